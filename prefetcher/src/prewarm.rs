//! The pre-warm consumer: reads [`PrewarmCommand`]s from `kafka.prewarm_topic` and
//! pre-warms through the node's own single-flight path ([`Node::prewarm`]).
//!
//! Every node reads every command: each node is its own consumer group
//! (`prefetcher-{node}` unless `kafka.group_id` says otherwise). Each message is
//! untrusted input, checked in this order, and a refusal is counted in
//! `prefetcher_prefetches_rejected_total{reason}`, never a crash or a stalled
//! partition:
//!
//! 0. with `kafka.prewarm_keys_file` set, the signature, before a byte of the payload
//!    is parsed ([`check_signature`]): `unsigned` (no `edge-pulse-sig` header),
//!    `unknown_key` (a key id not in the file), `bad_signature` (the HMAC does not match
//!    the payload, or the header is malformed or repeated). Without keys, commands are
//!    not authenticated: anyone who can produce to the topic is obeyed;
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
//!
//! The topic also carries purges ([`PurgeCommand`], told apart by their `kind`):
//! the same checks, in the same order, then [`handle_purge`]; their refusals are
//! counted in `prefetcher_purges_rejected_total{reason}`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use models::{
    CommandKind, PrewarmCommand, PurgeCommand, RegionId, SIGNATURE_HEADER, SigningKeys,
    command_kind, decode,
};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::watch;

use crate::config::{Config, KafkaConfig};
use crate::events::unix_now_ms;
use crate::proxy::{Node, PrewarmOutcome};
use crate::publisher::client_config;
use crate::purge::PurgeReport;
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
/// The signature (check 0) is the caller's, before this: [`check_signature`].
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

/// A purge command from the pre-warm topic, its signature already checked
/// (`crate::prewarm::check_signature`): the codec, `expired`, `other_region`,
/// `duplicate`, then [`Node::purge`] (`unknown_tenant`, `invalid_field`).
pub fn handle_purge(
    node: &Node,
    region: &RegionId,
    recent: &mut RecentCommands,
    payload: Option<&[u8]>,
    now_ms: u64,
) -> Result<PurgeReport, RejectReason> {
    let command: PurgeCommand =
        decode(payload.unwrap_or_default()).map_err(|e| RejectReason::from(&e))?;
    if command.is_expired(now_ms) {
        return Err(RejectReason::Expired);
    }
    if !command.regions.includes(region) {
        return Err(RejectReason::OtherRegion);
    }
    if recent.is_repeat(&command.id, now_ms) {
        return Err(RejectReason::Duplicate);
    }
    let (id, expires) = (command.id.clone(), command.expires_at_ms);
    let report = node
        .purge(&command.into(), "command")
        .map_err(|e| e.reason())?;
    recent.record(id, expires, now_ms);
    Ok(report)
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

/// Check 0 of the list above: with `keys`, `message` must carry one
/// [`SIGNATURE_HEADER`] that is a valid HMAC of its exact payload by one of them;
/// without keys every message passes. Every consumer of `prewarm` (the node's, the
/// edge agent's) runs it first.
pub fn check_signature(
    keys: Option<&SigningKeys>,
    message: &impl Message,
) -> Result<(), RejectReason> {
    let Some(keys) = keys else {
        return Ok(());
    };
    let mut signature = None;
    if let Some(headers) = message.headers() {
        for header in headers.iter().filter(|h| h.key == SIGNATURE_HEADER) {
            // A second signature header could make two readers disagree on which one
            // counts: refused, as a missing value is.
            if signature.is_some() || header.value.is_none() {
                return Err(RejectReason::BadSignature);
            }
            signature = header.value;
        }
    }
    keys.verify(signature, message.payload().unwrap_or_default())
        .map(|_| ())
        .map_err(RejectReason::from)
}

/// Logs, once at start, whether a consumer authenticates commands (`who` names it).
pub(crate) fn log_authentication(who: &str, keys: Option<&SigningKeys>) {
    match keys {
        Some(keys) => tracing::info!(
            keys = ?keys.ids().collect::<Vec<_>>(),
            "{who}: pre-warm commands must be signed with one of these keys"
        ),
        None => tracing::info!(
            "{who}: pre-warm commands are not authenticated (no kafka.prewarm_keys_file)"
        ),
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
    keys: Option<SigningKeys>,
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
    /// subscribed to `kafka.prewarm_topic`. With `keys` (the node's
    /// [`KafkaConfig::prewarm_keys`]) it acts only on commands signed by one of them.
    pub fn new(node: Node, keys: Option<SigningKeys>) -> Result<PrewarmConsumer, KafkaError> {
        let config: &Config = &node.config();
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
            keys,
            node,
            region,
            topic,
        })
    }

    /// Reads and handles commands until `shutdown` turns true, then commits the
    /// stored offsets.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(topic = %self.topic, region = %self.region, "pre-warm consumer started");
        log_authentication("pre-warm consumer", self.keys.as_ref());
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
            // The kind is read from a payload whose signature may not hold yet: only
            // to tell which handler (or, refused, which count) it goes to.
            let kind = command_kind(message.payload().unwrap_or_default());
            let handled = check_signature(self.keys.as_ref(), &message).and_then(|()| {
                let (node, region, payload) = (&self.node, &self.region, message.payload());
                match kind {
                    CommandKind::Prewarm => {
                        handle_prewarm(node, region, &mut recent, payload, now_ms)
                            .map(|outcome| tracing::debug!(?outcome, "pre-warm"))
                    }
                    CommandKind::Purge => handle_purge(node, region, &mut recent, payload, now_ms)
                        .map(|report| tracing::debug!(?report, "purge")),
                }
            });
            match handled {
                Ok(()) => {}
                Err(reason) => {
                    match kind {
                        CommandKind::Prewarm => metrics.prewarm_rejected(reason),
                        CommandKind::Purge => metrics.purge.rejected(reason),
                    }
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
    use models::{SignatureError, Signer};
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::*;

    const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn message(payload: &[u8], signatures: &[Option<&str>]) -> OwnedMessage {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "other",
            value: Some("x"),
        });
        for value in signatures {
            headers = headers.insert(Header {
                key: SIGNATURE_HEADER,
                value: *value,
            });
        }
        OwnedMessage::new(
            Some(payload.to_vec()),
            None,
            "prewarm".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        )
    }

    fn signer(id: &str, secret: &str) -> Signer {
        SigningKeys::parse(&format!("{id} {secret}"))
            .unwrap()
            .signer(id)
            .unwrap()
    }

    /// Without keys nothing is asked of a message; with keys, only one signature header
    /// that is a valid HMAC of the payload passes, and each refusal has its reason.
    #[test]
    fn with_keys_only_a_message_signed_by_one_of_them_passes() {
        let keys = SigningKeys::parse(&format!("k1 {SECRET}")).unwrap();
        let good = signer("k1", SECRET).sign(b"{}");
        let forged = signer("k1", &SECRET.replace('0', "f")).sign(b"{}");
        let unknown = signer("k7", SECRET).sign(b"{}");
        assert_eq!(check_signature(None, &message(b"{}", &[])), Ok(()));
        assert_eq!(
            check_signature(Some(&keys), &message(b"{}", &[Some(&good)])),
            Ok(())
        );
        let refused = [
            (message(b"{}", &[]), SignatureError::Unsigned),
            (
                message(b"{ }", &[Some(&good)]),
                SignatureError::BadSignature,
            ),
            (
                message(b"{}", &[Some(&forged)]),
                SignatureError::BadSignature,
            ),
            (
                message(b"{}", &[Some(&unknown)]),
                SignatureError::UnknownKey,
            ),
            (message(b"{}", &[None]), SignatureError::BadSignature),
            (
                message(b"{}", &[Some(&good), Some(&good)]),
                SignatureError::BadSignature,
            ),
        ];
        for (i, (message, want)) in refused.into_iter().enumerate() {
            assert_eq!(
                check_signature(Some(&keys), &message),
                Err(RejectReason::from(want)),
                "case {i}"
            );
        }
    }

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
