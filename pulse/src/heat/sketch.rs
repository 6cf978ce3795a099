//! The heat map's Count-Min sketch: cells that count each [`Outcome`] and carry the
//! bitsets of regions that missed and that asked, updated conservatively; and the
//! stable key hash its columns derive from.

use models::Outcome;
use serde::{Deserialize, Serialize};

#[cfg(test)]
use super::HeatConfig;

/// Counters per cell: one per outcome the heat map counts, every one but
/// `prefetch_cached` (an acknowledgement, never applied: `HeatMap::apply_ref`).
pub(super) const OUTCOMES: usize = Outcome::ALL.len() - 1;

/// One sketch cell: a count per outcome, the regions that reported a miss, and the
/// regions that asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Cell(pub(super) [u32; OUTCOMES], pub(super) u64, pub(super) u64);

/// What one event adds to a cell.
pub(super) struct Tally {
    pub(super) outcome: usize,
    /// The region's bit when the outcome is miss-like, else 0.
    pub(super) miss_bit: u64,
    /// The region's bit.
    pub(super) region_bit: u64,
}

/// Most rows a sketch may have ([`super::HeatConfig::validate`] caps the depth at 16).
const MAX_DEPTH: usize = 16;

/// Where one key lands in a sketch: one cell index per row. Computed once per event
/// and shared by the fine and the coarse sketch (they have the same dimensions).
pub(super) struct Columns {
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
pub(super) struct Sketch {
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
    #[cfg(test)]
    pub(super) fn new(config: &HeatConfig) -> Self {
        Self::with_dims(config.width(), config.depth())
    }

    /// An empty sketch of `depth` rows of `width` cells (a power of two).
    pub(super) fn with_dims(width: usize, depth: usize) -> Self {
        let depth = depth.clamp(1, MAX_DEPTH);
        Sketch {
            width,
            depth,
            cells: vec![Cell::default(); width * depth],
        }
    }

    /// (width, depth).
    pub(super) fn dims(&self) -> (usize, usize) {
        (self.width, self.depth)
    }

    /// Bytes of the cells.
    pub(super) fn bytes(&self) -> usize {
        self.cells.len() * std::mem::size_of::<Cell>()
    }

    pub(super) fn columns(&self, hash: u64) -> Columns {
        Columns::new(hash, self.width, self.depth)
    }

    /// Adds one event at `columns` (from a sketch of the same dimensions).
    pub(super) fn push(&mut self, columns: &Columns, tally: &Tally) {
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
    pub(super) fn get(&self, columns: &Columns) -> Cell {
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

    pub(super) fn clear(&mut self) {
        self.cells.fill(Cell::default());
    }
}

pub(super) fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Hit => 0,
        Outcome::Miss => 1,
        Outcome::Stale => 2,
        Outcome::Collapsed => 3,
        Outcome::PrefetchFill => 4,
        Outcome::PrefetchUseful => 5,
        Outcome::PrefetchCached => unreachable!("prefetch_cached is never applied to the heat map"),
    }
}

/// A stable 64-bit hash of a key (FNV-1a with a final mix). Sketch positions derive
/// from it, so it must not change between builds: checkpoints depend on it.
pub(super) fn key_hash(key: &str) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(outcome: Outcome) -> Tally {
        Tally {
            outcome: outcome_index(outcome),
            miss_bit: 0,
            region_bit: 1,
        }
    }

    /// Checkpoints hold cells at positions derived from this hash: a change would
    /// silently scatter every restored count (see `CHECKPOINT_VERSION`).
    #[test]
    fn key_hash_does_not_change_between_builds() {
        assert_eq!(key_hash("/img/logo.png"), 0x3226_cc96_de82_2775);
        assert_eq!(key_hash(""), 0xf52a_15e9_a9b5_e89b);
    }

    /// A small sketch (many collisions) still never reports less than the truth,
    /// per outcome, under conservative update.
    #[test]
    fn conservative_update_never_underestimates() {
        let config = HeatConfig {
            error: 0.05,
            confidence: 0.9,
            ..HeatConfig::default()
        };
        let mut sketch = Sketch::new(&config);
        let outcomes = [Outcome::Hit, Outcome::Miss];
        for k in 0..300u64 {
            let columns = sketch.columns(key_hash(&format!("/k/{k}")));
            for i in 0..k % 17 {
                sketch.push(&columns, &tally(outcomes[(i % 2) as usize]));
            }
        }
        for k in 0..300u64 {
            let cell = sketch.get(&sketch.columns(key_hash(&format!("/k/{k}"))));
            let n = k % 17;
            assert!(
                u64::from(cell.0[outcome_index(Outcome::Hit)]) >= n.div_ceil(2),
                "/k/{k}"
            );
            assert!(
                u64::from(cell.0[outcome_index(Outcome::Miss)]) >= n / 2,
                "/k/{k}"
            );
        }
    }

    /// A checkpoint is read back into indexing code: a sketch whose cells do not fill
    /// its rows, or whose width is not a power of two, is refused.
    #[test]
    fn a_checkpointed_sketch_of_the_wrong_shape_is_refused() {
        let cell = serde_json::to_value(Cell::default()).unwrap();
        let sketch = |width: usize, depth: usize, cells: usize| serde_json::json!({ "width": width, "depth": depth, "cells": vec![cell.clone(); cells] });
        assert!(serde_json::from_value::<Sketch>(sketch(4, 2, 8)).is_ok());
        for (width, depth, cells) in [(4, 2, 7), (3, 2, 6), (4, 0, 0), (4, 17, 68)] {
            assert!(
                serde_json::from_value::<Sketch>(sketch(width, depth, cells)).is_err(),
                "{width} x {depth} with {cells} cells"
            );
        }
    }
}
