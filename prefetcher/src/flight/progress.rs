//! What a flight has published ([`Progress`]: the head, the body's chunks, the
//! end) and, for a body that is not kept whole, how far each subscriber has read
//! ([`Readers`]), so the fill waits for the slowest instead of dropping what it has
//! not read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::Notify;

use super::{End, Head};

#[derive(Debug, Default)]
pub(super) struct Progress {
    pub(super) head: Option<Arc<Head>>,
    /// The body's chunks from the `first`th on (all of them unless a `window`).
    pub(super) chunks: VecDeque<Bytes>,
    pub(super) first: usize,
    /// Bytes in `chunks`.
    pub(super) held: u64,
    /// Set by [`FillPermit::share_window`](super::FillPermit::share_window): the
    /// most bytes `chunks` keep.
    pub(super) window: Option<u64>,
    pub(super) end: Option<End>,
}

impl Progress {
    /// Drops the oldest chunks past the window (the newest is always kept).
    pub(super) fn trim(&mut self) {
        let Some(window) = self.window else { return };
        while self.held > window && self.chunks.len() > 1 {
            if let Some(old) = self.chunks.pop_front() {
                self.held -= old.len() as u64;
                self.first += 1;
            }
        }
    }

    /// The bytes held that the reader at chunk `position` (not behind `first`)
    /// has not read yet.
    pub(super) fn unread(&self, position: usize) -> u64 {
        let skip = position.saturating_sub(self.first);
        self.chunks.iter().skip(skip).map(|c| c.len() as u64).sum()
    }
}

/// Where each subscriber of a flight is: the chunk it reads next.
#[derive(Debug, Default)]
pub(super) struct Readers {
    positions: Mutex<Vec<Weak<AtomicUsize>>>,
    advanced: Notify,
}

impl Readers {
    /// A new reader, at the first chunk.
    pub(super) fn join(&self) -> Arc<AtomicUsize> {
        let position = Arc::new(AtomicUsize::new(0));
        // Readers that left stay as dead entries until the flight ends: joining is
        // one push, whatever the size of the burst.
        let mut positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        positions.push(Arc::downgrade(&position));
        position
    }

    /// The position of the slowest reader still there and not behind `first` (one
    /// that fell behind the window is no longer waited for).
    pub(super) fn slowest(&self, first: usize) -> Option<usize> {
        let positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        positions
            .iter()
            .filter_map(Weak::upgrade)
            .map(|p| p.load(Ordering::Acquire))
            .filter(|p| *p >= first)
            .min()
    }

    /// A reader moved on or left.
    pub(super) fn advanced(&self) {
        self.advanced.notify_waiters();
    }

    /// Resolves at the next [`advanced`](Self::advanced) after this call.
    pub(super) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.advanced.notified()
    }
}
