//! A stored response ([`Entry`]) and the windows it may be used in ([`Freshness`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use tokio::time::Instant;

use crate::semantics::MAX_AGE_SECS;

/// How long a stored response may be used, from when it came from the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Freshness {
    /// Freshness lifetime left (jitter applied, upstream `Age` taken off).
    pub ttl: Duration,
    /// Past `ttl`: served stale while one refresh runs (`stale-while-revalidate`, or
    /// the config's grace when the origin is silent).
    pub grace: Duration,
    /// Past `ttl`: served stale instead of an origin error (`stale-if-error`, or the
    /// config's grace when the origin is silent).
    pub if_error: Duration,
    /// Past every window: kept this long only to be revalidated with its validators.
    pub keep: Duration,
}

/// One stored response.
#[derive(Debug)]
pub struct Entry {
    /// Status from the origin.
    pub status: StatusCode,
    /// The headers a hit answers with, built once at fill time: the origin's
    /// (hop-by-hop and `Age` removed) followed by an `x-cache` and an `Age` slot that
    /// each response overwrites in place, so the hit path clones one map and
    /// allocates nothing else for its head.
    pub headers: HeaderMap,
    /// The complete body.
    pub body: Bytes,
    pub(super) fresh_until: Instant,
    pub(super) stale_until: Instant,
    pub(super) error_until: Instant,
    pub(super) keep_until: Instant,
    pub(super) fill_time: Duration,
    pub(super) fetched_at: Instant,
    pub(super) initial_age: u64,
    pub(super) prefetched: AtomicBool,
    pub(super) weight: u32,
    /// Soft-purged with a re-warm scheduled (`crate::purge`): served stale without
    /// a refresh of its own until then, and never to another edge-pulse node.
    pub(super) awaits_rewarm: bool,
}

/// The `Age` an origin sent, in seconds (RFC 9111 §5.1); 0 when absent or invalid,
/// the first member of a list. A previous cache (a shield tier) sends one; the
/// freshness lifetime is counted from the origin's response, not from when this node
/// got it.
pub fn origin_age(headers: &HeaderMap) -> u64 {
    crate::semantics::age_of(headers)
}

impl Entry {
    /// A stored response, fresh for `ttl` then servable stale for `grace`, fetched
    /// now with no `Age` from the origin (see [`with_age`](Self::with_age)). Any
    /// `Age` in `headers` is dropped; `x-cache` and `Age` slots are appended.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        ttl: Duration,
        grace: Duration,
        fill_time: Duration,
        prefetched: bool,
    ) -> Entry {
        let freshness = Freshness {
            ttl,
            grace,
            ..Freshness::default()
        };
        Entry::stored(status, headers, body, freshness, fill_time, prefetched)
    }

    /// A stored response with every window of `freshness`.
    pub fn stored(
        status: StatusCode,
        mut headers: HeaderMap,
        body: Bytes,
        freshness: Freshness,
        fill_time: Duration,
        prefetched: bool,
    ) -> Entry {
        let now = Instant::now();
        headers.remove(header::AGE);
        headers.insert(
            crate::status::X_CACHE,
            HeaderValue::from_static(crate::status::CacheStatus::Hit.as_str()),
        );
        headers.insert(header::AGE, HeaderValue::from_static("0"));
        let header_bytes: usize = headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        let weight = (body.len() + header_bytes + 256).min(u32::MAX as usize) as u32;
        let fresh_until = now + freshness.ttl;
        let stale_until = fresh_until + freshness.grace;
        let error_until = fresh_until + freshness.if_error;
        let keep_until = stale_until
            .max(error_until)
            .max(fresh_until + freshness.keep);
        Entry {
            status,
            headers,
            body,
            fresh_until,
            stale_until,
            error_until,
            keep_until,
            fill_time,
            fetched_at: now,
            initial_age: 0,
            prefetched: AtomicBool::new(prefetched),
            weight,
            awaits_rewarm: false,
        }
    }

    /// This response soft-purged at `now`: stale from now on, servable stale until
    /// `until` (its re-warm comes before), kept to be revalidated as long as before.
    pub(super) fn soft_purged(&self, now: Instant, until: Instant) -> Entry {
        Entry {
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            fresh_until: now,
            stale_until: until,
            error_until: until.max(self.error_until),
            keep_until: until.max(self.keep_until),
            fill_time: self.fill_time,
            fetched_at: self.fetched_at,
            initial_age: self.initial_age,
            prefetched: AtomicBool::new(false),
            weight: self.weight,
            awaits_rewarm: true,
        }
    }

    /// Whether a purge marked this entry stale and scheduled its re-warm: requests
    /// served it stale start no refresh (the re-warm is the one), and another
    /// edge-pulse node asking for it (a downstream edge's fill) gets a fresh copy.
    pub fn awaits_rewarm(&self) -> bool {
        self.awaits_rewarm
    }

    /// Records when the response came from the origin and the `Age` it carried
    /// ([`origin_age`]), from which [`age`](Self::age) counts.
    pub fn with_age(mut self, fetched_at: Instant, initial_age: u64) -> Entry {
        self.fetched_at = fetched_at;
        self.initial_age = initial_age.min(MAX_AGE_SECS);
        self
    }

    /// The `Age` to send at `now` (RFC 9111 §4.2.3, without clock-based corrections):
    /// whole seconds since the response was fetched from the origin, plus the `Age`
    /// the origin sent.
    pub fn age(&self, now: Instant) -> u64 {
        let resident = now.saturating_duration_since(self.fetched_at).as_secs();
        self.initial_age.saturating_add(resident).min(MAX_AGE_SECS)
    }

    /// When the response came from the origin.
    pub fn fetched_at(&self) -> Instant {
        self.fetched_at
    }

    /// The `Age` the origin sent, in seconds.
    pub fn initial_age(&self) -> u64 {
        self.initial_age
    }

    /// Whether a background (pre-warm) fill stored this entry and no user has hit it
    /// yet. The first caller to see `true` gets it; later callers see `false`.
    pub fn take_prefetched(&self) -> bool {
        self.prefetched.load(Ordering::Relaxed) && self.prefetched.swap(false, Ordering::AcqRel)
    }

    /// How long the origin fill took.
    pub fn fill_time(&self) -> Duration {
        self.fill_time
    }

    /// Whether the entry is fresh at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    /// How much longer the entry stays fresh at `now`.
    pub fn fresh_for(&self, now: Instant) -> Duration {
        self.fresh_until.saturating_duration_since(now)
    }

    /// Whether the entry may stand in for an origin error at `now` (`stale-if-error`).
    pub fn usable_on_error(&self, now: Instant) -> bool {
        now < self.error_until
    }

    /// Whether the entry carries a validator (`ETag` or `Last-Modified`) for a
    /// conditional refresh.
    pub fn has_validators(&self) -> bool {
        self.headers.contains_key(header::ETAG) || self.headers.contains_key(header::LAST_MODIFIED)
    }

    pub(super) fn lifetime(&self) -> Duration {
        self.keep_until.saturating_duration_since(Instant::now())
    }
}
