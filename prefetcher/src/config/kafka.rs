//! The Kafka section (`[kafka]`): the access-event publisher and the pre-warm
//! consumer, and how the node checks it.

use serde::{Deserialize, Serialize};

use super::{Config, Result, invalid};

/// Where a new pre-warm consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetReset {
    /// From the oldest retained command (expired ones are dropped and counted).
    Earliest,
    /// Only commands produced after the group first joins.
    Latest,
}

impl OffsetReset {
    /// The librdkafka `auto.offset.reset` value.
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        }
    }
}

/// Kafka settings. Without `brokers` the node uses no Kafka at all: it serves, but
/// publishes no access events and reads no pre-warm commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `bootstrap.servers` (comma-separated `host:port`); `None` turns Kafka off.
    pub brokers: Option<String>,
    /// Topic the access events go to.
    pub events_topic: String,
    /// Topic the pre-warm commands come from.
    pub prewarm_topic: String,
    /// Consumer group of the pre-warm consumer; default `prefetcher-{node}`, so every
    /// node reads every command.
    pub group_id: Option<String>,
    /// Where a new consumer group starts reading the pre-warm topic.
    pub prewarm_offset_reset: OffsetReset,
    /// Access events buffered between the proxy and the publisher; past it events are
    /// dropped (and counted), never waited for.
    pub event_buffer: usize,
    /// librdkafka `queue.buffering.max.messages`: events queued inside the producer.
    pub queue_max_messages: usize,
    /// librdkafka `linger.ms`: how long the producer waits to fill a batch.
    pub linger_ms: u64,
    /// librdkafka `message.timeout.ms`: an event not delivered by then is dropped.
    pub message_timeout_ms: u64,
    /// Extra librdkafka properties for both clients (security settings and the like);
    /// they override the event producer's own settings (lz4, `acks=1`, the fields above).
    pub properties: std::collections::BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: None,
            events_topic: models::EVENTS_TOPIC.into(),
            prewarm_topic: models::PREWARM_TOPIC.into(),
            group_id: None,
            prewarm_offset_reset: OffsetReset::Earliest,
            event_buffer: 16_384,
            queue_max_messages: 100_000,
            linger_ms: 20,
            message_timeout_ms: 10_000,
            properties: std::collections::BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// Whether Kafka is on.
    pub fn enabled(&self) -> bool {
        self.brokers.is_some()
    }
}

impl Config {
    pub(super) fn validate_kafka(&self) -> Result<()> {
        let k = &self.kafka;
        let Some(brokers) = &k.brokers else {
            return Ok(());
        };
        if brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must name at least one host:port"));
        }
        if self.region.is_none() {
            return Err(invalid(
                "region",
                "is required when kafka.brokers is set (events and pre-warm targeting)",
            ));
        }
        if self.node.is_none() {
            return Err(invalid(
                "node",
                "is required when kafka.brokers is set (events and the consumer group)",
            ));
        }
        for (name, topic) in [
            ("kafka.events_topic", &k.events_topic),
            ("kafka.prewarm_topic", &k.prewarm_topic),
        ] {
            if !models::is_topic_name(topic) {
                return Err(invalid(
                    name,
                    "must be 1-249 characters of A-Z a-z 0-9 . _ -",
                ));
            }
        }
        if k.group_id.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(invalid("kafka.group_id", "must not be empty"));
        }
        if k.event_buffer == 0 {
            return Err(invalid("kafka.event_buffer", "must be positive"));
        }
        if !(1..=10_000_000).contains(&k.queue_max_messages) {
            return Err(invalid(
                "kafka.queue_max_messages",
                "must be in [1, 10000000]",
            ));
        }
        if k.linger_ms > 900_000 {
            return Err(invalid("kafka.linger_ms", "must be at most 900000"));
        }
        if k.message_timeout_ms == 0 {
            return Err(invalid("kafka.message_timeout_ms", "must be positive"));
        }
        Ok(())
    }
}
