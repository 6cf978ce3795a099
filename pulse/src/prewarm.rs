//! The online half of prediction: after each ingested batch the [`PrewarmLoop`] feeds
//! each live partition's [`Predictor`](crate::Predictor), sends its commands to the
//! prewarm topic, and keeps the metrics; a [`Retrainer`] thread refits the model now
//! and then on the labelled decisions of every owned partition and swaps it into all
//! of them only if it is not worse.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use models::{AccessEventRef, PrewarmCommand, SIGNATURE_HEADER, Signer, encode};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::fleet::ModelPublisher;
use crate::ingest::BatchObserver;
use crate::kafka::KafkaClients;
use crate::metrics::{Metrics, ReasonLabel};
use crate::partition::{PartitionState, SharedPartitions};
use crate::predict::{DecisionCounts, HELD_OUT_SHARE, RetrainOutcome, next_generation, retrain};
use crate::stoppable::StoppableThread;

/// Sends commands to the prewarm topic without ever blocking the ingest thread: the
/// producer has a bounded queue and a full queue is counted, not waited on.
///
/// Its delivery reports are served by the sender, in passing ([`PrewarmPublisher::serve`]),
/// not by a thread of their own: rdkafka's polling thread (`ThreadedProducer`) spins
/// through the last millisecond of every 100 ms wait, about 1 % of a core per idle
/// producer, which is more than an idle pulse does otherwise.
///
/// With a [`Signer`] ([`PrewarmPublisher::with_signer`]) every command carries its
/// signature in the [`SIGNATURE_HEADER`] header: an HMAC of the exact payload bytes
/// sent, which edges holding the key check before they read the command.
pub struct PrewarmPublisher {
    producer: BaseProducer,
    topic: String,
    signer: Option<Signer>,
    /// Keyed by tenant alone: proposals to the fleet's gate (`crate::gate`).
    by_tenant: bool,
}

impl PrewarmPublisher {
    /// A producer for `topic`.
    pub fn new(kafka: &KafkaClients, topic: &str) -> Result<Self, KafkaError> {
        let producer = kafka
            .config(&[
                ("linger.ms", "1"),
                ("queue.buffering.max.messages", "10000"),
                ("message.timeout.ms", "10000"),
            ])
            .create()?;
        Ok(PrewarmPublisher {
            producer,
            topic: topic.to_owned(),
            signer: None,
            by_tenant: false,
        })
    }

    /// A producer of proposals to the gate's decisions topic, keyed by tenant so that
    /// one gate sees all of a tenant's, whichever partition decided them.
    pub(crate) fn to_gate(kafka: &KafkaClients, decisions_topic: &str) -> Result<Self, KafkaError> {
        Ok(PrewarmPublisher {
            by_tenant: true,
            ..PrewarmPublisher::new(kafka, decisions_topic)?
        })
    }

    /// Signs every command sent with `signer`'s key.
    pub fn with_signer(mut self, signer: Signer) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Queues one command, keyed by `tenant/key` (by tenant, to the gate; signed,
    /// with a signer).
    pub fn send(&self, command: &PrewarmCommand) -> Result<(), KafkaError> {
        let key = if self.by_tenant {
            command.tenant.to_string()
        } else {
            command.partition_key()
        };
        self.send_payload(&key, &encode(command))
    }

    /// Queues one purge command, keyed by `tenant/prefix`, signed as a pre-warm is.
    pub fn send_purge(&self, command: &models::PurgeCommand) -> Result<(), KafkaError> {
        self.send_payload(&command.partition_key(), &encode(command))
    }

    fn send_payload(&self, key: &str, payload: &[u8]) -> Result<(), KafkaError> {
        let record = BaseRecord::to(&self.topic).key(key).payload(payload);
        let record = match &self.signer {
            Some(signer) => record.headers(OwnedHeaders::new().insert(Header {
                key: SIGNATURE_HEADER,
                value: Some(&signer.sign(payload)),
            })),
            None => record,
        };
        self.producer.send(record).map_err(|(e, _)| e)
    }

    /// Serves the delivery reports that have arrived, without waiting.
    pub fn serve(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Waits up to `timeout` for queued commands to be delivered.
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

/// Runs on the ingest thread: feeds each live partition's predictor, proposes its
/// commands to the fleet's gate (which sends what the tenant's budget, cooldown and
/// dedupe admit).
pub(crate) struct PrewarmLoop {
    publisher: PrewarmPublisher,
    metrics: Arc<Metrics>,
    /// Each partition predictor's totals at its last batch.
    last: HashMap<i32, (DecisionCounts, u64)>,
}

impl PrewarmLoop {
    /// A loop that publishes the predictors' commands with `publisher`.
    pub(crate) fn new(publisher: PrewarmPublisher, metrics: Arc<Metrics>) -> Self {
        PrewarmLoop {
            publisher,
            metrics,
            last: HashMap::new(),
        }
    }

    /// Turns a partition predictor's cumulative totals into counter increments. A
    /// partition assigned again has a new predictor whose totals start at zero.
    fn count(&mut self, partition: i32, counts: DecisionCounts, scored: u64) {
        let m = &self.metrics;
        let (mut last, mut last_scored) = self.last.get(&partition).copied().unwrap_or_default();
        if counts.sent < last.sent || scored < last_scored {
            (last, last_scored) = Default::default();
        }
        m.prewarm_useful
            .inc_by(counts.useful.saturating_sub(last.useful));
        m.prewarm_wasted
            .inc_by(counts.wasted.saturating_sub(last.wasted));
        m.keys_scored.inc_by(scored - last_scored);
        for ((skip, now), (_, before)) in counts.skips().into_iter().zip(last.skips()) {
            if now > before {
                m.skip(skip, now - before);
            }
        }
        self.last.insert(partition, (counts, scored));
    }
}

impl BatchObserver for PrewarmLoop {
    fn observe(&mut self, partition: &PartitionState, events: &[AccessEventRef<'_>]) {
        if let Some(predictor) = &partition.predictor {
            let mut predictor = predictor.lock().unwrap_or_else(|e| e.into_inner());
            for event in events {
                predictor.observe(event);
            }
        }
    }

    fn tick(&mut self, partition: &PartitionState, since: Instant) {
        let Some(predictor) = &partition.predictor else {
            return;
        };
        let heat = &partition.heat;
        let (commands, counts, scored) = {
            let mut predictor = predictor.lock().unwrap_or_else(|e| e.into_inner());
            let commands = predictor.tick(heat, heat.now_ms());
            (commands, predictor.counts(), predictor.scored())
        };
        for command in &commands {
            match self.publisher.send(command) {
                Ok(()) => {
                    self.metrics.prewarm_proposed.inc();
                    tracing::debug!(
                        tenant = %command.tenant,
                        key = %command.key,
                        id = %command.id,
                        "pre-warm proposed"
                    );
                }
                Err(e) => {
                    self.metrics.prewarm_send_failed.inc();
                    tracing::warn!(error = %e, key = %command.key, "pre-warm not sent");
                }
            }
            self.metrics
                .decision_seconds
                .observe(since.elapsed().as_secs_f64());
        }
        self.publisher.serve();
        self.count(partition.partition, counts, scored);
    }
}

impl Drop for PrewarmLoop {
    fn drop(&mut self) {
        // The last commands of a shutdown still reach the edges.
        self.publisher.flush(Duration::from_secs(2));
    }
}

/// Refits the model every `interval` on the labelled samples of every owned
/// partition's predictor. With a model topic, only the instance that owns partition 0
/// trains, and a model it keeps is published for the whole fleet (every instance's
/// watcher, its own included, puts it in use); without one, it is put in use here.
pub(crate) struct Retrainer {
    thread: StoppableThread,
}

/// The owner of this partition of the events topic trains the fleet's model.
pub(crate) const FLEET_TRAINER_PARTITION: i32 = 0;

impl Retrainer {
    /// Starts the retrain thread.
    pub(crate) fn start(
        partitions: SharedPartitions,
        interval: Duration,
        threshold: f64,
        metrics: Arc<Metrics>,
        fleet: Option<ModelPublisher>,
    ) -> Self {
        let thread = StoppableThread::spawn("pulse-retrain", move |stop| {
            let mut next = Instant::now() + interval;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if Instant::now() < next {
                    continue;
                }
                next = Instant::now() + interval;
                let trains_here = fleet.is_none()
                    || partitions
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(FLEET_TRAINER_PARTITION)
                        .is_some();
                let outcome = if trains_here {
                    retrain_once(&partitions, threshold, fleet.as_ref())
                } else {
                    "elsewhere"
                };
                if outcome == "replaced" {
                    metrics.model_put_in_use();
                }
                metrics
                    .retrains
                    .get_or_create(&ReasonLabel { reason: outcome })
                    .inc();
            }
        });
        Retrainer { thread }
    }

    /// Stops the thread and waits for it (dropping it does the same).
    pub(crate) fn stop(self) {
        self.thread.stop();
    }
}

/// One retrain: copy every partition's samples out under the locks, fit outside
/// them, and put a model that is not worse in use: published to the fleet with
/// `fleet`, else set on every partition here. Returns the outcome's metric label.
pub(crate) fn retrain_once(
    partitions: &SharedPartitions,
    threshold: f64,
    fleet: Option<&ModelPublisher>,
) -> &'static str {
    let (current, samples) = {
        let partitions = partitions.read().unwrap_or_else(|e| e.into_inner());
        let Some(model) = partitions.model().cloned() else {
            return "not_enough_data";
        };
        let mut samples = Vec::new();
        for state in partitions.states().values() {
            if let Some(p) = &state.predictor {
                let p = p.lock().unwrap_or_else(|e| e.into_inner());
                samples.extend(p.samples().cloned());
            }
        }
        (model, samples)
    };
    let options = next_generation(&current, threshold, crate::clock::wall_clock_ms());
    match retrain(&current, &samples, HELD_OUT_SHARE, &options) {
        RetrainOutcome::Replace {
            model,
            current,
            candidate,
        } => {
            tracing::info!(
                model = %model.name,
                precision = candidate.precision(),
                recall = candidate.recall(),
                was_precision = current.precision(),
                was_recall = current.recall(),
                "retrained model is not worse on held-out samples: replacing"
            );
            match fleet {
                Some(publisher) => match publisher.publish_blocking(&model) {
                    Ok(_) => "published",
                    Err(e) => {
                        tracing::warn!(error = %e, "retrained model not published; the fleet keeps the current one");
                        "publish_failed"
                    }
                },
                None => {
                    partitions
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .set_model(Arc::new(*model));
                    "replaced"
                }
            }
        }
        RetrainOutcome::Keep { current, candidate } => {
            tracing::info!(
                precision = candidate.precision(),
                recall = candidate.recall(),
                was_precision = current.precision(),
                was_recall = current.recall(),
                "retrained model is worse on held-out samples: keeping the current one"
            );
            "kept"
        }
        RetrainOutcome::NotEnoughData(why) => {
            tracing::debug!(%why, "not retrained");
            "not_enough_data"
        }
    }
}
