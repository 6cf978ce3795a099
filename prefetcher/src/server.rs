//! The accept loop: HTTP/1.1 and h2c on one listener, graceful shutdown.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

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
/// connections finish for up to `options.grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(options.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(options.max_head_bytes).unwrap_or(u32::MAX));
    // hyper's floor for the HTTP/1 read buffer is 8 KiB.
    builder
        .http1()
        .max_buf_size(options.max_head_bytes.max(8192));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::trace!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(options.grace) => {
            tracing::warn!("grace period over; closing remaining connections");
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
