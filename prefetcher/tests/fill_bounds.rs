//! What a client's fills cost, tried with a real HTTP/2 client (the `h2` crate) on
//! h2c: streams for new keys, each reset after the node accepted it and before any
//! byte of its answer. Each cancelled fill is dropped (its origin request closed),
//! a connection that keeps cancelling gets `GOAWAY` after
//! `server.max_cancelled_fills_per_connection`, and the fills one connection or
//! address leads at once are bounded (429 past them), while joiners, hits and other
//! clients are served.

use std::net::SocketAddr;

use bytes::Bytes;
use http::StatusCode;
use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestNode, h2_connect, h2_get, wait_until};
use prefetcher::{ClientLimit, Config};
use tokio::net::TcpStream;

const HOST: &str = "edge.test";

fn config(origin: &str, tune: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.origin.header_timeout_ms = 20_000;
    c.flight.wait_timeout_ms = 20_000;
    tune(&mut c);
    c
}

type Client = h2::client::SendRequest<Bytes>;

/// An HTTP/2 connection with the `h2` client, and the task that drives it (it ends
/// when the node closes the connection).
async fn connect(addr: SocketAddr) -> (Client, tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    (client, tokio::spawn(connection))
}

/// Opens a stream for `GET path`; `None` when the connection takes no more streams.
async fn open(client: &mut Client, path: &str) -> Option<h2::client::ResponseFuture> {
    let ready = client.clone().ready().await.ok()?;
    *client = ready;
    let request = http::Request::get(format!("http://{HOST}{path}"))
        .body(())
        .unwrap();
    client.send_request(request, true).ok().map(|(r, _)| r)
}

fn abandoned(node: &TestNode) -> u64 {
    let text = node.node.metrics().encode();
    text.lines()
        .find_map(|l| l.strip_prefix("prefetcher_fills_abandoned_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// The seed of the issue, stream by stream: each stream for a new key is reset once
/// its fill reached the origin, before any byte of the answer. The fill is dropped
/// (the origin sees its request closed), and past the bound the node sends `GOAWAY`
/// and the connection leads no more fills.
#[tokio::test]
async fn a_connection_that_keeps_cancelling_its_fills_gets_goaway() {
    let origin = SyntheticOrigin::start("origin").await;
    let max = 8;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_cancelled_fills_per_connection = max;
    }))
    .await;
    origin.hold();
    let (mut client, connection) = connect(node.addr).await;
    let mut reached = 0;
    for i in 0..(4 * max as usize) {
        let Some(response) = open(&mut client, &format!("/new/{i}")).await else {
            break;
        };
        // The stream is accepted and its fill is at the origin: a cost, then a reset.
        let at_origin = wait_until(|| origin.fills() > reached, "the fill at the origin");
        tokio::select! {
            () = at_origin => {}
            _ = response => unreachable!("no answer while the origin is held"),
        }
        reached = origin.fills();
        // Dropping the response future resets the stream (RST_STREAM CANCEL).
        wait_until(|| abandoned(&node) >= reached as u64, "the fill dropped").await;
        wait_until(|| origin.in_flight() == 0, "the origin request closed").await;
    }
    assert_eq!(
        reached,
        max as usize + 1,
        "fills led until the bound was passed"
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
    assert!(ended.is_ok(), "the node closed the connection (GOAWAY)");
    assert!(
        node.node
            .metrics()
            .client_limits(ClientLimit::CancelledFills)
            >= 1,
        "counted"
    );
    // Another client is served.
    origin.release();
    let mut other = h2_connect(node.addr).await.unwrap();
    let r = h2_get(&mut other, HOST, "/after").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
}

/// The attack as it was tried: up to 1 000 streams for new keys on one
/// connection, each reset about 50 ms after it opened, none read. The origin sees a
/// bounded number of fills (the connection's fills in flight plus its cancellation
/// allowance), not one per stream, and the connection gets `GOAWAY`.
#[tokio::test]
async fn a_thousand_streams_reset_after_accept_cost_a_bounded_number_of_fills() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |_| {})).await;
    let limits = node.node.config().server.clone();
    origin.hold();
    let (mut client, connection) = connect(node.addr).await;
    let mut opened = 0;
    for i in 0..1_000 {
        let Some(response) = open(&mut client, &format!("/burst/{i}")).await else {
            break;
        };
        opened += 1;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(50), response).await;
        });
    }
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
    assert!(ended.is_ok(), "GOAWAY after {opened} streams");
    // Every fill of the connection has ended (dropped: no client is left for any).
    wait_until(|| node.node.registry().is_empty(), "the fills to end").await;
    let bound =
        limits.max_fills_per_connection as u64 + limits.max_cancelled_fills_per_connection + 1;
    assert!(
        (origin.fills() as u64) <= bound,
        "{} origin fills for {opened} streams (bound {bound})",
        origin.fills()
    );
    let metrics = node.node.metrics();
    assert!(
        metrics.client_limits(ClientLimit::CancelledFills) > 0,
        "GOAWAY counted"
    );
    eprintln!(
        "{opened} streams: {} origin fills, {} refused past the connection's bound",
        origin.fills(),
        metrics.client_limits(ClientLimit::ConnectionFills)
    );
    wait_until(|| origin.in_flight() == 0, "every cancelled fill dropped").await;
    origin.release();
    let mut other = h2_connect(node.addr).await.unwrap();
    assert_eq!(
        h2_get(&mut other, HOST, "/after").await.unwrap().status,
        StatusCode::OK
    );
}

/// One connection leads at most `max_fills_per_connection` fills at once; past it
/// 429, no fill. Joining a fill in flight is not leading one.
#[tokio::test]
async fn the_fills_one_connection_leads_at_once_are_bounded() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_fills_per_connection = 3;
    }))
    .await;
    origin.hold();
    let (mut client, _connection) = connect(node.addr).await;
    let mut leading = Vec::new();
    for i in 0..3 {
        leading.push(open(&mut client, &format!("/k/{i}")).await.unwrap());
    }
    origin.wait_in_flight(3).await;
    let refused = open(&mut client, "/k/3").await.unwrap().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let joiner = open(&mut client, "/k/0").await.unwrap();
    wait_until(
        || node.node.metrics().waiters_joined.get() == 1,
        "the joiner to join",
    )
    .await;
    assert_eq!(origin.fills(), 3);
    assert_eq!(
        node.node
            .metrics()
            .client_limits(ClientLimit::ConnectionFills),
        1
    );
    origin.release();
    for response in leading.into_iter().chain([joiner]) {
        assert_eq!(response.await.unwrap().status(), StatusCode::OK);
    }
    // Answered: the slots are free again.
    let again = open(&mut client, "/k/3").await.unwrap().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

/// The connections of one address lead at most `max_fills_per_address` at once.
#[tokio::test]
async fn the_fills_one_address_leads_at_once_are_bounded() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url(), |c| {
        c.server.max_fills_per_connection = 2;
        c.server.max_fills_per_address = 3;
    }))
    .await;
    origin.hold();
    let (mut a, _a) = connect(node.addr).await;
    let (mut b, _b) = connect(node.addr).await;
    let a0 = open(&mut a, "/a/0").await.unwrap();
    let a1 = open(&mut a, "/a/1").await.unwrap();
    let b0 = open(&mut b, "/b/0").await.unwrap();
    origin.wait_in_flight(3).await;
    let refused = open(&mut b, "/b/1").await.unwrap().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        node.node.metrics().client_limits(ClientLimit::AddressFills),
        1
    );
    origin.release();
    for response in [a0, a1, b0] {
        assert_eq!(response.await.unwrap().status(), StatusCode::OK);
    }
}
