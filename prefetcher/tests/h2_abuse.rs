//! HTTP/2 abuse on h2c (prior knowledge), with frames written as raw bytes where a
//! client library refuses to misbehave: rapid reset (CVE-2023-44487), too many
//! concurrent streams, oversized header lists, a CONTINUATION flood
//! (CVE-2024-27316) and a client that never opens its flow-control window. Each is
//! bounded by an `[http2]` setting: the abusive connection gets `GOAWAY` or is
//! closed, the metric `prefetcher_h2_connection_errors_total` counts it under its
//! reason, and a legitimate h2 client is served meanwhile and afterwards.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestNode, h2_connect, h2_get, wait_until};
use prefetcher::{Config, H2Abuse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

const HOST: &str = "edge.test";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn config(origin: &str) -> Config {
    Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    )
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK string literal (no Huffman) with its length prefix.
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(0x7f);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
}

/// The header block of `GET http://edge.test{path}`, plus `extra` fields.
fn get_block(path: &str, extra: &[(&str, &[u8])]) -> Vec<u8> {
    // :method GET, :scheme http (static table 2, 6); :path, :authority by name.
    let mut block = vec![0x82, 0x86, 0x04];
    hpack_string(&mut block, path.as_bytes());
    block.push(0x01);
    hpack_string(&mut block, HOST.as_bytes());
    for (name, value) in extra {
        block.push(0x00);
        hpack_string(&mut block, name.as_bytes());
        hpack_string(&mut block, value);
    }
    block
}

/// The client preface and a SETTINGS frame with `settings`.
fn preface(settings: &[(u16, u32)]) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let payload: Vec<u8> = settings
        .iter()
        .flat_map(|(id, value)| [&id.to_be_bytes()[..], &value.to_be_bytes()[..]].concat())
        .collect();
    out.extend(frame(SETTINGS, 0, 0, &payload));
    out
}

/// What the server sent on a raw connection until it closed it.
#[derive(Debug, Default)]
struct Seen {
    /// (stream, error code) of every RST_STREAM.
    resets: Vec<(u32, u32)>,
    /// Error code and debug data of the GOAWAY, if any.
    goaway: Option<(u32, String)>,
    /// Streams that got response HEADERS.
    responses: Vec<u32>,
    /// DATA bytes received.
    data_bytes: usize,
}

/// Reads frames until the server closes the connection (at most 30 s, then
/// panics), acknowledging SETTINGS and answering PINGs as a live client does.
async fn read_until_closed(
    mut read: OwnedReadHalf,
    acks: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
) -> Seen {
    let mut seen = Seen::default();
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16384];
        loop {
            while buf.len() >= 9 {
                let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
                let payload = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                match kind {
                    SETTINGS if flags & ACK == 0 => {
                        let _ = acks.send(frame(SETTINGS, ACK, 0, &[]));
                    }
                    PING if flags & ACK == 0 => {
                        let _ = acks.send(frame(PING, ACK, 0, &payload));
                    }
                    RST_STREAM => seen
                        .resets
                        .push((stream, u32::from_be_bytes(payload[..4].try_into().unwrap()))),
                    GOAWAY => {
                        let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                        let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                        seen.goaway = Some((code, debug));
                    }
                    HEADERS => seen.responses.push(stream),
                    DATA => seen.data_bytes += len,
                    _ => {}
                }
            }
            match read.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        outcome.is_ok(),
        "the server kept the abusive connection open: {seen:?}"
    );
    seen
}

/// Opens a raw h2c connection, writes `first`, then whatever `more` yields until
/// the server closes the connection; returns what the server sent.
async fn abuse(
    addr: SocketAddr,
    first: Vec<u8>,
    mut more: impl FnMut(u64) -> Option<Vec<u8>> + Send + 'static,
) -> Seen {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let (acks_tx, mut acks_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        if write.write_all(&first).await.is_err() {
            return;
        }
        let mut i = 0;
        loop {
            while let Ok(ack) = acks_rx.try_recv() {
                if write.write_all(&ack).await.is_err() {
                    return;
                }
            }
            match more(i) {
                Some(bytes) => {
                    if write.write_all(&bytes).await.is_err() {
                        return;
                    }
                    i += 1;
                }
                None => match acks_rx.recv().await {
                    Some(ack) => {
                        if write.write_all(&ack).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
            }
        }
    });
    let seen = read_until_closed(read, acks_tx).await;
    writer.abort();
    seen
}

/// A legitimate h2c client gets its response.
async fn legitimate_client_is_served(addr: SocketAddr, path: &str) {
    let mut sender = h2_connect(addr).await.expect("h2c connection");
    let r = h2_get(&mut sender, HOST, path).await.expect("h2 response");
    assert_eq!(r.status, StatusCode::OK, "{path}");
    assert!(r.body.is_ok(), "{path}");
}

async fn counted(node: &TestNode, abuse: H2Abuse) {
    let metrics = node.node.metrics();
    wait_until(
        || metrics.h2_connection_errors(abuse) == 1,
        &format!(
            "prefetcher_h2_connection_errors_total{{reason=\"{}\"}}",
            abuse.as_str()
        ),
    )
    .await;
}

#[tokio::test]
async fn rapid_reset_ends_the_connection_with_enhance_your_calm() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.http2.max_pending_accept_reset_streams = 10;
    let node = TestNode::start(c).await;
    // 1 000 streams opened and cancelled in one write, as the attack does.
    let mut bytes = preface(&[]);
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        let block = get_block(&format!("/reset/{i}"), &[]);
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &block));
        bytes.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let attack = tokio::spawn(abuse(node.addr, bytes, |_| None));
    legitimate_client_is_served(node.addr, "/during").await;
    let seen = attack.await.unwrap();
    let (code, debug) = seen.goaway.expect("a GOAWAY");
    assert_eq!(code, ENHANCE_YOUR_CALM, "{debug}");
    counted(&node, H2Abuse::RapidReset).await;
    // Bounded: far fewer than the 1 000 requests reached the origin.
    assert!(origin.fills() < 100, "{} origin requests", origin.fills());
    legitimate_client_is_served(node.addr, "/after").await;
}

#[tokio::test]
async fn streams_past_the_concurrency_limit_are_refused_then_the_connection_ends() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.http2.max_concurrent_streams = 4;
    c.http2.max_local_error_reset_streams = 8;
    let node = TestNode::start(c).await;
    origin.hold();
    // 40 streams at once on a connection that may have 4 open: each one past the
    // limit is refused, and past 8 refusals the connection ends.
    let mut bytes = preface(&[]);
    for i in 0..40u32 {
        let block = get_block(&format!("/held/{i}"), &[]);
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &block));
    }
    let seen = abuse(node.addr, bytes, |_| None).await;
    const REFUSED_STREAM: u32 = 0x7;
    let refused = seen
        .resets
        .iter()
        .filter(|(_, code)| *code == REFUSED_STREAM)
        .count();
    assert!(refused >= 1, "{seen:?}");
    let (code, _) = seen.goaway.clone().expect("a GOAWAY");
    assert_eq!(code, ENHANCE_YOUR_CALM, "{seen:?}");
    counted(&node, H2Abuse::LocalErrorResets).await;
    assert!(
        origin.fills() <= 4,
        "{} requests at the origin",
        origin.fills()
    );
    origin.release();
    legitimate_client_is_served(node.addr, "/after").await;
}

#[tokio::test]
async fn an_oversized_header_list_gets_431_and_a_far_larger_one_ends_the_connection() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.http2.max_header_list_bytes = 4096;
    let node = TestNode::start(c).await;

    // Past the limit: the h2 crate as a client sends it; the stream gets 431 and the
    // connection goes on.
    let tcp = TcpStream::connect(node.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let big = http::Request::get(format!("http://{HOST}/big"))
        .header("x-big", "b".repeat(6 * 1024))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(big, true).unwrap();
    match response.await {
        Ok(response) => assert_eq!(
            response.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        ),
        Err(e) => assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e}"),
    }
    let mut client = client.ready().await.unwrap();
    let small = http::Request::get(format!("http://{HOST}/small"))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(small, true).unwrap();
    assert_eq!(response.await.unwrap().status(), StatusCode::OK);
    assert_eq!(origin.fills_for("/big"), 0);

    // Far past it (5×, in HEADERS and CONTINUATION frames): GOAWAY.
    let block = get_block("/huge", &[("x-huge", &vec![b'h'; 20 * 1024])]);
    let mut bytes = preface(&[]);
    let pieces: Vec<&[u8]> = block.chunks(8 * 1024).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let last = i + 1 == pieces.len();
        let flags = if last { END_HEADERS } else { 0 } | if i == 0 { END_STREAM } else { 0 };
        bytes.extend(frame(kind, flags, 1, piece));
    }
    let seen = abuse(node.addr, bytes, |_| None).await;
    assert_eq!(seen.goaway.map(|g| g.0), Some(ENHANCE_YOUR_CALM));
    counted(&node, H2Abuse::HeaderListTooLarge).await;
    assert_eq!(origin.fills_for("/huge"), 0);
    legitimate_client_is_served(node.addr, "/after").await;
}

#[tokio::test]
async fn a_continuation_flood_ends_the_connection() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    // HEADERS without END_HEADERS whose last field announces a 1 MiB value, then
    // CONTINUATION frames of it without end, as long as the server reads them.
    let mut block = get_block("/flood", &[]);
    block.push(0x00);
    hpack_string(&mut block, b"x-flood");
    let mut length = Vec::new();
    hpack_string(&mut length, &vec![b'f'; 1 << 20]);
    length.truncate(length.len() - (1 << 20));
    block.extend(length);
    let mut bytes = preface(&[]);
    bytes.extend(frame(HEADERS, END_STREAM, 1, &block));
    let piece = vec![b'f'; 256];
    let attack = tokio::spawn(abuse(node.addr, bytes, move |i| {
        (i < 1_000_000).then(|| frame(CONTINUATION, 0, 1, &piece))
    }));
    legitimate_client_is_served(node.addr, "/during").await;
    let seen = attack.await.unwrap();
    assert_eq!(seen.goaway.map(|g| g.0), Some(ENHANCE_YOUR_CALM));
    counted(&node, H2Abuse::ContinuationFlood).await;
    assert_eq!(origin.fills_for("/flood"), 0);
    legitimate_client_is_served(node.addr, "/after").await;
}

#[tokio::test]
async fn a_client_that_never_opens_its_window_is_cut_off() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_body_size(256 * 1024);
    let mut c = config(&origin.url());
    c.server.send_timeout_ms = 200;
    let node = TestNode::start(c).await;
    // SETTINGS_INITIAL_WINDOW_SIZE = 0 and never a WINDOW_UPDATE; SETTINGS and PINGs
    // are answered, so the connection looks alive.
    let mut bytes = preface(&[(0x4, 0)]);
    bytes.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &get_block("/stalled", &[]),
    ));
    let attack = tokio::spawn(abuse(node.addr, bytes, |_| None));
    legitimate_client_is_served(node.addr, "/during").await;
    let seen = attack.await.unwrap();
    assert_eq!(seen.responses, [1], "the response head went out: {seen:?}");
    assert_eq!(seen.data_bytes, 0, "no window, no data");
    counted(&node, H2Abuse::SendStall).await;
    legitimate_client_is_served(node.addr, "/after").await;
    // A legitimate large response on the same node is not taken for a stall.
    let mut sender = h2_connect(node.addr).await.unwrap();
    let r = h2_get(&mut sender, HOST, "/large").await.unwrap();
    assert_eq!(r.body.map(|b: Bytes| b.len()).unwrap(), 256 * 1024);
    assert_eq!(
        node.node.metrics().h2_connection_errors(H2Abuse::SendStall),
        1
    );
}
