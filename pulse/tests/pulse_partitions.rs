//! Pulse's state per partition on the real broker: two pulses (`pulse::start`, in
//! this process) in one consumer group on an 8-partition topic. When the second joins,
//! the cooperative rebalance moves only some partitions: those that stay are not
//! rewound, those that move are committed on revoke and rebuilt by their new owner by
//! replay (same heat map at a fixed `now_ms`, and no command sent while replaying).
//! When one leaves, the other takes everything. Across both, every event is counted
//! once. And the partitioner pulse uses to find a key's owner is the producers'.
//!
//! Needs a broker: `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092` (else the embedded one,
//! which has no `offsets_for_times`: there the moved-partition checks would fail).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
use pulse::testing::get_json as get;
use pulse::testing::{TestKafka, produce_events};
use pulse::{PulseConfig, PulseHandle, TraceSpec, generate_trace, partition_for_key};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureRecord;
use serde_json::Value;

const PARTITIONS: i32 = 8;

/// librdkafka's default partitioner, as producers use it, puts each keyed message
/// where [`partition_for_key`] says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_messages_land_where_the_partitioner_says() {
    let kafka = TestKafka::start();
    assert!(kafka.is_real(), "this test needs KAFKA_BOOTSTRAP_SERVERS");
    let topic = kafka.unique_topic("pulse-partitioner");
    kafka.create_topic(&topic, PARTITIONS).await;
    let producer = kafka.producer();
    let keys: Vec<String> = (0..300)
        .map(|i| format!("tenant-{}/img/{i}/{}.png", i % 7, i * 31))
        .collect();
    let sends = keys.iter().map(|key| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            let delivery = producer
                .send(
                    FutureRecord::to(&topic).key(key).payload("x"),
                    Duration::from_secs(30),
                )
                .await
                .unwrap_or_else(|(e, _)| panic!("producing {key}: {e}"));
            (key, delivery.partition)
        }
    });
    let mut used = BTreeSet::new();
    for (key, partition) in join_all(sends).await {
        assert_eq!(
            partition,
            partition_for_key(key.as_bytes(), PARTITIONS),
            "{key}"
        );
        used.insert(partition);
    }
    assert_eq!(used.len(), PARTITIONS as usize, "every partition got keys");
}

fn high_watermarks(consumer: &StreamConsumer, topic: &str) -> BTreeMap<i32, i64> {
    (0..PARTITIONS)
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("reading the watermarks");
            (p, high)
        })
        .collect()
}

/// One partition's counters, as a pulse holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counters {
    next_offset: i64,
    live_from: i64,
    replay_from: i64,
    applied: u64,
    replayed: u64,
    sent: u64,
    decisions: usize,
}

fn counters(pulse: &PulseHandle) -> BTreeMap<i32, Counters> {
    let partitions = pulse.partitions().read().unwrap();
    partitions
        .states()
        .iter()
        .map(|(&p, s)| {
            let (sent, decisions) = s.predictor.as_ref().map_or((0, 0), |pr| {
                let pr = pr.lock().unwrap();
                (pr.counts().sent, pr.decisions().count())
            });
            (
                p,
                Counters {
                    next_offset: s.next_offset,
                    live_from: s.live_from,
                    replay_from: s.replay_from,
                    applied: s.applied,
                    replayed: s.replayed,
                    sent,
                    decisions,
                },
            )
        })
        .collect()
}

/// Waits until `pulses` own every partition between them, once each, each caught up
/// with `high` and none replaying.
async fn settled(pulses: &[&PulseHandle], high: &BTreeMap<i32, i64>, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let owned: Vec<BTreeMap<i32, Counters>> = pulses.iter().map(|p| counters(p)).collect();
        let mut all: Vec<i32> = owned.iter().flat_map(|o| o.keys().copied()).collect();
        all.sort_unstable();
        let caught_up = owned
            .iter()
            .flatten()
            .all(|(p, c)| c.next_offset >= high[p] && c.next_offset >= c.live_from);
        if all == (0..PARTITIONS).collect::<Vec<_>>()
            && caught_up
            && owned.iter().all(|o| !o.is_empty())
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not settled: {owned:?}, high watermarks {high:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each tenant's events, added over `pulses`' `/api/tenants`.
async fn tenant_events(pulses: &[&PulseHandle]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for pulse in pulses {
        let (_, body) = get(&pulse.router(), "/api/tenants?scope=local").await;
        for t in body["tenants"].as_array().unwrap() {
            *out.entry(t["tenant"].as_str().unwrap().to_owned())
                .or_default() += t["events"].as_u64().unwrap();
        }
    }
    out
}

/// Every tenant's hot keys over 60 s at `now_ms`, from `pulses`, merged by hand (keys
/// live in one partition, so the union is exact), hottest first.
async fn hot_keys(pulses: &[&PulseHandle], tenants: &[String], now_ms: u64) -> Vec<Value> {
    let mut rows = Vec::new();
    for tenant in tenants {
        let mut keys = Vec::new();
        for pulse in pulses {
            let uri = format!("/api/heatmap?tenant={tenant}&window=60s&n=1000&now_ms={now_ms}");
            let (status, body) = get(&pulse.router(), &uri).await;
            assert!(status.is_success() || status == 404, "{uri}: {body}");
            keys.extend(body["keys"].as_array().cloned().unwrap_or_default());
        }
        keys.sort_by(|a, b| {
            b["count"]
                .as_u64()
                .cmp(&a["count"].as_u64())
                .then_with(|| a["key"].as_str().cmp(&b["key"].as_str()))
        });
        rows.push(Value::from(tenant.clone()));
        rows.extend(keys);
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_and_a_leave_lose_nothing_and_apply_nothing_twice() {
    let kafka = TestKafka::start();
    assert!(kafka.is_real(), "this test needs KAFKA_BOOTSTRAP_SERVERS");
    let topic = kafka.unique_topic("pulse-partitions");
    let prewarm_topic = kafka.unique_topic("pulse-partitions-commands");
    kafka.create_topic(&topic, PARTITIONS).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let started = std::time::Instant::now();

    // Viral keys spread over the partitions: the first pulse sends commands for them,
    // so a partition that moves is one whose events would give commands if scored.
    let trace = generate_trace(&TraceSpec {
        duration_ms: 40_000,
        background_rps: 40.0,
        virals: 12,
        noise: 0,
        crons: 0,
        flash_crowds: 0,
        ..TraceSpec::default()
    });
    let producer = kafka.producer();
    produce_events(&producer, &topic, &trace.events).await;
    let mut produced: BTreeMap<String, u64> = BTreeMap::new();
    for e in &trace.events {
        *produced.entry(e.tenant.to_string()).or_default() += 1;
    }
    let tenants: Vec<String> = produced.keys().cloned().collect();

    let offsets = kafka.consumer(&format!("{topic}-watch"));
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: topic.clone(),
        group: format!("{topic}-pulse"),
        prewarm_topic: prewarm_topic.clone(),
        commit_interval_secs: 1,
        retrain_interval_secs: 0,
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    };
    let a = pulse::start(config.clone())
        .await
        .expect("starting pulse a");
    let high = high_watermarks(&offsets, &topic);
    settled(&[&a], &high, "a alone").await;
    let before = counters(&a);
    assert!(
        a.metrics().prewarm_sent.get() > 0,
        "a sent commands for the virals"
    );
    for c in before.values() {
        assert_eq!(
            (c.replay_from, c.replayed),
            (0, 0),
            "nothing committed yet: {c:?}"
        );
    }
    let now_ms = a.partitions().read().unwrap().now_ms();
    let heat_before = hot_keys(&[&a], &tenants, now_ms).await;
    assert_eq!(tenant_events(&[&a]).await, produced);

    // B joins: some partitions move, the others stay with a, untouched.
    let b = pulse::start(config.clone())
        .await
        .expect("starting pulse b");
    settled(&[&a, &b], &high, "a and b").await;
    let (after_a, after_b) = (counters(&a), counters(&b));
    for (p, c) in &after_a {
        assert_eq!(
            c, &before[p],
            "partition {p} stayed with a and was not rewound"
        );
        assert_eq!(
            c.applied, high[p] as u64,
            "partition {p}: every offset applied once"
        );
    }
    let mut moved_commands = 0;
    for (p, c) in &after_b {
        // a committed what it had applied on revoke: b goes live from there, after
        // replaying the whole partition (every event is inside the replay window).
        assert_eq!(c.live_from, high[p], "partition {p}: committed on revoke");
        assert_eq!(
            c.replay_from, 0,
            "partition {p}: replayed from the window start ({c:?}, high {})",
            high[p]
        );
        assert_eq!(
            (c.replayed, c.applied),
            (high[p] as u64, 0),
            "partition {p}"
        );
        assert_eq!(
            (c.sent, c.decisions),
            (0, 0),
            "partition {p}: no command in replay"
        );
        moved_commands += before[p].sent;
    }
    assert_eq!(b.metrics().prewarm_sent.get(), 0, "b sent nothing");
    assert!(
        a.metrics().revoke_commits.get() > 0,
        "a committed on revoke"
    );
    assert!(
        moved_commands > 0,
        "the moved partitions had commands at a (else the check above proves little): {before:?}"
    );
    assert_eq!(
        tenant_events(&[&a, &b]).await,
        produced,
        "nothing lost, nothing twice"
    );
    assert_eq!(
        hot_keys(&[&a, &b], &tenants, now_ms).await,
        heat_before,
        "the moved partitions' windows were rebuilt by replay"
    );

    // Live events after the join reach whichever pulse owns their partition.
    let t0 = trace.events.last().unwrap().ts_ms + 1_000;
    let more: Vec<AccessEvent> = (0..400u64)
        .map(|i| {
            AccessEvent::new(
                t0 + i,
                TenantId::new(tenants[i as usize % tenants.len()].as_str()).unwrap(),
                CacheKey::new(format!("/after-join/{i}")).unwrap(),
                RegionId::new("eu-west").unwrap(),
                NodeId::new("edge-1").unwrap(),
                Outcome::Hit,
            )
        })
        .collect();
    produce_events(&producer, &topic, &more).await;
    for e in &more {
        *produced.get_mut(e.tenant.as_str()).unwrap() += 1;
    }
    let high = high_watermarks(&offsets, &topic);
    settled(&[&a, &b], &high, "after the join").await;
    assert_eq!(tenant_events(&[&a, &b]).await, produced);
    let b_before_leave = counters(&b);
    for (p, c) in &b_before_leave {
        assert_eq!(
            c.replayed, after_b[p].replayed,
            "partition {p}: no replay again"
        );
    }

    // A leaves: b takes every partition; those it had are not rewound.
    a.shutdown().await;
    settled(&[&b], &high, "b alone").await;
    for (p, c) in counters(&b) {
        match b_before_leave.get(&p) {
            Some(kept) => assert_eq!(&c, kept, "partition {p} stayed with b"),
            None => {
                assert_eq!(c.live_from, high[&p], "partition {p}: a committed on leave");
                assert_eq!(
                    c.replayed, high[&p] as u64,
                    "partition {p}: rebuilt by replay"
                );
                assert_eq!(c.sent, 0, "partition {p}");
            }
        }
    }
    assert_eq!(
        b.metrics().prewarm_sent.get(),
        0,
        "b sent nothing in replay"
    );
    assert_eq!(
        tenant_events(&[&b]).await,
        produced,
        "b alone counts everything once"
    );
    let (_, health) = get(&b.router(), "/healthz").await;
    assert_eq!(health["partition_count"], PARTITIONS);
    assert_eq!(
        health["partitions"].as_array().unwrap().len(),
        PARTITIONS as usize
    );
    let (_, tenants_body) = get(&b.router(), "/api/tenants").await;
    assert_eq!(tenants_body["coverage"]["complete"], true, "{tenants_body}");
    println!(
        "join, live events and leave took {:.1} s (the replay window is 65 s)",
        started.elapsed().as_secs_f64()
    );
    b.shutdown().await;
}
