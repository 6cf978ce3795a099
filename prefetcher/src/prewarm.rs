//! The pre-warm consumer: reads [`PrewarmCommand`]s from `kafka.prewarm_topic` and
//! pre-warms through the node's own single-flight path ([`Node::prewarm`]).
//!
//! Every node reads every command: each node is its own consumer group
//! (`prefetcher-{node}` unless `kafka.group_id` says otherwise). Each message is
//! untrusted input, checked in this order, and a refusal is counted in
//! `prefetcher_prefetches_rejected_total{reason}`, never a crash or a stalled
//! partition:
//!
//! 1. the codec (`too_large`, `malformed`, `invalid_field`, `unsupported_version`):
//!    it already refuses a key that is a URL, escapes with `..`, or is oversized;
//! 2. `expired`: past `expires_at_ms`;
//! 3. `other_region`: the command's `regions` do not include this node's region;
//! 4. `unknown_tenant`: the tenant is not in this node's configuration (the origin
//!    always comes from that configuration, never from the command);
//! 5. `duplicate`: a command with this id was acted on and has not expired (pulse gives
//!    a decision made again, after a replay or a rebalance, the id of the first);
//! 6. `full`: too many keys in flight.
//!
//! Whatever `priority` a command asks for, the fill runs in the prefetch class: a
//! forged command cannot claim user capacity. Offsets are stored after a message is
//! handled and committed in the background (at-least-once; a replayed pre-warm is
//! harmless, it finds the entry cached or joins the flight).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use models::{PrewarmCommand, RegionId, decode};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::watch;

use crate::config::{Config, KafkaConfig};
use crate::events::unix_now_ms;
use crate::proxy::{Node, PrewarmOutcome};
use crate::publisher::client_config;
use crate::status::RejectReason;

/// Logs rebalances and commits (the edge agent's pre-warm consumer uses it too).
pub(crate) struct LoggingContext;

impl ClientContext for LoggingContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // The consumer's own loop says once that it waits for a missing topic; end of
        // a partition is no error.
        if is_waiting_for_topic(&error)
            || error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        {
            tracing::debug!(%error, reason, "pre-warm consumer");
        } else {
            tracing::error!(%error, reason, "pre-warm consumer: kafka client error");
        }
    }
}

impl ConsumerContext for LoggingContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        tracing::info!(?rebalance, "pre-warm consumer: rebalance starting");
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        tracing::info!(?rebalance, "pre-warm consumer: rebalance done");
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::debug!("pre-warm consumer: offsets committed"),
            Err(error) => tracing::warn!(%error, "pre-warm consumer: commit failed"),
        }
    }
}

/// Checks one message payload against the node and, if it passes and is not a
/// repeat, pre-warms. `now_ms` is the wall clock in milliseconds since the Unix epoch.
pub fn handle_prewarm(
    node: &Node,
    region: &RegionId,
    recent: &mut RecentCommands,
    payload: Option<&[u8]>,
    now_ms: u64,
) -> Result<PrewarmOutcome, RejectReason> {
    let command = check_prewarm(region, payload, now_ms)?;
    if recent.is_repeat(&command.id, now_ms) {
        return Err(RejectReason::Duplicate);
    }
    let outcome = node
        .prewarm(&command.tenant, command.key)
        .map_err(|e| e.reason())?;
    recent.record(command.id, command.expires_at_ms, now_ms);
    Ok(outcome)
}

/// The ids of the commands a consumer acted on, each until it expires, at most
/// `capacity` of them (the oldest go first): a repeat of one is dropped.
#[derive(Debug)]
pub struct RecentCommands {
    expiry: HashMap<String, u64>,
    order: VecDeque<String>,
    capacity: usize,
}

impl RecentCommands {
    /// Ids a consumer remembers by default: a few MiB, minutes of a busy fleet.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// An empty set that holds at most `capacity` ids.
    pub fn new(capacity: usize) -> RecentCommands {
        RecentCommands {
            expiry: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Whether a command with `id` was acted on and has not expired at `now_ms`.
    pub fn is_repeat(&self, id: &str, now_ms: u64) -> bool {
        self.expiry.get(id).is_some_and(|expires| now_ms < *expires)
    }

    /// Remembers that the command `id` (valid until `expires_at_ms`) was acted on.
    pub fn record(&mut self, id: String, expires_at_ms: u64, now_ms: u64) {
        // Drop expired ids from the front (commands expire about in arrival order),
        // then the oldest while full.
        while let Some(front) = self.order.front() {
            let expired = self.expiry.get(front).is_none_or(|e| *e <= now_ms);
            if !expired && self.order.len() < self.capacity {
                break;
            }
            if let Some(old) = self.order.pop_front() {
                self.expiry.remove(&old);
            }
        }
        if self.expiry.insert(id.clone(), expires_at_ms).is_none() {
            self.order.push_back(id);
        }
    }

    /// Ids held now.
    pub fn len(&self) -> usize {
        self.expiry.len()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }
}

/// Checks 1 to 3 of the list above (codec, `expired`, `other_region`) on one message
/// payload for a node in `region`: every consumer of `prewarm` (the node's, the edge
/// agent's) runs these same checks, then its own `unknown_tenant` lookup.
pub fn check_prewarm(
    region: &RegionId,
    payload: Option<&[u8]>,
    now_ms: u64,
) -> Result<PrewarmCommand, RejectReason> {
    let command: PrewarmCommand =
        decode(payload.unwrap_or_default()).map_err(|e| RejectReason::from(&e))?;
    if command.is_expired(now_ms) {
        return Err(RejectReason::Expired);
    }
    if !command.regions.includes(region) {
        return Err(RejectReason::OtherRegion);
    }
    Ok(command)
}

/// A node's pre-warm consumer.
pub struct PrewarmConsumer {
    consumer: StreamConsumer<LoggingContext>,
    node: Node,
    region: RegionId,
    topic: String,
}

impl std::fmt::Debug for PrewarmConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrewarmConsumer")
            .field("topic", &self.topic)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl PrewarmConsumer {
    /// A consumer for `node`, configured by its validated config (Kafka on), already
    /// subscribed to `kafka.prewarm_topic`.
    pub fn new(node: Node) -> Result<PrewarmConsumer, KafkaError> {
        let config: &Config = node.config();
        let Some(region) = config.region.clone() else {
            return Err(KafkaError::ClientCreation(
                "the pre-warm consumer needs `region` in the config".into(),
            ));
        };
        let kafka = &config.kafka;
        let consumer = subscribe_prewarm(kafka, &config.prewarm_group())?;
        let topic = kafka.prewarm_topic.clone();
        Ok(PrewarmConsumer {
            consumer,
            node,
            region,
            topic,
        })
    }

    /// Reads and handles commands until `shutdown` turns true, then commits the
    /// stored offsets.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(topic = %self.topic, region = %self.region, "pre-warm consumer started");
        let metrics = self.node.metrics();
        let mut recent = RecentCommands::new(RecentCommands::DEFAULT_CAPACITY);
        let mut waiting = false;
        loop {
            let message = tokio::select! {
                message = self.consumer.recv() => message,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let message = match message {
                Ok(message) => {
                    waiting = false;
                    message
                }
                Err(error) if is_waiting_for_topic(&error) => {
                    // Pulse creates the topic; the edge waits for it, saying so once.
                    if !waiting {
                        tracing::info!(topic = %self.topic, "pre-warm consumer: waiting for the topic to be created");
                        waiting = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(error) => {
                    // Broker gone, rebalance in progress, ...: warn and keep going.
                    tracing::warn!(%error, "pre-warm consumer: receive failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            metrics.prefetches_received.inc();
            let now_ms = unix_now_ms();
            match handle_prewarm(
                &self.node,
                &self.region,
                &mut recent,
                message.payload(),
                now_ms,
            ) {
                Ok(outcome) => tracing::debug!(?outcome, "pre-warm"),
                Err(reason) => {
                    metrics.prewarm_rejected(reason);
                    tracing::debug!(
                        %reason,
                        partition = message.partition(),
                        offset = message.offset(),
                        "pre-warm command refused"
                    );
                }
            }
            if let Err(error) = self.consumer.store_offset_from_message(&message) {
                tracing::warn!(%error, "pre-warm consumer: storing the offset failed");
            }
        }
        // A synchronous commit blocks on the broker: keep it off the async threads.
        let consumer = self.consumer;
        let committed = tokio::task::spawn_blocking(move || {
            consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        })
        .await;
        match committed {
            Ok(Ok(())) => {}
            // Nothing consumed since the last commit.
            Ok(Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset))) => {}
            Ok(Err(error)) => tracing::warn!(%error, "pre-warm consumer: final commit failed"),
            Err(error) => tracing::warn!(%error, "pre-warm consumer: final commit panicked"),
        }
        tracing::info!("pre-warm consumer stopped");
    }
}

/// Whether `error` says the topic is not there (yet): the edge does not create the
/// pre-warm topic (pulse, its producer, does), so this is a wait, not a failure.
pub(crate) fn is_waiting_for_topic(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{UnknownTopic, UnknownTopicOrPartition};
    matches!(
        error.rdkafka_error_code(),
        Some(UnknownTopicOrPartition | UnknownTopic)
    )
}

/// A consumer of the pre-warm topic in `group`, subscribed. Offsets are stored by
/// hand after a message is handled, then committed by the background auto-commit.
pub(crate) fn subscribe_prewarm(
    kafka: &KafkaConfig,
    group: &str,
) -> Result<StreamConsumer<LoggingContext>, KafkaError> {
    let consumer: StreamConsumer<LoggingContext> = client_config(kafka)
        .set("group.id", group)
        .set("auto.offset.reset", kafka.prewarm_offset_reset.as_str())
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.commit.interval.ms", "1000")
        .set("session.timeout.ms", "10000")
        .create_with_context(LoggingContext)?;
    consumer.subscribe(&[&kafka.prewarm_topic])?;
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command acted on is a repeat until it expires, then no longer.
    #[test]
    fn a_repeat_is_dropped_until_the_command_expires() {
        let mut recent = RecentCommands::new(10);
        assert!(!recent.is_repeat("pw-1", 0));
        recent.record("pw-1".into(), 1_000, 0);
        assert!(recent.is_repeat("pw-1", 999));
        assert!(!recent.is_repeat("pw-1", 1_000), "expired");
        assert!(!recent.is_repeat("pw-2", 500), "another id");
    }

    /// A topic not there yet is waited for; other receive errors are failures.
    #[test]
    fn a_missing_topic_is_a_wait() {
        use rdkafka::types::RDKafkaErrorCode;
        assert!(is_waiting_for_topic(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(!is_waiting_for_topic(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::AllBrokersDown
        )));
    }

    /// Memory is bounded: past `capacity` the oldest ids go, and expired ones go
    /// whenever a new id comes.
    #[test]
    fn the_set_is_bounded() {
        let mut recent = RecentCommands::new(3);
        for i in 0..10 {
            recent.record(format!("pw-{i}"), 60_000, 0);
        }
        assert_eq!(recent.len(), 3);
        assert!(recent.is_repeat("pw-9", 1) && !recent.is_repeat("pw-0", 1));

        let mut recent = RecentCommands::new(100);
        recent.record("old".into(), 1_000, 0);
        recent.record("new".into(), 90_000, 5_000);
        assert_eq!(recent.len(), 1, "the expired id went");
    }
}
