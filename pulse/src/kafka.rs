//! Every Kafka client pulse makes is built here, from one [`KafkaClients`]: the
//! bootstrap servers plus a free map of librdkafka properties (SASL, TLS, tuning) that
//! the operator can always reach, as the edges' `kafka.properties`. (librdkafka is
//! built with the system OpenSSL, rdkafka's `ssl` feature: SSL, SASL_SSL and
//! SASL_PLAINTEXT; SASL PLAIN, SCRAM and OAUTHBEARER are built in.)
//!
//! Each client's configuration is built in one order: `bootstrap.servers`, then the
//! client's own settings (its group id, commit and fetch settings, producer limits),
//! then the operator's properties, which have the last word, except the few that
//! pulse's correctness depends on ([`RESERVED_PROPERTIES`]): naming one of those is
//! refused when the properties are given, naming the property, rather than letting
//! it quietly change how offsets are committed or partitions are assigned.
//!
//! The operator's properties go to every client alike (the ingest consumer, the
//! pre-warm and dead-letter producers, the model topic's admin, producer and watcher,
//! `read_topic`), so a property only one kind of client knows (a consumer's
//! `fetch.*`, a producer's `linger.ms`) is ignored by the others, as librdkafka does
//! with a property of the other kind (it logs a warning).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext};

/// The librdkafka properties pulse sets itself on the clients that need them, and why
/// an operator may not override them.
pub(crate) const RESERVED_PROPERTIES: [(&str, &str); 11] = [
    ("bootstrap.servers", "set by --brokers"),
    (
        "metadata.broker.list",
        "an alias of bootstrap.servers, set by --brokers",
    ),
    ("group.id", "set by --group (the ingest consumer's group)"),
    (
        "enable.auto.commit",
        "pulse commits each partition's offset only after its events are applied",
    ),
    (
        "auto.commit.enable",
        "an alias of enable.auto.commit: pulse commits each partition's offset only after its events are applied",
    ),
    (
        "enable.auto.offset.store",
        "pulse commits the offsets it applied, never librdkafka's stored ones",
    ),
    (
        "group.protocol",
        "pulse's rebalance handling (commit on revoke, replay on assign) runs on the classic protocol",
    ),
    (
        "partition.assignment.strategy",
        "pulse's rebalance handling is incremental (cooperative-sticky)",
    ),
    (
        "enable.partition.eof",
        "the model watcher needs it on and ingest needs it off",
    ),
    (
        "auto.offset.reset",
        "where a partition starts is pulse's replay rule (and the model watcher reads from the beginning)",
    ),
    (
        "transactional.id",
        "pulse's producers are not transactional",
    ),
];

/// An operator property pulse refuses, or a properties file it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KafkaPropertyError {
    /// The property is one pulse sets itself.
    #[error("{key}: pulse sets this property itself ({why})")]
    Reserved {
        /// The property.
        key: String,
        /// Why pulse needs its own value.
        why: &'static str,
    },
    /// A property without a name, or a `KEY=VALUE` without `=`.
    #[error("{0:?}: expected KEY=VALUE")]
    Malformed(String),
    /// The properties file cannot be read.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A line of the properties file is not `key=value` (nor a comment, nor blank).
    #[error("{path}: line {line}: {text:?}: expected key=value")]
    FileLine {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// The line.
        text: String,
    },
}

/// Refuses the first property pulse sets itself.
pub fn check_properties(properties: &BTreeMap<String, String>) -> Result<(), KafkaPropertyError> {
    for key in properties.keys() {
        if key.trim().is_empty() {
            return Err(KafkaPropertyError::Malformed(key.clone()));
        }
        if let Some((_, why)) = RESERVED_PROPERTIES.iter().find(|(k, _)| k == key) {
            return Err(KafkaPropertyError::Reserved {
                key: key.clone(),
                why,
            });
        }
    }
    Ok(())
}

/// `KEY=VALUE`, as `--kafka-property` takes it (the value may hold `=`).
pub fn parse_property(s: &str) -> Result<(String, String), KafkaPropertyError> {
    match s.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(KafkaPropertyError::Malformed(s.to_owned())),
    }
}

/// Reads a Java-style properties file, as Kafka's own tools take `--command-config`:
/// one `key=value` per line (or `key: value`), `#` and `!` comment lines, blank lines
/// skipped; keys and values trimmed. A line that is none of those fails, naming the
/// file and the line. (Line continuations and escapes are not read: librdkafka's
/// values need neither.)
pub fn read_properties_file(path: &Path) -> Result<BTreeMap<String, String>, KafkaPropertyError> {
    let text = std::fs::read_to_string(path).map_err(|e| KafkaPropertyError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let mut properties = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let split = trimmed
            .find(['=', ':'])
            .map(|at| (&trimmed[..at], &trimmed[at + 1..]));
        match split {
            Some((key, value)) if !key.trim().is_empty() => {
                properties.insert(key.trim().to_owned(), value.trim().to_owned());
            }
            _ => {
                return Err(KafkaPropertyError::FileLine {
                    path: path.to_owned(),
                    line: n + 1,
                    text: line.to_owned(),
                });
            }
        }
    }
    Ok(properties)
}

/// Where pulse's Kafka clients connect and how: the bootstrap servers plus the
/// operator's librdkafka properties. Every client pulse makes is built from one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaClients {
    brokers: String,
    properties: BTreeMap<String, String>,
}

impl KafkaClients {
    /// Clients of `brokers` (`HOST:PORT,...`) with librdkafka's defaults: no TLS, no
    /// SASL.
    pub fn new(brokers: impl Into<String>) -> Self {
        KafkaClients {
            brokers: brokers.into(),
            properties: BTreeMap::new(),
        }
    }

    /// These clients with the operator's `properties` on top of each client's own
    /// settings; a property pulse sets itself is refused.
    pub fn with_properties(
        mut self,
        properties: BTreeMap<String, String>,
    ) -> Result<Self, KafkaPropertyError> {
        check_properties(&properties)?;
        self.properties = properties;
        Ok(self)
    }

    /// These clients with `client.id` set to `id`, unless the operator set one (then
    /// `None`: the operator's stays).
    pub fn with_client_id(mut self, id: &str) -> Option<Self> {
        if self.properties.contains_key("client.id") {
            return None;
        }
        self.properties
            .insert("client.id".to_owned(), id.to_owned());
        Some(self)
    }

    /// `bootstrap.servers`.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The operator's properties.
    pub fn properties(&self) -> &BTreeMap<String, String> {
        &self.properties
    }

    /// A client's configuration: `bootstrap.servers`, then `own` (the client's own
    /// settings), then the operator's properties.
    pub(crate) fn config(&self, own: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in own {
            config.set(*key, *value);
        }
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }
}

/// The kind of a client error, as a metric label: `authentication` (SASL refused),
/// `tls` (the handshake failed: an untrusted or mismatched certificate, TLS spoken to
/// a plaintext listener), `transport`, `all_brokers_down`, `unknown_topic` (the topic
/// is not there yet), `end_of_partition` (no error: caught up; never counted) or
/// `other`.
pub(crate) fn error_kind(error: &KafkaError) -> &'static str {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::PartitionEOF) => "end_of_partition",
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            "unknown_topic"
        }
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
            "authentication"
        }
        Some(RDKafkaErrorCode::SSL) => "tls",
        Some(RDKafkaErrorCode::BrokerTransportFailure) => "transport",
        Some(RDKafkaErrorCode::AllBrokersDown) => "all_brokers_down",
        _ => "other",
    }
}

/// How a client-level error librdkafka reports (its error callback, "Global error")
/// is worth logging: end of a partition is no error at all (the model watcher asks
/// for it), a topic that is not there yet is news once, not an error (ingest waits for
/// it), anything else is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientErrorLevel {
    /// Not logged above debug.
    Quiet,
    /// Logged at info, once per client while it lasts.
    Waiting,
    /// Logged at error.
    Error,
}

/// What [`ClientErrorLevel`] `error` has.
pub(crate) fn client_error_level(error: &KafkaError) -> ClientErrorLevel {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::PartitionEOF) => ClientErrorLevel::Quiet,
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            ClientErrorLevel::Waiting
        }
        _ => ClientErrorLevel::Error,
    }
}

/// Logs a client-level error at its [`ClientErrorLevel`]; `waiting` remembers that the
/// "topic not there yet" line was written (cleared by the caller when it gets a
/// message).
pub(crate) fn log_client_error(
    error: &KafkaError,
    reason: &str,
    waiting: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    match client_error_level(error) {
        ClientErrorLevel::Quiet => tracing::debug!(%error, reason, "kafka client"),
        ClientErrorLevel::Waiting => {
            if !waiting.swap(true, Ordering::Relaxed) {
                tracing::info!(reason, "kafka: a topic is not there yet; waiting for it");
            } else {
                tracing::debug!(%error, reason, "kafka: still waiting for a topic");
            }
        }
        ClientErrorLevel::Error => tracing::error!(%error, reason, "kafka client error"),
    }
}

/// A client context that logs client-level errors by [`log_client_error`] (librdkafka's
/// own log lines go to `tracing` as the default context sends them).
#[derive(Debug, Default)]
pub(crate) struct QuietContext {
    waiting: std::sync::atomic::AtomicBool,
}

impl ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason, &self.waiting);
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The operator's properties come after the client's own settings; the
    /// bootstrap servers come first.
    #[test]
    fn the_operator_has_the_last_word_except_on_reserved_properties() {
        let kafka = KafkaClients::new("b:9092")
            .with_properties(props(&[
                ("security.protocol", "SASL_SSL"),
                ("linger.ms", "50"),
            ]))
            .unwrap();
        let config = kafka.config(&[("linger.ms", "1"), ("acks", "all")]);
        assert_eq!(config.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(config.get("linger.ms"), Some("50"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));

        for (key, _) in RESERVED_PROPERTIES {
            let error = KafkaClients::new("b:9092")
                .with_properties(props(&[(key, "x")]))
                .unwrap_err();
            assert!(error.to_string().starts_with(key), "{error}");
        }
    }

    #[test]
    fn a_property_flag_is_key_equals_value() {
        assert_eq!(
            parse_property("sasl.password=a=b").unwrap(),
            ("sasl.password".to_owned(), "a=b".to_owned())
        );
        assert!(parse_property("no-equals").is_err());
        assert!(parse_property("=value").is_err());
    }

    /// End of a partition is no error; a topic not there yet is waited for; the rest
    /// are errors.
    #[test]
    fn client_errors_are_logged_at_what_they_mean() {
        let eof = KafkaError::MessageConsumption(RDKafkaErrorCode::PartitionEOF);
        let unknown = KafkaError::Global(RDKafkaErrorCode::UnknownTopicOrPartition);
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(client_error_level(&eof), ClientErrorLevel::Quiet);
        assert_eq!(client_error_level(&unknown), ClientErrorLevel::Waiting);
        assert_eq!(client_error_level(&down), ClientErrorLevel::Error);
    }

    /// Comments (`#`, `!`), blank lines, `=` and `:` separators; a malformed line is
    /// refused naming the file and the line.
    #[test]
    fn a_properties_file_is_read_as_kafka_tools_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.properties");
        std::fs::write(
            &path,
            "# SASL\n! another comment\n\nsecurity.protocol = SASL_PLAINTEXT\n\
             sasl.mechanisms=PLAIN\nsasl.username: edge-pulse\nsasl.password=a=b\n",
        )
        .unwrap();
        assert_eq!(
            read_properties_file(&path).unwrap(),
            props(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanisms", "PLAIN"),
                ("sasl.username", "edge-pulse"),
                ("sasl.password", "a=b"),
            ])
        );
        std::fs::write(&path, "acks=all\njust a line\n").unwrap();
        let error = read_properties_file(&path).unwrap_err().to_string();
        assert!(
            error.contains("client.properties") && error.contains("line 2"),
            "{error}"
        );
        let missing = read_properties_file(&dir.path().join("none")).unwrap_err();
        assert!(matches!(missing, KafkaPropertyError::File { .. }));
    }
}
