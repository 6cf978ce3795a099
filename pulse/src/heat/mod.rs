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
//! - `view`: what queries return ([`Window`], [`KeyStats`], [`HotKey`],
//!   [`TenantSummary`], …).
//!
//! This module keeps the [`HeatMap`] itself, its [`HeatConfig`] and its errors.

mod rings;
mod sketch;
mod tenant;
mod top;
mod view;

use std::collections::HashMap;

use models::{AccessEvent, AccessEventRef, CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};

use sketch::{Cell, key_hash};
use top::{REGION_TOP_SKETCH, TOP_DEPTH, TOP_WIDTH, TopKey};

pub use tenant::TenantHeat;
pub use view::{
    HotKey, KeyStats, OutcomeCounts, RegionCount, TenantSummary, Trend, Velocities, Window,
    WindowStats,
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

/// How big and how exact the sketches are. Memory per tenant depends only on this,
/// never on the number of distinct keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatConfig {
    /// Additive error as a fraction of the window's events (ε), in (0, 1).
    pub error: f64,
    /// Probability that an estimate stays within the error (1 − δ), in (0, 1).
    pub confidence: f64,
    /// Keys tracked per tenant per coarse bucket (the heat map's candidates).
    pub top_k: usize,
    /// Keys tracked per region per coarse bucket.
    pub region_top_k: usize,
    /// Tenants tracked; events of further tenants are rejected (`tenant_limit`).
    pub max_tenants: usize,
}

impl Default for HeatConfig {
    fn default() -> Self {
        HeatConfig {
            error: 0.005,
            confidence: 0.99,
            top_k: 64,
            region_top_k: 16,
            max_tenants: 64,
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
        if !(1..=100_000).contains(&self.max_tenants) {
            return bad("max_tenants", "must be in 1..=100000");
        }
        Ok(())
    }

    /// Columns per sketch row, as streaming_algorithms computes them.
    pub fn width(&self) -> usize {
        ((2.0 / self.error).round() as usize)
            .max(2)
            .next_power_of_two()
    }

    /// Rows per sketch, as streaming_algorithms computes them.
    pub fn depth(&self) -> usize {
        (((1.0 - self.confidence).ln() / 0.5_f64.ln()).floor() as usize).max(1)
    }

    /// The effective additive error as a fraction of the window's events: `2 / width`
    /// (at most `error`).
    pub fn error_bound(&self) -> f64 {
        2.0 / self.width() as f64
    }

    /// Probability that one estimate exceeds the bound: `2^-depth` (streaming_algorithms
    /// rounds the depth down, so this is up to twice `1 - confidence`).
    pub fn failure_probability(&self) -> f64 {
        0.5_f64.powi(self.depth() as i32)
    }

    /// Worst-case bytes of one tenant: every bucket's sketch, every Top-K (for
    /// [`MAX_REGIONS`] regions) and its keys at [`models::MAX_KEY_LEN`].
    pub fn max_bytes_per_tenant(&self) -> usize {
        let sketch = self.width() * self.depth() * std::mem::size_of::<Cell>();
        let top = |k: usize, width: usize, depth: usize| {
            // map entry + list node + the key, plus the Top's own sketch.
            k * (64 + 2 * std::mem::size_of::<TopKey>() + models::MAX_KEY_LEN / 8)
                + width * depth * std::mem::size_of::<usize>()
        };
        let (tw, td) = self.top_sketch();
        let (rw, rd) = REGION_TOP_SKETCH;
        (FINE_BUCKETS + COARSE_BUCKETS) * sketch
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
    /// The tenant is new and `max_tenants` are already tracked.
    #[error("tenant limit reached")]
    TenantLimit,
}

impl ApplyError {
    /// Every reason, in declaration order (for metrics that list all of them).
    pub const ALL: [ApplyError; 2] = [ApplyError::TooOld, ApplyError::TenantLimit];

    /// The metric label `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyError::TooOld => "too_old",
            ApplyError::TenantLimit => "tenant_limit",
        }
    }
}

/// Why a query could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// No event of this tenant has been seen.
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// The tenant has no events from this region.
    #[error("unknown region {0:?} for this tenant")]
    UnknownRegion(String),
}

/// Every tenant's windows: the state pulse ingests into, checkpoints, and answers
/// the dashboard and the predictor from.
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
}

impl HeatMap {
    /// An empty heat map. `config` should have passed [`HeatConfig::validate`].
    pub fn new(config: HeatConfig) -> Self {
        HeatMap {
            config,
            watermark_ms: 0,
            tenants: HashMap::new(),
        }
    }

    /// The sketch configuration.
    pub fn config(&self) -> &HeatConfig {
        &self.config
    }

    /// The watermark: the newest event time applied, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.watermark_ms
    }

    /// Adds one event to its tenant's windows and advances the watermark.
    pub fn apply(&mut self, event: &AccessEvent) -> Result<(), ApplyError> {
        self.apply_ref(&event.borrowed())
    }

    /// [`HeatMap::apply`] for an event borrowed from its message
    /// ([`models::decode_event_ref`]): the ingest path, which copies no string.
    pub fn apply_ref(&mut self, event: &AccessEventRef<'_>) -> Result<(), ApplyError> {
        let watermark = self.watermark_ms.max(event.ts_ms);
        let tenant = match self.tenants.get_mut(event.tenant.as_str()) {
            Some(tenant) => tenant,
            None => {
                if self.tenants.len() >= self.config.max_tenants {
                    return Err(ApplyError::TenantLimit);
                }
                self.tenants
                    .entry(event.tenant.as_str().to_owned())
                    .or_insert_with(|| TenantHeat::new(&self.config))
            }
        };
        tenant.apply(&self.config, event, watermark)?;
        self.watermark_ms = watermark;
        Ok(())
    }

    /// Tenants seen, sorted by name.
    pub fn tenants(&self) -> Vec<TenantSummary> {
        let mut out: Vec<TenantSummary> = self
            .tenants
            .iter()
            .filter_map(|(name, t)| {
                Some(TenantSummary {
                    tenant: TenantId::new(name.as_str()).ok()?,
                    events: t.events,
                    last_event_ms: t.last_event_ms,
                    regions: t.regions.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
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

    /// Estimates for one key, with windows ending at `now_ms` (usually
    /// [`HeatMap::now_ms`]). A key never seen has zero counts.
    pub fn key_stats(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> Result<KeyStats, QueryError> {
        Ok(self.get(tenant)?.stats(tenant, key, now_ms))
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
        Ok(heat.hot_keys(region, window, n, now_ms))
    }

    /// Keys worth scoring now: those in the tenant's Top-K of the current or the
    /// previous second. Cheap; bounded by twice `top_k`.
    pub fn candidates(&self, tenant: &TenantId, now_ms: u64) -> Result<Vec<CacheKey>, QueryError> {
        Ok(self.get(tenant)?.candidates(now_ms))
    }

    /// The per-window estimates of one key, shortest window first: [`HeatMap::key_stats`]
    /// without the per-region breakdown, cheap enough to call per candidate per tick.
    pub fn key_windows(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> Result<[WindowStats; 4], QueryError> {
        let heat = self.get(tenant)?;
        let hash = key_hash(key.as_str());
        Ok(Window::ALL.map(|w| heat.window_stats(hash, w, now_ms)))
    }

    /// Approximate bytes held by the sketches and trackers (not the allocator's view).
    pub fn memory_bytes(&self) -> usize {
        let sketch = self.config.width() * self.config.depth() * std::mem::size_of::<Cell>();
        self.tenants
            .values()
            .map(|t| {
                (FINE_BUCKETS + COARSE_BUCKETS) * sketch
                    + t.fine.bytes()
                    + t.coarse.bytes()
                    + COARSE_BUCKETS * self.config.top_k * 96
            })
            .sum()
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

    #[test]
    fn tenant_limit_bounds_memory() {
        let mut heat = HeatMap::new(HeatConfig {
            max_tenants: 1,
            ..HeatConfig::default()
        });
        heat.apply(&ev(T0, "/a", "eu", Outcome::Hit)).unwrap();
        let mut other = ev(T0, "/a", "eu", Outcome::Hit);
        other.tenant = TenantId::new("other").unwrap();
        assert_eq!(heat.apply(&other), Err(ApplyError::TenantLimit));
        assert_eq!(ApplyError::TenantLimit.as_str(), "tenant_limit");
        assert!(heat.memory_bytes() > 0);
        assert!(heat.memory_bytes() <= heat.config().max_bytes_per_tenant());
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
