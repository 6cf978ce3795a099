//! The heat map: per tenant, a sliding window of time-bucketed Count-Min sketches
//! and Top-K trackers, fed one [`AccessEvent`] at a time and queried by window.
//!
//! Time is *event* time: a bucket is chosen by `AccessEvent::ts_ms`, and "now" is
//! the newest event time seen (the watermark) unless a query passes one. Replaying a
//! recorded trace therefore gives the same answers as the live stream did.
//!
//! # One tenant's rings
//! - a *fine* ring of [`FINE_BUCKETS`] buckets of [`FINE_MS`] ms (the last 2 s), and
//! - a *coarse* ring of [`COARSE_BUCKETS`] buckets of [`COARSE_MS`] ms (the last 60 s).
//!
//! Every bucket holds one Count-Min sketch whose cell counts each
//! [`Outcome`](models::Outcome) separately and carries a bitset of the regions that
//! reported a miss; a window query sums the newest buckets. Coarse buckets also hold a Top-K of keys for the
//! whole tenant and a smaller Top-K per region: their union is the candidate set of
//! the heat map, ranked by the sketch estimates.
//!
//! # Error bound
//! With `error = ε` and `confidence = 1 − δ`, a sketch has `w = 2^⌈log2(2/ε)⌉`
//! columns and `d = ⌊log2(1/δ)⌋` rows. An estimate is never below the true count, and
//! exceeds it by more than `(2/w)·N` (N = events of the tenant in the window) with
//! probability at most `2^−d`. [`HeatConfig::error_bound`] gives `2/w`.
//!
//! # Layout
//! - `sketch`: the Count-Min sketch of outcome cells and the stable key hash.
//! - `top`: the Top-K trackers of keys (the heat map's candidates).
//! - `rings`: the time-bucketed rings of sketches and Top-Ks.
//! - `tenant`: [`TenantHeat`], one tenant's rings and the queries on them.
//! - `edges`: counters per kind of edge ([`EdgeSummary`]), counted as events apply.
//! - `view`: what queries return ([`Window`], [`KeyStats`], [`HotKey`],
//!   [`TenantSummary`], …).
//!
//! This module keeps the [`HeatMap`] itself, its [`HeatConfig`] and its errors.

mod edges;
mod rings;
mod sketch;
mod tenant;
mod top;
mod view;

use std::collections::{HashMap, HashSet};

use models::{AccessEvent, AccessEventRef, CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use edges::EdgeCounters;
use sketch::{Cell, key_hash};
use tenant::SharedSketch;
use top::{REGION_TOP_SKETCH, TOP_DEPTH, TOP_WIDTH, TopKey};

pub use edges::{EdgeSummary, MAX_NODES_PER_EDGE, NODE_WINDOW_S, RATE_WINDOW_S};
pub use tenant::TenantHeat;
pub use view::{
    HotKey, KeyStats, OutcomeCounts, RegionCount, SketchKind, TenantSummary, Trend, Velocities,
    Window, WindowStats,
};

/// Width of a fine bucket, in milliseconds.
pub const FINE_MS: u64 = 200;
/// Fine buckets kept: 2 s, so the 200 ms and 1 s windows have a previous window to
/// compare with (acceleration).
pub const FINE_BUCKETS: usize = 10;
/// Width of a coarse bucket, in milliseconds.
pub const COARSE_MS: u64 = 1_000;
/// Coarse buckets kept: the 60 s window.
pub const COARSE_BUCKETS: usize = 60;
/// Regions tracked per tenant; events from further regions still count, without a
/// region (the bitset of miss regions is a `u64`).
pub const MAX_REGIONS: usize = 64;

/// How big and how exact the sketches are, how much memory they may take, and how far
/// producers' clocks are trusted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeatConfig {
    /// Additive error as a fraction of the window's events (ε), in (0, 1), of a
    /// tenant's own sketches.
    pub error: f64,
    /// Probability that an estimate stays within the error (1 − δ), in (0, 1).
    pub confidence: f64,
    /// Keys tracked per tenant per coarse bucket (the heat map's candidates).
    pub top_k: usize,
    /// Keys tracked per region per coarse bucket.
    pub region_top_k: usize,
    /// Tenants with fewer events than this in the last 60 s share one sketch; a tenant
    /// that reaches it gets its own (and goes back under half of it). 0: every tenant
    /// has its own sketches (the layout before the shared sketch).
    pub shared_sketch_below: u64,
    /// Additive error of the shared sketch, as a fraction of the *whole shared
    /// stream's* events in the window, in (0, 1).
    pub shared_error: f64,
    /// Bytes the heat map may hold (sketches, trackers, keys); a new tenant, or a
    /// promotion to own sketches, that would pass it is refused (`memory_budget`).
    pub memory_budget_bytes: u64,
    /// How far ahead of the clock an event may be stamped; further is `from_future`,
    /// and the watermark never passes the clock plus this.
    pub max_clock_skew_ms: u64,
}

impl Default for HeatConfig {
    fn default() -> Self {
        HeatConfig {
            error: 0.005,
            confidence: 0.99,
            top_k: 64,
            region_top_k: 16,
            shared_sketch_below: 5_000,
            shared_error: 0.0005,
            memory_budget_bytes: 1 << 30,
            max_clock_skew_ms: 5_000,
        }
    }
}

/// Why a [`HeatConfig`] was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid heat map config: {field}: {reason}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// Seconds of event time between full recounts of the memory estimate (each new
/// tenant and each promotion raise it at once; trackers grow in between).
const RECOUNT_EVERY_S: u64 = 10;

/// Most summaries of evicted tenants kept (the oldest go first).
pub const MAX_EVICTED_SUMMARIES: usize = 10_000;

/// How long a tenant may be silent before it is evicted: the longest window, after
/// which it has nothing left to answer.
pub const IDLE_EVICT_MS: u64 = COARSE_MS * COARSE_BUCKETS as u64;

impl HeatConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_owned(),
            })
        };
        if !(self.error > 0.0 && self.error < 1.0 && (2.0 / self.error).is_finite()) {
            return bad("error", "must be in (0, 1)");
        }
        if self.error < 1e-5 {
            return bad("error", "below 1e-5 the sketches get too large");
        }
        if !(self.confidence > 0.0 && self.confidence < 1.0) {
            return bad("confidence", "must be in (0, 1)");
        }
        if self.depth() > 16 {
            return bad("confidence", "more than 16 rows; use at most 0.99998");
        }
        if !(1..=10_000).contains(&self.top_k) {
            return bad("top_k", "must be in 1..=10000");
        }
        if !(1..=1_000).contains(&self.region_top_k) {
            return bad("region_top_k", "must be in 1..=1000");
        }
        if !(self.shared_error > 0.0 && self.shared_error < 1.0) {
            return bad("shared_error", "must be in (0, 1)");
        }
        if self.shared_error < 1e-5 {
            return bad(
                "shared_error",
                "below 1e-5 the shared sketch gets too large",
            );
        }
        if self.max_clock_skew_ms > 3_600_000 {
            return bad("max_clock_skew_ms", "at most one hour");
        }
        let floor = self.shared_bytes() + self.own_tenant_bytes();
        if self.memory_budget_bytes < floor as u64 {
            return bad(
                "memory_budget_bytes",
                &format!(
                    "below {floor} bytes: the shared sketch and one tenant of its own must fit"
                ),
            );
        }
        Ok(())
    }

    /// Whether a heat map made with `other` has sketches this config can read (the
    /// limits may differ).
    pub fn same_sketches(&self, other: &HeatConfig) -> bool {
        (
            self.width(),
            self.depth(),
            self.top_k,
            self.region_top_k,
            self.shared_width(),
        ) == (
            other.width(),
            other.depth(),
            other.top_k,
            other.region_top_k,
            other.shared_width(),
        )
    }

    /// Columns per sketch row, as streaming_algorithms computes them.
    pub fn width(&self) -> usize {
        ((2.0 / self.error).round() as usize)
            .max(2)
            .next_power_of_two()
    }

    /// Columns per row of the shared sketch.
    pub fn shared_width(&self) -> usize {
        ((2.0 / self.shared_error).round() as usize)
            .max(2)
            .next_power_of_two()
    }

    /// Rows per sketch, as streaming_algorithms computes them.
    pub fn depth(&self) -> usize {
        (((1.0 - self.confidence).ln() / 0.5_f64.ln()).floor() as usize).max(1)
    }

    /// The effective additive error of a tenant's own sketches, as a fraction of the
    /// tenant's events in the window: `2 / width` (at most `error`).
    pub fn error_bound(&self) -> f64 {
        2.0 / self.width() as f64
    }

    /// The effective additive error of the shared sketch, as a fraction of the events
    /// of *all* tenants in it in the window: `2 / shared_width`.
    pub fn shared_error_bound(&self) -> f64 {
        2.0 / self.shared_width() as f64
    }

    /// Probability that one estimate exceeds the bound: `2^-depth` (streaming_algorithms
    /// rounds the depth down, so this is up to twice `1 - confidence`).
    pub fn failure_probability(&self) -> f64 {
        0.5_f64.powi(self.depth() as i32)
    }

    /// Bytes of the shared sketch, every bucket in use.
    pub fn shared_bytes(&self) -> usize {
        (FINE_BUCKETS + COARSE_BUCKETS)
            * self.shared_width()
            * self.depth()
            * std::mem::size_of::<Cell>()
    }

    /// Bytes of one tenant's own sketches, every bucket in use (trackers not counted).
    pub fn own_tenant_bytes(&self) -> usize {
        (FINE_BUCKETS + COARSE_BUCKETS) * self.width() * self.depth() * std::mem::size_of::<Cell>()
    }

    /// Worst-case bytes of one tenant with its own sketches: every bucket's sketch,
    /// every Top-K (for [`MAX_REGIONS`] regions) and its keys at [`models::MAX_KEY_LEN`].
    pub fn max_bytes_per_tenant(&self) -> usize {
        let top = |k: usize, width: usize, depth: usize| {
            // map entry + list node + the key, plus the Top's own sketch.
            k * (64 + 2 * std::mem::size_of::<TopKey>() + models::MAX_KEY_LEN / 8)
                + width * depth * std::mem::size_of::<usize>()
        };
        let (tw, td) = self.top_sketch();
        let (rw, rd) = REGION_TOP_SKETCH;
        self.own_tenant_bytes()
            + COARSE_BUCKETS
                * (top(self.top_k, tw, td) + MAX_REGIONS * top(self.region_top_k, rw, rd))
    }

    /// Top-K trackers keep their own small sketch for keys outside the top.
    fn top_sketch(&self) -> (usize, usize) {
        // (tolerance, probability) -> (width, depth) as in CountMinSketch::new.
        (TOP_WIDTH, TOP_DEPTH)
    }
}

/// Why an event was not applied. Small and `Copy`: this is the per-message path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ApplyError {
    /// The event is older than the longest window behind the watermark.
    #[error("event is older than the 60 s window")]
    TooOld,
    /// The event is stamped further ahead of the clock than `max_clock_skew_ms`.
    #[error("event is stamped ahead of the clock by more than the allowed skew")]
    FromFuture,
    /// The tenant is not on the allow-list.
    #[error("tenant is not on the allow-list")]
    UnknownTenant,
    /// A new tenant would pass `memory_budget_bytes`.
    #[error("memory budget reached")]
    MemoryBudget,
}

impl ApplyError {
    /// Every reason, in declaration order (for metrics that list all of them).
    pub const ALL: [ApplyError; 4] = [
        ApplyError::TooOld,
        ApplyError::FromFuture,
        ApplyError::UnknownTenant,
        ApplyError::MemoryBudget,
    ];

    /// The metric label `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyError::TooOld => "too_old",
            ApplyError::FromFuture => "from_future",
            ApplyError::UnknownTenant => "unknown_tenant",
            ApplyError::MemoryBudget => "memory_budget",
        }
    }
}

/// Why a query could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// No event of this tenant has been seen (or it was evicted).
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// The tenant has no events from this region.
    #[error("unknown region {0:?} for this tenant")]
    UnknownRegion(String),
}

/// Every tenant's windows: the state pulse ingests into, checkpoints, and answers
/// the dashboard and the predictor from.
///
/// # Time
/// Buckets are chosen by event time. With a clock set ([`HeatMap::set_clock`], once
/// per batch by ingest: the wall clock), an event stamped more than
/// `max_clock_skew_ms` ahead of it is refused (`from_future`) and the watermark never
/// passes clock + skew, so one forged timestamp cannot make on-time events `too_old`.
/// Without a clock (replays and backtests of recorded traces) the trace is the clock:
/// the watermark is the newest event time.
///
/// # Tenants
/// A tenant silent for longer than the longest window ([`IDLE_EVICT_MS`], in event
/// time, behind the watermark) is evicted: its memory is returned and a small summary
/// kept ([`HeatMap::evicted`]). Small tenants share one sketch; a tenant whose traffic
/// reaches `shared_sketch_below` events per 60 s gets its own. The heat map holds no
/// process-wide state: one per Kafka partition, merged for queries, is the intended
/// scale-out.
///
/// ```
/// use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
/// use pulse::{HeatConfig, HeatMap, Window};
///
/// let mut heat = HeatMap::new(HeatConfig::default());
/// let tenant = TenantId::new("acme")?;
/// let key = CacheKey::new("/img/logo.png")?;
/// for (i, region) in ["eu-west", "us-east"].iter().enumerate() {
///     let event = AccessEvent::new(1_000 + i as u64, tenant.clone(), key.clone(),
///         RegionId::new(*region)?, NodeId::new("edge-1")?, Outcome::Miss);
///     heat.apply(&event).unwrap();
/// }
/// let stats = heat.key_stats(&tenant, &key, heat.now_ms()).unwrap();
/// assert!(stats.window(Window::Ms200).misses >= 2);
/// assert_eq!(stats.window(Window::Ms200).miss_regions.len(), 2);
/// # Ok::<(), models::IdError>(())
/// ```
#[derive(Clone, Serialize, Deserialize)]
pub struct HeatMap {
    config: HeatConfig,
    watermark_ms: u64,
    tenants: HashMap<String, TenantHeat>,
    shared: SharedSketch,
    evicted: HashMap<String, EvictedTenant>,
    /// The coarse bucket the last eviction pass ran in.
    maintained_s: u64,
    /// Tenants evicted since this heat map was made (or restored).
    #[serde(skip)]
    evictions: u64,
    /// The clock's last reading; `None`: event time is the clock (replays).
    #[serde(skip)]
    clock_ms: Option<u64>,
    /// Tenants allowed; `None`: every tenant.
    #[serde(skip)]
    allowed: Option<HashSet<String>>,
    /// The memory estimate the budget is checked against: recomputed once per second
    /// of event time, raised at once by each new tenant and each promotion.
    #[serde(skip)]
    bytes: usize,
    /// Counters per kind of edge, since this process started (not checkpointed).
    #[serde(skip)]
    edges: EdgeCounters,
}

/// What is kept of an evicted tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvictedTenant {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant: TenantId,
    /// Events applied before it went quiet.
    pub events: u64,
    /// Its newest event time, ms since the Unix epoch.
    pub last_event_ms: u64,
}

impl HeatMap {
    /// An empty heat map, event time as its clock. `config` should have passed
    /// [`HeatConfig::validate`].
    pub fn new(config: HeatConfig) -> Self {
        let shared = SharedSketch::new(&config);
        let mut heat = HeatMap {
            config,
            watermark_ms: 0,
            tenants: HashMap::new(),
            shared,
            evicted: HashMap::new(),
            maintained_s: 0,
            evictions: 0,
            clock_ms: None,
            allowed: None,
            bytes: 0,
            edges: EdgeCounters::default(),
        };
        heat.bytes = heat.reserved_bytes();
        heat
    }

    /// The sketch configuration.
    pub fn config(&self) -> &HeatConfig {
        &self.config
    }

    /// Takes `config`'s limits (budget, promotion threshold, clock skew) for a heat map
    /// restored from a checkpoint. Refused (`false`) when the sketches differ
    /// ([`HeatConfig::same_sketches`]).
    pub fn adopt_limits(&mut self, config: &HeatConfig) -> bool {
        if !self.config.same_sketches(config) {
            return false;
        }
        self.config = config.clone();
        self.bytes = self.reserved_bytes();
        true
    }

    /// The watermark: the newest event time applied, ms since the Unix epoch (never
    /// past the clock plus the allowed skew).
    pub fn now_ms(&self) -> u64 {
        self.watermark_ms
    }

    /// Sets the clock (ms since the Unix epoch): from now on an event stamped more than
    /// `max_clock_skew_ms` past it is refused. Ingest calls it with the wall clock before
    /// each batch; replays never do, and event time stays their clock.
    pub fn set_clock(&mut self, now_ms: u64) {
        self.clock_ms = Some(now_ms);
    }

    /// Only these tenants' events are applied (others: `unknown_tenant`); `None`:
    /// every tenant. Tracked tenants not on the list are dropped at once.
    pub fn set_allowed_tenants(&mut self, allowed: Option<HashSet<String>>) {
        if let Some(allowed) = &allowed {
            self.tenants.retain(|name, _| allowed.contains(name));
            self.bytes = self.reserved_bytes();
        }
        self.allowed = allowed;
    }

    /// Adds one event to its tenant's windows and advances the watermark.
    pub fn apply(&mut self, event: &AccessEvent) -> Result<(), ApplyError> {
        self.apply_ref(&event.borrowed())
    }

    /// [`HeatMap::apply`] for an event borrowed from its message
    /// ([`models::decode_event_ref`]): the ingest path, which copies no string.
    pub fn apply_ref(&mut self, event: &AccessEventRef<'_>) -> Result<(), ApplyError> {
        if let Some(clock) = self.clock_ms {
            if event.ts_ms > clock.saturating_add(self.config.max_clock_skew_ms) {
                return Err(ApplyError::FromFuture);
            }
        }
        let watermark = self.watermark_ms.max(event.ts_ms);
        if watermark / COARSE_MS > self.maintained_s {
            self.evict_idle(watermark);
        }
        let tenant = match self.tenants.get_mut(event.tenant.as_str()) {
            Some(tenant) => tenant,
            None => {
                let name = event.tenant.as_str();
                if self.allowed.as_ref().is_some_and(|a| !a.contains(name)) {
                    return Err(ApplyError::UnknownTenant);
                }
                if watermark.saturating_sub(event.ts_ms) >= IDLE_EVICT_MS {
                    // Checked before the tenant is made: a too-old event of a new
                    // tenant must not leave an empty tenant behind.
                    return Err(ApplyError::TooOld);
                }
                let own = self.config.shared_sketch_below == 0;
                let fresh = TenantHeat::new(&self.config, name, own);
                let cost = fresh.reserved_bytes(&self.config);
                if (self.bytes + cost) as u64 > self.config.memory_budget_bytes {
                    return Err(ApplyError::MemoryBudget);
                }
                self.bytes += cost;
                let events = self.evicted.remove(name).map_or(0, |e| e.events);
                let tenant = self.tenants.entry(name.to_owned()).or_insert(fresh);
                tenant.events = events;
                tenant
            }
        };
        let opened = tenant.apply(&self.config, &mut self.shared, event, watermark)?;
        self.watermark_ms = watermark;
        self.edges.count(event);
        if opened && self.config.shared_sketch_below > 0 {
            self.reconsider(event.tenant.as_str(), watermark);
        }
        Ok(())
    }

    /// Promotes a tenant whose traffic reached `shared_sketch_below` events per 60 s
    /// (if the budget allows its own sketches), demotes one under half of it.
    fn reconsider(&mut self, name: &str, now_ms: u64) {
        let Some(tenant) = self.tenants.get_mut(name) else {
            return;
        };
        let events = tenant.events_60s(now_ms);
        let below = self.config.shared_sketch_below;
        if !tenant.is_own() && events >= below {
            let cost = self.config.own_tenant_bytes();
            if (self.bytes + cost) as u64 <= self.config.memory_budget_bytes {
                tenant.set_own(&self.config, true);
                self.bytes += cost;
                tracing::debug!(tenant = name, events, "tenant promoted to its own sketches");
            }
        } else if tenant.is_own() && events < below / 2 {
            tenant.set_own(&self.config, false);
            tracing::debug!(tenant = name, events, "tenant back in the shared sketch");
        }
    }

    /// Evicts every tenant silent for [`IDLE_EVICT_MS`] behind `now_ms`, keeps their
    /// summaries (at most [`MAX_EVICTED_SUMMARIES`]), and refreshes the memory estimate.
    fn evict_idle(&mut self, now_ms: u64) {
        self.maintained_s = now_ms / COARSE_MS;
        let idle: Vec<String> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.last_event_ms.saturating_add(IDLE_EVICT_MS) <= now_ms)
            .map(|(name, _)| name.clone())
            .collect();
        let evicted_any = !idle.is_empty();
        self.evictions += idle.len() as u64;
        for name in idle {
            let Some(tenant) = self.tenants.remove(&name) else {
                continue;
            };
            if let Ok(id) = TenantId::new(name.as_str()) {
                self.evicted.insert(
                    name,
                    EvictedTenant {
                        tenant: id,
                        events: tenant.events,
                        last_event_ms: tenant.last_event_ms,
                    },
                );
            }
        }
        if evicted_any || self.maintained_s % RECOUNT_EVERY_S == 0 {
            self.bytes = self.reserved_bytes();
        }
        if self.evicted.len() > MAX_EVICTED_SUMMARIES {
            let mut oldest: Vec<(u64, String)> = self
                .evicted
                .iter()
                .map(|(n, e)| (e.last_event_ms, n.clone()))
                .collect();
            oldest.sort_unstable();
            let excess = self.evicted.len() - MAX_EVICTED_SUMMARIES * 3 / 4;
            for (_, name) in oldest.into_iter().take(excess) {
                self.evicted.remove(&name);
            }
        }
    }

    /// What the budget is checked against: [`HeatMap::memory_bytes`] with the shared
    /// sketch and each own tenant's sketches counted as if every bucket were in use
    /// (they are made on first use), so a budget that admitted them still holds when
    /// they fill.
    fn reserved_bytes(&self) -> usize {
        let shared = if self.config.shared_sketch_below > 0 {
            self.config.shared_bytes().max(self.shared.bytes())
        } else {
            self.shared.bytes()
        };
        std::mem::size_of::<Self>()
            + shared
            + self
                .tenants
                .iter()
                .map(|(name, t)| 48 + name.len() + t.reserved_bytes(&self.config))
                .sum::<usize>()
            + self.evicted.len() * (2 * 48 + std::mem::size_of::<EvictedTenant>())
    }

    /// Tenants seen, sorted by name, with where their counts are and the error bound
    /// of their 60 s estimates.
    pub fn tenants(&self) -> Vec<TenantSummary> {
        let now = self.watermark_ms;
        let mut out: Vec<TenantSummary> = self
            .tenants
            .iter()
            .filter_map(|(name, t)| {
                let own = t.is_own();
                Some(TenantSummary {
                    tenant: TenantId::new(name.as_str()).ok()?,
                    events: t.events,
                    last_event_ms: t.last_event_ms,
                    regions: t.regions.clone(),
                    sketch: if own {
                        SketchKind::Own
                    } else {
                        SketchKind::Shared
                    },
                    error_bound: if own {
                        self.config.error_bound()
                    } else {
                        self.config.shared_error_bound()
                    },
                    events_60s: t.events_60s(now),
                    error_bound_events_60s: t.error_bound_events(
                        &self.config,
                        &self.shared,
                        Window::S60,
                        now,
                    ),
                })
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// Summaries of evicted tenants, newest first.
    pub fn evicted(&self) -> Vec<EvictedTenant> {
        let mut out: Vec<EvictedTenant> = self.evicted.values().cloned().collect();
        out.sort_by(|a, b| {
            b.last_event_ms
                .cmp(&a.last_event_ms)
                .then(a.tenant.cmp(&b.tenant))
        });
        out
    }

    /// The tenants tracked, unsorted: [`HeatMap::tenants`] without the summaries and
    /// their error bounds, for callers that visit every tenant often (the predictor).
    pub fn tenant_ids(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// The counters of each kind of edge (prefetcher, nginx, varnish, other, then
    /// `unspecified`) since this process started, with their rate and nodes as of
    /// the watermark.
    pub fn edges(&self) -> Vec<EdgeSummary> {
        self.edges.summaries(self.watermark_ms)
    }

    /// Tenants evicted since this heat map was made or restored.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many tenants are tracked.
    pub fn tenants_len(&self) -> usize {
        self.tenants.len()
    }

    /// One tenant's windows.
    pub fn tenant(&self, tenant: &TenantId) -> Option<&TenantHeat> {
        self.tenants.get(tenant.as_str())
    }

    fn get(&self, tenant: &TenantId) -> Result<&TenantHeat, QueryError> {
        self.tenant(tenant)
            .ok_or_else(|| QueryError::UnknownTenant(tenant.to_string()))
    }

    /// The additive error bound, in events, of a tenant's estimates over `window`
    /// ending at `now_ms` (see [`TenantSummary::error_bound_events_60s`]).
    pub fn error_bound_events(
        &self,
        tenant: &TenantId,
        window: Window,
        now_ms: u64,
    ) -> Result<u64, QueryError> {
        Ok(self
            .get(tenant)?
            .error_bound_events(&self.config, &self.shared, window, now_ms))
    }

    /// Estimates for one key, with windows ending at `now_ms` (usually
    /// [`HeatMap::now_ms`]). A key never seen has zero counts.
    pub fn key_stats(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> Result<KeyStats, QueryError> {
        Ok(self.get(tenant)?.stats(&self.shared, tenant, key, now_ms))
    }

    /// The heat map: up to `n` hottest keys of a tenant (or of one of its regions)
    /// over `window` ending at `now_ms`, hottest first.
    pub fn hot_keys(
        &self,
        tenant: &TenantId,
        region: Option<&RegionId>,
        window: Window,
        n: usize,
        now_ms: u64,
    ) -> Result<Vec<HotKey>, QueryError> {
        let heat = self.get(tenant)?;
        let region = match region {
            None => None,
            Some(r) => Some(
                heat.regions
                    .iter()
                    .position(|x| x == r)
                    .ok_or_else(|| QueryError::UnknownRegion(r.to_string()))?,
            ),
        };
        Ok(heat.hot_keys(&self.shared, region, window, n, now_ms))
    }

    /// Keys worth scoring now: those in the tenant's Top-K of the current or the
    /// previous second. Cheap; bounded by twice `top_k`.
    pub fn candidates(&self, tenant: &TenantId, now_ms: u64) -> Result<Vec<CacheKey>, QueryError> {
        Ok(self.get(tenant)?.candidates(now_ms))
    }

    /// A key's demand per second over `window` ending at `now_ms`: a window of
    /// [`HeatMap::key_windows`] (the same `velocity`), for a tick's first look at a key.
    pub fn key_velocity(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        window: Window,
        now_ms: u64,
    ) -> Result<f64, QueryError> {
        let heat = self.get(tenant)?;
        let demand = heat.demand(&self.shared, key_hash(key.as_str()), window, now_ms);
        Ok(demand as f64 / window.seconds())
    }

    /// One key's estimates over each of `windows` ending at `now_ms`, in their order:
    /// [`HeatMap::key_stats`] without the per-region breakdown, and only the windows
    /// asked for (a minute's sixty buckets cost more than the rest together).
    pub fn key_windows<const N: usize>(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        windows: [Window; N],
        now_ms: u64,
    ) -> Result<[WindowStats; N], QueryError> {
        let heat = self.get(tenant)?;
        let hash = key_hash(key.as_str());
        Ok(windows.map(|w| heat.window_stats(&self.shared, hash, w, now_ms)))
    }

    /// Approximate bytes held by the sketches, trackers and keys (not the allocator's
    /// view): what `memory_budget_bytes` is checked against.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.shared.bytes()
            + self
                .tenants
                .iter()
                .map(|(name, t)| 48 + name.len() + t.bytes())
                .sum::<usize>()
            + self.evicted.len() * (2 * 48 + std::mem::size_of::<EvictedTenant>())
            + self.edges.bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use models::{NodeId, Outcome};
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};

    use super::*;

    const T0: u64 = 1_764_470_000_000;

    fn ev(ts: u64, key: &str, region: &str, outcome: Outcome) -> AccessEvent {
        AccessEvent::new(
            ts,
            TenantId::new("acme").unwrap(),
            CacheKey::new(key).unwrap(),
            RegionId::new(region).unwrap(),
            NodeId::new("edge-1").unwrap(),
            outcome,
        )
    }

    fn acme() -> TenantId {
        TenantId::new("acme").unwrap()
    }

    fn key(k: &str) -> CacheKey {
        CacheKey::new(k).unwrap()
    }

    #[test]
    fn config_validation_names_the_field() {
        let mut c = HeatConfig::default();
        assert!(c.validate().is_ok());
        c.error = 0.0;
        assert_eq!(c.validate().unwrap_err().field, "error");
        c = HeatConfig {
            confidence: 1.0,
            ..HeatConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "confidence");
        c = HeatConfig {
            top_k: 0,
            ..HeatConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("top_k"));
    }

    #[test]
    fn dimensions_follow_error_and_confidence() {
        let c = HeatConfig::default();
        assert_eq!(c.width(), 512);
        assert_eq!(c.depth(), 6);
        assert!(c.error_bound() <= c.error);
        // streaming_algorithms rounds the depth down: the failure probability is
        // 2^-depth, within a factor 2 of 1 - confidence.
        assert!(c.failure_probability() <= 2.0 * (1.0 - c.confidence));
    }

    #[test]
    fn windows_count_per_outcome_and_expire_with_event_time() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..10 {
            heat.apply(&ev(T0 + i, "/a", "eu", Outcome::Miss)).unwrap();
            heat.apply(&ev(T0 + i, "/a", "eu", Outcome::Hit)).unwrap();
        }
        let s = heat.key_stats(&acme(), &key("/a"), T0 + 10).unwrap();
        for w in Window::ALL {
            assert_eq!(s.window(w).counts.miss, 10, "{w:?}");
            assert_eq!(s.window(w).counts.hit, 10, "{w:?}");
            assert_eq!(s.window(w).total, 20);
        }
        assert_eq!(s.window(Window::Ms200).velocity, 100.0);

        // 200 ms later (in event time) the shortest window has moved on.
        let s = heat.key_stats(&acme(), &key("/a"), T0 + 200).unwrap();
        assert_eq!(s.window(Window::Ms200).total, 0);
        assert_eq!(s.window(Window::S1).total, 20);
        // After 1 s, only the coarse windows remember; after 60 s nothing does.
        let s = heat.key_stats(&acme(), &key("/a"), T0 + 1_000).unwrap();
        assert_eq!(s.window(Window::S1).total, 0);
        assert_eq!(s.window(Window::S10).total, 20);
        let s = heat.key_stats(&acme(), &key("/a"), T0 + 60_000).unwrap();
        assert_eq!(s.window(Window::S60).total, 0);

        // A newer event advances the watermark and recycles the buckets.
        heat.apply(&ev(T0 + 120_000, "/b", "eu", Outcome::Hit))
            .unwrap();
        assert_eq!(heat.now_ms(), T0 + 120_000);
        let s = heat.key_stats(&acme(), &key("/a"), heat.now_ms()).unwrap();
        assert!(s.windows.iter().all(|w| w.total == 0));
        // An event older than the 60 s window is refused.
        assert_eq!(
            heat.apply(&ev(T0 + 10, "/a", "eu", Outcome::Hit)),
            Err(ApplyError::TooOld)
        );
        // A late event still inside the window is counted in its own bucket.
        heat.apply(&ev(T0 + 119_000, "/a", "eu", Outcome::Hit))
            .unwrap();
        let s = heat.key_stats(&acme(), &key("/a"), heat.now_ms()).unwrap();
        assert_eq!(s.window(Window::S10).total, 1);
        assert_eq!(s.window(Window::Ms200).total, 0);
    }

    #[test]
    fn miss_regions_and_acceleration() {
        let mut heat = HeatMap::new(HeatConfig::default());
        // Quiet second: 2 hits; then a burst of misses from 10 regions in 200 ms.
        heat.apply(&ev(T0, "/v", "r0", Outcome::Hit)).unwrap();
        heat.apply(&ev(T0 + 500, "/v", "r0", Outcome::Hit)).unwrap();
        for i in 0..50 {
            let region = format!("r{}", i % 10);
            heat.apply(&ev(T0 + 1_000 + i, "/v", &region, Outcome::Miss))
                .unwrap();
        }
        let s = heat.key_stats(&acme(), &key("/v"), T0 + 1_050).unwrap();
        let short = s.window(Window::Ms200);
        assert_eq!(short.misses, 50);
        assert_eq!(short.miss_regions.len(), 10);
        assert!(s.acceleration_1s > 0.0);
        assert!(s.acceleration_200ms > 0.0);
        assert_eq!(s.trend, Trend::Rising);
        // Hits do not mark regions.
        let s = heat.key_stats(&acme(), &key("/v"), T0 + 500).unwrap();
        assert!(s.window(Window::Ms200).miss_regions.is_empty());
        assert_eq!(s.window(Window::Ms200).total, 1);
    }

    #[test]
    fn heat_map_ranks_keys_per_tenant_and_region() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..100 {
            heat.apply(&ev(T0 + i, "/hot", "eu", Outcome::Hit)).unwrap();
        }
        for i in 0..30 {
            heat.apply(&ev(T0 + i, "/warm", "us", Outcome::Miss))
                .unwrap();
        }
        heat.apply(&ev(T0, "/cold", "us", Outcome::Hit)).unwrap();
        let now = heat.now_ms();
        let top = heat.hot_keys(&acme(), None, Window::S10, 2, now).unwrap();
        let keys: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(keys, ["/hot", "/warm"]);
        assert_eq!(top[0].count, 100);
        assert_eq!(top[0].regions[0].region.as_str(), "eu");
        assert_eq!(top[1].miss_regions[0].as_str(), "us");
        let us = RegionId::new("us").unwrap();
        let top = heat
            .hot_keys(&acme(), Some(&us), Window::S60, 10, now)
            .unwrap();
        let keys: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(keys, ["/warm", "/cold"]);
        assert_eq!(top[0].count, 30);
        assert_eq!(
            heat.hot_keys(
                &acme(),
                Some(&RegionId::new("mars").unwrap()),
                Window::S1,
                5,
                now
            ),
            Err(QueryError::UnknownRegion("mars".into()))
        );
        assert!(matches!(
            heat.hot_keys(&TenantId::new("nobody").unwrap(), None, Window::S1, 5, now),
            Err(QueryError::UnknownTenant(_))
        ));
        let candidates = heat.candidates(&acme(), now).unwrap();
        assert!(candidates.contains(&key("/hot")));
        assert_eq!(heat.tenants()[0].events, 131);
    }

    /// A pre-warm fill is pulse's own command coming back, not a request: it is
    /// counted (per outcome and in `total`) but raises no velocity, no acceleration
    /// and no rank, and a key only pre-warmed is no candidate.
    #[test]
    fn pre_warm_fills_are_not_demand() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..5 {
            heat.apply(&ev(T0 + i, "/a", "eu", Outcome::Hit)).unwrap();
        }
        for i in 0..40 {
            let region = format!("r{}", i % 8);
            heat.apply(&ev(T0 + 10 + i, "/a", &region, Outcome::PrefetchFill))
                .unwrap();
            heat.apply(&ev(T0 + 10 + i, "/warmed", &region, Outcome::PrefetchFill))
                .unwrap();
        }
        let s = heat.key_stats(&acme(), &key("/a"), T0 + 60).unwrap();
        let short = s.window(Window::Ms200);
        assert_eq!(short.counts.prefetch_fill, 40);
        assert_eq!((short.total, short.demand, short.misses), (45, 5, 0));
        assert_eq!(short.velocity, 25.0);
        assert_eq!(s.window(Window::S1).velocity, 5.0);
        assert_eq!(s.acceleration_200ms, 125.0);
        // The warmed regions hold the key: they are not "unseen".
        assert_eq!(short.regions.len(), 9);

        let top = heat
            .hot_keys(&acme(), None, Window::S10, 10, T0 + 60)
            .unwrap();
        let rows: Vec<(&str, u64, f64)> = top
            .iter()
            .map(|h| (h.key.as_str(), h.count, h.velocities.s1))
            .collect();
        assert_eq!(rows, [("/a", 5, 5.0)]);
        assert_eq!(top[0].regions.len(), 1, "{:?}", top[0].regions);
        assert_eq!(heat.candidates(&acme(), T0 + 60).unwrap(), [key("/a")]);
    }

    fn ev_of(tenant: &str, ts: u64, key: &str, region: &str) -> AccessEvent {
        let mut e = ev(ts, key, region, Outcome::Miss);
        e.tenant = TenantId::new(tenant).unwrap();
        e
    }

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    /// Hostile input: a timestamp far ahead of the clock. It is refused
    /// (`from_future`), the watermark stays, and on-time events of every tenant are
    /// still applied; the watermark never passes clock + skew.
    #[test]
    fn a_future_timestamp_is_refused_and_cannot_blind_on_time_events() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.set_clock(T0);
        heat.apply(&ev_of("acme", T0 - 10, "/a", "eu")).unwrap();
        let hour = 3_600_000;
        assert_eq!(
            heat.apply(&ev_of("forger", T0 + hour, "/a", "eu")),
            Err(ApplyError::FromFuture)
        );
        assert_eq!(ApplyError::FromFuture.as_str(), "from_future");
        assert_eq!(heat.now_ms(), T0 - 10);
        assert!(heat.tenant(&tenant("forger")).is_none(), "no tenant made");
        for name in ["acme", "globex", "initech"] {
            heat.apply(&ev_of(name, T0, "/a", "eu")).unwrap();
        }
        // Within the skew: applied, and the watermark stays at most clock + skew.
        let skew = heat.config().max_clock_skew_ms;
        heat.apply(&ev_of("acme", T0 + skew, "/a", "eu")).unwrap();
        assert_eq!(
            heat.apply(&ev_of("acme", T0 + skew + 1, "/a", "eu")),
            Err(ApplyError::FromFuture)
        );
        assert_eq!(heat.now_ms(), T0 + skew);
        // A late event inside the 60 s window still counts in the coarse windows.
        heat.apply(&ev_of("globex", T0 - 30_000, "/late", "eu"))
            .unwrap();
        let s = heat
            .key_stats(&tenant("globex"), &key("/late"), heat.now_ms())
            .unwrap();
        assert_eq!(s.window(Window::S60).total, 1);
        assert_eq!(s.window(Window::S10).total, 0);
    }

    /// A replay has no clock: the trace's event time is the clock, so a recorded trace
    /// far from today replays as it was recorded.
    #[test]
    fn without_a_clock_event_time_is_the_clock() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.apply(&ev_of("acme", T0, "/a", "eu")).unwrap();
        heat.apply(&ev_of("acme", T0 + 3_600_000, "/a", "eu"))
            .unwrap();
        assert_eq!(heat.now_ms(), T0 + 3_600_000);
    }

    /// Hostile input: a tenant flood. The limit is the memory budget, not a count of
    /// tenants ever seen: tenants silent for a window are evicted (a small summary
    /// kept), so once the flood goes quiet a new tenant is served within one window.
    #[test]
    fn a_tenant_flood_that_went_quiet_leaves_room_within_one_window() {
        let config = HeatConfig::default();
        let one = TenantHeat::new(&config, "t", false).bytes();
        let budget = (HeatMap::new(config.clone()).memory_bytes() + 60 * one) as u64;
        let mut heat = HeatMap::new(HeatConfig {
            memory_budget_bytes: budget
                .max((config.shared_bytes() + config.own_tenant_bytes()) as u64),
            ..config
        });
        let mut refused = 0;
        for i in 0..100_000 {
            match heat.apply(&ev_of(&format!("flood-{i}"), T0, "/a", "eu")) {
                Ok(()) => {}
                Err(ApplyError::MemoryBudget) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(refused > 0, "the budget was never reached");
        let held = heat.tenants_len();
        assert!(heat.memory_bytes() as u64 <= heat.config().memory_budget_bytes);
        assert_eq!(
            heat.apply(&ev_of("newcomer", T0 + 1_000, "/a", "eu")),
            Err(ApplyError::MemoryBudget)
        );
        // One window later (event time), the newcomer is served and the flood is gone.
        heat.apply(&ev_of("newcomer", T0 + IDLE_EVICT_MS, "/a", "eu"))
            .unwrap();
        assert_eq!(heat.tenants_len(), 1);
        assert_eq!(heat.evicted().len(), held);
        assert!(heat.evicted().iter().all(|e| e.events == 1));
        assert!(heat.tenant(&tenant("newcomer")).is_some());
        assert!(
            heat.hot_keys(&tenant("flood-0"), None, Window::S60, 5, heat.now_ms())
                .is_err()
        );
    }

    /// An evicted tenant is not in the next checkpoint, and a tenant that comes back
    /// continues its event count from its summary.
    #[test]
    fn evicted_tenants_stay_evicted_through_a_checkpoint() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.apply(&ev_of("gone", T0, "/a", "eu")).unwrap();
        heat.apply(&ev_of("gone", T0, "/b", "eu")).unwrap();
        heat.apply(&ev_of("stays", T0 + IDLE_EVICT_MS, "/a", "eu"))
            .unwrap();
        let back: HeatMap = serde_json::from_slice(&serde_json::to_vec(&heat).unwrap()).unwrap();
        assert!(back.tenant(&tenant("gone")).is_none());
        assert_eq!(back.evicted()[0].tenant.as_str(), "gone");
        let mut back = back;
        back.apply(&ev_of("gone", T0 + IDLE_EVICT_MS + 1, "/a", "eu"))
            .unwrap();
        assert_eq!(back.tenant(&tenant("gone")).unwrap().events(), 3);
        assert!(back.evicted().is_empty());
    }

    /// With an allow-list, other tenants' events are refused (`unknown_tenant`) and
    /// no state is made for them.
    #[test]
    fn an_allow_list_refuses_other_tenants() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.apply(&ev_of("stranger", T0, "/a", "eu")).unwrap();
        heat.set_allowed_tenants(Some(["acme".to_owned()].into()));
        assert!(heat.tenant(&tenant("stranger")).is_none());
        heat.apply(&ev_of("acme", T0, "/a", "eu")).unwrap();
        assert_eq!(
            heat.apply(&ev_of("stranger", T0, "/a", "eu")),
            Err(ApplyError::UnknownTenant)
        );
        assert_eq!(heat.tenants_len(), 1);
    }

    /// Memory follows traffic: a small tenant lives in the shared sketch (its bound a
    /// fraction of the shared stream), a big one gets its own sketches once it passes
    /// `shared_sketch_below` (its bound a fraction of its own events). Both kinds
    /// never underestimate and stay within their stated bounds; the same key of two
    /// tenants is counted apart.
    #[test]
    fn small_tenants_share_a_sketch_and_big_ones_get_their_own() {
        let config = HeatConfig {
            shared_sketch_below: 500,
            ..HeatConfig::default()
        };
        let mut heat = HeatMap::new(config.clone());
        let mut exact: HashMap<(String, String), u64> = HashMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let zipf = Zipf::new(500.0, 1.0).unwrap();
        // 3 s of traffic: "big" sends 3 000 events, 200 small tenants 10 each.
        for i in 0..5_000u64 {
            let ts = T0 + i * 3_000 / 5_000;
            let (name, k) = if i % 5 < 3 {
                ("big".to_owned(), zipf.sample(&mut rng) as u64)
            } else {
                (format!("small-{}", i % 200), i % 3)
            };
            let k = format!("/k/{k}");
            heat.apply(&ev_of(&name, ts, &k, "eu")).unwrap();
            *exact.entry((name, k)).or_default() += 1;
        }
        let now = heat.now_ms();
        let summaries = heat.tenants();
        let big = summaries
            .iter()
            .find(|t| t.tenant.as_str() == "big")
            .unwrap();
        assert_eq!(big.sketch, SketchKind::Own);
        let small = summaries
            .iter()
            .find(|t| t.tenant.as_str() == "small-8")
            .unwrap();
        assert_eq!(small.sketch, SketchKind::Shared);
        assert_eq!(small.error_bound, config.shared_error_bound());
        for ((name, k), truth) in &exact {
            let t = tenant(name);
            let est = heat
                .key_stats(&t, &key(k), now)
                .unwrap()
                .window(Window::S60)
                .total;
            let bound = heat.error_bound_events(&t, Window::S60, now).unwrap();
            assert!(est >= *truth, "{name}{k}: {est} < {truth}");
            assert!(est <= truth + bound, "{name}{k}: {est} > {truth} + {bound}");
        }
        // The big tenant's first second went to the shared sketch, the rest to its own.
        let shared_only = TenantHeat::new(&config, "x", false).bytes();
        assert!(heat.tenant(&tenant("small-8")).unwrap().bytes() < shared_only + 4_096);
        let top = heat
            .hot_keys(&tenant("small-8"), None, Window::S60, 3, now)
            .unwrap();
        assert_eq!(top.len(), 3);
    }

    /// `shared_sketch_below = 0` is the layout before the shared sketch: every tenant
    /// has its own sketches from its first event.
    #[test]
    fn shared_sketch_below_zero_gives_every_tenant_its_own() {
        let mut heat = HeatMap::new(HeatConfig {
            shared_sketch_below: 0,
            ..HeatConfig::default()
        });
        heat.apply(&ev_of("tiny", T0, "/a", "eu")).unwrap();
        assert_eq!(heat.tenants()[0].sketch, SketchKind::Own);
        assert!(heat.memory_bytes() >= heat.config().own_tenant_bytes() / 70);
    }

    /// Hostile input: a key flood (300 000 distinct keys in one tenant here; the
    /// `rss` example and `scripts/bench-pulse` take 10 million). Memory
    /// stays bounded by the sketch settings, not by the keys.
    #[test]
    fn a_key_flood_does_not_grow_memory() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..300_000u64 {
            heat.apply(&ev_of(
                "acme",
                T0 + i / 30_000,
                &format!("/flood/{i}"),
                "eu",
            ))
            .unwrap();
        }
        for _ in 0..1_000 {
            heat.apply(&ev_of("acme", T0 + 9, "/real", "eu")).unwrap();
        }
        let bytes = heat.memory_bytes();
        assert!(
            bytes <= heat.config().max_bytes_per_tenant() + heat.config().shared_bytes(),
            "{bytes}"
        );
        let top = heat
            .hot_keys(&acme(), None, Window::S1, 1, heat.now_ms())
            .unwrap();
        assert_eq!(top[0].key.as_str(), "/real");
    }

    /// Hostile input: more regions than tracked. The first MAX_REGIONS are tracked,
    /// the others' events still count (without a region).
    #[test]
    fn a_region_flood_is_capped_and_still_counted() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for r in 0..(MAX_REGIONS + 36) {
            heat.apply(&ev_of("acme", T0, "/a", &format!("r{r}")))
                .unwrap();
        }
        assert_eq!(heat.tenants()[0].regions.len(), MAX_REGIONS);
        let s = heat.key_stats(&acme(), &key("/a"), T0).unwrap();
        assert_eq!(s.window(Window::S1).total, (MAX_REGIONS + 36) as u64);
        assert_eq!(s.window(Window::S1).miss_regions.len(), MAX_REGIONS);
    }

    /// Hostile input: one node floods one key. The key tops the heat map with its
    /// true count; the other keys' estimates stay within the bound of the tenant's
    /// (now larger) window.
    #[test]
    fn one_node_flooding_one_key_does_not_distort_the_others() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..50u64 {
            heat.apply(&ev_of("acme", T0 + i, &format!("/k/{}", i % 5), "eu"))
                .unwrap();
        }
        for i in 0..200_000u64 {
            heat.apply(&ev_of("acme", T0 + i / 40_000, "/flooded", "us"))
                .unwrap();
        }
        let now = heat.now_ms();
        let top = heat.hot_keys(&acme(), None, Window::S10, 6, now).unwrap();
        assert_eq!(top[0].key.as_str(), "/flooded");
        assert_eq!(top[0].count, 200_000);
        let bound = heat.error_bound_events(&acme(), Window::S10, now).unwrap();
        for k in 0..5 {
            let est = heat
                .key_stats(&acme(), &key(&format!("/k/{k}")), now)
                .unwrap()
                .window(Window::S10)
                .total;
            assert!((10..=10 + bound).contains(&est), "/k/{k}: {est}");
        }
    }

    /// The stated bound holds against an exact counter on a skewed stream: every
    /// estimate is at least the truth and at most `truth + error_bound * N`; and the
    /// heat map's top keys are the true top keys.
    #[test]
    fn estimates_stay_within_the_bound_on_a_zipf_stream() {
        let config = HeatConfig::default();
        let mut heat = HeatMap::new(config.clone());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let zipf = Zipf::new(20_000.0, 1.1).unwrap();
        let mut exact: HashMap<u64, u64> = HashMap::new();
        let n = 200_000u64;
        for i in 0..n {
            let k = zipf.sample(&mut rng) as u64;
            *exact.entry(k).or_default() += 1;
            // Spread over 9 s of event time: the 10 s window covers all of it.
            let ts = T0 + i * 9_000 / n;
            heat.apply(&ev(ts, &format!("/k/{k}"), "eu", Outcome::Hit))
                .unwrap();
        }
        let now = heat.now_ms();
        let bound = (config.error_bound() * n as f64).ceil() as u64;
        let mut over = 0;
        for (k, truth) in &exact {
            let est = heat
                .key_stats(&acme(), &key(&format!("/k/{k}")), now)
                .unwrap()
                .window(Window::S10)
                .total;
            assert!(est >= *truth, "/k/{k}: estimate {est} < truth {truth}");
            if est > truth + bound {
                over += 1;
            }
        }
        // Each estimate may exceed the bound with probability 2^-depth.
        let allowed = (config.failure_probability() * exact.len() as f64).ceil() as usize;
        assert!(
            over <= allowed,
            "{over} estimates beyond ±{bound}, allowed {allowed}"
        );

        let mut truth: Vec<(u64, u64)> = exact.iter().map(|(k, c)| (*c, *k)).collect();
        truth.sort_unstable_by(|a, b| b.cmp(a));
        let top = heat.hot_keys(&acme(), None, Window::S10, 10, now).unwrap();
        for (h, (count, k)) in top.iter().zip(&truth) {
            assert_eq!(h.key.as_str(), format!("/k/{k}"));
            assert!(h.count >= *count && h.count <= count + bound);
        }
    }

    #[test]
    fn serde_round_trip_keeps_answers() {
        let mut heat = HeatMap::new(HeatConfig::default());
        for i in 0..500 {
            let region = ["eu", "us", "ap"][i as usize % 3];
            heat.apply(&ev(
                T0 + i * 10,
                &format!("/k/{}", i % 7),
                region,
                Outcome::Miss,
            ))
            .unwrap();
        }
        let json = serde_json::to_vec(&heat).unwrap();
        let back: HeatMap = serde_json::from_slice(&json).unwrap();
        let now = heat.now_ms();
        assert_eq!(back.now_ms(), now);
        assert_eq!(back.tenants(), heat.tenants());
        for w in Window::ALL {
            assert_eq!(
                back.hot_keys(&acme(), None, w, 10, now).unwrap(),
                heat.hot_keys(&acme(), None, w, 10, now).unwrap()
            );
        }
        assert_eq!(
            back.key_stats(&acme(), &key("/k/3"), now).unwrap(),
            heat.key_stats(&acme(), &key("/k/3"), now).unwrap()
        );
    }
}
