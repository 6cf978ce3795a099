//! The rebalance protocol of the ingest consumer (see the [module
//! documentation](super)): assign (where each partition starts, its replay bounds),
//! revoke (commit, unassign, drop or park the state), and the watermark each commit
//! carries.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::commit::{add_commit, commit_failed, committed_partition_counts, committed_watermark};
use super::{Clock, IngestConfig};
use crate::metrics::Metrics;
use crate::partition::{Partitions, SharedPartitions};

/// Runs the rebalances (see the module documentation), logs commits, and turns
/// statistics into the lag gauge.
pub(super) struct IngestContext {
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
    pub(super) closing: AtomicBool,
    /// Set once "waiting for the topic" was logged; cleared when a message comes.
    pub(super) waiting_for_topic: AtomicBool,
}

pub(super) fn describe(tpl: &TopicPartitionList) -> String {
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
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::log_client_error(&error, reason, &self.waiting_for_topic);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        // Parse only what we need: the mock cluster omits fields the typed struct wants.
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(statistics) else {
            return;
        };
        let mut lag = 0i64;
        let mut ends = Vec::new();
        let mut topic_partitions = 0;
        for topic in v["topics"].as_object().into_iter().flat_map(|t| t.values()) {
            let ours = topic["topic"].as_str() == Some(self.topic.as_str());
            for (id, p) in topic["partitions"].as_object().into_iter().flatten() {
                if id == "-1" {
                    continue;
                }
                // The client's metadata (refreshed every second) lists the topic's
                // partitions; one it was asked for but the cluster does not know is
                // flagged `unknown`.
                if let (true, false, Ok(partition)) =
                    (ours, p["unknown"] == true, id.parse::<i32>())
                {
                    topic_partitions = topic_partitions.max(partition + 1);
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
        self.grow(&mut partitions, topic_partitions);
        // A count the topic had before a growth is kept while a replay could still
        // reach the events keyed under it.
        let replay_ms = self.replay.as_millis() as u64;
        partitions.forget_partition_counts(self.clock.now_ms().saturating_sub(replay_ms));
        for (partition, high) in ends {
            partitions.set_high_watermark(partition, high);
        }
        let grace_ms = partitions.longest_lateness_grace_ms();
        self.metrics.lateness_grace_ms.set(grace_ms as i64);
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
            Err(e) => commit_failed(&e, offsets),
        }
    }
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
    pub(super) fn new(
        config: &IngestConfig,
        partitions: SharedPartitions,
        metrics: Arc<Metrics>,
    ) -> Self {
        IngestContext {
            metrics,
            topic: config.topic.clone(),
            partitions,
            clock: config.clock.clone(),
            replay: config.replay,
            revoked: Mutex::new(Vec::new()),
            any_revoked: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            waiting_for_topic: AtomicBool::new(false),
        }
    }

    /// Records that the topic has `count` partitions, when that is more than known:
    /// from then on an answer is complete only when the new partitions are owned too,
    /// and keys are looked up under the old count and the new one.
    fn grow(&self, partitions: &mut Partitions, count: i32) {
        let was = partitions.partition_count();
        if !partitions.grow(count, self.clock.now_ms()) {
            return;
        }
        if was > 0 {
            tracing::info!(
                topic = %self.topic,
                was,
                partitions = count,
                "the topic grew: answers are incomplete until its new partitions are owned and live"
            );
        }
    }

    /// The partitions revoked since the last call: their polled messages go.
    pub(super) fn take_revoked(&self) -> Vec<i32> {
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
        // Asked at every assignment: a topic that grew is counted anew.
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
        .max(known)
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
        // Every partition's commit, for the partition counts the group has recorded
        // (a member that joins after a growth learns where keys lived before); ours
        // for where they start.
        let mut query = TopicPartitionList::new();
        for p in 0..count {
            query.add_partition(&self.topic, p);
        }
        let mut watermarks = HashMap::new();
        let mut histories = Vec::new();
        let committed: HashMap<i32, i64> = match consumer
            .committed_offsets(query, Duration::from_secs(10))
        {
            Ok(list) => list
                .elements()
                .iter()
                .inspect(|e| {
                    histories.extend(committed_partition_counts(e.metadata()).map(str::to_owned))
                })
                .filter(|e| ours.contains(&e.partition()))
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
        self.grow(&mut partitions, count);
        for history in &histories {
            partitions.learn_partition_counts(history, now);
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
            let (heat, calibration, traffic) = snapshot.map_or((None, None, None), |s| {
                (Some(s.heat), s.calibration, s.traffic)
            });
            let state = partitions.assign(p, heat, start.replay_from.unwrap_or(0), start.live_from);
            if let Some(saved) = calibration {
                let restored = state.restore_calibration(saved);
                tracing::info!(
                    partition = p,
                    restored,
                    "online calibration from the checkpoint"
                );
            }
            if let Some(saved) = traffic {
                let paces = state.restore_traffic(saved);
                tracing::info!(partition = p, paces, "paces and trust from the checkpoint");
            }
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
        // A member that gains no partition in a cooperative rebalance asks for none:
        // the broker would refuse an empty list.
        if since.is_empty() {
            return HashMap::new();
        }
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
                        add_commit(&mut commit, &self.topic, s, &partitions);
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
                Err(e) => commit_failed(&e, &commit),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::commit::logged;

    /// A member that gains no partition asks no offsets for the replay window (the
    /// broker refuses an empty list, which logged a warning in every rebalance).
    #[test]
    fn no_partition_gained_asks_no_replay_offsets() {
        let config = IngestConfig::new(crate::kafka::KafkaClients::new("127.0.0.1:1"));
        let context = IngestContext::new(
            &config,
            crate::partition::Partitions::heat_only(2).shared(),
            Arc::new(Metrics::new()),
        );
        let consumer: BaseConsumer<IngestContext> = config
            .kafka
            .config(&[("group.id", "pulse-test")])
            .create_with_context(context)
            .unwrap();
        let lines = logged(|| {
            let offsets = consumer
                .context()
                .window_offsets(&consumer, &HashMap::new());
            assert!(offsets.is_empty());
        });
        assert!(!lines.contains(" WARN "), "{lines}");
    }

    /// The client's statistics (every second, from metadata refreshed every second)
    /// tell the topic's partition count: a growth is taken at once, keys are then
    /// routed under both counts, and a partition the cluster does not know, another
    /// topic or a smaller count changes nothing.
    #[test]
    fn statistics_tell_a_growth() {
        let mut config = IngestConfig::new(crate::kafka::KafkaClients::new("127.0.0.1:1"));
        config.topic = "events".into();
        let partitions = crate::partition::Partitions::heat_only(4).shared();
        let context = IngestContext::new(&config, partitions.clone(), Arc::new(Metrics::new()));
        let stats = |topic: &str, known: i32, unknown: &[i32]| {
            let mut parts = serde_json::Map::new();
            parts.insert("-1".into(), serde_json::json!({"partition": -1}));
            for p in 0..known {
                parts.insert(
                    p.to_string(),
                    serde_json::json!({"unknown": false, "hi_offset": 5}),
                );
            }
            for p in unknown {
                parts.insert(p.to_string(), serde_json::json!({"unknown": true}));
            }
            serde_json::json!({"topics": {topic: {"topic": topic, "partitions": parts}}})
                .to_string()
        };
        let count = || partitions.read().unwrap().partition_count();
        context.stats_raw(stats("events", 4, &[9]).as_bytes());
        assert_eq!(count(), 4, "a partition the cluster does not know");
        context.stats_raw(stats("other", 8, &[]).as_bytes());
        assert_eq!(count(), 4, "another topic");
        let lines = logged(|| context.stats_raw(stats("events", 6, &[]).as_bytes()));
        assert_eq!(count(), 6);
        assert!(
            lines.contains(" INFO ") && lines.contains("grew"),
            "{lines}"
        );
        let key = b"acme/k/1";
        let by = |n| crate::fleet::partition_for_key(key, n);
        let mut observed = partitions.write().unwrap();
        for i in 0..crate::fleet::MIN_PAIRS {
            let k = format!("acme/k/{i}");
            observed.observe_key(
                k.as_bytes(),
                crate::fleet::partition_for_key(k.as_bytes(), 6),
            );
        }
        let mut both = vec![by(4), by(6)];
        both.sort_unstable();
        both.dedup();
        assert_eq!(observed.ownership().route(key), Some(both));
        drop(observed);
        context.stats_raw(stats("events", 5, &[]).as_bytes());
        assert_eq!(count(), 6, "a topic never shrinks");
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
