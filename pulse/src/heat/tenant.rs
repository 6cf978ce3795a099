//! One tenant's state: its regions, its fine and coarse rings, and the queries
//! answered from them (window sums, acceleration, hot keys, candidates).

use std::collections::HashMap;
use std::sync::Arc;

use models::{AccessEventRef, CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};

use super::rings::Ring;
use super::sketch::{OUTCOMES, Tally, key_hash, outcome_index};
use super::top::{REGION_TOP_SKETCH, TopKey, new_top};
use super::{
    ApplyError, COARSE_BUCKETS, COARSE_MS, FINE_BUCKETS, FINE_MS, HeatConfig, HotKey, KeyStats,
    MAX_REGIONS, OutcomeCounts, RegionCount, Trend, Velocities, Window, WindowStats,
};

/// One tenant's windows.
#[derive(Clone, Serialize, Deserialize)]
pub struct TenantHeat {
    pub(super) regions: Vec<RegionId>,
    pub(super) events: u64,
    pub(super) last_event_ms: u64,
    pub(super) fine: Ring,
    pub(super) coarse: Ring,
    /// The key text handed to the Top-K trackers, refilled per event (see `apply`).
    #[serde(skip)]
    spare_key: Arc<String>,
}

impl TenantHeat {
    pub(super) fn new(config: &HeatConfig) -> Self {
        TenantHeat {
            regions: Vec::new(),
            events: 0,
            last_event_ms: 0,
            fine: Ring::new(config, FINE_MS, FINE_BUCKETS, false),
            coarse: Ring::new(config, COARSE_MS, COARSE_BUCKETS, true),
            spare_key: Arc::default(),
        }
    }

    pub(super) fn apply(
        &mut self,
        config: &HeatConfig,
        event: &AccessEventRef<'_>,
        watermark_ms: u64,
    ) -> Result<(), ApplyError> {
        let ts = event.ts_ms;
        let Some(coarse) = self.coarse.slot(ts / COARSE_MS, watermark_ms / COARSE_MS) else {
            return Err(ApplyError::TooOld);
        };
        let key = event.key.as_str();
        let region = match self.regions.iter().position(|r| event.region == *r) {
            Some(i) => Some(i),
            None if self.regions.len() < MAX_REGIONS => {
                self.regions.push(event.region.to_owned_id());
                Some(self.regions.len() - 1)
            }
            None => None,
        };
        let hash = key_hash(key);
        let tally = Tally {
            outcome: outcome_index(event.outcome),
            miss_bit: match region {
                Some(i) if event.outcome.is_miss() => 1 << i,
                _ => 0,
            },
            region_bit: region.map_or(0, |i| 1 << i),
        };
        let columns = coarse.sketch.columns(hash);
        coarse.events += 1;
        coarse.sketch.push(&columns, &tally);

        // The Top-Ks rank what clients want: a pre-warm fill is no request.
        if event.outcome.is_demand() {
            // The trackers take the key by value but keep it only when it enters their
            // Top-K. So the text goes into a reusable buffer, and a new buffer is made
            // only when a tracker kept this one: one allocation per key entering a Top-K,
            // not per event.
            match Arc::get_mut(&mut self.spare_key) {
                // A buffer grown by a long key is not kept for short ones: a tracker
                // would hold on to the spare capacity.
                Some(buf) if buf.capacity() <= 4 * key.len().max(64) => {
                    buf.clear();
                    buf.push_str(key);
                }
                _ => self.spare_key = Arc::new(key.to_owned()),
            }
            let top_key = TopKey {
                hash,
                key: self.spare_key.clone(),
            };
            if let Some(i) = region {
                if coarse.region_tops.len() <= i {
                    coarse.region_tops.resize_with(i + 1, || None);
                }
                coarse.region_tops[i]
                    .get_or_insert_with(|| new_top(config.region_top_k, REGION_TOP_SKETCH))
                    .push(top_key.clone());
            }
            if let Some(top) = &mut coarse.top {
                top.push(top_key);
            }
            if Arc::strong_count(&self.spare_key) > 1 {
                self.spare_key = Arc::default();
            }
        }

        if let Some(fine) = self.fine.slot(ts / FINE_MS, watermark_ms / FINE_MS) {
            fine.events += 1;
            fine.sketch.push(&columns, &tally);
        }
        self.events += 1;
        self.last_event_ms = self.last_event_ms.max(ts);
        Ok(())
    }

    /// Sum of a key's cells over the `n` buckets of `ring` ending at `end_ms`.
    /// Counts per outcome, and the bitsets of regions that missed and that asked.
    fn sum(ring: &Ring, hash: u64, end_ms: u64, n: u64) -> ([u64; OUTCOMES], u64, u64) {
        let mut counts = [0u64; OUTCOMES];
        let (mut missed, mut asked) = (0u64, 0u64);
        let mut columns = None;
        for bucket in ring.last_n(end_ms, n) {
            let columns = columns.get_or_insert_with(|| bucket.sketch.columns(hash));
            let cell = bucket.sketch.get(columns);
            for (c, v) in counts.iter_mut().zip(cell.0) {
                *c += u64::from(v);
            }
            missed |= cell.1;
            asked |= cell.2;
        }
        (counts, missed, asked)
    }

    fn window_sum(&self, hash: u64, window: Window, end_ms: u64) -> ([u64; OUTCOMES], u64, u64) {
        if window.is_fine() {
            Self::sum(&self.fine, hash, end_ms, window.millis() / FINE_MS)
        } else {
            Self::sum(&self.coarse, hash, end_ms, window.millis() / COARSE_MS)
        }
    }

    fn region_names(&self, bits: u64) -> Vec<RegionId> {
        self.regions
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, r)| r.clone())
            .collect()
    }

    pub(super) fn window_stats(&self, hash: u64, window: Window, now_ms: u64) -> WindowStats {
        let (counts, missed, asked) = self.window_sum(hash, window, now_ms);
        let counts = OutcomeCounts::from_array(counts);
        let total = counts.total();
        let demand = counts.demand();
        let misses = counts.misses();
        WindowStats {
            window,
            counts,
            total,
            demand,
            misses,
            velocity: demand as f64 / window.seconds(),
            miss_velocity: misses as f64 / window.seconds(),
            miss_regions: self.region_names(missed),
            regions: self.region_names(asked),
        }
    }

    /// Demand in `window` ending at `end_ms`.
    fn demand(&self, hash: u64, window: Window, end_ms: u64) -> u64 {
        OutcomeCounts::from_array(self.window_sum(hash, window, end_ms).0).demand()
    }

    /// Velocity (demand) change between the window ending now and the one before it.
    fn acceleration(&self, hash: u64, window: Window, now_ms: u64) -> f64 {
        let now = self.demand(hash, window, now_ms);
        let before = match now_ms.checked_sub(window.millis()) {
            Some(end) => self.demand(hash, window, end),
            None => 0,
        };
        (now as f64 - before as f64) / window.seconds() / window.seconds()
    }

    /// Coarse bucket numbers covering `window` ending at `now_ms`.
    fn coarse_span(window: Window, now_ms: u64) -> (u64, u64) {
        let start = (now_ms + 1).saturating_sub(window.millis());
        (start / COARSE_MS, now_ms / COARSE_MS)
    }

    /// Per-region counts of keys (by hash) from the region Top-Ks in the span.
    fn region_counts(&self, first: u64, last: u64) -> HashMap<u64, Vec<u64>> {
        let mut out: HashMap<u64, Vec<u64>> = HashMap::new();
        for bucket in self.coarse.range(first, last) {
            for (i, top) in bucket.region_tops.iter().enumerate() {
                for (k, c) in top.iter().flat_map(|t| t.iter()) {
                    let row = out
                        .entry(k.hash)
                        .or_insert_with(|| vec![0; self.regions.len()]);
                    row[i] += *c as u64;
                }
            }
        }
        out
    }

    fn region_breakdown(&self, row: Option<&Vec<u64>>) -> Vec<RegionCount> {
        let mut regions: Vec<RegionCount> = row
            .map(|row| {
                row.iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0)
                    .map(|(i, c)| RegionCount {
                        region: self.regions[i].clone(),
                        count: *c,
                    })
                    .collect()
            })
            .unwrap_or_default();
        regions.sort_by(|a, b| b.count.cmp(&a.count).then(a.region.cmp(&b.region)));
        regions
    }

    pub(super) fn stats(&self, tenant: &TenantId, key: &CacheKey, now_ms: u64) -> KeyStats {
        let hash = key_hash(key.as_str());
        let windows: Vec<WindowStats> = Window::ALL
            .iter()
            .map(|w| self.window_stats(hash, *w, now_ms))
            .collect();
        let acceleration_1s = self.acceleration(hash, Window::S1, now_ms);
        let now_1s = windows[1].demand as f64;
        let trend = if acceleration_1s.abs() <= (0.1 * now_1s).max(1.0) {
            Trend::Steady
        } else if acceleration_1s > 0.0 {
            Trend::Rising
        } else {
            Trend::Falling
        };
        let (first, last) = Self::coarse_span(Window::S60, now_ms);
        let counts = self.region_counts(first, last);
        KeyStats {
            tenant: tenant.clone(),
            key: key.clone(),
            now_ms,
            windows,
            acceleration_200ms: self.acceleration(hash, Window::Ms200, now_ms),
            acceleration_1s,
            trend,
            regions: self.region_breakdown(counts.get(&hash)),
        }
    }

    pub(super) fn hot_keys(
        &self,
        region: Option<usize>,
        window: Window,
        n: usize,
        now_ms: u64,
    ) -> Vec<HotKey> {
        let (first, last) = Self::coarse_span(window, now_ms);
        // Candidates: every key in a Top-K of the span (the tenant's or the region's).
        let mut candidates: HashMap<u64, Arc<String>> = HashMap::new();
        for bucket in self.coarse.range(first, last) {
            let top = match region {
                None => bucket.top.as_ref(),
                Some(i) => bucket.region_tops.get(i).and_then(|t| t.as_ref()),
            };
            for (k, _) in top.iter().flat_map(|t| t.iter()) {
                candidates.entry(k.hash).or_insert_with(|| k.key.clone());
            }
        }
        let region_counts = self.region_counts(first, last);
        let mut rows: Vec<(u64, u64, Arc<String>)> = candidates
            .into_iter()
            .map(|(hash, key)| {
                let count = match region {
                    None => self.demand(hash, window, now_ms),
                    Some(i) => region_counts.get(&hash).map_or(0, |row| row[i]),
                };
                (count, hash, key)
            })
            .filter(|(count, _, _)| *count > 0)
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
        rows.truncate(n);
        rows.into_iter()
            .filter_map(|(count, hash, key)| {
                let key = CacheKey::new(key.as_str()).ok()?;
                let v = |w| self.window_stats(hash, w, now_ms);
                let short = v(Window::Ms200);
                let this = v(window);
                Some(HotKey {
                    key,
                    count,
                    misses: this.misses,
                    velocities: Velocities {
                        ms200: short.velocity,
                        s1: v(Window::S1).velocity,
                        s10: v(Window::S10).velocity,
                        s60: v(Window::S60).velocity,
                    },
                    acceleration: self.acceleration(hash, Window::S1, now_ms),
                    miss_regions: short.miss_regions,
                    regions: self.region_breakdown(region_counts.get(&hash)),
                })
            })
            .collect()
    }

    /// Keys in the Top-K of the current and the previous second.
    pub(super) fn candidates(&self, now_ms: u64) -> Vec<CacheKey> {
        let last = now_ms / COARSE_MS;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for bucket in self.coarse.range(last.saturating_sub(1), last) {
            for (k, _) in bucket.top.iter().flat_map(|t| t.iter()) {
                if seen.insert(k.hash) {
                    if let Ok(key) = CacheKey::new(k.key.as_str()) {
                        out.push(key);
                    }
                }
            }
        }
        out
    }
}

impl TenantHeat {
    /// Regions seen, in order of first appearance.
    pub fn regions(&self) -> &[RegionId] {
        &self.regions
    }

    /// Events applied.
    pub fn events(&self) -> u64 {
        self.events
    }
}
