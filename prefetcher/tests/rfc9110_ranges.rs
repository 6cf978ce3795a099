//! Conformance of range requests with RFC 9110 §14 (and §13.1.5 `If-Range`,
//! §15.3.7 `206`, §15.5.17 `416`), each case written from the RFC's text, against a
//! counting origin on a real socket. The origin here serves no ranges of its own:
//! every `206` a client sees was cut by the node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use models::TenantId;
use prefetcher::testing::wait_until;
use prefetcher::{CacheStatus, Config, NodeHandle, ServeOptions, serve, spawn_node};
use tokio::sync::watch;

/// The `Last-Modified` of every object: long before any `Date` the origin sends, so
/// it is a strong validator (RFC 9110 §8.8.2.2).
const LAST_MODIFIED: &str = "Sun, 01 Nov 2026 00:00:00 GMT";

#[derive(Default)]
struct OriginState {
    requests: Mutex<HashMap<String, usize>>,
    ranges_seen: Mutex<Vec<Option<String>>>,
    held: Mutex<Option<watch::Receiver<bool>>>,
}

/// A counting origin. `GET /{size}/{name}` answers `size` bytes (byte `i` is
/// `i % 251`) with `Content-Length`, `ETag: "{name}"` (`W/"{name}"` when the name
/// starts with `weak`), `Last-Modified` and `max-age=300`; under `/chunked/` the same
/// without `Content-Length`. It never honours `Range`, and records the `Range` of
/// every request.
struct Origin {
    addr: SocketAddr,
    state: Arc<OriginState>,
    release_tx: Option<watch::Sender<bool>>,
    _task: tokio::task::JoinHandle<()>,
}

fn object(size: usize) -> Bytes {
    (0..size)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn origin_handler(State(state): State<Arc<OriginState>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    *state
        .requests
        .lock()
        .unwrap()
        .entry(path.clone())
        .or_default() += 1;
    state.ranges_seen.lock().unwrap().push(
        request
            .headers()
            .get(header::RANGE)
            .map(|v| v.to_str().unwrap().to_string()),
    );
    let held = state.held.lock().unwrap().clone();
    if let Some(mut held) = held {
        let _ = held.wait_for(|released| *released).await;
    }
    let (chunked, rest) = match path.strip_prefix("/chunked") {
        Some(rest) => (true, rest),
        None => (false, path.as_str()),
    };
    let mut segments = rest.trim_start_matches('/').split('/');
    let size: usize = segments.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let name = segments.next().unwrap_or("x").to_string();
    let body = object(size);
    let mut response = if chunked {
        Response::new(Body::from_stream(futures::stream::iter([Ok::<
            Bytes,
            std::io::Error,
        >(body)])))
    } else {
        let mut r = Response::new(Body::from(body.clone()));
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        r
    };
    let headers = response.headers_mut();
    let etag = if name.starts_with("weak") {
        format!("W/\"{name}\"")
    } else {
        format!("\"{name}\"")
    };
    headers.insert(header::ETAG, HeaderValue::from_str(&etag).unwrap());
    headers.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_static(LAST_MODIFIED),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

impl Origin {
    async fn start() -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(OriginState::default());
        let router = Router::new()
            .fallback(origin_handler)
            .with_state(Arc::clone(&state));
        let task = tokio::spawn(serve(
            listener,
            router,
            std::future::pending(),
            ServeOptions::default(),
        ));
        Origin {
            addr,
            state,
            release_tx: None,
            _task: task,
        }
    }

    /// Requests for `path` so far.
    fn requests(&self, path: &str) -> usize {
        *self.state.requests.lock().unwrap().get(path).unwrap_or(&0)
    }

    /// The `Range` of each request so far, in order.
    fn ranges_seen(&self) -> Vec<Option<String>> {
        self.state.ranges_seen.lock().unwrap().clone()
    }

    /// Holds every response until [`release`](Self::release).
    fn hold(&mut self) {
        let (tx, rx) = watch::channel(false);
        *self.state.held.lock().unwrap() = Some(rx);
        self.release_tx = Some(tx);
    }

    fn release(&mut self) {
        if let Some(tx) = self.release_tx.take() {
            let _ = tx.send(true);
        }
        *self.state.held.lock().unwrap() = None;
    }
}

async fn node(origin: &Origin, configure: impl FnOnce(&mut Config)) -> NodeHandle {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        format!("http://{}", origin.addr),
    );
    c.cache.jitter = 0.0;
    c.origin.header_timeout_ms = 20_000;
    c.flight.wait_timeout_ms = 20_000;
    configure(&mut c);
    spawn_node(c).await.unwrap()
}

struct Got {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Got {
    fn header(&self, name: header::HeaderName) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn x_cache(&self) -> Option<CacheStatus> {
        CacheStatus::parse(self.headers.get("x-cache")?.to_str().ok()?)
    }
}

async fn get(node: &NodeHandle, path: &str, headers: &[(&str, &str)]) -> Got {
    request(node, reqwest::Method::GET, path, headers).await
}

async fn request(
    node: &NodeHandle,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", node.url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    Got {
        status,
        headers,
        body,
    }
}

/// A node with `path` already cached by one plain `GET`.
async fn cached(origin: &Origin, path: &str) -> NodeHandle {
    let node = node(origin, |_| {}).await;
    let first = get(&node, path, &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(origin.requests(path), 1);
    node
}

fn slice(size: usize, range: std::ops::RangeInclusive<usize>) -> Bytes {
    object(size).slice(range)
}

/// §14.2: "A server that supports range requests … responds with 206 (Partial
/// Content)"; §14.4: the 206 "MUST generate a Content-Range header field";
/// §15.3.7.1: a single part has the part's `Content-Type` and `Content-Length`.
#[tokio::test]
async fn s14_2_a_single_range_of_a_cached_response_is_a_206_from_the_cache() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/10000/single").await;
    let got = get(&node, "/10000/single", &[("range", "bytes=0-499")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.header(header::CONTENT_RANGE), Some("bytes 0-499/10000"));
    assert_eq!(got.header(header::CONTENT_LENGTH), Some("500"));
    assert_eq!(
        got.header(header::CONTENT_TYPE),
        Some("application/octet-stream")
    );
    assert_eq!(got.body, slice(10_000, 0..=499));
    assert_eq!(got.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(origin.requests("/10000/single"), 1, "served from the cache");
}

/// §14.1.2: "bytes=-500" is the final 500 bytes; "bytes=9500-" the bytes from 9500
/// to the end; a last-pos past the end is "the remainder of the representation".
#[tokio::test]
async fn s14_1_2_suffix_and_open_ranges_are_served() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/10000/open").await;
    for (range, content_range, bytes) in [
        ("bytes=-500", "bytes 9500-9999/10000", 9500..=9999),
        ("bytes=9500-", "bytes 9500-9999/10000", 9500..=9999),
        ("bytes=9990-20000", "bytes 9990-9999/10000", 9990..=9999),
        ("bytes=-20000", "bytes 0-9999/10000", 0..=9999),
    ] {
        let got = get(&node, "/10000/open", &[("range", range)]).await;
        assert_eq!(got.status, StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(got.header(header::CONTENT_RANGE), Some(content_range));
        assert_eq!(got.body, slice(10_000, bytes), "{range}");
    }
    assert_eq!(origin.requests("/10000/open"), 1);
}

/// One part of a `multipart/byteranges` body: its headers (names lower-cased) and
/// bytes.
type Part = (Vec<(String, String)>, Vec<u8>);

/// The parts of a `multipart/byteranges` body.
fn multipart_parts(content_type: &str, body: &[u8]) -> Vec<Part> {
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .expect("a boundary parameter")
        .trim_matches('"');
    let delimiter = format!("\r\n--{boundary}");
    let text = body;
    let mut parts = Vec::new();
    let mut rest = text;
    // Each part: delimiter CRLF headers CRLF CRLF bytes; the body ends with delimiter "--".
    loop {
        let at = find(rest, delimiter.as_bytes()).expect("a delimiter");
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .expect("CRLF after the delimiter");
        let end_of_headers = find(rest, b"\r\n\r\n").expect("the end of a part's headers");
        let headers: Vec<(String, String)> = std::str::from_utf8(&rest[..end_of_headers])
            .unwrap()
            .split("\r\n")
            .map(|line| {
                let (k, v) = line.split_once(':').unwrap();
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        rest = &rest[end_of_headers + 4..];
        // The part's length is stated by its Content-Range.
        let range = &headers
            .iter()
            .find(|(k, _)| k == "content-range")
            .unwrap()
            .1;
        let (first, last) = range
            .strip_prefix("bytes ")
            .unwrap()
            .split_once('/')
            .unwrap()
            .0
            .split_once('-')
            .unwrap();
        let n = last.parse::<usize>().unwrap() - first.parse::<usize>().unwrap() + 1;
        parts.push((headers, rest[..n].to_vec()));
        rest = &rest[n..];
    }
    parts
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// §14.6: several ranges are sent as `multipart/byteranges`, each part with its
/// `Content-Range` (and the representation's `Content-Type`), in the order asked;
/// §14.1.2: an unsatisfiable range in a set with a satisfiable one is left out.
#[tokio::test]
async fn s14_6_several_ranges_are_a_multipart_byteranges_body() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/10000/multi").await;
    let got = get(
        &node,
        "/10000/multi",
        &[("range", "bytes=9000-9099, 0-9, 20000-")],
    )
    .await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.header(header::CONTENT_RANGE), None, "only in the parts");
    let content_type = got.header(header::CONTENT_TYPE).unwrap().to_string();
    assert!(
        content_type.starts_with("multipart/byteranges; boundary="),
        "{content_type}"
    );
    assert_eq!(
        got.header(header::CONTENT_LENGTH),
        Some(got.body.len().to_string().as_str())
    );
    let parts = multipart_parts(&content_type, &got.body);
    assert_eq!(parts.len(), 2);
    let expect = [
        ("bytes 9000-9099/10000", slice(10_000, 9000..=9099)),
        ("bytes 0-9/10000", slice(10_000, 0..=9)),
    ];
    for ((headers, bytes), (content_range, expected)) in parts.iter().zip(expect) {
        let h = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("content-range"), Some(content_range));
        assert_eq!(h("content-type"), Some("application/octet-stream"));
        assert_eq!(bytes.as_slice(), &expected[..]);
    }
    assert_eq!(origin.requests("/10000/multi"), 1);
}

/// §14.1.2 and §15.5.17: when no range is satisfiable the answer is 416, and "the
/// server SHOULD send a Content-Range header field with an unsatisfied-range value"
/// (`bytes */length`).
#[tokio::test]
async fn s15_5_17_an_unsatisfiable_range_is_a_416_with_the_length() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/10000/unsat").await;
    for range in ["bytes=10000-", "bytes=-0", "bytes=20000-30000, 10000-"] {
        let got = get(&node, "/10000/unsat", &[("range", range)]).await;
        assert_eq!(got.status, StatusCode::RANGE_NOT_SATISFIABLE, "{range}");
        assert_eq!(got.header(header::CONTENT_RANGE), Some("bytes */10000"));
        assert!(got.body.is_empty());
    }
    assert_eq!(origin.requests("/10000/unsat"), 1);
}

/// §14.2: "A server MAY ignore the Range header field" and "An origin server MUST
/// ignore a Range header field that contains a range unit it does not understand";
/// an invalid `ranges-specifier` (here: last-pos below first-pos, §14.1.1) is
/// ignored too: the full 200. §14.2 also: GET is the only method with range
/// semantics, so a HEAD ignores it.
#[tokio::test]
async fn s14_2_invalid_or_unknown_ranges_are_ignored_for_the_full_200() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/1000/ignored").await;
    for range in ["bytes=500-100", "items=0-1", "bytes=abc", "bytes 0-1"] {
        let got = get(&node, "/1000/ignored", &[("range", range)]).await;
        assert_eq!(got.status, StatusCode::OK, "{range}");
        assert_eq!(got.body, object(1000), "{range}");
        assert_eq!(got.header(header::CONTENT_RANGE), None);
        assert_eq!(got.x_cache(), Some(CacheStatus::Hit));
    }
    let head = request(
        &node,
        reqwest::Method::HEAD,
        "/1000/ignored",
        &[("range", "bytes=0-9")],
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.header(header::CONTENT_RANGE), None);
    assert_eq!(origin.requests("/1000/ignored"), 1);
}

/// §14.3: "A server that supports range requests … MAY send Accept-Ranges: bytes".
/// The node serves ranges of what it caches, and says so on cached responses.
#[tokio::test]
async fn s14_3_cached_responses_advertise_byte_ranges() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/100/advertised").await;
    let got = get(&node, "/100/advertised", &[]).await;
    assert_eq!(got.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(got.header(header::ACCEPT_RANGES), Some("bytes"));
}

/// §13.1.5: "the recipient … MUST ignore the Range header field" unless the
/// `If-Range` validator matches by strong comparison (an entity-tag) or exactly
/// equals a strong `Last-Modified` (a date); a weak entity-tag never matches. When
/// it does not match, the whole representation is sent (200).
#[tokio::test]
async fn s13_1_5_if_range_falls_back_to_the_full_200_unless_it_matches() {
    let origin = Origin::start().await;
    let node = cached(&origin, "/1000/v1").await;
    let range = ("range", "bytes=0-9");
    let partial = [
        vec![range, ("if-range", "\"v1\"")],
        vec![range, ("if-range", LAST_MODIFIED)],
    ];
    for headers in &partial {
        let got = get(&node, "/1000/v1", headers).await;
        assert_eq!(got.status, StatusCode::PARTIAL_CONTENT, "{headers:?}");
        assert_eq!(got.body, slice(1000, 0..=9));
    }
    let full = [
        vec![range, ("if-range", "\"v2\"")],
        vec![range, ("if-range", "W/\"v1\"")],
        vec![range, ("if-range", "Mon, 02 Nov 2026 00:00:00 GMT")],
        vec![range, ("if-range", "not a validator")],
    ];
    for headers in &full {
        let got = get(&node, "/1000/v1", headers).await;
        assert_eq!(got.status, StatusCode::OK, "{headers:?}");
        assert_eq!(got.body, object(1000));
    }
    // A weak stored entity-tag never matches, even when it is the same tag.
    let weak = cached(&origin, "/1000/weak").await;
    let got = get(&weak, "/1000/weak", &[range, ("if-range", "\"weak\"")]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(origin.requests("/1000/v1"), 1);
}

/// The node's own rule for misses: range requests on a cold key share one fill of
/// the whole object with the plain GETs (single flight), and each client gets its
/// own 206 cut from the streamed body; the object is then cached for all.
#[tokio::test]
async fn a_range_miss_fills_the_whole_object_once_for_every_request() {
    let mut origin = Origin::start().await;
    let node = node(&origin, |_| {}).await;
    origin.hold();
    let path = "/10000/cold";
    let asked = [
        Some("bytes=0-99"),
        Some("bytes=-10"),
        Some("bytes=5000-"),
        Some("bytes=0-0,9999-9999"),
        Some("bytes=20000-"),
        None,
    ];
    let mut tasks = Vec::new();
    for (i, range) in asked.into_iter().enumerate() {
        let url = format!("{}{path}", node.url());
        tasks.push(tokio::spawn(async move {
            let mut r = reqwest::Client::new().get(url);
            if let Some(range) = range {
                r = r.header("range", range);
            }
            let response = r.send().await.unwrap();
            let status = response.status();
            let x_cache = response.headers().get("x-cache").cloned();
            let body = response.bytes().await.unwrap();
            (i, status, x_cache, body)
        }));
        if i == 0 {
            wait_until(|| origin.requests(path) == 1, "the leader's fill").await;
        }
    }
    let metrics = node.node().metrics();
    wait_until(
        || metrics.waiters_joined.get() == asked.len() as u64 - 1,
        "every other request to join",
    )
    .await;
    origin.release();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    results.sort_by_key(|r| r.0);
    let all = object(10_000);
    assert_eq!(results[0].1, StatusCode::PARTIAL_CONTENT);
    assert_eq!(results[0].2.as_ref().unwrap(), "MISS");
    assert_eq!(results[0].3, all.slice(0..100));
    assert_eq!(results[1].1, StatusCode::PARTIAL_CONTENT);
    assert_eq!(results[1].2.as_ref().unwrap(), "COLLAPSED");
    assert_eq!(results[1].3, all.slice(9990..));
    assert_eq!(results[2].3, all.slice(5000..));
    assert_eq!(results[3].1, StatusCode::PARTIAL_CONTENT);
    assert!(
        find(&results[3].3, b"Content-Range: bytes 9999-9999/10000").is_some(),
        "a multipart body"
    );
    assert_eq!(results[4].1, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(results[5].1, StatusCode::OK);
    assert_eq!(results[5].3, all);
    assert_eq!(origin.requests(path), 1, "one fill for all");
    assert!(
        origin.ranges_seen().iter().all(Option::is_none),
        "the fill asks for the whole object"
    );
    let hit = get(&node, path, &[("range", "bytes=1-2")]).await;
    assert_eq!(hit.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(hit.body, all.slice(1..3));
}

/// Past `cache.max_object_bytes` a range request is passed to the origin unchanged
/// (its `Range` included), not collapsed and not stored; once the node has seen the
/// object is too large, later range requests go straight to the origin.
#[tokio::test]
async fn a_range_miss_beyond_max_object_bytes_passes_through_unchanged() {
    let origin = Origin::start().await;
    let node = node(&origin, |c| c.cache.max_object_bytes = 4096).await;
    let path = "/10000/large";
    let first = get(&node, path, &[("range", "bytes=0-9")]).await;
    assert_eq!(first.x_cache(), Some(CacheStatus::Bypass));
    // This origin ignores Range: what it answers is what the client gets.
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, object(10_000));
    // The abandoned whole-object fill, then the range request itself.
    assert_eq!(origin.requests(path), 2);
    assert_eq!(
        origin.ranges_seen(),
        [None, Some("bytes=0-9".to_string())],
        "passed on unchanged"
    );
    let second = get(&node, path, &[("range", "bytes=10-19")]).await;
    assert_eq!(second.x_cache(), Some(CacheStatus::Bypass));
    assert_eq!(origin.requests(path), 3, "straight to the origin");
    assert_eq!(
        origin.ranges_seen().last().unwrap().as_deref(),
        Some("bytes=10-19")
    );
    assert_eq!(node.node().cache().entry_count(), 0, "nothing stored");
}

/// A fill whose length is unknown until its end (no `Content-Length`) cannot be
/// cut as it streams: the range request goes to the origin, the fill still caches
/// the object, and later range requests are served from it.
#[tokio::test]
async fn a_range_miss_without_a_length_goes_to_the_origin_and_later_hits() {
    let origin = Origin::start().await;
    let node = node(&origin, |_| {}).await;
    let path = "/chunked/1000/unsized";
    let first = get(&node, path, &[("range", "bytes=0-9")]).await;
    assert_eq!(first.x_cache(), Some(CacheStatus::Bypass));
    assert_eq!(
        origin.ranges_seen().last().unwrap().as_deref(),
        Some("bytes=0-9")
    );
    wait_until(
        || node.node().cache().entry_count() == 1,
        "the fill to be stored",
    )
    .await;
    let second = get(&node, path, &[("range", "bytes=0-9")]).await;
    assert_eq!(second.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(second.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(second.body, slice(1000, 0..=9));
    assert_eq!(origin.requests(path), 2);
}
