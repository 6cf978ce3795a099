//! Slow and greedy clients, through real sockets on 127.0.0.1 (the `[server]`
//! section): a request head that trickles in, an idle keep-alive connection, a
//! response the client does not read, a stalled upload, too many connections (from
//! the node's clients, from one address), too many requests from one address, too
//! many header fields. Each test checks what the limit does (the connection closed,
//! the status), that it is counted, that the origin saw nothing it should not, and
//! that a legitimate client is served meanwhile. Timeouts are short (300 ms) so the
//! tests are quick; nothing asserts how long anything took.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestClient, TestNode, h2_connect, h2_get, wait_until};
use prefetcher::{ClientLimit, Config, ServeOptions, TlsListenConfig, serve, spawn_node};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const HOST: &str = "edge.test";
/// Long enough never to act within a test.
const NEVER_MS: u64 = 600_000;

/// A node whose timeouts are all `NEVER_MS` but those `tune` sets.
fn config(origin: &str, tune: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.server.header_timeout_ms = NEVER_MS;
    c.server.idle_timeout_ms = NEVER_MS;
    c.server.send_timeout_ms = NEVER_MS;
    c.server.body_timeout_ms = NEVER_MS;
    tune(&mut c);
    c
}

fn limits_hit(node: &TestNode, limit: ClientLimit) -> u64 {
    node.node.metrics().client_limits(limit)
}

/// A connection to `addr` from the local address `from` (any of 127.0.0.0/8 works
/// on Linux loopback, so tests can play several clients).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// Reads until the server closes the connection (EOF or reset) and returns what came
/// before; panics if it stays open for 10 s (a correctness bound, not a speed claim).
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 65536];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
    got
}

/// Reads one response head and returns its status and the head.
async fn read_head(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while !buf.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(_) => buf.push(byte[0]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 10 s");
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    Some((status, head))
}

/// Reads one response with a `Content-Length` body; returns status and head.
async fn read_response(stream: &mut TcpStream) -> Option<(u16, String)> {
    let (status, head) = read_head(stream).await?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((status, head))
}

/// A keep-alive `GET path` on `stream`; its status.
async fn get_on(stream: &mut TcpStream, path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nhost: {HOST}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    read_response(stream).await.map(|(status, _)| status)
}

/// Sends a request head one header line at a time, `gap` apart, never finishing it,
/// until the server closes the connection.
fn trickle<S>(mut stream: S, path: &str, gap: Duration) -> tokio::task::JoinHandle<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let start = format!("GET {path} HTTP/1.1\r\nhost: {HOST}\r\n");
    tokio::spawn(async move {
        if stream.write_all(start.as_bytes()).await.is_err() {
            return stream;
        }
        for i in 0.. {
            tokio::time::sleep(gap).await;
            if stream
                .write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
        stream
    })
}

#[tokio::test]
async fn a_request_head_that_trickles_in_is_cut_off_at_the_header_timeout() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.header_timeout_ms = 300;
    }))
    .await;
    let client = TestClient::new();

    // A first request that never completes, one header line every 50 ms.
    let slow = trickle(
        connect_from("127.0.0.1", node.addr).await,
        "/slow",
        Duration::from_millis(50),
    );
    // A keep-alive connection whose second request trickles.
    let mut kept = connect_from("127.0.0.1", node.addr).await;
    assert_eq!(get_on(&mut kept, "/first").await, Some(200));
    let kept = trickle(kept, "/slow-second", Duration::from_millis(50));
    // A connection that never sends a byte.
    let mut silent = connect_from("127.0.0.1", node.addr).await;

    // Meanwhile a legitimate client is served.
    let r = client.get(node.addr, HOST, "/legit").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);

    for handle in [slow, kept] {
        // The trickle ends when the server closes the connection.
        let mut stream = tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .expect("the server kept a trickling connection open")
            .unwrap();
        assert!(
            read_until_closed(&mut stream).await.is_empty(),
            "cut off without an answer"
        );
    }
    assert!(read_until_closed(&mut silent).await.is_empty());
    assert_eq!(origin.fills_for("/slow"), 0);
    assert_eq!(origin.fills_for("/slow-second"), 0);
    assert_eq!(limits_hit(&node, ClientLimit::HeaderTimeout), 3);
    assert_eq!(limits_hit(&node, ClientLimit::IdleTimeout), 0);
    let text = node.node.metrics().encode();
    assert!(
        text.contains(r#"prefetcher_client_limits_total{reason="header_timeout"} 3"#),
        "{text}"
    );
    // The node still serves.
    let r = client.get(node.addr, HOST, "/after").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.idle_timeout_ms = 300;
    }))
    .await;

    // HTTP/1.1: one request, then silence.
    let mut idle = connect_from("127.0.0.1", node.addr).await;
    assert_eq!(get_on(&mut idle, "/a").await, Some(200));
    assert!(read_until_closed(&mut idle).await.is_empty());

    // HTTP/2: one request, then no stream open; the server ends the connection.
    let stream = TcpStream::connect(node.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let request = http::Request::builder()
        .uri(format!("http://{HOST}/b"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection stayed open");

    // A request in flight keeps its connection, however long the origin takes.
    origin.hold();
    let mut busy = connect_from("127.0.0.1", node.addr).await;
    let waiting = tokio::spawn(async move {
        let status = get_on(&mut busy, "/held").await;
        (status, busy)
    });
    origin.wait_in_flight(1).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    origin.release();
    let (status, _busy) = waiting.await.unwrap();
    assert_eq!(
        status,
        Some(200),
        "a connection with a request in flight is not idle"
    );

    assert_eq!(limits_hit(&node, ClientLimit::IdleTimeout), 2);
    assert_eq!(limits_hit(&node, ClientLimit::HeaderTimeout), 0);
}

#[tokio::test]
async fn a_client_that_does_not_read_its_response_is_cut_off_at_the_send_timeout() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.send_timeout_ms = 300;
        c.cache.max_object_bytes = 64 << 20;
    }))
    .await;
    // 32 MiB: more than the socket buffers on both sides hold.
    let path = "/bytes/33554432/big";
    let mut reader = connect_from("127.0.0.1", node.addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {HOST}\r\n\r\n");
    reader.write_all(request.as_bytes()).await.unwrap();
    // Never reads; the node gives up on it.
    wait_until(
        || limits_hit(&node, ClientLimit::SendTimeout) == 1,
        "the send timeout",
    )
    .await;
    let got = read_until_closed(&mut reader).await;
    assert!(got.len() < 32 << 20, "the response was cut off");

    // The same object, read as it comes, arrives whole.
    let r = TestClient::new().get(node.addr, HOST, path).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.unwrap().len(), 32 << 20);
    assert_eq!(limits_hit(&node, ClientLimit::SendTimeout), 1);
}

/// An origin that reads whole request bodies and counts how each upload ended.
#[derive(Default)]
struct UploadOrigin {
    completed: AtomicUsize,
    aborted: AtomicUsize,
}

async fn upload_origin() -> (SocketAddr, Arc<UploadOrigin>) {
    async fn upload(State(state): State<Arc<UploadOrigin>>, body: Body) -> StatusCode {
        match body.collect().await {
            Ok(_) => {
                state.completed.fetch_add(1, Ordering::SeqCst);
                StatusCode::OK
            }
            Err(_) => {
                state.aborted.fetch_add(1, Ordering::SeqCst);
                StatusCode::BAD_REQUEST
            }
        }
    }
    let state = Arc::new(UploadOrigin::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .fallback(upload)
        .with_state(Arc::clone(&state));
    tokio::spawn(serve(
        listener,
        router,
        std::future::pending(),
        ServeOptions::default(),
    ));
    (addr, state)
}

#[tokio::test]
async fn a_stalled_upload_gets_408_and_its_origin_request_is_aborted() {
    let (origin_addr, origin) = upload_origin().await;
    let node = TestNode::start(config(&format!("http://{origin_addr}"), |c| {
        c.server.body_timeout_ms = 300;
    }))
    .await;

    // 10 of 1000 declared bytes, then nothing.
    let mut stalled = connect_from("127.0.0.1", node.addr).await;
    let head = format!("POST /upload HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: 1000\r\n\r\n");
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&[b'x'; 10]).await.unwrap();

    // Meanwhile a whole upload goes through.
    let r = TestClient::new()
        .send(
            http::Method::POST,
            node.addr,
            HOST,
            "/upload",
            &[],
            vec![b'y'; 1000],
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.completed.load(Ordering::SeqCst), 1);

    let (status, _) = read_head(&mut stalled).await.expect("an answer");
    assert_eq!(status, 408);
    wait_until(
        || origin.aborted.load(Ordering::SeqCst) == 1,
        "the origin to see its upload aborted",
    )
    .await;
    assert_eq!(origin.completed.load(Ordering::SeqCst), 1);
    assert_eq!(limits_hit(&node, ClientLimit::BodyTimeout), 1);
}

#[tokio::test]
async fn past_max_connections_new_connections_are_closed_and_open_ones_are_served() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_connections = 3;
        c.server.max_connections_per_address = 0;
    }))
    .await;
    // Three keep-alive connections that made a request each (connections that have
    // not could give way to a newcomer: see the eviction test).
    let mut held = Vec::new();
    for i in 0..3 {
        let mut stream = connect_from("127.0.0.1", node.addr).await;
        assert_eq!(get_on(&mut stream, &format!("/held-{i}")).await, Some(200));
        held.push(stream);
    }
    let mut refused = connect_from("127.0.0.1", node.addr).await;
    assert!(read_until_closed(&mut refused).await.is_empty());
    assert_eq!(limits_hit(&node, ClientLimit::MaxConnections), 1);

    // The open connections are served as ever.
    assert_eq!(get_on(&mut held[0], "/a").await, Some(200));
    // One closes: room for a new client.
    drop(held.pop());
    wait_until(
        || node.node.metrics().client_connections() == 2,
        "a connection to close",
    )
    .await;
    let r = TestClient::new().get(node.addr, HOST, "/b").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.fills(), 5, "the refused connection reached nothing");
    assert_eq!(limits_hit(&node, ClientLimit::Evicted), 0);
}

#[tokio::test]
async fn one_address_holds_only_its_share_of_connections() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_connections_per_address = 2;
        c.server.exempt = vec!["127.0.0.3".into()];
    }))
    .await;
    let mut greedy = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from("127.0.0.1", node.addr).await;
        assert_eq!(get_on(&mut stream, "/greedy").await, Some(200));
        greedy.push(stream);
    }
    let mut refused = connect_from("127.0.0.1", node.addr).await;
    assert!(read_until_closed(&mut refused).await.is_empty());
    assert_eq!(limits_hit(&node, ClientLimit::AddressConnections), 1);

    // Another address is served.
    let mut other = connect_from("127.0.0.2", node.addr).await;
    assert_eq!(get_on(&mut other, "/other").await, Some(200));
    // An exempt address may hold more.
    let mut exempt = Vec::new();
    for _ in 0..4 {
        exempt.push(connect_from("127.0.0.3", node.addr).await);
    }
    for stream in &mut exempt {
        assert_eq!(get_on(stream, "/exempt").await, Some(200));
    }
    // The greedy address's own connections still work.
    assert_eq!(get_on(&mut greedy[1], "/mine").await, Some(200));
    assert_eq!(limits_hit(&node, ClientLimit::AddressConnections), 1);
}

/// At a connection limit, a connection that has sent no complete request head for
/// a while (a second, or half the header timeout) gives way to a newcomer: a
/// slow-header client cannot lock out a client sharing its address (NAT) or the
/// node's last connections; one that has made its request is never evicted.
#[tokio::test]
async fn an_unproven_connection_gives_way_to_one_that_sends_its_request() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_connections_per_address = 2;
    }))
    .await;
    // Two connections from one address that never send a request ...
    let mut first = connect_from("127.0.0.1", node.addr).await;
    let mut second = connect_from("127.0.0.1", node.addr).await;
    wait_until(
        || node.node.metrics().client_connections() == 2,
        "two open connections",
    )
    .await;
    // ... for longer than a newcomer must wait to evict one.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut newcomer = connect_from("127.0.0.1", node.addr).await;
    assert_eq!(get_on(&mut newcomer, "/newcomer").await, Some(200));
    assert!(
        read_until_closed(&mut first).await.is_empty(),
        "the oldest gave way"
    );
    assert_eq!(limits_hit(&node, ClientLimit::Evicted), 1);
    // The next newcomer evicts the other slow one, never the newcomer ...
    let mut second_newcomer = connect_from("127.0.0.1", node.addr).await;
    assert_eq!(get_on(&mut second_newcomer, "/second").await, Some(200));
    assert!(read_until_closed(&mut second).await.is_empty());
    assert_eq!(limits_hit(&node, ClientLimit::Evicted), 2);
    // ... and with only connections that made their request left, one more is refused.
    let mut third = connect_from("127.0.0.1", node.addr).await;
    assert!(read_until_closed(&mut third).await.is_empty());
    assert_eq!(limits_hit(&node, ClientLimit::AddressConnections), 1);
    assert_eq!(get_on(&mut newcomer, "/again").await, Some(200));
    assert_eq!(get_on(&mut second_newcomer, "/again").await, Some(200));
    assert_eq!(origin.fills(), 3);
}

#[tokio::test]
async fn an_address_past_its_rate_gets_429_with_retry_after() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        // One request per 10 s after a burst of 3: nothing refills during the test.
        c.server.requests_per_second_per_address = 0.1;
        c.server.request_burst_per_address = 3;
    }))
    .await;
    let mut greedy = connect_from("127.0.0.1", node.addr).await;
    for i in 0..3 {
        assert_eq!(get_on(&mut greedy, &format!("/r{i}")).await, Some(200));
    }
    greedy
        .write_all(format!("GET /r3 HTTP/1.1\r\nhost: {HOST}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, head) = read_response(&mut greedy).await.unwrap();
    assert_eq!(status, 429);
    let retry_after: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    // The same address on a new connection, and over HTTP/2: the same bucket.
    let r = TestClient::new().get(node.addr, HOST, "/r4").await.unwrap();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let mut h2 = h2_connect(node.addr).await.unwrap();
    let r = h2_get(&mut h2, HOST, "/r5").await.unwrap();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(origin.fills(), 3, "refused requests never reach the origin");

    // Another address has its own bucket.
    let mut other = connect_from("127.0.0.2", node.addr).await;
    assert_eq!(get_on(&mut other, "/other").await, Some(200));
    assert_eq!(limits_hit(&node, ClientLimit::AddressRate), 3);
}

#[tokio::test]
async fn too_many_header_fields_get_431_over_http1_and_http2() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_headers = 20;
    }))
    .await;
    let client = TestClient::new();
    let names: Vec<String> = (0..30).map(|i| format!("x-h-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();

    // HTTP/1.1: hyper's parser refuses the head.
    let r = client
        .request(http::Method::GET, node.addr, HOST, "/many", &many)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // HTTP/2: the gate does.
    let mut h2 = h2_connect(node.addr).await.unwrap();
    h2.ready().await.unwrap();
    let mut request = http::Request::builder().uri(format!("http://{HOST}/many-h2"));
    for (name, value) in &many {
        request = request.header(*name, *value);
    }
    let response = h2
        .send_request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );

    // Within the count, served.
    let r = client
        .request(http::Method::GET, node.addr, HOST, "/few", &many[..10])
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.fills(), 1, "only the request within the count");
    wait_until(
        || limits_hit(&node, ClientLimit::HeadTooLarge) == 1,
        "the HTTP/1.1 refusal to be counted",
    )
    .await;
    assert_eq!(limits_hit(&node, ClientLimit::TooManyHeaders), 1);
}

/// The TLS listener: the handshake counts against the header timeout, a head that
/// trickles in after it is cut off as on the plain listener, and one address's
/// connections are counted across both listeners.
#[tokio::test]
async fn the_tls_listener_has_the_same_timeouts_and_shares_the_limits() {
    let origin = SyntheticOrigin::start("origin").await;
    let generated = rcgen::generate_simple_self_signed(vec!["edge.test".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, generated.cert.pem()).unwrap();
    std::fs::write(&key_file, generated.key_pair.serialize_pem()).unwrap();
    let mut c = config(&origin.url(), |c| {
        c.server.header_timeout_ms = 300;
        c.server.max_connections_per_address = 2;
    });
    c.tls = Some(TlsListenConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file,
        key_file,
    });
    let node = spawn_node(c).await.unwrap();
    let tls_addr = node.tls_addr().unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(generated.cert.der().clone()).unwrap();
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls));
    let name = rustls_pki_types::ServerName::try_from("edge.test").unwrap();

    // No handshake at all.
    let mut silent = connect_from("127.0.0.4", tls_addr).await;
    // A handshake, then a head that trickles in.
    let stream = connect_from("127.0.0.5", tls_addr).await;
    let stream = connector.connect(name.clone(), stream).await.unwrap();
    let slow = trickle(stream, "/slow-tls", Duration::from_millis(50));

    // Meanwhile a legitimate client is served over TLS.
    let stream = connect_from("127.0.0.1", tls_addr).await;
    let mut legit = connector.connect(name.clone(), stream).await.unwrap();
    legit
        .write_all(
            format!("GET /legit HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let answer = read_until_closed(&mut legit).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    assert!(read_until_closed(&mut silent).await.is_empty());
    let mut slow = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the server kept a trickling TLS connection open")
        .unwrap();
    assert!(read_until_closed(&mut slow).await.is_empty());
    assert_eq!(origin.fills_for("/slow-tls"), 0);
    let metrics = node.node().metrics();
    assert_eq!(metrics.client_limits(ClientLimit::HeaderTimeout), 2);

    // Two plain connections from one address leave it no TLS connection.
    let mut plain = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from("127.0.0.6", node.addr()).await;
        assert_eq!(get_on(&mut stream, "/plain").await, Some(200));
        plain.push(stream);
    }
    let mut refused = connect_from("127.0.0.6", tls_addr).await;
    assert!(read_until_closed(&mut refused).await.is_empty());
    assert_eq!(metrics.client_limits(ClientLimit::AddressConnections), 1);
}
