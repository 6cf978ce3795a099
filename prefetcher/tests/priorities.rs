//! Fill priorities through the proxy: an overloaded origin answers 503 with a growing
//! `Retry-After` instead of queueing users without bound, and a pre-warm never takes
//! a slot a waiting user needs.

use std::sync::Arc;

use http::{StatusCode, header};
use models::{CacheKey, Outcome, TenantId};
use prefetcher::testing::{Fetched, SyntheticOrigin, TestClient, TestNode, wait_until};
use prefetcher::{CacheStatus, ChannelSink, Config, Node, PrewarmOutcome};

const HOST: &str = "edge.test";

fn config(origin: &str) -> Config {
    Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    )
}

/// A node with one fill slot, none of it reserved for users, set up further by `tune`,
/// whose slot a held fill of `/slow` takes: the origin, the node, a client and that
/// fill's request (answered once the origin is released).
async fn one_slot_taken(
    tune: impl FnOnce(&mut Config),
) -> (
    SyntheticOrigin,
    TestNode,
    TestClient,
    tokio::task::JoinHandle<Fetched>,
) {
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.flight.max_fills = 1;
    c.flight.reserved_for_user = 0;
    tune(&mut c);
    let node = TestNode::start(c).await;
    let client = TestClient::new();
    origin.hold();
    let leader = {
        let (client, addr) = (client.clone(), node.addr);
        tokio::spawn(async move { client.get(addr, HOST, "/slow").await.unwrap() })
    };
    origin.wait_in_flight(1).await;
    (origin, node, client, leader)
}

#[tokio::test]
async fn an_overloaded_origin_gets_503_with_a_growing_jittered_retry_after() {
    let (origin, node, client, leader) = one_slot_taken(|c| {
        c.flight.max_queued_fills = 0;
        c.flight.retry_after_max_s = 600;
    })
    .await;
    let mut retry_after = Vec::new();
    for i in 0..20 {
        let r = client
            .get(node.addr, HOST, &format!("/other{i}"))
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.x_cache(), Some(CacheStatus::Miss));
        let secs: u32 = r.headers[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=600).contains(&secs), "{secs}");
        retry_after.push(secs);
    }
    // Twenty rejections in a row on one slot: the advice grows with the overload
    // (the first is at most 3 s; the jitter is at most +50 %).
    assert!(retry_after[0] <= 3, "{retry_after:?}");
    assert!(retry_after[19] > retry_after[0], "{retry_after:?}");
    assert_eq!(
        origin.fills(),
        1,
        "rejected requests never reached the origin"
    );
    origin.release();
    assert_eq!(leader.await.unwrap().status, StatusCode::OK);
    let ok = client.get(node.addr, HOST, "/other0").await.unwrap();
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "served again once the slot is free"
    );
}

/// A user fill waiting for a slot has a deadline: then its request gets 503 with a
/// `Retry-After`, and the origin never sees it.
#[tokio::test]
async fn a_queued_user_fill_gets_503_at_its_deadline() {
    let (origin, node, client, leader) = one_slot_taken(|c| c.flight.queue_timeout_ms = 200).await;
    let r = client.get(node.addr, HOST, "/queued").await.unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(
        origin.fills(),
        1,
        "the refused fill never reached the origin"
    );
    origin.release();
    assert_eq!(leader.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn a_prewarm_never_takes_the_user_reserve_and_waits_for_spare_capacity() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.flight.max_fills = 2;
    c.flight.reserved_for_user = 1;
    let (sink, mut events) = ChannelSink::new(64);
    let node = Node::with_sink(c, Arc::new(sink)).unwrap();
    let node = TestNode::start_with(node).await;
    let client = TestClient::new();
    let tenant = TenantId::new("acme").unwrap();
    origin.hold();
    let user = {
        let (client, addr) = (client.clone(), node.addr);
        tokio::spawn(async move { client.get(addr, HOST, "/user").await.unwrap() })
    };
    origin.wait_in_flight(1).await;
    // One slot is free, but it is the user reserve: the pre-warm queues.
    assert_eq!(
        node.node
            .prewarm(&tenant, CacheKey::new("/warm?b=2&a=1").unwrap()),
        Ok(PrewarmOutcome::Started)
    );
    let limiter = node.node.origin().limiter().clone();
    wait_until(|| limiter.prefetch_queued() == 1, "the queued pre-warm").await;
    assert_eq!(origin.in_flight(), 1);
    origin.release();
    assert_eq!(user.await.unwrap().status, StatusCode::OK);
    // With the user fill done there is spare capacity: the pre-warm runs.
    wait_until(
        || origin.fills_for("/warm?a=1&b=2") == 1,
        "the pre-warm fill",
    )
    .await;
    let warmed = wait_for_status(&client, &node, "/warm?a=1&b=2").await;
    assert_eq!(
        warmed,
        CacheStatus::Prefetched,
        "the key was normalised like a request's"
    );
    let m = node.node.metrics();
    assert_eq!(m.prefetches_started.get(), 1);
    assert_eq!(m.prefetches_useful.get(), 1);
    assert_eq!(m.prefetches_shed.get(), 0);
    let mut outcomes = Vec::new();
    while let Ok(r) = events.try_recv() {
        outcomes.push(r.outcome);
    }
    assert!(outcomes.contains(&Outcome::PrefetchFill), "{outcomes:?}");
    assert!(outcomes.contains(&Outcome::PrefetchUseful), "{outcomes:?}");
}

/// The first response for `path` once the pre-warm's entry is stored.
async fn wait_for_status(client: &TestClient, node: &TestNode, path: &str) -> CacheStatus {
    let key =
        prefetcher::FlightKey::new(TenantId::new("acme").unwrap(), CacheKey::new(path).unwrap());
    wait_until(
        || node.node.cache().get_fresh(&key).is_some(),
        "the stored entry",
    )
    .await;
    client
        .get(node.addr, HOST, path)
        .await
        .unwrap()
        .x_cache()
        .unwrap()
}
