//! [`PulseConfig`]: everything `pulse serve` can be told, its defaults and its
//! checks ([`PulseConfig::validate`], whose [`PulseConfigError`] names the field).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use models::TenantId;
use serde::{Deserialize, Serialize};

use crate::fleet::{DEFAULT_PEER_TIMEOUT, Peers, PeersConfig, PeersError};
use crate::heat::HeatConfig;
use crate::kafka::check_properties;
use crate::predict::{DecisionPolicy, RETRAIN_INTERVAL_SECS};
use crate::{EVENTS_TOPIC, PREWARM_TOPIC};

/// Everything `pulse serve` can be told. Every field has a default (the flags'
/// defaults); unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PulseConfig {
    /// Kafka bootstrap servers (`HOST:PORT,...`); `None` starts an embedded broker.
    pub brokers: Option<String>,
    /// librdkafka properties for every Kafka client pulse makes (TLS, SASL, tuning),
    /// over each client's own settings; the few pulse's correctness depends on
    /// ([`RESERVED_PROPERTIES`](crate::RESERVED_PROPERTIES)) are refused.
    pub kafka_properties: BTreeMap<String, String>,
    /// The events topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Where the dashboard API listens (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Checkpoint file: every owned partition's heat map and offset, written
    /// periodically and at shutdown (offsets are committed after each checkpoint); a
    /// partition assigned later starts from its snapshot.
    pub checkpoint: Option<PathBuf>,
    /// Seconds between checkpoints.
    pub checkpoint_interval_secs: u64,
    /// Seconds between offset commits when there is no checkpoint file.
    pub commit_interval_secs: u64,
    /// Where rejected messages go (with a `pulse-reject-reason` header), if anywhere.
    pub dead_letter_topic: Option<String>,
    /// Sketch sizes and limits.
    pub heat: HeatConfig,
    /// Tenants allowed (with those of `tenants_file`); both empty: every tenant.
    /// Events of others are rejected (`unknown_tenant`).
    pub tenants: Vec<String>,
    /// A file of allowed tenants, one per line; blank lines and `#` comments skipped.
    pub tenants_file: Option<PathBuf>,
    /// Predict and send pre-warm commands; off: heat map and API only.
    pub prewarm: bool,
    /// The topic pre-warm commands go to.
    pub prewarm_topic: String,
    /// A file of pre-warm signing keys, one `KEY_ID SECRET_HEX` a line (`#`
    /// comments): with it, every command carries an HMAC by the key
    /// `prewarm_signing_key_id` in its `edge-pulse-sig` header. The edges hold the same
    /// file (all the keys valid now); pulse uses one of them.
    pub prewarm_signing_keys: Option<PathBuf>,
    /// The id of the key in `prewarm_signing_keys` that signs (required with it).
    pub prewarm_signing_key_id: Option<String>,
    /// The scoring model file (JSON, from `pulse train`); the shipped model without it.
    pub model: Option<PathBuf>,
    /// Minimum confidence for a pre-warm command, in [0, 1].
    pub threshold: f64,
    /// How long a key waits after a command before it can get another.
    pub cooldown_ms: u64,
    /// How long a command stays valid at the edges.
    pub command_ttl_ms: u64,
    /// Each tenant's committed rate of commands per second, for the whole fleet (one
    /// bucket per tenant, held by the gate).
    pub tenant_rate_per_s: f64,
    /// Each tenant's burst allowance, in commands, for the whole fleet.
    pub tenant_burst: f64,
    /// Each tenant's rate of operators' warm-up commands per second (`POST
    /// /api/warm`), for the whole fleet: a bucket of its own beside the predictions'.
    /// A warm-up's pace may not exceed it.
    pub warm_rate_per_s: f64,
    /// Each tenant's burst allowance for warm-ups, in commands.
    pub warm_burst: f64,
    /// What a wasted pre-warm fill costs, in client misses (the cost rule).
    pub wasted_fill_cost: f64,
    /// Per-tenant overrides of `wasted_fill_cost`.
    pub tenant_fill_costs: std::collections::HashMap<TenantId, f64>,
    /// Seconds between background retrains on pulse's own labelled decisions (0: never).
    pub retrain_interval_secs: u64,
    /// Require `Authorization: Bearer <token>` on every `/api/*` route.
    pub api_token: Option<String>,
    /// Partitions of the topics created on the embedded broker.
    pub embedded_partitions: i32,
    /// Partitions of the events, pre-warm and dead-letter topics when pulse creates
    /// them on a broker that lacks them (an existing topic is used as it is).
    pub topic_partitions: i32,
    /// `retention.ms` of the topics pulse creates (`None`: the broker's default).
    pub topic_retention_ms: Option<u64>,
    /// The other instances of this group (`http://host:port` of their APIs): fleet
    /// answers gather their `scope=local` parts. Empty: this instance answers alone.
    pub peers: Vec<String>,
    /// This instance's API base URL as the others reach it: carried in its consumer's
    /// client id, so instances find each other by describing their consumer group.
    /// Used when `peers` is empty (`peers` overrides it).
    pub advertise_url: Option<String>,
    /// How long a peer may take to answer, in milliseconds.
    pub peer_timeout_ms: u64,
    /// One model for the fleet: published on a compacted topic by the instance that
    /// owns partition 0 and read by every instance. Off: each instance keeps and
    /// retrains its own model.
    pub fleet_model: bool,
    /// The fleet model's topic; `None`: `{topic}.{group}.model` (one per fleet).
    pub model_topic: Option<String>,
    /// Recalibrate the confidence online from the outcomes each partition sees
    /// (`predict::online`); off: the model's own confidence.
    pub calibrate_online: bool,
}

impl Default for PulseConfig {
    fn default() -> Self {
        let policy = DecisionPolicy::default();
        PulseConfig {
            brokers: None,
            kafka_properties: BTreeMap::new(),
            topic: EVENTS_TOPIC.to_owned(),
            group: "pulse".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            checkpoint: None,
            checkpoint_interval_secs: 10,
            commit_interval_secs: 2,
            dead_letter_topic: None,
            heat: HeatConfig::default(),
            tenants: Vec::new(),
            tenants_file: None,
            prewarm: true,
            prewarm_topic: PREWARM_TOPIC.to_owned(),
            prewarm_signing_keys: None,
            prewarm_signing_key_id: None,
            model: None,
            threshold: policy.threshold,
            cooldown_ms: policy.cooldown_ms,
            command_ttl_ms: policy.command_ttl_ms,
            tenant_rate_per_s: policy.tenant_rate_per_s,
            tenant_burst: policy.tenant_burst,
            warm_rate_per_s: policy.tenant_rate_per_s,
            warm_burst: policy.tenant_burst,
            wasted_fill_cost: policy.wasted_fill_cost,
            tenant_fill_costs: policy.tenant_fill_costs,
            retrain_interval_secs: RETRAIN_INTERVAL_SECS,
            api_token: None,
            embedded_partitions: 4,
            topic_partitions: 4,
            topic_retention_ms: None,
            peers: Vec::new(),
            advertise_url: None,
            peer_timeout_ms: DEFAULT_PEER_TIMEOUT.as_millis() as u64,
            fleet_model: true,
            model_topic: None,
            calibrate_online: true,
        }
    }
}

/// A [`PulseConfig`] field that is refused, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PulseConfigError {
    /// The field, as named in [`PulseConfig`] (`heat.top_k` for the sketch settings).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> Result<(), PulseConfigError> {
    Err(PulseConfigError {
        field,
        reason: reason.into(),
    })
}

impl PulseConfig {
    /// Checks every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), PulseConfigError> {
        if let Some(b) = &self.brokers {
            if b.trim().is_empty() || b.split(',').any(|s| !s.contains(':')) {
                return refuse(
                    "brokers",
                    format!("expected HOST:PORT[,HOST:PORT...], got {b:?}"),
                );
            }
        }
        if let Err(e) = check_properties(&self.kafka_properties) {
            return refuse("kafka_properties", e.to_string());
        }
        if self.topic.trim().is_empty() {
            return refuse("topic", "must not be empty");
        }
        if self.group.trim().is_empty() {
            return refuse("group", "must not be empty");
        }
        if let Some(dlq) = &self.dead_letter_topic {
            if dlq.trim().is_empty() || *dlq == self.topic {
                return refuse(
                    "dead_letter_topic",
                    "must be non-empty and differ from topic",
                );
            }
        }
        if self.checkpoint_interval_secs == 0 {
            return refuse("checkpoint_interval_secs", "must be at least 1");
        }
        if self.commit_interval_secs == 0 {
            return refuse("commit_interval_secs", "must be at least 1");
        }
        if let Err(e) = self.heat.validate() {
            let field = match e.field {
                "error" => "heat.error",
                "confidence" => "heat.confidence",
                "top_k" => "heat.top_k",
                "region_top_k" => "heat.region_top_k",
                "shared_sketch_below" => "heat.shared_sketch_below",
                "shared_error" => "heat.shared_error",
                "max_clock_skew_ms" => "heat.max_clock_skew_ms",
                _ => "heat.memory_budget_bytes",
            };
            return refuse(field, e.reason);
        }
        if let Some(bad) = self
            .tenants
            .iter()
            .find(|t| TenantId::new(t.as_str()).is_err())
        {
            return refuse("tenants", format!("{bad:?} is not a valid tenant id"));
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return refuse("threshold", format!("{} is outside [0, 1]", self.threshold));
        }
        if self.command_ttl_ms < 1_000 {
            return refuse("command_ttl_ms", "must be at least 1 s");
        }
        if !(self.tenant_rate_per_s > 0.0 && self.tenant_rate_per_s.is_finite()) {
            return refuse("tenant_rate_per_s", "must be positive");
        }
        if !(self.tenant_burst >= 1.0 && self.tenant_burst.is_finite()) {
            return refuse("tenant_burst", "must be at least 1");
        }
        if !(self.warm_rate_per_s > 0.0 && self.warm_rate_per_s.is_finite()) {
            return refuse("warm_rate_per_s", "must be positive");
        }
        if !(self.warm_burst >= 1.0 && self.warm_burst.is_finite()) {
            return refuse("warm_burst", "must be at least 1");
        }
        let costs = std::iter::once(&self.wasted_fill_cost).chain(self.tenant_fill_costs.values());
        if costs.into_iter().any(|c| !(*c >= 0.0 && c.is_finite())) {
            return refuse("wasted_fill_cost", "must be 0 or more");
        }
        if self.prewarm_topic.trim().is_empty() || self.prewarm_topic == self.topic {
            return refuse("prewarm_topic", "must be non-empty and differ from topic");
        }
        match (&self.prewarm_signing_keys, &self.prewarm_signing_key_id) {
            (Some(_), None) => {
                return refuse(
                    "prewarm_signing_key_id",
                    "required with prewarm_signing_keys: the id of the key that signs",
                );
            }
            (None, Some(_)) => {
                return refuse(
                    "prewarm_signing_key_id",
                    "set without prewarm_signing_keys, the file that holds the key",
                );
            }
            (Some(_), Some(id)) if !models::is_key_id(id) => {
                return refuse(
                    "prewarm_signing_key_id",
                    format!("{id:?}: 1 to 64 characters of A-Z a-z 0-9 . _ -"),
                );
            }
            _ => {}
        }
        if !(1..=1_000).contains(&self.embedded_partitions) {
            return refuse("embedded_partitions", "1 to 1000");
        }
        if !(1..=1_000).contains(&self.topic_partitions) {
            return refuse("topic_partitions", "1 to 1000");
        }
        if self.topic_retention_ms == Some(0) {
            return refuse(
                "topic_retention_ms",
                "at least 1 (leave it out for the broker's default)",
            );
        }
        if self.peer_timeout_ms == 0 {
            return refuse("peer_timeout_ms", "must be at least 1");
        }
        if let Err(e) = self.peers() {
            return refuse("peers", e.to_string());
        }
        if let Some(url) = &self.advertise_url {
            if let Err(e) = crate::fleet::PeerUrl::parse(url) {
                return refuse("advertise_url", e.to_string());
            }
        }
        let model_topic = self.model_topic();
        if !models::is_topic_name(&model_topic)
            || [&self.topic, &self.prewarm_topic].contains(&&model_topic)
        {
            return refuse(
                "model_topic",
                format!(
                    "{model_topic:?}: a topic name (letters, digits, '.', '_', '-'; at most \
                     249) that differs from topic and prewarm_topic"
                ),
            );
        }
        Ok(())
    }

    /// The fleet model's topic: `model_topic`, or one named after the events topic and
    /// the group, so each fleet has its own.
    pub fn model_topic(&self) -> String {
        self.model_topic
            .clone()
            .unwrap_or_else(|| format!("{}.{}.model", self.topic, self.group))
    }

    /// The fleet gate's decisions topic: proposals keyed by tenant (`crate::gate`).
    pub fn decisions_topic(&self) -> String {
        format!("{}.{}.decisions", self.topic, self.group)
    }

    /// The fleet gate's compacted state topic: per tenant, its budget, cooldowns and
    /// the ids sent.
    pub fn gate_state_topic(&self) -> String {
        format!("{}.{}.gate-state", self.topic, self.group)
    }

    /// The fleet gate's consumer group.
    pub fn gate_group(&self) -> String {
        format!("{}.gate", self.group)
    }

    /// The peers these settings name, `None` without any.
    pub fn peers(&self) -> Result<Option<Peers>, PeersError> {
        if self.peers.is_empty() && self.advertise_url.is_none() {
            return Ok(None);
        }
        let config = PeersConfig {
            timeout: Duration::from_millis(self.peer_timeout_ms),
            api_token: self.api_token.clone(),
            ..PeersConfig::default()
        };
        Peers::new(&self.peers, config).map(Some)
    }

    /// The decision rules these settings give.
    pub fn policy(&self) -> DecisionPolicy {
        DecisionPolicy {
            threshold: self.threshold,
            cooldown_ms: self.cooldown_ms,
            command_ttl_ms: self.command_ttl_ms,
            tenant_rate_per_s: self.tenant_rate_per_s,
            tenant_burst: self.tenant_burst,
            wasted_fill_cost: self.wasted_fill_cost,
            tenant_fill_costs: self.tenant_fill_costs.clone(),
            ..DecisionPolicy::default()
        }
    }
}
