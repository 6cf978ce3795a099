//! The heat map: per tenant, a sliding window of time-bucketed Count-Min sketches
//! and Top-K trackers, fed one [`AccessEvent`] at a time and queried by window.
//!
//! Time is *event* time: a bucket is chosen by `AccessEvent::ts_ms`, and "now" is
//! the newest event time seen (the watermark) unless a query passes one. Replaying a
//! recorded trace therefore gives the same answers as the live stream did.
//!
//! # Layout of one tenant
//! - a *fine* ring of [`FINE_BUCKETS`] buckets of [`FINE_MS`] ms (the last 2 s), and
//! - a *coarse* ring of [`COARSE_BUCKETS`] buckets of [`COARSE_MS`] ms (the last 60 s).
//!
//! Every bucket holds one Count-Min sketch whose cell counts each [`Outcome`]
//! separately and carries a bitset of the regions that reported a miss; a window
//! query sums the newest buckets. Coarse buckets also hold a Top-K of keys for the
//! whole tenant and a smaller Top-K per region: their union is the candidate set of
//! the heat map, ranked by the sketch estimates.
//!
//! # Error bound
//! With `error = ε` and `confidence = 1 − δ`, a sketch has `w = 2^⌈log2(2/ε)⌉`
//! columns and `d = ⌊log2(1/δ)⌋` rows. An estimate is never below the true count, and
//! exceeds it by more than `(2/w)·N` (N = events of the tenant in the window) with
//! probability at most `2^−d`. [`HeatConfig::error_bound`] gives `2/w`.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use models::{AccessEvent, AccessEventRef, CacheKey, Outcome, RegionId, TenantId};
use serde::{Deserialize, Serialize};
use streaming_algorithms::Top;
use utoipa::ToSchema;

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

const OUTCOMES: usize = Outcome::ALL.len();

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
    pub fn millis(self) -> u64 {
        match self {
            Window::Ms200 => 200,
            Window::S1 => 1_000,
            Window::S10 => 10_000,
            Window::S60 => 60_000,
        }
    }

    fn seconds(self) -> f64 {
        self.millis() as f64 / 1_000.0
    }

    /// Short windows are answered from the fine ring, long ones from the coarse ring.
    fn is_fine(self) -> bool {
        self.millis() <= FINE_MS * FINE_BUCKETS as u64 / 2
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

const TOP_WIDTH: usize = 256; // tolerance 2/256
const TOP_DEPTH: usize = 4; // probability 1 - 2^-4
const REGION_TOP_SKETCH: (usize, usize) = (64, 2);

fn new_top(k: usize, dims: (usize, usize)) -> Tracker {
    Tracker::new(k, dims)
}

/// A Top-K of keys. Checkpointed as its entries (the `Top`'s hash map has struct
/// keys, which JSON cannot hold); restoring re-pushes them, so the tracked counts
/// survive and the small sketch for untracked keys starts empty.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "TrackerRepr", from = "TrackerRepr")]
struct Tracker {
    top: Top<TopKey, usize>,
    k: usize,
    dims: (usize, usize),
}

#[derive(Serialize, Deserialize)]
struct TrackerRepr {
    k: usize,
    width: usize,
    depth: usize,
    entries: Vec<(TopKey, usize)>,
}

impl Tracker {
    fn new(k: usize, (width, depth): (usize, usize)) -> Self {
        let tolerance = 2.0 / width as f64;
        let probability = 1.0 - 0.5_f64.powi(depth as i32);
        Tracker {
            top: Top::new(k, probability, tolerance, ()),
            k,
            dims: (width, depth),
        }
    }

    fn push(&mut self, key: TopKey) {
        self.top.push(key, &1usize);
    }

    fn clear(&mut self) {
        self.top.clear();
    }

    fn iter(&self) -> impl Iterator<Item = (&TopKey, &usize)> {
        self.top.iter()
    }
}

impl From<Tracker> for TrackerRepr {
    fn from(t: Tracker) -> Self {
        TrackerRepr {
            k: t.k,
            width: t.dims.0,
            depth: t.dims.1,
            entries: t.top.iter().map(|(k, c)| (k.clone(), *c)).collect(),
        }
    }
}

impl From<TrackerRepr> for Tracker {
    fn from(r: TrackerRepr) -> Self {
        // Bounded whatever the file says: validate() caps k, and the dims are ours.
        let mut t = Tracker::new(
            r.k.clamp(1, 10_000),
            (r.width.clamp(2, 1 << 16), r.depth.clamp(1, 16)),
        );
        for (key, count) in r.entries.into_iter().take(t.k) {
            t.top.push(key, &count);
        }
        t
    }
}

/// One sketch cell: a count per outcome, the regions that reported a miss, and the
/// regions that asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Cell([u32; OUTCOMES], u64, u64);

/// What one event adds to a cell.
struct Tally {
    outcome: usize,
    /// The region's bit when the outcome is miss-like, else 0.
    miss_bit: u64,
    /// The region's bit.
    region_bit: u64,
}

/// Most rows a sketch may have ([`HeatConfig::validate`] caps the depth at 16).
const MAX_DEPTH: usize = 16;

/// Where one key lands in a sketch: one cell index per row. Computed once per event
/// and shared by the fine and the coarse sketch (they have the same dimensions).
struct Columns {
    cells: [usize; MAX_DEPTH],
    depth: usize,
}

impl Columns {
    fn new(hash: u64, width: usize, depth: usize) -> Self {
        let mut cells = [0usize; MAX_DEPTH];
        let mask = (width - 1) as u64;
        for (row, cell) in cells.iter_mut().enumerate().take(depth) {
            // An independent column per row: the key hash mixed with a per-row odd
            // constant (splitmix64 finaliser). Must not change between builds:
            // checkpoints depend on it (see CHECKPOINT_VERSION).
            let mut h = hash ^ (row as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 30;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 27;
            h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^= h >> 31;
            *cell = row * width + (h & mask) as usize;
        }
        Columns { cells, depth }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.cells[..self.depth].iter().copied()
    }
}

/// A Count-Min sketch of [`Cell`]s with conservative update: `depth` rows of `width`
/// cells, stored row after row.
///
/// Why not streaming_algorithms' `CountMinSketch` here (the Top-K trackers still use
/// it): its `push` hashes the key again with XxHash for every row of every sketch
/// (twelve hash finalisations per event for the fine and the coarse sketch), and its
/// conservative update copies whole 40-byte cells to intersect and then union them.
/// That was a third of the per-event cost. Here the columns come from the key's
/// 64-bit hash once per event ([`Columns`]), and the update touches one counter per
/// row. The result is exactly the crate's conservative update for this cell (where
/// intersect is the element-wise minimum and AND, union the maximum and OR): the
/// event's outcome counter in each row becomes max(itself, minimum over the rows + 1),
/// the other counters cannot change, and the region bits are ORed in.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "SketchRepr")]
struct Sketch {
    width: usize,
    depth: usize,
    cells: Vec<Cell>,
}

#[derive(Deserialize)]
struct SketchRepr {
    width: usize,
    depth: usize,
    cells: Vec<Cell>,
}

impl TryFrom<SketchRepr> for Sketch {
    type Error = String;
    fn try_from(r: SketchRepr) -> Result<Self, String> {
        // A checkpoint is read back into indexing code: refuse what would panic.
        if !r.width.is_power_of_two()
            || !(1..=MAX_DEPTH).contains(&r.depth)
            || r.cells.len() != r.width.saturating_mul(r.depth)
        {
            return Err(format!(
                "sketch of {} cells is not {} x {}",
                r.cells.len(),
                r.depth,
                r.width
            ));
        }
        Ok(Sketch {
            width: r.width,
            depth: r.depth,
            cells: r.cells,
        })
    }
}

impl Sketch {
    fn new(config: &HeatConfig) -> Self {
        let (width, depth) = (config.width(), config.depth().min(MAX_DEPTH));
        Sketch {
            width,
            depth,
            cells: vec![Cell::default(); width * depth],
        }
    }

    fn columns(&self, hash: u64) -> Columns {
        Columns::new(hash, self.width, self.depth)
    }

    /// Adds one event at `columns` (from a sketch of the same dimensions).
    fn push(&mut self, columns: &Columns, tally: &Tally) {
        let o = tally.outcome;
        let lowest = columns
            .iter()
            .map(|i| self.cells[i].0[o])
            .min()
            .unwrap_or(0);
        let raised = lowest.saturating_add(1);
        for i in columns.iter() {
            let cell = &mut self.cells[i];
            cell.0[o] = cell.0[o].max(raised);
            cell.1 |= tally.miss_bit;
            cell.2 |= tally.region_bit;
        }
    }

    /// The estimate at `columns`: the minimum per outcome, the intersection of the
    /// region sets.
    fn get(&self, columns: &Columns) -> Cell {
        let mut cells = columns.iter().map(|i| self.cells[i]);
        let Some(mut acc) = cells.next() else {
            return Cell::default();
        };
        for cell in cells {
            for (a, b) in acc.0.iter_mut().zip(cell.0) {
                *a = (*a).min(b);
            }
            acc.1 &= cell.1;
            acc.2 &= cell.2;
        }
        acc
    }

    fn clear(&mut self) {
        self.cells.fill(Cell::default());
    }
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Hit => 0,
        Outcome::Miss => 1,
        Outcome::Stale => 2,
        Outcome::Collapsed => 3,
        Outcome::PrefetchFill => 4,
        Outcome::PrefetchUseful => 5,
    }
}

/// A stable 64-bit hash of a key (FNV-1a with a final mix). Sketch positions derive
/// from it, so it must not change between builds: checkpoints depend on it.
fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64 finaliser: FNV's low bits are weak.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// A key in a Top-K: hashed once, compared by hash first.
///
/// The text is an `Arc<String>` so one buffer per tenant can be refilled for each
/// event and handed to the trackers; only when a tracker keeps it (the key entered a
/// Top-K) does the tenant allocate a new buffer. See `TenantHeat::apply`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TopKey {
    hash: u64,
    key: Arc<String>,
}

impl Hash for TopKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for TopKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl Eq for TopKey {}

#[derive(Clone, Serialize, Deserialize)]
struct Bucket {
    /// The bucket number (`ts_ms / width`) this slot holds, if any.
    index: Option<u64>,
    events: u64,
    sketch: Sketch,
    /// Coarse buckets only: the tenant's top keys.
    top: Option<Tracker>,
    /// Coarse buckets only: top keys per region (by region number), made on first use.
    region_tops: Vec<Option<Tracker>>,
}

#[derive(Clone, Serialize, Deserialize)]
struct Ring {
    width_ms: u64,
    buckets: Vec<Bucket>,
}

impl Ring {
    fn new(config: &HeatConfig, width_ms: u64, len: usize, with_tops: bool) -> Self {
        let sketch = Sketch::new(config);
        let bucket = Bucket {
            index: None,
            events: 0,
            sketch,
            top: with_tops.then(|| new_top(config.top_k, config.top_sketch())),
            region_tops: Vec::new(),
        };
        Ring {
            width_ms,
            buckets: vec![bucket; len],
        }
    }

    /// The slot for bucket `index`, cleared if it held an older bucket; `None` when
    /// `index` has already left the ring (its slot holds a newer bucket or it is
    /// older than the ring behind `newest`).
    fn slot(&mut self, index: u64, newest: u64) -> Option<&mut Bucket> {
        let len = self.buckets.len() as u64;
        if index + len <= newest {
            return None;
        }
        let bucket = &mut self.buckets[(index % len) as usize];
        match bucket.index {
            Some(held) if held == index => {}
            Some(held) if held > index => return None,
            _ => {
                bucket.index = Some(index);
                bucket.events = 0;
                bucket.sketch.clear();
                if let Some(top) = &mut bucket.top {
                    top.clear();
                }
                for top in bucket.region_tops.iter_mut().flatten() {
                    top.clear();
                }
            }
        }
        Some(bucket)
    }

    /// Buckets with numbers in `first..=last` that the ring still holds.
    fn range(&self, first: u64, last: u64) -> impl Iterator<Item = &Bucket> {
        self.buckets
            .iter()
            .filter(move |b| b.index.is_some_and(|i| i >= first && i <= last))
    }

    /// The `n` buckets ending with the one holding `end_ms`.
    fn last_n(&self, end_ms: u64, n: u64) -> impl Iterator<Item = &Bucket> {
        let last = end_ms / self.width_ms;
        self.range((last + 1).saturating_sub(n), last)
    }

    fn bytes(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| {
                let tops = b.top.iter().chain(b.region_tops.iter().flatten()).count();
                std::mem::size_of::<Bucket>() + tops * 512
            })
            .sum()
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
    fn from_array(a: [u64; OUTCOMES]) -> Self {
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
        }
    }

    /// All outcomes together.
    pub fn total(&self) -> u64 {
        Outcome::ALL.iter().map(|o| self.get(*o)).sum()
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
    /// All outcomes.
    pub total: u64,
    /// Miss-like outcomes (miss, collapsed, stale).
    pub misses: u64,
    /// `total` per second.
    pub velocity: f64,
    /// `misses` per second.
    pub miss_velocity: f64,
    /// Regions that reported a miss-like outcome in the window.
    #[schema(value_type = Vec<String>)]
    pub miss_regions: Vec<RegionId>,
    /// Regions that asked for the key in the window, whatever the outcome.
    #[schema(value_type = Vec<String>)]
    pub regions: Vec<RegionId>,
}

/// Whether a key's demand is growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trend {
    /// The last second saw clearly more events than the one before.
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
    /// Events seen from it (from the per-region Top-K: a key outside a region's top
    /// counts 0 there).
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
    /// Change of velocity between the last 200 ms and the 200 ms before, events/s².
    pub acceleration_200ms: f64,
    /// Change of velocity between the last second and the second before, events/s².
    pub acceleration_1s: f64,
    /// The 1 s trend.
    pub trend: Trend,
    /// Per-region events over the last 60 s.
    pub regions: Vec<RegionCount>,
}

impl KeyStats {
    /// The stats of one window.
    pub fn window(&self, window: Window) -> &WindowStats {
        let i = Window::ALL.iter().position(|w| *w == window).unwrap_or(0);
        &self.windows[i]
    }
}

/// Velocities (events per second) of a key over each window.
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
    /// Events in the window: the whole tenant's (sketch estimate), or the region's
    /// (Top-K count) when the query named a region.
    pub count: u64,
    /// Miss-like events in the window, whole tenant.
    pub misses: u64,
    /// Whole-tenant velocity per window.
    pub velocities: Velocities,
    /// Whole-tenant acceleration over the last second, events/s².
    pub acceleration: f64,
    /// Regions that reported a miss in the last 200 ms.
    #[schema(value_type = Vec<String>)]
    pub miss_regions: Vec<RegionId>,
    /// Per-region events in the window (1 s granularity), largest first.
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
}

/// Why an event was not applied. Small and `Copy`: this is the per-message path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The event is older than the longest window behind the watermark.
    #[error("event is older than the 60 s window")]
    TooOld,
    /// The tenant is new and `max_tenants` are already tracked.
    #[error("tenant limit reached")]
    TenantLimit,
}

impl ApplyError {
    /// A short stable name for the metric label `reason`.
    pub fn reason(self) -> &'static str {
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

/// One tenant's windows.
#[derive(Clone, Serialize, Deserialize)]
pub struct TenantHeat {
    regions: Vec<RegionId>,
    events: u64,
    last_event_ms: u64,
    fine: Ring,
    coarse: Ring,
    /// The key text handed to the Top-K trackers, refilled per event (see `apply`).
    #[serde(skip)]
    spare_key: Arc<String>,
}

impl TenantHeat {
    fn new(config: &HeatConfig) -> Self {
        TenantHeat {
            regions: Vec::new(),
            events: 0,
            last_event_ms: 0,
            fine: Ring::new(config, FINE_MS, FINE_BUCKETS, false),
            coarse: Ring::new(config, COARSE_MS, COARSE_BUCKETS, true),
            spare_key: Arc::default(),
        }
    }

    fn apply(
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

    fn window_stats(&self, hash: u64, window: Window, now_ms: u64) -> WindowStats {
        let (counts, missed, asked) = self.window_sum(hash, window, now_ms);
        let counts = OutcomeCounts::from_array(counts);
        let total = counts.total();
        let misses = counts.misses();
        WindowStats {
            window,
            counts,
            total,
            misses,
            velocity: total as f64 / window.seconds(),
            miss_velocity: misses as f64 / window.seconds(),
            miss_regions: self.region_names(missed),
            regions: self.region_names(asked),
        }
    }

    /// Velocity change between the window ending now and the one before it.
    fn acceleration(&self, hash: u64, window: Window, now_ms: u64) -> f64 {
        let total = |end| -> u64 { self.window_sum(hash, window, end).0.iter().sum() };
        let now = total(now_ms);
        let before = match now_ms.checked_sub(window.millis()) {
            Some(end) => total(end),
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

    fn stats(&self, tenant: &TenantId, key: &CacheKey, now_ms: u64) -> KeyStats {
        let hash = key_hash(key.as_str());
        let windows: Vec<WindowStats> = Window::ALL
            .iter()
            .map(|w| self.window_stats(hash, *w, now_ms))
            .collect();
        let acceleration_1s = self.acceleration(hash, Window::S1, now_ms);
        let now_1s = windows[1].total as f64;
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

    fn hot_keys(
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
                    None => self.window_sum(hash, window, now_ms).0.iter().sum(),
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
    fn candidates(&self, now_ms: u64) -> Vec<CacheKey> {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use models::NodeId;
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
        assert_eq!(ApplyError::TenantLimit.reason(), "tenant_limit");
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
