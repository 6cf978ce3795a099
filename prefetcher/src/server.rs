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
//! Every proxy connection also runs behind its guards (`crate::guard`): HTTP/1 heads
//! are checked on the raw bytes, an HTTP/2 client that never opens its window is cut
//! off after `http2.send_stall_timeout_ms`, and HTTP/2 connection errors are counted
//! by reason. The `[http2]` bounds apply to every listener.
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
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{Activity, ConnectionLimiter};
use crate::config::Http2Config;
use crate::guard::{ConnGuard, HeadGuard, WatchedBody, h2_abuse, send_stalled};
use crate::metrics::ClientCounters;
use crate::origin::ClientAddr;
use crate::proxy::Node;
use crate::status::H2Abuse;
use crate::supervise::{
    CountingIo, Gate, Prefixed, Supervised, Supervisor, TrackedBody, count_connection_error,
    read_first_head,
};

/// Options of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long open connections may take to finish after shutdown starts.
    pub grace: Duration,
    /// Most bytes hyper buffers for one HTTP/1.1 request head (request line and
    /// headers): past it 431. The proxy's own, smaller `limits` answer first; this
    /// bounds memory before they run. (HTTP/2: `http2.max_header_list_bytes`.)
    pub max_head_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
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
    let listening = Listening {
        tls: None,
        guarded: None,
        limiter: ConnectionLimiter::unlimited(),
        http2: Http2Config::default(),
    };
    serve_with(
        listener,
        move |_, _| service.clone(),
        listening,
        shutdown,
        options,
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
    let listening = Listening::proxy(&node, None);
    let service = move |client, guard| ProxyService(node.clone(), client, guard);
    serve_with(listener, service, listening, shutdown, options).await;
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
    let listening = Listening::proxy(&node, Some(TlsAcceptor::from(tls)));
    let service = move |client, guard| ProxyService(node.clone(), client, guard);
    serve_with(listener, service, listening, shutdown, options).await;
}

/// What a listener serves its connections with.
struct Listening {
    tls: Option<TlsAcceptor>,
    /// The node whose connections run behind the guards and whose metrics count what
    /// they find (the proxy listeners); `None` for a plain router.
    guarded: Option<Node>,
    limiter: ConnectionLimiter,
    http2: Http2Config,
}

impl Listening {
    fn proxy(node: &Node, tls: Option<TlsAcceptor>) -> Listening {
        Listening {
            tls,
            guarded: Some(node.clone()),
            limiter: node.connections().clone(),
            http2: node.config().http2.clone(),
        }
    }
}

/// A node as a hyper service for one connection: one boxed future per request,
/// nothing else; the client's address and whether it came over TLS ride along
/// without touching the request's extensions (which would allocate per request), and
/// so does the connection's guard: an HTTP/1 request takes its head's verdict from
/// it, an HTTP/2 response body is watched for a stalled client.
#[derive(Clone)]
struct ProxyService(Node, ClientAddr, Option<Arc<ConnGuard>>);

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let (node, peer, guard) = (self.0.clone(), self.1, self.2.clone());
        Box::pin(async move {
            let h2 = request.version() == http::Version::HTTP_2;
            let verdict = match &guard {
                Some(guard) if !h2 => guard.next_verdict(),
                _ => None,
            };
            let response = node
                .handle_guarded(request.map(Body::new), Some(peer), verdict)
                .await;
            Ok(match guard {
                Some(guard) if h2 => response.map(|body| Body::new(WatchedBody::new(body, guard))),
                _ => response,
            })
        })
    }
}

/// Applies `http2` to `builder`'s HTTP/2 side.
fn configure_http2(builder: &mut auto::Builder<TokioExecutor>, http2: &Http2Config) {
    let mut h2 = builder.http2();
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(http2.max_concurrent_streams)
        .max_header_list_size(http2.max_header_list_bytes)
        .max_pending_accept_reset_streams(http2.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(http2.max_local_error_reset_streams);
    if http2.keep_alive_interval_ms > 0 {
        h2.keep_alive_interval(Duration::from_millis(http2.keep_alive_interval_ms))
            .keep_alive_timeout(Duration::from_millis(http2.keep_alive_timeout_ms));
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

async fn serve_with<S>(
    listener: TcpListener,
    service_for: impl Fn(ClientAddr, Option<Arc<ConnGuard>>) -> S,
    listening: Listening,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let Listening {
        tls,
        guarded,
        limiter,
        http2,
    } = listening;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    configure_http2(&mut builder, &http2);
    // hyper's floor for the HTTP/1 read buffer is 8 KiB.
    // writev: the head and a cached body's `Bytes` go out in one vectored write.
    // Never `pipeline_flush`: it switches hyper to copying every body into its write
    // buffer (measured: a 100 KiB memcpy per 100 KiB hit).
    let max_head = options.max_head_bytes.max(8192);
    builder.http1().max_buf_size(max_head).writev(true);
    configure_limits(&mut builder, &limiter);
    let supervisor = Supervisor::start(limiter.limits(), limiter.counters());
    let max_headers = limiter.limits().max_headers;
    let send_stall = Duration::from_millis(http2.send_stall_timeout_ms);
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
                let guard = guarded
                    .as_ref()
                    .map(|node| (node.clone(), Arc::new(ConnGuard::default())));
                let client = ClientAddr { addr: peer, tls: tls.is_some() };
                let service = Gate::new(
                    service_for(client, guard.as_ref().map(|(_, g)| Arc::clone(g))),
                    slot,
                    Arc::clone(supervised.activity()),
                    max_headers,
                );
                let connection = Connection {
                    builder: builder.clone(),
                    supervised,
                    counters: limiter.counters(),
                    guard,
                    max_head,
                    send_stall,
                };
                match &tls {
                    Some(acceptor) => {
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            // The handshake counts against the first request's header
                            // timeout.
                            let accepted = connection.supervised.run(acceptor.accept(stream)).await;
                            match accepted {
                                Some(Ok(stream)) => connection.serve(stream, service).await,
                                Some(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                                None => {}
                            }
                        });
                    }
                    None => {
                        tokio::spawn(connection.serve(stream, service));
                    }
                }
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

/// A connection's service behind its [`Gate`], as hyper serves it.
trait GatedService:
    hyper::service::Service<
        http::Request<Incoming>,
        Response = http::Response<TrackedBody>,
        Error = Infallible,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<S> GatedService for S where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<TrackedBody>,
            Error = Infallible,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

/// One admitted connection, ready to be served.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    supervised: Supervised,
    counters: ClientCounters,
    /// The node and the connection's guard, on a proxy listener.
    guard: Option<(Node, Arc<ConnGuard>)>,
    max_head: usize,
    send_stall: Duration,
}

impl Connection {
    async fn serve<IO, S>(self, mut io: IO, service: S)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: GatedService,
    {
        // A small task reads the first request head; hyper, its buffers and its
        // (large, inline) state only for a connection whose head is in, in a task of
        // its own: tokio copies a task's whole future when it spawns and ends it, and
        // slow-header connections come and go.
        let Some(head) = self
            .supervised
            .run(read_first_head(&mut io, self.max_head))
            .await
        else {
            return;
        };
        tokio::spawn(self.serve_from(Prefixed::new(head, io), service));
    }

    /// Serves the connection once its first head is in.
    async fn serve_from<IO, S>(self, io: Prefixed<IO>, service: S)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: GatedService,
    {
        let Some((node, guard)) = self.guard else {
            let connection = self.builder.serve_connection(TokioIo::new(io), service);
            let ended = self
                .supervised
                .run_graceful(connection, |c| c.graceful_shutdown())
                .await;
            if let Some(Err(e)) = ended {
                count_connection_error(&*e, &self.counters);
                tracing::trace!(error = %e, "connection ended with an error");
            }
            return;
        };
        let io = HeadGuard::new(io, Arc::clone(&guard), self.max_head);
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        let ended = self
            .supervised
            .run_graceful(connection, |c| c.graceful_shutdown());
        let metrics = node.metrics();
        tokio::select! {
            ended = ended => {
                let error = match ended {
                    Some(Err(e)) => Some(e),
                    _ => None,
                };
                let abuse = guard
                    .goaway_sent()
                    .or_else(|| error.as_ref().and_then(|e| h2_abuse(&**e)));
                if let Some(abuse) = abuse {
                    metrics.h2_connection_error(abuse);
                    tracing::debug!(reason = abuse.as_str(), "HTTP/2 connection ended for abuse");
                } else if let Some(e) = error {
                    count_connection_error(&*e, &self.counters);
                    tracing::trace!(error = %e, "connection ended with an error");
                }
            }
            () = send_stalled(&guard, self.send_stall) => {
                // Dropping the connection closes it: the stalled streams can never
                // finish, so a graceful GOAWAY would wait for nothing.
                metrics.h2_connection_error(H2Abuse::SendStall);
                tracing::debug!("HTTP/2 client stalled its responses; connection closed");
            }
        }
        for reason in guard.unanswered_refusals() {
            metrics.refused(reason);
        }
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
