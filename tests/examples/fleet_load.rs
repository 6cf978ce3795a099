//! The event load of `scripts/bench/fleet`: creates a fresh topic with the given
//! partitions (alone with `--create-only`, so consumers can join it first), and fills
//! it (a topic that exists already with `--existing`) with a seeded trace (`pulse::generate_trace`, the default
//! mix of tenants, regions and bursts, its background rate sized to about `--events`),
//! moved so that it ends now. Each event is keyed `tenant/key` (librdkafka's default
//! partitioner, as edges key them) and stamped with its event time, as an edge would.
//! Prints `events=N produce_secs=S` once the broker has acknowledged every event.
//!
//! ```sh
//! cargo run --release -p tests --example fleet_load -- \
//!     --brokers 127.0.0.1:9092 --topic bench-events --partitions 8 --events 1500000
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use models::encode;
use pulse::{TraceSpec, generate_trace};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

/// Fill a fresh topic with a seeded trace.
#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long)]
    brokers: String,
    /// The topic to create (it must not exist).
    #[arg(long)]
    topic: String,
    /// Its partitions.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// About how many events (the background's; the bursts add a few percent).
    #[arg(long, default_value_t = 1_500_000)]
    events: u64,
    /// Minutes of event time the trace spans.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// The trace's seed.
    #[arg(long, default_value_t = 4242)]
    seed: u64,
    /// Produce live at about this many events per second (0: the trace ends now, and
    /// is produced as fast as the broker takes it). The trace then starts now, spans
    /// `--events` / `--rate` seconds instead of `--minutes`, and each event is sent at
    /// its event time.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Create the topic and exit.
    #[arg(long, conflicts_with = "existing")]
    create_only: bool,
    /// Delete the topic (and any more named by `--also`) and exit: a bench's topics
    /// hold gigabytes.
    #[arg(long, conflicts_with_all = ["existing", "create_only"])]
    delete: bool,
    /// More topics for `--delete`.
    #[arg(long, requires = "delete")]
    also: Vec<String>,
    /// The topic exists already: only produce.
    #[arg(long)]
    existing: bool,
}

/// Counts failed deliveries; librdkafka calls it from `poll`/`flush`.
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.delete {
        return delete_topics(&args).await;
    }
    if !args.existing {
        create_topic(&args).await?;
    }
    if args.create_only {
        return Ok(());
    }

    let duration_ms = match args.rate {
        0 => args.minutes.max(1) * 60_000,
        rate => (args.events * 1_000 / rate).max(1_000),
    };
    let spec = TraceSpec {
        seed: args.seed,
        duration_ms,
        background_rps: args.events as f64 / (duration_ms as f64 / 1_000.0),
        ..TraceSpec::default()
    };
    let mut events = generate_trace(&spec).events;
    // Ends now, inside every consumer's clock-skew bound and young enough that the
    // broker's retention keeps it; or, paced, starts now.
    let now_ms = tests::wall_ms();
    let start_ms = match args.rate {
        0 => now_ms - duration_ms,
        _ => now_ms,
    };
    for event in &mut events {
        event.ts_ms = event.ts_ms - spec.start_ms + start_ms;
    }

    let producer: BaseProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000")
        .create_with_context(Deliveries::default())
        .context("creating a producer")?;
    let started = Instant::now();
    for (sent, event) in events.iter().enumerate() {
        // Paced in steps of a hundred events: a sleep per event would be longer than
        // the gap between two.
        if args.rate > 0 && sent % 100 == 0 {
            // A sleep, not `poll(early)`: rdkafka's poll spins through the last
            // millisecond of a wait, and this process shares the cores it measures.
            let due = Duration::from_millis(event.ts_ms.saturating_sub(start_ms));
            if let Some(early) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(early);
            }
        }
        let key = event.partition_key();
        let payload = encode(event);
        let mut record = Some(
            BaseRecord::to(&args.topic)
                .key(&key)
                .payload(&payload)
                .timestamp(event.ts_ms as i64),
        );
        while let Some(r) = record.take() {
            match producer.send(r) {
                Ok(()) => {}
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(20));
                    record = Some(r);
                }
                Err((e, _)) => bail!("producing to {}: {e}", args.topic),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(120))
        .context("waiting for the broker to acknowledge every event")?;
    let failed = producer.context().failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} of {} events were not delivered", events.len());
    }
    println!(
        "events={} produce_secs={:.1}",
        events.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn admin(brokers: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("creating an admin client")
}

async fn create_topic(args: &Args) -> anyhow::Result<()> {
    let admin = admin(&args.brokers)?;
    let topic = NewTopic::new(&args.topic, args.partitions, TopicReplication::Fixed(1));
    for result in admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .context("CreateTopics")?
    {
        result.map_err(|(topic, e)| anyhow::anyhow!("creating {topic}: {e}"))?;
    }
    Ok(())
}

async fn delete_topics(args: &Args) -> anyhow::Result<()> {
    let admin = admin(&args.brokers)?;
    let topics: Vec<&str> = std::iter::once(args.topic.as_str())
        .chain(args.also.iter().map(String::as_str))
        .collect();
    for result in admin
        .delete_topics(&topics, &AdminOptions::new())
        .await
        .context("DeleteTopics")?
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, e)) => bail!("deleting {topic}: {e}"),
        }
    }
    Ok(())
}
