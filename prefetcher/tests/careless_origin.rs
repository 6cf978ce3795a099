//! What a careless origin sends, as raw bytes on a real socket: ambiguous framing
//! (RFC 9112 §6), an unsolicited `101`, conflicting freshness, a pooled connection
//! closed under a request, finely chunked and oversized bodies; and what a patient
//! client can make the cache keep (`Vary` variants) or the origin see (a repeated
//! query parameter). Each row: what the client gets, and whether anything of it was
//! stored (a second request reaches the origin again).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use prefetcher::testing::{TestClient, TestNode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use common::{HOST, config};

/// An origin on a raw socket. `answer` gets the connection's number (from 0), the
/// request's number on it (from 0) and its head, and gives the bytes to answer, or
/// `None` to close the connection without a byte. After an answer the connection is
/// closed unless `keep_alive`. It keeps every request head it read.
struct RawOrigin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

type Answer = dyn Fn(usize, usize, &str) -> Option<Vec<u8>> + Send + Sync;

impl RawOrigin {
    async fn start(answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> RawOrigin {
        RawOrigin::start_with(false, move |_, _, head| Some(answer(head))).await
    }

    async fn start_with(
        keep_alive: bool,
        answer: impl Fn(usize, usize, &str) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> RawOrigin {
        RawOrigin::start_delayed(keep_alive, Duration::ZERO, answer).await
    }

    /// [`start_with`](Self::start_with), each answer written `delay` after its
    /// request was read (time for other requests to join its fill).
    async fn start_delayed(
        keep_alive: bool,
        delay: Duration,
        answer: impl Fn(usize, usize, &str) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> RawOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        let answer: Arc<Answer> = Arc::new(answer);
        tokio::spawn(async move {
            for conn in 0.. {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let (seen, answer) = (Arc::clone(&seen), Arc::clone(&answer));
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    for n in 0.. {
                        let end = loop {
                            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break end;
                            }
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(read) => buf.extend_from_slice(&chunk[..read]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.clear();
                        let reply = answer(conn, n, &head);
                        seen.lock().unwrap().push(head);
                        let Some(reply) = reply else { return };
                        tokio::time::sleep(delay).await;
                        if stream.write_all(&reply).await.is_err() || !keep_alive {
                            let _ = stream.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        RawOrigin { addr, heads }
    }

    fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }

    /// The request line of the `i`th request.
    fn request_line(&self, i: usize) -> String {
        let heads = self.heads.lock().unwrap();
        heads[i].lines().next().unwrap_or("").to_string()
    }
}

/// A node in front of an origin that answers every request with `reply`.
async fn node_before(reply: &'static str) -> (RawOrigin, TestNode) {
    let origin = RawOrigin::start(move |_| reply.as_bytes().to_vec()).await;
    let node = TestNode::start(config(&format!("http://{}", origin.addr))).await;
    (origin, node)
}

/// Two `GET path`s: both must be `502`, both reach the origin (nothing stored), and
/// both fills are counted as failed for `reason`.
async fn refused_twice(reply: &'static str, reason: &str) {
    let (origin, node) = node_before(reply).await;
    let client = TestClient::new();
    for n in 1..=2 {
        let r = client.get(node.addr, HOST, "/x").await.unwrap();
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{reply:?}: {r:?}");
        assert_eq!(
            origin.requests(),
            n,
            "{reply:?}: the second request refills"
        );
    }
    let failures = node.node.metrics().encode();
    assert!(
        failures.contains(&format!("reason=\"{reason}\"}} 2")),
        "{reply:?}: counted as {reason}"
    );
}

#[tokio::test]
async fn content_length_beside_chunked_is_refused_not_truncated() {
    refused_twice(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5\r\n\
         Transfer-Encoding: chunked\r\n\r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n",
        "malformed",
    )
    .await;
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_refused() {
    refused_twice(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\n\
         Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nxxxxx\r\n0\r\n\r\n",
        "malformed",
    )
    .await;
}

#[tokio::test]
async fn an_unsolicited_switching_protocols_is_refused() {
    refused_twice(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "malformed",
    )
    .await;
}

#[tokio::test]
async fn differing_content_lengths_are_refused() {
    refused_twice(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5, 6\r\n\r\nhello!",
        // hyper refuses these itself.
        "connect",
    )
    .await;
}

#[tokio::test]
async fn a_list_of_one_content_length_becomes_that_length() {
    let (origin, node) = node_before(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5, 5\r\n\r\nhello",
    )
    .await;
    let client = TestClient::new();
    for cache in ["MISS", "HIT"] {
        let r = client.get(node.addr, HOST, "/x").await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), b"hello", "{cache}");
        assert_eq!(r.headers["content-length"], "5", "{cache}");
        assert_eq!(r.headers["x-cache"], cache);
    }
    assert_eq!(origin.requests(), 1);
}

/// `max-age=0` then `max-age=31536000`: the shortest holds (RFC 9111 §4.2.1), so
/// the second request is not a year-long hit.
#[tokio::test]
async fn conflicting_lifetimes_are_read_conservatively() {
    for reply in [
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=0\r\nCache-Control: max-age=31536000\r\n\
         Content-Length: 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nCache-Control: s-maxage=0, s-maxage=31536000\r\n\
         Content-Length: 2\r\n\r\nok",
    ] {
        let (origin, node) = node_before(reply).await;
        let client = TestClient::new();
        for n in 1..=2 {
            let r = client.get(node.addr, HOST, "/x").await.unwrap();
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(origin.requests(), n, "{reply:?}: not served from the cache");
        }
    }
}

/// The values of a repeated parameter reach the origin in the client's order; the
/// names are sorted (one key for `?b&a` and `?a&b`), and two orders of the values
/// are two keys.
#[tokio::test]
async fn repeated_query_parameters_keep_their_order() {
    let (origin, node) =
        node_before("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 2\r\n\r\nok")
            .await;
    let client = TestClient::new();
    client
        .get(node.addr, HOST, "/q?sort=price&b=1&sort=date")
        .await
        .unwrap();
    assert_eq!(
        origin.request_line(0),
        "GET /q?b=1&sort=price&sort=date HTTP/1.1"
    );
    let hit = client
        .get(node.addr, HOST, "/q?b=1&sort=price&sort=date")
        .await
        .unwrap();
    assert_eq!(hit.headers["x-cache"], "HIT");
    client
        .get(node.addr, HOST, "/q?sort=date&sort=price&b=1")
        .await
        .unwrap();
    assert_eq!(
        origin.requests(),
        2,
        "another order of values is another key"
    );
    assert_eq!(
        origin.request_line(1),
        "GET /q?b=1&sort=date&sort=price HTTP/1.1"
    );
}

/// A pooled connection the origin closes when the next request arrives, before any
/// byte of an answer (the keep-alive race): a `GET` fill is sent once more on a
/// fresh connection and served; a `POST` is not sent again (its client gets `502`).
#[tokio::test]
async fn a_fill_on_a_connection_the_origin_just_closed_is_sent_again() {
    // Every connection answers its first request and closes on its second.
    let origin = RawOrigin::start_with(true, |_, n, _| {
        (n == 0).then(|| {
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 2\r\n\r\nok".to_vec()
        })
    })
    .await;
    let node = TestNode::start(config(&format!("http://{}", origin.addr))).await;
    let client = TestClient::new();
    let first = client.get(node.addr, HOST, "/a").await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    let retried = client.get(node.addr, HOST, "/b").await.unwrap();
    assert_eq!(retried.status, StatusCode::OK, "{retried:?}");
    assert_eq!(retried.body.as_deref().unwrap(), b"ok");
    assert_eq!(
        origin.requests(),
        3,
        "sent twice, answered on the fresh connection"
    );
    assert_eq!(origin.request_line(2), "GET /b HTTP/1.1");

    client.get(node.addr, HOST, "/c").await.unwrap();
    let posted = client
        .send(http::Method::POST, node.addr, HOST, "/p", &[], "x")
        .await
        .unwrap();
    assert_eq!(
        posted.status,
        StatusCode::BAD_GATEWAY,
        "a POST is not sent twice"
    );
    assert_eq!(origin.requests(), 5);
}

/// `body` in chunked coding, `chunk` bytes per chunk, after a `200` head with
/// `fields`.
fn chunked(fields: &str, body: &[u8], chunk: usize) -> Vec<u8> {
    let mut out =
        format!("HTTP/1.1 200 OK\r\n{fields}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
    for part in body.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// `n` concurrent `GET path`s, once the first has reached the origin; every
/// response read whole.
async fn burst(node: &TestNode, path: &'static str, n: usize) -> Vec<prefetcher::testing::Fetched> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let addr = node.addr;
            tokio::spawn(async move { TestClient::new().get(addr, HOST, path).await.unwrap() })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A body sent one byte per chunk reaches the leader and its collapsed waiters
/// whole and is stored (the fill coalesces what it keeps and publishes:
/// `proxy::fill_body`'s tests count it).
#[tokio::test]
async fn a_body_in_one_byte_chunks_is_served_whole_and_stored() {
    // Small: hyper decodes a chunk in ~0.2 ms in a debug build.
    let body = pattern(6 * 1024);
    let reply = chunked("Cache-Control: max-age=600\r\n", &body, 1);
    let origin = RawOrigin::start_delayed(false, Duration::from_millis(300), move |_, _, _| {
        Some(reply.clone())
    })
    .await;
    let node = TestNode::start(config(&format!("http://{}", origin.addr))).await;
    for r in burst(&node, "/fine", 4).await {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), &body[..]);
    }
    assert_eq!(origin.requests(), 1, "one fill for the burst");
    let hit = TestClient::new()
        .get(node.addr, HOST, "/fine")
        .await
        .unwrap();
    assert_eq!(hit.headers["x-cache"], "HIT");
    assert_eq!(hit.body.as_deref().unwrap(), &body[..]);
    let held = &node.node.metrics().fill_bytes_held;
    assert_eq!(
        held.get(),
        0,
        "the stored body is the cache's to account for"
    );
}

/// An unsized body past `cache.max_object_bytes` is not stored, and streams whole
/// to the leader and every client collapsed on its fill (it was cut at the limit
/// for all of them); the next request fetches again.
#[tokio::test]
async fn an_unsized_body_past_the_storage_limit_streams_whole_to_every_client() {
    let body = pattern(1024 * 1024);
    let reply = chunked("Cache-Control: max-age=600\r\n", &body, 8 * 1024);
    let origin = RawOrigin::start_delayed(false, Duration::from_millis(300), move |_, _, _| {
        Some(reply.clone())
    })
    .await;
    let mut c = config(&format!("http://{}", origin.addr));
    c.cache.max_object_bytes = 256 * 1024;
    let node = TestNode::start(c).await;
    let responses = burst(&node, "/big", 4).await;
    assert_eq!(origin.requests(), 1, "one fill for the burst");
    for r in responses {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().map(|b| b.len()), Ok(body.len()));
        assert_eq!(r.body.as_deref().unwrap(), &body[..]);
    }
    let next = TestClient::new()
        .get(node.addr, HOST, "/big")
        .await
        .unwrap();
    assert_eq!(next.headers["x-cache"], "MISS", "not stored");
    assert_eq!(next.body.as_deref().unwrap(), &body[..]);
    assert_eq!(origin.requests(), 2);
}

/// An object above `cache.max_object_bytes` with a `Content-Length`: a burst of
/// clients on it makes one origin fetch, every client gets the whole body (the
/// fill paces itself by the slowest), and nothing is stored.
#[tokio::test]
async fn a_burst_on_an_object_above_the_storage_limit_makes_one_origin_fetch() {
    const CLIENTS: usize = 100;
    let body = pattern(256 * 1024);
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(&body);
    let origin = RawOrigin::start_delayed(false, Duration::from_millis(1000), move |_, _, _| {
        Some(reply.clone())
    })
    .await;
    let mut c = config(&format!("http://{}", origin.addr));
    c.cache.max_object_bytes = 64 * 1024;
    let node = TestNode::start(c).await;
    let responses = burst(&node, "/download", CLIENTS).await;
    assert_eq!(origin.requests(), 1, "one origin fetch for the burst");
    for r in responses {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), &body[..]);
    }
    let next = TestClient::new()
        .get(node.addr, HOST, "/download")
        .await
        .unwrap();
    assert_eq!(next.headers["x-cache"], "MISS", "not stored");
    assert_eq!(origin.requests(), 2);
}

/// A client listing 24 KiB of made-up codings on each request to a
/// `Vary: Accept-Encoding` URL, a new query string each time: what the cache keeps
/// of the variant strings stays within its share of `cache.max_bytes` (counted
/// string by string), and its accounting within `cache.max_bytes`.
#[tokio::test]
async fn a_vary_flood_stays_within_the_cache_size() {
    let origin = RawOrigin::start_with(true, |_, _, _| {
        Some(
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nVary: Accept-Encoding\r\n\
              Content-Length: 2\r\n\r\nok"
                .to_vec(),
        )
    })
    .await;
    let mut c = config(&format!("http://{}", origin.addr));
    c.cache.max_bytes = 2 << 20;
    c.cache.max_object_bytes = 1 << 20;
    let node = TestNode::start(c).await;
    let codings: Vec<String> = (0..2_300).map(|i| format!("x-{i:08}")).collect();
    let codings = codings.join(",");
    let client = TestClient::new();
    // ~30 ms a request in a debug build: 60 are 1.4 MB of variant strings.
    for i in 0..60 {
        let r = client
            .request(
                http::Method::GET,
                node.addr,
                HOST,
                &format!("/v?n={i}"),
                &[("accept-encoding", &codings[..24 * 1024])],
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
    }
    let cache = node.node.cache();
    let held = cache.vary_variant_bytes();
    // 1/16 of the cache, at least 256 KiB: 256 KiB here.
    assert!(held <= 256 * 1024, "{held} bytes of variant strings held");
    let accounted = cache.weighted_bytes();
    assert!(accounted <= 2 << 20, "{accounted} bytes accounted");
}
