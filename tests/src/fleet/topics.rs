//! The topics a fleet test reads and writes: events produced and counted per
//! partition, high watermarks, the commands on the prewarm topic.

use std::time::{Duration, Instant};

use models::{AccessEvent, PrewarmCommand, decode};
use pulse::testing::{TestKafka, produce_events, produce_paced};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{Message, Offset, TopicPartitionList};

/// Grows `topic` to `partitions` with the admin API (as `kafka-topics.sh --alter`),
/// panicking with the broker's reason if it refuses.
pub async fn grow_topic(kafka: &TestKafka, topic: &str, partitions: usize) {
    let admin: AdminClient<DefaultClientContext> = kafka.config().create().unwrap();
    for result in admin
        .create_partitions(
            [&NewPartitions::new(topic, partitions)],
            &AdminOptions::new(),
        )
        .await
        .expect("CreatePartitions request")
    {
        result.unwrap_or_else(|(t, e)| panic!("growing {t}: {e}"));
    }
}

/// [`produce_events`], counted per partition of the `partitions` of `topic`.
pub async fn produce_counted(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    events: &[AccessEvent],
) -> Vec<i64> {
    let mut per_partition = vec![0i64; partitions as usize];
    for p in produce_events(producer, topic, events).await {
        per_partition[p as usize] += 1;
    }
    per_partition
}

/// [`produce_paced`] in real time, counted per partition of the `partitions` of
/// `topic` (owned arguments, to run as a task beside the test).
pub async fn produce_paced_counted(
    producer: FutureProducer,
    topic: String,
    partitions: i32,
    events: Vec<AccessEvent>,
) -> Vec<i64> {
    let mut per_partition = vec![0i64; partitions as usize];
    for p in produce_paced(&producer, &topic, &events, 1).await {
        per_partition[p as usize] += 1;
    }
    per_partition
}

/// Each of `topic`'s first `partitions` partitions' high watermark.
pub fn high_watermarks(kafka: &TestKafka, topic: &str, partitions: i32) -> Vec<i64> {
    let client: BaseConsumer = kafka.config().create().expect("creating a metadata client");
    (0..partitions)
        .map(|p| {
            client
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"))
                .1
        })
        .collect()
}

/// Every command on `topic` (one partition), from its beginning to its end.
pub fn read_commands(kafka: &TestKafka, topic: &str) -> Vec<PrewarmCommand> {
    read_commands_of(kafka, topic, 1)
}

/// Every command on `topic`'s first `partitions` partitions (a gate's decisions topic
/// holds proposals, as commands), from their beginnings to their ends.
pub fn read_commands_of(kafka: &TestKafka, topic: &str, partitions: i32) -> Vec<PrewarmCommand> {
    let end: i64 = high_watermarks(kafka, topic, partitions).iter().sum();
    // `assign` needs a group id; nothing is committed under it.
    let consumer: BaseConsumer = kafka
        .config()
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("creating a command reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut commands = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (commands.len() as i64) < end {
        assert!(
            Instant::now() < deadline,
            "read {} of {end} commands from {topic}",
            commands.len()
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.unwrap_or_else(|e| panic!("reading {topic}: {e}"));
        let command: PrewarmCommand = decode(message.payload().unwrap_or_default())
            .unwrap_or_else(|e| panic!("a command on {topic} does not decode: {e}"));
        commands.push(command);
    }
    commands
}
