//! A first start on a broker without pulse's topics, on the real broker: `pulse::start`
//! creates the events and pre-warm topics with the configured partition count and
//! retention, and leaves a topic that is there already as it is.
//!
//! Needs `KAFKA_BOOTSTRAP_SERVERS` (`scripts/kafka start`, then
//! `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092`): without it these tests fail, never skip.

use std::time::Duration;

use pulse::PulseConfig;
use pulse::testing::TestKafka;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long anything may take before the test fails; never a measured bound.
const PATIENCE: Duration = Duration::from_secs(60);

/// The topic's partition count as the broker's metadata says (0: not there), read by a
/// consumer, which never creates a topic by asking.
fn partitions(kafka: &TestKafka, topic: &str) -> usize {
    let consumer: BaseConsumer = kafka.config().create().expect("a consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len())
}

/// `retention.ms` of `topic`, from the broker.
async fn retention_ms(kafka: &TestKafka, topic: &str) -> Option<String> {
    let admin: AdminClient<DefaultClientContext> = kafka.config().create().expect("an admin");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await
            .expect("DescribeConfigs request");
        if let Ok(resource) = &described[0]
            && let Some(entry) = resource.get("retention.ms")
        {
            return entry.value.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{topic} never described"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_start_creates_the_topics_it_needs_and_keeps_those_there() {
    let kafka = TestKafka::real();
    let events = kafka.unique_topic("first-start-events");
    let prewarm = kafka.unique_topic("first-start-prewarm");
    let existing = kafka.unique_topic("first-start-dlq");
    kafka.create_topic(&existing, 2).await;
    assert_eq!(
        partitions(&kafka, &events),
        0,
        "no events topic before the start"
    );

    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: events.clone(),
        group: format!("{events}-group"),
        prewarm_topic: prewarm.clone(),
        dead_letter_topic: Some(existing.clone()),
        topic_partitions: 3,
        topic_retention_ms: Some(3_600_000),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    })
    .await
    .expect("pulse starts");

    assert_eq!(partitions(&kafka, &events), 3, "events topic created");
    assert_eq!(partitions(&kafka, &prewarm), 3, "pre-warm topic created");
    assert_eq!(partitions(&kafka, &existing), 2, "an existing topic kept");
    assert_eq!(
        retention_ms(&kafka, &events).await.as_deref(),
        Some("3600000")
    );
    pulse.shutdown().await;
}
