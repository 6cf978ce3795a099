//! What one client connection did, as its own task and its requests record it, and
//! how to tell it to close: the state admission (eviction of unproven connections)
//! and supervision (the sweeper's timeouts) judge a connection by.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use futures::task::AtomicWaker;

/// Run on.
pub(super) const RUN: u8 = 0;
/// Close gracefully (idle, or the listener shuts down).
pub(super) const CLOSE: u8 = 1;
/// Drop the connection now.
pub(super) const ABORT: u8 = 2;

/// What a connection did, as its own task and its requests record it, for the
/// sweeper (`supervise`) and for admission to judge; and how to tell it to close.
/// Counters only grow (`bodies_owed` aside).
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Reads that returned bytes.
    pub(crate) reads: AtomicU64,
    /// Writes that took bytes.
    pub(crate) writes: AtomicU64,
    /// The last write found the socket full.
    pub(crate) write_blocked: AtomicBool,
    /// Requests handed to the service: 0 until the first request head is complete
    /// (the connection is *unproven* until then).
    pub(crate) started: AtomicU64,
    /// Requests whose response body is done (or dropped).
    pub(crate) finished: AtomicU64,
    /// The connection speaks HTTP/2: bytes between requests are frames (pings,
    /// window updates), not a request head on its way.
    pub(crate) h2: AtomicBool,
    /// HTTP/2 response bodies ready for the client to take (their last poll gave
    /// data, or they were never polled) that it has not taken: a stream's
    /// flow-control window holds them up, which no socket write shows.
    pub(crate) bodies_owed: AtomicUsize,
    /// Polls of HTTP/2 response bodies: the client took data (or made room for it).
    /// Written from the streams' tasks, so read-modify-write.
    pub(crate) body_polls: AtomicU64,
    /// [`RUN`], [`CLOSE`] or [`ABORT`]; only ever raised.
    pub(crate) signal: AtomicU8,
    /// The connection's task, woken when told to close.
    pub(crate) waker: AtomicWaker,
}

impl Activity {
    /// Tells the connection to close ([`CLOSE`]) or to drop ([`ABORT`]).
    pub(crate) fn tell(&self, signal: u8) {
        self.signal.fetch_max(signal, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Bumps a counter only this connection's task writes: no read-modify-write.
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(super) fn proven_or_closing(&self) -> bool {
        self.started.load(Ordering::Relaxed) > 0 || self.signal.load(Ordering::Relaxed) >= ABORT
    }
}
