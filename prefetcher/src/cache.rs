//! The L1 cache and its freshness rules: TTL from `Cache-Control`/`Expires` or a
//! jittered default, a stale-while-revalidate grace window, XFetch early refresh.
//!
//! Storage is moka (bounded in bytes by a weigher, per-entry expiry at the end of the
//! grace window); freshness decisions use [`tokio::time::Instant`] so tests can pause
//! time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use moka::notification::RemovalCause;
use prometheus_client::metrics::counter::Counter;
use rand::Rng;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::flight::FlightKey;

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
    fresh_until: Instant,
    stale_until: Instant,
    fill_time: Duration,
    fetched_at: Instant,
    initial_age: u64,
    prefetched: AtomicBool,
    weight: u32,
}

/// The largest `Age` (RFC 9111 §1.2.2: delta-seconds past 2^31 are sent as 2^31).
const MAX_AGE_SECS: u64 = 1 << 31;

/// The `Age` an origin sent, in seconds (RFC 9111 §5.1); 0 when absent or invalid.
/// A previous cache (a shield tier) sends one; the freshness lifetime is counted
/// from the origin's response, not from when this node got it.
pub fn origin_age(headers: &HeaderMap) -> u64 {
    headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |secs| secs.min(MAX_AGE_SECS))
}

impl Entry {
    /// A stored response, fresh for `ttl` then servable stale for `grace`, fetched
    /// now with no `Age` from the origin (see [`with_age`](Self::with_age)). Any
    /// `Age` in `headers` is dropped; `x-cache` and `Age` slots are appended.
    pub fn new(
        status: StatusCode,
        mut headers: HeaderMap,
        body: Bytes,
        ttl: Duration,
        grace: Duration,
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
        Entry {
            status,
            headers,
            body,
            fresh_until: now + ttl,
            stale_until: now + ttl + grace,
            fill_time,
            fetched_at: now,
            initial_age: 0,
            prefetched: AtomicBool::new(prefetched),
            weight,
        }
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

    fn lifetime(&self) -> Duration {
        self.stale_until.saturating_duration_since(Instant::now())
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A fresh entry; `refresh_early` when XFetch drew this request to refresh it.
    Fresh {
        /// The entry.
        entry: Arc<Entry>,
        /// Start one background refresh now.
        refresh_early: bool,
    },
    /// Expired but inside its grace window: serve it and refresh in the background.
    Stale(Arc<Entry>),
    /// Nothing usable.
    Miss,
}

struct EntryExpiry;

impl moka::Expiry<FlightKey, Arc<Entry>> for EntryExpiry {
    fn expire_after_create(
        &self,
        _key: &FlightKey,
        value: &Arc<Entry>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.lifetime())
    }

    fn expire_after_update(
        &self,
        _key: &FlightKey,
        value: &Arc<Entry>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.lifetime())
    }
}

/// The node's L1 cache, bounded in bytes.
#[derive(Clone)]
pub struct L1Cache {
    entries: moka::sync::Cache<FlightKey, Arc<Entry>>,
    xfetch_beta: f64,
}

impl L1Cache {
    /// A cache holding at most `config.max_bytes`.
    pub fn new(config: &CacheConfig) -> L1Cache {
        L1Cache::build(config, None)
    }

    /// A cache that counts in `wasted` every pre-warmed entry that leaves the cache
    /// (expired, evicted for size, or replaced) before any user hit it.
    pub fn with_waste_counter(config: &CacheConfig, wasted: Counter) -> L1Cache {
        L1Cache::build(config, Some(wasted))
    }

    fn build(config: &CacheConfig, wasted: Option<Counter>) -> L1Cache {
        let mut builder = moka::sync::Cache::builder()
            .max_capacity(config.max_bytes)
            .weigher(|k: &FlightKey, v: &Arc<Entry>| {
                v.weight
                    .saturating_add((k.key().as_str().len() + k.tenant().as_str().len()) as u32)
            })
            .expire_after(EntryExpiry);
        if let Some(wasted) = wasted {
            builder = builder.eviction_listener(move |_key, entry: Arc<Entry>, cause| {
                // An explicit invalidation is an operator's choice, not a wasted fill.
                if cause != RemovalCause::Explicit && entry.prefetched.load(Ordering::Acquire) {
                    wasted.inc();
                }
            });
        }
        let entries = builder.build();
        L1Cache {
            entries,
            xfetch_beta: config.xfetch_beta,
        }
    }

    /// Looks `key` up at the current instant.
    pub fn lookup(&self, key: &FlightKey) -> Lookup {
        let Some(entry) = self.entries.get(key) else {
            return Lookup::Miss;
        };
        let now = Instant::now();
        if now < entry.fresh_until {
            let refresh_early = self.xfetch_beta > 0.0
                && xfetch_due(
                    entry.fill_time,
                    entry.fresh_until - now,
                    self.xfetch_beta,
                    rand::rng().random::<f64>(),
                );
            Lookup::Fresh {
                entry,
                refresh_early,
            }
        } else if now < entry.stale_until {
            Lookup::Stale(entry)
        } else {
            Lookup::Miss
        }
    }

    /// A fresh entry, if any (the leader's second look before it fetches).
    pub fn get_fresh(&self, key: &FlightKey) -> Option<Arc<Entry>> {
        match self.lookup(key) {
            Lookup::Fresh { entry, .. } => Some(entry),
            _ => None,
        }
    }

    /// Stores `entry`, replacing any older one.
    pub fn insert(&self, key: FlightKey, entry: Entry) {
        self.entries.insert(key, Arc::new(entry));
    }

    /// Drops `key`.
    pub fn invalidate(&self, key: &FlightKey) {
        self.entries.invalidate(key);
    }

    /// Approximate number of entries.
    pub fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

/// XFetch (Vattani et al.): refresh early when `fill · β · −ln(u) ≥ time left`, so
/// the chance rises as expiry nears and with slower fills; `u` is uniform in [0, 1).
pub fn xfetch_due(fill: Duration, remaining: Duration, beta: f64, u: f64) -> bool {
    let u = u.clamp(f64::MIN_POSITIVE, 1.0);
    fill.as_secs_f64() * beta * -u.ln() >= remaining.as_secs_f64()
}

/// What may be done with an origin response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Storability {
    /// Store it: fresh for `ttl`, then stale-servable for `grace`.
    Store {
        /// Freshness lifetime (jitter applied).
        ttl: Duration,
        /// Stale-while-revalidate window.
        grace: Duration,
    },
    /// Give it to the requests already waiting on this fill, but do not store it.
    ShareOnly,
    /// Per-user (`private`, `no-store`, `Set-Cookie`, `Vary` on request headers):
    /// only the leader's client gets it; waiters fetch on their own.
    Private,
}

/// Statuses stored by default (RFC 9110 heuristically cacheable, less 206/405/414/501).
fn status_storable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 410
    )
}

/// Decides what to do with a (non-5xx) origin response. `u` is a uniform draw in
/// [0, 1) for the jitter.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    config: &CacheConfig,
    now: SystemTime,
    u: f64,
) -> Storability {
    if headers.contains_key(header::SET_COOKIE) {
        return Storability::Private;
    }
    let directives = CacheControl::parse(headers);
    if directives.private || directives.no_store {
        return Storability::Private;
    }
    if let Some(vary) = headers.get(header::VARY) {
        // Fills send no per-user headers (and no Accept-Encoding), so a response that
        // varies only on encoding is the same for everyone; anything else is not.
        let only_encoding = vary.to_str().is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .all(|f| f.is_empty() || f.eq_ignore_ascii_case("accept-encoding"))
        });
        if !only_encoding {
            return Storability::Private;
        }
    }
    if directives.no_cache || !status_storable(status) {
        return Storability::ShareOnly;
    }
    let jitter = config.jitter;
    let ttl = match directives.s_maxage.or(directives.max_age) {
        Some(secs) => Some(Duration::from_secs(secs)),
        None => expires_ttl(headers, now),
    };
    let ttl = match ttl {
        // The origin's lifetime is a ceiling: jitter may only shorten it.
        Some(t) => t.mul_f64(1.0 - jitter * u),
        None => {
            Duration::from_millis(config.default_ttl_ms).mul_f64(1.0 + jitter * (2.0 * u - 1.0))
        }
    };
    // The lifetime runs from the origin's response: time it already spent in a
    // cache upstream (its `Age`) is used up.
    let ttl = ttl.saturating_sub(Duration::from_secs(origin_age(headers)));
    if ttl.is_zero() {
        return Storability::ShareOnly;
    }
    let grace = directives
        .stale_while_revalidate
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_millis(config.stale_grace_ms));
    Storability::Store { ttl, grace }
}

fn expires_ttl(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let expires = headers.get(header::EXPIRES)?.to_str().ok();
    // An unparsable Expires means "already expired" (RFC 9111 §5.3).
    let Some(expires) = expires.and_then(|v| httpdate::parse_http_date(v).ok()) else {
        return Some(Duration::ZERO);
    };
    let date = headers
        .get(header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .unwrap_or(now);
    Some(expires.duration_since(date).unwrap_or(Duration::ZERO))
}

#[derive(Debug, Default)]
struct CacheControl {
    private: bool,
    no_store: bool,
    no_cache: bool,
    max_age: Option<u64>,
    s_maxage: Option<u64>,
    stale_while_revalidate: Option<u64>,
}

impl CacheControl {
    fn parse(headers: &HeaderMap) -> CacheControl {
        let mut cc = CacheControl::default();
        for value in headers.get_all(header::CACHE_CONTROL) {
            let Ok(value) = value.to_str() else {
                // Unreadable directives: assume the strictest.
                cc.no_store = true;
                continue;
            };
            for directive in value.split(',') {
                let (name, arg) = match directive.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (directive.trim(), None),
                };
                let secs = arg.and_then(|a| a.parse::<u64>().ok());
                match name.to_ascii_lowercase().as_str() {
                    "private" => cc.private = true,
                    "no-store" => cc.no_store = true,
                    "no-cache" => cc.no_cache = true,
                    "max-age" => cc.max_age = Some(secs.unwrap_or(0)),
                    "s-maxage" => cc.s_maxage = Some(secs.unwrap_or(0)),
                    "stale-while-revalidate" => cc.stale_while_revalidate = secs,
                    _ => {}
                }
            }
        }
        cc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::{CacheKey, TenantId};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn cfg() -> CacheConfig {
        CacheConfig {
            jitter: 0.0,
            ..CacheConfig::default()
        }
    }

    fn classify_now(status: u16, h: &[(&str, &str)], cfg: &CacheConfig, u: f64) -> Storability {
        classify(
            StatusCode::from_u16(status).unwrap(),
            &headers(h),
            cfg,
            SystemTime::now(),
            u,
        )
    }

    #[test]
    fn ttl_comes_from_s_maxage_then_max_age_then_expires_then_default() {
        let c = cfg();
        let ttl = |s: Storability| match s {
            Storability::Store { ttl, .. } => ttl,
            other => panic!("not stored: {other:?}"),
        };
        assert_eq!(
            ttl(classify_now(
                200,
                &[("cache-control", "max-age=30, s-maxage=90")],
                &c,
                0.5
            )),
            Duration::from_secs(90)
        );
        assert_eq!(
            ttl(classify_now(
                200,
                &[("cache-control", "public, max-age=30")],
                &c,
                0.5
            )),
            Duration::from_secs(30)
        );
        let date = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let h = [
            ("date", httpdate::fmt_http_date(date)),
            (
                "expires",
                httpdate::fmt_http_date(date + Duration::from_secs(120)),
            ),
        ];
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            ttl(classify_now(200, &h, &c, 0.5)),
            Duration::from_secs(120)
        );
        assert_eq!(
            ttl(classify_now(200, &[], &c, 0.5)),
            Duration::from_secs(60)
        );
        assert_eq!(
            classify_now(200, &[("expires", "garbage")], &c, 0.5),
            Storability::ShareOnly
        );
    }

    #[test]
    fn jitter_spreads_the_default_both_ways_and_only_shortens_origin_ttls() {
        let c = CacheConfig {
            jitter: 0.1,
            ..CacheConfig::default()
        };
        let ttl = |s: Storability| match s {
            Storability::Store { ttl, .. } => ttl,
            other => panic!("not stored: {other:?}"),
        };
        assert_eq!(
            ttl(classify_now(200, &[], &c, 0.0)),
            Duration::from_secs(54)
        );
        assert_eq!(
            ttl(classify_now(200, &[], &c, 1.0)),
            Duration::from_secs(66)
        );
        let origin = [("cache-control", "max-age=100")];
        assert_eq!(
            ttl(classify_now(200, &origin, &c, 0.0)),
            Duration::from_secs(100)
        );
        assert_eq!(
            ttl(classify_now(200, &origin, &c, 1.0)),
            Duration::from_secs(90)
        );
    }

    #[test]
    fn per_user_responses_never_collapse_and_uncacheable_ones_are_not_stored() {
        let c = cfg();
        for h in [
            vec![("cache-control", "private, max-age=60")],
            vec![("cache-control", "no-store")],
            vec![("set-cookie", "s=1"), ("cache-control", "max-age=60")],
            vec![("vary", "Accept-Language")],
        ] {
            assert_eq!(
                classify_now(200, &h, &c, 0.5),
                Storability::Private,
                "{h:?}"
            );
        }
        assert_eq!(
            classify_now(200, &[("cache-control", "no-cache")], &c, 0.5),
            Storability::ShareOnly
        );
        assert_eq!(
            classify_now(200, &[("cache-control", "max-age=0")], &c, 0.5),
            Storability::ShareOnly
        );
        assert_eq!(classify_now(302, &[], &c, 0.5), Storability::ShareOnly);
        assert!(matches!(
            classify_now(200, &[("vary", "accept-encoding")], &c, 0.5),
            Storability::Store { .. }
        ));
    }

    #[test]
    fn stale_while_revalidate_sets_the_grace_window() {
        let c = cfg();
        match classify_now(
            200,
            &[("cache-control", "max-age=5, stale-while-revalidate=30")],
            &c,
            0.5,
        ) {
            Storability::Store { grace, .. } => assert_eq!(grace, Duration::from_secs(30)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn xfetch_is_never_due_far_from_expiry_and_always_due_at_it() {
        let fill = Duration::from_millis(200);
        assert!(!xfetch_due(fill, Duration::from_secs(3600), 1.0, 0.5));
        assert!(xfetch_due(fill, Duration::ZERO, 1.0, 0.999));
        // Rare draws (u near 0) refresh earlier than common ones.
        let remaining = Duration::from_millis(500);
        assert!(xfetch_due(fill, remaining, 1.0, 0.01));
        assert!(!xfetch_due(fill, remaining, 1.0, 0.9));
    }

    #[tokio::test(start_paused = true)]
    async fn entries_go_fresh_then_stale_then_miss() {
        let cache = L1Cache::new(&cfg());
        let key = FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new("/a").unwrap());
        assert!(matches!(cache.lookup(&key), Lookup::Miss));
        cache.insert(
            key.clone(),
            Entry::new(
                StatusCode::OK,
                HeaderMap::new(),
                Bytes::from_static(b"x"),
                Duration::from_secs(10),
                Duration::from_secs(5),
                Duration::from_millis(1),
                true,
            ),
        );
        match cache.lookup(&key) {
            Lookup::Fresh { entry, .. } => {
                assert!(entry.take_prefetched());
                assert!(
                    !entry.take_prefetched(),
                    "only the first hit is prefetch_useful"
                );
            }
            other => panic!("{other:?}"),
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(matches!(cache.lookup(&key), Lookup::Stale(_)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(cache.lookup(&key), Lookup::Miss));
    }

    #[test]
    fn an_origin_age_uses_up_part_of_the_lifetime() {
        let c = cfg();
        let ttl = |h: &[(&str, &str)]| match classify_now(200, h, &c, 0.5) {
            Storability::Store { ttl, .. } => Some(ttl),
            _ => None,
        };
        let cc = ("cache-control", "max-age=100");
        assert_eq!(ttl(&[cc, ("age", "30")]), Some(Duration::from_secs(70)));
        assert_eq!(ttl(&[cc, ("age", "100")]), None, "already expired upstream");
        assert_eq!(ttl(&[cc, ("age", "soon")]), Some(Duration::from_secs(100)));
        assert_eq!(ttl(&[("age", "20")]), Some(Duration::from_secs(40)));
        assert_eq!(origin_age(&headers(&[("age", " 12 ")])), 12);
        assert_eq!(origin_age(&headers(&[("age", "-1")])), 0);
        assert_eq!(origin_age(&headers(&[("age", "99999999999")])), 1 << 31);
    }

    #[tokio::test(start_paused = true)]
    async fn an_entrys_age_is_its_time_since_the_fetch_plus_the_origins_age() {
        let fetched = Instant::now();
        let entry = Entry::new(
            StatusCode::OK,
            headers(&[("content-type", "text/plain"), ("age", "30")]),
            Bytes::from_static(b"x"),
            Duration::from_secs(60),
            Duration::ZERO,
            Duration::from_millis(1),
            false,
        )
        .with_age(fetched, 30);
        assert_eq!(entry.age(fetched), 30);
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(entry.age(Instant::now()), 32, "whole seconds");
        // The origin's Age is replaced by one slot, x-cache gets one, nothing else moves.
        assert_eq!(entry.headers.get_all(header::AGE).iter().count(), 1);
        assert_eq!(entry.headers.get(crate::status::X_CACHE).unwrap(), "HIT");
        assert_eq!(
            entry.headers.get(header::CONTENT_TYPE).unwrap(),
            "text/plain"
        );
        assert_eq!(entry.headers.len(), 3);
    }

    #[test]
    fn prefetched_entries_leaving_unused_count_as_wasted() {
        let wasted = Counter::default();
        let cache = L1Cache::with_waste_counter(&cfg(), wasted.clone());
        let key = FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new("/w").unwrap());
        let entry = |prefetched| {
            Entry::new(
                StatusCode::OK,
                HeaderMap::new(),
                Bytes::from_static(b"x"),
                Duration::from_secs(60),
                Duration::ZERO,
                Duration::from_millis(1),
                prefetched,
            )
        };
        cache.insert(key.clone(), entry(true));
        cache.insert(key.clone(), entry(true));
        cache.entry_count();
        assert_eq!(wasted.get(), 1, "replaced before any user hit");
        assert!(cache.get_fresh(&key).unwrap().take_prefetched());
        cache.insert(key.clone(), entry(false));
        cache.invalidate(&key);
        cache.entry_count();
        assert_eq!(
            wasted.get(),
            1,
            "used, plain and invalidated entries are not waste"
        );
    }
}
