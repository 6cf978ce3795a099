//! The Kafka section (`[kafka]`): the access-event publisher and the pre-warm
//! consumer, and how the node checks it.

use std::path::PathBuf;

use models::SigningKeys;
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
    /// A file of the keys pre-warm commands are signed with, one `KEY_ID SECRET_HEX`
    /// a line (`#` comments): with it, a command is acted on only if its
    /// `edge-pulse-sig` header is a valid HMAC by one of them; without it, commands
    /// are not authenticated. Read at start ([`KafkaConfig::prewarm_keys`]).
    pub prewarm_keys_file: Option<PathBuf>,
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
            prewarm_keys_file: None,
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

    /// Reads and checks `prewarm_keys_file`: `None` without one. A file that cannot be
    /// read, holds no key, or has a bad line (a short or non-hex secret, a key id twice)
    /// is an error naming the field, the file and the line, never the secret.
    pub fn prewarm_keys(&self) -> Result<Option<SigningKeys>> {
        let Some(path) = &self.prewarm_keys_file else {
            return Ok(None);
        };
        let field = "kafka.prewarm_keys_file";
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(field, format!("{}: {e}", path.display())))?;
        SigningKeys::parse(&text)
            .map(Some)
            .map_err(|e| invalid(field, format!("{}: {e}", path.display())))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn keys_from(text: &str) -> Result<Option<SigningKeys>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, text).unwrap();
        KafkaConfig {
            prewarm_keys_file: Some(path),
            ..KafkaConfig::default()
        }
        .prewarm_keys()
    }

    /// No file, no keys; a good file gives its keys, two of them during a roll.
    #[test]
    fn the_key_file_is_read_with_every_key_in_it() {
        assert!(KafkaConfig::default().prewarm_keys().unwrap().is_none());
        let text = format!(
            "# rolling k1 to k2\nk1 {SECRET}\nk2 {}\n",
            SECRET.replace('0', "9")
        );
        let keys = keys_from(&text).unwrap().unwrap();
        assert_eq!(keys.ids().collect::<Vec<_>>(), ["k1", "k2"]);
    }

    /// A missing file, a short key, a duplicate id, bad hex: refused at start, naming
    /// the field and the line, never showing the secret.
    #[test]
    fn a_bad_key_file_is_refused_naming_the_field() {
        let cases = [
            (
                format!("k1 {}", &SECRET[..32]),
                "line 1: the secret of \"k1\" is 16 bytes",
            ),
            (
                format!("k1 {SECRET}\nk1 {SECRET}"),
                "line 2: key id \"k1\" appears twice",
            ),
            (
                format!("k1 {}", SECRET.replace('0', "g")),
                "line 1: the secret of \"k1\" is not hex",
            ),
            (String::new(), "no key"),
        ];
        for (text, want) in cases {
            match keys_from(&text) {
                Err(ConfigError::Invalid { field, reason }) => {
                    assert_eq!(field, "kafka.prewarm_keys_file");
                    assert!(reason.contains(want), "{reason}");
                    assert!(!reason.contains(&SECRET[8..24]), "{reason}");
                }
                other => panic!("{text:?}: expected an invalid field, got {other:?}"),
            }
        }
        let missing = KafkaConfig {
            prewarm_keys_file: Some("/nonexistent/keys".into()),
            ..KafkaConfig::default()
        };
        let error = missing.prewarm_keys().unwrap_err().to_string();
        assert!(
            error.contains("kafka.prewarm_keys_file") && error.contains("/nonexistent/keys"),
            "{error}"
        );
    }
}
