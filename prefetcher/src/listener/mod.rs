//! The client listeners: accepting, admitting, guarding and supervising client
//! connections. HTTP/1.1 and h2c on one listener (HTTP/1.1 and h2 by ALPN on a TLS
//! listener), graceful shutdown.
//!
//! Each accepted connection is first admitted (`admission`: the node-wide and
//! per-address connection limits; a refused one is closed at once), then served under
//! supervision (`supervise`: one sweeper per listener for the header, idle and send
//! timeouts, HTTP/1 and HTTP/2 alike) behind its gate (`gate`: the per-request rate
//! and header-count checks, and the one response-body wrapper the sweeper reads).
//! Its socket is counted and its first head read apart (`io`); what it did is its
//! `activity`. The proxy listeners take their limits from the node's `[server]`
//! configuration; [`serve`] (the admin listener, test origins) only the default
//! timeouts.
//!
//! Every proxy connection also runs behind its guard (`guard`): HTTP/1 heads are
//! checked on the raw bytes (by `crate::request_head`), HTTP/2 connection errors
//! are counted by reason (`h2_abuse`), and the origin fills it and its address lead
//! are bounded (`fills`: a connection that keeps cancelling its fills is closed).
//! The `[http2]` bounds apply to every listener.
//!
//! The listener serves any hyper service; the node's own (its requests straight to
//! `Node::handle`, no router) is the proxy's: `serve_node` and `serve_node_tls` live
//! in `crate::proxy`, which plugs the node into [`serve_with`]. The admin listener and
//! tests use [`serve`] with a `Router`.

mod activity;
mod admission;
mod fills;
mod gate;
mod guard;
mod h2_abuse;
mod io;
mod supervise;

use std::convert::Infallible;
use std::future::Future;
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

pub use admission::ConnectionLimiter;
pub(crate) use fills::LeadTicket;
pub(crate) use guard::{ConnGuard, Verdict};

use activity::Activity;
use fills::ConnFills;
use gate::{Gate, ResponseBody};
use guard::HeadGuard;
use h2_abuse::h2_abuse;
use io::{CountingIo, Prefixed, read_first_head};
use supervise::{Supervised, Supervisor};

use crate::config::Http2Config;
use crate::metrics::ClientCounters;
use crate::origin::ClientAddr;
use crate::status::ClientLimit;

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
        guarded: false,
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

/// What a listener serves its connections with.
pub(crate) struct Listening {
    /// The TLS acceptor of a TLS listener.
    pub(crate) tls: Option<TlsAcceptor>,
    /// Whether connections run behind their [`ConnGuard`] and the guard's findings
    /// are counted (the proxy listeners); not for a plain router.
    pub(crate) guarded: bool,
    /// The admission (and the counters) of the listener's connections.
    pub(crate) limiter: ConnectionLimiter,
    /// The HTTP/2 bounds.
    pub(crate) http2: Http2Config,
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

/// Serves `listener` until `shutdown` resolves, then lets open connections finish for
/// up to `options.grace`: each accepted connection admitted, supervised and gated,
/// and served by the service `service_for` makes for it (from the client's address
/// and, on a guarded listener, the connection's guard).
pub(crate) async fn serve_with<S>(
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
                let guard = guarded.then(|| {
                    let fills = ConnFills::new(
                        limiter.limits(),
                        slot.address_fills(),
                        Arc::clone(supervised.activity()),
                        limiter.counters(),
                    );
                    Arc::new(ConnGuard::with_fills(fills))
                });
                let client = ClientAddr { addr: peer, tls: tls.is_some() };
                let service = Gate::new(
                    service_for(client, guard.clone()),
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
                                Some(Err(e)) => {
                                    connection.counters.tls_handshake_failures.inc();
                                    tracing::debug!(error = %e, "TLS handshake failed")
                                }
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
        Response = http::Response<ResponseBody>,
        Error = Infallible,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<S> GatedService for S where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<ResponseBody>,
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
    /// The connection's guard, on a proxy listener.
    guard: Option<Arc<ConnGuard>>,
    max_head: usize,
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
        let Some(guard) = self.guard else {
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
        // `None`: dropped by the sweeper (a timeout, a stalled client; counted there)
        // or at the end of the shutdown's grace.
        let ended = self
            .supervised
            .run_graceful(connection, |c| c.graceful_shutdown())
            .await;
        let error = match ended {
            Some(Err(e)) => Some(e),
            _ => None,
        };
        let abuse = guard
            .goaway_sent()
            .or_else(|| error.as_ref().and_then(|e| h2_abuse(&**e)));
        if let Some(abuse) = abuse {
            self.counters.h2_connection_error(abuse);
            tracing::debug!(reason = abuse.as_str(), "HTTP/2 connection ended for abuse");
        } else if let Some(e) = error {
            count_connection_error(&*e, &self.counters);
            tracing::trace!(error = %e, "connection ended with an error");
        }
        for reason in guard.unanswered_refusals() {
            self.counters.refused(reason);
        }
    }
}

/// Counts what ended a connection with an error, where it is a limit: an HTTP/1.1
/// head the parser refused as too large (hyper answered 431).
fn count_connection_error(error: &(dyn std::error::Error + 'static), counters: &ClientCounters) {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>()
            && e.is_parse_too_large()
        {
            counters.count(ClientLimit::HeadTooLarge);
            return;
        }
        source = e.source();
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
