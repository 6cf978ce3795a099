//! One model for the fleet through a compacted topic, on the real broker: the topic is
//! created compacted, a watcher applies the newest valid model already on the topic and
//! then follows new ones, hostile messages are counted and never applied, and a
//! watcher started later starts from the newest valid model.
//!
//! Needs `KAFKA_BOOTSTRAP_SERVERS` (`scripts/kafka start`, then
//! `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092`): without it these tests fail, never skip.

use std::sync::Arc;
use std::time::Duration;

use pulse::testing::TestKafka;
use pulse::{
    KafkaClients, MAX_MODEL_BYTES, MODEL_KEY, MODEL_REJECT_REASONS, ModelPublisher, ModelTopic,
    ModelWatcher, ModelWatcherCounts, ScoringModel, TopicState, default_model,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// How long anything may take before the test fails; never a measured bound.
const PATIENCE: Duration = Duration::from_secs(60);

/// The real broker (compaction and topic configs are what these tests read) and its
/// `bootstrap.servers`.
fn kafka() -> (TestKafka, String) {
    let kafka = TestKafka::real();
    let brokers = kafka.bootstrap_servers().to_owned();
    (kafka, brokers)
}

fn admin(kafka: &TestKafka) -> AdminClient<DefaultClientContext> {
    kafka.config().create().expect("creating an admin client")
}

/// One of the topic's configs, read from the broker, not from the code under test
/// (a topic created a moment ago may be unknown to the broker for a moment, or
/// described without its configs).
async fn topic_config(kafka: &TestKafka, topic: &str, name: &str) -> String {
    let admin = admin(kafka);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await
            .expect("DescribeConfigs request");
        let early = tokio::time::Instant::now() < deadline;
        match &described[0] {
            Ok(resource) => {
                if resource.get(name).is_some() || !early {
                    return resource
                        .get(name)
                        .and_then(|e| e.value.clone())
                        .unwrap_or_else(|| panic!("{name} is set"));
                }
            }
            Err(RDKafkaErrorCode::UnknownTopicOrPartition) if early => {}
            Err(code) => panic!("describing {topic}: {code}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn model(name: &str) -> ScoringModel {
    ScoringModel {
        name: name.into(),
        ..default_model()
    }
}

/// Produces a raw message to the model partition, as anyone with broker access could.
async fn produce_raw(kafka: &TestKafka, topic: &str, key: Option<&str>, payload: Option<&[u8]>) {
    let producer: FutureProducer = kafka.config().create().expect("creating a producer");
    let mut record = FutureRecord::<str, [u8]>::to(topic).partition(0);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(payload) = payload {
        record = record.payload(payload);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .unwrap_or_else(|(e, _)| panic!("producing to {topic}: {e}"));
}

/// A watcher whose callback forwards each applied model's name.
fn watch(brokers: &str, topic: &str) -> (ModelWatcher, UnboundedReceiver<String>) {
    let (applied_tx, applied_rx) = unbounded_channel();
    let watcher = ModelWatcher::start(
        &KafkaClients::new(brokers),
        topic,
        move |model: Arc<ScoringModel>| {
            let _ = applied_tx.send(model.name.clone());
        },
    )
    .expect("starting a watcher");
    (watcher, applied_rx)
}

async fn next_applied(applied_rx: &mut UnboundedReceiver<String>) -> String {
    tokio::time::timeout(PATIENCE, applied_rx.recv())
        .await
        .expect("a model applied within the patience")
        .expect("the watcher is running")
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rejected_total(counts: &ModelWatcherCounts) -> u64 {
    MODEL_REJECT_REASONS
        .into_iter()
        .map(|reason| counts.rejected(reason))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_is_created_compacted_and_an_existing_one_is_described() {
    let (kafka, brokers) = kafka();
    let topic = kafka.unique_topic("pulse-model");
    assert_eq!(
        ModelTopic::ensure(&KafkaClients::new(&brokers), &topic)
            .await
            .unwrap(),
        TopicState::Created
    );
    assert_eq!(
        topic_config(&kafka, &topic, "cleanup.policy").await,
        "compact"
    );
    let max_message: usize = topic_config(&kafka, &topic, "max.message.bytes")
        .await
        .parse()
        .unwrap();
    assert!(
        (MAX_MODEL_BYTES..2 * MAX_MODEL_BYTES).contains(&max_message),
        "{max_message}"
    );
    assert_eq!(
        ModelTopic::ensure(&KafkaClients::new(&brokers), &topic)
            .await
            .unwrap(),
        TopicState::Existed { compacted: true }
    );

    let plain = kafka.unique_topic("pulse-model-plain");
    let results = admin(&kafka)
        .create_topics(
            [&NewTopic::new(&plain, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("CreateTopics request");
    results[0].as_ref().expect("creating a plain topic");
    assert_eq!(
        topic_config(&kafka, &plain, "cleanup.policy").await,
        "delete"
    );
    assert_eq!(
        ModelTopic::ensure(&KafkaClients::new(&brokers), &plain)
            .await
            .unwrap(),
        TopicState::Existed { compacted: false }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_apply_the_newest_valid_model_and_skip_hostile_messages() {
    let (kafka, brokers) = kafka();
    let topic = kafka.unique_topic("pulse-model");
    ModelTopic::ensure(&KafkaClients::new(&brokers), &topic)
        .await
        .unwrap();
    let publisher = Arc::new(ModelPublisher::new(&KafkaClients::new(&brokers), &topic).unwrap());

    publisher.publish(&model("model-a")).await.unwrap();
    let (first, mut first_rx) = watch(&brokers, &topic);
    let first_counts = first.counts();
    assert_eq!(next_applied(&mut first_rx).await, "model-a");
    wait_until("the first watcher catches up", || first_counts.caught_up()).await;

    // Hostile messages, one per reason: counted, never applied.
    let a_json = model("model-a").to_json();
    let wrong_format = a_json.replacen("\"format\": 2", "\"format\": 99", 1);
    let oversized = vec![b' '; MAX_MODEL_BYTES + 1];
    let other_key = model("model-x").to_json();
    let hostile: [(Option<&str>, Option<&[u8]>); 6] = [
        (Some(MODEL_KEY), Some(b"{not json")),
        (Some(MODEL_KEY), Some(wrong_format.as_bytes())),
        (Some(MODEL_KEY), Some(&oversized)),
        (Some(MODEL_KEY), Some(&[0xff, 0xfe])),
        (Some(MODEL_KEY), None),
        (Some("not-the-model"), Some(other_key.as_bytes())),
    ];
    for (key, payload) in hostile {
        produce_raw(&kafka, &topic, key, payload).await;
    }
    wait_until("six hostile messages rejected", || {
        rejected_total(&first_counts) == 6
    })
    .await;
    for (reason, expected) in [
        ("invalid", 2),
        ("too_large", 1),
        ("not_utf8", 1),
        ("no_payload", 1),
        ("wrong_key", 1),
    ] {
        assert_eq!(first_counts.rejected(reason), expected, "{reason}");
    }
    assert!(first_rx.try_recv().is_err(), "nothing hostile was applied");

    // From a plain thread, as the retrainer would.
    let blocking = publisher.clone();
    tokio::task::spawn_blocking(move || blocking.publish_blocking(&model("model-b")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next_applied(&mut first_rx).await, "model-b");

    // The same model again is not applied again; garbage after it changes nothing.
    publisher.publish(&model("model-b")).await.unwrap();
    produce_raw(&kafka, &topic, Some(MODEL_KEY), Some(b"[]")).await;
    wait_until("the repeat and the garbage are read", || {
        first_counts.unchanged.get() == 1 && rejected_total(&first_counts) == 7
    })
    .await;
    assert!(first_rx.try_recv().is_err(), "model-b applied once");

    // A watcher started now replays everything and applies only the newest valid model.
    let (second, mut second_rx) = watch(&brokers, &topic);
    let second_counts = second.counts();
    assert_eq!(next_applied(&mut second_rx).await, "model-b");
    wait_until("the second watcher catches up", || {
        second_counts.caught_up()
    })
    .await;
    assert!(second_rx.try_recv().is_err(), "one model applied at start");
    assert_eq!(rejected_total(&second_counts), 7);
    assert_eq!(second_counts.applied.get(), 1);

    publisher.publish(&model("model-c")).await.unwrap();
    assert_eq!(next_applied(&mut first_rx).await, "model-c");
    assert_eq!(next_applied(&mut second_rx).await, "model-c");
    assert_eq!(first_counts.applied.get(), 3);

    first.stop();
    second.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_an_empty_topic_applies_the_first_model_published() {
    let (kafka, brokers) = kafka();
    let topic = kafka.unique_topic("pulse-model");
    ModelTopic::ensure(&KafkaClients::new(&brokers), &topic)
        .await
        .unwrap();
    let (watcher, mut applied_rx) = watch(&brokers, &topic);
    let counts = watcher.counts();
    wait_until("the watcher reaches the end of an empty topic", || {
        counts.caught_up()
    })
    .await;
    assert!(applied_rx.try_recv().is_err());

    let publisher = ModelPublisher::new(&KafkaClients::new(&brokers), &topic).unwrap();
    publisher.publish(&model("model-first")).await.unwrap();
    assert_eq!(next_applied(&mut applied_rx).await, "model-first");
    drop(watcher);
}
