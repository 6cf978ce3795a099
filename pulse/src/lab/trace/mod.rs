//! A synthetic access trace: a Zipf background over many keys, viral events that
//! start in one region and spread to the others, cron-like bursts that hit every
//! region at once on the minute, noise bursts (one region, short, no spread) and flash
//! crowds (one region, sent by its local news site) that must not trigger a pre-warm,
//! and, if asked, audiences: groups of regions with their own taste that a viral does
//! not leave. The truth about every injected burst comes with it, so `pulse backtest`
//! can score decisions without a hand-labelled data set.
//!
//! - `spec`: [`TraceSpec`], what to generate.
//! - `family`: [`Family`] and [`FAMILIES`], the named ways to set the generator.
//! - `generate`: [`generate`], the generator itself.
//! - here: the truth it returns ([`Trace`], [`Burst`], [`BurstKind`]).

use models::{AccessEvent, CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};

mod family;
mod generate;
mod spec;

pub use family::{FAMILIES, Family};
pub use generate::generate;
pub use spec::{TraceSpec, ViralReferrers};

/// The kind of an injected burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BurstKind {
    /// Starts in one region and spreads to the others: pre-warm the rest.
    Viral,
    /// Hits every region at once on the minute: nothing left to warm.
    Cron,
    /// A short spike in one region that goes nowhere: must not trigger.
    Noise,
    /// A crowd in one region, on many nodes, for many seconds, that never spreads.
    Flash,
    /// One node asking for one key over and over (a retry loop, a bot).
    Hammer,
}

/// One injected burst and where and when it reached each region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    /// What kind.
    pub kind: BurstKind,
    /// Whose key.
    pub tenant: TenantId,
    /// Which key.
    pub key: CacheKey,
    /// When it started in its first region.
    pub start_ms: u64,
    /// When it ended everywhere.
    pub end_ms: u64,
    /// Each region it reached, with the time it started there.
    pub regions: Vec<(RegionId, u64)>,
}

/// A generated trace: the events in time order and the truth about the bursts.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Events, sorted by time.
    pub events: Vec<AccessEvent>,
    /// The injected bursts.
    pub bursts: Vec<Burst>,
    /// All regions of the fleet.
    pub regions: Vec<RegionId>,
}
