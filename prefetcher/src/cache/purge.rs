//! Invalidating a tenant's keys under a path prefix, and carrying a tag if asked
//! (`crate::purge` decides what to ask for and re-warms): hard (removed) or soft
//! (stale until its re-warm).

use std::collections::HashSet;
use std::sync::Arc;

use models::{CacheKey, TenantId};
use tokio::time::Instant;

use super::L1Cache;
use crate::flight::FlightKey;

/// A soft purge: the matched URLs are marked stale until `until` instead of removed,
/// at most `max_urls` of them (the rest are removed).
#[derive(Debug, Clone, Copy)]
pub struct SoftPurge {
    /// The last instant a soft-purged entry may be served stale.
    pub until: Instant,
    /// Most URLs marked stale; past it, matched URLs are removed.
    pub max_urls: usize,
}

/// The URLs a purge matched (each once, whatever its variants and schemes).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Marked stale (soft).
    pub soft: Vec<CacheKey>,
    /// Removed.
    pub hard: Vec<CacheKey>,
}

impl L1Cache {
    /// Purges every stored response of `tenant` whose key starts with `prefix` (and,
    /// with `tag`, that carries it: [`carries_tag`]): every
    /// variant and both schemes of each URL, removed, or with `soft` marked stale
    /// until `soft.until` ([`super::Entry::awaits_rewarm`]). Other tenants' keys are
    /// never touched. One pass over the entries: O(entries), no index kept for it.
    pub fn purge_prefix(
        &self,
        tenant: &TenantId,
        prefix: &str,
        tag: Option<&str>,
        soft: Option<SoftPurge>,
    ) -> Purged {
        let matches = |k: &FlightKey| k.tenant() == tenant && k.key().as_str().starts_with(prefix);
        let found: Vec<(Arc<FlightKey>, Arc<super::Entry>)> = self
            .entries
            .iter()
            .filter(|(k, e)| matches(k) && tag.is_none_or(|t| carries_tag(&e.headers, t)))
            .collect();
        let now = Instant::now();
        let mut soft_urls: HashSet<CacheKey> = HashSet::new();
        let mut hard_urls: HashSet<CacheKey> = HashSet::new();
        for (key, entry) in found {
            let url = key.key();
            let keep_soft = soft.filter(|s| {
                soft_urls.contains(url)
                    || (!hard_urls.contains(url) && soft_urls.len() < s.max_urls)
            });
            match keep_soft {
                Some(s) => {
                    soft_urls.insert(url.clone());
                    self.entries
                        .insert((*key).clone(), Arc::new(entry.soft_purged(now, s.until)));
                }
                None => {
                    hard_urls.insert(url.clone());
                    self.entries.invalidate(&*key);
                }
            }
        }
        // A removed URL forgets what it varied on; a softened one keeps it, so its
        // variants are still found.
        // With a tag, only the URLs whose responses carried it.
        let vary: Vec<Arc<FlightKey>> = self
            .vary
            .iter()
            .filter(|(k, _)| match tag {
                None => matches(k) && !soft_urls.contains(k.key()),
                Some(_) => k.tenant() == tenant && hard_urls.contains(k.key()),
            })
            .map(|(k, _)| k)
            .collect();
        for primary in vary {
            hard_urls.insert(primary.key().clone());
            self.invalidate_variants(&primary);
        }
        let mut purged = Purged {
            soft: soft_urls.into_iter().collect(),
            hard: hard_urls.into_iter().collect(),
        };
        purged.soft.sort();
        purged.hard.sort();
        purged
    }
}

/// Whether a stored response carries `tag`: one of the space-separated keys of its
/// `Surrogate-Key` (Fastly, Varnish xkey) or the comma-separated tags of its
/// `Cache-Tag` (Cloudflare, Akamai).
fn carries_tag(headers: &http::HeaderMap, tag: &str) -> bool {
    let values = |name: &'static str| {
        headers
            .get_all(name)
            .into_iter()
            .filter_map(|v| v.to_str().ok())
    };
    values("surrogate-key").any(|v| v.split_ascii_whitespace().any(|t| t == tag))
        || values("cache-tag").any(|v| v.split(',').any(|t| t.trim() == tag))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    use super::*;
    use crate::cache::Lookup;
    use crate::config::CacheConfig;

    fn store(cache: &L1Cache, tenant: &str, key: &str) -> FlightKey {
        store_with(cache, tenant, key, &[])
    }

    fn store_with(cache: &L1Cache, tenant: &str, key: &str, h: &[(&str, &str)]) -> FlightKey {
        let k = FlightKey::new(TenantId::new(tenant).unwrap(), CacheKey::new(key).unwrap());
        let mut headers = HeaderMap::new();
        for (name, value) in h {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let entry = super::super::Entry::new(
            StatusCode::OK,
            headers,
            Bytes::from_static(b"x"),
            Duration::from_secs(600),
            Duration::ZERO,
            Duration::from_millis(1),
            false,
        );
        cache.insert(k.clone(), entry);
        k
    }

    fn keys(list: &[&str]) -> Vec<CacheKey> {
        list.iter().map(|k| CacheKey::new(*k).unwrap()).collect()
    }

    /// Rule: a prefix purge removes the tenant's matching keys and nothing else: not
    /// the tenant's other keys, not another tenant's keys under the same prefix.
    #[test]
    fn a_prefix_purge_removes_only_the_tenants_matching_keys() {
        let cache = L1Cache::new(&CacheConfig::default());
        let a1 = store(&cache, "acme", "/assets/1.js");
        let a2 = store(&cache, "acme", "/assets/2.js?v=3");
        let other = store(&cache, "acme", "/asset.js");
        let theirs = store(&cache, "globex", "/assets/1.js");
        let acme = TenantId::new("acme").unwrap();
        let purged = cache.purge_prefix(&acme, "/assets/", None, None);
        assert_eq!(purged.hard, keys(&["/assets/1.js", "/assets/2.js?v=3"]));
        assert!(purged.soft.is_empty());
        assert!(matches!(cache.lookup(&a1), Lookup::Miss));
        assert!(matches!(cache.lookup(&a2), Lookup::Miss));
        assert!(cache.get_fresh(&other).is_some(), "outside the prefix");
        assert!(cache.get_fresh(&theirs).is_some(), "another tenant's");
    }

    /// A soft purge leaves the entries servable stale, marked as awaiting their
    /// re-warm, until its bound; past `max_urls`, URLs are removed.
    #[tokio::test(start_paused = true)]
    async fn a_soft_purge_marks_stale_until_its_bound() {
        let cache = L1Cache::new(&CacheConfig::default());
        let a = store(&cache, "acme", "/p/a");
        let b = store(&cache, "acme", "/p/b");
        let acme = TenantId::new("acme").unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let purged = cache.purge_prefix(&acme, "/p/", None, Some(SoftPurge { until, max_urls: 1 }));
        assert_eq!((purged.soft.len(), purged.hard.len()), (1, 1));
        let (soft, hard) = if purged.soft == keys(&["/p/a"]) {
            (a, b)
        } else {
            (b, a)
        };
        match cache.lookup(&soft) {
            Lookup::Stale(entry) => assert!(entry.awaits_rewarm()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(cache.lookup(&hard), Lookup::Miss));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(
            !matches!(cache.lookup(&soft), Lookup::Stale(_) | Lookup::Fresh { .. }),
            "past the bound it is no longer served"
        );
    }

    /// Rule: a tag purge removes the tenant's keys under the prefix whose responses
    /// carried the tag (`Surrogate-Key`, space-separated; `Cache-Tag`, comma-separated),
    /// and no other.
    #[test]
    fn a_tag_purge_removes_only_the_tagged_keys() {
        let cache = L1Cache::new(&CacheConfig::default());
        let a = store_with(
            &cache,
            "acme",
            "/p/a",
            &[("surrogate-key", "shoes product-42")],
        );
        let b = store_with(&cache, "acme", "/p/b", &[("cache-tag", "x, product-42")]);
        let c = store_with(&cache, "acme", "/p/c", &[("surrogate-key", "product-421")]);
        let d = store(&cache, "acme", "/p/d");
        let e = store_with(&cache, "globex", "/p/e", &[("surrogate-key", "product-42")]);
        let acme = TenantId::new("acme").unwrap();
        let purged = cache.purge_prefix(&acme, "/", Some("product-42"), None);
        assert_eq!(purged.hard, keys(&["/p/a", "/p/b"]));
        for gone in [&a, &b] {
            assert!(matches!(cache.lookup(gone), Lookup::Miss));
        }
        for kept in [&c, &d, &e] {
            assert!(cache.get_fresh(kept).is_some(), "{kept:?}");
        }
    }
}
