//! The peer fan-out: asks every other pulse instance the same `/api/*` question with
//! `scope=local` and hands back, per peer, its parsed answer or a named failure.
//!
//! A merged fleet answer is only honest if it can say *which* peer is missing and
//! *why*, so nothing here is silently dropped:
//! - every peer is asked concurrently and bounded by one timeout: a fleet answer costs
//!   one slow peer, not the sum of them;
//! - a peer's 4xx is an answer, not an outage (a `404 unknown_tenant` from a peer
//!   that owns none of the tenant's partitions is normal): it keeps the status and the
//!   peer's [`ErrorBody`] so the merge can tell the two apart ([`PeerFailure::is_outage`]);
//! - a body is read up to a limit, so a broken or hostile peer cannot exhaust memory;
//! - each answer carries its round-trip time, for a later p99.
//!
//! Peers are plain `http://host:port` base URLs (pulse serves no TLS itself); the
//! client is hyper-util's pooled client, already in the tree through axum, so keep-alive
//! connections are reused between fan-outs.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

use super::ErrorBody;

mod discovery;
mod silence;
mod url;

pub(crate) use discovery::{client_id, discover};
pub(crate) use silence::SILENCE_BEFORE_WARNING;
use silence::Silences;
use url::with_local_scope;
pub use url::{PeerUrl, PeersError};

/// How long a peer may take to answer, connection and body included.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest answer body read from a peer. A heat map of the largest allowed size is a
/// few MiB of JSON; more than this is a broken peer, not an answer.
pub(super) const DEFAULT_MAX_PEER_BODY: usize = 16 * 1024 * 1024;

/// Largest error body read from a peer's non-2xx answer: an [`ErrorBody`] is small.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// How much of a non-JSON error body is kept for the log.
const ERROR_EXCERPT: usize = 256;

/// Idle keep-alive connections kept per peer: enough for concurrent fan-outs, bounded.
const MAX_IDLE_PER_PEER: usize = 16;

/// How peers are asked.
#[derive(Debug, Clone)]
pub struct PeersConfig {
    /// Per peer, connection to last body byte ([`DEFAULT_PEER_TIMEOUT`]).
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer <token>`: the fleet shares pulse's `api_token`.
    pub api_token: Option<String>,
    /// Largest answer body read ([`DEFAULT_MAX_PEER_BODY`]).
    pub max_body_bytes: usize,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            timeout: DEFAULT_PEER_TIMEOUT,
            api_token: None,
            max_body_bytes: DEFAULT_MAX_PEER_BODY,
        }
    }
}

/// Why a peer gave no usable answer.
#[derive(Debug)]
pub enum PeerFailure {
    /// No connection, or it broke before the answer was read.
    Unreachable(String),
    /// No complete answer within the timeout.
    Timeout(Duration),
    /// The peer answered with a non-2xx status; `error` is its [`ErrorBody`] when the
    /// body has that shape, otherwise `body` holds the start of what it sent.
    Status {
        /// The peer's status code.
        status: StatusCode,
        /// The peer's `{error, message}`, when it sent one.
        error: Option<ErrorBody>,
        /// The first bytes of a body that is not an [`ErrorBody`].
        body: String,
    },
    /// A 2xx whose body is not the expected JSON.
    BadBody(String),
    /// The body is larger than the configured limit.
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The path given to [`Peers::gather`] cannot be sent (a bug in the caller).
    InvalidRequest(&'static str),
}

impl PeerFailure {
    /// A stable label for metrics and `missing_peers`: `unreachable`, `timeout`,
    /// `status`, `bad_body`, `too_large` or `invalid_request`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PeerFailure::Unreachable(_) => "unreachable",
            PeerFailure::Timeout(_) => "timeout",
            PeerFailure::Status { .. } => "status",
            PeerFailure::BadBody(_) => "bad_body",
            PeerFailure::TooLarge { .. } => "too_large",
            PeerFailure::InvalidRequest(_) => "invalid_request",
        }
    }

    /// The peer's status code, when it answered with one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            PeerFailure::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the peer's partitions are missing from the answer. A 4xx is the peer
    /// answering the question ("no such tenant here"), so it is not an outage;
    /// everything else is.
    pub fn is_outage(&self) -> bool {
        !self.status().is_some_and(|s| s.is_client_error())
    }
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerFailure::Unreachable(why) => write!(f, "unreachable: {why}"),
            PeerFailure::Timeout(after) => write!(f, "timeout after {after:?}"),
            PeerFailure::Status {
                status,
                error: Some(e),
                ..
            } => write!(f, "status {}: {}: {}", status.as_u16(), e.error, e.message),
            PeerFailure::Status { status, body, .. } => {
                write!(f, "status {}: {body:?}", status.as_u16())
            }
            PeerFailure::BadBody(why) => write!(f, "bad body: {why}"),
            PeerFailure::TooLarge { limit } => write!(f, "body larger than {limit} bytes"),
            PeerFailure::InvalidRequest(why) => write!(f, "invalid request: {why}"),
        }
    }
}

impl std::error::Error for PeerFailure {}

/// One peer's part of a fan-out.
#[derive(Debug)]
pub struct PeerAnswer<T> {
    /// Who was asked.
    pub peer: PeerUrl,
    /// From sending the request to the answer or the failure.
    pub elapsed: Duration,
    /// The parsed answer, or why there is none.
    pub result: Result<T, PeerFailure>,
}

/// What every request shares; behind an `Arc` so spawned requests own it cheaply.
struct Asker {
    client: Client<HttpConnector, Empty<Bytes>>,
    authorization: Option<HeaderValue>,
    timeout: Duration,
    max_body: usize,
}

/// The other instances of the fleet and a pooled HTTP client to ask them.
#[derive(Clone)]
pub struct Peers {
    /// Shared by the clones: discovery ([`Peers::set_urls`]) updates every one.
    peers: Arc<std::sync::RwLock<Arc<[PeerUrl]>>>,
    /// Which peer each partition is assigned to, as the group's description said
    /// (discovery only; empty with `--peers`).
    owners: Arc<std::sync::RwLock<std::collections::BTreeMap<i32, PeerUrl>>>,
    silences: Arc<Silences>,
    asker: Arc<Asker>,
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("peers", &self.urls())
            .field("timeout", &self.asker.timeout)
            .field("max_body", &self.asker.max_body)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// Validates every entry (a bad one is named) and builds the client. An empty
    /// list is valid: a single instance has no peers.
    pub fn new<S: AsRef<str>>(entries: &[S], config: PeersConfig) -> Result<Self, PeersError> {
        if config.timeout.is_zero() {
            return Err(PeersError::ZeroTimeout);
        }
        if config.max_body_bytes == 0 {
            return Err(PeersError::ZeroMaxBody);
        }
        let mut seen = HashSet::new();
        let mut peers = Vec::with_capacity(entries.len());
        for entry in entries {
            let peer = PeerUrl::parse(entry.as_ref())?;
            if !seen.insert(peer.clone()) {
                return Err(PeersError::Duplicate(entry.as_ref().to_owned()));
            }
            peers.push(peer);
        }
        let authorization = config
            .api_token
            .as_deref()
            .map(|token| {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| PeersError::InvalidToken)?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(MAX_IDLE_PER_PEER)
            .build(connector);
        Ok(Peers {
            peers: Arc::new(std::sync::RwLock::new(peers.into())),
            owners: Arc::default(),
            silences: Arc::default(),
            asker: Arc::new(Asker {
                client,
                authorization,
                timeout: config.timeout,
                max_body: config.max_body_bytes,
            }),
        })
    }

    /// [`Peers::new`] from the comma-separated form of `--peers` (blank items skipped).
    pub fn from_list(list: &str, config: PeersConfig) -> Result<Self, PeersError> {
        let entries: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        Peers::new(&entries, config)
    }

    /// The peers, in the order given (or found).
    pub fn urls(&self) -> Arc<[PeerUrl]> {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the peers (those found in the consumer group); `true` when they
    /// changed.
    pub fn set_urls(&self, mut urls: Vec<PeerUrl>) -> bool {
        urls.sort();
        urls.dedup();
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if *peers.as_ref() == urls[..] {
            return false;
        }
        self.silences.keep_only(&urls);
        *peers = urls.into();
        true
    }

    /// Notes whether `peer` answered; for a failure, how long it has not answered
    /// (compared with [`SILENCE_BEFORE_WARNING`]).
    pub fn silent_for(&self, peer: &PeerUrl, answered: bool) -> Duration {
        self.silences.note(peer, answered, Instant::now())
    }

    /// Records which peer each partition is assigned to.
    pub fn set_owners(&self, owners: std::collections::BTreeMap<i32, PeerUrl>) {
        *self.owners.write().unwrap_or_else(|e| e.into_inner()) = owners;
    }

    /// The peer `partition` is assigned to, if the group said so.
    pub fn owner_of(&self, partition: i32) -> Option<PeerUrl> {
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        owners.get(&partition).cloned()
    }

    /// How many peers there are.
    pub fn len(&self) -> usize {
        self.urls().len()
    }

    /// Whether there are none (a single instance).
    pub fn is_empty(&self) -> bool {
        self.urls().is_empty()
    }

    /// The per-peer timeout.
    pub fn timeout(&self) -> Duration {
        self.asker.timeout
    }

    /// Asks every peer `path_and_query` (such as `/api/heatmap?tenant=acme`) with
    /// `scope=local`, all at once, and returns one answer per peer in [`Peers::urls`]
    /// order. Takes about the slowest peer's time, at most the timeout. Dropping the
    /// future cancels the requests still running.
    pub async fn gather<T>(&self, path_and_query: &str) -> Vec<PeerAnswer<T>>
    where
        T: DeserializeOwned + Send + 'static,
    {
        self.gather_from(self.urls(), path_and_query).await
    }

    /// [`Peers::gather`] from `peers` only (a key's owners).
    pub async fn gather_from<T>(
        &self,
        peers: Arc<[PeerUrl]>,
        path_and_query: &str,
    ) -> Vec<PeerAnswer<T>>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let uri_tail = match with_local_scope(path_and_query) {
            Ok(tail) => tail,
            Err(why) => return all_failed(&peers, why),
        };
        let mut tasks = JoinSet::new();
        for (index, peer) in peers.iter().enumerate() {
            let ask = ask_peer(self.asker.clone(), peer.clone(), uri_tail.clone());
            tasks.spawn(async move { (index, ask.await) });
        }
        let mut answers: Vec<Option<PeerAnswer<T>>> = peers.iter().map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((index, answer)) => answers[index] = Some(answer),
                // A request task cannot panic short of a bug; its slot is filled below.
                Err(e) => tracing::error!(error = %e, "peer request task failed"),
            }
        }
        answers
            .into_iter()
            .zip(peers.iter())
            .map(|(answer, peer)| {
                answer.unwrap_or_else(|| PeerAnswer {
                    peer: peer.clone(),
                    elapsed: Duration::ZERO,
                    result: Err(PeerFailure::Unreachable("request task failed".into())),
                })
            })
            .collect()
    }

    /// Asks one peer (for example the owner of a key) `path_and_query` with
    /// `scope=local`, under the same timeout and limits as [`Peers::gather`].
    pub async fn ask<T: DeserializeOwned>(
        &self,
        peer: &PeerUrl,
        path_and_query: &str,
    ) -> PeerAnswer<T> {
        match with_local_scope(path_and_query) {
            Ok(tail) => ask_peer(self.asker.clone(), peer.clone(), tail).await,
            Err(why) => PeerAnswer {
                peer: peer.clone(),
                elapsed: Duration::ZERO,
                result: Err(PeerFailure::InvalidRequest(why)),
            },
        }
    }
}

fn all_failed<T>(peers: &[PeerUrl], why: &'static str) -> Vec<PeerAnswer<T>> {
    peers
        .iter()
        .map(|peer| PeerAnswer {
            peer: peer.clone(),
            elapsed: Duration::ZERO,
            result: Err(PeerFailure::InvalidRequest(why)),
        })
        .collect()
}

async fn ask_peer<T: DeserializeOwned>(
    asker: Arc<Asker>,
    peer: PeerUrl,
    uri_tail: String,
) -> PeerAnswer<T> {
    let started = Instant::now();
    let result = match tokio::time::timeout(asker.timeout, fetch(&asker, &peer, &uri_tail)).await {
        Ok(result) => result,
        Err(_) => Err(PeerFailure::Timeout(asker.timeout)),
    };
    PeerAnswer {
        peer,
        elapsed: started.elapsed(),
        result,
    }
}

async fn fetch<T: DeserializeOwned>(
    asker: &Asker,
    peer: &PeerUrl,
    uri_tail: &str,
) -> Result<T, PeerFailure> {
    let uri: Uri = format!("{peer}{uri_tail}")
        .parse()
        .map_err(|_| PeerFailure::InvalidRequest("not a valid URI with this peer"))?;
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header(header::ACCEPT, "application/json");
    if let Some(auth) = &asker.authorization {
        request = request.header(header::AUTHORIZATION, auth.clone());
    }
    let request = request
        .body(Empty::new())
        .map_err(|_| PeerFailure::InvalidRequest("the request cannot be built"))?;
    let response = asker
        .client
        .request(request)
        .await
        .map_err(|e| PeerFailure::Unreachable(error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        let body = read_limited(response.into_body(), MAX_ERROR_BODY)
            .await
            .unwrap_or_default();
        let error = serde_json::from_slice::<ErrorBody>(&body).ok();
        let excerpt = if error.is_some() {
            String::new()
        } else {
            let end = body.len().min(ERROR_EXCERPT);
            String::from_utf8_lossy(&body[..end]).into_owned()
        };
        return Err(PeerFailure::Status {
            status,
            error,
            body: excerpt,
        });
    }
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > asker.max_body as u64) {
        return Err(PeerFailure::TooLarge {
            limit: asker.max_body,
        });
    }
    let body = read_limited(response.into_body(), asker.max_body).await?;
    // Parsing a large answer is CPU work on an async thread; answers are bounded and a
    // fan-out parses one per peer, so it stays short.
    serde_json::from_slice(&body).map_err(|e| PeerFailure::BadBody(e.to_string()))
}

/// Reads a body up to `limit` bytes, whatever `Content-Length` claims.
async fn read_limited(body: hyper::body::Incoming, limit: usize) -> Result<Bytes, PeerFailure> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(PeerFailure::TooLarge { limit })
        }
        Err(e) => Err(PeerFailure::Unreachable(format!(
            "reading the body: {}",
            error_chain(e.as_ref())
        ))),
    }
}

/// An error and its sources, so "client error (Connect)" says "connection refused".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::http::HeaderMap;
    use axum::routing::get;
    use serde::Deserialize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// What the echo route saw.
    #[derive(Debug, Deserialize)]
    struct Echo {
        query: Option<String>,
        auth: Option<String>,
        name: String,
    }

    /// An axum server on a real socket; it lives as long as the test's runtime.
    async fn serve(router: Router) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{addr}")
    }

    /// A peer that answers every request with what it saw, tagged with `name`.
    fn echo(name: &'static str) -> Router {
        Router::new().route(
            "/api/echo",
            get(move |uri: Uri, headers: HeaderMap| async move {
                axum::Json(serde_json::json!({
                    "name": name,
                    "query": uri.query(),
                    "auth": headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap()),
                }))
            }),
        )
    }

    /// A peer that never answers.
    fn hanging() -> Router {
        Router::new().fallback(|| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "too late"
        })
    }

    /// A port nothing listens on.
    async fn closed_port() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("http://{addr}")
    }

    /// A raw peer that streams a chunked 200 body without a length, far over `bytes`.
    async fn endless_chunks(bytes: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                transfer-encoding: chunked\r\n\r\n";
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = format!("400\r\n{}\r\n", "[".repeat(0x400));
                    for _ in 0..(bytes / 0x400) * 4 {
                        if stream.write_all(chunk.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    let _ = stream.write_all(b"0\r\n\r\n").await;
                });
            }
        });
        format!("http://{addr}")
    }

    fn config(timeout: Duration) -> PeersConfig {
        PeersConfig {
            timeout,
            ..PeersConfig::default()
        }
    }

    #[tokio::test]
    async fn answers_come_in_peer_order_with_scope_local_and_the_token() {
        let first = serve(echo("first")).await;
        let second = serve(echo("second")).await;
        let peers = Peers::new(
            &[&second, &first],
            PeersConfig {
                api_token: Some("s3cret".into()),
                ..PeersConfig::default()
            },
        )
        .unwrap();
        let answers = peers
            .gather::<Echo>("/api/echo?tenant=acme&scope=fleet")
            .await;
        let names: Vec<&str> = answers
            .iter()
            .map(|a| a.result.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(names, ["second", "first"]);
        for answer in &answers {
            let echo = answer.result.as_ref().unwrap();
            assert_eq!(echo.query.as_deref(), Some("tenant=acme&scope=local"));
            assert_eq!(echo.auth.as_deref(), Some("Bearer s3cret"));
        }
        assert_eq!(answers[0].peer.as_str(), second);

        let untokened = Peers::new(&[&first], PeersConfig::default()).unwrap();
        let one = untokened
            .ask::<Echo>(&untokened.urls()[0], "/api/echo")
            .await;
        let echo = one.result.unwrap();
        assert_eq!(echo.auth, None);
        assert_eq!(echo.query.as_deref(), Some("scope=local"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_failure_is_named_and_a_4xx_is_not_an_outage() {
        const LIMIT: usize = 4096;
        let refused = closed_port().await;
        let failing = serve(
            Router::new()
                .fallback(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom: internal") }),
        )
        .await;
        let unknown_tenant = serve(Router::new().fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({
                    "error": "unknown_tenant",
                    "message": "no tenant acme",
                })),
            )
        }))
        .await;
        let garbage = serve(Router::new().fallback(|| async {
            (
                [(header::CONTENT_TYPE, "application/json")],
                "{\"name\": tru",
            )
        }))
        .await;
        let oversized = serve(Router::new().fallback(|| async { "x".repeat(LIMIT + 1) })).await;
        let chunked = endless_chunks(LIMIT).await;
        let hung = serve(hanging()).await;
        let fine = serve(echo("fine")).await;

        let timeout = Duration::from_secs(3);
        let peers = Peers::new(
            &[
                &refused,
                &failing,
                &unknown_tenant,
                &garbage,
                &oversized,
                &chunked,
                &hung,
                &fine,
            ],
            PeersConfig {
                timeout,
                api_token: None,
                max_body_bytes: LIMIT,
            },
        )
        .unwrap();
        let answers = peers.gather::<Echo>("/api/echo").await;
        let labels: Vec<&str> = answers
            .iter()
            .map(|a| a.result.as_ref().map_or_else(PeerFailure::as_str, |_| "ok"))
            .collect();
        assert_eq!(
            labels,
            [
                "unreachable",
                "status",
                "status",
                "bad_body",
                "too_large",
                "too_large",
                "timeout",
                "ok"
            ],
            "{answers:#?}"
        );
        let failure = |i: usize| answers[i].result.as_ref().unwrap_err();

        assert!(failure(0).is_outage());
        assert!(failure(0).to_string().contains("onnect"), "{}", failure(0));

        assert_eq!(failure(1).status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(failure(1).is_outage());
        match failure(1) {
            PeerFailure::Status { error, body, .. } => {
                assert!(error.is_none());
                assert_eq!(body, "boom: internal");
            }
            other => panic!("{other}"),
        }

        assert_eq!(failure(2).status(), Some(StatusCode::NOT_FOUND));
        assert!(!failure(2).is_outage(), "a 404 is an answer");
        match failure(2) {
            PeerFailure::Status {
                error: Some(e),
                body,
                ..
            } => {
                assert_eq!(e.error, "unknown_tenant");
                assert_eq!(e.message, "no tenant acme");
                assert!(body.is_empty());
            }
            other => panic!("{other}"),
        }
        for i in 3..7 {
            assert!(failure(i).is_outage(), "{}", failure(i));
        }
        assert!(answers[6].elapsed >= timeout);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn peers_are_asked_at_the_same_time() {
        // Each peer answers only once both have been asked: asked one after the other,
        // the first would wait for the second until the timeout.
        let both_asked = Arc::new(tokio::sync::Barrier::new(2));
        let waiting = |name: &'static str| {
            let both_asked = both_asked.clone();
            Router::new().fallback(move || async move {
                both_asked.wait().await;
                axum::Json(serde_json::json!({ "name": name }))
            })
        };
        let a = serve(waiting("a")).await;
        let b = serve(waiting("b")).await;
        let peers = Peers::new(&[&a, &b], config(Duration::from_secs(20))).unwrap();
        let answers = peers.gather::<Echo>("/api/x").await;
        let names: Vec<&str> = answers
            .iter()
            .map(|a| a.result.as_ref().expect("answered").name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hanging_peers_each_time_out() {
        let timeout = Duration::from_millis(500);
        let peers = Peers::new(
            &[serve(hanging()).await, serve(hanging()).await],
            config(timeout),
        )
        .unwrap();
        let started = Instant::now();
        let answers = peers.gather::<Echo>("/api/x").await;
        // Printed, not asserted: about one timeout, not two.
        eprintln!("two hanging peers took {:?}", started.elapsed());
        for answer in &answers {
            assert!(matches!(answer.result, Err(PeerFailure::Timeout(t)) if t == timeout));
            assert!(answer.elapsed >= timeout);
        }
    }

    #[tokio::test]
    async fn a_bad_path_fails_every_peer_without_a_request() {
        let fine = serve(echo("fine")).await;
        let peers = Peers::new(&[&fine], PeersConfig::default()).unwrap();
        let answers = peers.gather::<Echo>("api/echo").await;
        assert_eq!(answers.len(), 1);
        assert!(matches!(
            answers[0].result,
            Err(PeerFailure::InvalidRequest(_))
        ));
        let none = Peers::new::<&str>(&[], PeersConfig::default()).unwrap();
        assert!(none.gather::<Echo>("/api/echo").await.is_empty());
    }
}
