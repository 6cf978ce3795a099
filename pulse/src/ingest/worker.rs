//! The partition worker loop on the ingest thread (see the [module
//! documentation](super)): poll a batch, decode it in place, apply it run by run
//! under one write lock, run the observer (replayed events to the trackers, live ones
//! to the predictor, ticks when due), and checkpoint and commit on their intervals.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use models::{AccessEventRef, decode_event_ref};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord};
use rdkafka::{Offset, TopicPartitionList};

use super::commit::{add_commit, commit_failed};
use super::rebalance::{IngestContext, describe};
use super::{BATCH, BatchObserver, IngestConfig, POLL_WAIT};
use crate::checkpoint;
use crate::metrics::{Metrics, PartitionerLabel};
use crate::partition::SharedPartitions;
use crate::reject::RejectReason;
use crate::ticks::Ticks;

pub(super) struct Worker {
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
    pub(super) fn new(
        consumer: BaseConsumer<IngestContext>,
        dead_letter: Option<(BaseProducer, String)>,
        config: IngestConfig,
        partitions: SharedPartitions,
        metrics: Arc<Metrics>,
        observer: Option<Box<dyn BatchObserver>>,
    ) -> Self {
        Worker {
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
        }
    }

    pub(super) fn run(mut self, stop: &AtomicBool) {
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
                    Ok(m) => {
                        self.consumer
                            .context()
                            .waiting_for_topic
                            .store(false, Ordering::Relaxed);
                        messages.push(m)
                    }
                    Err(e) => {
                        let reason = crate::kafka::error_kind(&e);
                        if reason == "end_of_partition" {
                            // Not an error: librdkafka says it has caught up.
                            continue;
                        }
                        self.metrics
                            .consume_errors
                            .get_or_create(&crate::metrics::ReasonLabel { reason })
                            .inc();
                        if reason == "unknown_topic" {
                            // Not created yet (pulse creates it at start where it
                            // may): said once, counted each time.
                            crate::kafka::log_client_error(
                                &e,
                                "the events topic",
                                &self.consumer.context().waiting_for_topic,
                            );
                        } else if reason == "authentication" {
                            tracing::error!(error = %e, "the broker refused pulse's credentials (--kafka-property sasl.*); continuing");
                        } else if reason == "tls" {
                            tracing::error!(error = %e, "the TLS handshake with the broker failed (--kafka-property ssl.*); continuing");
                        } else {
                            tracing::warn!(error = %e, "consume error; continuing");
                        }
                    }
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
            if !messages.is_empty() {
                // Where the producers put each key: which partitioner they use.
                let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
                for message in &messages {
                    if let Some(key) = message.key() {
                        partitions.observe_key(key, message.partition());
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
    fn apply(&self, items: &[Item<'_>], mut observer: Option<&mut dyn BatchObserver>) {
        let observing = observer.is_some();
        let tick_now = Instant::now();
        let mut live: Vec<(i32, Vec<AccessEventRef<'_>>)> = Vec::new();
        let mut replayed: Vec<(i32, Vec<AccessEventRef<'_>>)> = Vec::new();
        if !items.is_empty() {
            let (mut applied, mut replays, mut stale) = (0u64, 0u64, 0u64);
            let mut refused = Vec::new();
            let now = self.config.clock.now_ms();
            {
                let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
                let predicting = observing && partitions.prediction_on();
                let mut ticks = self.ticks.borrow_mut();
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
                    // Live events before `observed` were handed to the observer by a
                    // tick on the event-time grid, mid-run (`crate::ticks`).
                    let mut observed = 0;
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
                        // Before the event that opens a new cell of event time, whatever
                        // the batch: the ticks follow the events alone. (A run that
                        // ends a replay ticks after it, on the wall-time rule.)
                        let opens_cell = crate::ticks::cell(event.ts_ms)
                            > crate::ticks::cell(state.heat.now_ms());
                        if predicting && !replay && opens_cell && replay_events.is_empty() {
                            if let Some(observer) = observer.as_deref_mut() {
                                let state = &*state;
                                if live_events.len() > observed {
                                    observer.observe(state, &live_events[observed..]);
                                    observed = live_events.len();
                                    ticks.events(p, tick_now);
                                }
                                if let Some(since) =
                                    ticks.take_crossed(p, state.heat.now_ms(), tick_now)
                                {
                                    observer.tick(state, since);
                                }
                            }
                        }
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
                    live_events.drain(..observed);
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
        let ownership = partitions.ownership();
        let fitting = ownership.fitting();
        for (p, agreeing) in ownership.agreeing() {
            let name = PartitionerLabel { name: p.as_str() };
            self.metrics
                .partitioner_agreeing
                .get_or_create(&name)
                .set(agreeing as i64);
            self.metrics
                .partitioner
                .get_or_create(&name)
                .set(i64::from(fitting == Some(p)));
        }
        self.metrics
            .partitioner
            .get_or_create(&PartitionerLabel { name: "none" })
            .set(i64::from(fitting.is_none()));
        self.metrics.partitioner_pairs.set(ownership.pairs() as i64);
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
                add_commit(&mut tpl, &self.config.topic, s, &partitions);
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
            Err(e) => commit_failed(&e, &tpl),
        }
    }
}
