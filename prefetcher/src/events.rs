//! The access-event hook: called once per answered cacheable request, and once per
//! completed background fill. The Kafka publisher (`publisher`) reads a
//! [`ChannelSink`]'s receiving end.
//!
//! A sink must never block or fail a request: [`ChannelSink`] uses a bounded channel
//! and counts what it drops.
//!
//! A record carries its own time, taken when the request was answered (or the
//! background fill completed): the publisher may dequeue it much later under a
//! backlog, and the event's `ts_ms` must not move with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use models::{
    AccessEvent, CacheKey, CacheKeyRef, Domain, DomainRef, NodeId, Outcome, RegionId, TenantId,
    TenantRef,
};
use tokio::sync::mpsc;

/// One request outcome, before the node adds its region and node ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeRecord {
    /// When it was answered: wall clock, milliseconds since the Unix epoch
    /// (taken at answer time, never by the publisher).
    pub ts_ms: u64,
    /// The tenant (from trusted configuration).
    pub tenant: TenantId,
    /// The normalised cache key.
    pub key: CacheKey,
    /// How it was answered.
    pub outcome: Outcome,
    /// Body bytes sent (the stored or declared length; 0 for HEAD).
    pub bytes: u64,
    /// Origin fill time, for outcomes that waited on (or ran) a fill.
    pub fill_ms: Option<u32>,
    /// The `Referer` header's host, when valid.
    pub referrer: Option<Domain>,
}

impl OutcomeRecord {
    /// The wire event for this record, stamped with the record's own `ts_ms`.
    pub fn into_event(self, region: RegionId, node: NodeId) -> AccessEvent {
        let mut event = AccessEvent::new(
            self.ts_ms,
            self.tenant,
            self.key,
            region,
            node,
            self.outcome,
        );
        event.bytes = self.bytes;
        event.fill_ms = self.fill_ms;
        event.referrer = self.referrer;
        event
    }
}

impl OutcomeRecord {
    /// The record borrowed: what the publisher encodes.
    pub fn borrowed(&self) -> OutcomeRef<'_> {
        OutcomeRef {
            ts_ms: self.ts_ms,
            tenant: self.tenant.borrowed(),
            key: self.key.borrowed(),
            outcome: self.outcome,
            bytes: self.bytes,
            fill_ms: self.fill_ms,
            referrer: self.referrer.as_ref().map(Domain::borrowed),
        }
    }
}

/// An [`OutcomeRecord`] whose strings are borrowed (from a log line, say), so one
/// can be encoded and published without an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeRef<'a> {
    /// When it was answered, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The tenant.
    pub tenant: TenantRef<'a>,
    /// The normalised cache key.
    pub key: CacheKeyRef<'a>,
    /// How it was answered.
    pub outcome: Outcome,
    /// Body bytes sent.
    pub bytes: u64,
    /// Origin fill time.
    pub fill_ms: Option<u32>,
    /// The `Referer` header's host.
    pub referrer: Option<DomainRef<'a>>,
}

impl OutcomeRef<'_> {
    /// The owned record (strings copied, not checked again).
    pub fn to_owned_record(&self) -> OutcomeRecord {
        OutcomeRecord {
            ts_ms: self.ts_ms,
            tenant: self.tenant.to_owned_id(),
            key: self.key.to_owned_id(),
            outcome: self.outcome,
            bytes: self.bytes,
            fill_ms: self.fill_ms,
            referrer: self.referrer.as_ref().map(DomainRef::to_owned_id),
        }
    }
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A record the sink could not take (its buffer was full); the node counts it in
/// `prefetcher_events_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("access event dropped: buffer full")]
pub struct Dropped;

/// Where outcomes go. Implementations must return at once.
pub trait EventSink: Send + Sync + 'static {
    /// Whether records are wanted (lets the hit path skip building them).
    fn enabled(&self) -> bool {
        true
    }

    /// Takes one record, or refuses it at once; must not block.
    fn record(&self, record: OutcomeRecord) -> Result<(), Dropped>;
}

/// Discards everything.
#[derive(Debug, Default)]
pub struct NoopSink;

impl EventSink for NoopSink {
    fn enabled(&self) -> bool {
        false
    }

    fn record(&self, _record: OutcomeRecord) -> Result<(), Dropped> {
        Ok(())
    }
}

/// A bounded channel: `try_send`, and a count of records dropped when it is full.
#[derive(Debug)]
pub struct ChannelSink {
    tx: mpsc::Sender<OutcomeRecord>,
    dropped: AtomicU64,
}

impl ChannelSink {
    /// A sink with room for `capacity` records, and its receiving end.
    pub fn new(capacity: usize) -> (ChannelSink, mpsc::Receiver<OutcomeRecord>) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            ChannelSink {
                tx,
                dropped: AtomicU64::new(0),
            },
            rx,
        )
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl EventSink for ChannelSink {
    fn record(&self, record: OutcomeRecord) -> Result<(), Dropped> {
        self.tx.try_send(record).map_err(|_| {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            Dropped
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_channel_drops_and_counts_instead_of_blocking() {
        let (sink, mut rx) = ChannelSink::new(1);
        let record = OutcomeRecord {
            ts_ms: 1_700_000_000_123,
            tenant: TenantId::new("t").unwrap(),
            key: CacheKey::new("/a").unwrap(),
            outcome: Outcome::Hit,
            bytes: 3,
            fill_ms: None,
            referrer: None,
        };
        assert_eq!(sink.record(record.clone()), Ok(()));
        assert_eq!(sink.record(record.clone()), Err(Dropped));
        assert_eq!(sink.dropped(), 1);
        let event = rx
            .try_recv()
            .unwrap()
            .into_event(RegionId::new("r").unwrap(), NodeId::new("n").unwrap());
        assert_eq!(event.ts_ms, 1_700_000_000_123);
        assert_eq!(event.outcome, Outcome::Hit);
        assert_eq!(event.bytes, 3);
    }
}
