//! The fleet's command gate: one budget, one cooldown and one dedupe per tenant for
//! every instance, held through rebalances and crashes, on Kafka alone (the shape of
//! a Kafka Streams repartition: state keyed by tenant moves through a topic keyed by
//! tenant).
//!
//! Each partition's predictor decides as before, but its commands are *proposals*:
//! they go to the decisions topic, keyed by tenant ([`PrewarmPublisher::to_gate`]).
//! Every instance runs a [`Gate`]: a consumer in a group of its own (`{group}.gate`)
//! on the decisions topic, so each tenant's proposals, whichever partition of the
//! events topic made them, reach exactly one gate at a time. The gate applies the
//! tenant's [`TenantGate`] (token bucket, per-key cooldown, ids already sent) and
//! sends what it admits to the prewarm topic, signed.
//!
//! The state of decisions partition `p` is kept in partition `p` of a compacted state
//! topic, one record per tenant, written after every change. A gate that is given a
//! partition reads that partition of the state topic to its end before it decides on
//! any of its proposals, so a move or a crash neither refills a bucket nor forgets a
//! cooldown or an id. The order of a batch is: state records (and their delivery),
//! then the admitted commands (and theirs), then the decisions' offsets: a crash
//! between the first and the second loses the batch's commands (a pre-warm is a hint),
//! and never sends one twice; a crash before the offsets are committed replays the
//! batch's proposals, and the state written refuses them (`duplicate` or `cooldown`).
//!
//! What it does not cover: a gate that lost its partition without knowing it (stalled
//! past the session timeout) still writes for a moment beside the new owner, as a
//! Kafka Streams task without exactly-once does.

mod state;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use models::{PrewarmCommand, TenantId, decode};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::kafka::{KafkaClients, log_client_error};
use crate::metrics::Metrics;
use crate::predict::Skip;
use crate::prewarm::PrewarmPublisher;
use crate::stoppable::StoppableThread;

pub(crate) use state::{Admission, GateRules, TenantGate};

/// The topics the gate reads and writes.
#[derive(Debug, Clone)]
pub(crate) struct GateTopics {
    /// Proposals, keyed by tenant.
    pub decisions: String,
    /// The compacted state, one record per tenant.
    pub state: String,
    /// The group the gates share.
    pub group: String,
}

/// Most proposals decided in one batch.
const BATCH: usize = 500;
/// Bound on a batch's state and commands reaching the broker.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on reading a partition of the state topic to its end.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(20);
/// Reads of a partition's state tried before its proposals are refused.
const RESTORE_ATTEMPTS: u32 = 3;

/// Counts the group's rebalances: state loaded before the last one may be stale.
struct GateContext {
    rebalances: AtomicU64,
    waiting: AtomicBool,
}

impl ClientContext for GateContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason, &self.waiting);
    }
}

impl ConsumerContext for GateContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.rebalances.fetch_add(1, Ordering::SeqCst);
        tracing::debug!(?rebalance, "gate rebalance");
    }
}

/// Counts the state records the broker did not take: their batch's commands are not
/// sent (a flush returns once every record is settled, delivered or not).
#[derive(Default)]
struct StateDeliveries {
    failed: AtomicU64,
    waiting: AtomicBool,
}

impl ClientContext for StateDeliveries {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason, &self.waiting);
    }
}

impl ProducerContext for StateDeliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(error = %e, "gate: a state record was not written");
        }
    }
}

/// The gate's thread.
pub(crate) struct Gate {
    thread: StoppableThread,
}

impl Gate {
    /// Joins the gate group and starts deciding.
    pub(crate) fn start(
        kafka: &KafkaClients,
        topics: GateTopics,
        rules: GateRules,
        publisher: PrewarmPublisher,
        metrics: Arc<Metrics>,
    ) -> Result<Self, KafkaError> {
        let context = GateContext {
            rebalances: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
        };
        let consumer: BaseConsumer<GateContext> = kafka
            .config(&[
                ("group.id", &topics.group),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                // A new group decides on every proposal kept: the state refuses repeats.
                ("auto.offset.reset", "earliest"),
                ("enable.partition.eof", "false"),
                // A dead instance's tenants move within seconds, as its partitions do.
                ("session.timeout.ms", "6000"),
            ])
            .create_with_context(context)?;
        consumer.subscribe(&[&topics.decisions])?;
        let state_producer: BaseProducer<StateDeliveries> = kafka
            .config(&[("linger.ms", "1"), ("acks", "all")])
            .create_with_context(StateDeliveries::default())?;
        let restorer: BaseConsumer = kafka
            .config(&[
                ("group.id", &format!("{}.restore", topics.group)),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "false"),
            ])
            .create()?;
        let mut stage = Stage {
            consumer,
            state_producer,
            restorer,
            publisher,
            topics,
            rules,
            metrics,
            loaded: HashMap::new(),
            loaded_at: 0,
        };
        let thread = StoppableThread::spawn("pulse-gate", move |stop| stage.run(stop));
        Ok(Gate { thread })
    }

    /// Decides on what is left (briefly), commits, and stops.
    pub(crate) fn stop(self) {
        self.thread.stop();
    }
}

struct Stage {
    consumer: BaseConsumer<GateContext>,
    state_producer: BaseProducer<StateDeliveries>,
    restorer: BaseConsumer,
    publisher: PrewarmPublisher,
    topics: GateTopics,
    rules: GateRules,
    metrics: Arc<Metrics>,
    /// Per decisions partition: its tenants' state, read from the state topic.
    loaded: HashMap<i32, HashMap<TenantId, TenantGate>>,
    /// The rebalance count `loaded` was read under.
    loaded_at: u64,
}

impl Stage {
    fn run(&mut self, stop: &AtomicBool) {
        let mut draining_until = None;
        loop {
            if stop.load(Ordering::Relaxed) && draining_until.is_none() {
                // What ingest proposed last still goes out (a shutdown's last ticks).
                draining_until = Some(Instant::now() + Duration::from_secs(2));
            }
            let batch = self.poll_batch();
            if batch.is_empty() && draining_until.is_some() {
                break;
            }
            if draining_until.is_some_and(|until| Instant::now() > until) {
                self.decide(batch);
                break;
            }
            self.decide(batch);
        }
    }

    /// Proposals polled under one assignment: a rebalance in the middle drops what
    /// came before it (uncommitted; whoever owns those partitions now decides them).
    fn poll_batch(&mut self) -> Vec<(i32, i64, Option<PrewarmCommand>)> {
        let mut batch = Vec::new();
        let started = self.consumer.context().rebalances.load(Ordering::SeqCst);
        let mut wait = Duration::from_millis(100);
        while batch.len() < BATCH {
            let Some(message) = self.consumer.poll(wait) else {
                break;
            };
            wait = Duration::from_millis(2);
            if self.consumer.context().rebalances.load(Ordering::SeqCst) != started {
                return Vec::new();
            }
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "gate: reading the decisions topic");
                    break;
                }
            };
            let proposal = decode::<PrewarmCommand>(message.payload().unwrap_or_default()).ok();
            batch.push((message.partition(), message.offset(), proposal));
        }
        if self.consumer.context().rebalances.load(Ordering::SeqCst) != started {
            return Vec::new();
        }
        batch
    }

    fn decide(&mut self, batch: Vec<(i32, i64, Option<PrewarmCommand>)>) {
        if batch.is_empty() {
            return;
        }
        let rebalances = self.consumer.context().rebalances.load(Ordering::SeqCst);
        if rebalances != self.loaded_at {
            self.loaded.clear();
            self.loaded_at = rebalances;
        }
        let mut changed: BTreeSet<(i32, TenantId)> = BTreeSet::new();
        let mut admitted = Vec::new();
        let mut offsets: HashMap<i32, i64> = HashMap::new();
        for (partition, offset, proposal) in batch {
            offsets.insert(partition, offset + 1);
            let Some(command) = proposal else {
                self.count("invalid");
                continue;
            };
            let rules = self.rules;
            let Some(tenants) = self.tenants(partition) else {
                self.count("state_unavailable");
                continue;
            };
            let admission = tenants
                .entry(command.tenant.clone())
                .or_insert_with(|| TenantGate::fresh(&rules, command.issued_at_ms))
                .admit(&rules, &command);
            self.count(admission.as_str());
            if admission != Admission::Duplicate {
                // Its id is remembered, whatever became of it.
                changed.insert((partition, command.tenant.clone()));
            }
            match admission {
                Admission::Admitted => admitted.push(command),
                Admission::Cooldown => self.metrics.skip(Skip::Cooldown, 1),
                Admission::OverBudget => self.metrics.skip(Skip::OverBudget, 1),
                Admission::Duplicate => {}
            }
        }
        if self.write_state(&changed) {
            self.send(&admitted);
        } else {
            // The state may not be on the broker: sending could repeat after a crash.
            self.metrics
                .prewarm_send_failed
                .inc_by(admitted.len() as u64);
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, next) in offsets {
            let _ =
                tpl.add_partition_offset(&self.topics.decisions, partition, Offset::Offset(next));
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
            tracing::warn!(error = %e, "gate: committing the decisions' offsets");
        }
    }

    fn count(&self, outcome: &'static str) {
        self.metrics.gate_outcome(outcome);
    }

    /// The tenants of decisions partition `partition`, read from the state topic the
    /// first time it is asked for under this assignment; `None` when the state topic
    /// cannot be read (nothing of the partition is admitted then: an empty state would
    /// refill every bucket).
    fn tenants(&mut self, partition: i32) -> Option<&mut HashMap<TenantId, TenantGate>> {
        if !self.loaded.contains_key(&partition) {
            let mut restored = None;
            for attempt in 1..=RESTORE_ATTEMPTS {
                match self.restore(partition) {
                    Ok(tenants) => {
                        restored = Some(tenants);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(partition, attempt, error = %e, "gate: its state could not be read");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            }
            let restored = restored?;
            tracing::info!(
                partition,
                tenants = restored.len(),
                "gate: took over a decisions partition with its state"
            );
            self.loaded.insert(partition, restored);
        }
        self.loaded.get_mut(&partition)
    }

    /// Partition `partition` of the state topic, to its end: the last record per tenant.
    fn restore(&self, partition: i32) -> Result<HashMap<TenantId, TenantGate>, KafkaError> {
        let topic = &self.topics.state;
        let (low, high) =
            self.restorer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        let mut tenants = HashMap::new();
        if high <= low {
            return Ok(tenants);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
        self.restorer.assign(&tpl)?;
        let deadline = Instant::now() + RESTORE_TIMEOUT;
        let mut next = low;
        while next < high {
            if Instant::now() > deadline {
                return Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                ));
            }
            let Some(message) = self.restorer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = message?;
            next = message.offset() + 1;
            let tenant = message
                .key()
                .and_then(|k| std::str::from_utf8(k).ok())
                .and_then(|k| TenantId::new(k).ok());
            let state = message.payload().and_then(TenantGate::from_record);
            match (tenant, state) {
                (Some(tenant), Some(state)) => {
                    tenants.insert(tenant, state);
                }
                _ => self.count("invalid"),
            }
        }
        self.restorer.unassign()?;
        Ok(tenants)
    }

    /// Writes the changed tenants' state and waits for the broker to have it.
    fn write_state(&self, changed: &BTreeSet<(i32, TenantId)>) -> bool {
        if changed.is_empty() {
            return true;
        }
        let failed_before = self.state_producer.context().failed.load(Ordering::SeqCst);
        for (partition, tenant) in changed {
            let record = self.loaded[partition][tenant].to_record();
            let sent = self.state_producer.send(
                BaseRecord::to(&self.topics.state)
                    .partition(*partition)
                    .key(tenant.as_str())
                    .payload(&record),
            );
            if let Err((e, _)) = sent {
                tracing::warn!(error = %e, "gate: state not written; the batch's commands are dropped");
                return false;
            }
        }
        match self.state_producer.flush(DELIVERY_TIMEOUT) {
            Ok(()) => self.state_producer.context().failed.load(Ordering::SeqCst) == failed_before,
            Err(e) => {
                tracing::warn!(error = %e, "gate: state not confirmed; the batch's commands are dropped");
                false
            }
        }
    }

    fn send(&self, admitted: &[PrewarmCommand]) {
        for command in admitted {
            match self.publisher.send(command) {
                Ok(()) => {
                    self.metrics.prewarm_sent.inc();
                    tracing::info!(
                        tenant = %command.tenant,
                        key = %command.key,
                        id = %command.id,
                        confidence = command.confidence,
                        regions = ?command.regions,
                        "pre-warm sent"
                    );
                }
                Err(e) => {
                    self.metrics.prewarm_send_failed.inc();
                    tracing::warn!(error = %e, key = %command.key, "pre-warm not sent");
                }
            }
        }
        self.publisher.flush(DELIVERY_TIMEOUT);
    }
}
