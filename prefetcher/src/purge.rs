//! Purges: a tenant's keys under a path prefix (and carrying a tag, if asked)
//! invalidated on this node, and
//! re-warmed without a stampede when the purge asks for it. The model (stated in
//! `docs/warming.md#purges`):
//!
//! - **Two doors, one purge.** `POST /purge` on the admin listener (a bearer token,
//!   `purge.token_file`; without one the endpoint is off) purges this node; a signed
//!   [`PurgeCommand`] on the pre-warm topic purges every node of its regions, checked
//!   as pre-warm commands are (signature, codec, expiry, region, tenant, repeat) and
//!   refused with a count in `prefetcher_purges_rejected_total{reason}`. Both end in
//!   [`Node::purge`].
//! - **Hard or soft.** Hard removes; soft marks stale (`x-cache: STALE`) until the
//!   re-warm window ends, the Fastly soft purge bounded by the window. A soft purge
//!   needs a re-warm: stale is served only while its refill is scheduled.
//! - **Re-warm with jitter.** Each URL the purge matched (at most
//!   `purge.max_rewarm_urls`; the rest are removed) is refilled once, through the
//!   pre-warm path ([`Node::warm`]: single flight, background priority, the tenant's
//!   share of the spare fill slots), at an instant drawn uniformly in the window by
//!   each node for each key ([`rewarm_plan`]): the nodes of a region, and the regions,
//!   never refill together. Until then a soft-purged entry is served stale without a
//!   refresh of its own, and only to clients: another edge-pulse node asking for it
//!   (an edge filling from this node as its shield) gets a fresh copy, so a region
//!   behind a shield fills each key from the origin once.

use std::time::Duration;

use models::{
    CacheKey, MAX_REWARM_WINDOW_MS, PurgeCommand, PurgeMode, TenantId, check_prefix, check_tag,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::status::RejectReason;

/// Largest `POST /purge` body, in bytes.
pub(crate) const MAX_PURGE_BODY: usize = 4 * 1024;

/// What to purge, from either door.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {
    /// A tenant this node serves.
    pub tenant: TenantId,
    /// Every key starting with it (at most 1024 bytes).
    pub prefix: CacheKey,
    /// Only the keys whose responses carried this tag (`Surrogate-Key`, `Cache-Tag`).
    #[serde(default)]
    pub tag: Option<String>,
    /// `hard` (default) or `soft` (needs `rewarm_window_ms`).
    #[serde(default)]
    pub mode: PurgeMode,
    /// Re-warm what was purged over this many milliseconds (1 to 3 600 000).
    #[serde(default)]
    pub rewarm_window_ms: Option<u64>,
}

impl From<PurgeCommand> for PurgeRequest {
    fn from(c: PurgeCommand) -> Self {
        PurgeRequest {
            tenant: c.tenant,
            prefix: c.prefix,
            tag: c.tag,
            mode: c.mode,
            rewarm_window_ms: c.rewarm_window_ms,
        }
    }
}

impl PurgeRequest {
    /// The rules across fields; the message starts with the field.
    pub(crate) fn check(&self) -> Result<(), String> {
        check_prefix(self.prefix.as_str())?;
        if let Some(tag) = &self.tag {
            check_tag(tag)?;
        }
        match self.rewarm_window_ms {
            Some(w) if !(1..=MAX_REWARM_WINDOW_MS).contains(&w) => Err(format!(
                "rewarm_window_ms: {w} is outside 1..={MAX_REWARM_WINDOW_MS}"
            )),
            None if self.mode == PurgeMode::Soft => Err(
                "rewarm_window_ms: a soft purge needs one (stale is served only until the re-warm)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
}

/// What a purge did on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeReport {
    /// URLs removed.
    pub removed: usize,
    /// URLs marked stale until their re-warm.
    pub stale: usize,
    /// URLs whose re-warm is scheduled.
    pub rewarm: usize,
}

/// Why a purge was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PurgeError {
    /// The tenant is not in this node's configuration.
    #[error("tenant: unknown tenant {0}")]
    UnknownTenant(String),
    /// A field breaks a rule; the message starts with it.
    #[error("{0}")]
    InvalidField(String),
}

impl PurgeError {
    /// The reason it is counted under.
    pub fn reason(&self) -> RejectReason {
        match self {
            PurgeError::UnknownTenant(_) => RejectReason::UnknownTenant,
            PurgeError::InvalidField(_) => RejectReason::InvalidField,
        }
    }
}

/// When each key is re-warmed, from the purge: the window cut in one slot per key,
/// the keys shuffled into the slots, each at a uniform draw inside its slot; soonest
/// first. The fills are as evenly spread as the window allows (never two in a slot,
/// so `keys / window` at most per second from one node), and each node draws its own
/// order and instants, so the nodes of a region (and the regions) do not refill a
/// key together. `after` shifts the whole plan (an edge behind a shield waits for its
/// shield's window, `purge.behind_shield`).
pub fn rewarm_plan(
    mut keys: Vec<CacheKey>,
    window: Duration,
    after: Duration,
    rng: &mut impl Rng,
) -> Vec<(Duration, CacheKey)> {
    use rand::seq::SliceRandom;
    keys.shuffle(rng);
    let slots = keys.len().max(1) as f64;
    keys.into_iter()
        .enumerate()
        .map(|(i, k)| {
            let at = window.mul_f64((i as f64 + rng.random::<f64>()) / slots);
            (
                after + at.min(window.saturating_sub(Duration::from_nanos(1))),
                k,
            )
        })
        .collect()
}

/// Compares two tokens in time independent of where they differ.
pub(crate) fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Purges' and re-warms' Prometheus metrics (prefix `prefetcher_`).
#[derive(Debug, Clone, Default)]
pub struct PurgeMetrics {
    purges: Family<SourceLabels, Counter>,
    urls: Family<ModeLabels, Counter>,
    rejected: Family<ReasonLabels, Counter>,
    rewarm_keys: Family<ResultLabels, Counter>,
    /// Re-warms scheduled and not yet ended.
    pub rewarm_pending: Gauge,
}

impl PurgeMetrics {
    /// Registers every metric in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        for source in ["admin", "command"] {
            let _ = self.purges.get_or_create(&SourceLabels { source });
        }
        for reason in RejectReason::ALL {
            let _ = self.rejected.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        registry.register(
            "purges",
            "Purges done on this node, by source (admin: POST /purge; command: the pre-warm topic)",
            self.purges.clone(),
        );
        registry.register(
            "purge_urls",
            "URLs purged, by mode (hard: removed; soft: stale until re-warmed)",
            self.urls.clone(),
        );
        registry.register(
            "purges_rejected",
            "Purges refused (commands and POST /purge), by reason",
            self.rejected.clone(),
        );
        registry.register(
            "rewarm_keys",
            "Purged URLs re-warmed, by result (filled, cached, failed)",
            self.rewarm_keys.clone(),
        );
        registry.register(
            "rewarm_pending",
            "Purged URLs whose re-warm is scheduled or running",
            self.rewarm_pending.clone(),
        );
    }

    /// Counts a refused purge.
    pub fn rejected(&self, reason: RejectReason) {
        self.rejected
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Purges refused so far for `reason`.
    pub fn rejected_count(&self, reason: RejectReason) -> u64 {
        self.rejected
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// Re-warmed URLs so far by `result` (`filled`, `cached`, `failed`).
    pub fn rewarmed(&self, result: &'static str) -> u64 {
        self.rewarm_keys
            .get_or_create(&ResultLabels { result })
            .get()
    }

    pub(crate) fn urls(&self, mode: &'static str) -> Counter {
        self.urls.get_or_create_owned(&ModeLabels { mode })
    }

    pub(crate) fn purged(&self, source: &'static str) {
        self.purges.get_or_create(&SourceLabels { source }).inc();
    }

    pub(crate) fn rewarm_done(&self, result: &'static str) {
        self.rewarm_keys
            .get_or_create(&ResultLabels { result })
            .inc();
        self.rewarm_pending.dec();
    }
}

/// How many draws of [`rewarm_plan`] fall in each tenth of the window (tests).
#[cfg(test)]
fn deciles(
    plan: &[(Duration, CacheKey)],
    window: Duration,
) -> std::collections::HashMap<usize, usize> {
    let mut out = std::collections::HashMap::new();
    for (at, _) in plan {
        let d = (at.as_secs_f64() / window.as_secs_f64() * 10.0) as usize;
        *out.entry(d).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    /// Rule: the re-warm of a purge is spread over its window: every instant inside
    /// it, every tenth of it holding a tenth of the keys, and two nodes' plans for the
    /// same keys differ (they never refill a key together); behind a shield, the plan
    /// is the next window.
    #[test]
    fn rewarm_jitter_spreads_fills_over_the_window() {
        let keys: Vec<CacheKey> = (0..2_000)
            .map(|i| CacheKey::new(format!("/k/{i}")).unwrap())
            .collect();
        let window = Duration::from_secs(30);
        let one = rewarm_plan(
            keys.clone(),
            window,
            Duration::ZERO,
            &mut StdRng::seed_from_u64(1),
        );
        let two = rewarm_plan(
            keys.clone(),
            window,
            Duration::ZERO,
            &mut StdRng::seed_from_u64(2),
        );
        assert!(one.iter().all(|(at, _)| *at < window));
        assert!(one.windows(2).all(|w| w[0].0 <= w[1].0), "soonest first");
        let tenths = deciles(&one, window);
        for d in 0..10 {
            let n = tenths.get(&d).copied().unwrap_or(0);
            assert!((199..=201).contains(&n), "tenth {d} holds {n} of 2000");
        }
        let slot = window / 2_000;
        assert!(
            one.windows(2).all(|w| w[1].0 - w[0].0 < 2 * slot),
            "no gap longer than two slots"
        );
        assert!(
            one.last().unwrap().0 - one[0].0 > window - 2 * slot,
            "the whole window"
        );
        let behind = rewarm_plan(keys, window, window, &mut StdRng::seed_from_u64(3));
        assert!(
            behind
                .iter()
                .all(|(at, _)| *at >= window && *at < 2 * window)
        );
        let at = |plan: &[(Duration, CacheKey)], key: &str| {
            plan.iter().find(|(_, k)| k.as_str() == key).unwrap().0
        };
        let same = (0..2_000)
            .filter(|i| at(&one, &format!("/k/{i}")) == at(&two, &format!("/k/{i}")))
            .count();
        assert_eq!(same, 0, "two nodes draw their own instants");
    }

    /// Rule: the request is bounded: the prefix's length, the window, and a soft
    /// purge needs a window.
    #[test]
    fn purge_requests_are_bounded() {
        let ok: PurgeRequest = serde_json::from_str(
            r#"{"tenant":"acme","prefix":"/a/","mode":"soft","rewarm_window_ms":5000}"#,
        )
        .unwrap();
        assert_eq!(ok.check(), Ok(()));
        let long = PurgeRequest {
            prefix: CacheKey::new(format!("/{}", "a".repeat(1_100))).unwrap(),
            ..ok.clone()
        };
        assert!(long.check().unwrap_err().starts_with("prefix:"));
        let slow = PurgeRequest {
            rewarm_window_ms: Some(MAX_REWARM_WINDOW_MS + 1),
            ..ok.clone()
        };
        assert!(slow.check().unwrap_err().starts_with("rewarm_window_ms:"));
        let soft_alone = PurgeRequest {
            rewarm_window_ms: None,
            ..ok.clone()
        };
        assert!(
            soft_alone
                .check()
                .unwrap_err()
                .starts_with("rewarm_window_ms:")
        );
        let spaced = PurgeRequest {
            tag: Some("a b".into()),
            ..ok.clone()
        };
        assert!(spaced.check().unwrap_err().starts_with("tag:"));
        assert!(
            serde_json::from_str::<PurgeRequest>(r#"{"tenant":"acme","prefix":"/a/","x":1}"#)
                .is_err(),
            "unknown fields are refused"
        );
        assert!(same_token(b"secret", b"secret") && !same_token(b"secret", b"secreT"));
        assert!(!same_token(b"secret", b"secret2"));
    }
}
