//! What a fill holds of the body it streams: the chunks it will store, and small
//! chunks being coalesced. An origin decides how it cuts its body (one byte per
//! chunk, if it likes); what the fill publishes and keeps is cut by this node:
//! chunks below [`COALESCE_BYTES`] are copied into one buffer of that size, which
//! goes out when full or when the origin has nothing more ready, so a body costs
//! about its size, never a handle per origin chunk nor the origin read buffers
//! behind them.
//!
//! A body that grows past `cache.max_object_bytes` is no longer kept
//! ([`FillBody::stop_storing`]): what was held is dropped, and the chunks still
//! go to the subscribers.

use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::gauge::Gauge;

/// Chunks below this are coalesced; the buffer they are copied into has this size.
pub(super) const COALESCE_BYTES: usize = 16 * 1024;

/// The body of one fill: the chunks kept for the store, and the coalescing buffer;
/// what it holds is counted in a gauge (`prefetcher_fill_bytes_held`) until it is
/// dropped or handed to the store.
#[derive(Debug)]
pub(super) struct FillBody {
    pending: BytesMut,
    /// `None` once the body is not to be stored.
    kept: Option<Vec<Bytes>>,
    kept_bytes: u64,
    gauge: Gauge,
    /// What the gauge counts of this body.
    counted: i64,
}

impl FillBody {
    /// A body that is kept for the store when `store`, counted in `gauge`.
    pub(super) fn new(store: bool, gauge: Gauge) -> FillBody {
        FillBody {
            pending: BytesMut::new(),
            kept: store.then(Vec::new),
            kept_bytes: 0,
            gauge,
            counted: 0,
        }
    }

    /// Brings the gauge to what the body holds now.
    fn count(&mut self) {
        let held = (self.kept_bytes + self.pending.len() as u64) as i64;
        self.gauge.inc_by(held - self.counted);
        self.counted = held;
    }

    /// Whether the body is still kept for the store.
    pub(super) fn storing(&self) -> bool {
        self.kept.is_some()
    }

    /// Whether bytes wait in the coalescing buffer.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes one origin chunk: the chunk to publish now, if any (a large chunk as it
    /// came, after what was pending; or a full coalescing buffer).
    pub(super) fn push(&mut self, data: Bytes) -> Option<Bytes> {
        if self.pending.is_empty() && data.len() >= COALESCE_BYTES {
            let chunk = self.keep(data);
            self.count();
            return Some(chunk);
        }
        if self.pending.is_empty() && self.pending.capacity() < data.len() {
            // A fresh buffer of the coalescing size (the last one went out whole).
            self.pending = BytesMut::with_capacity(COALESCE_BYTES);
        }
        self.pending.extend_from_slice(&data);
        let full = (self.pending.len() >= COALESCE_BYTES).then(|| self.flush_now());
        self.count();
        full
    }

    /// What waits in the coalescing buffer, to publish now (the origin has nothing
    /// more ready, or the body ended).
    pub(super) fn flush(&mut self) -> Option<Bytes> {
        let chunk = (!self.pending.is_empty()).then(|| self.flush_now());
        self.count();
        chunk
    }

    fn flush_now(&mut self) -> Bytes {
        let chunk = self.pending.split().freeze();
        self.keep(chunk)
    }

    fn keep(&mut self, chunk: Bytes) -> Bytes {
        if let Some(kept) = &mut self.kept {
            self.kept_bytes += chunk.len() as u64;
            kept.push(chunk.clone());
        }
        chunk
    }

    /// The body is past what may be stored: drop what was kept, keep nothing more.
    pub(super) fn stop_storing(&mut self) {
        self.kept = None;
        self.kept_bytes = 0;
        self.count();
    }

    /// The bytes this fill holds: kept for the store, and pending.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> u64 {
        self.kept_bytes + self.pending.capacity() as u64
    }

    /// The kept chunks, as one body for the store (which accounts for it from now on).
    pub(super) fn into_stored(mut self) -> Bytes {
        let mut kept = self.kept.take().unwrap_or_default();
        if kept.len() == 1 {
            return kept.pop().unwrap_or_default();
        }
        let mut all = BytesMut::with_capacity(self.kept_bytes as usize);
        kept.iter().for_each(|c| all.extend_from_slice(c));
        all.freeze()
    }
}

impl Drop for FillBody {
    fn drop(&mut self) {
        self.gauge.dec_by(self.counted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body sent one byte per chunk: published and kept in chunks of the
    /// coalescing size, and what the fill holds is the body's size (plus one
    /// buffer), not a handle per byte.
    #[test]
    fn one_byte_chunks_are_coalesced_and_held_at_their_size() {
        let total = 100_000usize;
        let gauge = Gauge::default();
        let mut body = FillBody::new(true, gauge.clone());
        let mut published = Vec::new();
        for i in 0..total {
            published.extend(body.push(Bytes::from(vec![i as u8])));
            assert!(body.held_bytes() <= (i + 1 + COALESCE_BYTES) as u64);
        }
        published.extend(body.flush());
        assert_eq!(published.len(), total.div_ceil(COALESCE_BYTES));
        assert!(published.iter().all(|c| c.len() <= COALESCE_BYTES));
        assert!(body.held_bytes() <= (total + COALESCE_BYTES) as u64);
        assert_eq!(gauge.get(), total as i64, "counted while held");
        let stored = body.into_stored();
        assert_eq!(gauge.get(), 0, "the store accounts for it now");
        assert_eq!(stored.len(), total);
        assert!(stored.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    /// A large chunk goes out as it came (no copy), after what was pending.
    #[test]
    fn large_chunks_pass_as_they_came() {
        let mut body = FillBody::new(true, Gauge::default());
        assert_eq!(body.push(Bytes::from_static(b"ab")), None);
        let big = Bytes::from(vec![7u8; COALESCE_BYTES]);
        // Pending bytes first: the large chunk is copied behind them.
        let out = body.push(big.clone()).unwrap();
        assert_eq!(out.len(), COALESCE_BYTES + 2);
        let direct = body.push(big.clone()).unwrap();
        assert_eq!(direct.as_ptr(), big.as_ptr(), "not copied");
        assert_eq!(body.into_stored().len(), 2 * COALESCE_BYTES + 2);
    }

    /// Past the storage limit nothing is kept, and the chunks still go out.
    #[test]
    fn a_body_that_stops_storing_holds_only_its_buffer() {
        let gauge = Gauge::default();
        let mut body = FillBody::new(true, gauge.clone());
        let chunk = Bytes::from(vec![1u8; COALESCE_BYTES]);
        for _ in 0..8 {
            assert!(body.push(chunk.clone()).is_some());
        }
        assert_eq!(body.held_bytes(), 8 * COALESCE_BYTES as u64);
        body.stop_storing();
        assert!(!body.storing());
        for _ in 0..8 {
            assert!(body.push(chunk.clone()).is_some());
        }
        assert_eq!(body.push(Bytes::from_static(b"x")), None);
        assert!(body.held_bytes() <= COALESCE_BYTES as u64);
        assert_eq!(gauge.get(), 1, "the pending byte");
        assert_eq!(body.flush().unwrap(), Bytes::from_static(b"x"));
        drop(body);
        assert_eq!(gauge.get(), 0, "a dropped body is counted no more");
    }
}
