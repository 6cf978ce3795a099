//! The online half of prediction: after each ingested batch the [`PrewarmLoop`] feeds
//! the [`Predictor`], sends its commands to the prewarm topic, and keeps the metrics;
//! a [`Retrainer`] thread refits the model now and then on the predictor's own
//! labelled decisions and swaps it in only if it is not worse.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use models::{AccessEventRef, PrewarmCommand, encode};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use crate::heat::HeatMap;
use crate::ingest::BatchObserver;
use crate::metrics::{Metrics, ReasonLabel};
use crate::predict::{DecisionCounts, Predictor, RetrainOutcome, TrainOptions, retrain};
use crate::stoppable::StoppableThread;

/// The predictor, shared by the ingest thread (which feeds it), the retrainer and the
/// API (which read it). A `std` lock: every critical section is short and none spans
/// an `.await`.
pub type SharedPredictor = Arc<Mutex<Predictor>>;

/// Sends commands to the prewarm topic without ever blocking the ingest thread: the
/// producer has a bounded queue and a full queue is counted, not waited on.
pub struct PrewarmPublisher {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl PrewarmPublisher {
    /// A producer for `topic` on `brokers`.
    pub fn new(brokers: &str, topic: &str) -> Result<Self, KafkaError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "1")
            .set("queue.buffering.max.messages", "10000")
            .set("message.timeout.ms", "10000")
            .create()?;
        Ok(PrewarmPublisher {
            producer,
            topic: topic.to_owned(),
        })
    }

    /// Queues one command, keyed by `tenant/key`.
    pub fn send(&self, command: &PrewarmCommand) -> Result<(), KafkaError> {
        let key = command.partition_key();
        let payload = encode(command);
        self.producer
            .send(BaseRecord::to(&self.topic).key(&key).payload(&payload))
            .map_err(|(e, _)| e)
    }

    /// Waits up to `timeout` for queued commands to be delivered.
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

/// Runs on the ingest thread: feeds the predictor, publishes its commands.
pub struct PrewarmLoop {
    predictor: SharedPredictor,
    publisher: PrewarmPublisher,
    metrics: Arc<Metrics>,
    last_counts: DecisionCounts,
    last_scored: u64,
}

impl PrewarmLoop {
    /// A loop that publishes `predictor`'s commands with `publisher`.
    pub fn new(
        predictor: SharedPredictor,
        publisher: PrewarmPublisher,
        metrics: Arc<Metrics>,
    ) -> Self {
        PrewarmLoop {
            predictor,
            publisher,
            metrics,
            last_counts: DecisionCounts::default(),
            last_scored: 0,
        }
    }

    /// Turns the predictor's cumulative totals into counter increments.
    fn count(&mut self, counts: DecisionCounts, scored: u64) {
        let m = &self.metrics;
        let last = self.last_counts;
        m.prewarm_useful.inc_by(counts.useful - last.useful);
        m.prewarm_wasted.inc_by(counts.wasted - last.wasted);
        m.keys_scored.inc_by(scored - self.last_scored);
        for ((skip, now), (_, before)) in counts.skips().into_iter().zip(last.skips()) {
            if now > before {
                m.skip(skip, now - before);
            }
        }
        self.last_counts = counts;
        self.last_scored = scored;
    }
}

impl BatchObserver for PrewarmLoop {
    fn on_batch(&mut self, heat: &HeatMap, events: &[AccessEventRef<'_>]) {
        let applied_at = Instant::now();
        let (commands, counts, scored) = {
            let mut predictor = self.predictor.lock().unwrap_or_else(|e| e.into_inner());
            for event in events {
                predictor.observe(event);
            }
            let commands = predictor.tick(heat, heat.now_ms());
            (commands, predictor.counts(), predictor.scored())
        };
        for command in &commands {
            match self.publisher.send(command) {
                Ok(()) => {
                    self.metrics.prewarm_sent.inc();
                    tracing::info!(
                        tenant = %command.tenant,
                        key = %command.key,
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
            self.metrics
                .decision_seconds
                .observe(applied_at.elapsed().as_secs_f64());
        }
        self.count(counts, scored);
    }
}

impl Drop for PrewarmLoop {
    fn drop(&mut self) {
        // The last commands of a shutdown still reach the edges.
        self.publisher.flush(Duration::from_secs(2));
    }
}

/// Refits the model every `interval` on the predictor's labelled samples.
pub struct Retrainer {
    thread: StoppableThread,
}

/// Fewest labelled samples worth a retrain.
const MIN_SAMPLES: usize = 200;

impl Retrainer {
    /// Starts the retrain thread.
    pub fn start(
        predictor: SharedPredictor,
        interval: Duration,
        threshold: f64,
        metrics: Arc<Metrics>,
    ) -> Self {
        let thread = StoppableThread::spawn("pulse-retrain", move |stop| {
            let mut next = Instant::now() + interval;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if Instant::now() < next {
                    continue;
                }
                next = Instant::now() + interval;
                let outcome = retrain_once(&predictor, threshold);
                metrics
                    .retrains
                    .get_or_create(&ReasonLabel { reason: outcome })
                    .inc();
            }
        });
        Retrainer { thread }
    }

    /// Stops the thread and waits for it (dropping it does the same).
    pub fn stop(self) {
        self.thread.stop();
    }
}

/// One retrain: copy the samples out under the lock, fit outside it, swap under it.
/// Returns the outcome's metric label.
pub fn retrain_once(predictor: &SharedPredictor, threshold: f64) -> &'static str {
    let (current, samples) = {
        let p = predictor.lock().unwrap_or_else(|e| e.into_inner());
        let Some(model) = p.model().cloned() else {
            return "not_enough_data";
        };
        (model, p.samples().cloned().collect::<Vec<_>>())
    };
    if samples.len() < MIN_SAMPLES {
        tracing::debug!(
            samples = samples.len(),
            "too few labelled samples to retrain"
        );
        return "not_enough_data";
    }
    let generation = current
        .name
        .rsplit_once("-online-")
        .and_then(|(_, n)| n.parse::<u32>().ok())
        .unwrap_or(0);
    let base = current.name.split("-online-").next().unwrap_or("model");
    let options = TrainOptions {
        name: format!("{base}-online-{}", generation + 1),
        trained_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        threshold,
        ..TrainOptions::default()
    };
    match retrain(&current, &samples, 0.2, &options) {
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
            let mut p = predictor.lock().unwrap_or_else(|e| e.into_inner());
            p.set_model(Arc::new(*model));
            "replaced"
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
