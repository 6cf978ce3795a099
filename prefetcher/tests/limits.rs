//! Request size limits and credential isolation, through real sockets on 127.0.0.1:0:
//! a request past a limit is answered 414/431/413 and never reaches the origin; a head
//! too large for hyper's buffer is refused without hurting the next connection; a
//! request with credentials never gets a cached response and never leaves one.

use std::time::Duration;

use http::{Method, StatusCode};
use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestClient, TestNode};
use prefetcher::{CacheStatus, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "edge.test";

fn config(origin: &str) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.limits.max_body_bytes = 4096;
    c
}

/// Writes `head` (and `body`) on a fresh connection and returns the status code of
/// the answer, or `None` when the server closed the connection without one.
async fn raw(addr: std::net::SocketAddr, head: &[u8], body: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may answer (and close) before it has read everything we send.
    let _ = stream.write_all(head).await;
    let _ = stream.write_all(body).await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 10 s");
    let text = String::from_utf8_lossy(&buf);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

#[tokio::test]
async fn requests_past_the_limits_are_refused_before_the_origin() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();

    // Request line: a 9 KiB target.
    let long = format!("/{}", "a".repeat(9 * 1024));
    let r = client.get(node.addr, HOST, &long).await.unwrap();
    assert_eq!(r.status, StatusCode::URI_TOO_LONG);

    // Headers: 40 headers of 1 KiB (over 32 KiB), GET and POST alike.
    let value = "v".repeat(1024);
    let names: Vec<String> = (0..40).map(|i| format!("x-pad-{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), value.as_str())).collect();
    for method in [Method::GET, Method::POST] {
        let r = client
            .request(method.clone(), node.addr, HOST, "/h", &headers)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{method}"
        );
    }

    // Body: a declared length past the limit is refused before it is read.
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: {}\r\n\r\n",
        1 << 20
    );
    assert_eq!(raw(node.addr, head.as_bytes(), &[]).await, Some(413));
    assert_eq!(origin.fills(), 0, "nothing past a limit reached the origin");

    // Within the limits everything works.
    let r = client.get(node.addr, HOST, "/ok?x=1").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let head = format!("POST /small HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: 5\r\n\r\n");
    assert_eq!(raw(node.addr, head.as_bytes(), b"hello").await, Some(200));
}

#[tokio::test]
async fn a_streamed_body_past_the_limit_is_cut_off() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let chunk = vec![b'x'; 1024];
    let mut body = Vec::new();
    for _ in 0..8 {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(&chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let head =
        format!("POST /stream HTTP/1.1\r\nhost: {HOST}\r\ntransfer-encoding: chunked\r\n\r\n");
    let status = raw(node.addr, head.as_bytes(), &body).await;
    assert!(
        !matches!(status, Some(200..=299)),
        "an 8 KiB streamed body passed a 4 KiB limit: {status:?}"
    );
    // The node still serves.
    let r = TestClient::new()
        .get(node.addr, HOST, "/after")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn a_head_too_large_for_the_buffer_is_refused_and_the_node_keeps_serving() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    // One 200 KiB header: past hyper's 64 KiB head buffer.
    let head = format!(
        "GET /big HTTP/1.1\r\nhost: {HOST}\r\nx-big: {}\r\n\r\n",
        "b".repeat(200 * 1024)
    );
    let status = raw(node.addr, head.as_bytes(), &[]).await;
    assert!(
        matches!(status, None | Some(431)),
        "expected 431 or a closed connection, got {status:?}"
    );
    let r = TestClient::new()
        .get(node.addr, HOST, "/next")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.fills_for("/big"), 0);
}

#[tokio::test]
async fn credentialed_requests_never_get_or_leave_a_cached_response() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    let credentials = [
        ("authorization", "Bearer alice"),
        ("cookie", "session=alice"),
    ];

    // An anonymous response is cached ...
    let r = client.get(node.addr, HOST, "/page").await.unwrap();
    assert_eq!(r.x_cache(), Some(CacheStatus::Miss));
    let r = client.get(node.addr, HOST, "/page").await.unwrap();
    assert_eq!(r.x_cache(), Some(CacheStatus::Hit));
    // ... but a request with credentials goes to the origin, not to that entry.
    for (i, header) in credentials.iter().enumerate() {
        let r = client
            .request(Method::GET, node.addr, HOST, "/page", &[*header])
            .await
            .unwrap();
        assert_eq!(r.x_cache(), Some(CacheStatus::Bypass), "{header:?}");
        assert_eq!(origin.fills_for("/page"), 2 + i, "{header:?}");
    }

    // A response fetched with credentials is never stored for anyone else.
    for (i, header) in credentials.iter().enumerate() {
        let path = format!("/private-{i}");
        let r = client
            .request(Method::GET, node.addr, HOST, &path, &[*header])
            .await
            .unwrap();
        assert_eq!(r.x_cache(), Some(CacheStatus::Bypass));
        let r = client.get(node.addr, HOST, &path).await.unwrap();
        assert_eq!(
            r.x_cache(),
            Some(CacheStatus::Miss),
            "{header:?}: an anonymous request found the credentialed response"
        );
        assert_eq!(origin.fills_for(&path), 2);
    }

    // `Cache-Control: private` from the origin is not stored either.
    origin.set_cache_control(Some("private, max-age=60"));
    for _ in 0..2 {
        client.get(node.addr, HOST, "/mine").await.unwrap();
    }
    assert_eq!(
        origin.fills_for("/mine"),
        2,
        "a private response was cached"
    );
}
