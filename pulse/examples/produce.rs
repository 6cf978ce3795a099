//! Produces a JSON-lines file of access events (from `pulse trace --out`, or written
//! by hand) to a Kafka topic, each keyed `tenant/key` like an edge node keys them.
//!
//! ```sh
//! cargo run -p pulse --example produce -- --brokers 127.0.0.1:9092 events.jsonl
//! # all into partition 0, so pulse reads the backlog in event-time order:
//! cargo run -p pulse --example produce -- --brokers HOST:PORT --partition 0 events.jsonl
//! # replay in real time, shifted so the first event happens now (a live dashboard):
//! cargo run -p pulse --example produce -- --brokers HOST:PORT --realtime events.jsonl
//! # at the pace of event time, 4 times faster, timestamps kept (pulse scores the bursts
//! # as they unfold, not as one backlog read in large batches):
//! cargo run -p pulse --example produce -- --brokers HOST:PORT --pace 4 events.jsonl
//! ```
//!
//! Every line must decode as an `AccessEvent`; a line that does not stops the run
//! with its line number. It prints `produced N events` once every message has been
//! acknowledged, and fails if any was not.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use models::{AccessEvent, decode, encode};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

/// Produce access events from a JSON-lines file to Kafka.
#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers (HOST:PORT,...), such as the address `pulse serve` prints.
    #[arg(long)]
    brokers: String,
    /// The topic.
    #[arg(long, default_value = pulse::EVENTS_TOPIC)]
    topic: String,
    /// Send every event to this partition instead of partitioning by key.
    #[arg(long)]
    partition: Option<i32>,
    /// Send each event at its own time, shifted so the first one is sent now, with
    /// `ts_ms` rewritten to match.
    #[arg(long, conflicts_with = "pace")]
    realtime: bool,
    /// Send each event at its own time, `PACE` times faster than event time, its `ts_ms`
    /// kept.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pace: Option<u64>,
    /// The JSON-lines file.
    file: PathBuf,
}

/// Counts delivery failures; librdkafka calls it from `poll`/`flush`.
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
}

impl rdkafka::ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!("delivery failed: {e}");
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    let mut events: Vec<AccessEvent> = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let event = decode(line.as_bytes())
            .with_context(|| format!("{}:{}: not an access event", args.file.display(), i + 1))?;
        events.push(event);
    }

    let producer: BaseProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create_with_context(Deliveries::default())
        .context("creating a Kafka producer")?;

    let started = Instant::now();
    let first_ts = events.first().map_or(0, |e| e.ts_ms);
    let pace = if args.realtime { Some(1) } else { args.pace };
    let start_ms = pulse::wall_clock_ms();
    for mut event in events.iter().cloned() {
        if let Some(pace) = pace {
            let offset = event.ts_ms.saturating_sub(first_ts);
            // A sleep, not `poll(wait)`: rdkafka's poll spins through the last
            // millisecond of a wait. Delivery reports are served after each send.
            let due = started + Duration::from_millis(offset / pace);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if args.realtime {
                event.ts_ms = start_ms + offset;
            }
        }
        let key = event.partition_key();
        let payload = encode(&event);
        let mut record = BaseRecord::to(&args.topic).key(&key).payload(&payload);
        if let Some(p) = args.partition {
            record = record.partition(p);
        }
        // A full local queue: serve delivery reports until there is room.
        let mut record = Some(record);
        while let Some(r) = record.take() {
            match producer.send(r) {
                Ok(()) => {}
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(50));
                    record = Some(r);
                }
                Err((e, _)) => bail!("producing to {}: {e}", args.topic),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(60))
        .context("waiting for the broker to acknowledge every event")?;
    let failed = producer.context().failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} of {} events were not delivered", events.len());
    }
    println!(
        "produced {} events to {} in {:.1} s",
        events.len(),
        args.topic,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
