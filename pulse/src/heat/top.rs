//! Top-K trackers of keys (streaming_algorithms' `Top`), the heat map's candidates:
//! one per coarse bucket for the whole tenant and a smaller one per region.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streaming_algorithms::Top;

pub(super) const TOP_WIDTH: usize = 256; // tolerance 2/256
pub(super) const TOP_DEPTH: usize = 4; // probability 1 - 2^-4
pub(super) const REGION_TOP_SKETCH: (usize, usize) = (64, 2);

pub(super) fn new_top(k: usize, dims: (usize, usize)) -> Tracker {
    Tracker::new(k, dims)
}

/// A Top-K of keys. Checkpointed as its entries (the `Top`'s hash map has struct
/// keys, which JSON cannot hold); restoring re-pushes them, so the tracked counts
/// survive and the small sketch for untracked keys starts empty.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "TrackerRepr", from = "TrackerRepr")]
pub(super) struct Tracker {
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

    pub(super) fn push(&mut self, key: TopKey) {
        self.top.push(key, &1usize);
    }

    pub(super) fn clear(&mut self) {
        self.top.clear();
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&TopKey, &usize)> {
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

/// A key in a Top-K: hashed once, compared by hash first.
///
/// The text is an `Arc<String>` so one buffer per tenant can be refilled for each
/// event and handed to the trackers; only when a tracker keeps it (the key entered a
/// Top-K) does the tenant allocate a new buffer. See `TenantHeat::apply`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TopKey {
    pub(super) hash: u64,
    pub(super) key: Arc<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> TopKey {
        TopKey {
            hash: text.len() as u64,
            key: Arc::new(text.to_owned()),
        }
    }

    fn entries(t: &Tracker) -> Vec<(String, usize)> {
        let mut out: Vec<_> = t.iter().map(|(k, c)| (k.key.to_string(), *c)).collect();
        out.sort();
        out
    }

    /// Checkpointed as its entries, a tracker comes back with the same keys and counts.
    #[test]
    fn a_tracker_survives_its_checkpoint_form() {
        let mut t = new_top(4, (TOP_WIDTH, TOP_DEPTH));
        for (text, n) in [("/a", 5), ("/bb", 3), ("/ccc", 1)] {
            for _ in 0..n {
                t.push(key(text));
            }
        }
        let back: Tracker = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(entries(&back), entries(&t));
        assert_eq!(
            entries(&back),
            [("/a".into(), 5), ("/bb".into(), 3), ("/ccc".into(), 1)]
        );
    }

    /// Whatever a checkpoint file says, a restored tracker stays within the bounds
    /// `HeatConfig::validate` allows.
    #[test]
    fn a_hostile_checkpoint_cannot_make_a_huge_tracker() {
        let entries: Vec<_> = (0..20_000u64)
            .map(|i| serde_json::json!([{ "hash": i, "key": format!("/k/{i}") }, 1]))
            .collect();
        let repr = serde_json::json!({
            "k": 1_000_000_000u64, "width": 1u64 << 40, "depth": 1_000, "entries": entries,
        });
        let t: Tracker = serde_json::from_value(repr).unwrap();
        assert_eq!(t.k, 10_000);
        assert_eq!(t.dims, (1 << 16, 16));
        assert!(t.iter().count() <= 10_000);
    }
}
