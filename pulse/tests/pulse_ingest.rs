//! Pulse end to end over Kafka, started as it ships (`pulse::start`): events produced
//! to a topic are consumed into the heat map, read back through the dashboard API,
//! checkpointed, and their offsets committed; malformed messages are counted and
//! skipped; a restarted pulse comes back with the heat map from its checkpoint.

use std::time::Duration;

use axum::http::StatusCode;
use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use pulse::PulseConfig;
use pulse::testing::{TestKafka, committed_offsets, get_json as get, produce};

const T0: u64 = 1_764_470_000_000;
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

fn event(i: u64, key: &str, outcome: Outcome) -> AccessEvent {
    AccessEvent::new(
        T0 + i * 3,
        TenantId::new("acme").unwrap(),
        CacheKey::new(key).unwrap(),
        RegionId::new(REGIONS[i as usize % 3]).unwrap(),
        NodeId::new(format!("edge-{}", i % 2)).unwrap(),
        outcome,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_heat_map_api_and_offsets_follow_the_checkpoint() {
    let kafka = TestKafka::start();
    let topic = kafka.unique_topic("pulse-events");
    kafka.create_topic(&topic, 3).await;

    let mut sent = Vec::new();
    for i in 0..60 {
        sent.push(event(i, "/live/score.json", Outcome::Miss));
    }
    for i in 0..10 {
        sent.push(event(i, "/img/logo.png", Outcome::Hit));
    }
    let producer = kafka.producer();
    let bad: [&[u8]; 2] = [
        b"{not json",
        br#"{"v":1,"ts_ms":1,"tenant":"acme","key":"http://evil/x","region":"r","node":"n","outcome":"hit"}"#,
    ];
    for (i, e) in sent.iter().enumerate() {
        let key = e.partition_key();
        if i < 60 && i % 30 == 5 {
            produce(&producer, &topic, &key, bad[i / 30]).await;
        }
        produce(&producer, &topic, &key, &encode(e)).await;
    }
    let total_messages = (sent.len() + bad.len()) as i64;

    let checkpoint = std::env::temp_dir().join(format!("{topic}.ckpt"));
    let group = format!("{topic}-pulse");
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: group.clone(),
        topic: topic.clone(),
        checkpoint: Some(checkpoint.clone()),
        checkpoint_interval_secs: 1,
        listen: "127.0.0.1:0".parse().unwrap(),
        // The heat map and its API only: no commands on the shared broker.
        prewarm: false,
        ..PulseConfig::default()
    };
    let pulse = pulse::start(config.clone()).await.expect("starting pulse");
    let metrics = pulse.metrics().clone();
    let partitions = pulse.partitions().clone();

    let rejected = |reason: &'static str| {
        metrics
            .rejected
            .get_or_create(&pulse::ReasonLabel { reason })
            .get()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metrics.consumed.get() < sent.len() as u64
        || rejected("malformed") + rejected("invalid_field") < 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled: {} consumed, metrics:\n{}",
            metrics.consumed.get(),
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metrics.consumed.get(), 70);
    assert_eq!(rejected("malformed"), 1);
    assert_eq!(rejected("invalid_field"), 1);

    // The heat map, read back through the API.
    let app = pulse.router();
    let (status, body) = get(&app, "/api/heatmap?tenant=acme&window=60s").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let keys = body["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{body}");
    assert_eq!(keys[0]["key"], "/live/score.json");
    assert_eq!(keys[0]["count"], 60);
    assert_eq!(keys[0]["misses"], 60);
    assert_eq!(keys[0]["regions"].as_array().unwrap().len(), 3, "{body}");
    assert_eq!(keys[1]["key"], "/img/logo.png");
    assert_eq!(keys[1]["count"], 10);

    let (status, stats) = get(&app, "/api/keys/acme/live/score.json").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["windows"][3]["counts"]["miss"], 60);
    assert_eq!(stats["windows"][0]["window"], "200ms");
    let mut miss_regions: Vec<String> = stats["windows"][0]["miss_regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    miss_regions.sort();
    assert_eq!(miss_regions, ["ap-south", "eu-west", "us-east"]);

    let (_, text) = get(&app, "/metrics").await;
    let text = text.as_str().unwrap();
    assert!(text.contains("pulse_events_consumed_total 70"), "{text}");
    assert!(
        text.contains("pulse_events_rejected_total{reason=\"malformed\"} 1"),
        "{text}"
    );

    // Shutdown writes a final checkpoint (each partition with its offset), then
    // commits every consumed offset.
    pulse.shutdown().await;
    let restored = pulse::load_checkpoint(&checkpoint)
        .unwrap()
        .expect("a checkpoint");
    let now = {
        let live = partitions.read().unwrap();
        assert_eq!(
            (restored.partition_count, restored.partitions.len()),
            (3, 3)
        );
        for snapshot in &restored.partitions {
            let state = live.get(snapshot.partition).expect("an owned partition");
            assert_eq!(snapshot.next_offset, state.next_offset);
            assert_eq!(snapshot.heat.now_ms(), state.heat.now_ms());
            assert_eq!(snapshot.heat.tenants(), state.heat.tenants());
        }
        live.now_ms()
    };
    let at_now = format!("/api/heatmap?tenant=acme&window=60s&now_ms={now}");
    let (_, before) = get(&app, &at_now).await;

    let committed = committed_offsets(&kafka.config(), &group, &topic, 3, Duration::from_secs(10))
        .expect("reading committed offsets");
    let sum: i64 = committed.iter().map(|o| o.unwrap_or(0)).sum();
    assert_eq!(sum, total_messages, "committed: {committed:?}");

    // A restarted pulse starts from that checkpoint: every offset is committed, so it
    // consumes nothing, yet as its partitions are assigned its API shows what the
    // first one counted.
    let restarted = pulse::start(config).await.expect("restarting pulse");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !restarted.partitions().read().unwrap().complete() {
        assert!(tokio::time::Instant::now() < deadline, "never assigned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, after) = get(&restarted.router(), &at_now).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(after["keys"], before["keys"]);
    assert_eq!(after["keys"][0]["count"], 60, "{after}");
    assert_eq!(restarted.metrics().consumed.get(), 0);
    restarted.shutdown().await;
    let _ = std::fs::remove_file(&checkpoint);
}

/// `pulse train` and `pulse backtest` read `kafka://HOST:PORT/TOPIC`: every partition
/// from its beginning to its end as it is, each partition's events in the order they
/// were delivered (`load_events` sorts them by time unless a replay takes them as
/// delivered), bad messages counted and skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_topic_reads_every_partition_to_its_end_as_delivered() {
    let kafka = TestKafka::start();
    let topic = kafka.unique_topic("pulse-read");
    kafka.create_topic(&topic, 3).await;
    // Keys spread the events over the partitions, times out of order.
    let sent: Vec<AccessEvent> = (0..45)
        .map(|i| event((i * 17) % 45, &format!("/k/{}", i % 9), Outcome::Miss))
        .collect();
    let producer = kafka.producer();
    for e in &sent {
        produce(&producer, &topic, &e.partition_key(), &encode(e)).await;
    }
    produce(&producer, &topic, "bad", b"{not json").await;
    produce(&producer, &topic, "bad", br#"{"v":9}"#).await;

    let servers = kafka.bootstrap_servers().to_owned();
    let read_topic = topic.clone();
    let read = tokio::task::spawn_blocking(move || {
        pulse::read_topic(
            &pulse::KafkaClients::new(&servers),
            &read_topic,
            Duration::from_secs(10),
        )
    })
    .await
    .unwrap()
    .expect("reading the topic");
    // Every event once (their times are distinct)...
    let mut expected = sent.clone();
    expected.sort_by_key(|e| e.ts_ms);
    let mut by_time = read.events.clone();
    by_time.sort_by_key(|e| e.ts_ms);
    assert_eq!(by_time, expected);
    // ...and a key's events, on one partition, in the order they were produced.
    let keys: std::collections::BTreeSet<_> = sent.iter().map(|e| &e.key).collect();
    for key in keys {
        let produced: Vec<_> = sent.iter().filter(|e| &e.key == key).collect();
        let polled: Vec<_> = read.events.iter().filter(|e| &e.key == key).collect();
        assert_eq!(polled, produced, "{key}");
    }
    assert_eq!(
        read.rejected.into_iter().collect::<Vec<_>>(),
        [("invalid_field", 1), ("malformed", 1)]
    );

    let servers = kafka.bootstrap_servers().to_owned();
    let missing = format!("{topic}-missing");
    let result = tokio::task::spawn_blocking(move || {
        pulse::read_topic(
            &pulse::KafkaClients::new(&servers),
            &missing,
            Duration::from_secs(5),
        )
    })
    .await
    .unwrap();
    assert!(result.is_err(), "a topic that does not exist is an error");
}
