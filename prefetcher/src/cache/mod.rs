//! The L1 cache and its freshness rules (RFC 9111 §4.2): lifetime from `s-maxage`,
//! `max-age` or `Expires` (the targeted fields of RFC 9213 first), else the configured
//! default (off unless set), else a heuristic share of the `Last-Modified` age; the
//! `stale-while-revalidate` and `stale-if-error` windows; variants of a URL whose
//! responses `Vary`; XFetch early refresh.
//!
//! By what they hold: `entry` (a stored response, [`Entry`], and its windows,
//! [`Freshness`]), `freshness` (what an origin response may be stored for,
//! [`classify`], and XFetch, [`xfetch_due`]); this file the store itself
//! ([`L1Cache`]: lookups, the variants of each URL, invalidation); `purge` the
//! invalidation of a tenant's prefix ([`L1Cache::purge_prefix`]).
//!
//! Storage is moka (bounded in bytes by a weigher, per-entry expiry at the end of the
//! grace window); freshness decisions use [`tokio::time::Instant`] so tests can pause
//! time.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use moka::notification::RemovalCause;
use prometheus_client::metrics::counter::Counter;
use rand::Rng;
use tokio::time::Instant;

use crate::config::CacheConfig;
use crate::flight::{FlightKey, Scheme};
use crate::semantics::variant_of;

mod entry;
mod freshness;
mod purge;

pub use entry::{Entry, Freshness, origin_age};
pub use freshness::{Storability, classify, xfetch_due};
pub(crate) use purge::SoftPurge;

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
    /// Expired past its grace window, kept to be revalidated (or served on an origin
    /// error): the request fills, conditionally when the entry has validators.
    Expired(Arc<Entry>),
    /// Nothing stored.
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

/// The variants stored for one URL whose responses `Vary`.
#[derive(Debug)]
struct VarySpec {
    names: Arc<[HeaderName]>,
    /// Stored variants, oldest first; at most `max_variants`. A `std::sync::Mutex`:
    /// held for one list operation on a store or an invalidation, never on a hit.
    variants: Mutex<VecDeque<Arc<str>>>,
}

impl VarySpec {
    fn new(names: Arc<[HeaderName]>) -> VarySpec {
        VarySpec {
            names,
            variants: Mutex::new(VecDeque::new()),
        }
    }

    fn variants(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<str>>> {
        self.variants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes this record holds for the URL `primary`: its key, the names and
    /// every variant string (a client chooses their length, up to the header limit,
    /// and a variant outlives the entry it named until the record drops it).
    fn weight(&self, primary: &FlightKey) -> u32 {
        const OVERHEAD: usize = 128;
        let names: usize = self.names.iter().map(|n| n.as_str().len() + 16).sum();
        let variants: usize = self.variants().iter().map(|v| v.len() + 24).sum();
        let key = primary.key().as_str().len() + primary.tenant().as_str().len();
        (OVERHEAD + key + names + variants).min(u32::MAX as usize) as u32
    }
}

/// The node's L1 cache, bounded in bytes.
#[derive(Clone)]
pub struct L1Cache {
    entries: moka::sync::Cache<FlightKey, Arc<Entry>>,
    /// URL (primary key) → what its responses vary on and which variants are stored.
    vary: moka::sync::Cache<FlightKey, Arc<VarySpec>>,
    xfetch_beta: f64,
    max_variants: usize,
}

/// The share of `cache.max_bytes` the `Vary` records may hold (by their bytes,
/// [`VarySpec::weight`]); the entries get the rest, so the two stay within the
/// configured size together. A record evicted takes its variants' entries along.
const VARY_SHARE: u64 = 16;
/// The least the `Vary` records get (never more than half the cache).
const MIN_VARY_BYTES: u64 = 256 * 1024;

/// `(entries, vary records)`: how `max_bytes` is split.
fn budgets(max_bytes: u64) -> (u64, u64) {
    let vary = (max_bytes / VARY_SHARE).max(MIN_VARY_BYTES.min(max_bytes / 2));
    (max_bytes - vary, vary)
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
        let (entry_bytes, vary_bytes) = budgets(config.max_bytes);
        let mut builder = moka::sync::Cache::builder()
            .max_capacity(entry_bytes)
            .weigher(|k: &FlightKey, v: &Arc<Entry>| {
                v.weight.saturating_add(
                    (k.key().as_str().len()
                        + k.tenant().as_str().len()
                        + k.variant().map_or(0, str::len)) as u32,
                )
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
        let entries: moka::sync::Cache<FlightKey, Arc<Entry>> = builder.build();
        let variants_of = entries.clone();
        let vary = moka::sync::Cache::builder()
            .max_capacity(vary_bytes)
            .weigher(|primary: &FlightKey, spec: &Arc<VarySpec>| spec.weight(primary))
            .time_to_idle(Duration::from_secs(24 * 3600))
            .eviction_listener(move |primary: Arc<FlightKey>, spec: Arc<VarySpec>, cause| {
                // Evicted for room or idleness: its entries could no longer be found
                // nor invalidated through it. (A replaced record is the same one
                // reweighed; an explicit removal invalidates its entries itself.)
                if matches!(cause, RemovalCause::Size | RemovalCause::Expired) {
                    let variants = std::mem::take(&mut *spec.variants());
                    for variant in variants {
                        variants_of.invalidate(&primary.with_variant(variant));
                    }
                }
            })
            .build();
        L1Cache {
            entries,
            vary,
            xfetch_beta: config.xfetch_beta,
            max_variants: config.max_variants.max(1),
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
        } else if now < entry.keep_until {
            Lookup::Expired(entry)
        } else {
            // Moka's own clock removes it soon; this one is the one tests can pause.
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

    /// The key a request with `headers` uses for the URL `primary`: the URL itself, or
    /// the variant its selecting headers pick when the URL's responses `Vary`.
    pub fn key_for(&self, primary: &FlightKey, headers: &HeaderMap) -> FlightKey {
        self.key_for_with(primary, |names| variant_of(names, headers))
    }

    /// [`key_for`](Self::key_for) with the variant computed by `variant` from the
    /// names the URL varies on (the proxy computes it from what a fill sends the
    /// origin, not from what the client sent).
    pub fn key_for_with(
        &self,
        primary: &FlightKey,
        variant: impl FnOnce(&[HeaderName]) -> Arc<str>,
    ) -> FlightKey {
        match self.vary.get(primary) {
            Some(spec) => primary.with_variant(variant(&spec.names)),
            None => primary.clone(),
        }
    }

    /// Stores `entry` under `key`, replacing any older one. A response without `Vary`
    /// stored under a URL replaces every variant the URL had.
    pub fn insert(&self, key: FlightKey, entry: Entry) {
        if key.variant().is_none() && self.vary.contains_key(&key) {
            self.invalidate_variants(&key);
        }
        self.entries.insert(key, Arc::new(entry));
    }

    /// Records that the URL `primary`'s responses vary on `names` (before a fill's
    /// head goes out, so requests of other variants get their own flights).
    pub fn note_vary(&self, primary: &FlightKey, names: Arc<[HeaderName]>) {
        if self
            .vary
            .get(primary)
            .is_some_and(|spec| spec.names == names)
        {
            return;
        }
        self.invalidate_variants(primary);
        self.vary
            .insert(primary.clone(), Arc::new(VarySpec::new(names)));
    }

    /// Stores the variant `variant` of the URL `primary`, whose responses vary on
    /// `names`. Past `max_variants` the oldest variant of the URL is dropped, so a
    /// client sending ever new header values cannot grow one URL without bound.
    pub fn insert_variant(
        &self,
        primary: &FlightKey,
        names: Arc<[HeaderName]>,
        variant: Arc<str>,
        entry: Entry,
    ) {
        let spec = match self.vary.get(primary) {
            Some(spec) if spec.names == names => spec,
            _ => {
                // First variant, or the origin now varies on other fields: the old
                // variants were selected by the wrong fields.
                self.invalidate_variants(primary);
                Arc::new(VarySpec::new(names))
            }
        };
        self.entries.invalidate(primary);
        let evicted = {
            let mut variants = spec.variants();
            if !variants.contains(&variant) {
                variants.push_back(Arc::clone(&variant));
            }
            let mut evicted = Vec::new();
            while variants.len() > self.max_variants {
                evicted.extend(variants.pop_front());
            }
            evicted
        };
        // (Re)inserted so that its weight counts the variant it now holds.
        self.vary.insert(primary.clone(), spec);
        for old in evicted {
            self.entries.invalidate(&primary.with_variant(old));
        }
        self.entries
            .insert(primary.with_variant(variant), Arc::new(entry));
    }

    /// Drops `key`.
    pub fn invalidate(&self, key: &FlightKey) {
        self.entries.invalidate(key);
    }

    /// Drops every stored response of the URL `primary`: the plain one and every
    /// variant (RFC 9111 §4.4), of both schemes (one resource at the origin).
    pub fn invalidate_url(&self, primary: &FlightKey) {
        for scheme in [Scheme::Http, Scheme::Https] {
            let primary = primary.primary().with_scheme(scheme);
            self.entries.invalidate(&primary);
            self.invalidate_variants(&primary);
        }
    }

    fn invalidate_variants(&self, primary: &FlightKey) {
        if let Some(spec) = self.vary.remove(primary) {
            let variants = std::mem::take(&mut *spec.variants());
            for variant in variants {
                self.entries.invalidate(&primary.with_variant(variant));
            }
        }
    }

    /// The bytes the cache holds by its own accounting: entries, and the `Vary`
    /// records (pending evictions run first). Within `cache.max_bytes`.
    pub fn weighted_bytes(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.vary.run_pending_tasks();
        self.entries.weighted_size() + self.vary.weighted_size()
    }

    /// The bytes of every variant string the `Vary` records hold, counted one by
    /// one (not by the weigher): what a client can make them keep.
    pub fn vary_variant_bytes(&self) -> u64 {
        self.vary.run_pending_tasks();
        self.vary
            .iter()
            .map(|(_, spec)| spec.variants().iter().map(|v| v.len() as u64).sum::<u64>())
            .sum()
    }

    /// Approximate number of entries.
    pub fn entry_count(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    use bytes::Bytes;
    use http::{StatusCode, header};
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
            Storability::Store(f) => f.ttl,
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
        // A silent origin: nothing stored by default ...
        assert_eq!(classify_now(200, &[], &c, 0.5), Storability::ShareOnly);
        // ... the configured default when set ...
        let with_default = CacheConfig {
            default_ttl_ms: 60_000,
            ..cfg()
        };
        assert_eq!(
            ttl(classify_now(200, &[], &with_default, 0.5)),
            Duration::from_secs(60)
        );
        // ... else 10 % of the Last-Modified age (RFC 9111 §4.2.2).
        let lm = [
            ("date", httpdate::fmt_http_date(date)),
            (
                "last-modified",
                httpdate::fmt_http_date(date - Duration::from_secs(1000)),
            ),
        ];
        let lm: Vec<(&str, &str)> = lm.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            ttl(classify_now(200, &lm, &c, 0.5)),
            Duration::from_secs(100)
        );
        assert_eq!(
            classify_now(302, &lm, &c, 0.5),
            Storability::ShareOnly,
            "302 is not heuristically cacheable"
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
            default_ttl_ms: 60_000,
            ..CacheConfig::default()
        };
        let ttl = |s: Storability| match s {
            Storability::Store(f) => f.ttl,
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
            vec![("vary", "*"), ("cache-control", "max-age=60")],
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
            classify_now(
                200,
                &[("vary", "accept-language"), ("cache-control", "max-age=5")],
                &c,
                0.5
            ),
            Storability::Store(_)
        ));
        // no-cache with a validator: stored, but never fresh (always revalidated).
        match classify_now(
            200,
            &[("cache-control", "no-cache, max-age=60"), ("etag", "\"1\"")],
            &c,
            0.5,
        ) {
            Storability::Store(f) => assert_eq!((f.ttl, f.grace), (Duration::ZERO, Duration::ZERO)),
            other => panic!("{other:?}"),
        }
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
            Storability::Store(f) => assert_eq!(f.grace, Duration::from_secs(30)),
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
            Storability::Store(f) => Some(f.ttl),
            _ => None,
        };
        let cc = ("cache-control", "max-age=100");
        assert_eq!(ttl(&[cc, ("age", "30")]), Some(Duration::from_secs(70)));
        assert_eq!(ttl(&[cc, ("age", "100")]), None, "already expired upstream");
        assert_eq!(ttl(&[cc, ("age", "soon")]), Some(Duration::from_secs(100)));
        assert_eq!(ttl(&[("age", "20")]), None, "no default lifetime");
        assert_eq!(origin_age(&headers(&[("age", " 12 ")])), 12);
        assert_eq!(origin_age(&headers(&[("age", "-1")])), 0);
        assert_eq!(origin_age(&headers(&[("age", "7200, 0")])), 7200);
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

    #[test]
    fn variants_of_a_url_are_capped_and_invalidated_together() {
        let c = CacheConfig {
            max_variants: 2,
            ..cfg()
        };
        let cache = L1Cache::new(&c);
        let url = FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new("/v").unwrap());
        let names: Arc<[HeaderName]> = vec![header::ACCEPT_ENCODING].into();
        let entry = || {
            Entry::new(
                StatusCode::OK,
                HeaderMap::new(),
                Bytes::from_static(b"x"),
                Duration::from_secs(60),
                Duration::ZERO,
                Duration::from_millis(1),
                false,
            )
        };
        let request = |ae: &str| headers(&[("accept-encoding", ae)]);
        for ae in ["gzip", "br", "zstd"] {
            let key = cache.key_for(&url, &request(ae));
            let variant: Arc<str> = key
                .variant()
                .map(Arc::from)
                .unwrap_or_else(|| crate::semantics::variant_of(&names, &request(ae)));
            cache.insert_variant(&url, Arc::clone(&names), variant, entry());
        }
        let fresh = |ae: &str| {
            cache
                .get_fresh(&cache.key_for(&url, &request(ae)))
                .is_some()
        };
        assert!(!fresh("gzip"), "the oldest variant went past the cap");
        assert!(fresh("br") && fresh("zstd"));
        assert!(
            cache.get_fresh(&url).is_none(),
            "no plain entry for a varying URL"
        );
        cache.invalidate_url(&url);
        assert!(!fresh("br") && !fresh("zstd"));
        assert_eq!(
            cache.key_for(&url, &request("br")),
            url,
            "the Vary is forgotten"
        );
    }

    /// Item 1 of the second round: a client that lists 24 KiB of made-up codings on
    /// each request to a `Vary: Accept-Encoding` URL, a new query string each time.
    /// The variant strings stay within the records' share of `max_bytes`, counted
    /// string by string, and the cache's accounting within `max_bytes`.
    #[test]
    fn vary_records_are_bounded_by_bytes_within_the_cache_size() {
        let c = CacheConfig {
            max_bytes: 4 << 20,
            ..cfg()
        };
        let cache = L1Cache::new(&c);
        let names: Arc<[HeaderName]> = vec![header::ACCEPT_ENCODING].into();
        let codings: Vec<String> = (0..2_000).map(|i| format!("x-{i:08}")).collect();
        let request = headers(&[("accept-encoding", &codings.join(","))]);
        for i in 0..400 {
            let url = FlightKey::new(
                TenantId::new("t").unwrap(),
                CacheKey::new(format!("/v?n={i}")).unwrap(),
            );
            cache.note_vary(&url, Arc::clone(&names));
            let key = cache.key_for(&url, &request);
            let variant: Arc<str> = key.variant().map(Arc::from).unwrap();
            assert!(variant.len() > 20_000);
            let entry = Entry::new(
                StatusCode::OK,
                HeaderMap::new(),
                Bytes::from_static(b"x"),
                Duration::from_secs(600),
                Duration::ZERO,
                Duration::from_millis(1),
                false,
            );
            cache.insert_variant(&url, Arc::clone(&names), variant, entry);
        }
        let (_, vary_budget) = budgets(c.max_bytes);
        let held = cache.vary_variant_bytes();
        assert!(held <= vary_budget, "{held} variant bytes held");
        let accounted = cache.weighted_bytes();
        assert!(accounted <= c.max_bytes, "{accounted} bytes accounted");
        assert!(held > 0, "variants are still kept");
    }
}
