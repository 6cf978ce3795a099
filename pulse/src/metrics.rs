//! Prometheus metrics, served as text at `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::predict::Skip;
use crate::reject::RejectReason;

/// Label of rejected events, skipped keys and retrains.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`RejectReason::as_str`], [`Skip::as_str`], or a retrain's outcome.
    pub reason: &'static str,
}

/// Label of the gate's decisions.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// What the gate did: `admitted`, `cooldown`, `over_budget`, `duplicate`,
    /// `invalid`, `state_unavailable`.
    pub outcome: &'static str,
}

/// What the gate can do with a proposal (`gate::Admission`'s labels, then `invalid`: a
/// message that is not a decision or a state, and `state_unavailable`: the partition's
/// state could not be read, so nothing of it is admitted).
pub(crate) const GATE_OUTCOMES: [&str; 6] = [
    "admitted",
    "cooldown",
    "over_budget",
    "duplicate",
    "invalid",
    "state_unavailable",
];

/// Label of HTTP request metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The matched route, such as `/api/heatmap`.
    pub route: String,
    /// The response status code.
    pub status: u16,
}

type HistogramFamily = Family<RouteLabel, Histogram, fn() -> Histogram>;

/// Label of a peer's answers to fleet questions.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    /// The peer's base URL.
    pub peer: String,
    /// `ok`, or why it is not an answer ([`PeerFailure::as_str`]).
    pub outcome: &'static str,
}

/// Label of the producers' partitioner metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionerLabel {
    /// `consistent_random`, `murmur2_random`, `fnv1a` (or `none`).
    pub name: &'static str,
}

/// What a model-topic watcher has done, as Prometheus counters the service can register.
#[derive(Debug)]
pub struct ModelWatcherCounts {
    /// Models handed to the callback.
    pub applied: Counter,
    /// Valid models skipped because they equal the one in use.
    pub unchanged: Counter,
    /// Messages skipped, by reason (`too_large`, `wrong_key`, `no_payload`, `not_utf8`, `invalid`; `invalid` is not JSON
    /// for a model this build reads).
    pub rejected: Family<ReasonLabel, Counter>,
    pub(crate) caught_up: AtomicBool,
}

impl ModelWatcherCounts {
    /// Messages rejected for `reason`.
    pub fn rejected(&self, reason: &'static str) -> u64 {
        self.rejected.get_or_create(&ReasonLabel { reason }).get()
    }

    /// Whether the watcher has read the whole topic once (the newest model at start
    /// has been applied, if there was one).
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }
}

/// Every metric pulse exports. Cheap to update from any thread.
pub struct Metrics {
    registry: Registry,
    /// Events decoded and applied live to a partition's heat map.
    pub consumed: Counter,
    /// Events applied while a newly assigned partition rebuilt its windows (never
    /// scored or sent).
    pub events_replayed: Counter,
    /// Partitions of the events topic this instance owns.
    pub partitions_owned: Gauge,
    /// 1 for the partitioner that placed every keyed message consumed (`none`: no
    /// partitioner fits, or too few messages yet), 0 for the others.
    pub partitioner: Family<PartitionerLabel, Gauge>,
    /// Keyed messages consumed each partitioner placed, out of `partitioner_pairs`.
    pub partitioner_agreeing: Family<PartitionerLabel, Gauge>,
    /// Keyed messages consumed whose partition was checked.
    pub partitioner_pairs: Gauge,
    /// Synchronous commits of revoked partitions' applied offsets.
    pub revoke_commits: Counter,
    /// Messages skipped, by reason ([`RejectReason`]; every one is exported from the
    /// start, at 0).
    pub rejected: Family<ReasonLabel, Counter>,
    /// Rejected messages forwarded to the dead-letter topic.
    pub dead_lettered: Counter,
    /// Errors the ingest consumer polled instead of a message, by kind
    /// (`authentication`: the broker refused pulse's credentials; `tls`: the TLS
    /// handshake failed; `transport`, `all_brokers_down`, `unknown_topic`: the topic is
    /// not there yet, `other`; the end of a partition is no error and not counted).
    pub consume_errors: Family<ReasonLabel, Counter>,
    /// Messages behind the partitions' high watermarks, summed.
    pub consumer_lag: Gauge,
    /// The longest grace of the owned partitions: how far behind its watermark a
    /// partition also measures a key's last second, from how late its events arrive.
    pub lateness_grace_ms: Gauge,
    /// Approximate bytes held by the sketches.
    pub sketch_bytes: Gauge,
    /// Tenants tracked.
    pub tenants: Gauge,
    /// Tenants evicted after a window without events (`pulse_tenants_evicted_total`).
    pub tenants_evicted: Counter,
    /// Checkpoints written.
    pub checkpoints: Counter,
    /// Offset commits requested.
    pub commits: Counter,
    /// HTTP request latency in seconds.
    pub request_seconds: HistogramFamily,
    /// Keys scored by the model.
    pub keys_scored: Counter,
    /// Pre-warm commands produced to the prewarm topic.
    pub prewarm_sent: Counter,
    /// Pre-warm commands that could not be handed to the producer.
    pub prewarm_send_failed: Counter,
    /// Decisions the partitions proposed to the fleet's gate (the decisions topic).
    pub prewarm_proposed: Counter,
    /// Operators' warm-up commands proposed to the fleet's gate (`POST /api/warm`).
    pub warm_proposed: Counter,
    /// Purge commands sent to the fleet (`POST /api/purge`).
    pub purges_sent: Counter,
    /// What the fleet's gate did with the proposals it read, by outcome.
    pub gate_decisions: Family<OutcomeLabel, Counter>,
    /// Commands requested in a warmed region before they expired.
    pub prewarm_useful: Counter,
    /// Commands that expired with no request in any warmed region.
    pub prewarm_wasted: Counter,
    /// Scored keys that got no command, by reason ([`Skip`]; every one is exported
    /// from the start, at 0).
    pub prewarm_skipped: Family<ReasonLabel, Counter>,
    /// From the oldest event a tick decided on being applied to its commands handed to
    /// the producer (the wait for the tick included).
    pub decision_seconds: Histogram,
    /// Background retrains, by outcome (`replaced`, `kept`, `not_enough_data`; with the
    /// fleet model topic `published`, `publish_failed`, and `elsewhere` on instances
    /// that do not own partition 0).
    pub retrains: Family<ReasonLabel, Counter>,
    /// Peers' answers to fleet questions, by peer and outcome.
    pub peer_answers: Family<PeerLabel, Counter>,
    /// How long peers took to answer a fleet question (failures included).
    pub peer_seconds: Histogram,
    /// What the model-topic watcher applied, skipped and refused.
    pub model_watch: Arc<ModelWatcherCounts>,
    /// Unix time, in seconds, the scoring model in use was put in use (loaded at
    /// start, a retrain that replaced it, a fleet model applied); 0 with prediction
    /// off. Its age is `time() - pulse_model_in_use_since_seconds`.
    pub model_in_use_since: Gauge,
    /// Answers for the fleet gathered from the peers (`--peers`).
    pub fleet_answers: Counter,
    /// Of those, answers that say they miss a partition or a peer (`coverage`
    /// incomplete).
    pub fleet_answers_incomplete: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pulse");
        let m = Metrics {
            consumed: Counter::default(),
            events_replayed: Counter::default(),
            partitions_owned: Gauge::default(),
            partitioner: Family::default(),
            partitioner_agreeing: Family::default(),
            partitioner_pairs: Gauge::default(),
            revoke_commits: Counter::default(),
            rejected: Family::default(),
            dead_lettered: Counter::default(),
            consume_errors: Family::default(),
            consumer_lag: Gauge::default(),
            lateness_grace_ms: Gauge::default(),
            sketch_bytes: Gauge::default(),
            tenants: Gauge::default(),
            tenants_evicted: Counter::default(),
            checkpoints: Counter::default(),
            commits: Counter::default(),
            request_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
            }),
            keys_scored: Counter::default(),
            prewarm_sent: Counter::default(),
            prewarm_send_failed: Counter::default(),
            prewarm_proposed: Counter::default(),
            warm_proposed: Counter::default(),
            purges_sent: Counter::default(),
            gate_decisions: Family::default(),
            prewarm_useful: Counter::default(),
            prewarm_wasted: Counter::default(),
            prewarm_skipped: Family::default(),
            decision_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            retrains: Family::default(),
            peer_answers: Family::default(),
            peer_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            model_watch: Arc::default(),
            model_in_use_since: Gauge::default(),
            fleet_answers: Counter::default(),
            fleet_answers_incomplete: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "events_consumed",
            "Events decoded and applied",
            m.consumed.clone(),
        );
        registry.register(
            "events_replayed",
            "Events applied while a newly assigned partition rebuilt its windows",
            m.events_replayed.clone(),
        );
        registry.register(
            "partitions_owned",
            "Partitions of the events topic this instance owns",
            m.partitions_owned.clone(),
        );
        registry.register(
            "partitioner",
            "1 for the producers' partitioner that placed every keyed message consumed (none: keys are looked up in every partition)",
            m.partitioner.clone(),
        );
        registry.register(
            "partitioner_agreeing_messages",
            "Keyed messages consumed each partitioner would have placed where they were",
            m.partitioner_agreeing.clone(),
        );
        registry.register(
            "partitioner_messages",
            "Keyed messages consumed whose partition was checked against the partitioners",
            m.partitioner_pairs.clone(),
        );
        registry.register(
            "revoke_commits",
            "Commits of revoked partitions' applied offsets",
            m.revoke_commits.clone(),
        );
        registry.register(
            "events_rejected",
            "Messages skipped, by reason",
            m.rejected.clone(),
        );
        registry.register(
            "events_dead_lettered",
            "Rejected messages forwarded to the dead-letter topic",
            m.dead_lettered.clone(),
        );
        registry.register(
            "consume_errors",
            "Errors the ingest consumer polled instead of a message, by kind (authentication: credentials refused)",
            m.consume_errors.clone(),
        );
        registry.register(
            "consumer_lag_messages",
            "Messages behind the high watermark, all assigned partitions",
            m.consumer_lag.clone(),
        );
        registry.register(
            "event_lateness_grace_ms",
            "How far behind its watermark a partition also measures a key's last second, from how late its events arrive (the longest of the owned partitions; 0: in time order)",
            m.lateness_grace_ms.clone(),
        );
        registry.register(
            "sketch_memory_bytes",
            "Approximate bytes held by sketches and Top-K trackers",
            m.sketch_bytes.clone(),
        );
        registry.register("tenants", "Tenants tracked", m.tenants.clone());
        registry.register(
            "tenants_evicted",
            "Tenants evicted after a window without events",
            m.tenants_evicted.clone(),
        );
        registry.register("checkpoints", "Checkpoints written", m.checkpoints.clone());
        registry.register(
            "offset_commits",
            "Offset commits requested",
            m.commits.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            m.request_seconds.clone(),
        );
        registry.register(
            "keys_scored",
            "Keys scored by the model",
            m.keys_scored.clone(),
        );
        registry.register(
            "prewarm_commands_sent",
            "Pre-warm commands produced to the prewarm topic",
            m.prewarm_sent.clone(),
        );
        registry.register(
            "prewarm_commands_send_failed",
            "Pre-warm commands the producer refused (queue full or broker gone)",
            m.prewarm_send_failed.clone(),
        );
        registry.register(
            "prewarm_proposals",
            "Decisions proposed to the fleet's gate (the decisions topic)",
            m.prewarm_proposed.clone(),
        );
        registry.register(
            "warm_proposals",
            "Operators' warm-up commands proposed to the fleet's gate (POST /api/warm)",
            m.warm_proposed.clone(),
        );
        registry.register(
            "purges",
            "Purge commands sent, signed, to the pre-warm topic (POST /api/purge)",
            m.purges_sent.clone(),
        );
        registry.register(
            "gate_decisions",
            "Proposals the fleet's gate read, by what it did with them",
            m.gate_decisions.clone(),
        );
        registry.register(
            "prewarm_commands_useful",
            "Commands requested in a warmed region before they expired",
            m.prewarm_useful.clone(),
        );
        registry.register(
            "prewarm_commands_wasted",
            "Commands that expired with no request in any warmed region",
            m.prewarm_wasted.clone(),
        );
        registry.register(
            "prewarm_skipped",
            "Scored keys that got no command, by reason",
            m.prewarm_skipped.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "From the oldest event a tick decided on being applied to its pre-warm commands handed to the producer",
            m.decision_seconds.clone(),
        );
        registry.register(
            "model_retrains",
            "Background retrains, by outcome",
            m.retrains.clone(),
        );
        registry.register(
            "peer_answers",
            "Peers' answers to fleet questions, by peer and outcome",
            m.peer_answers.clone(),
        );
        registry.register(
            "peer_request_duration_seconds",
            "How long a peer took to answer a fleet question",
            m.peer_seconds.clone(),
        );
        registry.register(
            "fleet_models_applied",
            "Models from the model topic put in use",
            m.model_watch.applied.clone(),
        );
        registry.register(
            "fleet_models_unchanged",
            "Models from the model topic equal to the one in use",
            m.model_watch.unchanged.clone(),
        );
        registry.register(
            "fleet_models_rejected",
            "Messages on the model topic that are not a usable model, by reason",
            m.model_watch.rejected.clone(),
        );
        registry.register(
            "model_in_use_since_seconds",
            "Unix time the scoring model in use was put in use (0: prediction off)",
            m.model_in_use_since.clone(),
        );
        registry.register(
            "fleet_answers",
            "Answers for the fleet gathered from the peers",
            m.fleet_answers.clone(),
        );
        registry.register(
            "fleet_answers_incomplete",
            "Answers for the fleet that miss a partition or a peer",
            m.fleet_answers_incomplete.clone(),
        );
        // Every label a reason enum can give, so a dashboard sees each series at 0
        // before the first rejection and no list of labels is kept by hand.
        for reason in RejectReason::ALL {
            let _ = m.rejected.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        for skip in Skip::ALL {
            let _ = m.prewarm_skipped.get_or_create(&ReasonLabel {
                reason: skip.as_str(),
            });
        }
        for outcome in GATE_OUTCOMES {
            let _ = m.gate_decisions.get_or_create(&OutcomeLabel { outcome });
        }
        Metrics { registry, ..m }
    }

    /// Counts one rejected message.
    pub fn reject(&self, reason: RejectReason) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts `n` scored keys that got no command for `skip`.
    pub fn skip(&self, skip: Skip, n: u64) {
        self.prewarm_skipped
            .get_or_create(&ReasonLabel {
                reason: skip.as_str(),
            })
            .inc_by(n);
    }

    /// Counts one proposal the gate handled, by `outcome`.
    pub(crate) fn gate_outcome(&self, outcome: &'static str) {
        self.gate_decisions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Notes that a scoring model was put in use now.
    pub fn model_put_in_use(&self) {
        self.model_in_use_since
            .set((crate::clock::wall_clock_ms() / 1_000) as i64);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use models::DecodeReason;

    use super::*;
    use crate::heat::ApplyError;

    #[test]
    fn encodes_counters_by_reason() {
        let m = Metrics::new();
        m.consumed.inc_by(3);
        m.reject(RejectReason::Decode(DecodeReason::Malformed));
        m.reject(ApplyError::TooOld.into());
        m.skip(Skip::Cooldown, 2);
        let text = m.encode();
        assert!(text.contains("pulse_events_consumed_total 3"), "{text}");
        for line in [
            "pulse_events_rejected_total{reason=\"malformed\"} 1",
            "pulse_events_rejected_total{reason=\"too_old\"} 1",
            "pulse_prewarm_skipped_total{reason=\"cooldown\"} 2",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    /// Every reason an enum can give is a series from the start, at 0, under the
    /// labels it always had.
    #[test]
    fn every_reason_is_exported_at_zero() {
        let text = Metrics::new().encode();
        let rejects: Vec<&str> = RejectReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            rejects,
            [
                "too_large",
                "malformed",
                "invalid_field",
                "unsupported_version",
                "too_old",
                "from_future",
                "unknown_tenant",
                "memory_budget"
            ]
        );
        for reason in rejects {
            let line = format!("pulse_events_rejected_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&line), "{line} in {text}");
        }
        let skips: Vec<&str> = Skip::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            skips,
            [
                "below_threshold",
                "unconfirmed",
                "not_worth_it",
                "nothing_to_warm",
                "cooldown",
                "over_budget",
                "awaiting_regions"
            ]
        );
        for reason in skips {
            let line = format!("pulse_prewarm_skipped_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}
