//! The broker under test. `scripts/test` starts a real Apache Kafka and sets
//! `KAFKA_BOOTSTRAP_SERVERS`; a plain `cargo test` gets librdkafka's mock cluster,
//! which speaks the same protocol. A configured broker that cannot be reached fails
//! the test loudly: it is never skipped. A test that needs what only a real broker
//! does (topic configs, compaction) asks for one with [`TestKafka::real`], and fails
//! when none is configured.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::join_all;
use models::{AccessEvent, SIGNATURE_HEADER, encode};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::broker::EmbeddedBroker;

/// The environment variable naming a real broker.
pub const BOOTSTRAP_ENV: &str = "KAFKA_BOOTSTRAP_SERVERS";

/// `prefix` made unique to this call, this process and this moment: a topic, group or
/// node name no other test (or earlier run against the same broker) uses.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A broker for one test, with helpers for unique topics and ready-made clients.
pub struct TestKafka {
    bootstrap_servers: String,
    embedded: Option<EmbeddedBroker>,
}

impl TestKafka {
    /// Connects to `$KAFKA_BOOTSTRAP_SERVERS`, or starts an embedded broker. Panics
    /// with the reason when a configured broker does not answer.
    pub fn start() -> Self {
        let kafka = match std::env::var(BOOTSTRAP_ENV) {
            Ok(servers) if !servers.trim().is_empty() => {
                let kafka = TestKafka {
                    bootstrap_servers: servers,
                    embedded: None,
                };
                kafka.expect_reachable();
                kafka
            }
            _ => {
                let broker = EmbeddedBroker::start(1).expect("starting the embedded broker");
                TestKafka {
                    bootstrap_servers: broker.bootstrap_servers().to_owned(),
                    embedded: Some(broker),
                }
            }
        };
        eprintln!(
            "kafka under test: {} at {}",
            kafka.kind(),
            kafka.bootstrap_servers
        );
        kafka
    }

    /// The real broker `$KAFKA_BOOTSTRAP_SERVERS` names, checked reachable. Panics
    /// when it is unset (the test needs a real broker, the mock cluster will not do)
    /// or does not answer.
    pub fn real() -> Self {
        match std::env::var(BOOTSTRAP_ENV) {
            Ok(servers) if !servers.trim().is_empty() => Self::start(),
            _ => panic!(
                "{BOOTSTRAP_ENV} is not set: this test needs the real broker \
                 (scripts/kafka start; {BOOTSTRAP_ENV}=127.0.0.1:9092)"
            ),
        }
    }

    /// "real broker" or "embedded mock cluster".
    pub fn kind(&self) -> &'static str {
        if self.embedded.is_some() {
            "embedded mock cluster"
        } else {
            "real broker"
        }
    }

    /// Whether the broker is a real Apache Kafka.
    pub fn is_real(&self) -> bool {
        self.embedded.is_none()
    }

    /// The `bootstrap.servers` list.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    fn expect_reachable(&self) {
        let consumer: BaseConsumer = self.config().create().expect("creating a metadata client");
        if let Err(e) = consumer.fetch_metadata(None, Duration::from_secs(10)) {
            panic!(
                "{BOOTSTRAP_ENV}={} is set but the broker does not answer: {e}. \
                 Start it with `scripts/kafka start`, or unset {BOOTSTRAP_ENV} to use the embedded broker.",
                self.bootstrap_servers
            );
        }
    }

    /// A client config pointing at this broker.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        config
    }

    /// A topic name no other test (or earlier run against the same broker) uses.
    pub fn unique_topic(&self, prefix: &str) -> String {
        unique_name(prefix)
    }

    /// Creates `name` with `partitions` partitions and waits until it is usable.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        match &self.embedded {
            Some(broker) => broker
                .create_topic(name, partitions)
                .expect("creating a topic on the embedded broker"),
            None => {
                let admin: AdminClient<DefaultClientContext> =
                    self.config().create().expect("creating an admin client");
                // No time retention: the traces tests produce are stamped in the past
                // (the generator's fixed start), and the broker's retention check
                // (every five minutes) would delete them by their timestamps, leaving
                // a replay window empty at random.
                let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1))
                    .set("retention.ms", "-1");
                let results = admin
                    .create_topics([&topic], &AdminOptions::new())
                    .await
                    .expect("CreateTopics request");
                for result in results {
                    result.unwrap_or_else(|(topic, e)| panic!("creating {topic}: {e}"));
                }
            }
        }
    }

    /// A producer that waits for every in-sync replica (there is one).
    pub fn producer(&self) -> FutureProducer {
        self.config()
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()
            .expect("creating a producer")
    }

    /// A consumer in `group` that starts from the earliest offset and commits by hand.
    pub fn consumer(&self, group: &str) -> StreamConsumer {
        self.config()
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .create()
            .expect("creating a consumer")
    }
}

/// Produces one message and waits for the broker to take it.
pub async fn produce(producer: &FutureProducer, topic: &str, key: &str, payload: &[u8]) {
    produce_signed(producer, topic, key, payload, None).await;
}

/// [`produce`] with `signature` (if any) in the signature header, as pulse sends its
/// commands: how a test puts a signed, forged or unsigned command on the topic.
pub async fn produce_signed(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
    signature: Option<&str>,
) {
    let mut record = FutureRecord::to(topic).key(key).payload(payload);
    if let Some(signature) = signature {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: SIGNATURE_HEADER,
            value: Some(signature),
        }));
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .unwrap_or_else(|(e, _)| panic!("producing to {topic}: {e}"));
}

/// Produces `events` as edges do: keyed `tenant/key` (librdkafka's default
/// partitioner), the event time as the message timestamp, 2 000 in flight at a time;
/// waits for the broker to take each. The partition each one went to, in order.
pub async fn produce_events(
    producer: &FutureProducer,
    topic: &str,
    events: &[AccessEvent],
) -> Vec<i32> {
    let mut partitions = Vec::with_capacity(events.len());
    for chunk in events.chunks(2_000) {
        let sends = chunk.iter().map(|e| {
            let key = e.partition_key();
            let payload = encode(e);
            async move {
                producer
                    .send(
                        FutureRecord::to(topic)
                            .key(&key)
                            .payload(&payload)
                            .timestamp(e.ts_ms as i64),
                        Duration::from_secs(30),
                    )
                    .await
                    .map(|delivery| delivery.partition)
                    .map_err(|(e, _)| e)
            }
        });
        for sent in join_all(sends).await {
            partitions.push(sent.unwrap_or_else(|e| panic!("producing to {topic}: {e}")));
        }
    }
    partitions
}

/// [`produce_events`] at the pace of event time, `speedup` times faster, a quarter
/// second of event time at a time, as edges send them: a pulse reading the topic then
/// polls small batches and scores bursts as they unfold, not one backlog at its end.
/// The partition each one went to, in order.
pub async fn produce_paced(
    producer: &FutureProducer,
    topic: &str,
    events: &[AccessEvent],
    speedup: u64,
) -> Vec<i32> {
    let mut partitions = Vec::with_capacity(events.len());
    let Some(first) = events.first().map(|e| e.ts_ms) else {
        return partitions;
    };
    let started = tokio::time::Instant::now();
    let quarter = |e: &AccessEvent| (e.ts_ms - first) / 250;
    for slice in events.chunk_by(|a, b| quarter(a) == quarter(b)) {
        let due = Duration::from_millis(quarter(&slice[0]) * 250 / speedup.max(1));
        tokio::time::sleep_until(started + due).await;
        partitions.extend(produce_events(producer, topic, slice).await);
    }
    partitions
}

/// `group`'s committed offset of each of `topic`'s first `partitions` partitions
/// (`None`: nothing committed), asked of the group coordinator on the broker `config`
/// names, without joining the group; an error while the broker cannot say.
pub fn committed_offsets(
    config: &ClientConfig,
    group: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> KafkaResult<Vec<Option<i64>>> {
    let client: BaseConsumer = config
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("creating an offsets client");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = client.committed_offsets(tpl, timeout)?;
    Ok((0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            },
        )
        .collect())
}
