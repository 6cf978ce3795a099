//! What pulse tells edge nodes to fetch before anyone asks.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::SCHEMA_VERSION;
use crate::ids::{CacheKey, RegionId, TenantId};

/// The origin-fill priority class a command asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Lowest class: only spare origin capacity, shed first under load.
    Background,
    /// The class of user requests; pulse never sends it, but a node may promote a
    /// background fill to it when a user request joins.
    User,
}

/// The budget a command is charged to at pulse's fleet gate: each tenant holds one
/// token bucket per class, so an operator's warm-up cannot starve the predictions,
/// nor the reverse. On the wire, the optional `class` field (absent: `prediction`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandClass {
    /// Decided by pulse's predictor.
    #[default]
    Prediction,
    /// Asked for by an operator (`POST /api/warm` on pulse).
    Warm,
}

/// Which regions should warm the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionTargets {
    /// Every region; on the wire, the string `"all"`.
    All,
    /// Only these regions; on the wire, an array of region ids.
    Only(Vec<RegionId>),
}

impl RegionTargets {
    /// Whether a node in `region` should act on the command.
    pub fn includes(&self, region: &(impl AsRef<str> + ?Sized)) -> bool {
        match self {
            RegionTargets::All => true,
            RegionTargets::Only(regions) => regions.iter().any(|r| r.as_str() == region.as_ref()),
        }
    }
}

impl Serialize for RegionTargets {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RegionTargets::All => serializer.serialize_str("all"),
            RegionTargets::Only(regions) => regions.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for RegionTargets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Word(String),
            Regions(Vec<RegionId>),
        }
        match Wire::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom("regions: expected \"all\" or an array of region ids")
        })? {
            Wire::Word(word) if word == "all" => Ok(RegionTargets::All),
            Wire::Word(word) => Err(serde::de::Error::custom(format!(
                "regions: expected \"all\" or an array of region ids, got {word:?}"
            ))),
            Wire::Regions(regions) => Ok(RegionTargets::Only(regions)),
        }
    }
}

/// One feature's part in a decision: its value and what it added to the score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureContribution {
    /// The feature's name, as in the model card.
    pub name: String,
    /// Its raw value at decision time.
    pub value: f64,
    /// Its coefficient times its normalised value.
    pub contribution: f64,
}

/// Why pulse decided to pre-warm: the score broken down by feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// The model version that scored the key.
    pub model: String,
    /// The model's intercept (what the score is before any feature).
    pub intercept: f64,
    /// Each feature's value and contribution.
    pub features: Vec<FeatureContribution>,
}

/// A request that edge nodes fetch `key` for `tenant` before their first user asks:
/// the message on the `prewarm` topic, keyed by `tenant/key`.
///
/// It names a path, never a URL: a node resolves the origin from its own
/// configuration, so a forged command cannot make it fetch an arbitrary host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrewarmCommand {
    /// Schema version; this build writes and accepts [`SCHEMA_VERSION`].
    pub v: u16,
    /// Unique id of this command, for tracing a decision to its outcome.
    pub id: String,
    /// The tenant whose origin serves the key.
    pub tenant: TenantId,
    /// The path to fetch.
    pub key: CacheKey,
    /// The model's confidence that demand is coming, in `[0, 1]`.
    pub confidence: f64,
    /// The fill priority; pulse always sends [`Priority::Background`].
    pub priority: Priority,
    /// When pulse issued the command, in milliseconds since the Unix epoch.
    pub issued_at_ms: u64,
    /// After this instant nodes drop the command unexecuted.
    pub expires_at_ms: u64,
    /// The regions that should warm the key.
    pub regions: RegionTargets,
    /// The score broken down by feature.
    pub reason: Reason,
    /// The gate budget the command is charged to.
    #[serde(default)]
    pub class: CommandClass,
}

/// Longest command id, in bytes.
pub const MAX_COMMAND_ID_LEN: usize = 64;

impl PrewarmCommand {
    /// Checks the rules that span fields or that types cannot hold.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.id.is_empty() || self.id.len() > MAX_COMMAND_ID_LEN {
            return Err(format!("id: must be 1-{MAX_COMMAND_ID_LEN} bytes"));
        }
        if !(0.0..=1.0).contains(&self.confidence) {
            return Err(format!("confidence: {} is outside [0, 1]", self.confidence));
        }
        if self.expires_at_ms <= self.issued_at_ms {
            return Err("expires_at_ms: must be after issued_at_ms".into());
        }
        if matches!(&self.regions, RegionTargets::Only(r) if r.is_empty()) {
            return Err("regions: an empty list targets nobody; use \"all\"".into());
        }
        if let Some(f) = self
            .reason
            .features
            .iter()
            .find(|f| !f.value.is_finite() || !f.contribution.is_finite())
        {
            return Err(format!("reason.features: {} is not finite", f.name));
        }
        Ok(())
    }

    /// A fresh command with the current schema version at background priority.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        tenant: TenantId,
        key: CacheKey,
        confidence: f64,
        issued_at_ms: u64,
        expires_at_ms: u64,
        regions: RegionTargets,
        reason: Reason,
    ) -> Self {
        PrewarmCommand {
            v: SCHEMA_VERSION,
            id,
            tenant,
            key,
            confidence,
            priority: Priority::Background,
            issued_at_ms,
            expires_at_ms,
            regions,
            reason,
            class: CommandClass::Prediction,
        }
    }

    /// Whether the command has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }

    /// The Kafka message key: `tenant/key`.
    pub fn partition_key(&self) -> String {
        crate::topic::message_key(self.tenant.as_str(), self.key.as_str())
    }
}
