//! The origin fills one client connection and one client address lead: a request
//! that misses and starts a fill holds a [`LeadTicket`] until its response head, so
//! a client cannot make the origin work harder than the bounds of `[server]` allow
//! by opening streams for new keys and cancelling them (an HTTP/2 stream reset after
//! the node accepted it, which `h2`'s rapid-reset bound never sees).
//!
//! Invariants:
//! - A connection leads at most `max_fills_per_connection` fills at once, and the
//!   connections of one address (not exempt) at most `max_fills_per_address`; a
//!   request past either gets 429 and starts no fill (counted `connection_fills`,
//!   `address_fills`).
//! - Every ticket gives back what it took when dropped, whatever ends the request.
//! - A ticket dropped before its response head was *cancelled*. A connection whose
//!   cancelled fills pass `max_cancelled_fills_per_connection` and outnumber its
//!   answered ones leads no more fills and is told to close, gracefully (HTTP/2
//!   `GOAWAY`, its streams in flight finish), counted as `cancelled_fills` then and
//!   for each lead it is refused after. A
//!   browser that cancels some of what it asked for now and then is not such a
//!   connection; one that cancels everything it asks for is.
//!
//! (What the node does with a fill every client left is the fill's business: it is
//! dropped while it is not worth finishing, `crate::proxy`'s fill task.)
//!
//! Counters are atomics: a request that leads takes no lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::activity::{Activity, CLOSE};
use crate::config::ConnectionLimits;
use crate::metrics::ClientCounters;
use crate::status::ClientLimit;

/// The fills of one connection, and of its address.
pub(crate) struct ConnFills {
    max_per_connection: usize,
    max_per_address: usize,
    max_cancelled: u64,
    leading: AtomicUsize,
    answered: AtomicU64,
    cancelled: AtomicU64,
    /// Told to close for its cancelled fills: it leads no more.
    barred: AtomicBool,
    /// The address's fills in flight, shared by its connections; `None` when the
    /// address is exempt or the bound is off.
    address: Option<Arc<AtomicUsize>>,
    activity: Arc<Activity>,
    counters: ClientCounters,
}

impl std::fmt::Debug for ConnFills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnFills")
            .field("leading", &self.leading)
            .field("answered", &self.answered)
            .field("cancelled", &self.cancelled)
            .finish_non_exhaustive()
    }
}

impl ConnFills {
    /// The fills of the connection whose activity is `activity`, from the address
    /// whose count is `address`.
    pub(crate) fn new(
        limits: &ConnectionLimits,
        address: Option<Arc<AtomicUsize>>,
        activity: Arc<Activity>,
        counters: ClientCounters,
    ) -> ConnFills {
        ConnFills {
            max_per_connection: limits.max_fills_per_connection,
            max_per_address: limits.max_fills_per_address,
            max_cancelled: limits.max_cancelled_fills_per_connection,
            leading: AtomicUsize::new(0),
            answered: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            barred: AtomicBool::new(false),
            address: address.filter(|_| limits.max_fills_per_address > 0),
            activity,
            counters,
        }
    }

    /// A ticket to lead one more fill, or the limit (counted) that refuses it.
    pub(crate) fn try_lead(&self) -> Result<LeadTicket<'_>, ClientLimit> {
        let refuse = |limit| {
            self.counters.count(limit);
            Err(limit)
        };
        if self.barred.load(Ordering::Acquire) {
            return refuse(ClientLimit::CancelledFills);
        }
        if self.leading.fetch_add(1, Ordering::AcqRel) >= self.max_per_connection {
            self.leading.fetch_sub(1, Ordering::AcqRel);
            return refuse(ClientLimit::ConnectionFills);
        }
        if let Some(address) = &self.address
            && address.fetch_add(1, Ordering::AcqRel) >= self.max_per_address
        {
            address.fetch_sub(1, Ordering::AcqRel);
            self.leading.fetch_sub(1, Ordering::AcqRel);
            return refuse(ClientLimit::AddressFills);
        }
        Ok(LeadTicket {
            fills: self,
            answered: false,
        })
    }

    fn cancelled_one(&self) {
        let cancelled = self.cancelled.fetch_add(1, Ordering::AcqRel) + 1;
        if cancelled > self.max_cancelled
            && cancelled > self.answered.load(Ordering::Acquire)
            && !self.barred.swap(true, Ordering::AcqRel)
        {
            self.counters.count(ClientLimit::CancelledFills);
            tracing::debug!(cancelled, "connection closed for its cancelled fills");
            self.activity.tell(CLOSE);
        }
    }
}

/// One fill a connection leads, from its start to its response head.
#[derive(Debug)]
pub(crate) struct LeadTicket<'a> {
    fills: &'a ConnFills,
    answered: bool,
}

impl LeadTicket<'_> {
    /// The request got its response head: not a cancelled fill.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for LeadTicket<'_> {
    fn drop(&mut self) {
        let fills = self.fills;
        fills.leading.fetch_sub(1, Ordering::AcqRel);
        if let Some(address) = &fills.address {
            address.fetch_sub(1, Ordering::AcqRel);
        }
        if self.answered {
            fills.answered.fetch_add(1, Ordering::AcqRel);
        } else {
            fills.cancelled_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::activity::RUN;

    fn fills(address: &Arc<AtomicUsize>, tune: impl FnOnce(&mut ConnectionLimits)) -> ConnFills {
        let mut limits = ConnectionLimits::default();
        tune(&mut limits);
        let counters = crate::metrics::Metrics::new().client_counters();
        ConnFills::new(
            &limits,
            Some(Arc::clone(address)),
            Arc::new(Activity::default()),
            counters,
        )
    }

    #[test]
    fn a_connection_and_an_address_lead_at_most_their_bound_and_tickets_give_back() {
        let address = Arc::new(AtomicUsize::new(0));
        let tune = |l: &mut ConnectionLimits| {
            l.max_fills_per_connection = 2;
            l.max_fills_per_address = 3;
        };
        let (a, b) = (fills(&address, tune), fills(&address, tune));
        let a1 = a.try_lead().unwrap();
        let a2 = a.try_lead().unwrap();
        assert_eq!(a.try_lead().unwrap_err(), ClientLimit::ConnectionFills);
        let b1 = b.try_lead().unwrap();
        assert_eq!(b.try_lead().unwrap_err(), ClientLimit::AddressFills);
        assert_eq!(address.load(Ordering::Acquire), 3);
        a1.answered();
        drop(a2);
        drop(b1);
        assert_eq!(address.load(Ordering::Acquire), 0);
        assert_eq!(a.leading.load(Ordering::Acquire), 0);
        assert_eq!(b.leading.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_connection_that_cancels_more_than_it_is_answered_is_closed_once() {
        let address = Arc::new(AtomicUsize::new(0));
        let c = fills(&address, |l| l.max_cancelled_fills_per_connection = 3);
        // Answered fills outweigh the cancelled ones: it goes on.
        for _ in 0..5 {
            c.try_lead().unwrap().answered();
        }
        for _ in 0..5 {
            drop(c.try_lead().unwrap());
        }
        assert_eq!(c.activity.signal.load(Ordering::Acquire), RUN);
        drop(c.try_lead().unwrap());
        assert_eq!(c.activity.signal.load(Ordering::Acquire), CLOSE);
        assert_eq!(c.try_lead().unwrap_err(), ClientLimit::CancelledFills);
        assert_eq!(
            c.counters.get(ClientLimit::CancelledFills),
            2,
            "closed once"
        );
    }
}
