//! Pulse against hostile and messy producers, over Kafka, started as it ships
//! (`pulse::start`): the rows of README's "Hostile producers" table that go through
//! ingest. Each test produces to its own topic and reads the outcome back through the
//! metrics and the dashboard API. The rows that need no broker (a key flood, a region
//! flood, one node flooding one key) are unit tests in `pulse/src/heat/mod.rs`.

use std::time::Duration;

use axum::http::StatusCode;
use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use pulse::testing::{TestKafka, get_json as get, produce, wall_ms};
use pulse::{HeatConfig, Metrics, PulseConfig, PulseHandle};

fn event(tenant: &str, ts_ms: u64, key: &str) -> AccessEvent {
    AccessEvent::new(
        ts_ms,
        TenantId::new(tenant).unwrap(),
        CacheKey::new(key).unwrap(),
        RegionId::new("eu-west").unwrap(),
        NodeId::new("edge-1").unwrap(),
        Outcome::Miss,
    )
}

fn rejected(metrics: &Metrics, reason: &'static str) -> u64 {
    metrics
        .rejected
        .get_or_create(&pulse::ReasonLabel { reason })
        .get()
}

/// Every message accounted for: applied or rejected with some reason.
fn handled(metrics: &Metrics) -> u64 {
    metrics.consumed.get()
        + pulse::RejectReason::ALL
            .iter()
            .map(|r| rejected(metrics, r.as_str()))
            .sum::<u64>()
}

/// A one-partition topic (so the order produced is the order applied) and a pulse
/// reading it: heat map and API only, no commands on the shared broker.
async fn pulse_on(kafka: &TestKafka, prefix: &str, config: PulseConfig) -> (String, PulseHandle) {
    let topic = kafka.unique_topic(prefix);
    kafka.create_topic(&topic, 1).await;
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: format!("{topic}-pulse"),
        topic: topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        prewarm: false,
        ..config
    };
    let pulse = pulse::start(config).await.expect("starting pulse");
    (topic, pulse)
}

async fn wait_handled(pulse: &PulseHandle, expected: u64) {
    let metrics = pulse.metrics();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while handled(metrics) < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled: {} of {expected} messages handled, metrics:\n{}",
            handled(metrics),
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(handled(metrics), expected, "{}", metrics.encode());
}

/// Row "future and far-past timestamps": one event stamped an hour ahead is rejected
/// `from_future` and cannot move the watermark, so the on-time events of every tenant
/// after it are applied; an event from before the 60 s window is `too_old`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_event_does_not_blind_on_time_events() {
    let kafka = TestKafka::start();
    let (topic, pulse) = pulse_on(&kafka, "hostile-skew", PulseConfig::default()).await;
    let producer = kafka.producer();
    let now = wall_ms();
    let tenants = ["acme", "globex", "initech"];
    produce(&producer, &topic, "k", &encode(&event("acme", now, "/a"))).await;
    let forged = event("forger", now + 3_600_000, "/a");
    produce(&producer, &topic, "k", &encode(&forged)).await;
    for (i, tenant) in tenants.iter().enumerate() {
        for j in 0..10 {
            let e = event(tenant, now + (i * 10 + j) as u64, "/a");
            produce(&producer, &topic, "k", &encode(&e)).await;
        }
    }
    let far_past = event("acme", now - 3_600_000, "/a");
    produce(&producer, &topic, "k", &encode(&far_past)).await;
    wait_handled(&pulse, 33).await;

    let metrics = pulse.metrics();
    assert_eq!(rejected(metrics, "from_future"), 1);
    assert_eq!(rejected(metrics, "too_old"), 1);
    assert_eq!(metrics.consumed.get(), 31);
    let app = pulse.router();
    for (tenant, count) in [("acme", 11), ("globex", 10), ("initech", 10)] {
        let (status, body) = get(&app, &format!("/api/heatmap?tenant={tenant}&window=60s")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["keys"][0]["count"], count, "{tenant}: {body}");
    }
    let (_, body) = get(&app, "/api/tenants").await;
    let names: Vec<&str> = body["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, tenants);
    let watermark = body["now_ms"].as_u64().unwrap();
    assert!(
        watermark <= wall_ms() + HeatConfig::default().max_clock_skew_ms,
        "watermark {watermark} ahead of the clock"
    );
    pulse.shutdown().await;
}

/// Row "tenant flood": more tenants than the memory budget holds. The ones past it are
/// rejected `memory_budget`; once the flood is a window old, a new tenant is served
/// (the flood evicted, its summaries kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flood_that_went_quiet_leaves_room_for_a_new_tenant() {
    let kafka = TestKafka::start();
    // Small sketches and the smallest budget they allow: a few dozen shared tenants.
    let heat = HeatConfig {
        error: 0.05,
        shared_error: 0.005,
        ..HeatConfig::default()
    };
    let heat = HeatConfig {
        memory_budget_bytes: (heat.shared_bytes() + heat.own_tenant_bytes()) as u64,
        ..heat
    };
    let config = PulseConfig {
        heat,
        ..PulseConfig::default()
    };
    let (topic, pulse) = pulse_on(&kafka, "hostile-flood", config).await;
    let producer = kafka.producer();
    let now = wall_ms();
    let flood = 400;
    for i in 0..flood {
        let e = event(&format!("flood-{i}"), now - 70_000, "/a");
        produce(&producer, &topic, "k", &encode(&e)).await;
    }
    wait_handled(&pulse, flood).await;
    let metrics = pulse.metrics();
    let refused = rejected(metrics, "memory_budget");
    assert!(refused > 0, "the flood never reached the budget");
    let held = metrics.consumed.get();

    // The flood is 70 s old in event time when the newcomer's event arrives.
    produce(
        &producer,
        &topic,
        "k",
        &encode(&event("newcomer", now, "/new")),
    )
    .await;
    wait_handled(&pulse, flood + 1).await;
    assert_eq!(rejected(metrics, "memory_budget"), refused);
    let app = pulse.router();
    let (status, body) = get(&app, "/api/heatmap?tenant=newcomer&window=60s").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["keys"][0]["count"], 1, "{body}");
    let (_, body) = get(&app, "/api/tenants").await;
    assert_eq!(body["tenants"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["evicted"].as_array().unwrap().len() as u64, held);
    assert_eq!(metrics.tenants_evicted.get(), held);
    let (status, _) = get(&app, "/api/heatmap?tenant=flood-0").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    pulse.shutdown().await;
}

/// Rows "oversized and malformed messages", "events with unknown fields" and the
/// allow-list: bad messages are counted by reason and skipped; unknown fields are
/// ignored and the event applied; a tenant off the allow-list is `unknown_tenant`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_counted_and_unknown_fields_ignored() {
    let kafka = TestKafka::start();
    let config = PulseConfig {
        tenants: vec!["acme".into()],
        ..PulseConfig::default()
    };
    let (topic, pulse) = pulse_on(&kafka, "hostile-bad", config).await;
    let producer = kafka.producer();
    let now = wall_ms();
    let good = String::from_utf8(encode(&event("acme", now, "/a"))).unwrap();
    let with_unknown = good.replacen('{', r#"{"x-debug":{"nested":[1,2]},"#, 1);
    let oversized = good.replacen("\"/a\"", &format!("\"/{}\"", "a".repeat(5_000)), 1);
    let stranger = encode(&event("mallory", now, "/a"));
    let messages: [&[u8]; 6] = [
        good.as_bytes(),
        with_unknown.as_bytes(),
        oversized.as_bytes(),
        b"{not json",
        b"\xff\xfe binary",
        &stranger,
    ];
    for m in messages {
        produce(&producer, &topic, "k", m).await;
    }
    wait_handled(&pulse, 6).await;
    let metrics = pulse.metrics();
    assert_eq!(metrics.consumed.get(), 2, "{}", metrics.encode());
    assert_eq!(rejected(metrics, "too_large"), 1);
    assert_eq!(rejected(metrics, "malformed"), 2);
    assert_eq!(rejected(metrics, "unknown_tenant"), 1);
    let (_, body) = get(&pulse.router(), "/api/heatmap?tenant=acme&window=60s").await;
    assert_eq!(body["keys"][0]["count"], 2, "{body}");
    pulse.shutdown().await;
}

/// Row "a producer replaying the same batch": events carry no id, so pulse cannot
/// tell a replay from new traffic. The batch is counted again: the key's counts double
/// for the window the replay falls in, and nothing else changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_batch_is_counted_again() {
    let kafka = TestKafka::start();
    let (topic, pulse) = pulse_on(&kafka, "hostile-replay", PulseConfig::default()).await;
    let producer = kafka.producer();
    let now = wall_ms();
    let batch: Vec<AccessEvent> = (0..20)
        .map(|i| event("acme", now + i, &format!("/k/{}", i % 4)))
        .collect();
    for _ in 0..2 {
        for e in &batch {
            produce(&producer, &topic, "k", &encode(e)).await;
        }
    }
    wait_handled(&pulse, 40).await;
    assert_eq!(pulse.metrics().consumed.get(), 40);
    let (_, body) = get(&pulse.router(), "/api/heatmap?tenant=acme&window=60s&n=10").await;
    let keys = body["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 4, "{body}");
    assert!(keys.iter().all(|k| k["count"] == 10), "{body}");
    pulse.shutdown().await;
}
