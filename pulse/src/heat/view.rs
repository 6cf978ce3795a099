//! What the heat map's queries return: the [`Window`]s, per-key [`KeyStats`], the
//! heat map's [`HotKey`] rows and the [`TenantSummary`]. These are also the API's JSON
//! and OpenAPI schemas.

use models::{CacheKey, Outcome, RegionId, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::FINE_SPAN_MS;
use super::sketch::OUTCOMES;

/// A query window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Window {
    /// The last 200 ms.
    #[serde(rename = "200ms")]
    Ms200,
    /// The last second.
    #[serde(rename = "1s")]
    S1,
    /// The last 10 seconds.
    #[serde(rename = "10s")]
    S10,
    /// The last 60 seconds.
    #[serde(rename = "60s")]
    S60,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 4] = [Window::Ms200, Window::S1, Window::S10, Window::S60];

    /// The name used in URLs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Window::Ms200 => "200ms",
            Window::S1 => "1s",
            Window::S10 => "10s",
            Window::S60 => "60s",
        }
    }

    /// The window's length in milliseconds.
    pub const fn millis(self) -> u64 {
        match self {
            Window::Ms200 => 200,
            Window::S1 => 1_000,
            Window::S10 => 10_000,
            Window::S60 => 60_000,
        }
    }

    pub(crate) fn seconds(self) -> f64 {
        self.millis() as f64 / 1_000.0
    }

    /// Short windows are answered from the fine ring, long ones from the coarse ring.
    pub(super) fn is_fine(self) -> bool {
        self.millis() <= FINE_SPAN_MS / 2
    }
}

impl std::str::FromStr for Window {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Window::ALL
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| format!("unknown window {s:?}: expected one of 200ms, 1s, 10s, 60s"))
    }
}

/// Counts per outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutcomeCounts {
    /// Served from cache.
    pub hit: u64,
    /// Led an origin fill.
    pub miss: u64,
    /// Served stale while refreshing.
    pub stale: u64,
    /// Joined a fill in flight.
    pub collapsed: u64,
    /// Filled by a pre-warm command.
    pub prefetch_fill: u64,
    /// First user hit on a pre-warmed entry.
    pub prefetch_useful: u64,
}

impl OutcomeCounts {
    pub(super) fn from_array(a: [u64; OUTCOMES]) -> Self {
        OutcomeCounts {
            hit: a[0],
            miss: a[1],
            stale: a[2],
            collapsed: a[3],
            prefetch_fill: a[4],
            prefetch_useful: a[5],
        }
    }

    /// The count of one outcome.
    pub fn get(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Hit => self.hit,
            Outcome::Miss => self.miss,
            Outcome::Stale => self.stale,
            Outcome::Collapsed => self.collapsed,
            Outcome::PrefetchFill => self.prefetch_fill,
            Outcome::PrefetchUseful => self.prefetch_useful,
            // Never applied to the heat map.
            Outcome::PrefetchCached => 0,
        }
    }

    /// All outcomes together.
    pub fn total(&self) -> u64 {
        Outcome::ALL.iter().map(|o| self.get(*o)).sum()
    }

    /// Client requests: every outcome but pre-warm fills ([`Outcome::is_demand`]).
    pub fn demand(&self) -> u64 {
        Outcome::ALL
            .iter()
            .filter(|o| o.is_demand())
            .map(|o| self.get(*o))
            .sum()
    }

    /// Outcomes that found no fresh copy ([`Outcome::is_miss`]).
    pub fn misses(&self) -> u64 {
        Outcome::ALL
            .iter()
            .filter(|o| o.is_miss())
            .map(|o| self.get(*o))
            .sum()
    }
}

/// One key over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WindowStats {
    /// The window.
    pub window: Window,
    /// Estimated events per outcome (never below the truth).
    pub counts: OutcomeCounts,
    /// All outcomes, pre-warm fills included.
    pub total: u64,
    /// Client requests ([`Outcome::is_demand`]): `total` without the pre-warm fills.
    pub demand: u64,
    /// Miss-like outcomes (miss, collapsed, stale).
    pub misses: u64,
    /// `demand` per second: a pre-warm fill is not a request and raises no velocity.
    pub velocity: f64,
    /// `misses` per second.
    pub miss_velocity: f64,
    /// Regions that reported a miss-like outcome in the window.
    #[schema(value_type = Vec<String>)]
    pub miss_regions: Vec<RegionId>,
    /// Regions that asked for the key in the window, whatever the outcome, and those a
    /// pre-warm filled (they hold the key).
    #[schema(value_type = Vec<String>)]
    pub regions: Vec<RegionId>,
}

/// Whether a key's demand is growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trend {
    /// The last second saw clearly more demand than the one before.
    Rising,
    /// About the same.
    Steady,
    /// Clearly fewer.
    Falling,
}

/// A count attributed to one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegionCount {
    /// The region.
    #[schema(value_type = String)]
    pub region: RegionId,
    /// Demand from it (from the per-region Top-K: a key outside a region's top counts
    /// 0 there).
    pub count: u64,
}

/// Everything pulse knows about one key: what the predictor's features are made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KeyStats {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant: TenantId,
    /// The key.
    #[schema(value_type = String)]
    pub key: CacheKey,
    /// The event time the windows end at, ms since the Unix epoch.
    pub now_ms: u64,
    /// One entry per [`Window`], shortest first.
    pub windows: Vec<WindowStats>,
    /// Change of velocity (demand) between the last 200 ms and the 200 ms before,
    /// requests/s².
    pub acceleration_200ms: f64,
    /// Change of velocity (demand) between the last second and the second before,
    /// requests/s².
    pub acceleration_1s: f64,
    /// The 1 s trend.
    pub trend: Trend,
    /// Per-region demand over the last 60 s.
    pub regions: Vec<RegionCount>,
}

impl KeyStats {
    /// The stats of one window.
    pub fn window(&self, window: Window) -> &WindowStats {
        let i = Window::ALL.iter().position(|w| *w == window).unwrap_or(0);
        &self.windows[i]
    }
}

/// Velocities (client requests per second, [`Outcome::is_demand`]) of a key over each
/// window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Velocities {
    /// Over the last 200 ms.
    #[serde(rename = "200ms")]
    pub ms200: f64,
    /// Over the last second.
    #[serde(rename = "1s")]
    pub s1: f64,
    /// Over the last 10 s.
    #[serde(rename = "10s")]
    pub s10: f64,
    /// Over the last 60 s.
    #[serde(rename = "60s")]
    pub s60: f64,
}

/// One row of the heat map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HotKey {
    /// The key.
    #[schema(value_type = String)]
    pub key: CacheKey,
    /// Demand in the window: the whole tenant's (sketch estimate), or the region's
    /// (Top-K count) when the query named a region.
    pub count: u64,
    /// Miss-like events in the window, whole tenant.
    pub misses: u64,
    /// Whole-tenant velocity per window.
    pub velocities: Velocities,
    /// Whole-tenant acceleration of demand over the last second, requests/s².
    pub acceleration: f64,
    /// Regions that reported a miss in the last 200 ms.
    #[schema(value_type = Vec<String>)]
    pub miss_regions: Vec<RegionId>,
    /// Per-region demand in the window (1 s granularity), largest first.
    pub regions: Vec<RegionCount>,
}

/// A tenant and how much pulse has seen of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantSummary {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant: TenantId,
    /// Events applied since the heat map started (or was restored).
    pub events: u64,
    /// Newest event time, ms since the Unix epoch.
    pub last_event_ms: u64,
    /// Regions seen, in order of first appearance.
    #[schema(value_type = Vec<String>)]
    pub regions: Vec<RegionId>,
    /// Where its new counts go: its own sketches or the shared one.
    pub sketch: SketchKind,
    /// Additive error of an estimate as a fraction: of the tenant's own events in the
    /// window (`own`), or of the *whole shared stream's* events in the window
    /// (`shared`).
    pub error_bound: f64,
    /// The tenant's events in the last 60 s.
    pub events_60s: u64,
    /// The additive error bound of its 60 s estimates, in events: for each 1 s bucket,
    /// the own sketch's bound times the tenant's events in it, or the shared sketch's
    /// bound times the shared stream's events in it. An estimate exceeds the truth by
    /// more with probability at most the failure probability.
    pub error_bound_events_60s: u64,
}

/// Where a tenant's counts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SketchKind {
    /// Its own sketches: the bound is a fraction of its own events.
    Own,
    /// The sketch small tenants share: the bound is a fraction of all their events.
    Shared,
}
