//! The node behind its client listeners: [`serve_node`] and [`serve_node_tls`] plug
//! the node's own hyper service into the listener (`crate::listener`), which accepts,
//! admits, guards and supervises the connections.
//!
//! The service hands each request straight to [`Node::handle`]: the proxy has no
//! routes, so an axum `Router` in front of it (path matching, extensions, body
//! boxing) was pure per-request cost on the hit path.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::Node;
use crate::listener::{ConnGuard, Listening, ServeOptions, serve_with};
use crate::origin::ClientAddr;

/// Serves `node`'s proxy on `listener` (the same requests and answers as
/// [`app`](crate::app), without a router), like [`serve`](crate::serve).
pub async fn serve_node(
    listener: TcpListener,
    node: Node,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let listening = listening(&node, None);
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
    let listening = listening(&node, Some(TlsAcceptor::from(tls)));
    let service = move |client, guard| ProxyService(node.clone(), client, guard);
    serve_with(listener, service, listening, shutdown, options).await;
}

/// A proxy listener of `node`: guarded, under the node's connection limits.
fn listening(node: &Node, tls: Option<TlsAcceptor>) -> Listening {
    Listening {
        tls,
        guarded: true,
        limiter: node.connections().clone(),
        http2: node.config().http2.clone(),
    }
}

/// A node as a hyper service for one connection: one boxed future per request,
/// nothing else; the client's address and whether it came over TLS ride along
/// without touching the request's extensions (which would allocate per request), and
/// so does the connection's guard, from which an HTTP/1 request takes its head's
/// verdict and a miss its ticket to lead a fill.
#[derive(Clone)]
struct ProxyService(Node, ClientAddr, Option<Arc<ConnGuard>>);

impl hyper::service::Service<http::Request<Incoming>> for ProxyService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let (node, peer, guard) = (self.0.clone(), self.1, self.2.clone());
        Box::pin(async move {
            let verdict = match &guard {
                Some(guard) if request.version() != http::Version::HTTP_2 => guard.next_verdict(),
                _ => None,
            };
            Ok(node
                .handle_guarded(request.map(Body::new), Some(peer), verdict, guard)
                .await)
        })
    }
}
