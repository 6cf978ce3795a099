//! Test support (feature `testing`): a synthetic origin that counts fills and can hold
//! a fill open, fail, hang or truncate; panics injected into a node's fill task
//! ([`PanicPoint`], `Node::panic_next_fill`); a node runner; small HTTP clients. Used
//! by this crate's tests, the `tests` crate's scenarios and the benchmark.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
pub use crate::faults::PanicPoint;
use crate::listener::{ServeOptions, serve};
use crate::proxy::Node;
use crate::proxy::serve_node;
use crate::status::{CacheStatus, X_CACHE};

/// How the synthetic origin answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 with the deterministic body.
    Ok,
    /// This status, carelessly marked `Cache-Control: max-age=60`.
    Fail(u16),
    /// Never answers.
    Hang,
    /// The first request hangs, later ones answer normally.
    HangFirst,
    /// Declares the full length, sends half the body, then resets.
    Truncate,
}

/// A scripted answer of the synthetic origin (see [`SyntheticOrigin::script`]).
#[derive(Debug, Clone)]
pub struct Scripted {
    /// Status.
    pub status: u16,
    /// Response headers, in order (repeats allowed).
    pub headers: Vec<(String, String)>,
    /// The body; `None` is the origin's usual body for the path (none for 304/204).
    pub body: Option<Bytes>,
}

impl Scripted {
    /// `status` with these headers and the usual body.
    pub fn new(status: u16, headers: &[(&str, &str)]) -> Scripted {
        Scripted {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: None,
        }
    }

    /// The same, with this body.
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Scripted {
        self.body = Some(body.into());
        self
    }
}

/// One request as the synthetic origin received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Method.
    pub method: http::Method,
    /// Path and query.
    pub path: String,
    /// Every header as received.
    pub headers: HeaderMap,
}

/// How a scripted path answers: from the request's headers and how many requests
/// for the path came before it (0 for the first).
type Script = dyn Fn(&HeaderMap, usize) -> Scripted + Send + Sync;

struct OriginState {
    scripts: Mutex<HashMap<String, Arc<Script>>>,
    received: Mutex<Vec<Received>>,
    name: String,
    fills: AtomicUsize,
    per_path: Mutex<HashMap<String, usize>>,
    in_flight: AtomicUsize,
    /// Most requests in flight at once since the last `GET /__origin/peak?reset`.
    peak_in_flight: AtomicUsize,
    behaviour: Mutex<Behaviour>,
    held: watch::Sender<bool>,
    hold_mid_body: AtomicBool,
    body_size: AtomicUsize,
    latency_ms: AtomicU64,
    cache_control: Mutex<Option<String>>,
    extra_headers: Mutex<Vec<(String, String)>>,
}

/// A synthetic origin on `127.0.0.1:0`.
///
/// The body of `path` is [`SyntheticOrigin::body_for`]`(name, path, size)`, where the
/// size is the one set by [`set_body_size`](Self::set_body_size) or, for paths under
/// `/bytes/N/`, N. A path under `/vary/` is answered as the rest of it, with
/// `Vary: Accept-Encoding`. Paths given a [`script`](Self::script) answer by it. `GET /__origin/fills?path=/p` returns the fill count of `/p` (or of
/// every path without `path=`) and is not itself counted; `GET /__origin/peak` the most
/// requests it had in flight at once (`?reset` starts counting again).
pub struct SyntheticOrigin {
    addr: SocketAddr,
    state: Arc<OriginState>,
    task: JoinHandle<()>,
}

impl Drop for SyntheticOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct InFlight(Arc<OriginState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn released(mut held: watch::Receiver<bool>) {
    let _ = held.wait_for(|h| !*h).await;
}

impl SyntheticOrigin {
    /// Starts an origin whose bodies carry `name`.
    pub async fn start(name: &str) -> SyntheticOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        SyntheticOrigin::serve_on(listener, name)
    }

    /// Starts an origin on an already bound listener.
    pub fn serve_on(listener: TcpListener, name: &str) -> SyntheticOrigin {
        let addr = listener.local_addr().expect("origin address");
        let state = Arc::new(OriginState {
            scripts: Mutex::new(HashMap::new()),
            received: Mutex::new(Vec::new()),
            name: name.to_string(),
            fills: AtomicUsize::new(0),
            per_path: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            behaviour: Mutex::new(Behaviour::Ok),
            held: watch::Sender::new(false),
            hold_mid_body: AtomicBool::new(false),
            body_size: AtomicUsize::new(1024),
            latency_ms: AtomicU64::new(0),
            cache_control: Mutex::new(Some("public, max-age=300".into())),
            extra_headers: Mutex::new(Vec::new()),
        });
        let router = Router::new()
            .fallback(origin_handler)
            .with_state(Arc::clone(&state));
        let options = ServeOptions {
            grace: Duration::from_millis(100),
            ..ServeOptions::default()
        };
        let task = tokio::spawn(serve(listener, router, std::future::pending(), options));
        SyntheticOrigin { addr, state, task }
    }

    /// The origin's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests served so far (all paths).
    pub fn fills(&self) -> usize {
        self.state.fills.load(Ordering::SeqCst)
    }

    /// Requests served so far for `path` (with its query, as received).
    pub fn fills_for(&self, path: &str) -> usize {
        *lock(&self.state.per_path).get(path).unwrap_or(&0)
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// Holds every response (before its head, or mid-body with
    /// [`hold_mid_body`](Self::hold_mid_body)) until [`release`](Self::release).
    pub fn hold(&self) {
        self.state.held.send_replace(true);
    }

    /// Lets held responses go on.
    pub fn release(&self) {
        self.state.held.send_replace(false);
    }

    /// Holds after the head and half the body instead of before the head.
    pub fn hold_mid_body(&self, mid: bool) {
        self.state.hold_mid_body.store(mid, Ordering::SeqCst);
    }

    /// Sets how the origin answers.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *lock(&self.state.behaviour) = behaviour;
    }

    /// Sets the default body size.
    pub fn set_body_size(&self, size: usize) {
        self.state.body_size.store(size, Ordering::SeqCst);
    }

    /// Sets a delay before every response.
    pub fn set_latency(&self, latency: Duration) {
        self.state
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the `Cache-Control` of successful responses (`None`: no header).
    pub fn set_cache_control(&self, value: Option<&str>) {
        *lock(&self.state.cache_control) = value.map(str::to_string);
    }

    /// Adds a header to successful responses.
    pub fn add_header(&self, name: &str, value: &str) {
        lock(&self.state.extra_headers).push((name.into(), value.into()));
    }

    /// Answers requests for `path` (with its query, as received) by `script`, called
    /// with the request's headers and the number of earlier requests for the path.
    /// Holds, latency and counting apply as for any request.
    pub fn script(
        &self,
        path: &str,
        script: impl Fn(&HeaderMap, usize) -> Scripted + Send + Sync + 'static,
    ) {
        lock(&self.state.scripts).insert(path.to_string(), Arc::new(script));
    }

    /// Every request received for `path` (with its query), oldest first.
    pub fn received(&self, path: &str) -> Vec<Received> {
        lock(&self.state.received)
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Waits (up to 30 s, then panics) until `n` requests are being answered.
    pub async fn wait_in_flight(&self, n: usize) {
        wait_until(|| self.in_flight() >= n, "origin requests in flight").await;
    }

    /// The body the origin named `name` serves for `path` at `size` bytes.
    pub fn body_for(name: &str, path: &str, size: usize) -> Bytes {
        let pattern = format!("{name}{path};");
        pattern
            .bytes()
            .cycle()
            .take(size.max(1))
            .collect::<Vec<u8>>()
            .into()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Polls `done` every 5 ms for up to 30 s (a correctness bound, not a speed claim).
pub async fn wait_until(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn origin_handler(State(state): State<Arc<OriginState>>, request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if request.uri().path() == "/__origin/fills" {
        let count = match request.uri().query().and_then(|q| q.strip_prefix("path=")) {
            Some(p) => *lock(&state.per_path).get(p).unwrap_or(&0),
            None => state.fills.load(Ordering::SeqCst),
        };
        return Response::new(Body::from(format!("{count}\n")));
    }
    if request.uri().path() == "/__origin/peak" {
        let peak = if request.uri().query() == Some("reset") {
            state.peak_in_flight.swap(0, Ordering::SeqCst)
        } else {
            state.peak_in_flight.load(Ordering::SeqCst)
        };
        return Response::new(Body::from(format!("{peak}\n")));
    }
    let n = state.fills.fetch_add(1, Ordering::SeqCst) + 1;
    let earlier = {
        let mut per_path = lock(&state.per_path);
        let count = per_path.entry(path.clone()).or_default();
        *count += 1;
        *count - 1
    };
    lock(&state.received).push(Received {
        method: request.method().clone(),
        path: path.clone(),
        headers: request.headers().clone(),
    });
    let script = lock(&state.scripts).get(&path).cloned();
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak_in_flight.fetch_max(now, Ordering::SeqCst);
    let guard = InFlight(Arc::clone(&state));
    let latency = state.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let behaviour = *lock(&state.behaviour);
    if behaviour == Behaviour::Hang || (behaviour == Behaviour::HangFirst && n == 1) {
        std::future::pending::<()>().await;
    }
    let mid_body = state.hold_mid_body.load(Ordering::SeqCst);
    if !mid_body {
        released(state.held.subscribe()).await;
    }
    if let Behaviour::Fail(code) = behaviour {
        let mut response = Response::new(Body::from("origin error\n"));
        *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=60"),
        );
        return response;
    }
    if let Some(script) = script {
        let scripted = script(request.headers(), earlier);
        drop(guard);
        let size = state.body_size.load(Ordering::SeqCst);
        let body = match (scripted.body, scripted.status) {
            (Some(body), _) => body,
            (None, 204 | 304) => Bytes::new(),
            (None, _) => SyntheticOrigin::body_for(&state.name, request.uri().path(), size),
        };
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = StatusCode::from_u16(scripted.status).expect("status");
        for (k, v) in &scripted.headers {
            response.headers_mut().append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
                HeaderValue::from_str(v).expect("header value"),
            );
        }
        return response;
    }
    // `/vary/...` answers as `...` does, with `Vary: Accept-Encoding` (the bench's
    // negotiated hit path).
    let vary = request.uri().path().starts_with("/vary/");
    let sized_path = if vary {
        &request.uri().path()["/vary".len()..]
    } else {
        request.uri().path()
    };
    let size = sized_path
        .strip_prefix("/bytes/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| state.body_size.load(Ordering::SeqCst));
    let body = SyntheticOrigin::body_for(&state.name, request.uri().path(), size);
    let half = body.len() / 2;
    let (first, rest) = (body.slice(..half), body.slice(half..));
    let held = state.held.subscribe();
    let truncate = behaviour == Behaviour::Truncate;
    let stream = futures::stream::unfold(0u8, move |step| {
        let (first, rest, held) = (first.clone(), rest.clone(), held.clone());
        async move {
            match step {
                0 => Some((Ok::<Bytes, std::io::Error>(first), 1)),
                1 if truncate => {
                    // Pending once, so the head and the first half are flushed
                    // before the reset (else the client sees no byte at all).
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Some((
                        Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "synthetic truncation",
                        )),
                        2,
                    ))
                }
                1 => {
                    if mid_body {
                        released(held).await;
                    }
                    Some((Ok(rest), 2))
                }
                _ => None,
            }
        }
    });
    let stream = futures::StreamExt::map(stream, move |item| {
        let _keep = &guard;
        item
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if vary {
        headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if let Some(cc) = lock(&state.cache_control).clone() {
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_str(&cc).expect("header"),
        );
    }
    for (k, v) in lock(&state.extra_headers).iter() {
        headers.append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            HeaderValue::from_str(v).expect("header value"),
        );
    }
    response
}

/// A node serving on `127.0.0.1:0`, stopped on drop.
pub struct TestNode {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The node, for its registry, cache and metrics.
    pub node: Node,
    task: JoinHandle<()>,
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestNode {
    /// Starts a node with `config` (its `listen` is ignored).
    pub async fn start(config: Config) -> TestNode {
        TestNode::start_with(Node::new(config).expect("valid config")).await
    }

    /// Serves an existing node.
    pub async fn start_with(node: Node) -> TestNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
        let addr = listener.local_addr().expect("node address");
        let options = ServeOptions {
            grace: Duration::from_millis(100),
            ..ServeOptions::default()
        };
        let task = tokio::spawn(serve_node(
            listener,
            node.clone(),
            std::future::pending(),
            options,
        ));
        TestNode { addr, node, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A response as a test sees it.
#[derive(Debug)]
pub struct Fetched {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The body, or why it could not be read completely (truncation shows here).
    pub body: Result<Bytes, String>,
}

impl Fetched {
    /// Reads a whole response; a body that breaks off is an `Err` body, not a short one.
    async fn read(response: hyper::Response<hyper::body::Incoming>) -> Fetched {
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| format!("body: {e}"));
        Fetched {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The `x-cache` status.
    pub fn x_cache(&self) -> Option<CacheStatus> {
        self.headers
            .get(X_CACHE)
            .and_then(|v| v.to_str().ok())
            .and_then(CacheStatus::parse)
    }
}

/// An HTTP/1.1 client with a keep-alive pool.
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    with_body: Client<HttpConnector, http_body_util::Full<Bytes>>,
}

impl Default for TestClient {
    fn default() -> Self {
        TestClient::new()
    }
}

impl TestClient {
    /// A client.
    pub fn new() -> TestClient {
        TestClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            with_body: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// `GET http://addr{path}` with `Host: host`.
    pub async fn get(&self, addr: SocketAddr, host: &str, path: &str) -> Result<Fetched, String> {
        self.request(http::Method::GET, addr, host, path, &[]).await
    }

    /// Any body-less request with extra headers.
    pub async fn request(
        &self,
        method: http::Method,
        addr: SocketAddr,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Fetched, String> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(header::HOST, host);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder.body(Empty::new()).map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Fetched::read(response).await)
    }
}

impl TestClient {
    /// A request with a body (a `POST`, or a `GET` with a body).
    pub async fn send(
        &self,
        method: http::Method,
        addr: SocketAddr,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Fetched, String> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(header::HOST, host);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder
            .body(http_body_util::Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let response = self
            .with_body
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Fetched::read(response).await)
    }
}

/// Opens one h2c connection to `addr`; clone the sender to multiplex many requests.
pub async fn h2_connect(
    addr: SocketAddr,
) -> Result<hyper::client::conn::http2::SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One GET over an h2c sender.
pub async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> Result<Fetched, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .uri(format!("http://{host}{path}"))
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Fetched::read(response).await)
}
