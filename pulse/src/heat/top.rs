//! Top-K trackers of keys, the heat map's candidates: one per coarse bucket for the
//! whole tenant and a smaller one per region.
//!
//! A tenant with its own sketches gets streaming_algorithms' `Top` (a map, an ordered
//! list and a small sketch of its own: about 10 KiB per tracker). A tenant in the shared
//! sketch gets a [`SMALL_TOP_K`]-entry Space-Saving list instead (a few hundred bytes):
//! ten thousand small tenants must not cost ten thousand full trackers per second.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streaming_algorithms::Top;

pub(super) const TOP_WIDTH: usize = 256; // tolerance 2/256
pub(super) const TOP_DEPTH: usize = 4; // probability 1 - 2^-4
pub(super) const REGION_TOP_SKETCH: (usize, usize) = (64, 2);

/// Entries of a small tenant's tracker (Space-Saving: a key outside the list replaces
/// the smallest entry and inherits its count plus one, so a count is never below the
/// truth and the top keys of a skewed stream stay in).
pub(super) const SMALL_TOP_K: usize = 8;

/// Bytes a tracked key is assumed to hold (its `Arc<String>`): the memory estimate
/// does not walk every tracker's keys.
const ASSUMED_KEY_BYTES: usize = 48;

pub(super) fn new_top(k: usize, dims: (usize, usize)) -> Tracker {
    Tracker::new(k, dims)
}

pub(super) fn new_small_top() -> Tracker {
    Tracker {
        top: Kind::Small(Vec::new()),
        k: SMALL_TOP_K,
        dims: (0, 0),
    }
}

#[derive(Clone)]
enum Kind {
    Full(Box<Top<TopKey, usize>>),
    Small(Vec<(TopKey, usize)>),
}

/// A Top-K of keys. Checkpointed as its entries (the `Top`'s hash map has struct
/// keys, which JSON cannot hold); restoring re-pushes them, so the tracked counts
/// survive and the small sketch for untracked keys starts empty.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "TrackerRepr", from = "TrackerRepr")]
pub(super) struct Tracker {
    top: Kind,
    k: usize,
    dims: (usize, usize),
}

#[derive(Serialize, Deserialize)]
struct TrackerRepr {
    k: usize,
    width: usize,
    depth: usize,
    entries: Vec<(TopKey, usize)>,
    /// A small tenant's Space-Saving list rather than a `Top`.
    #[serde(default)]
    small: bool,
}

impl Tracker {
    fn new(k: usize, (width, depth): (usize, usize)) -> Self {
        let tolerance = 2.0 / width as f64;
        let probability = 1.0 - 0.5_f64.powi(depth as i32);
        Tracker {
            top: Kind::Full(Box::new(Top::new(k, probability, tolerance, ()))),
            k,
            dims: (width, depth),
        }
    }

    pub(super) fn push(&mut self, key: TopKey) {
        match &mut self.top {
            Kind::Full(top) => top.push(key, &1usize),
            Kind::Small(list) => {
                if let Some(entry) = list.iter_mut().find(|(k, _)| *k == key) {
                    entry.1 += 1;
                } else if list.len() < self.k {
                    list.push((key, 1));
                } else if let Some(smallest) = list.iter_mut().min_by_key(|(_, c)| *c) {
                    *smallest = (key, smallest.1 + 1);
                }
            }
        }
    }

    pub(super) fn clear(&mut self) {
        match &mut self.top {
            Kind::Full(top) => top.clear(),
            Kind::Small(list) => list.clear(),
        }
    }

    pub(super) fn is_small(&self) -> bool {
        matches!(self.top, Kind::Small(_))
    }

    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (&TopKey, &usize)> + '_> {
        match &self.top {
            Kind::Full(top) => Box::new(top.iter()),
            Kind::Small(list) => Box::new(list.iter().map(|(k, c)| (k, c))),
        }
    }

    /// Approximate bytes held (for the memory budget), without walking the entries:
    /// a full tracker is counted as if full, keys at [`ASSUMED_KEY_BYTES`].
    pub(super) fn bytes(&self) -> usize {
        let entry = 64 + ASSUMED_KEY_BYTES;
        match &self.top {
            Kind::Full(_) => {
                std::mem::size_of::<Top<TopKey, usize>>()
                    + self.dims.0 * self.dims.1 * std::mem::size_of::<usize>()
                    + self.k * entry
            }
            Kind::Small(list) => list.capacity() * (std::mem::size_of::<(TopKey, usize)>() + entry),
        }
    }
}

impl From<Tracker> for TrackerRepr {
    fn from(t: Tracker) -> Self {
        TrackerRepr {
            k: t.k,
            width: t.dims.0,
            depth: t.dims.1,
            entries: t.iter().map(|(k, c)| (k.clone(), *c)).collect(),
            small: t.is_small(),
        }
    }
}

impl From<TrackerRepr> for Tracker {
    fn from(r: TrackerRepr) -> Self {
        if r.small {
            let mut entries = r.entries;
            entries.truncate(SMALL_TOP_K);
            return Tracker {
                top: Kind::Small(entries),
                k: SMALL_TOP_K,
                dims: (0, 0),
            };
        }
        // Bounded whatever the file says: validate() caps k, and the dims are ours.
        let mut t = Tracker::new(
            r.k.clamp(1, 10_000),
            (r.width.clamp(2, 1 << 16), r.depth.clamp(1, 16)),
        );
        if let Kind::Full(top) = &mut t.top {
            for (key, count) in r.entries.into_iter().take(t.k) {
                top.push(key, &count);
            }
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

    /// A small tracker keeps the heavy keys of a skewed stream, never counts below the
    /// truth, stays at SMALL_TOP_K entries, and survives its checkpoint form.
    #[test]
    fn a_small_tracker_keeps_the_heavy_keys_within_its_size() {
        let mut t = new_small_top();
        for i in 0..1_000usize {
            // "/hot" every other event, then "/warm" every tenth; the rest all distinct.
            let text = if i % 2 == 0 {
                "/hot".to_owned()
            } else if i % 10 == 1 {
                "/warm".to_owned()
            } else {
                format!("/cold/{i}")
            };
            t.push(key(&text));
        }
        let got = entries(&t);
        assert!(got.len() <= SMALL_TOP_K);
        let count = |k: &str| got.iter().find(|(key, _)| key == k).map(|e| e.1);
        assert!(count("/hot").unwrap() >= 500, "{got:?}");
        assert!(count("/warm").unwrap() >= 100, "{got:?}");
        let back: Tracker = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert!(back.is_small());
        assert_eq!(entries(&back), got);
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
