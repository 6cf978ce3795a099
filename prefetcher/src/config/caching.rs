//! The cache (`[cache]`), single-flight (`[flight]`) and pre-warm fill
//! (`[prefetch]`) sections.

use serde::{Deserialize, Serialize};

/// The L1 cache: size bounds, TTLs, stale-while-revalidate and early refresh.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Total bytes the cache may hold (bodies, headers and keys).
    pub max_bytes: u64,
    /// Largest object that is cached or collapsed; larger ones pass through.
    pub max_object_bytes: u64,
    /// Freshness lifetime when the origin gives none (no `s-maxage`, `max-age` or
    /// `Expires`): used instead of the RFC 9111 heuristic. 0 (the default) turns it
    /// off, so only what the origin says, or the heuristic it allows, applies.
    pub default_ttl_ms: u64,
    /// Spread of TTLs as a fraction: the default TTL moves by ± this much, origin TTLs
    /// only shorten by up to this much, so entries stored together do not expire
    /// together. 0 turns it off.
    pub jitter: f64,
    /// How long past expiry an entry may be served stale while one refresh runs, or
    /// instead of an origin error, when the origin sends no `stale-while-revalidate` /
    /// `stale-if-error` and nothing that forbids stale (`must-revalidate`,
    /// `proxy-revalidate`, `s-maxage`, `no-cache`). 0 (the default) turns it off.
    pub stale_grace_ms: u64,
    /// Most stored variants of one URL whose responses `Vary`; past it the oldest goes.
    pub max_variants: usize,
    /// How long an expired entry with a validator (`ETag`, `Last-Modified`) is kept
    /// past its last usable moment, to be revalidated with a conditional request.
    pub keep_for_revalidation_ms: u64,
    /// XFetch β for probabilistic early refresh; 0 turns it off, 1 is the usual value.
    pub xfetch_beta: f64,
    /// Whether an origin's 5xx is stored when its fields give it freshness
    /// (`max-age`, `Expires` …). Off (the default): a 5xx goes to the requests
    /// collapsed on its fill and is never stored, whatever its headers say, so the
    /// next wave refills (an expired entry the origin allows `stale-if-error` for
    /// answers instead). On: a 5xx is stored as RFC 9111 would store any response.
    pub store_errors: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: 256 * 1024 * 1024,
            max_object_bytes: 16 * 1024 * 1024,
            default_ttl_ms: 0,
            jitter: 0.1,
            stale_grace_ms: 0,
            max_variants: 16,
            keep_for_revalidation_ms: 3_600_000,
            xfetch_beta: 0.0,
            store_errors: false,
        }
    }
}

/// What a waiter does when a fill takes longer than `wait_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum WaitTimeoutPolicy {
    /// Fetch from the origin on its own (uncached).
    Hedge,
    /// Answer 504.
    Fail,
}

/// Single-flight settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlightConfig {
    /// Whether concurrent misses for one key share one origin fill (the default).
    /// `false` makes every miss fetch on its own, as plain cache-aside does: only
    /// for measuring the baseline that collapsing is compared with.
    pub collapse: bool,
    /// Longest a waiter waits for the leader's response head.
    pub wait_timeout_ms: u64,
    /// What a waiter does then.
    pub on_wait_timeout: WaitTimeoutPolicy,
    /// Most origin fills (and hedges) in progress at once.
    pub max_fills: usize,
    /// Fill slots background (pre-warm) fills may never take.
    pub reserved_for_user: usize,
    /// Most distinct keys in flight at once; past it a request gets 503.
    pub max_flights: usize,
    /// User fills that may wait for a fill slot when all `max_fills` are busy; past it
    /// a request gets 503 with a `Retry-After` instead of queueing without bound.
    pub max_queued_fills: usize,
    /// Largest `Retry-After` (seconds) an overloaded node sends.
    pub retry_after_max_s: u32,
    /// Longest a user fill waits for a slot; then the request gets 503 with a
    /// `Retry-After`.
    pub queue_timeout_ms: u64,
    /// A tenant with no fill started, running or queued for this long is idle: the
    /// others may borrow its committed share of the slots.
    pub share_idle_ms: u64,
    /// Whether each origin's user fills follow an adaptive limit (the default) or
    /// only the fixed `max_fills`: `false` is for measuring the fixed baseline.
    pub adaptive_origin_limit: bool,
    /// Lower bound of an origin's adaptive limit.
    pub origin_min_fills: usize,
}

impl Default for FlightConfig {
    fn default() -> Self {
        FlightConfig {
            collapse: true,
            wait_timeout_ms: 3_000,
            on_wait_timeout: WaitTimeoutPolicy::Hedge,
            max_fills: 256,
            reserved_for_user: 64,
            max_flights: 100_000,
            max_queued_fills: 1024,
            retry_after_max_s: 30,
            queue_timeout_ms: 2_000,
            share_idle_ms: 5_000,
            adaptive_origin_limit: true,
            origin_min_fills: 4,
        }
    }
}

/// The prefetch (pre-warm) class of origin fills. It uses only spare capacity: at
/// most a limit that adapts to origin latency (additive increase while fills are as
/// fast as usual, multiplicative decrease when they slow down or fail), never the
/// `flight.reserved_for_user` slots, and never while a user fill waits for a slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefetchConfig {
    /// Upper bound of the adaptive prefetch limit (and its starting value); capped at
    /// `flight.max_fills - flight.reserved_for_user`.
    pub max_fills: usize,
    /// Lower bound of the adaptive prefetch limit.
    pub min_fills: usize,
    /// Prefetches that may wait for a prefetch slot; more are shed at once.
    pub max_queued: usize,
    /// Longest a prefetch waits for a slot before it is shed.
    pub queue_timeout_ms: u64,
    /// The limit shrinks when recent fill latency exceeds this multiple of the
    /// origin's no-load latency (the lowest recent latency, rising toward a slower
    /// origin over 30 s), holds past half of that excess, and grows only below it;
    /// the origins' adaptive limits use it too. 1.5 is Netflix concurrency-limits'
    /// `rttTolerance` default.
    pub latency_tolerance: f64,
    /// The limit also shrinks while recent fill latency is above this, if set.
    pub latency_target_ms: Option<u64>,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            max_fills: 32,
            min_fills: 1,
            max_queued: 1024,
            queue_timeout_ms: 10_000,
            latency_tolerance: 1.5,
            latency_target_ms: None,
        }
    }
}
