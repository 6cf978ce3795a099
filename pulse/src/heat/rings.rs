//! Time rings: a fixed number of buckets of a fixed width in event time, each with
//! its sketch (and, in the coarse ring, its Top-Ks). A slot is recycled when a newer
//! bucket needs it; an event older than the ring is refused.

use serde::{Deserialize, Serialize};

use super::HeatConfig;
use super::sketch::Sketch;
use super::top::{Tracker, new_top};

#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Bucket {
    /// The bucket number (`ts_ms / width`) this slot holds, if any.
    pub(super) index: Option<u64>,
    pub(super) events: u64,
    pub(super) sketch: Sketch,
    /// Coarse buckets only: the tenant's top keys.
    pub(super) top: Option<Tracker>,
    /// Coarse buckets only: top keys per region (by region number), made on first use.
    pub(super) region_tops: Vec<Option<Tracker>>,
}

#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Ring {
    width_ms: u64,
    buckets: Vec<Bucket>,
}

impl Ring {
    pub(super) fn new(config: &HeatConfig, width_ms: u64, len: usize, with_tops: bool) -> Self {
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
    pub(super) fn slot(&mut self, index: u64, newest: u64) -> Option<&mut Bucket> {
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
    pub(super) fn range(&self, first: u64, last: u64) -> impl Iterator<Item = &Bucket> {
        self.buckets
            .iter()
            .filter(move |b| b.index.is_some_and(|i| i >= first && i <= last))
    }

    /// The `n` buckets ending with the one holding `end_ms`.
    pub(super) fn last_n(&self, end_ms: u64, n: u64) -> impl Iterator<Item = &Bucket> {
        let last = end_ms / self.width_ms;
        self.range((last + 1).saturating_sub(n), last)
    }

    pub(super) fn bytes(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| {
                let tops = b.top.iter().chain(b.region_tops.iter().flatten()).count();
                std::mem::size_of::<Bucket>() + tops * 512
            })
            .sum()
    }
}
