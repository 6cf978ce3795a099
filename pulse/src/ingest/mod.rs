//! Kafka ingest: one consumer-group member on the events topic, feeding the state of
//! each partition it owns ([`Partitions`]).
//!
//! A dedicated thread owns a `BaseConsumer`: it polls a batch, decodes it, applies
//! it under one write lock (messages come in runs per partition: one lookup per run),
//! and commits each partition's applied offset (with a checkpoint file, only after a
//! checkpoint that contains it). Keeping consume, decode and apply on one thread keeps
//! the CPU work off the async runtime, needs no channel hop per message, and makes
//! "checkpoint, then commit" a plain sequence rather than a protocol between tasks.
//!
//! # Rebalances
//! The group uses the cooperative (incremental) protocol: a rebalance moves only the
//! partitions that change owner, and the others go on untouched. The rebalance
//! callback runs on this thread, inside `poll`, between batches:
//! - **revoke**: the applied offset of each revoked partition is committed
//!   synchronously, the partition is unassigned, its state dropped, and its polled
//!   but not yet applied messages discarded: the next owner reads them from the
//!   committed offset, so nothing is lost and nothing applied twice. When the
//!   assignment was *lost* (the group could not be reached, as in a broker outage)
//!   nothing is committed, since another member may own the partition already, and
//!   the state is parked as a snapshot instead of dropped: not served, checkpointed,
//!   and resumed from if the partition comes back;
//! - **assign**: the committed offset becomes the partition's `live_from`; it starts
//!   from its checkpoint snapshot's offset if there is one (at most the committed
//!   offset), else from the offset of the first message stamped within the longest
//!   window of wall time ago (`offsets_for_times`), and *replays* up to `live_from`:
//!   replayed events rebuild the heat map and the tracker, and are never scored or
//!   sent.
//!
//! A message that does not decode, or that the heat map refuses, is counted by
//! reason, optionally forwarded to a dead-letter topic, and its offset is committed
//! like any other: a bad message never stalls its partition.

//!
//! # Layout
//! - `rebalance`: the rebalance protocol (`IngestContext`: assign with its replay
//!   bounds, revoke with its commit) and the topic's partition count;
//! - `commit`: what a commit carries for the next owner (the partition's watermark,
//!   the topic's partition counts) and how a failed one is logged;
//! - `worker`: the partition worker loop (`Worker`: poll, decode, apply, tick,
//!   checkpoint and commit).

mod commit;
mod rebalance;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use models::AccessEventRef;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::BaseProducer;

use crate::heat::Window;
use crate::kafka::KafkaClients;
use crate::metrics::Metrics;
use crate::partition::{PartitionState, SharedPartitions};
use crate::stoppable::StoppableThread;
use rebalance::IngestContext;
use worker::Worker;

/// What runs on the ingest thread after each poll round, per owned partition that is
/// live (not replaying), with the partitions locked for reading: the predictor. It
/// sees the partition's live events just applied, still borrowed from the polled
/// messages, and ticks when the partition's schedule says ([`Ticks`]: with new events,
/// every 10 ms of event time or of wall time, whichever comes first).
pub trait BatchObserver: Send + 'static {
    /// Called after `events` were applied to `partition`'s heat map.
    fn observe(&mut self, partition: &PartitionState, events: &[AccessEventRef<'_>]);
    /// Time for `partition` to decide; `since` is when its oldest event not yet
    /// decided on was applied.
    fn tick(&mut self, partition: &PartitionState, since: std::time::Instant);
}

/// Most messages applied under one write lock.
const BATCH: usize = 4_096;

/// The longest a poll round waits for messages.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// Where ingest reads "now" from: the bound on how far ahead of it an event may be
/// stamped ([`HeatMap::set_clock`](crate::HeatMap::set_clock)), and where replay
/// starts. The wall clock in service; tests may set their own.
/// Replays and backtests have none: the trace's event time is their clock.
pub trait Clock: std::fmt::Debug + Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> u64 {
        crate::clock::wall_clock_ms()
    }
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The brokers and the operator's librdkafka properties.
    pub kafka: KafkaClients,
    /// The events topic.
    pub topic: String,
    /// The consumer group.
    pub group_id: String,
    /// Where rejected messages go, if anywhere.
    pub dead_letter_topic: Option<String>,
    /// The checkpoint file; without one, offsets are committed every
    /// `commit_interval` after the events are applied.
    pub checkpoint: Option<PathBuf>,
    /// How often to checkpoint (and then commit).
    pub checkpoint_interval: Duration,
    /// How often to commit when there is no checkpoint file.
    pub commit_interval: Duration,
    /// The clock events are checked against (set on the heat maps before each batch)
    /// and replay starts from.
    pub clock: Arc<dyn Clock>,
    /// How much wall time a newly assigned partition replays before its committed
    /// offset: the longest window, plus the allowed clock skew.
    pub replay: Duration,
}

impl IngestConfig {
    /// Defaults for `kafka`: topic `edge-events`, group `pulse`, no dead-letter
    /// topic, no checkpoint, checkpoint every 10 s, commit every 2 s, the wall clock,
    /// a replay of the longest window (60 s) and 5 s of clock skew.
    pub fn new(kafka: KafkaClients) -> Self {
        IngestConfig {
            kafka,
            topic: crate::EVENTS_TOPIC.to_owned(),
            group_id: "pulse".to_owned(),
            dead_letter_topic: None,
            checkpoint: None,
            checkpoint_interval: Duration::from_secs(10),
            commit_interval: Duration::from_secs(2),
            clock: Arc::new(WallClock),
            replay: Duration::from_millis(Window::S60.millis() + 5_000),
        }
    }
}

/// Why ingest could not start.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// librdkafka refused the configuration or the subscription.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// The running ingest thread. [`Ingest::stop`] (or drop) stops it after a final
/// checkpoint and commit.
pub struct Ingest {
    thread: StoppableThread,
}

impl Ingest {
    /// Subscribes and starts the ingest thread.
    pub fn start(
        config: IngestConfig,
        partitions: SharedPartitions,
        metrics: Arc<Metrics>,
    ) -> Result<Ingest, IngestError> {
        Self::start_with(config, partitions, metrics, None)
    }

    /// Like [`Ingest::start`], with an observer run after each batch.
    pub fn start_with(
        config: IngestConfig,
        partitions: SharedPartitions,
        metrics: Arc<Metrics>,
        observer: Option<Box<dyn BatchObserver>>,
    ) -> Result<Ingest, IngestError> {
        let context = IngestContext::new(&config, partitions.clone(), metrics.clone());
        let consumer: BaseConsumer<IngestContext> = config
            .kafka
            .config(&[
                ("group.id", &config.group_id),
                ("enable.auto.commit", "false"),
                ("auto.offset.reset", "earliest"),
                ("enable.partition.eof", "false"),
                ("session.timeout.ms", "6000"),
                ("statistics.interval.ms", "1000"),
                // A topic that grows is seen within a second or two (librdkafka's
                // default is 5 min; producers' defaults are minutes too): answers say
                // incomplete from then until a rebalance has assigned the new
                // partitions, which the same refresh sets off. One small metadata
                // request a second.
                ("topic.metadata.refresh.interval.ms", "1000"),
                // Incremental rebalances: partitions that stay are never revoked.
                ("partition.assignment.strategy", "cooperative-sticky"),
                // We commit the offsets we applied (`commit`), never librdkafka's stored
                // ones: storing each polled offset is a lock per message for nothing.
                ("enable.auto.offset.store", "false"),
                // Throughput: fetch big batches, answered as soon as there is data, and
                // keep up to 64 MiB pre-fetched so the poll loop never waits on the
                // network while the broker has messages (librdkafka's fetcher runs on its
                // own thread). Once that queue is full, librdkafka's fetcher pauses for
                // `fetch.queue.backoff.ms` (1 s by default) before it looks again: a poll
                // loop that drains the queue in a fraction of that then sits idle. 10 ms
                // keeps it fed (a plain poll loop went from 0.7 M to 2.1 M messages/s
                // here).
                ("fetch.queue.backoff.ms", "10"),
                ("fetch.wait.max.ms", "100"),
                ("fetch.min.bytes", "1"),
                ("max.partition.fetch.bytes", "4194304"),
                ("queued.min.messages", "200000"),
                ("queued.max.messages.kbytes", "65536"),
            ])
            .create_with_context(context)?;
        consumer.subscribe(&[&config.topic])?;
        let dead_letter = match &config.dead_letter_topic {
            Some(topic) => {
                let producer: BaseProducer =
                    config.kafka.config(&[("linger.ms", "20")]).create()?;
                Some((producer, topic.clone()))
            }
            None => None,
        };
        let worker = Worker::new(consumer, dead_letter, config, partitions, metrics, observer);
        Ok(Ingest {
            thread: StoppableThread::spawn("pulse-ingest", move |stop| worker.run(stop)),
        })
    }

    /// Stops polling, writes a final checkpoint, commits, and waits for the thread.
    /// Blocks: call it from `spawn_blocking` in async code. Dropping it does the same.
    pub fn stop(self) {
        self.thread.stop();
    }
}
