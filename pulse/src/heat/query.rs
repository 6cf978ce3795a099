//! The queries on a [`HeatMap`]: tenants, one key's windows, the hottest keys, the
//! predictor's candidates and velocities.

use models::{CacheKey, RegionId, TenantId};

use super::sketch::key_hash;
use super::{
    EdgeSummary, HeatMap, HotKey, KeyStats, QueryError, SketchKind, TenantHeat, TenantSummary,
    Window, WindowStats,
};

impl HeatMap {
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
}

#[cfg(test)]
mod tests {
    use models::Outcome;

    use super::*;
    use crate::heat::tests::{T0, acme, ev, key};
    use crate::heat::*;

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
}
