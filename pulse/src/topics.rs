//! The topics pulse reads and writes, created at start where they are missing, so a
//! first start on a fresh broker is clean: the events topic (with the dead-letter
//! topic, if any) and the pre-warm topic, each with the configured partition count and
//! retention (the broker's replication default). A topic that is there already is used
//! as it is (its partition count and retention are the operator's). Where pulse may
//! not create a topic (no `CREATE` on the cluster), it says once, at info, that it
//! waits for it, and ingest waits.
//!
//! On an embedded broker of this process (the demo hands its address to
//! [`crate::start`]) the topics are created through it: the mock cluster has no admin
//! API.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};

use crate::broker::EmbeddedBroker;
use crate::kafka::KafkaClients;

/// Bound on the admin request.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A topic pulse needs and how to create it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicSpec {
    /// Its name.
    pub name: String,
    /// Partitions, when pulse creates it.
    pub partitions: i32,
    /// `retention.ms`, when pulse creates it (`None`: the broker's default).
    pub retention_ms: Option<u64>,
    /// Created with `cleanup.policy=compact` (a state topic: the last record per key).
    pub compacted: bool,
}

/// What happened to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// Created now.
    Created,
    /// It was there.
    Existed,
    /// The broker refused to create it (no permission, a policy): pulse waits for it.
    Refused(RDKafkaErrorCode),
}

/// Creates each of `topics` that is missing; a refusal is logged once at info (pulse
/// waits for that topic). Fails only when the broker cannot be asked at all.
pub(crate) async fn ensure_topics(
    clients: &KafkaClients,
    topics: &[TopicSpec],
) -> Result<Vec<(String, Ensured)>, KafkaError> {
    if EmbeddedBroker::is_running_at(clients.brokers()) {
        // The mock cluster keeps no topic configs (no retention) and does not tell a
        // topic it made from one it had: either way the topic is there.
        let mut out = Vec::new();
        for topic in topics {
            let created =
                EmbeddedBroker::create_topic_at(clients.brokers(), &topic.name, topic.partitions);
            match created {
                Some(Ok(())) | None => out.push((topic.name.clone(), Ensured::Existed)),
                Some(Err(e)) => {
                    tracing::info!(topic = %topic.name, error = %e, "the embedded broker did not create the topic; waiting for it");
                    out.push((
                        topic.name.clone(),
                        Ensured::Refused(RDKafkaErrorCode::Unknown),
                    ));
                }
            }
        }
        return Ok(out);
    }
    let admin: AdminClient<DefaultClientContext> = clients.config(&[]).create()?;
    let retention: Vec<Option<String>> = topics
        .iter()
        .map(|t| t.retention_ms.map(|ms| ms.to_string()))
        .collect();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .zip(&retention)
        .map(|(t, retention)| {
            let topic = NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(-1));
            let topic = match retention {
                Some(ms) if !t.compacted => topic.set("retention.ms", ms),
                _ => topic,
            };
            if t.compacted {
                topic.set("cleanup.policy", "compact")
            } else {
                topic
            }
        })
        .collect();
    let options = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    let results = admin.create_topics(&new, &options).await?;
    let mut out = Vec::new();
    for (result, spec) in results.into_iter().zip(topics) {
        let ensured = match result {
            Ok(_) => {
                tracing::info!(
                    topic = %spec.name,
                    partitions = spec.partitions,
                    retention_ms = spec.retention_ms,
                    "created the topic"
                );
                Ensured::Created
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(topic = %spec.name, "topic there already");
                Ensured::Existed
            }
            Err((_, code)) => {
                // Without CREATE permission the broker says so even of a topic that
                // exists; librdkafka's metadata says whether it does.
                if exists(clients, &spec.name).await {
                    Ensured::Existed
                } else {
                    tracing::info!(topic = %spec.name, refused = %code, "pulse may not create the topic; waiting for it to be created");
                    Ensured::Refused(code)
                }
            }
        };
        out.push((spec.name.clone(), ensured));
    }
    // A topic just created reaches every broker's metadata a moment later: waiting for
    // it keeps the consumer's first subscription from finding it missing.
    for (name, ensured) in &out {
        if *ensured == Ensured::Created {
            let deadline = std::time::Instant::now() + METADATA_WAIT;
            while !exists(clients, name).await && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Ok(out)
}

/// The longest pulse waits for a topic it created to appear in the metadata.
const METADATA_WAIT: Duration = Duration::from_secs(5);

/// Whether the broker's metadata lists `topic` (with partitions).
async fn exists(clients: &KafkaClients, topic: &str) -> bool {
    // A blocking metadata request, on a client of its own: off the async threads.
    // Asking about a topic must not create it (a producer's metadata request may,
    // where the broker auto-creates topics).
    let config = clients.config(&[("allow.auto.create.topics", "false")]);
    let topic = topic.to_owned();
    let found = tokio::task::spawn_blocking(move || {
        let client: BaseProducer = config.create().ok()?;
        let metadata = client
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(5))
            .ok()?;
        Some(
            metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()),
        )
    })
    .await;
    matches!(found, Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the embedded broker of this process, topics are made without the admin API
    /// (which the mock cluster lacks), and making them again is no error.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_embedded_broker_gets_its_topics_at_once() {
        let broker = EmbeddedBroker::start(1).unwrap();
        let clients = KafkaClients::new(broker.bootstrap_servers());
        let specs = [TopicSpec {
            name: "events".into(),
            partitions: 2,
            retention_ms: Some(60_000),
            compacted: false,
        }];
        for _ in 0..2 {
            let ensured = ensure_topics(&clients, &specs).await.unwrap();
            assert_eq!(ensured, [("events".to_owned(), Ensured::Existed)]);
        }
    }
}
