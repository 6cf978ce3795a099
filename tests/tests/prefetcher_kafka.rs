//! The prefetcher's Kafka loop against a broker (real or embedded): pre-warm commands
//! read from `prewarm` fill through the single-flight path at prefetch priority,
//! access events reach `edge-events`, forged commands are refused and counted, and
//! neither a saturated origin nor an unreachable broker hurts user requests.
//!
//! Every test uses its own topics and consumer groups, so tests (and earlier runs
//! against the same broker) never see each other's messages.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use models::{
    AccessEvent, CacheKey, EdgeKind, Outcome, PrewarmCommand, Reason, RegionId, RegionTargets,
    TenantId, decode, encode,
};
use prefetcher::testing::{Fetched, SyntheticOrigin, TestClient, wait_until};
use prefetcher::{CacheStatus, Config, FlightKey, NodeHandle, spawn_node};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tests::{TestKafka, wall_ms};

const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";

/// Topics for one test, created on the broker.
struct Topics {
    events: String,
    prewarm: String,
}

impl Topics {
    async fn create(kafka: &TestKafka) -> Topics {
        let topics = Topics {
            events: kafka.unique_topic("edge-events"),
            prewarm: kafka.unique_topic("prewarm"),
        };
        kafka.create_topic(&topics.events, 3).await;
        kafka.create_topic(&topics.prewarm, 2).await;
        topics
    }
}

/// A node config for `origin` with Kafka at `brokers` on `topics`.
fn node_config(origin: &SyntheticOrigin, brokers: &str, topics: &Topics) -> Config {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin.url(),
    );
    let node = format!(
        "edge-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    config.region = Some(RegionId::new(REGION).unwrap());
    config.kafka.group_id = Some(format!("{}-{node}", topics.prewarm));
    config.node = Some(node.parse().unwrap());
    config.kafka.brokers = Some(brokers.to_string());
    config.kafka.events_topic = topics.events.clone();
    config.kafka.prewarm_topic = topics.prewarm.clone();
    config.kafka.linger_ms = 5;
    config
}

fn command(key: &str, regions: RegionTargets) -> PrewarmCommand {
    let now = wall_ms();
    PrewarmCommand::new(
        format!("c-{key}"),
        TenantId::new(TENANT).unwrap(),
        CacheKey::new(key).unwrap(),
        0.9,
        now,
        now + 120_000,
        regions,
        Reason {
            model: "test".into(),
            intercept: 0.0,
            features: Vec::new(),
        },
    )
}

fn here() -> RegionTargets {
    RegionTargets::Only(vec![RegionId::new(REGION).unwrap()])
}

async fn produce(producer: &FutureProducer, topic: &str, key: &str, payload: &[u8]) {
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(payload),
            Duration::from_secs(30),
        )
        .await
        .expect("producing a pre-warm command");
}

async fn produce_command(producer: &FutureProducer, topic: &str, command: &PrewarmCommand) {
    produce(producer, topic, &command.partition_key(), &encode(command)).await;
}

/// Reads `topic` from the start until `done` holds for the events read (60 s bound).
async fn read_events(
    kafka: &TestKafka,
    topic: &str,
    mut done: impl FnMut(&[AccessEvent]) -> bool,
) -> Vec<AccessEvent> {
    let consumer = kafka.consumer(&format!("{topic}-reader"));
    consumer.subscribe(&[topic]).unwrap();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(&events) {
        let message = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("gave up waiting for events; read {events:?}"))
            .expect("reading edge-events");
        events.push(decode(message.payload().unwrap_or_default()).expect("a valid event"));
    }
    events
}

async fn get(node: &NodeHandle, path: &str) -> Fetched {
    TestClient::new()
        .get(node.addr(), HOST, path)
        .await
        .expect("request")
}

fn spawn_get(node: &NodeHandle, path: &str) -> tokio::task::JoinHandle<Fetched> {
    let (addr, path) = (node.addr(), path.to_string());
    tokio::spawn(async move {
        TestClient::new()
            .get(addr, HOST, &path)
            .await
            .expect("request")
    })
}

fn cached(node: &NodeHandle, path: &str) -> bool {
    let key = FlightKey::new(TenantId::new(TENANT).unwrap(), CacheKey::new(path).unwrap());
    node.node().cache().get_fresh(&key).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_fills_once_and_its_first_user_hit_is_prefetched_and_published() {
    let kafka = TestKafka::start();
    let topics = Topics::create(&kafka).await;
    let origin = SyntheticOrigin::start("origin").await;
    let node = spawn_node(node_config(&origin, kafka.bootstrap_servers(), &topics))
        .await
        .unwrap();
    let producer = kafka.producer();
    produce_command(&producer, &topics.prewarm, &command("/warm", here())).await;

    wait_until(|| cached(&node, "/warm"), "the pre-warm fill").await;
    assert_eq!(origin.fills_for("/warm"), 1);
    let first = TestClient::new()
        .request(
            http::Method::GET,
            node.addr(),
            HOST,
            "/warm",
            &[("referer", "https://News.Example.com/story?id=1")],
        )
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.x_cache(), Some(CacheStatus::Prefetched));
    assert_eq!(
        first.body.unwrap(),
        SyntheticOrigin::body_for("origin", "/warm", 1024)
    );
    assert_eq!(get(&node, "/warm").await.x_cache(), Some(CacheStatus::Hit));
    assert_eq!(
        origin.fills(),
        1,
        "one origin fill for the pre-warm and both hits"
    );

    let events = read_events(&kafka, &topics.events, |e| e.len() >= 3).await;
    let outcomes: Vec<Outcome> = events.iter().map(|e| e.outcome).collect();
    assert_eq!(
        outcomes,
        [Outcome::PrefetchFill, Outcome::PrefetchUseful, Outcome::Hit],
        "one key's events arrive in order on its partition"
    );
    assert!(
        events.iter().all(|e| e.edge == Some(EdgeKind::Prefetcher)),
        "a prefetcher's events say so: {events:?}"
    );
    let useful = &events[1];
    assert_eq!(useful.key.as_str(), "/warm");
    assert_eq!(useful.tenant.as_str(), TENANT);
    assert_eq!(useful.region.as_str(), REGION);
    assert_eq!(Some(&useful.node), node.node().config().node.as_ref());
    assert_eq!(
        useful.referrer.as_ref().map(|d| d.as_str()),
        Some("news.example.com")
    );
    assert_eq!(useful.bytes, 1024);
    let m = node.node().metrics();
    assert_eq!(m.prefetches_received.get(), 1);
    assert_eq!(m.prefetches_started.get(), 1);
    assert_eq!(m.prefetches_useful.get(), 1);
    wait_until(
        || m.events_published.get() == 3,
        "delivery acknowledgements",
    )
    .await;
    assert_eq!(m.events_dropped.get(), 0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_for_a_key_in_flight_joins_the_user_fill() {
    let kafka = TestKafka::start();
    let topics = Topics::create(&kafka).await;
    let origin = SyntheticOrigin::start("origin").await;
    let node = spawn_node(node_config(&origin, kafka.bootstrap_servers(), &topics))
        .await
        .unwrap();
    origin.hold();
    let user = spawn_get(&node, "/join");
    origin.wait_in_flight(1).await;
    produce_command(
        &kafka.producer(),
        &topics.prewarm,
        &command("/join", here()),
    )
    .await;
    let m = node.node().metrics();
    wait_until(|| m.prefetches_joined.get() == 1, "the pre-warm joining").await;
    origin.release();
    let user = user.await.unwrap();
    assert_eq!(user.status, 200);
    assert_eq!(user.x_cache(), Some(CacheStatus::Miss));
    assert_eq!(
        origin.fills_for("/join"),
        1,
        "one fill for the user and the pre-warm"
    );
    assert_eq!(m.prefetches_started.get(), 0);
    assert_eq!(
        get(&node, "/join").await.x_cache(),
        Some(CacheStatus::Hit),
        "a user fill's entry is not reported as prefetched"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_request_promotes_a_queued_prefetch() {
    let kafka = TestKafka::start();
    let topics = Topics::create(&kafka).await;
    let origin = SyntheticOrigin::start("origin").await;
    let mut config = node_config(&origin, kafka.bootstrap_servers(), &topics);
    config.flight.max_fills = 2;
    config.flight.reserved_for_user = 1;
    config.prefetch.max_fills = 1;
    config.prefetch.queue_timeout_ms = 120_000;
    let node = spawn_node(config).await.unwrap();
    let limiter = node.node().origin().limiter().clone();
    let m = node.node().metrics();
    origin.hold();
    let producer = kafka.producer();
    // The first pre-warm takes the only prefetch slot and is held at the origin.
    produce_command(&producer, &topics.prewarm, &command("/p1", here())).await;
    origin.wait_in_flight(1).await;
    // The second waits in the prefetch queue.
    produce_command(&producer, &topics.prewarm, &command("/p2", here())).await;
    wait_until(|| limiter.prefetch_queued() == 1, "the queued pre-warm").await;
    assert_eq!(origin.fills_for("/p2"), 0);
    // A user joins it: it leaves the prefetch queue for a user slot.
    let user = spawn_get(&node, "/p2");
    origin.wait_in_flight(2).await;
    assert_eq!(m.prefetches_promoted.get(), 1);
    assert_eq!(limiter.prefetch_queued(), 0);
    origin.release();
    let user = user.await.unwrap();
    assert_eq!(user.status, 200);
    assert_eq!(user.x_cache(), Some(CacheStatus::Collapsed));
    assert_eq!(origin.fills_for("/p2"), 1);
    wait_until(|| cached(&node, "/p1"), "the first pre-warm").await;
    assert_eq!(m.prefetches_shed.get(), 0);
    assert_eq!(origin.fills(), 2);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_origin_saturated_prefetches_are_shed_and_users_are_served() {
    let kafka = TestKafka::start();
    let topics = Topics::create(&kafka).await;
    let origin = SyntheticOrigin::start("origin").await;
    let mut config = node_config(&origin, kafka.bootstrap_servers(), &topics);
    config.flight.max_fills = 3;
    config.flight.reserved_for_user = 1;
    config.prefetch.queue_timeout_ms = 120_000;
    let node = spawn_node(config).await.unwrap();
    let limiter = node.node().origin().limiter().clone();
    let m = node.node().metrics();
    origin.hold();
    // Users take every fill slot.
    let mut users: Vec<_> = (1..=3)
        .map(|i| spawn_get(&node, &format!("/u{i}")))
        .collect();
    origin.wait_in_flight(3).await;
    let producer = kafka.producer();
    for i in 1..=3 {
        produce_command(
            &producer,
            &topics.prewarm,
            &command(&format!("/s{i}"), here()),
        )
        .await;
    }
    wait_until(|| limiter.prefetch_queued() == 3, "the queued pre-warms").await;
    // One more user has to wait for a slot: the queued prefetches go first.
    users.push(spawn_get(&node, "/u4"));
    wait_until(|| m.prefetches_shed.get() == 3, "the pre-warms shed").await;
    assert_eq!(limiter.prefetch_queued(), 0);
    origin.release();
    for user in users {
        let user = user.await.unwrap();
        assert_eq!(user.status, 200, "users are unaffected");
        assert_eq!(user.x_cache(), Some(CacheStatus::Miss));
    }
    for i in 1..=3 {
        assert_eq!(
            origin.fills_for(&format!("/s{i}")),
            0,
            "shed, never fetched"
        );
    }
    assert_eq!(origin.fills(), 4);
    // Shed pre-warms leave nothing behind: the key can be filled afresh.
    assert_eq!(get(&node, "/s1").await.x_cache(), Some(CacheStatus::Miss));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_unreachable_the_proxy_serves_and_counts_dropped_events() {
    let origin = SyntheticOrigin::start("origin").await;
    let topics = Topics {
        events: "edge-events".into(),
        prewarm: "prewarm".into(),
    };
    // Nothing listens on port 1: the producer can never deliver.
    let mut config = node_config(&origin, "127.0.0.1:1", &topics);
    config.kafka.message_timeout_ms = 1_000;
    config.kafka.event_buffer = 8;
    let node = spawn_node(config).await.unwrap();
    let requests = 40;
    for i in 0..requests {
        let r = get(&node, &format!("/k{}", i % 5)).await;
        assert_eq!(r.status, 200);
        assert!(r.body.is_ok());
    }
    let m = node.node().metrics();
    assert_eq!(
        m.requests(CacheStatus::Miss) + m.requests(CacheStatus::Hit),
        requests
    );
    // Every event is dropped, either at the full buffer or when its delivery times out.
    wait_until(
        || m.events_dropped.get() == requests,
        "every event counted as dropped",
    )
    .await;
    assert_eq!(m.events_published.get(), 0);
    // Still serving.
    assert_eq!(get(&node, "/k0").await.x_cache(), Some(CacheStatus::Hit));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_foreign_commands_are_refused_and_counted() {
    let kafka = TestKafka::start();
    let topics = Topics::create(&kafka).await;
    let origin = SyntheticOrigin::start("origin").await;
    let node = spawn_node(node_config(&origin, kafka.bootstrap_servers(), &topics))
        .await
        .unwrap();
    let valid = serde_json::to_value(command("/ok", here())).unwrap();
    let with = |field: &str, value: serde_json::Value| {
        let mut v = valid.clone();
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    };
    let now = wall_ms();
    let mut huge = valid.clone();
    huge["reason"]["model"] = serde_json::Value::String("m".repeat(20_000));
    let forged: Vec<(&str, Vec<u8>)> = vec![
        ("malformed", b"{not json".to_vec()),
        ("malformed", Vec::new()),
        (
            "invalid_field",
            with("key", "http://evil.example/steal".into()),
        ),
        ("invalid_field", with("key", "//evil.example/steal".into())),
        ("invalid_field", with("key", "/a/../../etc/passwd".into())),
        ("too_large", serde_json::to_vec(&huge).unwrap()),
        ("unsupported_version", with("v", 9.into())),
        ("unknown_tenant", with("tenant", "mallory".into())),
        ("expired", {
            let mut v = valid.clone();
            v["issued_at_ms"] = (now - 20_000).into();
            v["expires_at_ms"] = (now - 10_000).into();
            serde_json::to_vec(&v).unwrap()
        }),
        (
            "other_region",
            with("regions", serde_json::json!(["us-east"])),
        ),
    ];
    let producer = kafka.producer();
    for (_, payload) in &forged {
        produce(&producer, &topics.prewarm, "acme/x", payload).await;
    }
    // A user-priority command is honoured only at prefetch priority; "all" targets us.
    let mut ok = command("/ok", RegionTargets::All);
    ok.priority = models::Priority::User;
    produce_command(&producer, &topics.prewarm, &ok).await;
    // The same decision again (a replay upstream): same id, dropped as a repeat.
    produce_command(&producer, &topics.prewarm, &ok).await;

    let m = node.node().metrics();
    let total = forged.len() as u64 + 2;
    wait_until(
        || m.prefetches_received.get() == total,
        "every command read",
    )
    .await;
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for (reason, _) in &forged {
        *expected.entry(reason).or_default() += 1;
    }
    for (reason, count) in &expected {
        assert_eq!(m.prewarm_rejections(reason), *count, "reason {reason}");
    }
    assert_eq!(m.prewarm_rejections("duplicate"), 1, "the repeat");
    wait_until(|| cached(&node, "/ok"), "the valid pre-warm").await;
    assert_eq!(m.prefetches_started.get(), 1);
    assert_eq!(
        origin.fills(),
        1,
        "only the valid command reached the origin"
    );
    assert_eq!(origin.fills_for("/ok"), 1);
    let text = m.encode();
    assert!(
        text.contains(r#"prefetcher_prefetches_rejected_total{reason="unknown_tenant"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("mallory") && !text.contains("evil"),
        "no labels from input"
    );
    node.shutdown().await;
}
