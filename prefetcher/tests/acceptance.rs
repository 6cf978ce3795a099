//! Acceptance tests for issue 4: real sockets on 127.0.0.1:0, a synthetic origin that
//! counts fills. No assertion is about speed; waits are bounded only for correctness.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use models::{CacheKey, Outcome, TenantId};
use prefetcher::testing::{
    Behaviour, Fetched, PanicPoint, SyntheticOrigin, TestClient, TestNode, h2_connect, h2_get,
    wait_until,
};
use prefetcher::{
    CacheStatus, ChannelSink, Config, FlightKey, Node, PrewarmOutcome, ServeOptions, TenantConfig,
    WaitTimeoutPolicy, admin_app, serve,
};

const HOST: &str = "edge.test";

fn config(origin: &str) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.origin.header_timeout_ms = 20_000;
    c.flight.wait_timeout_ms = 20_000;
    c
}

fn body(path: &str) -> Bytes {
    SyntheticOrigin::body_for("origin", path, 1024)
}

fn statuses(results: &[Fetched]) -> Vec<CacheStatus> {
    results.iter().filter_map(|f| f.x_cache()).collect()
}

/// The response's `Age` in seconds; `None` without one. Panics on two or a bad one.
fn age(f: &Fetched) -> Option<u64> {
    let values: Vec<_> = f.headers.get_all(http::header::AGE).iter().collect();
    assert!(values.len() <= 1, "one Age at most: {values:?}");
    values
        .first()
        .map(|v| v.to_str().unwrap().parse().expect("Age is delta-seconds"))
}

/// Sends `n` concurrent GETs of `path` to `node` and returns the join handles.
fn spawn_gets(
    client: &TestClient,
    node: &TestNode,
    host: &'static str,
    path: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Fetched>> {
    (0..n)
        .map(|_| {
            let (client, addr) = (client.clone(), node.addr);
            tokio::spawn(async move { client.get(addr, host, path).await.expect("request") })
        })
        .collect()
}

async fn join(handles: Vec<tokio::task::JoinHandle<Fetched>>) -> Vec<Fetched> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

async fn wait_waiters(node: &TestNode, n: u64) {
    wait_until(
        || node.node.metrics().waiters_joined.get() >= n,
        "waiters to join",
    )
    .await;
}

/// The baseline the reference scenario measures collapsing against: with
/// `flight.collapse = false` every concurrent miss is its own origin fill.
#[tokio::test]
async fn without_collapsing_every_overlapping_miss_fills() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut cfg = config(&origin.url());
    cfg.flight.collapse = false;
    // Twelve fills at once to an origin that has not answered yet: past the slow
    // start of its adaptive limit (10), so the baseline runs on the fixed one.
    cfg.flight.adaptive_origin_limit = false;
    let node = TestNode::start(cfg).await;
    let client = TestClient::new();
    origin.hold();
    let handles = spawn_gets(&client, &node, HOST, "/a", 12);
    origin.wait_in_flight(12).await;
    origin.release();
    let results = join(handles).await;
    assert_eq!(origin.fills(), 12);
    for r in &results {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_ref().unwrap(), &body("/a"));
        assert_eq!(r.x_cache(), Some(CacheStatus::Miss));
        assert_eq!(age(r), None, "straight from an origin that sent no Age");
    }
    // The cache still works: the next request is a hit.
    let warm = client.get(node.addr, HOST, "/a").await.unwrap();
    assert_eq!(warm.x_cache(), Some(CacheStatus::Hit));
    assert!(age(&warm).is_some(), "served from the cache");
    assert!(node.node.registry().is_empty());
}

#[tokio::test]
async fn twelve_overlapping_requests_on_one_node_make_one_fill() {
    let origin = SyntheticOrigin::start("origin").await;
    // As a shield tier would: the response already spent 100 s in a cache upstream.
    origin.add_header("age", "100");
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    origin.hold();
    let handles = spawn_gets(&client, &node, HOST, "/a", 12);
    origin.wait_in_flight(1).await;
    wait_waiters(&node, 11).await;
    origin.release();
    let results = join(handles).await;
    assert_eq!(origin.fills(), 1);
    for r in &results {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_ref().unwrap(), &body("/a"));
    }
    let s = statuses(&results);
    assert_eq!(s.iter().filter(|s| **s == CacheStatus::Miss).count(), 1);
    assert_eq!(
        s.iter().filter(|s| **s == CacheStatus::Collapsed).count(),
        11
    );
    // RFC 9111 §5.1: the origin's Age plus the time since the fetch, one header each.
    for r in &results {
        assert!(age(r).is_some_and(|a| a >= 100), "{:?}", r.headers);
    }
    let warm = client.get(node.addr, HOST, "/a").await.unwrap();
    assert_eq!(warm.x_cache(), Some(CacheStatus::Hit));
    assert!(age(&warm).is_some_and(|a| a >= 100), "{:?}", warm.headers);
    assert_eq!(warm.body.unwrap(), body("/a"));
    assert_eq!(origin.fills(), 1);
    wait_until(|| node.node.registry().is_empty(), "flight entry removal").await;
}

#[tokio::test]
async fn three_nodes_make_three_fills_without_a_shield_and_one_with_it() {
    let client = TestClient::new();

    // Without a shield: one fill per node.
    let origin = SyntheticOrigin::start("origin").await;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(TestNode::start(config(&origin.url())).await);
    }
    origin.hold();
    let mut handles = Vec::new();
    for node in &nodes {
        handles.extend(spawn_gets(&client, node, HOST, "/s", 4));
    }
    for node in &nodes {
        wait_waiters(node, 3).await;
    }
    origin.wait_in_flight(3).await;
    origin.release();
    let results = join(handles).await;
    assert!(
        results
            .iter()
            .all(|r| r.body.as_ref().ok() == Some(&body("/s")))
    );
    assert_eq!(origin.fills(), 3);

    // With a shield: the edges' origin is a regional node; one fill per region.
    let origin = SyntheticOrigin::start("origin").await;
    let regional = TestNode::start(config(&origin.url())).await;
    let mut edges = Vec::new();
    for _ in 0..3 {
        edges.push(TestNode::start(config(&regional.url())).await);
    }
    origin.hold();
    let mut handles = Vec::new();
    for edge in &edges {
        handles.extend(spawn_gets(&client, edge, HOST, "/s", 4));
    }
    for edge in &edges {
        wait_waiters(edge, 3).await;
    }
    wait_waiters(&regional, 2).await;
    origin.release();
    let results = join(handles).await;
    for r in &results {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_ref().unwrap(), &body("/s"));
    }
    assert_eq!(origin.fills(), 1, "node-level plus regional collapsing");
    assert_eq!(regional.node.metrics().fills_started.get(), 1);
}

#[tokio::test]
async fn two_tenants_with_the_same_path_get_separate_fills_and_their_own_bodies() {
    let acme = SyntheticOrigin::start("acme").await;
    let globex = SyntheticOrigin::start("globex").await;
    let mut c = config(&acme.url());
    c.tenants = vec![
        TenantConfig {
            id: TenantId::new("acme").unwrap(),
            hosts: vec!["acme.test".into()],
            origin: acme.url(),
            host_header: None,
            weight: 1.0,
            peak_fills: None,
            routes: Vec::new(),
            origin_hints: None,
        },
        TenantConfig {
            id: TenantId::new("globex").unwrap(),
            hosts: vec!["globex.test".into()],
            origin: globex.url(),
            host_header: None,
            weight: 1.0,
            peak_fills: None,
            routes: Vec::new(),
            origin_hints: None,
        },
    ];
    let node = TestNode::start(c).await;
    let client = TestClient::new();
    acme.hold();
    globex.hold();
    let a = spawn_gets(&client, &node, "acme.test", "/same", 6);
    let g = spawn_gets(&client, &node, "globex.test:8080", "/same", 6);
    wait_waiters(&node, 10).await;
    acme.release();
    globex.release();
    for r in join(a).await {
        assert_eq!(
            r.body.unwrap(),
            SyntheticOrigin::body_for("acme", "/same", 1024)
        );
    }
    for r in join(g).await {
        assert_eq!(
            r.body.unwrap(),
            SyntheticOrigin::body_for("globex", "/same", 1024)
        );
    }
    assert_eq!((acme.fills(), globex.fills()), (1, 1));
    // The tenant comes from the host mapping only: an unknown host is refused.
    let unknown = client.get(node.addr, "evil.test", "/same").await.unwrap();
    assert_eq!(unknown.status, StatusCode::MISDIRECTED_REQUEST);
}

#[tokio::test]
async fn a_failing_origin_fails_every_caller_caches_nothing_and_the_next_wave_refills() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    origin.set_behaviour(Behaviour::Fail(500));
    origin.hold();
    let handles = spawn_gets(&client, &node, HOST, "/f", 12);
    wait_waiters(&node, 11).await;
    origin.release();
    let results = join(handles).await;
    assert_eq!(origin.fills(), 1);
    // Every caller gets the origin's own error, status and body (never stored).
    assert!(
        results
            .iter()
            .all(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR
                && r.body.as_deref().ok() == Some(&b"origin error\n"[..])),
        "{results:?}"
    );
    assert!(node.node.registry().is_empty(), "no flight entry remains");
    assert_eq!(node.node.metrics().fill_failures(), 1);

    origin.set_behaviour(Behaviour::Ok);
    origin.hold();
    let handles = spawn_gets(&client, &node, HOST, "/f", 12);
    wait_waiters(&node, 22).await;
    origin.release();
    let results = join(handles).await;
    assert_eq!(origin.fills(), 2, "the next wave makes one fresh fill");
    assert!(
        results
            .iter()
            .all(|r| r.body.as_ref().ok() == Some(&body("/f")))
    );

    let results = join(spawn_gets(&client, &node, HOST, "/f", 12)).await;
    assert_eq!(origin.fills(), 2, "a warm wave makes none");
    assert!(statuses(&results).iter().all(|s| *s == CacheStatus::Hit));
}

#[tokio::test]
async fn a_hung_origin_releases_waiters_within_the_bound() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_behaviour(Behaviour::Hang);
    let mut c = config(&origin.url());
    c.flight.wait_timeout_ms = 200;
    c.flight.on_wait_timeout = WaitTimeoutPolicy::Fail;
    c.origin.header_timeout_ms = 1_500;
    let node = TestNode::start(c).await;
    let client = TestClient::new();
    let handles = spawn_gets(&client, &node, HOST, "/h", 12);
    wait_waiters(&node, 11).await;
    origin.wait_in_flight(1).await;
    // Memory stays bounded: one flight and one origin request, however many wait.
    assert_eq!(node.node.registry().len(), 1);
    assert_eq!(origin.fills(), 1);
    let results = join(handles).await;
    assert!(
        results
            .iter()
            .all(|r| r.status == StatusCode::GATEWAY_TIMEOUT)
    );
    let s = statuses(&results);
    assert_eq!(
        s.iter().filter(|s| **s == CacheStatus::Collapsed).count(),
        11
    );
    assert_eq!(node.node.metrics().wait_timeouts.get(), 11);
    wait_until(
        || node.node.registry().is_empty(),
        "the hung fill to time out",
    )
    .await;
    assert_eq!(origin.fills(), 1, "waiters did not pile onto the origin");
}

#[tokio::test]
async fn waiters_hedge_after_the_bound_when_configured() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_behaviour(Behaviour::HangFirst);
    let mut c = config(&origin.url());
    c.flight.wait_timeout_ms = 200;
    c.flight.on_wait_timeout = WaitTimeoutPolicy::Hedge;
    c.origin.header_timeout_ms = 3_000;
    let node = TestNode::start(c).await;
    let client = TestClient::new();
    let leader = spawn_gets(&client, &node, HOST, "/hedge", 1);
    origin.wait_in_flight(1).await;
    let waiters = join(spawn_gets(&client, &node, HOST, "/hedge", 3)).await;
    for w in &waiters {
        assert_eq!(w.status, StatusCode::OK);
        assert_eq!(w.x_cache(), Some(CacheStatus::Miss));
        assert_eq!(w.body.as_ref().unwrap(), &body("/hedge"));
    }
    assert_eq!(node.node.metrics().hedges.get(), 3);
    let leader = join(leader).await;
    assert_eq!(leader[0].status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test]
async fn the_leaders_client_disconnecting_mid_fill_does_not_hurt_the_others() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_body_size(64 * 1024);
    origin.hold_mid_body(true);
    origin.hold();
    let node = TestNode::start(config(&origin.url())).await;
    let leader = {
        let (client, addr) = (TestClient::new(), node.addr);
        tokio::spawn(async move { client.get(addr, HOST, "/big").await })
    };
    origin.wait_in_flight(1).await;
    let client = TestClient::new();
    let others = spawn_gets(&client, &node, HOST, "/big", 11);
    wait_waiters(&node, 11).await;
    leader.abort();
    let _ = leader.await;
    origin.release();
    let expected = SyntheticOrigin::body_for("origin", "/big", 64 * 1024);
    for r in join(others).await {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.x_cache(), Some(CacheStatus::Collapsed));
        assert_eq!(r.body.unwrap(), expected, "the whole body");
    }
    assert_eq!(origin.fills(), 1);
    let warm = client.get(node.addr, HOST, "/big").await.unwrap();
    assert_eq!(warm.x_cache(), Some(CacheStatus::Hit));
}

async fn stranded_after_30s<T>(responses: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), responses)
        .await
        .expect("a client was stranded by the panicked fill")
}

fn flight_key(path: &str) -> FlightKey {
    FlightKey::new(TenantId::new("acme").unwrap(), CacheKey::new(path).unwrap())
}

/// A fill task that panics before its response head: the leader's client gets a
/// clean 502, the waiters take over leadership and all get the whole body from one
/// more origin fill, which is cached; no flight entry remains.
#[tokio::test]
async fn a_leader_panicking_before_the_head_hands_over_to_its_waiters() {
    let origin = SyntheticOrigin::start("origin").await;
    let mut cfg = config(&origin.url());
    // A stranded waiter would answer 504 at the bound (never fetch on its own), so
    // only a real hand-over can produce bodies with two origin fills.
    cfg.flight.wait_timeout_ms = 10_000;
    cfg.flight.on_wait_timeout = WaitTimeoutPolicy::Fail;
    let node = TestNode::start(cfg).await;
    let client = TestClient::new();
    origin.hold();
    let leader = spawn_gets(&client, &node, HOST, "/p", 1);
    origin.wait_in_flight(1).await;
    let waiters = spawn_gets(&client, &node, HOST, "/p", 11);
    wait_waiters(&node, 11).await;
    node.node
        .panic_next_fill(flight_key("/p"), PanicPoint::BeforeHead);
    origin.release();

    // Every response is bounded (a correctness bound, not a speed claim): a stranded
    // subscriber fails the test instead of hanging it.
    let waiters = stranded_after_30s(join(waiters)).await;
    for r in &waiters {
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.body.as_ref().unwrap(), &body("/p"), "the whole body");
    }
    let s = statuses(&waiters);
    assert_eq!(
        s.iter().filter(|s| **s == CacheStatus::Miss).count(),
        1,
        "exactly one waiter took over: {s:?}"
    );
    let leader = stranded_after_30s(join(leader)).await.pop().unwrap();
    assert_eq!(leader.status, StatusCode::BAD_GATEWAY, "{leader:?}");
    assert_eq!(leader.x_cache(), Some(CacheStatus::Miss));
    assert_eq!(
        leader.headers.get("cache-control").unwrap(),
        "no-store",
        "the error is not cacheable downstream"
    );
    assert_eq!(
        origin.fills_for("/p"),
        2,
        "the panicked fill and the hand-over"
    );
    wait_until(|| node.node.registry().is_empty(), "flight entry removal").await;
    let next = client.get(node.addr, HOST, "/p").await.unwrap();
    assert_eq!(next.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(next.body.unwrap(), body("/p"));
    assert_eq!(origin.fills_for("/p"), 2);
}

/// A fill task that panics mid-body: every response already started ends in an
/// error (never a complete-looking short body), nothing is cached, no flight entry
/// remains, and the next request succeeds with exactly one more origin fill.
#[tokio::test]
async fn a_leader_panicking_mid_body_fails_every_response_cleanly() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_body_size(64 * 1024);
    origin.hold_mid_body(true);
    origin.hold();
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    let handles: Vec<_> = (0..12)
        .map(|_| {
            let (client, addr) = (client.clone(), node.addr);
            tokio::spawn(async move { client.get(addr, HOST, "/q").await })
        })
        .collect();
    origin.wait_in_flight(1).await;
    wait_waiters(&node, 11).await;
    // Armed once everyone subscribed: the next body chunk the fill takes (at the
    // latest the second half, after the release) panics.
    node.node
        .panic_next_fill(flight_key("/q"), PanicPoint::MidBody);
    origin.release();
    let expected = SyntheticOrigin::body_for("origin", "/q", 64 * 1024);
    let results = stranded_after_30s(futures::future::join_all(handles)).await;
    for r in results {
        // Either the connection closes before hyper wrote the head, or the body
        // breaks off after it: both are errors a client sees as such.
        match r.unwrap() {
            Err(_) => {}
            Ok(r) => assert!(
                r.body.is_err(),
                "a short body must not look complete: {} {:?}",
                r.status,
                r.body.as_ref().map(|b| b.len())
            ),
        }
    }
    wait_until(|| node.node.registry().is_empty(), "flight entry removal").await;
    assert_eq!(origin.fills_for("/q"), 1);
    let next = client.get(node.addr, HOST, "/q").await.unwrap();
    assert_eq!(
        next.x_cache(),
        Some(CacheStatus::Miss),
        "nothing was cached"
    );
    assert_eq!(next.body.unwrap(), expected);
    assert_eq!(origin.fills_for("/q"), 2, "exactly one more origin fill");
    let warm = client.get(node.addr, HOST, "/q").await.unwrap();
    assert_eq!(warm.x_cache(), Some(CacheStatus::Hit));
}

#[tokio::test]
async fn a_truncated_origin_body_is_never_cached_nor_served_as_complete() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_behaviour(Behaviour::Truncate);
    origin.hold();
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    let handles = spawn_gets(&client, &node, HOST, "/t", 12);
    wait_waiters(&node, 11).await;
    origin.release();
    for r in join(handles).await {
        let complete = r.status == StatusCode::OK && r.body.as_ref().ok() == Some(&body("/t"));
        assert!(!complete, "a truncated body was served as complete");
        assert!(r.body.is_err() || r.status != StatusCode::OK, "{r:?}");
    }
    wait_until(|| node.node.registry().is_empty(), "flight removal").await;
    origin.set_behaviour(Behaviour::Ok);
    let next = client.get(node.addr, HOST, "/t").await.unwrap();
    assert_eq!(
        next.x_cache(),
        Some(CacheStatus::Miss),
        "nothing was cached"
    );
    assert_eq!(next.body.unwrap(), body("/t"));
    assert_eq!(origin.fills(), 2);
}

#[tokio::test]
async fn ten_thousand_concurrent_requests_on_one_cold_key_make_one_fill() {
    const CONNECTIONS: usize = 10;
    const PER_CONNECTION: usize = 1_000;
    let origin = SyntheticOrigin::start("origin").await;
    let mut c = config(&origin.url());
    c.http2.max_concurrent_streams = PER_CONNECTION as u32;
    let node = TestNode::start(c).await;
    origin.hold();
    // h2c multiplexing keeps this within the file-descriptor limit while every
    // request is a real, concurrent request through the proxy.
    let mut handles = Vec::new();
    for _ in 0..CONNECTIONS {
        let sender = h2_connect(node.addr).await.expect("h2c connection");
        for _ in 0..PER_CONNECTION {
            let mut sender = sender.clone();
            handles.push(tokio::spawn(async move {
                h2_get(&mut sender, HOST, "/viral").await
            }));
        }
    }
    let total = (CONNECTIONS * PER_CONNECTION) as u64;
    wait_waiters(&node, total - 1).await;
    origin.release();
    let mut errors = 0;
    for h in handles {
        match h.await.expect("task") {
            Ok(r)
                if r.status == StatusCode::OK && r.body.as_ref().ok() == Some(&body("/viral")) => {}
            _ => errors += 1,
        }
    }
    assert_eq!(errors, 0);
    assert_eq!(origin.fills(), 1);
}

#[tokio::test]
async fn credentials_and_per_user_responses_never_collapse() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    // Requests with credentials pass through, each to the origin.
    for _ in 0..2 {
        let r = client
            .request(
                Method::GET,
                node.addr,
                HOST,
                "/me",
                &[("authorization", "Bearer x")],
            )
            .await
            .unwrap();
        assert_eq!(r.x_cache(), Some(CacheStatus::Bypass));
    }
    assert_eq!(origin.fills_for("/me"), 2);
    let post = client
        .request(Method::POST, node.addr, HOST, "/form", &[])
        .await
        .unwrap();
    assert_eq!(post.x_cache(), Some(CacheStatus::Bypass));

    // A response that sets a cookie goes to its own request only.
    origin.add_header("set-cookie", "session=1");
    origin.hold();
    let handles = spawn_gets(&client, &node, HOST, "/cookie", 3);
    wait_waiters(&node, 2).await;
    origin.release();
    for r in join(handles).await {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.x_cache(), Some(CacheStatus::Miss));
    }
    assert_eq!(
        origin.fills_for("/cookie"),
        3,
        "the waiters fetched on their own"
    );
    client.get(node.addr, HOST, "/cookie").await.unwrap();
    assert_eq!(origin.fills_for("/cookie"), 4, "nothing was cached");
}

#[tokio::test]
async fn stale_entries_are_served_while_one_refresh_runs() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_cache_control(Some("max-age=1, stale-while-revalidate=60"));
    let mut c = config(&origin.url());
    c.cache.jitter = 0.0;
    let node = TestNode::start(c).await;
    let client = TestClient::new();
    assert_eq!(
        client.get(node.addr, HOST, "/swr").await.unwrap().x_cache(),
        Some(CacheStatus::Miss)
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let results = join(spawn_gets(&client, &node, HOST, "/swr", 5)).await;
    for r in &results {
        assert_eq!(r.body.as_ref().unwrap(), &body("/swr"));
        if r.x_cache() == Some(CacheStatus::Stale) {
            assert!(age(r).is_some_and(|a| a >= 1), "{:?}", r.headers);
        }
    }
    assert!(statuses(&results).contains(&CacheStatus::Stale));
    wait_until(|| node.node.registry().is_empty(), "the refresh").await;
    assert_eq!(
        origin.fills(),
        2,
        "one background refresh for the whole wave"
    );
    assert_eq!(
        client.get(node.addr, HOST, "/swr").await.unwrap().x_cache(),
        Some(CacheStatus::Hit)
    );
}

#[tokio::test]
async fn a_prewarmed_entry_reports_prefetched_on_its_first_user_hit() {
    let origin = SyntheticOrigin::start("origin").await;
    let (sink, mut events) = ChannelSink::new(64);
    let node = Node::with_sink(config(&origin.url()), Arc::new(sink)).unwrap();
    let node = TestNode::start_with(node).await;
    let tenant = TenantId::new("acme").unwrap();
    let key = CacheKey::new("/warm").unwrap();
    assert_eq!(
        node.node.prewarm(&tenant, key.clone()),
        Ok(PrewarmOutcome::Started)
    );
    wait_until(
        || {
            node.node
                .cache()
                .get_fresh(&prefetcher::FlightKey::new(tenant.clone(), key.clone()))
                .is_some()
        },
        "the pre-warm",
    )
    .await;
    assert_eq!(
        node.node.prewarm(&tenant, key.clone()),
        Ok(PrewarmOutcome::Cached)
    );
    let client = TestClient::new();
    let first = client.get(node.addr, HOST, "/warm").await.unwrap();
    assert_eq!(first.x_cache(), Some(CacheStatus::Prefetched));
    assert!(
        age(&first).is_some(),
        "served from the cache: {:?}",
        first.headers
    );
    let second = client.get(node.addr, HOST, "/warm").await.unwrap();
    assert_eq!(second.x_cache(), Some(CacheStatus::Hit));
    let outcomes: Vec<Outcome> = (0..4).map(|_| events.try_recv().unwrap().outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::PrefetchFill,
            // The second pre-warm found it cached and said so.
            Outcome::PrefetchCached,
            Outcome::PrefetchUseful,
            Outcome::Hit
        ]
    );
    assert_eq!(origin.fills(), 1);
}

#[tokio::test]
async fn metrics_are_served_on_the_admin_listener_with_bounded_labels() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let client = TestClient::new();
    client.get(node.addr, HOST, "/m").await.unwrap();
    client.get(node.addr, HOST, "/m").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let task = tokio::spawn(serve(
        listener,
        admin_app(node.node.clone()),
        std::future::pending(),
        ServeOptions::default(),
    ));
    let r = client.get(admin, "admin", "/metrics").await.unwrap();
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(
        text.contains(r#"prefetcher_requests_total{status="MISS"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"prefetcher_requests_total{status="HIT"} 1"#));
    assert!(text.contains("prefetcher_fills_started_total 1"));
    assert!(text.contains("prefetcher_waiters_joined_total"));
    assert!(text.contains("prefetcher_hedges_total"));
    assert!(text.contains("prefetcher_wait_seconds_bucket"));
    // The configured tenant is a label of the per-tenant fill series only; keys never.
    assert!(text.contains(r#"prefetcher_tenant_fills_active{tenant="acme"} 0"#));
    let elsewhere = text.replace(r#"{tenant="acme"}"#, "");
    assert!(
        !elsewhere.contains("acme") && !text.contains("/m\""),
        "no tenants but configured ones, no keys as labels"
    );
    task.abort();
}
