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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use models::{AccessEventRef, decode_event_ref};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::checkpoint;
use crate::heat::Window;
use crate::metrics::Metrics;
use crate::partition::{PartitionState, SharedPartitions};
use crate::reject::RejectReason;
use crate::stoppable::StoppableThread;
use crate::ticks::Ticks;

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
    fn tick(&mut self, partition: &PartitionState, since: Instant);
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
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
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
    /// Defaults for `brokers`: topic `edge-events`, group `pulse`, no dead-letter
    /// topic, no checkpoint, checkpoint every 10 s, commit every 2 s, the wall clock,
    /// a replay of the longest window (60 s) and 5 s of clock skew.
    pub fn new(brokers: impl Into<String>) -> Self {
        IngestConfig {
            brokers: brokers.into(),
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

/// Runs the rebalances (see the module documentation), logs commits, and turns
/// statistics into the lag gauge.
struct IngestContext {
    metrics: Arc<Metrics>,
    topic: String,
    partitions: SharedPartitions,
    clock: Arc<dyn Clock>,
    replay: Duration,
    /// Partitions revoked since the worker last looked: their polled messages go.
    revoked: Mutex<Vec<i32>>,
    /// Set when `revoked` has entries: the ingest thread checks it after every poll,
    /// and an atomic load is cheaper than a lock per message.
    any_revoked: AtomicBool,
    /// Set when ingest stops: revoked partitions keep their state (the handle may
    /// still read it), their offsets are committed all the same.
    closing: AtomicBool,
}

fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => format!("{}/{}@{o}", e.topic(), e.partition()),
            _ => format!("{}/{}", e.topic(), e.partition()),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl ClientContext for IngestContext {
    fn stats_raw(&self, statistics: &[u8]) {
        // Parse only what we need: the mock cluster omits fields the typed struct wants.
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(statistics) else {
            return;
        };
        let mut lag = 0i64;
        let mut ends = Vec::new();
        for topic in v["topics"].as_object().into_iter().flat_map(|t| t.values()) {
            for (id, p) in topic["partitions"].as_object().into_iter().flatten() {
                if id == "-1" {
                    continue;
                }
                let hi = p["hi_offset"].as_i64().unwrap_or(-1);
                if let (Ok(partition), true) = (id.parse::<i32>(), hi >= 0) {
                    if topic["topic"].as_str() == Some(self.topic.as_str()) {
                        ends.push((partition, hi));
                    }
                }
                let at = p["app_offset"]
                    .as_i64()
                    .filter(|o| *o >= 0)
                    .or_else(|| p["committed_offset"].as_i64().filter(|o| *o >= 0));
                if let (true, Some(at)) = (hi >= 0, at) {
                    lag += (hi - at).max(0);
                }
            }
        }
        self.metrics.consumer_lag.set(lag);
        // Each owned partition's end, for its lag in /healthz.
        let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        for (partition, high) in ends {
            partitions.set_high_watermark(partition, high);
        }
    }
}

impl ConsumerContext for IngestContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, tpl),
            other => {
                // As librdkafka's default: give up the assignment; what was applied is
                // committed first unless the assignment is already lost.
                tracing::warn!(error = ?other, "rebalance error; unassigning");
                self.revoke(consumer, tpl);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!(offsets = %describe(offsets), "offsets committed"),
            Err(e) => tracing::warn!(error = %e, offsets = %describe(offsets), "commit failed"),
        }
    }
}

/// The offset-commit metadata of a partition: its watermark (newest event time
/// applied), so the next owner replays from the partition's own event time.
const WATERMARK_METADATA: &str = "watermark_ms=";

/// Adds `partition`'s applied offset to `tpl`, with its watermark as the commit's
/// metadata.
fn add_commit(tpl: &mut TopicPartitionList, topic: &str, state: &PartitionState) {
    let mut entry = tpl.add_partition(topic, state.partition);
    let _ = entry.set_offset(Offset::Offset(state.next_offset));
    entry.set_metadata(format!("{WATERMARK_METADATA}{}", state.heat.now_ms()));
}

/// The watermark a commit's metadata carries, if it is one of ours.
fn committed_watermark(metadata: &str) -> Option<u64> {
    metadata
        .strip_prefix(WATERMARK_METADATA)?
        .parse()
        .ok()
        .filter(|&ms| ms > 0)
}

/// Where a newly assigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Start {
    /// First offset to read; `None`: the beginning of the partition (nothing was
    /// ever committed, so everything is live).
    replay_from: Option<i64>,
    /// The committed offset: below it, events are replayed.
    live_from: i64,
}

/// Where a partition starts, from its committed offset, its snapshot's offset and
/// the offset of the replay window's first message (each if known).
fn start_of(committed: Option<i64>, snapshot: Option<i64>, window: Option<i64>) -> Start {
    match (committed, snapshot) {
        // A snapshot at or behind the group: replay from it up to the committed offset,
        // or from the replay window when the snapshot is older than that (what lies
        // between is outside every window; replaying it would only cost time).
        (Some(c), Some(s)) if s <= c => Start {
            replay_from: Some(window.map_or(s, |w| s.max(w.min(c)))),
            live_from: c,
        },
        // A snapshot ahead of the group (checkpointed, not yet committed) or nothing
        // committed: its events were applied here; go on live from it.
        (_, Some(s)) => Start {
            replay_from: Some(s),
            live_from: s,
        },
        (Some(c), None) => Start {
            replay_from: Some(window.map_or(c, |w| w.min(c))),
            live_from: c,
        },
        (None, None) => Start {
            replay_from: None,
            live_from: 0,
        },
    }
}

impl IngestContext {
    fn take_revoked(&self) -> Vec<i32> {
        if !self.any_revoked.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.revoked.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn partition_count(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) -> i32 {
        let known = self
            .partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .partition_count();
        if known > 0 {
            return known;
        }
        match consumer.fetch_metadata(Some(&self.topic), Duration::from_secs(5)) {
            Ok(m) => m
                .topics()
                .iter()
                .find(|t| t.name() == self.topic)
                .map_or(0, |t| t.partitions().len() as i32),
            Err(e) => {
                tracing::warn!(error = %e, "topic metadata unavailable; partition count from the assignment");
                0
            }
        }
        .max(
            tpl.elements()
                .iter()
                .map(|e| e.partition() + 1)
                .max()
                .unwrap_or(0),
        )
    }

    /// The partitions of the events topic in a rebalance's list.
    fn ours(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }

    fn assign(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let count = self.partition_count(consumer, tpl);
        let ours = self.ours(tpl);
        let mut query = TopicPartitionList::new();
        for &p in &ours {
            query.add_partition(&self.topic, p);
        }
        let mut watermarks = HashMap::new();
        let committed: HashMap<i32, i64> = match consumer
            .committed_offsets(query.clone(), Duration::from_secs(10))
        {
            Ok(list) => list
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => {
                        if let Some(w) = committed_watermark(e.metadata()) {
                            watermarks.insert(e.partition(), w);
                        }
                        Some((e.partition(), o))
                    }
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "committed offsets unavailable; starting where the group is, without replay");
                HashMap::new()
            }
        };
        // The replay window ends at the partition's watermark as its last owner
        // committed it (its own event time), else at the wall clock.
        let now = self.clock.now_ms();
        let since: HashMap<i32, i64> = ours
            .iter()
            .map(|&p| {
                let end = watermarks.get(&p).copied().unwrap_or(now);
                (p, end.saturating_sub(self.replay.as_millis() as u64) as i64)
            })
            .collect();
        let window = self.window_offsets(consumer, &since);
        let behind = self.snapshots_past_the_end(consumer, &ours);
        let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        if partitions.partition_count() == 0 {
            partitions.set_partition_count(count);
        }
        for &p in &ours {
            let snapshot = partitions.take_snapshot(p);
            // A snapshot past the partition's end is of an earlier topic of the same
            // name (an embedded broker is new at every start): its windows are kept,
            // its offset is not, or the new topic's first offsets would be skipped.
            let snapshot_offset = snapshot
                .as_ref()
                .map(|s| s.next_offset)
                .filter(|_| !behind.contains(&p));
            let start = start_of(
                committed.get(&p).copied(),
                snapshot_offset,
                window.get(&p).copied(),
            );
            let offset = start.replay_from.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) = tpl.set_partition_offset(&self.topic, p, offset) {
                tracing::warn!(partition = p, error = %e, "start offset not set");
            }
            tracing::info!(
                partition = p,
                replay_from = ?start.replay_from,
                live_from = start.live_from,
                snapshot = snapshot.is_some(),
                "rebalance: assigned"
            );
            partitions.assign(
                p,
                snapshot.map(|s| s.heat),
                start.replay_from.unwrap_or(0),
                start.live_from,
            );
        }
        self.metrics
            .partitions_owned
            .set(partitions.states().len() as i64);
        drop(partitions);
        let assigned = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_assign(tpl),
            _ => consumer.assign(tpl),
        };
        if let Err(e) = assigned {
            tracing::error!(error = %e, partitions = %describe(tpl), "assign failed");
        }
    }

    /// The partitions whose snapshot's offset is past the partition's end.
    fn snapshots_past_the_end(
        &self,
        consumer: &BaseConsumer<Self>,
        partitions: &[i32],
    ) -> HashSet<i32> {
        let offsets: Vec<(i32, i64)> = {
            let state = self.partitions.read().unwrap_or_else(|e| e.into_inner());
            partitions
                .iter()
                .filter_map(|&p| state.snapshot_offset(p).map(|o| (p, o)))
                .collect()
        };
        let mut past = HashSet::new();
        for (p, offset) in offsets {
            match consumer.fetch_watermarks(&self.topic, p, Duration::from_secs(5)) {
                Ok((_, high)) if offset > high => {
                    tracing::warn!(
                        partition = p,
                        snapshot_offset = offset,
                        high,
                        "snapshot past the partition's end (a new topic?): windows restored, offsets from the group"
                    );
                    past.insert(p);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "watermarks unavailable; trusting the snapshot's offset")
                }
            }
        }
        past
    }

    /// The first offset stamped at or after `since` per partition; empty when the
    /// lookup fails (librdkafka's mock cluster does not answer it): then nothing is
    /// replayed.
    fn window_offsets(
        &self,
        consumer: &BaseConsumer<Self>,
        since: &HashMap<i32, i64>,
    ) -> HashMap<i32, i64> {
        let mut query = TopicPartitionList::new();
        for (&p, &ms) in since {
            let _ = query.add_partition_offset(&self.topic, p, Offset::Offset(ms));
        }
        match consumer.offsets_for_times(query, Duration::from_secs(10)) {
            Ok(list) => list
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some((e.partition(), o)),
                    // No message that recent: replay nothing (clamped to committed).
                    Offset::End => Some((e.partition(), i64::MAX)),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "offsets for the replay window unavailable; replaying nothing");
                HashMap::new()
            }
        }
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let lost = consumer.assignment_lost();
        let ours = self.ours(tpl);
        let mut commit = TopicPartitionList::new();
        {
            let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
            for &p in &ours {
                if let Some(s) = partitions.get(p) {
                    if !s.replaying() && s.next_offset > 0 {
                        add_commit(&mut commit, &self.topic, s);
                    }
                }
            }
        }
        if lost {
            tracing::warn!(partitions = %describe(tpl), "rebalance: assignment lost; not committing");
        } else if commit.count() > 0 {
            self.metrics.revoke_commits.inc();
            match consumer.commit(&commit, CommitMode::Sync) {
                Ok(()) => {
                    tracing::info!(offsets = %describe(&commit), "rebalance: committed on revoke")
                }
                Err(e) => {
                    tracing::warn!(error = %e, offsets = %describe(&commit), "commit on revoke failed")
                }
            }
        }
        let unassigned = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
            _ => consumer.assign(&TopicPartitionList::new()),
        };
        if let Err(e) = unassigned {
            tracing::warn!(error = %e, "unassign failed");
        }
        let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        if !self.closing.load(Ordering::Acquire) {
            for &p in &ours {
                if lost {
                    if let Some(next_offset) = partitions.park(p) {
                        tracing::warn!(
                            partition = p,
                            next_offset,
                            "rebalance: assignment lost; the state waits as a snapshot"
                        );
                    }
                } else if let Some(s) = partitions.revoke(p) {
                    tracing::info!(
                        partition = p,
                        next_offset = s.next_offset,
                        live_from = s.live_from,
                        applied = s.applied,
                        replayed = s.replayed,
                        "rebalance: revoked"
                    );
                }
            }
        }
        self.metrics
            .partitions_owned
            .set(partitions.states().len() as i64);
        drop(partitions);
        self.revoked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(ours);
        self.any_revoked.store(true, Ordering::Release);
    }
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
        let context = IngestContext {
            metrics: metrics.clone(),
            topic: config.topic.clone(),
            partitions: partitions.clone(),
            clock: config.clock.clone(),
            replay: config.replay,
            revoked: Mutex::new(Vec::new()),
            any_revoked: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        };
        let consumer: BaseConsumer<IngestContext> = ClientConfig::new()
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("session.timeout.ms", "6000")
            .set("statistics.interval.ms", "1000")
            // Incremental rebalances: partitions that stay are never revoked.
            .set("partition.assignment.strategy", "cooperative-sticky")
            // We commit the offsets we applied (`commit`), never librdkafka's stored
            // ones: storing each polled offset is a lock per message for nothing.
            .set("enable.auto.offset.store", "false")
            // Throughput: fetch big batches, answered as soon as there is data, and
            // keep up to 64 MiB pre-fetched so the poll loop never waits on the network
            // while the broker has messages (librdkafka's fetcher runs on its own thread).
            // Once that queue is full, librdkafka's fetcher pauses for
            // `fetch.queue.backoff.ms` (1 s by default) before it looks again: a poll loop
            // that drains the queue in a fraction of that then sits idle. 10 ms keeps it
            // fed (a plain poll loop went from 0.7 M to 2.1 M messages/s here).
            .set("fetch.queue.backoff.ms", "10")
            .set("fetch.wait.max.ms", "100")
            .set("fetch.min.bytes", "1")
            .set("max.partition.fetch.bytes", "4194304")
            .set("queued.min.messages", "200000")
            .set("queued.max.messages.kbytes", "65536")
            .create_with_context(context)?;
        consumer.subscribe(&[&config.topic])?;
        let dead_letter = match &config.dead_letter_topic {
            Some(topic) => {
                let producer: BaseProducer = ClientConfig::new()
                    .set("bootstrap.servers", &config.brokers)
                    .set("linger.ms", "20")
                    .create()?;
                Some((producer, topic.clone()))
            }
            None => None,
        };
        let worker = Worker {
            consumer,
            dead_letter,
            config,
            partitions,
            metrics,
            committed: HashMap::new(),
            observer,
            ticks: std::cell::RefCell::default(),
            last_tenant_count: std::cell::Cell::new(
                Instant::now()
                    .checked_sub(Duration::from_secs(1))
                    .unwrap_or_else(Instant::now),
            ),
        };
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

struct Worker {
    consumer: BaseConsumer<IngestContext>,
    /// Served by this thread after each round (no polling thread: see
    /// [`PrewarmPublisher`](crate::PrewarmPublisher)).
    dead_letter: Option<(BaseProducer, String)>,
    config: IngestConfig,
    partitions: SharedPartitions,
    metrics: Arc<Metrics>,
    /// The offset last committed per partition, so an unchanged one is not sent again.
    committed: HashMap<i32, i64>,
    observer: Option<Box<dyn BatchObserver>>,
    /// When each live partition ticks (a `RefCell`: `apply` borrows `self` shared
    /// while the polled messages borrow the consumer).
    ticks: std::cell::RefCell<Ticks>,
    /// When the distinct tenants were last counted for the gauge.
    last_tenant_count: std::cell::Cell<Instant>,
}

/// One polled message: its partition, offset and event (`None`: rejected, or
/// discarded).
type Item<'a> = (i32, i64, Option<AccessEventRef<'a>>);

impl Worker {
    fn run(mut self, stop: &AtomicBool) {
        tracing::info!(topic = %self.config.topic, group = %self.config.group_id, "ingest started");
        let mut last_commit = Instant::now();
        let mut last_checkpoint = Instant::now();
        let mut pending = false;
        // Held apart from `self`: the polled messages borrow the consumer meanwhile.
        let mut observer = self.observer.take();
        while !stop.load(Ordering::Relaxed) {
            // Poll a batch. The messages stay in librdkafka's buffers: the events are
            // decoded from them in place (`AccessEventRef` borrows the payload).
            let mut messages: Vec<BorrowedMessage<'_>> = Vec::with_capacity(BATCH);
            // Wait for messages, but not past a partition's tick with events waiting.
            // Whole milliseconds: rdkafka waits in those, and spins through a
            // fraction left over.
            let mut timeout = self
                .ticks
                .borrow()
                .next_due(Instant::now())
                .map_or(POLL_WAIT, |due| {
                    Duration::from_millis(due.as_micros().div_ceil(1_000) as u64).min(POLL_WAIT)
                });
            while messages.len() < BATCH {
                let polled = self.consumer.poll(timeout);
                let revoked = self.consumer.context().take_revoked();
                if !revoked.is_empty() {
                    // Polled, not applied, and no longer ours: the next owner reads them
                    // from the offset committed on revoke.
                    let before = messages.len();
                    messages.retain(|m| !revoked.contains(&m.partition()));
                    let dropped = before - messages.len();
                    if dropped > 0 {
                        tracing::info!(
                            messages = dropped,
                            "discarded polled messages of revoked partitions"
                        );
                    }
                }
                let Some(result) = polled else { break };
                timeout = Duration::ZERO;
                match result {
                    Ok(m) => messages.push(m),
                    Err(e) => tracing::warn!(error = %e, "consume error; continuing"),
                }
            }
            let mut items: Vec<Item<'_>> = Vec::with_capacity(messages.len());
            if !messages.is_empty() {
                pending = true;
                // Replayed messages were already counted (and dead-lettered) by the
                // partition's previous owner.
                let live_from: BTreeMap<i32, i64> = {
                    let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
                    partitions
                        .states()
                        .iter()
                        .map(|(&p, s)| (p, s.live_from))
                        .collect()
                };
                for message in &messages {
                    let payload = message.payload().unwrap_or_default();
                    let (p, offset) = (message.partition(), message.offset());
                    match decode_event_ref(payload) {
                        Ok(event) => items.push((p, offset, Some(event))),
                        Err(e) => {
                            items.push((p, offset, None));
                            if live_from.get(&p).is_some_and(|l| offset >= *l) {
                                tracing::debug!(partition = p, offset, error = %e, "rejected");
                                self.reject(RejectReason::from(&e), message.key(), payload);
                            }
                        }
                    }
                }
            }
            // Idle rounds run the observer too: time-driven work (expiring
            // decisions) must not wait for traffic.
            self.apply(&items, observer.as_deref_mut());
            drop(items);
            drop(messages);
            if let Some((producer, _)) = &self.dead_letter {
                producer.poll(Duration::ZERO);
            }
            match &self.config.checkpoint {
                Some(_) if last_checkpoint.elapsed() >= self.config.checkpoint_interval => {
                    last_checkpoint = Instant::now();
                    if pending && self.checkpoint() {
                        pending = false;
                        self.commit();
                    }
                }
                None if pending && last_commit.elapsed() >= self.config.commit_interval => {
                    last_commit = Instant::now();
                    pending = false;
                    self.commit();
                }
                _ => {}
            }
        }
        // Shutdown: whatever was applied is checkpointed, then committed. Revokes
        // while the consumer closes commit again and keep the states for the handle.
        if self.config.checkpoint.is_none() || self.checkpoint() {
            self.commit();
        }
        self.consumer
            .context()
            .closing
            .store(true, Ordering::Release);
        if let Some((producer, _)) = &self.dead_letter {
            let _ = rdkafka::producer::Producer::flush(producer, Duration::from_secs(5));
        }
        tracing::info!("ingest stopped");
    }

    /// Applies the batch, run by run (one partition per run), under one write lock;
    /// then, under a read lock, feeds replayed events to their partition's tracker
    /// (no scoring) and runs the observer on each live partition's events.
    fn apply(&self, items: &[Item<'_>], observer: Option<&mut dyn BatchObserver>) {
        let observing = observer.is_some();
        let mut live: Vec<(i32, Vec<AccessEventRef<'_>>)> = Vec::new();
        let mut replayed: Vec<(i32, Vec<AccessEventRef<'_>>)> = Vec::new();
        if !items.is_empty() {
            let (mut applied, mut replays, mut stale) = (0u64, 0u64, 0u64);
            let mut refused = Vec::new();
            let now = self.config.clock.now_ms();
            {
                let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
                let predicting = observing && partitions.prediction_on();
                let mut rest = items;
                while let Some(&(p, _, _)) = rest.first() {
                    let len = rest.iter().take_while(|(q, _, _)| *q == p).count();
                    let (run, tail) = rest.split_at(len);
                    rest = tail;
                    let Some(state) = partitions.states_mut().get_mut(&p) else {
                        stale += run.len() as u64;
                        continue;
                    };
                    state.heat.set_clock(now);
                    let mut live_events = Vec::new();
                    let mut replay_events = Vec::new();
                    for (_, offset, event) in run {
                        // Applied already (a replay start before it, or a fetch
                        // repeated): never twice.
                        if *offset < state.next_offset {
                            stale += 1;
                            continue;
                        }
                        state.next_offset = offset + 1;
                        let Some(event) = event else { continue };
                        let replay = state.is_replay(*offset);
                        match state.heat.apply_ref(event) {
                            Ok(()) if replay => {
                                state.replayed += 1;
                                replays += 1;
                                if predicting {
                                    // Borrowed strings: a clone copies no text.
                                    replay_events.push(event.clone());
                                }
                            }
                            Ok(()) => {
                                state.applied += 1;
                                applied += 1;
                                if predicting {
                                    live_events.push(event.clone());
                                }
                            }
                            Err(e) if !replay => refused.push(RejectReason::from(e)),
                            Err(_) => {}
                        }
                    }
                    if !replay_events.is_empty() {
                        replayed.push((p, replay_events));
                    }
                    if !live_events.is_empty() {
                        live.push((p, live_events));
                    }
                }
                self.gauges(&partitions);
            }
            for reason in refused {
                self.metrics.reject(reason);
            }
            self.metrics.consumed.inc_by(applied);
            self.metrics.events_replayed.inc_by(replays);
            if stale > 0 {
                tracing::debug!(
                    messages = stale,
                    "skipped messages already applied or of partitions not owned"
                );
            }
        }
        self.count_tenants();
        let Some(observer) = observer else {
            return;
        };
        let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        for (p, events) in &replayed {
            let Some(state) = partitions.get(*p) else {
                continue;
            };
            if let Some(predictor) = &state.predictor {
                let mut predictor = predictor.lock().unwrap_or_else(|e| e.into_inner());
                for event in events {
                    predictor.observe(event);
                }
                predictor.warm(&state.heat, state.heat.now_ms());
            }
        }
        let mut events_of: HashMap<i32, &[AccessEventRef<'_>]> = HashMap::new();
        for (p, events) in &live {
            events_of.insert(*p, events);
        }
        let now = Instant::now();
        let mut ticks = self.ticks.borrow_mut();
        ticks.retain(|p| partitions.get(p).is_some_and(|s| !s.replaying()));
        for (p, state) in partitions.states() {
            // A replaying partition sends nothing: its previous owner acted already.
            if state.replaying() {
                continue;
            }
            if let Some(events) = events_of.get(p) {
                observer.observe(state, events);
                ticks.events(*p, now);
            }
            if let Some(since) = ticks.take_due(*p, state.heat.now_ms(), now) {
                observer.tick(state, since);
            }
        }
    }

    /// The distinct tenants of the owned partitions and the sketches' memory, for the
    /// gauges. A tenant is in every partition it has keys in: both visit them all, so
    /// once a second (idle rounds included) rather than per batch.
    fn count_tenants(&self) {
        if self.last_tenant_count.get().elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last_tenant_count.set(Instant::now());
        let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        let tenants: HashSet<&str> = partitions
            .states()
            .values()
            .flat_map(|s| s.heat.tenant_ids())
            .collect();
        self.metrics.tenants.set(tenants.len() as i64);
        // Memory walks every tenant of every partition: once a second too.
        self.metrics
            .sketch_bytes
            .set(partitions.memory_bytes() as i64);
    }

    fn gauges(&self, partitions: &crate::partition::Partitions) {
        let mut evicted = 0;
        for s in partitions.states().values() {
            evicted += s.heat.evictions();
        }
        let counted = self.metrics.tenants_evicted.get();
        if evicted > counted {
            self.metrics.tenants_evicted.inc_by(evicted - counted);
        }
    }

    fn reject(&self, reason: RejectReason, key: Option<&[u8]>, payload: &[u8]) {
        self.metrics.reject(reason);
        let Some((producer, topic)) = &self.dead_letter else {
            return;
        };
        let headers = OwnedHeaders::new().insert(Header {
            key: "pulse-reject-reason",
            value: Some(reason.as_str()),
        });
        let mut record: BaseRecord<'_, [u8], [u8]> =
            BaseRecord::to(topic).payload(payload).headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        match producer.send(record) {
            Ok(()) => {
                self.metrics.dead_lettered.inc();
            }
            Err((e, _)) => {
                tracing::warn!(error = %e, "dead-letter send failed; message dropped");
            }
        }
    }

    /// Writes the checkpoint (every owned partition with its offset); true when it
    /// is on disk.
    fn checkpoint(&self) -> bool {
        let Some(path) = &self.config.checkpoint else {
            return false;
        };
        let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        match checkpoint::save(path, &self.config.topic, &partitions) {
            Ok(()) => {
                self.metrics.checkpoints.inc();
                tracing::debug!(path = %path.display(), "checkpoint written");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed; offsets not committed");
                false
            }
        }
    }

    /// Commits each owned partition's applied offset, never below where it went live
    /// (a replaying partition is left alone), synchronously: a few milliseconds per
    /// interval on this thread, and the outcome is known (and logged) before ingest
    /// goes on.
    fn commit(&mut self) {
        let mut tpl = TopicPartitionList::new();
        {
            let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
            for (&p, s) in partitions.states() {
                if s.replaying()
                    || s.next_offset <= 0
                    || self.committed.get(&p) == Some(&s.next_offset)
                {
                    continue;
                }
                add_commit(&mut tpl, &self.config.topic, s);
            }
        }
        if tpl.count() == 0 {
            tracing::debug!("nothing new to commit");
            return;
        }
        self.metrics.commits.inc();
        match self.consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                tracing::info!(offsets = %describe(&tpl), "offsets committed");
                for e in tpl.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        self.committed.insert(e.partition(), o);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, offsets = %describe(&tpl), "commit failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit carries the partition's watermark; the next owner reads it back, and
    /// anything else (another client's metadata, none) is no watermark.
    #[test]
    fn a_commit_carries_the_partition_watermark() {
        let mut heat = crate::heat::HeatMap::new(crate::heat::HeatConfig::default());
        heat.set_clock(u64::MAX);
        let mut partitions = crate::partition::Partitions::heat_only(2);
        partitions.assign(1, Some(heat), 0, 0);
        let state = partitions.states_mut().get_mut(&1).unwrap();
        state.next_offset = 42;
        let event = models::AccessEvent::new(
            1_764_470_000_123,
            models::TenantId::new("acme").unwrap(),
            models::CacheKey::new("/a").unwrap(),
            models::RegionId::new("eu-west").unwrap(),
            models::NodeId::new("edge-1").unwrap(),
            models::Outcome::Hit,
        );
        state.heat.apply(&event).unwrap();
        let mut tpl = TopicPartitionList::new();
        add_commit(&mut tpl, "events", &partitions.states()[&1]);
        let entry = tpl.find_partition("events", 1).unwrap();
        assert_eq!(entry.offset(), Offset::Offset(42));
        assert_eq!(
            committed_watermark(entry.metadata()),
            Some(1_764_470_000_123)
        );
        for other in [
            "",
            "watermark_ms=",
            "watermark_ms=soon",
            "owner=a",
            "watermark_ms=0",
        ] {
            assert_eq!(committed_watermark(other), None, "{other:?}");
        }
    }

    /// Where an assigned partition starts, for each combination of committed offset,
    /// snapshot and replay window.
    #[test]
    fn a_partition_replays_up_to_its_committed_offset() {
        // Committed, no snapshot: replay the window, clamped to the committed offset.
        assert_eq!(
            start_of(Some(100), None, Some(40)),
            Start {
                replay_from: Some(40),
                live_from: 100
            }
        );
        assert_eq!(
            start_of(Some(100), None, Some(i64::MAX)),
            Start {
                replay_from: Some(100),
                live_from: 100
            }
        );
        // The window lookup failed: nothing replayed.
        assert_eq!(
            start_of(Some(100), None, None),
            Start {
                replay_from: Some(100),
                live_from: 100
            }
        );
        // A snapshot behind the committed offset: replay from it, or from the window
        // when the snapshot is older than the window.
        assert_eq!(
            start_of(Some(100), Some(70), Some(40)),
            Start {
                replay_from: Some(70),
                live_from: 100
            }
        );
        assert_eq!(
            start_of(Some(100), Some(10), Some(40)),
            Start {
                replay_from: Some(40),
                live_from: 100
            }
        );
        assert_eq!(
            start_of(Some(100), Some(70), None),
            Start {
                replay_from: Some(70),
                live_from: 100
            }
        );
        // A snapshot ahead of it: live from the snapshot.
        assert_eq!(
            start_of(Some(100), Some(120), Some(40)),
            Start {
                replay_from: Some(120),
                live_from: 120
            }
        );
        // Nothing committed, no snapshot: from the beginning, all live.
        assert_eq!(
            start_of(None, None, Some(40)),
            Start {
                replay_from: None,
                live_from: 0
            }
        );
    }
}
