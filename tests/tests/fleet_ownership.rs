//! Pulse's answers whatever partitioner the producers use (issue #28): three `pulse
//! serve` processes in one group on the real broker, with no `--peers` (each
//! advertises its URL, `--advertise-url`, and finds the others by describing the
//! group), fed at once by librdkafka's
//! default partitioner (`consistent_random`, CRC-32), librdkafka's `murmur2_random`
//! and Kafka's own Java console producer (`scripts/kafka console-producer`, its
//! default partitioner, murmur2), all keying events by `tenant/key`, so most keys
//! have their events on two or three partitions.
//!
//! The scenario, on a 4-partition topic: A and B start; the three producers send
//! their first events together, and while they do B is SIGKILLed and C joins; B comes
//! back; the topic grows to 6 partitions (AdminClient `create_partitions`) and the
//! three producers (new ones, which see the new count) send more; the fleet settles
//! (each partition owned once, at its high watermark, not replaying); A leaves with
//! SIGTERM, and while its partitions move B's and C's answers are polled; the fleet
//! settles again.
//!
//! With the three up on the grown topic, each names the other two as its peers
//! (`/healthz`). Then it checks, on B and C:
//! - each names the other, and only the other, as its peer (`/healthz`);
//! - `pulse_partitioner{name="none"}` is 1: no partitioner placed every message;
//! - every key's `/api/keys/{tenant}/{key}` at a fixed `now_ms` counts at least the
//!   events produced for it and at most the answer's stated bound above
//!   (`ownership.error_bound_events_60s`), says it asked every partition, and is
//!   complete;
//! - the merged heat map has one row per key, each at most the truth plus its stated
//!   bound (`split_error_bound_events`);
//! - B and C give identical answers (but for `coverage`, which names who was asked);
//! - every `/api/tenants` answer polled while A's partitions moved that says
//!   `complete: true` counts exactly the events produced: a partition that is still
//!   replaying keeps the answer incomplete.
//!
//! Needs a real broker (`KAFKA_BOOTSTRAP_SERVERS`, `scripts/kafka start`) and Java
//! (the console producer); it fails, loudly, without them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::FutureProducer;
use serde_json::Value;
use tests::fleet::{
    FleetProbe, ProcessEnv, PulseProcess, grow_topic, high_watermarks, pulse_bin, strip,
};
use tests::{TestKafka, free_port, produce_events, wall_ms};

/// Partitions at the start, and after the topic grows.
const PARTITIONS: i32 = 4;
const GROWN: i32 = 6;
const TENANTS: [&str; 2] = ["acme", "globex"];
/// Keys per tenant.
const KEYS: u64 = 40;
/// Events per producer before and after the topic grows.
const FIRST: usize = 1_500;
const SECOND: usize = 900;

/// `n` seeded events, all stamped in `[first_ms, first_ms + 30 s)`.
fn events(seed: u64, n: usize, first_ms: u64) -> Vec<AccessEvent> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
            // Skewed: low keys are hot.
            let key = (rng.random_range(0..KEYS) * rng.random_range(0..KEYS)) / KEYS;
            AccessEvent::new(
                first_ms + (i as u64 * 30_000) / n as u64,
                TenantId::new(tenant).unwrap(),
                CacheKey::new(format!("/k/{key}")).unwrap(),
                RegionId::new(["eu-west", "us-east", "ap-south"][i % 3]).unwrap(),
                NodeId::new(format!("edge-{}", i % 4)).unwrap(),
                if rng.random_bool(0.3) {
                    Outcome::Miss
                } else {
                    Outcome::Hit
                },
            )
        })
        .collect()
}

/// A librdkafka producer with `partitioner` (None: librdkafka's default).
fn producer(kafka: &TestKafka, partitioner: Option<&str>) -> FutureProducer {
    let mut config = kafka.config();
    config.set("acks", "all").set("linger.ms", "5");
    if let Some(p) = partitioner {
        config.set("partitioner", p);
    }
    config.create().expect("creating a producer")
}

/// Sends `events` in ten slices 300 ms apart, so the fleet changes while they arrive.
async fn produce_slowly(producer: FutureProducer, topic: String, events: Vec<AccessEvent>) {
    for slice in events.chunks(events.len().div_ceil(10)) {
        produce_events(&producer, &topic, slice).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Sends `events` through Kafka's Java console producer (keyed `tenant/key`, a tab
/// between key and payload), in ten slices 300 ms apart; returns when it has exited
/// (it flushes everything first).
fn produce_with_java(bootstrap: &str, topic: &str, events: &[AccessEvent]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka");
    let mut child = Command::new(&script)
        .args(["console-producer", "--bootstrap-server"])
        .arg(bootstrap)
        .args(["--topic", topic, "--property", "parse.key=true"])
        .args(["--property", "key.separator=\t"])
        .args(["--producer-property", "acks=all"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e} (needs Java)", script.display()));
    let mut stdin = child.stdin.take().unwrap();
    for slice in events.chunks(events.len().div_ceil(10)) {
        let mut lines = Vec::new();
        for e in slice {
            lines.extend_from_slice(e.partition_key().as_bytes());
            lines.push(b'\t');
            lines.extend_from_slice(&encode(e));
            lines.push(b'\n');
        }
        stdin.write_all(&lines).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "the console producer failed: {status}");
}

/// Each producer's events, produced at once: librdkafka's default, its
/// `murmur2_random`, and the Java console producer (on a thread of its own).
async fn produce_all(kafka: &TestKafka, topic: &str, batches: [Vec<AccessEvent>; 3]) {
    let [crc, murmur, java] = batches;
    let default = tokio::spawn(produce_slowly(producer(kafka, None), topic.to_owned(), crc));
    let murmur = tokio::spawn(produce_slowly(
        producer(kafka, Some("murmur2_random")),
        topic.to_owned(),
        murmur,
    ));
    let (bootstrap, topic) = (kafka.bootstrap_servers().to_owned(), topic.to_owned());
    let java = tokio::task::spawn_blocking(move || produce_with_java(&bootstrap, &topic, &java));
    default.await.unwrap();
    murmur.await.unwrap();
    java.await.unwrap();
}

/// The value of the Prometheus sample `name` in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_are_right_whatever_the_producers_partitioner() {
    let kafka = TestKafka::start();
    assert!(
        kafka.is_real(),
        "this test runs pulse as separate processes and needs a real broker: set \
         KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 (scripts/kafka start)"
    );
    let topic = kafka.unique_topic("pulse-ownership");
    kafka.create_topic(&topic, PARTITIONS).await;
    let dir = tempfile::Builder::new()
        .prefix("pulse-ownership")
        .tempdir()
        .unwrap();
    eprintln!(
        "pulse binary: {}; logs in {}",
        pulse_bin().display(),
        dir.path().display()
    );
    let env = ProcessEnv {
        dir: dir.path().to_owned(),
        vars: Vec::new(),
    };
    let ports = [free_port(), free_port(), free_port()];
    let url = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let group = format!("{topic}-fleet");
    // No `--peers`: each finds the others in the group's description.
    let start = |name: &'static str, me: usize| {
        let args = [
            "--brokers",
            kafka.bootstrap_servers(),
            "--topic",
            &topic,
            "--group",
            &group,
            "--commit-interval-secs",
            "1",
            "--no-prewarm",
            "--advertise-url",
            &url(me),
        ]
        .map(str::to_owned)
        .to_vec();
        PulseProcess::start(name, ports[me], args, &env)
    };

    // Event times: a minute's window that ends before the wall clock, holding them all.
    let first_ms = wall_ms() / 1_000 * 1_000 - 40_000;
    let now_ms = first_ms + 59_999;
    let first: [Vec<AccessEvent>; 3] = [1, 2, 3].map(|s| events(s, FIRST, first_ms));
    let second: [Vec<AccessEvent>; 3] = [4, 5, 6].map(|s| events(s, SECOND, first_ms));
    let mut truth: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut per_tenant: BTreeMap<String, u64> = BTreeMap::new();
    for e in first.iter().chain(&second).flatten() {
        *truth
            .entry((e.tenant.to_string(), e.key.to_string()))
            .or_default() += 1;
        *per_tenant.entry(e.tenant.to_string()).or_default() += 1;
    }

    let probe = FleetProbe::new(PARTITIONS);
    let mut a = start("A", 0);
    let mut b = start("B", 1);
    probe.wait_healthy(&mut a).await;
    probe.wait_healthy(&mut b).await;

    // 1. Three producers at once; B is SIGKILLed while they send, C joins.
    let producing = produce_all(&kafka, &topic, first);
    let changes = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        b.sigkill();
        start("C", 2)
    };
    let ((), mut c) = tokio::join!(producing, changes);
    probe.wait_healthy(&mut c).await;
    b.restart();
    probe.wait_healthy(&mut b).await;

    // 2. The topic grows; new producers see the new count.
    grow_topic(&kafka, &topic, GROWN as usize).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    produce_all(&kafka, &topic, second).await;
    let hwm = high_watermarks(&kafka, &topic, GROWN);
    assert_eq!(
        hwm.iter().sum::<i64>() as u64,
        per_tenant.values().sum::<u64>(),
        "every event is on the topic"
    );
    let probe = FleetProbe::new(GROWN);
    let since = Instant::now();
    let took = probe
        .settle(&mut [&mut a, &mut b, &mut c], &[], &hwm, since, "grown")
        .await;
    eprintln!("settled on {GROWN} partitions in {took:?}");
    // Three instances, no `--peers`: each finds the other two in the group (discovery
    // describes the group every 2 s, so a member that just came back may lag a beat).
    for (process, others) in [(&a, [&b, &c]), (&b, [&a, &c]), (&c, [&a, &b])] {
        let mut expected: Vec<String> = others
            .iter()
            .map(|o| format!("http://{}", o.addr()))
            .collect();
        expected.sort();
        let deadline = Instant::now() + Duration::from_secs(15);
        let found = loop {
            let (_, health) = probe.get(process.addr(), "/healthz").await.unwrap();
            let mut found: Vec<String> = health["peers"]
                .as_array()
                .map(|peers| {
                    peers
                        .iter()
                        .filter_map(|p| p.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            if found == expected || Instant::now() > deadline {
                break found;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert_eq!(
            found, expected,
            "{}: found the other two in the group",
            process.name
        );
    }

    // 3. A leaves; while its partitions move, a whole answer is a right one.
    let left = a.sigterm();
    assert!(left.success(), "A: {left}");
    let down = [url(0)];
    let polled_since = Instant::now();
    let mut whole_answers = 0;
    let mut partial_answers = 0;
    while polled_since.elapsed() < Duration::from_secs(8) {
        for process in [&b, &c] {
            let Ok((200, body)) = probe.get(process.addr(), "/api/tenants").await else {
                continue;
            };
            if body["coverage"]["complete"] != true {
                partial_answers += 1;
                continue;
            }
            whole_answers += 1;
            let counted: BTreeMap<String, u64> = body["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t["tenant"].as_str().unwrap().to_owned(),
                        t["events"].as_u64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                counted, per_tenant,
                "{}: an answer said complete with other counts: {}",
                process.name, body["coverage"]
            );
        }
    }
    eprintln!("while A left: {whole_answers} whole answers, {partial_answers} partial");
    let took = probe
        .settle(&mut [&mut b, &mut c], &down, &hwm, Instant::now(), "A left")
        .await;
    eprintln!("settled without A in {took:?}");

    // 4. The answers, from B and from C.
    for process in [&b, &c] {
        let (status, Value::String(metrics)) = probe.get(process.addr(), "/metrics").await.unwrap()
        else {
            panic!("{}: /metrics is not text", process.name);
        };
        assert_eq!(status, 200);
        assert_eq!(
            sample(&metrics, "pulse_partitioner{name=\"none\"}"),
            Some(1.0),
            "{}: no partitioner places every message",
            process.name
        );
    }
    for (process, other) in [(&b, &c), (&c, &b)] {
        let (_, health) = probe.get(process.addr(), "/healthz").await.unwrap();
        let other = format!("http://{}", other.addr());
        assert_eq!(
            health["peers"],
            serde_json::json!([other]),
            "{}: found its peers in the group",
            process.name
        );
    }
    let mut checked = 0;
    for ((tenant, key), &count) in &truth {
        let route = format!("/api/keys/{tenant}{key}?now_ms={now_ms}");
        let (status, from_b) = probe.get(b.addr(), &route).await.unwrap();
        assert_eq!(status, 200, "B {route}: {from_b}");
        let counted = from_b["windows"][3]["total"].as_u64().unwrap();
        let bound = from_b["ownership"]["error_bound_events_60s"]
            .as_u64()
            .unwrap();
        assert!(
            count <= counted && counted <= count + bound,
            "B {route}: counts {counted} of {count} produced (bound {bound})"
        );
        assert_eq!(from_b["ownership"]["partitioner"], Value::Null, "{from_b}");
        assert_eq!(
            from_b["ownership"]["partitions"],
            serde_json::json!((0..GROWN).collect::<Vec<_>>())
        );
        assert_eq!(from_b["coverage"]["complete"], true, "B {route}: {from_b}");
        let (_, from_c) = probe.get(c.addr(), &route).await.unwrap();
        assert_eq!(strip(&from_c), strip(&from_b), "{route}: B and C differ");
        checked += 1;
    }
    for tenant in TENANTS {
        let route = format!("/api/heatmap?tenant={tenant}&window=60s&n=1000&now_ms={now_ms}");
        let (status, from_b) = probe.get(b.addr(), &route).await.unwrap();
        assert_eq!(status, 200, "B {route}: {from_b}");
        let bound = from_b["split_error_bound_events"].as_u64().unwrap();
        let mut seen = BTreeMap::new();
        for row in from_b["keys"].as_array().unwrap() {
            let key = row["key"].as_str().unwrap().to_owned();
            let count = row["count"].as_u64().unwrap();
            let produced = truth[&(tenant.to_owned(), key.clone())];
            assert!(
                count <= produced + bound,
                "{tenant}{key}: a row of {count}, {produced} produced (bound {bound})"
            );
            assert!(
                seen.insert(key.clone(), count).is_none(),
                "{tenant}{key}: two rows in the heat map"
            );
        }
        let (_, from_c) = probe.get(c.addr(), &route).await.unwrap();
        assert_eq!(strip(&from_c), strip(&from_b), "{route}: B and C differ");
    }
    eprintln!("{checked} keys checked on B and C");
    for mut process in [b, c] {
        let stopped = process.sigterm();
        assert!(stopped.success(), "{}: {stopped}", process.name);
    }
}
