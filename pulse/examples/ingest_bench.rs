//! Ingest from a real broker: pulse's sustained consume-and-apply rate next to the
//! raw consume rate of `kcat -C` on the same topic, in the same run.
//!
//! Both rates are measured the same way, from the first message to the last: kcat's
//! from the first byte it prints to its exit at the end of the topic (so its process
//! start, metadata and first fetch are not counted, as pulse's are not either), and
//! pulse's from the first applied batch to the last event applied (the events of that
//! first batch are not counted). Pulse runs twice, each time in a process of its own
//! (this example run again with `--consume`) so its peak RSS is pulse's alone: consume,
//! decode and apply only, then as `pulse serve` runs, with the predictor after every
//! batch.
//!
//! `cargo run --profile bench -p pulse --example ingest_bench -- BROKERS [EVENTS]`.
//! Prints one line of `key=value` pairs for scripts/bench/pulse.

#[path = "support/vm_hwm.rs"]
mod vm_hwm;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use pulse::{Metrics, PulseConfig};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let mut args = std::env::args().skip(1).peekable();
    if args.next_if(|a| a == "--consume").is_some() {
        let mut arg = || {
            args.next()
                .expect("--consume BROKERS TOPIC EVENTS plain|predict")
        };
        let (brokers, topic, n) = (arg(), arg(), arg().parse().expect("EVENTS"));
        return consume(&brokers, &topic, n, arg() == "predict").await;
    }
    let brokers = args.next().unwrap_or_else(|| "127.0.0.1:9092".into());
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let topic = format!(
        "pulse-bench-{}-{}",
        std::process::id(),
        pulse::wall_clock_ms() / 1000
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("admin client");
    for r in admin
        .create_topics(
            [&NewTopic::new(&topic, 4, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic")
    {
        r.expect("create topic");
    }

    // Produce: Zipf-ish keys over 3 regions, 30 s of event time (inside the 60 s
    // window, so no event is refused however unevenly the partitions are fetched).
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", "lz4")
        .create()
        .expect("producer");
    let t0 = 1_764_470_000_000u64;
    let tenant = TenantId::new("acme").unwrap();
    let regions: Vec<RegionId> = ["eu-west", "us-east", "ap-south"]
        .iter()
        .map(|r| RegionId::new(*r).unwrap())
        .collect();
    let mut bytes = 0usize;
    for i in 0..n {
        let k = (i * 2_654_435_761) % 100_000 % (1 + i % 1_000);
        let e = AccessEvent::new(
            t0 + i * 30_000 / n,
            tenant.clone(),
            CacheKey::new(format!("/assets/{k}.js")).unwrap(),
            regions[i as usize % 3].clone(),
            NodeId::new(format!("edge-{}", i % 8)).unwrap(),
            Outcome::ALL[i as usize % 4],
        );
        let payload = encode(&e);
        bytes += payload.len();
        let key = e.partition_key();
        loop {
            match producer.send(BaseRecord::to(&topic).key(&key).payload(&payload)) {
                Ok(()) => break,
                Err(_) => {
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("flush");

    eprintln!("produced {n} events; kcat");
    // kcat: raw consume of the whole topic, output read and discarded. Its pre-fetch
    // queue is raised past the topic's size: with librdkafka's defaults a full queue
    // makes its fetcher pause, and kcat's rate varied from 0.18 M to 1.15 M events/s
    // between runs; raised, it never waits on a full queue (0.80-1.16 M/s here).
    let mut kcat = Command::new("kcat")
        .args([
            "-C",
            "-b",
            &brokers,
            "-t",
            &topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-X",
            "queued.min.messages=10000000",
            "-X",
            "queued.max.messages.kbytes=1000000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running kcat (apt-get install -y kcat)");
    let mut out = kcat.stdout.take().expect("kcat stdout");
    let mut buf = vec![0u8; 1 << 20];
    let (mut first_byte, mut lines) = (None, 0u64);
    loop {
        let len = out.read(&mut buf).expect("reading kcat");
        if len == 0 {
            break;
        }
        first_byte.get_or_insert_with(Instant::now);
        lines += buf[..len].iter().filter(|b| **b == b'\n').count() as u64;
    }
    let kcat_secs = first_byte
        .expect("kcat printed nothing")
        .elapsed()
        .as_secs_f64();
    assert!(kcat.wait().expect("kcat").success(), "kcat failed");
    assert_eq!(lines, n, "kcat read every event");

    eprintln!("kcat done; pulse");
    let pulse = consume_in_child(&brokers, &topic, n, "plain");
    eprintln!("pulse done; pulse with prediction");
    let predict = consume_in_child(&brokers, &topic, n, "predict");
    let kcat_rate = n as f64 / kcat_secs;
    let rate = |run: &[(String, String)]| field(run, "rate").parse::<f64>().unwrap();
    println!(
        "events={n} avg_bytes={} kcat_secs={kcat_secs:.2} kcat_rate={kcat_rate:.0} pulse_rate={:.0} ratio={:.2} predict_rate={:.0} predict_ratio={:.2} rejected={} predict_rejected={} vm_hwm_mib={} predict_vm_hwm_mib={}",
        bytes / n as usize,
        rate(&pulse),
        rate(&pulse) / kcat_rate,
        rate(&predict),
        rate(&predict) / kcat_rate,
        field(&pulse, "rejected"),
        field(&predict, "rejected"),
        field(&pulse, "vm_hwm_mib"),
        field(&predict, "vm_hwm_mib"),
    );
}

/// Runs `--consume` in a new process of this example and returns its `key=value`s.
fn consume_in_child(brokers: &str, topic: &str, n: u64, mode: &str) -> Vec<(String, String)> {
    let exe = std::env::current_exe().expect("this example's path");
    let output = Command::new(exe)
        .args(["--consume", brokers, topic, &n.to_string(), mode])
        .stderr(Stdio::inherit())
        .output()
        .expect("running the consume child");
    assert!(
        output.status.success(),
        "{mode} run failed: {}",
        output.status
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn field<'a>(run: &'a [(String, String)], key: &str) -> &'a str {
    run.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("the consume run printed no {key}"))
}

/// The child: consumes the whole topic with a fresh consumer group, as plain ingest or
/// with the predictor on the ingest thread after every batch, and prints its rate,
/// what was refused and its own peak RSS.
async fn consume(brokers: &str, topic: &str, n: u64, predict: bool) {
    let group = if predict { "predict" } else { "pulse" };
    let (rate, metrics) = pulse_run(brokers, topic, group, n, predict).await;
    // Everything the heat map or the decoder refused, whatever the reason.
    let rejected: u64 = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("pulse_events_rejected_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    println!(
        "rate={rate:.0} rejected={rejected} too_old={} vm_hwm_mib={:.1}",
        too_old(&metrics),
        vm_hwm::vm_hwm_kib() as f64 / 1024.0
    );
}

/// Every message counts once it is processed: applied, or refused by the heat map
/// (`too_old`: partitions are fetched unevenly, so one partition's newest events can
/// move the watermark past another's oldest by more than the 60 s window).
fn too_old(metrics: &Metrics) -> u64 {
    metrics
        .rejected
        .get_or_create(&pulse::ReasonLabel {
            reason: pulse::ApplyError::TooOld.as_str(),
        })
        .get()
}

/// Consumes the whole topic with a fresh consumer group, running pulse as it ships
/// (`pulse::start`), with or without prediction (any pre-warm command goes to a topic
/// of its own); the rate from the first applied event to the last.
async fn pulse_run(
    brokers: &str,
    topic: &str,
    group: &str,
    n: u64,
    predict: bool,
) -> (f64, Arc<Metrics>) {
    let pulse = pulse::start(PulseConfig {
        brokers: Some(brokers.to_owned()),
        topic: topic.to_owned(),
        group: format!("{topic}-{group}"),
        listen: "127.0.0.1:0".parse().expect("a socket address"),
        prewarm: predict,
        prewarm_topic: format!("{topic}-prewarm"),
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse");
    let metrics = pulse.metrics().clone();
    let mut first: Option<(Instant, u64)> = None;
    loop {
        let consumed = metrics.consumed.get() + too_old(&metrics);
        if first.is_none() && consumed > 0 {
            first = Some((Instant::now(), consumed));
        }
        if consumed >= n {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let (since, at_first) = first.unwrap();
    let rate = (n - at_first) as f64 / since.elapsed().as_secs_f64();
    pulse.shutdown().await;
    (rate, metrics)
}
