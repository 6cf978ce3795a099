//! Pass-through uploads are bounded (item 7): a whole-body deadline
//! (`server.body_deadline_ms`) that a steady trickle cannot dodge, as it dodges the
//! gap timeout, and upload slots (`server.max_uploads`, `max_uploads_per_address`)
//! so slow uploads cannot hold origin connections without end. Real sockets; clients
//! on 127.0.0.2, 127.0.0.3 play other addresses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use http::StatusCode;
use http_body_util::BodyExt;
use models::TenantId;
use prefetcher::testing::{TestNode, wait_until};
use prefetcher::{ClientLimit, Config, ServeOptions, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const HOST: &str = "edge.test";

/// An origin that reads whole request bodies and counts how each upload went.
#[derive(Default)]
struct UploadOrigin {
    started: AtomicUsize,
    completed: AtomicUsize,
    aborted: AtomicUsize,
}

async fn upload_origin() -> (SocketAddr, Arc<UploadOrigin>) {
    async fn upload(State(state): State<Arc<UploadOrigin>>, body: Body) -> StatusCode {
        state.started.fetch_add(1, Ordering::SeqCst);
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

fn config(origin: SocketAddr, tune: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        format!("http://{origin}"),
    );
    c.origin.header_timeout_ms = 30_000;
    tune(&mut c);
    c
}

async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// Reads a response head (10 s at most): its status and text.
async fn read_head(stream: &mut TcpStream) -> (u16, String) {
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
    let head = String::from_utf8_lossy(&buf).to_string();
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head)
}

/// An upload of `declared` bytes from `from`, its head and `sent` bytes written.
async fn upload(from: &str, node: SocketAddr, declared: usize, sent: usize) -> TcpStream {
    let mut stream = connect_from(from, node).await;
    let head =
        format!("POST /upload HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: {declared}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b'x'; sent]).await.unwrap();
    stream
}

/// A byte every 100 ms never trips a 2 s gap timeout; the 500 ms deadline on the
/// whole body ends it: 408, the origin request aborted, counted `body_deadline`.
#[tokio::test]
async fn an_upload_trickling_past_the_deadline_gets_408_and_is_aborted() {
    let (origin_addr, origin) = upload_origin().await;
    let node = TestNode::start(config(origin_addr, |c| {
        c.server.body_timeout_ms = 2_000;
        c.server.body_deadline_ms = 500;
    }))
    .await;
    let mut stream = upload("127.0.0.1", node.addr, 60, 0).await;
    let (mut read, mut write) = stream.split();
    let trickle = async {
        for _ in 0..60 {
            if write.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The whole body went in: an answer is due now either way.
        std::future::pending::<()>().await;
    };
    let answer = async {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            match read.read(&mut byte).await {
                Ok(0) | Err(_) => break,
                Ok(_) => buf.push(byte[0]),
            }
        }
        String::from_utf8_lossy(&buf).to_string()
    };
    let head = tokio::select! {
        head = answer => head,
        () = trickle => unreachable!(),
    };
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    wait_until(
        || origin.aborted.load(Ordering::SeqCst) == 1,
        "the origin to see its upload aborted",
    )
    .await;
    assert_eq!(origin.completed.load(Ordering::SeqCst), 0);
    let limit = ClientLimit::parse("body_deadline").expect("a client limit");
    assert_eq!(node.node.metrics().client_limits(limit), 1);
}

/// Two uploads in flight from one address are its share: a third gets 429; another
/// address gets the node's last slot; past `max_uploads` the next gets 503. A slot
/// is free again once its upload ends.
#[tokio::test]
async fn uploads_take_slots_per_address_and_per_node() {
    let (origin_addr, origin) = upload_origin().await;
    let node = TestNode::start(config(origin_addr, |c| {
        c.server.max_uploads = 3;
        c.server.max_uploads_per_address = 2;
    }))
    .await;
    let mut first = upload("127.0.0.1", node.addr, 100, 1).await;
    let _second = upload("127.0.0.1", node.addr, 100, 1).await;
    wait_until(|| origin.started.load(Ordering::SeqCst) == 2, "two uploads").await;
    let mut third = upload("127.0.0.1", node.addr, 100, 1).await;
    let (status, head) = read_head(&mut third).await;
    assert_eq!(status, 429, "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    let _other = upload("127.0.0.2", node.addr, 100, 1).await;
    wait_until(
        || origin.started.load(Ordering::SeqCst) == 3,
        "a third upload",
    )
    .await;
    let mut over = upload("127.0.0.3", node.addr, 100, 1).await;
    assert_eq!(read_head(&mut over).await.0, 503);
    assert_eq!(origin.started.load(Ordering::SeqCst), 3);
    let metrics = node.node.metrics();
    for (label, n) in [("address_uploads", 1), ("max_uploads", 1)] {
        let limit = ClientLimit::parse(label).expect("a client limit");
        assert_eq!(metrics.client_limits(limit), n, "{label}");
    }
    // The first upload ends: its slot goes to the next.
    first.write_all(&[b'x'; 99]).await.unwrap();
    assert_eq!(read_head(&mut first).await.0, 200);
    let mut next = upload("127.0.0.3", node.addr, 10, 10).await;
    assert_eq!(read_head(&mut next).await.0, 200);
    assert_eq!(origin.completed.load(Ordering::SeqCst), 2);
}
