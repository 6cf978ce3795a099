//! One scoring model for the fleet, carried by a compacted Kafka topic.
//!
//! One instance trains and [`ModelPublisher::publish`]es; every instance runs a
//! [`ModelWatcher`] that reads the topic from the beginning and hands the newest valid
//! model to a callback (which swaps it into every partition's predictor). The topic is
//! the source of truth, so an instance that starts, restarts or joins late scores with
//! the same model as the others without asking anyone:
//! - every model is written to partition 0 under the key [`MODEL_KEY`], so compaction
//!   keeps the latest one and the order of the partition is the order of the models;
//! - the watcher has no consumer-group semantics (it assigns partition 0 itself and
//!   never commits): each instance must read every model, not a share of them;
//! - the topic is writable by whoever can reach the broker, so every message is
//!   hostile: too large, not a model, or a model this build cannot read is counted and
//!   skipped, and the model in use stays.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::future_producer::{DeliveryFuture, OwnedDeliveryResult};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::kafka::{KafkaClients, QuietContext};
use crate::metrics::{ModelWatcherCounts, ReasonLabel};
use crate::predict::ScoringModel;
use crate::stoppable::StoppableThread;

/// The key of every model message: one key, so compaction keeps only the newest.
pub const MODEL_KEY: &str = "model";

/// The partition models are written to and read from.
const MODEL_PARTITION: i32 = 0;

/// Largest model message accepted. A model is a few KiB of JSON; this leaves room for
/// more features while keeping a hostile message from costing much to parse.
pub const MAX_MODEL_BYTES: usize = 256 * 1024;

/// Room for a record batch's headers and the key around the largest model.
const BATCH_OVERHEAD: usize = 4096;

/// Bound on admin requests and on a publish waiting for the broker's acknowledgement.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the watcher thread looks at its stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How often a broker error is logged while it lasts.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why the model topic could not be set up or written.
#[derive(Debug, thiserror::Error)]
pub enum ModelTopicError {
    /// A Kafka client could not be created or a request failed.
    #[error("model topic {topic}: {error}")]
    Kafka {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        error: KafkaError,
    },
    /// The broker refused to create the topic.
    #[error("creating model topic {topic}: {code}")]
    Create {
        /// The topic.
        topic: String,
        /// The broker's error code.
        code: RDKafkaErrorCode,
    },
    /// The model is too large to publish (watchers would skip it).
    #[error("model {name} is {bytes} bytes of JSON, over the {MAX_MODEL_BYTES}-byte limit")]
    TooLarge {
        /// The model's name.
        name: String,
        /// Its JSON size.
        bytes: usize,
    },
}

/// What [`ModelTopic::ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicState {
    /// The topic was created: compacted, one partition, messages up to about
    /// [`MAX_MODEL_BYTES`].
    Created,
    /// The topic was already there; `compacted` says whether `cleanup.policy`
    /// includes `compact` (without it the newest model can expire with retention).
    Existed {
        /// Whether compaction is on.
        compacted: bool,
    },
}

/// Setting up the model topic.
pub struct ModelTopic;

impl ModelTopic {
    /// Creates `topic` with one partition and `cleanup.policy=compact` if it is
    /// missing (replication is the broker's default). An existing topic is used as it
    /// is; without compaction a warning is logged, since retention could delete the
    /// only copy of the model in use.
    pub async fn ensure(
        clients: &KafkaClients,
        topic: &str,
    ) -> Result<TopicState, ModelTopicError> {
        let kafka = |error| ModelTopicError::Kafka {
            topic: topic.to_owned(),
            error,
        };
        let admin: AdminClient<DefaultClientContext> =
            clients.config(&[]).create().map_err(kafka)?;
        let options = AdminOptions::new().request_timeout(Some(KAFKA_TIMEOUT));
        // The broker itself refuses messages far over the watcher's limit, so a hostile
        // one never costs a watcher more than that to fetch.
        let max_message_bytes = (MAX_MODEL_BYTES + BATCH_OVERHEAD).to_string();
        let new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            .set("max.message.bytes", &max_message_bytes);
        let results = admin
            .create_topics([&new_topic], &options)
            .await
            .map_err(kafka)?;
        for result in results {
            match result {
                Ok(_) => {
                    tracing::info!(topic, "created the compacted model topic");
                    return Ok(TopicState::Created);
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => {
                    return Err(ModelTopicError::Create {
                        topic: topic.to_owned(),
                        code,
                    });
                }
            }
        }
        let compacted = is_compacted(&admin, topic, &options).await?;
        if !compacted {
            tracing::warn!(
                topic,
                "the model topic exists without cleanup.policy=compact: retention may delete \
                 the model in use, and instances started after that fall back to the built-in model"
            );
        }
        Ok(TopicState::Existed { compacted })
    }
}

/// Whether `topic`'s `cleanup.policy` includes `compact`. A topic created a moment ago
/// (by another instance racing this one) can be unknown to the broker for a moment, or
/// described without its configs (every topic has a `cleanup.policy`), so those
/// answers are retried within [`KAFKA_TIMEOUT`].
async fn is_compacted(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    options: &AdminOptions,
) -> Result<bool, ModelTopicError> {
    let kafka = |error| ModelTopicError::Kafka {
        topic: topic.to_owned(),
        error,
    };
    let deadline = Instant::now() + KAFKA_TIMEOUT;
    let resource = loop {
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], options)
            .await
            .map_err(kafka)?;
        let early = Instant::now() < deadline;
        match described.into_iter().next() {
            Some(Ok(resource)) => {
                if resource.get("cleanup.policy").is_some() || !early {
                    break resource;
                }
            }
            Some(Err(RDKafkaErrorCode::UnknownTopicOrPartition)) if early => {}
            Some(Err(code)) => return Err(kafka(KafkaError::AdminOp(code))),
            None => {
                return Err(kafka(KafkaError::AdminOpCreation(
                    "DescribeConfigs returned no resource".into(),
                )));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(resource
        .get("cleanup.policy")
        .and_then(|entry| entry.value.as_deref())
        .is_some_and(|policy| policy.split(',').any(|p| p.trim() == "compact")))
}

/// Writes models to the model topic.
///
/// Its producer lives for one publish: a model is published now and then, and a
/// producer kept between publishes costs its polling thread, which spins through the
/// last millisecond of every 100 ms wait (about 1 % of a core).
pub struct ModelPublisher {
    config: ClientConfig,
    topic: String,
}

impl ModelPublisher {
    /// A publisher to `topic` that waits for every in-sync replica: a model is
    /// published rarely and must not be lost. The configuration is checked here, by
    /// creating a producer once.
    pub fn new(kafka: &KafkaClients, topic: &str) -> Result<Self, ModelTopicError> {
        let config = kafka.config(&[
            ("acks", "all"),
            ("message.timeout.ms", &KAFKA_TIMEOUT.as_millis().to_string()),
            (
                "message.max.bytes",
                &(MAX_MODEL_BYTES + BATCH_OVERHEAD).to_string(),
            ),
        ]);
        let publisher = ModelPublisher {
            config,
            topic: topic.to_owned(),
        };
        drop(publisher.producer()?);
        Ok(publisher)
    }

    fn producer(&self) -> Result<FutureProducer, ModelTopicError> {
        self.config.create().map_err(|e| self.kafka_error(e))
    }

    /// Produces `model`'s JSON to partition 0 under [`MODEL_KEY`] and waits until the
    /// broker has it (librdkafka reports within `message.timeout.ms`, 10 s). Returns
    /// the message's offset.
    pub async fn publish(&self, model: &ScoringModel) -> Result<i64, ModelTopicError> {
        let json = self.checked_json(model)?;
        let producer = self.producer()?;
        let delivery = self.send(&producer, &json)?.await;
        self.delivered(model, delivery)
    }

    /// [`ModelPublisher::publish`] for a plain thread such as the retrainer: blocks the
    /// calling thread until the broker has the model (never call it on an async task).
    /// It needs no runtime: the delivery report comes from librdkafka's own thread.
    pub fn publish_blocking(&self, model: &ScoringModel) -> Result<i64, ModelTopicError> {
        let json = self.checked_json(model)?;
        let producer = self.producer()?;
        let delivery = block_on(self.send(&producer, &json)?);
        self.delivered(model, delivery)
    }

    fn checked_json(&self, model: &ScoringModel) -> Result<String, ModelTopicError> {
        let json = model.to_json();
        if json.len() > MAX_MODEL_BYTES {
            return Err(ModelTopicError::TooLarge {
                name: model.name.clone(),
                bytes: json.len(),
            });
        }
        Ok(json)
    }

    /// Enqueues without waiting for room: a model is one message now and then, so a
    /// full queue means a broker long away, which is worth an error, not a wait.
    fn send(
        &self,
        producer: &FutureProducer,
        json: &str,
    ) -> Result<DeliveryFuture, ModelTopicError> {
        let record = FutureRecord::to(&self.topic)
            .partition(MODEL_PARTITION)
            .key(MODEL_KEY)
            .payload(json);
        producer
            .send_result(record)
            .map_err(|(error, _)| self.kafka_error(error))
    }

    /// `delivery` fails only when the producer is dropped before the report.
    fn delivered<Dropped>(
        &self,
        model: &ScoringModel,
        delivery: Result<OwnedDeliveryResult, Dropped>,
    ) -> Result<i64, ModelTopicError> {
        let delivery = delivery
            .map_err(|_| self.kafka_error(KafkaError::Canceled))?
            .map_err(|(error, _)| self.kafka_error(error))?;
        tracing::info!(
            topic = %self.topic,
            model = %model.name,
            offset = delivery.offset,
            "published the model"
        );
        Ok(delivery.offset)
    }

    fn kafka_error(&self, error: KafkaError) -> ModelTopicError {
        ModelTopicError::Kafka {
            topic: self.topic.clone(),
            error,
        }
    }
}

/// Runs a future on the calling thread, parking it between polls: enough for a
/// delivery report, which librdkafka's thread completes.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// Why a model message is skipped: the `reason` label of [`ModelWatcherCounts::rejected`].
pub const MODEL_REJECT_REASONS: [&str; 5] = [
    "too_large",
    "wrong_key",
    "no_payload",
    "not_utf8",
    "invalid",
];

impl Default for ModelWatcherCounts {
    /// Every reason exported from the start, at 0.
    fn default() -> Self {
        let rejected = Family::default();
        for reason in MODEL_REJECT_REASONS {
            let _ = rejected.get_or_create(&ReasonLabel { reason });
        }
        ModelWatcherCounts {
            applied: Counter::default(),
            unchanged: Counter::default(),
            rejected,
            caught_up: AtomicBool::new(false),
        }
    }
}

/// Follows the model topic on a thread and hands each new valid model to a callback.
/// Dropping it stops and joins the thread, as [`ModelWatcher::stop`] does.
pub struct ModelWatcher {
    thread: StoppableThread,
    counts: Arc<ModelWatcherCounts>,
}

impl ModelWatcher {
    /// Reads `topic` from the beginning on a thread of its own; once the end is
    /// reached, calls `on_model` with the newest valid model found (if any), then with
    /// every later valid model that differs from the last one applied. `on_model` runs
    /// on the watcher thread: keep it short (swap an `Arc`).
    pub fn start(
        kafka: &KafkaClients,
        topic: &str,
        on_model: impl FnMut(Arc<ScoringModel>) + Send + 'static,
    ) -> Result<Self, ModelTopicError> {
        Self::start_counted(kafka, topic, Arc::default(), on_model)
    }

    /// Like [`ModelWatcher::start`], counting into `counts` (registered in the
    /// service's metrics).
    pub fn start_counted(
        clients: &KafkaClients,
        topic: &str,
        counts: Arc<ModelWatcherCounts>,
        mut on_model: impl FnMut(Arc<ScoringModel>) + Send + 'static,
    ) -> Result<Self, ModelTopicError> {
        let kafka = |error| ModelTopicError::Kafka {
            topic: topic.to_owned(),
            error,
        };
        // Its end-of-partition errors are asked for (below), not errors.
        let consumer: BaseConsumer<QuietContext> = clients
            .config(&[
                // Never joins or commits: the id only has to be unique.
                ("group.id", &unique_group_id()),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", "earliest"),
                // The end of the partition is when the model found at start is applied.
                ("enable.partition.eof", "true"),
            ])
            .create_with_context(QuietContext::default())
            .map_err(kafka)?;
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, MODEL_PARTITION, Offset::Beginning)
            .map_err(kafka)?;
        consumer.assign(&assignment).map_err(kafka)?;

        let thread_counts = counts.clone();
        let topic = topic.to_owned();
        let thread = StoppableThread::spawn("pulse-model-watch", move |stop| {
            let mut feed = ModelFeed::default();
            let mut last_error_log: Option<Instant> = None;
            let mut apply = |model: Arc<ScoringModel>, offset: i64| {
                tracing::info!(topic = %topic, model = %model.name, offset, "model from the topic applied");
                thread_counts.applied.inc();
                on_model(model);
            };
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(POLL_INTERVAL) {
                    None => {}
                    Some(Ok(message)) => {
                        let offset = message.offset();
                        match feed.offer(message.key(), message.payload(), offset) {
                            Offer::Apply(model) => apply(model, offset),
                            Offer::Held => {}
                            Offer::Unchanged => {
                                thread_counts.unchanged.inc();
                            }
                            Offer::Rejected(reason, detail) => {
                                tracing::warn!(topic = %topic, offset, reason, %detail, "model message skipped");
                                thread_counts
                                    .rejected
                                    .get_or_create(&ReasonLabel { reason })
                                    .inc();
                            }
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {
                        if let Some((model, offset)) = feed.reached_end() {
                            apply(model, offset);
                        }
                        thread_counts.caught_up.store(true, Ordering::Release);
                    }
                    // A broker away is not fatal: librdkafka reconnects; keep polling.
                    Some(Err(error))
                        if last_error_log.is_none_or(|at| at.elapsed() >= ERROR_LOG_INTERVAL) =>
                    {
                        tracing::warn!(topic = %topic, %error, "reading the model topic");
                        last_error_log = Some(Instant::now());
                    }
                    Some(Err(_)) => {}
                }
            }
        });
        Ok(ModelWatcher { thread, counts })
    }

    /// The watcher's counters, shared with the thread.
    pub fn counts(&self) -> Arc<ModelWatcherCounts> {
        self.counts.clone()
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        self.thread.stop();
    }
}

/// Unique to this watcher: the process, the time, and a count of the watchers this
/// process started.
fn unique_group_id() -> String {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "pulse-model-watch-{}-{}-{}",
        std::process::id(),
        crate::clock::wall_clock_ms(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    )
}

/// What to do with one message of the model topic.
#[derive(Debug)]
enum Offer {
    /// Apply this model now.
    Apply(Arc<ScoringModel>),
    /// Valid, kept until the end of the topic is reached (only the newest is applied).
    Held,
    /// Valid but equal to the model in use.
    Unchanged,
    /// Not a usable model: the reason label and what was wrong.
    Rejected(&'static str, String),
}

/// The watcher's decisions, apart from Kafka: which messages are models, which one to
/// apply, and when.
#[derive(Debug, Default)]
struct ModelFeed {
    /// The model in use.
    last: Option<Arc<ScoringModel>>,
    /// The newest valid model seen while catching up, and its offset.
    held: Option<(ScoringModel, i64)>,
    /// Whether the end of the topic has been reached once.
    caught_up: bool,
}

impl ModelFeed {
    fn offer(&mut self, key: Option<&[u8]>, payload: Option<&[u8]>, offset: i64) -> Offer {
        if key != Some(MODEL_KEY.as_bytes()) {
            let key = key.map(|k| String::from_utf8_lossy(&k[..k.len().min(64)]).into_owned());
            return Offer::Rejected("wrong_key", format!("key {key:?}, not {MODEL_KEY:?}"));
        }
        let Some(payload) = payload else {
            return Offer::Rejected("no_payload", "empty message (a tombstone?)".into());
        };
        if payload.len() > MAX_MODEL_BYTES {
            return Offer::Rejected(
                "too_large",
                format!("{} bytes, over {MAX_MODEL_BYTES}", payload.len()),
            );
        }
        let Ok(json) = std::str::from_utf8(payload) else {
            return Offer::Rejected("not_utf8", "the payload is not UTF-8".into());
        };
        let model = match ScoringModel::from_json(json) {
            Ok(model) => model,
            Err(e) => return Offer::Rejected("invalid", e.to_string()),
        };
        if !self.caught_up {
            self.held = Some((model, offset));
            return Offer::Held;
        }
        self.adopt(model).map_or(Offer::Unchanged, Offer::Apply)
    }

    /// The end of the topic: from now on every new model applies at once; returns the
    /// newest one held while catching up, unless it is the model in use.
    fn reached_end(&mut self) -> Option<(Arc<ScoringModel>, i64)> {
        self.caught_up = true;
        let (held, offset) = self.held.take()?;
        self.adopt(held).map(|model| (model, offset))
    }

    fn adopt(&mut self, model: ScoringModel) -> Option<Arc<ScoringModel>> {
        if self.last.as_deref() == Some(&model) {
            return None;
        }
        let model = Arc::new(model);
        self.last = Some(model.clone());
        Some(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::default_model;

    fn model(name: &str) -> ScoringModel {
        ScoringModel {
            name: name.into(),
            ..default_model()
        }
    }

    fn offer(feed: &mut ModelFeed, payload: &[u8]) -> Offer {
        feed.offer(Some(MODEL_KEY.as_bytes()), Some(payload), 0)
    }

    fn rejected(offer: Offer) -> &'static str {
        match offer {
            Offer::Rejected(reason, _) => reason,
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn only_the_newest_valid_model_at_start_is_applied() {
        let mut feed = ModelFeed::default();
        assert!(matches!(
            offer(&mut feed, model("a").to_json().as_bytes()),
            Offer::Held
        ));
        let b = model("b").to_json();
        assert!(matches!(
            feed.offer(Some(MODEL_KEY.as_bytes()), Some(b.as_bytes()), 7),
            Offer::Held
        ));
        assert_eq!(rejected(offer(&mut feed, b"{not json")), "invalid");
        let (applied, offset) = feed.reached_end().expect("the newest valid model");
        assert_eq!((applied.name.as_str(), offset), ("b", 7));
        assert!(feed.reached_end().is_none(), "applied once");
    }

    #[test]
    fn after_the_end_each_new_model_applies_and_a_repeat_does_not() {
        let mut feed = ModelFeed::default();
        assert!(
            feed.reached_end().is_none(),
            "an empty topic applies nothing"
        );
        let Offer::Apply(a) = offer(&mut feed, model("a").to_json().as_bytes()) else {
            panic!("a new model applies at once");
        };
        assert_eq!(a.name, "a");
        assert!(matches!(
            offer(&mut feed, model("a").to_json().as_bytes()),
            Offer::Unchanged
        ));
        // The same name with other content is another model.
        let mut retrained = model("a");
        retrained.intercept += 0.5;
        assert!(matches!(
            offer(&mut feed, retrained.to_json().as_bytes()),
            Offer::Apply(_)
        ));
    }

    #[test]
    fn hostile_messages_are_rejected_by_reason() {
        let mut feed = ModelFeed::default();
        feed.reached_end();
        let json = model("a").to_json();
        assert_eq!(
            rejected(feed.offer(Some(b"other"), Some(json.as_bytes()), 0)),
            "wrong_key"
        );
        assert_eq!(
            rejected(feed.offer(None, Some(json.as_bytes()), 0)),
            "wrong_key"
        );
        assert_eq!(
            rejected(feed.offer(Some(MODEL_KEY.as_bytes()), None, 0)),
            "no_payload"
        );
        let huge = vec![b' '; MAX_MODEL_BYTES + 1];
        assert_eq!(rejected(offer(&mut feed, &huge)), "too_large");
        assert_eq!(rejected(offer(&mut feed, &[0xff, 0xfe])), "not_utf8");
        let wrong_format = json.replacen("\"format\": 2", "\"format\": 99", 1);
        assert_ne!(wrong_format, json);
        assert_eq!(
            rejected(offer(&mut feed, wrong_format.as_bytes())),
            "invalid"
        );
        assert!(feed.last.is_none(), "nothing hostile was applied");
    }
}
