//! A topic that grows under a fleet (issue #56): two pulses (`pulse::start`, in this
//! process) in one group on the real broker, finding each other through
//! `advertise_url`, read a 3-partition topic; while a keyed producer (librdkafka's
//! default partitioner, its metadata refreshed every second) writes, the topic grows
//! to 5 partitions (AdminClient `create_partitions`) and a third pulse joins. At the
//! end the joiner leaves.
//!
//! Each round of the test reads every instance's partitions (owner, offsets,
//! replaying), asks every instance for every key, and reads the partitions again. A
//! round is *quiet* when nothing moved in between and every partition the topic has is
//! owned once, caught up with its high watermark (the producer has finished) and not
//! replaying. It checks:
//! - an answer that says `complete: true` never counts more than the events produced
//!   for the key, and, in a round where every owned partition has consumed what was
//!   produced (or is replaying), exactly those (never complete and wrong), keys whose
//!   old and new partitions are on different instances included;
//! - a quiet round that follows a quiet round (discovery has had its beat to learn
//!   who owns what) has every answer complete: not incomplete and right once every
//!   partition is owned and live; the test waits for two such rounds after the
//!   growth and after the leave;
//! - some key had its partitions on two instances;
//! - the fleet's join, growth and leave logged no WARN or ERROR line (the test's own
//!   subscriber reads every log line of the three pulses and of librdkafka);
//! - something wrong still warns: a fourth pulse joins advertising a URL nobody
//!   listens on, and fleet answers that leave it out warn once it has been silent for
//!   the warning's delay (5 s).
//!
//! Needs a real broker (`KAFKA_BOOTSTRAP_SERVERS`); takes about 20 s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
use pulse::{PulseConfig, PulseHandle, partition_for_key};
use rdkafka::producer::FutureProducer;
use tests::fleet::{FleetProbe, grow_topic, high_watermarks};
use tests::{TestKafka, free_port, produce_events, wall_ms};

const PARTITIONS: i32 = 3;
const GROWN: i32 = 5;
const KEYS: u64 = 30;
/// Events before the growth, and while it happens.
const FIRST: usize = 600;
const SECOND: usize = 900;
/// Longest wait for the fleet to settle after a step (a correctness bound).
const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// `n` events of tenant `acme` over [`KEYS`] keys, stamped in the minute before the
/// test's `now_ms`.
fn events(n: usize, first_ms: u64, offset: usize) -> Vec<AccessEvent> {
    (0..n)
        .map(|i| {
            let j = i + offset;
            AccessEvent::new(
                first_ms + (j as u64 * 17) % 30_000,
                TenantId::new("acme").unwrap(),
                CacheKey::new(format!("/k/{}", (j as u64 * 7_919) % KEYS)).unwrap(),
                RegionId::new(["eu-west", "us-east"][j % 2]).unwrap(),
                NodeId::new("edge-1").unwrap(),
                if j % 3 == 0 {
                    Outcome::Miss
                } else {
                    Outcome::Hit
                },
            )
        })
        .collect()
}

/// Every log line at WARN or above, of every client in this process.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    fn install() -> Self {
        let warnings = Warnings::default();
        let writer = warnings.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .try_init()
            .expect("the test's log subscriber");
        warnings
    }

    fn lines(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// One owned partition as an instance holds it.
#[derive(Debug, Clone, PartialEq)]
struct Owned {
    instance: usize,
    next_offset: i64,
    live_from: i64,
    replaying: bool,
}

/// Every instance's owned partitions, by partition.
fn owners(fleet: &[&PulseHandle]) -> BTreeMap<i32, Vec<Owned>> {
    let mut out: BTreeMap<i32, Vec<Owned>> = BTreeMap::new();
    for (instance, pulse) in fleet.iter().enumerate() {
        let partitions = pulse.partitions().read().unwrap();
        for (&p, s) in partitions.states() {
            out.entry(p).or_default().push(Owned {
                instance,
                next_offset: s.next_offset,
                live_from: s.live_from,
                replaying: s.replaying(),
            });
        }
    }
    out
}

/// Whether every partition of the topic is owned once, caught up with `high` and live.
fn settled(owned: &BTreeMap<i32, Vec<Owned>>, high: &[i64]) -> bool {
    owned.len() == high.len()
        && owned.iter().all(|(&p, o)| {
            matches!(o.as_slice(), [one] if !one.replaying && one.next_offset == high[p as usize])
        })
}

struct Round {
    quiet: bool,
    complete: usize,
    answers: usize,
}

/// One round: every key asked of every instance. An answer that says complete with
/// more than `truth` fails the test; when every owned partition has consumed up to
/// `high` (the producer has finished) or is replaying, so does one with less (before
/// that, a complete answer may trail the truth by what is not consumed yet).
async fn round(
    fleet: &[&PulseHandle],
    truth: &BTreeMap<String, u64>,
    high: Option<&[i64]>,
    now_ms: u64,
) -> Round {
    let probe = FleetProbe::new(GROWN);
    let before = owners(fleet);
    let consumed = high.is_some_and(|high| {
        before.iter().all(|(&p, owned)| {
            owned
                .iter()
                .all(|o| o.replaying || o.next_offset >= high[p as usize])
        })
    });
    let mut out = Round {
        quiet: false,
        complete: 0,
        answers: 0,
    };
    for (i, pulse) in fleet.iter().enumerate() {
        for (key, &count) in truth {
            let route = format!("/api/keys/acme{key}?now_ms={now_ms}");
            let (status, body) = probe.get(pulse.api_addr(), &route).await.unwrap();
            out.answers += 1;
            if status != 200 || body["coverage"]["complete"] != true {
                continue;
            }
            out.complete += 1;
            let counted = body["windows"][3]["total"].as_u64().unwrap();
            // Never more than produced, consumed or not (a partition counted twice).
            assert!(
                counted <= count,
                "instance {i} {route}: complete with {counted}, more than produced: {body}"
            );
            if !consumed {
                continue;
            }
            assert_eq!(
                counted, count,
                "instance {i} {route}: complete with {counted} of {count}: {body}"
            );
        }
    }
    out.quiet = high.is_some_and(|high| {
        let after = owners(fleet);
        after == before && settled(&after, high)
    });
    out
}

/// Rounds until two quiet ones in a row, the second all complete; the complete and
/// partial answers seen before.
async fn until_whole(
    fleet: &[&PulseHandle],
    truth: &BTreeMap<String, u64>,
    high: &[i64],
    now_ms: u64,
    step: &str,
) -> (usize, usize) {
    let since = Instant::now();
    let (mut complete, mut partial, mut quiet_before) = (0, 0, false);
    let mut partial_when_quiet = 0;
    loop {
        let r = round(fleet, truth, Some(high), now_ms).await;
        if quiet_before && r.quiet && r.complete == r.answers {
            eprintln!(
                "{step}: whole in {:?}; {complete} complete and {partial} partial answers \
                 before, {partial_when_quiet} of them partial in a quiet round",
                since.elapsed()
            );
            return (complete, partial);
        }
        if r.quiet {
            partial_when_quiet += r.answers - r.complete;
        }
        complete += r.complete;
        partial += r.answers - r.complete;
        quiet_before = r.quiet;
        assert!(
            since.elapsed() < SETTLE_BOUND,
            "{step}: not whole within {SETTLE_BOUND:?}: {:?}",
            owners(fleet)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_that_grows_under_a_fleet_is_answered_right_and_quietly() {
    let warnings = Warnings::install();
    let kafka = TestKafka::start();
    assert!(
        kafka.is_real(),
        "this test needs a real broker: KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092"
    );
    let topic = kafka.unique_topic("pulse-growth");
    kafka.create_topic(&topic, PARTITIONS).await;
    let ports = [free_port(), free_port(), free_port()];
    let config = |me: usize| PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: topic.clone(),
        group: format!("{topic}-fleet"),
        listen: format!("127.0.0.1:{}", ports[me]).parse().unwrap(),
        advertise_url: Some(format!("http://127.0.0.1:{}", ports[me])),
        commit_interval_secs: 1,
        prewarm: false,
        retrain_interval_secs: 0,
        fleet_model: false,
        ..PulseConfig::default()
    };

    let first_ms = wall_ms() / 1_000 * 1_000 - 40_000;
    let now_ms = first_ms + 59_999;
    let (first, second) = (events(FIRST, first_ms, 0), events(SECOND, first_ms, FIRST));
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for e in first.iter().chain(&second) {
        *truth.entry(e.key.to_string()).or_default() += 1;
    }
    let mut producer_config = kafka.config();
    producer_config
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("topic.metadata.refresh.interval.ms", "1000");
    let producer: FutureProducer = producer_config.create().unwrap();

    // A and B on the first events.
    let a = pulse::start(config(0)).await.expect("starting A");
    let b = pulse::start(config(1)).await.expect("starting B");
    produce_events(&producer, &topic, &first).await;
    let so_far: BTreeMap<String, u64> = first.iter().fold(BTreeMap::new(), |mut m, e| {
        *m.entry(e.key.to_string()).or_default() += 1;
        m
    });
    let high = high_watermarks(&kafka, &topic, PARTITIONS);
    until_whole(&[&a, &b], &so_far, &high, now_ms, "A and B").await;

    // The producer writes on; the topic grows, then C joins.
    let writing = {
        let (producer, topic) = (producer.clone(), topic.clone());
        tokio::spawn(async move {
            for slice in second.chunks(SECOND / 10) {
                produce_events(&producer, &topic, slice).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    grow_topic(&kafka, &topic, GROWN as usize).await;
    let grown_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let c = pulse::start(config(2)).await.expect("starting C");
    // While the producer writes, the rounds only check that every instance answers.
    let (mut seen, mut owned) = (None, None);
    while !writing.is_finished() || owned.is_none() {
        round(&[&a, &b, &c], &truth, None, now_ms).await;
        let count = |p: &PulseHandle| p.partitions().read().unwrap().partition_count();
        if seen.is_none() && count(&a) == GROWN && count(&b) == GROWN {
            seen = Some(grown_at.elapsed());
        }
        if owned.is_none() && owners(&[&a, &b, &c]).len() == GROWN as usize {
            owned = Some(grown_at.elapsed());
        }
        assert!(
            grown_at.elapsed() < SETTLE_BOUND,
            "the new partitions are not owned"
        );
    }
    eprintln!("after the growth: A and B knew it in {seen:?}, every partition owned in {owned:?}");
    writing.await.unwrap();
    let high = high_watermarks(&kafka, &topic, GROWN);
    assert_eq!(
        high.iter().sum::<i64>() as usize,
        FIRST + SECOND,
        "every event is on the topic"
    );
    assert!(
        high[PARTITIONS as usize..].iter().all(|&h| h > 0),
        "the producer wrote to the new partitions: {high:?}"
    );
    until_whole(&[&a, &b, &c], &truth, &high, now_ms, "grown, C joined").await;
    eprintln!("whole {:?} after the growth", grown_at.elapsed());

    // Some key lived on two partitions, on two instances.
    let owned = owners(&[&a, &b, &c]);
    let owner = |p: i32| owned[&p][0].instance;
    let across = truth
        .keys()
        .filter(|key| {
            let k = models::message_key("acme", key);
            let (old, new) = (
                partition_for_key(k.as_bytes(), PARTITIONS),
                partition_for_key(k.as_bytes(), GROWN),
            );
            old != new && owner(old) != owner(new)
        })
        .count();
    eprintln!("{across} keys on two partitions of two instances");
    assert!(
        across > 0,
        "some key's partitions are on two instances: {owned:?}"
    );

    // C leaves.
    c.shutdown().await;
    until_whole(&[&a, &b], &truth, &high, now_ms, "C left").await;
    let lines = warnings.lines();
    assert!(
        lines.trim().is_empty(),
        "a healthy fleet's join, growth and leave logged warnings:\n{lines}"
    );

    // Something wrong: D joins advertising a URL nobody listens on. A's fleet answers
    // leave it out, and once it has been silent for the warning's delay, they warn.
    let wrong = format!("http://127.0.0.1:{}", free_port());
    let d = pulse::start(PulseConfig {
        advertise_url: Some(wrong.clone()),
        ..config(2)
    })
    .await
    .expect("starting D");
    let probe = FleetProbe::new(GROWN);
    let since = Instant::now();
    while !warnings.lines().contains(&wrong) {
        assert!(
            since.elapsed() < SETTLE_BOUND,
            "no warning about a peer that never answers"
        );
        let _ = probe.get(a.api_addr(), "/api/tenants").await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let lines = warnings.lines();
    eprintln!("warned {:?} after D joined", since.elapsed());
    assert!(
        lines.contains("WARN") && lines.contains("peer left out of a fleet answer"),
        "{lines}"
    );
    for pulse in [d, a, b] {
        pulse.shutdown().await;
    }
}
