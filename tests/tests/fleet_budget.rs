//! One budget, one cooldown and one dedupe per tenant for the whole fleet (issue #28),
//! on the real broker: the partitions' deciders propose, the fleet's gate
//! (`pulse/src/gate/`) admits.
//!
//! The events: two tenants, a Zipf background and 24 viral bursts (thinned to a tenth:
//! the shipped model still acts on them) over 40 s of event time, produced at twice or
//! four times the pace of event time once the instances run, so they decide live. The
//! budget is 2 commands per tenant plus 0.02 a second: far below what the model wants
//! (a dozen or so per tenant), so it binds.
//!
//! - `a_crash_repeats_no_command`: three `pulse serve` processes on 8 partitions, a
//!   budget of 3 + 0.02/s per tenant and no periodic commit during the run; B is
//!   SIGKILLed while the events are produced, once its proposals are on the decisions
//!   topic (its uncommitted tail is decided again by its partitions' new owners, and
//!   its gate partitions move with their state), and restarted. On the prewarm topic:
//!   no id twice, no (tenant, key) commanded twice within its cooldown (other than
//!   follow-ups of the same burst), per tenant at most one budget; and the gates did refuse decisions made
//!   again (`duplicate`, `cooldown`), or the check would prove nothing.
//! - `one_budget_for_1_3_and_8_instances`: in-process `pulse::start` handles (eight
//!   processes per group would cost more than they show), groups of 1, 3 and 8
//!   instances on one events topic at P = 8, then at P = 32; per group and tenant, no
//!   more commands than one budget, and the gate refused some (it bound).
//!
//! On the code before the gate the budget was split per partition (max(burst / P, 1)
//! each: 8 and 32 at once here, not 2 or 3), and both tests fail on the budget check;
//! that code also read a moved partition's tail as one backlog, ticked once, and so
//! rarely decided it again: the crash then lost commands rather than repeating them,
//! and the first test's "decided again" check fails on it too.
//!
//! Needs a real broker (`KAFKA_BOOTSTRAP_SERVERS`, `scripts/kafka start`); fails,
//! loudly, without one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use models::{AccessEvent, PrewarmCommand};
use pulse::{PulseConfig, PulseHandle, TraceSpec, generate_trace};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tests::fleet::{
    FleetProbe, ProcessEnv, PulseProcess, high_watermarks, parse_health, pulse_bin, read_commands,
    read_commands_of,
};
use tests::{TestKafka, committed_offsets, free_port, produce_paced, wall_ms};

/// Each tenant's burst, for the whole fleet.
const BURST: f64 = 2.0;
/// Each tenant's rate, per second.
const RATE_PER_S: f64 = 0.02;
/// The crash test's budget: binding too (the scenario checks both), though a
/// decision made again is refused as a duplicate or by the cooldown before the budget
/// is asked.
const CRASH_BURST: f64 = 3.0;
const CRASH_RATE_PER_S: f64 = 0.02;
/// The default cooldown.
const COOLDOWN_MS: u64 = 60_000;
/// The metric of the decisions an instance proposed to the fleet's gate.
const PROPOSALS: &str = "pulse_prewarm_proposals_total";

/// The two tests share two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// 40 s of two tenants' events, ending now, bursts thinned to a tenth.
fn events(seed: u64) -> Vec<AccessEvent> {
    let spec = TraceSpec {
        seed,
        duration_ms: 40_000,
        tenants: 2,
        keys_per_tenant: 500,
        regions: 4,
        nodes_per_region: 2,
        background_rps: 60.0,
        virals: 24,
        noise: 0,
        crons: 0,
        flash_crowds: 0,
        ..TraceSpec::default()
    };
    let trace = generate_trace(&spec);
    let bursts: BTreeSet<(String, String)> = trace
        .bursts
        .iter()
        .map(|b| (b.tenant.to_string(), b.key.to_string()))
        .collect();
    let start = wall_ms() / 1_000 * 1_000 - spec.duration_ms;
    let mut thin = StdRng::seed_from_u64(seed);
    trace
        .events
        .into_iter()
        .filter(|e| {
            !bursts.contains(&(e.tenant.to_string(), e.key.to_string())) || thin.random_bool(0.1)
        })
        .map(|mut e| {
            e.ts_ms = e.ts_ms - spec.start_ms + start;
            e
        })
        .collect()
}

/// The checks on one group's prewarm topic: no id twice; within a key's cooldown only
/// follow-ups of its burst; per tenant at most one budget over the span of event time
/// its commands were issued in.
fn check_commands(label: &str, commands: &[PrewarmCommand], burst: f64, rate_per_s: f64) {
    let mut ids = BTreeSet::new();
    for c in commands {
        assert!(
            ids.insert(c.id.as_str()),
            "{label}: command id {} sent twice",
            c.id
        );
    }
    let burst_of = |id: &str| id.split('-').nth(1).map(str::to_owned);
    let mut per_key: BTreeMap<(String, String), Vec<&PrewarmCommand>> = BTreeMap::new();
    let mut per_tenant: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for c in commands {
        per_key
            .entry((c.tenant.to_string(), c.key.to_string()))
            .or_default()
            .push(c);
        per_tenant
            .entry(c.tenant.to_string())
            .or_default()
            .push(c.issued_at_ms);
    }
    for ((tenant, key), mut sent) in per_key {
        sent.sort_by_key(|c| c.issued_at_ms);
        let first = sent[0];
        for c in &sent[1..] {
            assert!(
                c.issued_at_ms >= first.issued_at_ms + COOLDOWN_MS
                    || burst_of(&c.id) == burst_of(&first.id),
                "{label}: {tenant}{key} commanded twice within its cooldown, not as a \
                 follow-up: {} at {} then {} at {}",
                first.id,
                first.issued_at_ms,
                c.id,
                c.issued_at_ms
            );
        }
    }
    for (tenant, issued) in &per_tenant {
        let span_s = (issued.iter().max().unwrap() - issued.iter().min().unwrap()) as f64 / 1e3;
        let budget = burst + rate_per_s * span_s;
        assert!(
            issued.len() as f64 <= budget,
            "{label}: {tenant}: {} commands, over one fleet budget ({burst} + {rate_per_s}/s \
             × {span_s:.1} s = {budget:.2})",
            issued.len()
        );
    }
    eprintln!(
        "{label}: commands per tenant {:?}",
        per_tenant
            .iter()
            .map(|(t, v)| (t, v.len()))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_repeats_no_command() {
    let _serial = SERIAL.lock().await;
    // Whether the dead instance's tail holds a decision its new owner makes again
    // depends on where the kill falls: a run where none was made again proves nothing
    // and is run once more (each run's checks hold either way).
    for attempt in 1..=3 {
        let repeats_refused = crash_run().await;
        if repeats_refused > 0.0 {
            return;
        }
        eprintln!("attempt {attempt}: no decision was made again after the crash");
    }
    panic!(
        "no decision was made again after the crash in 3 runs (no duplicate or cooldown \
         refused by any gate): the check proves nothing"
    );
}

/// One run of the crash scenario, its checks made; what the gates refused as made
/// again.
async fn crash_run() -> f64 {
    const P: i32 = 8;
    let kafka = TestKafka::start();
    assert!(
        kafka.is_real(),
        "this test runs pulse as separate processes and needs a real broker: set \
         KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 (scripts/kafka start)"
    );
    let events_topic = kafka.unique_topic("fleet-budget-events");
    let prewarm_topic = kafka.unique_topic("fleet-budget-prewarm");
    kafka.create_topic(&events_topic, P).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let dir = tempfile::Builder::new()
        .prefix("fleet-budget")
        .tempdir()
        .unwrap();
    eprintln!(
        "pulse binary: {}; logs in {}",
        pulse_bin().display(),
        dir.path().display()
    );
    let env = ProcessEnv {
        dir: dir.path().to_owned(),
        vars: vec![],
    };
    let ports = [free_port(), free_port(), free_port()];
    let args = |me: usize| -> Vec<String> {
        let peers: Vec<String> = (0..3)
            .filter(|&i| i != me)
            .map(|i| format!("http://127.0.0.1:{}", ports[i]))
            .collect();
        [
            "--brokers",
            kafka.bootstrap_servers(),
            "--topic",
            &events_topic,
            "--group",
            &format!("{events_topic}-fleet"),
            "--prewarm-topic",
            &prewarm_topic,
            "--no-model-topic",
            // The gate's topics too: 8 partitions.
            "--topic-partitions",
            "8",
            "--retrain-interval-secs",
            "0",
            // Decisions from the first seconds on: a fresh pulse's online calibration
            // would wait for a second region, and this trace's thinned bursts seldom
            // reach one within the run.
            "--no-calibrate-online",
            // No periodic commit within the test: B's whole tail is uncommitted, and
            // the crash makes its partitions' new owners decide it again.
            "--commit-interval-secs",
            "600",
            "--tenant-burst",
            &CRASH_BURST.to_string(),
            "--tenant-rate",
            &CRASH_RATE_PER_S.to_string(),
            "--peers",
            &peers.join(","),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let probe = FleetProbe::new(P);
    let mut a = PulseProcess::start("a", ports[0], args(0), &env);
    let mut b = PulseProcess::start("b", ports[1], args(1), &env);
    let mut c = PulseProcess::start("c", ports[2], args(2), &env);
    for p in [&mut a, &mut b, &mut c] {
        probe.wait_healthy(p).await;
    }
    wait_owned(&probe, &mut [&mut a, &mut b, &mut c], P, None).await;

    let events = events(28);
    let producer = kafka.producer();
    let topic = events_topic.clone();
    let all = events.clone();
    let produced = tokio::spawn(async move { produce_paced(&producer, &topic, &all, 2).await });
    let group = format!("{events_topic}-fleet");
    let decisions = format!("{events_topic}.{group}.decisions");
    // Mid-stream, once an instance (B: the first to propose; which one proposes at all
    // depends on the partitions and so the keys it was given) has proposed something
    // and its proposals are on the decisions topic (its partitions' decisions are in
    // its uncommitted tail; one still in its producer's queue would die with it, and be
    // decided for the first time by the partition's next owner): B dies, and comes back.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = 'proposed: loop {
        for (i, p) in [&a, &b, &c].into_iter().enumerate() {
            if probe.metric_sum(p, PROPOSALS).await > 0.0 {
                break 'proposed i;
            }
        }
        assert!(
            !produced.is_finished() && Instant::now() < deadline,
            "no instance proposed anything while the events were produced\n{}\n{}\n{}",
            a.log_tail(),
            b.log_tail(),
            c.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // B is the victim from here on, whichever name it started under.
    match victim {
        0 => std::mem::swap(&mut a, &mut b),
        2 => std::mem::swap(&mut c, &mut b),
        _ => {}
    }
    let mut made = 0.0;
    for p in [&a, &b, &c] {
        made += probe.metric_sum(p, PROPOSALS).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let delivered: i64 = high_watermarks(&kafka, &decisions, P).iter().sum();
        if delivered as f64 >= made {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{made} proposals made, {delivered} on the decisions topic after 30 s\n{}",
            b.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.sigkill();
    eprintln!("{} SIGKILLed", b.name);
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.restart();
    probe.wait_healthy(&mut b).await;
    produced.await.expect("producing the events");
    let hwm = high_watermarks(&kafka, &events_topic, P);
    wait_owned(&probe, &mut [&mut a, &mut b, &mut c], P, Some(&hwm)).await;
    // Every proposal decided on: the gate group's offsets at the decisions' end.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let end = high_watermarks(&kafka, &decisions, P);
        let committed = committed_offsets(
            &kafka.config(),
            &format!("{group}.gate"),
            &decisions,
            P,
            Duration::from_secs(10),
        )
        .unwrap_or_default();
        let done = committed.len() == end.len()
            && committed
                .iter()
                .zip(&end)
                .all(|(c, e)| *e == 0 || *c == Some(*e));
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gates did not decide every proposal: committed {committed:?}, end {end:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What the gates refused as made again (B's counts are since its restart).
    let mut repeats_refused = 0.0;
    for p in [&a, &b, &c] {
        if let Ok((_, Value::String(text))) = probe.get(p.addr(), "/metrics").await {
            for line in text
                .lines()
                .filter(|l| l.starts_with("pulse_gate_decisions_total"))
            {
                eprintln!("{}: {line}", p.name);
                let repeat = line.contains("\"duplicate\"") || line.contains("\"cooldown\"");
                if repeat {
                    repeats_refused += line
                        .rsplit(' ')
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0);
                }
            }
        }
    }
    if repeats_refused == 0.0 {
        // For the log: the keys proposed more than once. A decision made again under
        // another id (its burst seen to start at another tick) was refused by the
        // budget, not as a repeat.
        let mut proposed: BTreeMap<(String, String), Vec<(u64, String)>> = BTreeMap::new();
        for c in read_commands_of(&kafka, &decisions, P) {
            proposed
                .entry((c.tenant.to_string(), c.key.to_string()))
                .or_default()
                .push((c.issued_at_ms, c.id));
        }
        proposed.retain(|_, ids| ids.len() > 1);
        eprintln!(
            "proposed more than once: {proposed:?}\nB's log:\n{}",
            b.log_tail()
        );
    }
    let commands = read_commands(&kafka, &prewarm_topic);
    assert!(!commands.is_empty(), "the fleet sent no command at all");
    check_commands(
        "3 processes, P = 8, the first to propose SIGKILLed",
        &commands,
        CRASH_BURST,
        CRASH_RATE_PER_S,
    );
    for p in [&mut a, &mut b, &mut c] {
        p.sigterm();
    }
    repeats_refused
}

/// Waits until every partition is owned by a live instance, not replaying and, with
/// `hwm`, applied to its high watermark.
async fn wait_owned(
    probe: &FleetProbe,
    fleet: &mut [&mut PulseProcess],
    p: i32,
    hwm: Option<&[i64]>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = BTreeSet::new();
        for process in fleet.iter_mut() {
            process.expect_running();
            if let Ok((200, body)) = probe.get(process.addr(), "/healthz").await {
                let (_, owned) = parse_health(process.name, &body);
                for o in owned {
                    let caught_up = hwm.is_none_or(|h| o.next_offset >= h[o.partition as usize]);
                    if !o.replaying && caught_up {
                        done.insert(o.partition);
                    }
                }
            }
        }
        if done.len() == p as usize {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "partitions {done:?} of {p} owned and caught up after 60 s\n{}",
            fleet
                .iter()
                .map(|f| f.log_tail())
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A group of `n` in-process instances on `events_topic`, with its own prewarm topic.
async fn group(
    kafka: &TestKafka,
    events_topic: &str,
    p: i32,
    n: usize,
) -> (Vec<PulseHandle>, String) {
    let prewarm_topic = kafka.unique_topic(&format!("fleet-budget-prewarm-{n}"));
    kafka.create_topic(&prewarm_topic, 1).await;
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: events_topic.to_owned(),
        group: format!("{events_topic}-{n}"),
        prewarm_topic: prewarm_topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        topic_partitions: p,
        retrain_interval_secs: 0,
        fleet_model: false,
        commit_interval_secs: 1,
        tenant_burst: BURST,
        tenant_rate_per_s: RATE_PER_S,
        ..PulseConfig::default()
    };
    // Started together: the group forms in one rebalance, not eight.
    let starting: Vec<_> = (0..n)
        .map(|_| tokio::spawn(pulse::start(config.clone())))
        .collect();
    let mut handles = Vec::new();
    for start in starting {
        handles.push(start.await.unwrap().expect("starting pulse"));
    }
    (handles, prewarm_topic)
}

fn owned(handles: &[PulseHandle]) -> usize {
    handles
        .iter()
        .map(|h| h.partitions().read().unwrap().states().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_budget_for_1_3_and_8_instances() {
    let _serial = SERIAL.lock().await;
    let kafka = TestKafka::start();
    assert!(
        kafka.is_real(),
        "this test needs a real broker: set KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092"
    );
    for p in [8, 32] {
        let events_topic = kafka.unique_topic(&format!("fleet-budget-p{p}"));
        kafka.create_topic(&events_topic, p).await;
        let mut groups = Vec::new();
        for n in [1, 3, 8] {
            groups.push((n, group(&kafka, &events_topic, p, n).await));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while groups.iter().any(|(_, (h, _))| owned(h) != p as usize) {
            assert!(
                Instant::now() < deadline,
                "P = {p}: the groups did not get every partition"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let events = events(u64::from(p as u32));
        produce_paced(&kafka.producer(), &events_topic, &events, 4).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        for (n, (handles, _)) in &groups {
            while handles
                .iter()
                .map(|h| h.metrics().consumed.get())
                .sum::<u64>()
                < events.len() as u64
            {
                assert!(
                    Instant::now() < deadline,
                    "P = {p}, {n} instances: not every event applied"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (n, (handles, prewarm_topic)) in groups {
            let label = format!("P = {p}, {n} instances");
            let commands = read_commands(&kafka, &prewarm_topic);
            check_commands(&label, &commands, BURST, RATE_PER_S);
            let refused: u64 = handles
                .iter()
                .map(|h| {
                    h.metrics()
                        .gate_decisions
                        .get_or_create(&pulse::OutcomeLabel {
                            outcome: "over_budget",
                        })
                        .get()
                })
                .sum();
            assert!(
                refused > 0,
                "{label}: the gate refused nothing over budget: the budget did not bind \
                 ({} commands), so the check proves nothing",
                commands.len()
            );
            for h in handles {
                h.shutdown().await;
            }
        }
    }
}
