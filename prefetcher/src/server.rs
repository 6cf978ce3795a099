//! The accept loop: HTTP/1.1 and h2c on one listener (HTTP/1.1 and h2 by ALPN on a
//! TLS listener), graceful shutdown.
//!
//! Each accepted connection is first admitted (`admission`: the node-wide and
//! per-address connection limits; a refused one is closed at once), then served under
//! supervision (`supervise`: header, idle and send timeouts; per-request rate and
//! header-count checks). The proxy listeners take their limits from the node's
//! `[server]` configuration; [`serve`] (the admin listener, test origins) only the
//! default timeouts.
//!
//! The proxy listener ([`serve_node`]) hands each request straight to
//! [`Node::handle`]: the proxy has no routes, so an axum `Router` in front of it
//! (path matching, extensions, body boxing) was pure per-request cost on the hit
//! path. The admin listener and tests use [`serve`] with a `Router`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{Activity, ConnectionLimiter};
use crate::origin::ClientAddr;
use crate::proxy::Node;
use crate::supervise::{
    CountingIo, Gate, Prefixed, Supervisor, count_connection_error, read_first_head,
};

/// Options of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Concurrent streams one h2c connection may carry.
    pub h2_max_concurrent_streams: u32,
    /// How long open connections may take to finish after shutdown starts.
    pub grace: Duration,
    /// Most bytes hyper buffers for one request head (HTTP/1.1 request line and
    /// headers; the HTTP/2 header list): past it 431, or a stream reset. The proxy's
    /// own, smaller `limits` answer first; this bounds memory before they run.
    pub max_head_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            h2_max_concurrent_streams: 1024,
            grace: Duration::from_secs(10),
            max_head_bytes: 64 * 1024,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open
/// connections finish for up to `options.grace`. Connections get the default
/// header, idle and send timeouts and no connection or rate limits.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let service = TowerToHyperService::new(router);
    let limiter = ConnectionLimiter::unlimited();
    serve_with(
        listener,
        move |_| service.clone(),
        None,
        shutdown,
        options,
        limiter,
    )
    .await;
}

/// Serves `node`'s proxy on `listener` (the same requests and answers as
/// [`app`](crate::app), without a router), like [`serve`].
pub async fn serve_node(
    listener: TcpListener,
    node: Node,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let limiter = node.connections().clone();
    let service = move |client| ProxyService(node.clone(), client);
    serve_with(listener, service, None, shutdown, options, limiter).await;
}

/// Serves `node`'s proxy over TLS on `listener`, like [`serve_node`]: HTTP/2 or
/// HTTP/1.1 as the client's ALPN chooses (`tls` should offer both). Each handshake
/// runs in the connection's own task within the header timeout, so a slow or silent
/// client never holds up the accept loop. The plain and TLS listeners of one node
/// share its connection limits.
pub async fn serve_node_tls(
    listener: TcpListener,
    node: Node,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let acceptor = TlsAcceptor::from(tls);
    let limiter = node.connections().clone();
    let service = move |client| ProxyService(node.clone(), client);
    serve_with(
        listener,
        service,
        Some(acceptor),
        shutdown,
        options,
        limiter,
    )
    .await;
}

/// A node as a hyper service for one connection: one boxed future per request,
/// nothing else; the client's address and whether it came over TLS ride along
/// without touching the request's extensions (which would allocate per request).
#[derive(Clone)]
struct ProxyService(Node, ClientAddr);

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let (node, peer) = (self.0.clone(), self.1);
        Box::pin(async move { Ok(node.handle_from(request.map(Body::new), Some(peer)).await) })
    }
}

async fn serve_with<S>(
    listener: TcpListener,
    service_for: impl Fn(ClientAddr) -> S,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
    limiter: ConnectionLimiter,
) where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(options.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(options.max_head_bytes).unwrap_or(u32::MAX));
    // hyper's floor for the HTTP/1 read buffer is 8 KiB.
    // writev: the head and a cached body's `Bytes` go out in one vectored write.
    // Never `pipeline_flush`: it switches hyper to copying every body into its write
    // buffer (measured: a 100 KiB memcpy per 100 KiB hit).
    builder
        .http1()
        .max_buf_size(options.max_head_bytes.max(8192))
        .writev(true);
    configure_limits(&mut builder, &limiter);
    let supervisor = Supervisor::start(limiter.limits(), limiter.counters());
    let max_headers = limiter.limits().max_headers;
    let max_head = options.max_head_bytes.max(8192);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        limiter.count(crate::status::ClientLimit::AcceptError);
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                // Refused (and counted): closed at once, before any read.
                let activity = Arc::new(Activity::default());
                let Ok(slot) = limiter.admit(peer.ip(), &activity) else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let supervised = supervisor.register(activity);
                let stream = CountingIo::new(stream, Arc::clone(supervised.activity()));
                let service = Gate::new(
                    service_for(ClientAddr { addr: peer, tls: tls.is_some() }),
                    slot,
                    Arc::clone(supervised.activity()),
                    max_headers,
                );
                let counters = limiter.counters();
                if let Some(acceptor) = &tls {
                    let (acceptor, builder) = (acceptor.clone(), builder.clone());
                    tokio::spawn(async move {
                        // The handshake counts against the first request's header timeout.
                        let stream = match supervised.run(acceptor.accept(stream)).await {
                            Some(Ok(stream)) => stream,
                            Some(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            None => return,
                        };
                        let mut stream = stream;
                        let Some(head) =
                            supervised.run(read_first_head(&mut stream, max_head)).await
                        else {
                            return;
                        };
                        // See the plain path below.
                        tokio::spawn(async move {
                            let connection = builder
                                .serve_connection(TokioIo::new(Prefixed::new(head, stream)), service);
                            let ended = supervised
                                .run_graceful(connection, |c| c.graceful_shutdown())
                                .await;
                            if let Some(Err(e)) = ended {
                                count_connection_error(&*e, &counters);
                                tracing::trace!(error = %e, "connection ended with an error");
                            }
                        });
                    });
                    continue;
                }
                let builder = builder.clone();
                tokio::spawn(async move {
                    // A small task reads the first request head; hyper, its buffers and
                    // its (large, inline) state only for a connection whose head is in,
                    // in a task of its own: tokio copies a task's whole future when it
                    // spawns and ends it, and slow-header connections come and go.
                    let mut stream = stream;
                    let Some(head) = supervised.run(read_first_head(&mut stream, max_head)).await
                    else {
                        return;
                    };
                    tokio::spawn(async move {
                        let connection = builder
                            .serve_connection(TokioIo::new(Prefixed::new(head, stream)), service);
                        let ended = supervised
                            .run_graceful(connection, |c| c.graceful_shutdown())
                            .await;
                        if let Some(Err(e)) = ended {
                            count_connection_error(&*e, &counters);
                            tracing::trace!(error = %e, "connection ended with an error");
                        }
                    });
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    supervisor.shutdown();
    tokio::select! {
        () = supervisor.drained() => {}
        () = tokio::time::sleep(options.grace) => {
            tracing::warn!("grace period over; closing remaining connections");
            supervisor.abort_all();
        }
    }
}

/// The hyper settings of the `[server]` limits.
fn configure_limits(builder: &mut auto::Builder<TokioExecutor>, limiter: &ConnectionLimiter) {
    let limits = limiter.limits();
    // hyper's own header timeout is off: it needs a timer reset per request, and it
    // runs from the moment a keep-alive connection goes idle, so it would also be the
    // idle timeout. The supervisor's runs from the head's first byte.
    let http1 = &mut builder.http1();
    http1.header_read_timeout(None);
    // 100 is hyper's default; setting it anyway would build the parser's header
    // array element by element on every request.
    if limits.max_headers != 100 {
        http1.max_headers(limits.max_headers);
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
