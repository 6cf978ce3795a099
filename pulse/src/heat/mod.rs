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

mod config;
mod edges;
mod error;
mod evict;
mod query;
mod rings;
mod sketch;
mod tenant;
mod top;
mod view;

use std::collections::{HashMap, HashSet};

use models::{AccessEvent, AccessEventRef, Outcome};
use serde::{Deserialize, Serialize};

use edges::EdgeCounters;
use tenant::SharedSketch;

pub use config::{ConfigError, HeatConfig};
pub use edges::EdgeSummary;
pub(crate) use edges::{MAX_NODES_PER_EDGE, NODE_WINDOW_S, RATE_WINDOW_S};
pub use error::{ApplyError, QueryError};
pub use evict::EvictedTenant;
pub(crate) use evict::{IDLE_EVICT_MS, MAX_EVICTED_SUMMARIES};
pub use tenant::TenantHeat;
pub use view::{
    HotKey, KeyStats, OutcomeCounts, RegionCount, SketchKind, TenantSummary, Trend, Velocities,
    Window, WindowStats,
};

/// Width of a fine bucket, in milliseconds.
pub(crate) const FINE_MS: u64 = 200;
/// Fine buckets kept: 2 s, so the 200 ms and 1 s windows have a previous window to
/// compare with (acceleration).
pub(crate) const FINE_BUCKETS: usize = 10;
/// The time the fine ring spans.
pub(crate) const FINE_SPAN_MS: u64 = FINE_MS * FINE_BUCKETS as u64;
/// Width of a coarse bucket, in milliseconds.
pub(crate) const COARSE_MS: u64 = 1_000;
/// Coarse buckets kept: the 60 s window.
pub(crate) const COARSE_BUCKETS: usize = 60;
/// Regions tracked per tenant; events from further regions still count, without a
/// region (the bitset of miss regions is a `u64`).
pub(crate) const MAX_REGIONS: usize = 64;

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
    /// A `prefetch_cached` event is no request and no fill: it is not counted (the
    /// warm-up that asked is credited with it, `crate::warm`).
    pub fn apply_ref(&mut self, event: &AccessEventRef<'_>) -> Result<(), ApplyError> {
        if event.outcome == Outcome::PrefetchCached {
            return Ok(());
        }
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

    use models::{CacheKey, NodeId, Outcome, RegionId, TenantId};
    use rand::SeedableRng;
    use rand_distr::{Distribution, Zipf};

    use super::*;

    pub(super) const T0: u64 = 1_764_470_000_000;

    pub(super) fn ev(ts: u64, key: &str, region: &str, outcome: Outcome) -> AccessEvent {
        AccessEvent::new(
            ts,
            TenantId::new("acme").unwrap(),
            CacheKey::new(key).unwrap(),
            RegionId::new(region).unwrap(),
            NodeId::new("edge-1").unwrap(),
            outcome,
        )
    }

    pub(super) fn acme() -> TenantId {
        TenantId::new("acme").unwrap()
    }

    pub(super) fn key(k: &str) -> CacheKey {
        CacheKey::new(k).unwrap()
    }

    pub(super) fn ev_of(tenant: &str, ts: u64, key: &str, region: &str) -> AccessEvent {
        let mut e = ev(ts, key, region, Outcome::Miss);
        e.tenant = TenantId::new(tenant).unwrap();
        e
    }

    pub(super) fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    /// A pre-warm that found the key cached is no request and no fill: the heat map
    /// counts it nowhere (no tenant made, no watermark moved, no edge counted).
    #[test]
    fn a_prefetch_cached_event_is_not_counted() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.apply(&ev(T0, "/a", "eu", Outcome::PrefetchCached))
            .unwrap();
        assert!(heat.tenants().is_empty());
        heat.apply(&ev(T0, "/a", "eu", Outcome::Hit)).unwrap();
        heat.apply(&ev(T0 + 5_000, "/a", "eu", Outcome::PrefetchCached))
            .unwrap();
        let tenants = heat.tenants();
        assert_eq!((tenants[0].events, heat.now_ms()), (1, T0));
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
