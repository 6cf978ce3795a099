//! Time rings: a fixed number of buckets of a fixed width in event time, each with
//! its sketch (and, in the coarse ring, its Top-Ks). A slot is recycled when a newer
//! bucket needs it; an event older than the ring is refused.
//!
//! A ring allocates nothing until a bucket is first used, and a bucket takes the
//! ring's current *mode* when it is recycled: with its own sketch of `sketch_dims` or
//! none (its counts live in the heat map's shared sketch), with full Top-K trackers or
//! small ones. So promoting or demoting a tenant changes nothing already counted: each
//! bucket is read where it was written, and the old form leaves with the bucket.

use serde::{Deserialize, Serialize};

use super::sketch::Sketch;
use super::top::Tracker;

#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Bucket {
    /// The bucket number (`ts_ms / width`) this slot holds, if any.
    pub(super) index: Option<u64>,
    pub(super) events: u64,
    /// The bucket's own sketch; `None`: its counts are in the shared sketch.
    pub(super) sketch: Option<Sketch>,
    /// Coarse buckets only: the tenant's top keys, made on first use.
    pub(super) top: Option<Tracker>,
    /// Coarse buckets only: top keys per region (by region number), made on first use.
    pub(super) region_tops: Vec<Option<Tracker>>,
}

impl Bucket {
    fn empty() -> Self {
        Bucket {
            index: None,
            events: 0,
            sketch: None,
            top: None,
            region_tops: Vec::new(),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Ring {
    width_ms: u64,
    buckets: Vec<Bucket>,
    /// Recycled buckets get a sketch of (width, depth); `None`: no sketch of their own.
    sketch_dims: Option<(usize, usize)>,
    /// Recycled buckets get full Top-K trackers (else small ones).
    full_tops: bool,
}

impl Ring {
    pub(super) fn new(
        width_ms: u64,
        len: usize,
        sketch_dims: Option<(usize, usize)>,
        full_tops: bool,
    ) -> Self {
        Ring {
            width_ms,
            buckets: (0..len).map(|_| Bucket::empty()).collect(),
            sketch_dims,
            full_tops,
        }
    }

    /// Changes the form buckets take from their next recycling on.
    pub(super) fn set_mode(&mut self, sketch_dims: Option<(usize, usize)>, full_tops: bool) {
        self.sketch_dims = sketch_dims;
        self.full_tops = full_tops;
    }

    pub(super) fn full_tops(&self) -> bool {
        self.full_tops
    }

    pub(super) fn has_own_sketch(&self) -> bool {
        self.sketch_dims.is_some()
    }

    /// The slot for bucket `index`, cleared if it held an older bucket; `None` when
    /// `index` has already left the ring (its slot holds a newer bucket or it is
    /// older than the ring behind `newest`).
    pub(super) fn slot(&mut self, index: u64, newest: u64) -> Option<&mut Bucket> {
        let len = self.buckets.len() as u64;
        if index + len <= newest {
            return None;
        }
        let (dims, full_tops) = (self.sketch_dims, self.full_tops);
        let bucket = &mut self.buckets[(index % len) as usize];
        match bucket.index {
            Some(held) if held == index => {}
            Some(held) if held > index => return None,
            _ => {
                bucket.index = Some(index);
                bucket.events = 0;
                match (dims, &mut bucket.sketch) {
                    (Some(dims), Some(sketch)) if sketch.dims() == dims => sketch.clear(),
                    (Some((width, depth)), sketch) => {
                        *sketch = Some(Sketch::with_dims(width, depth));
                    }
                    (None, sketch) => *sketch = None,
                }
                // A tracker of the ring's kind is kept and cleared (its allocation is
                // reused every second); one of the other kind (the tenant was promoted
                // or demoted) is dropped and made again on first use.
                let keep = |t: &Tracker| t.is_small() != full_tops;
                match &mut bucket.top {
                    Some(top) if keep(top) => top.clear(),
                    top => *top = None,
                }
                for top in bucket.region_tops.iter_mut() {
                    match top {
                        Some(t) if keep(t) => t.clear(),
                        t => *t = None,
                    }
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

    /// The bucket holding number `index`, if the ring still holds it.
    pub(super) fn get(&self, index: u64) -> Option<&Bucket> {
        let len = self.buckets.len() as u64;
        let bucket = &self.buckets[(index % len) as usize];
        (bucket.index == Some(index)).then_some(bucket)
    }

    pub(super) fn width_ms(&self) -> u64 {
        self.width_ms
    }

    /// Events in the buckets numbered `first..=last`.
    pub(super) fn events(&self, first: u64, last: u64) -> u64 {
        self.range(first, last).map(|b| b.events).sum()
    }

    /// Bytes of the buckets' own sketches.
    pub(super) fn sketch_bytes(&self) -> usize {
        self.buckets
            .iter()
            .filter_map(|b| b.sketch.as_ref())
            .map(Sketch::bytes)
            .sum()
    }

    /// Approximate bytes held: the slots, the sketches, the trackers and their keys.
    pub(super) fn bytes(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| {
                std::mem::size_of::<Bucket>()
                    + b.sketch.as_ref().map_or(0, Sketch::bytes)
                    + b.top.as_ref().map_or(0, Tracker::bytes)
                    + b.region_tops.capacity() * std::mem::size_of::<Option<Tracker>>()
                    + b.region_tops
                        .iter()
                        .flatten()
                        .map(Tracker::bytes)
                        .sum::<usize>()
            })
            .sum()
    }
}
