//! One tenant's state: its regions, its fine and coarse rings, and the queries
//! answered from them (window sums, acceleration, hot keys, candidates).
//!
//! A tenant's counts are in its own sketches or in the heat map's [`SharedSketch`],
//! bucket by bucket (see `rings`): a query reads each bucket where it was written.

use std::collections::HashMap;
use std::sync::Arc;

use models::{AccessEventRef, CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};

use super::rings::{Bucket, Ring};
use super::sketch::{Cell, Columns, OUTCOMES, Tally, key_hash, outcome_index};
use super::top::{REGION_TOP_SKETCH, TopKey, new_small_top, new_top};
use super::{
    ApplyError, COARSE_BUCKETS, COARSE_MS, FINE_BUCKETS, FINE_MS, HeatConfig, HotKey, KeyStats,
    MAX_REGIONS, OutcomeCounts, RegionCount, Trend, Velocities, Window, WindowStats,
};

/// The sketch small tenants share: one fine and one coarse ring of sketches keyed by
/// (tenant, key), without trackers (each tenant keeps its own small ones).
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct SharedSketch {
    pub(super) fine: Ring,
    pub(super) coarse: Ring,
}

impl SharedSketch {
    pub(super) fn new(config: &HeatConfig) -> Self {
        let dims = Some((config.shared_width(), config.depth()));
        SharedSketch {
            fine: Ring::new(FINE_MS, FINE_BUCKETS, dims, false),
            coarse: Ring::new(COARSE_MS, COARSE_BUCKETS, dims, false),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.fine.bytes() + self.coarse.bytes()
    }
}

/// Where a key of a tenant lands in the shared sketch: the key hash mixed with the
/// tenant's, so equal keys of two tenants are different counters.
fn shared_hash(tenant_hash: u64, hash: u64) -> u64 {
    hash ^ tenant_hash
        .rotate_left(29)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// One event's columns, computed at most once per sketch shape (the own fine and
/// coarse sketches share one, the shared ones another).
struct EventColumns {
    hash: u64,
    shared_hash: u64,
    own: Option<((usize, usize), Columns)>,
    shared: Option<((usize, usize), Columns)>,
}

impl EventColumns {
    fn push(&mut self, bucket: &mut Bucket, shared: Option<&mut Bucket>, tally: &Tally) {
        bucket.events += 1;
        let (sketch, hash, cache) = match (&mut bucket.sketch, shared) {
            (Some(sketch), _) => (sketch, self.hash, &mut self.own),
            (None, Some(shared)) => match &mut shared.sketch {
                Some(sketch) => {
                    shared.events += 1;
                    (sketch, self.shared_hash, &mut self.shared)
                }
                None => return,
            },
            (None, None) => return,
        };
        let columns = match cache {
            Some((dims, columns)) if *dims == sketch.dims() => columns,
            cache => &mut cache.insert((sketch.dims(), sketch.columns(hash))).1,
        };
        sketch.push(columns, tally);
    }
}

/// One tenant's windows.
#[derive(Clone, Serialize, Deserialize)]
pub struct TenantHeat {
    pub(super) regions: Vec<RegionId>,
    pub(super) events: u64,
    pub(super) last_event_ms: u64,
    pub(super) fine: Ring,
    pub(super) coarse: Ring,
    /// The tenant name's hash: its keys' place in the shared sketch.
    pub(super) tenant_hash: u64,
    /// The key text handed to the Top-K trackers, refilled per event (see `apply`).
    #[serde(skip)]
    spare_key: Arc<String>,
}

impl TenantHeat {
    /// A tenant with its own sketches (`own`) or in the shared one.
    pub(super) fn new(config: &HeatConfig, tenant: &str, own: bool) -> Self {
        let dims = own.then(|| (config.width(), config.depth()));
        TenantHeat {
            regions: Vec::new(),
            events: 0,
            last_event_ms: 0,
            fine: Ring::new(FINE_MS, FINE_BUCKETS, dims, own),
            coarse: Ring::new(COARSE_MS, COARSE_BUCKETS, dims, own),
            tenant_hash: key_hash(tenant),
            spare_key: Arc::default(),
        }
    }

    /// Whether new buckets get the tenant's own sketches.
    pub(super) fn is_own(&self) -> bool {
        self.coarse.has_own_sketch()
    }

    /// Gives the tenant its own sketches (`own`) or puts it back in the shared one,
    /// from each bucket's next recycling on.
    pub(super) fn set_own(&mut self, config: &HeatConfig, own: bool) {
        let dims = own.then(|| (config.width(), config.depth()));
        self.fine.set_mode(dims, own);
        self.coarse.set_mode(dims, own);
    }

    /// Bytes the tenant holds (the memory budget's view).
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.fine.bytes()
            + self.coarse.bytes()
            + self
                .regions
                .iter()
                .map(|r| 24 + r.as_str().len())
                .sum::<usize>()
    }

    /// [`TenantHeat::bytes`] with its own sketches counted as if every bucket were in
    /// use, plus room for its first trackers: what the memory budget reserves.
    pub(super) fn reserved_bytes(&self, config: &HeatConfig) -> usize {
        let sketches = self.fine.sketch_bytes() + self.coarse.sketch_bytes();
        let own = if self.is_own() {
            config.own_tenant_bytes().saturating_sub(sketches)
        } else {
            0
        };
        self.bytes() + own + 1_024
    }

    /// Events of the tenant in the coarse buckets up to and including `last`'s 60.
    pub(super) fn events_60s(&self, now_ms: u64) -> u64 {
        let last = now_ms / COARSE_MS;
        self.coarse
            .events((last + 1).saturating_sub(COARSE_BUCKETS as u64), last)
    }

    /// Applies one event; `Ok(true)` when it opened a new coarse bucket of this tenant
    /// (the heat map then reconsiders the tenant's sketch: once per tenant per second).
    pub(super) fn apply(
        &mut self,
        config: &HeatConfig,
        shared: &mut SharedSketch,
        event: &AccessEventRef<'_>,
        watermark_ms: u64,
    ) -> Result<bool, ApplyError> {
        let ts = event.ts_ms;
        let full_tops = self.coarse.full_tops();
        let Some(coarse) = self.coarse.slot(ts / COARSE_MS, watermark_ms / COARSE_MS) else {
            return Err(ApplyError::TooOld);
        };
        let opened = coarse.events == 0;
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
        let mut columns = EventColumns {
            hash,
            shared_hash: shared_hash(self.tenant_hash, hash),
            own: None,
            shared: None,
        };
        let shared_coarse = match coarse.sketch {
            Some(_) => None,
            None => shared.coarse.slot(ts / COARSE_MS, watermark_ms / COARSE_MS),
        };
        columns.push(coarse, shared_coarse, &tally);

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
                    .get_or_insert_with(|| {
                        if full_tops {
                            new_top(config.region_top_k, REGION_TOP_SKETCH)
                        } else {
                            new_small_top()
                        }
                    })
                    .push(top_key.clone());
            }
            coarse
                .top
                .get_or_insert_with(|| {
                    if full_tops {
                        new_top(config.top_k, config.top_sketch())
                    } else {
                        new_small_top()
                    }
                })
                .push(top_key);
            if Arc::strong_count(&self.spare_key) > 1 {
                self.spare_key = Arc::default();
            }
        }

        if let Some(fine) = self.fine.slot(ts / FINE_MS, watermark_ms / FINE_MS) {
            let shared_fine = match fine.sketch {
                Some(_) => None,
                None => shared.fine.slot(ts / FINE_MS, watermark_ms / FINE_MS),
            };
            columns.push(fine, shared_fine, &tally);
        }
        self.events += 1;
        self.last_event_ms = self.last_event_ms.max(ts);
        Ok(opened)
    }

    /// The cell of a key in one bucket: from the bucket's own sketch, or from the
    /// shared ring's bucket of the same number.
    fn cell(
        &self,
        bucket: &Bucket,
        shared_ring: &Ring,
        hash: u64,
        own: &mut Option<Columns>,
        shared: &mut Option<Columns>,
    ) -> Option<Cell> {
        match &bucket.sketch {
            Some(sketch) => {
                let columns = own.get_or_insert_with(|| sketch.columns(hash));
                Some(sketch.get(columns))
            }
            None => {
                let other = shared_ring.get(bucket.index?)?;
                let sketch = other.sketch.as_ref()?;
                let columns = shared
                    .get_or_insert_with(|| sketch.columns(shared_hash(self.tenant_hash, hash)));
                Some(sketch.get(columns))
            }
        }
    }

    /// Sum of a key's cells over the `n` buckets of `ring` ending at `end_ms`.
    /// Counts per outcome, and the bitsets of regions that missed and that asked.
    fn sum(
        &self,
        ring: &Ring,
        shared_ring: &Ring,
        hash: u64,
        end_ms: u64,
        n: u64,
    ) -> ([u64; OUTCOMES], u64, u64) {
        let mut counts = [0u64; OUTCOMES];
        let (mut missed, mut asked) = (0u64, 0u64);
        let (mut own, mut shared) = (None, None);
        for bucket in ring.last_n(end_ms, n) {
            let Some(cell) = self.cell(bucket, shared_ring, hash, &mut own, &mut shared) else {
                continue;
            };
            for (c, v) in counts.iter_mut().zip(cell.0) {
                *c += u64::from(v);
            }
            missed |= cell.1;
            asked |= cell.2;
        }
        (counts, missed, asked)
    }

    fn window_sum(
        &self,
        shared: &SharedSketch,
        hash: u64,
        window: Window,
        end_ms: u64,
    ) -> ([u64; OUTCOMES], u64, u64) {
        if window.is_fine() {
            self.sum(
                &self.fine,
                &shared.fine,
                hash,
                end_ms,
                window.millis() / FINE_MS,
            )
        } else {
            self.sum(
                &self.coarse,
                &shared.coarse,
                hash,
                end_ms,
                window.millis() / COARSE_MS,
            )
        }
    }

    /// The additive error bound, in events, of an estimate over `window` ending at
    /// `end_ms`: per bucket, the own sketch's ε times the tenant's events in it, or
    /// the shared sketch's ε times the whole shared stream's events in it.
    pub(super) fn error_bound_events(
        &self,
        config: &HeatConfig,
        shared: &SharedSketch,
        window: Window,
        end_ms: u64,
    ) -> u64 {
        let (ring, shared_ring, width) = if window.is_fine() {
            (&self.fine, &shared.fine, FINE_MS)
        } else {
            (&self.coarse, &shared.coarse, COARSE_MS)
        };
        let mut bound = 0.0;
        for bucket in ring.last_n(end_ms, window.millis() / width) {
            bound += match &bucket.sketch {
                Some(_) => config.error_bound() * bucket.events as f64,
                None => {
                    let n = bucket
                        .index
                        .and_then(|i| shared_ring.get(i))
                        .map_or(0, |b| b.events);
                    config.shared_error_bound() * n as f64
                }
            };
        }
        debug_assert_eq!(ring.width_ms(), width);
        bound.ceil() as u64
    }

    fn region_names(&self, bits: u64) -> Vec<RegionId> {
        self.regions
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, r)| r.clone())
            .collect()
    }

    pub(super) fn window_stats(
        &self,
        shared: &SharedSketch,
        hash: u64,
        window: Window,
        now_ms: u64,
    ) -> WindowStats {
        let (counts, missed, asked) = self.window_sum(shared, hash, window, now_ms);
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
    pub(super) fn demand(
        &self,
        shared: &SharedSketch,
        hash: u64,
        window: Window,
        end_ms: u64,
    ) -> u64 {
        OutcomeCounts::from_array(self.window_sum(shared, hash, window, end_ms).0).demand()
    }

    /// Velocity (demand) change between the window ending now and the one before it.
    fn acceleration(&self, shared: &SharedSketch, hash: u64, window: Window, now_ms: u64) -> f64 {
        let now = self.demand(shared, hash, window, now_ms);
        let before = match now_ms.checked_sub(window.millis()) {
            Some(end) => self.demand(shared, hash, window, end),
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

    pub(super) fn stats(
        &self,
        shared: &SharedSketch,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> KeyStats {
        let hash = key_hash(key.as_str());
        let windows: Vec<WindowStats> = Window::ALL
            .iter()
            .map(|w| self.window_stats(shared, hash, *w, now_ms))
            .collect();
        let acceleration_1s = self.acceleration(shared, hash, Window::S1, now_ms);
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
            acceleration_200ms: self.acceleration(shared, hash, Window::Ms200, now_ms),
            acceleration_1s,
            trend,
            regions: self.region_breakdown(counts.get(&hash)),
        }
    }

    pub(super) fn hot_keys(
        &self,
        shared: &SharedSketch,
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
                    None => self.demand(shared, hash, window, now_ms),
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
                let v = |w| self.window_stats(shared, hash, w, now_ms);
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
                    acceleration: self.acceleration(shared, hash, Window::S1, now_ms),
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
    /// Whether the tenant's new counts go to its own sketches (else the shared one).
    pub fn has_own_sketch(&self) -> bool {
        self.is_own()
    }

    /// Regions seen, in order of first appearance.
    pub fn regions(&self) -> &[RegionId] {
        &self.regions
    }

    /// Events applied.
    pub fn events(&self) -> u64 {
        self.events
    }
}
