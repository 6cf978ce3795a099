//! The feature vector of one key at decision time ([`Features`], in the order the
//! model file lists them) and its extraction from the heat map's windows and the
//! tracker's history.

use models::{CacheKey, RegionId, TenantId};
use serde::{Deserialize, Serialize};

use super::pipeline::policy::{BURST_FACTOR, BURST_MIN_RPS};
use super::tracker::{TrackedKey, Tracker};
use crate::heat::{Window, WindowStats};

macro_rules! features {
    ($( $(#[$doc:meta])* $name:ident ),+ $(,)?) => {
        /// The features of one key at one instant. Raw values: the model applies its
        /// own transforms (see [`ScoringModel`](super::model::ScoringModel)).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
        pub struct Features {
            $( $(#[$doc])* pub $name: f64, )+
        }

        /// Feature names in model order; the model file lists the same names.
        pub(crate) const FEATURE_NAMES: [&str; FEATURE_COUNT] = [$(stringify!($name)),+];

        impl Features {
            /// The values in [`FEATURE_NAMES`] order.
            pub fn values(&self) -> [f64; FEATURE_COUNT] {
                [$(self.$name),+]
            }

            /// Builds a vector from values in [`FEATURE_NAMES`] order.
            pub fn from_values(values: [f64; FEATURE_COUNT]) -> Self {
                let [$($name),+] = values;
                Features { $($name),+ }
            }
        }
    };
}

/// How many features the model reads.
pub const FEATURE_COUNT: usize = 18;

features! {
    /// Requests per second for the key over the last 200 ms, all outcomes.
    velocity_200ms,
    /// Requests per second over the last 1 s.
    velocity_1s,
    /// Requests per second over the last 10 s.
    velocity_10s,
    /// `ln((1 + v200ms) / (1 + v10s))`: positive while demand accelerates.
    acceleration,
    /// Share of the last second's requests that found no fresh copy (miss, collapsed, stale).
    miss_share_1s,
    /// Share of the tenant's regions that asked for the key in the last 60 s (exact,
    /// from the tracker): how far it has spread, whatever the fleet's size.
    reached_share,
    /// Share of the tenant's regions that have not asked in the last 60 s: the ones a
    /// pre-warm would help.
    unseen_share,
    /// Regions whose first request came in the last 10 s (a second or more after pulse
    /// began tracking the key) and that have asked at least 5 times since: the key is
    /// spreading.
    new_regions_10s,
    /// Share of the key's requests (since tracking began) from its busiest node: near 1
    /// for a retry loop or a bot, small for a crowd.
    top_node_share,
    /// Distinct nodes that asked for the key since tracking began.
    nodes_asking,
    /// How many times this key burst before, in earlier minutes, at the same second of
    /// the minute (cron-like).
    phase_bursts_before,
    /// Share of the last 10 s of requests from the key's single most common referrer domain.
    referrer_top_share,
    /// Share of the last 10 s of requests from social or news referrer domains.
    referrer_social_share,
    /// Share from search engines: demand that each reader looks up on their own, as
    /// a crowd does in its one region, rather than a link passed on.
    referrer_search_share,
    /// Share from webmail and newsletter links: one mailing, read everywhere at once.
    referrer_mail_share,
    /// `referrer_top_share` minus that domain's share over the key's last 60 s (its
    /// baseline), or over the tenant's recent mix for a key without history.
    referrer_lift,
    /// Share of the tenant's regions in which the key's top referrer domain (last 10 s)
    /// referred any request lately (5-10 minutes, any tenant's keys): low for a local
    /// site, whose readers never spread the key elsewhere; 1 without a referrer.
    referrer_reach,
    /// The tenant's burstiness at this hour of the week: an EWMA of the bursts it had then.
    tenant_burstiness,
}

/// What kind of site sent a visitor: the classes whose share tells a link passed on
/// (social, mail) from demand looked up where it arose (search).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReferrerClass {
    /// A social network or a news aggregator.
    Social,
    /// A webmail reader or a newsletter's link.
    Mail,
    /// A search engine.
    Search,
    /// Anything else: the site itself, a local paper, a partner.
    Other,
}

/// Social networks and news aggregators, matched on the domain or any parent.
const SOCIAL_AND_NEWS: [&str; 15] = [
    "t.co",
    "x.com",
    "twitter.com",
    "facebook.com",
    "instagram.com",
    "reddit.com",
    "linkedin.com",
    "tiktok.com",
    "pinterest.com",
    "news.ycombinator.com",
    "news.google.com",
    "bsky.app",
    "threads.net",
    "youtube.com",
    "flipboard.com",
];

/// Webmail readers; a `newsletter.` host counts as mail too.
const MAIL: [&str; 6] = [
    "mail.google.com",
    "outlook.live.com",
    "outlook.office.com",
    "mail.yahoo.com",
    "mail.proton.me",
    "mail.aol.com",
];

/// Search engines (checked after the two lists above: `news.google.com` and
/// `mail.google.com` are not searches).
const SEARCH: [&str; 9] = [
    "google.com",
    "bing.com",
    "duckduckgo.com",
    "search.yahoo.com",
    "yandex.ru",
    "yandex.com",
    "baidu.com",
    "ecosia.org",
    "search.brave.com",
];

/// Whether `domain` is `parent` or a subdomain of it.
fn within(domain: &str, parent: &str) -> bool {
    domain == parent
        || domain
            .strip_suffix(parent)
            .is_some_and(|p| p.ends_with('.'))
}

/// The class of a referrer domain.
pub(crate) fn referrer_class(domain: &str) -> ReferrerClass {
    let any = |list: &[&str]| list.iter().any(|parent| within(domain, parent));
    if any(&SOCIAL_AND_NEWS) {
        ReferrerClass::Social
    } else if any(&MAIL) || domain.starts_with("newsletter.") {
        ReferrerClass::Mail
    } else if any(&SEARCH) {
        ReferrerClass::Search
    } else {
        ReferrerClass::Other
    }
}

/// Two bursts are "at the same phase" when their second of the minute is this close.
const PHASE_TOLERANCE_S: u64 = 2;
/// A key's own referrer baseline needs this many older requests; else the tenant's.
const MIN_BASELINE_REQUESTS: u32 = 20;

/// Whether a key whose last second ran `v1` requests per second is bursting, given its
/// minute's rate `v60`, asked for only when the last second is busy enough to matter
/// (most keys a tick looks at are not: it spares their minute's sixty buckets).
pub(crate) fn is_bursting(v1: f64, v60: impl FnOnce() -> f64) -> bool {
    v1 >= BURST_MIN_RPS && v1 >= BURST_FACTOR * v60().max(0.1)
}

/// The windows [`extract`] reads, in its order (the minute only decides whether a key
/// bursts, before extraction).
pub(crate) const FEATURE_WINDOWS: [Window; 3] = [Window::Ms200, Window::S1, Window::S10];

/// The features of one key and what the decision needs besides them.
pub(crate) struct Extracted {
    pub(crate) features: Features,
    /// Fleet regions that have not asked for the key in the last minute.
    pub(crate) unseen: Vec<RegionId>,
    /// The same regions as tracker ids, with their request counts so far.
    pub(crate) unseen_counts: Vec<(usize, u32)>,
    /// The tenant's regions (tracker ids) that asked for the key in the last minute.
    pub(crate) reached: Vec<usize>,
}

/// Computes the features of a tracked key at `now_ms`.
pub(crate) fn extract(
    windows: &[WindowStats; 3],
    tracker: &Tracker,
    tenant: &TenantId,
    key: &CacheKey,
    now_ms: u64,
) -> Option<Extracted> {
    let t = tracker.tenants.get(tenant)?;
    let k = t.keys.get(key)?;
    let [w200, w1, w10] = windows;
    let (v200, v1, v10) = (w200.velocity, w1.velocity, w10.velocity);

    // Exact region presence from the tracker (the sketch's region bits collide under
    // load), over the tenant's own regions (the fleet may be larger than the tenant's).
    let minute_ago = now_ms.saturating_sub(60_000);
    let mut tenant_regions = 0usize;
    let mut tenant_mask = 0u64;
    let mut unseen = Vec::new();
    let mut unseen_counts = Vec::new();
    let mut reached = Vec::new();
    for i in t.regions(now_ms) {
        tenant_regions += 1;
        tenant_mask |= 1 << i;
        if k.region_seen_since(i, minute_ago) {
            reached.push(i);
        } else {
            unseen.push(tracker.regions[i].clone());
            unseen_counts.push((i, k.region_count(i)));
        }
    }
    let share = |n: usize| {
        if tenant_regions == 0 {
            0.0
        } else {
            n as f64 / tenant_regions as f64
        }
    };

    let referrers = referrers(k, t, now_ms);
    // Unknown (no referrer, or a domain past a cap) counts as everywhere: no evidence
    // that the key's visitors are local.
    let referrer_reach = referrers
        .top
        .and_then(|domain| tracker.reach.regions(domain))
        .filter(|_| tenant_regions > 0)
        .map_or(1.0, |mask| {
            f64::from((mask & tenant_mask).count_ones()) / tenant_regions as f64
        });
    let features = Features {
        velocity_200ms: v200,
        velocity_1s: v1,
        velocity_10s: v10,
        acceleration: ((1.0 + v200) / (1.0 + v10)).ln(),
        miss_share_1s: if w1.demand == 0 {
            0.0
        } else {
            w1.misses as f64 / w1.demand as f64
        },
        reached_share: share(reached.len()),
        unseen_share: share(unseen.len()),
        new_regions_10s: k.regions_new_since(
            now_ms.saturating_sub(10_000),
            1_000,
            super::MIN_REGION_DEMAND,
        ) as f64,
        top_node_share: k.top_node_share(),
        nodes_asking: k.nodes.len() as f64,
        phase_bursts_before: phase_bursts_before(k, now_ms) as f64,
        referrer_top_share: referrers.top_share,
        referrer_social_share: referrers.social_share,
        referrer_search_share: referrers.search_share,
        referrer_mail_share: referrers.mail_share,
        referrer_lift: referrers.lift,
        referrer_reach,
        tenant_burstiness: t.burstiness(now_ms),
    };
    Some(Extracted {
        features,
        reached,
        unseen,
        unseen_counts,
    })
}

/// Earlier bursts of the key at the same second of the minute as the current one (or
/// as now, when it is not bursting): cron jobs fire on the minute.
fn phase_bursts_before(k: &TrackedKey, now_ms: u64) -> usize {
    let (reference, earlier) = match (k.in_burst, k.bursts.back()) {
        (true, Some(start)) => (*start, k.bursts.len() - 1),
        _ => (now_ms, k.bursts.len()),
    };
    let phase = |ms: u64| (ms / 1_000) % 60;
    let target = phase(reference);
    k.bursts
        .iter()
        .take(earlier)
        // A re-burst of the same wave within the minute is no schedule.
        .filter(|b| **b + 50_000 <= reference)
        .filter(|b| {
            let d = phase(**b).abs_diff(target);
            d.min(60 - d) <= PHASE_TOLERANCE_S
        })
        .count()
}

/// A key's referrers over the last 10 s.
#[derive(Default)]
struct Referrers<'t> {
    /// The most common domain.
    top: Option<&'t str>,
    /// Its share of the requests.
    top_share: f64,
    /// The shares from social or news domains, search engines and mail.
    social_share: f64,
    search_share: f64,
    mail_share: f64,
    /// `top_share` minus that domain's baseline share.
    lift: f64,
}

fn referrers<'t>(
    k: &TrackedKey,
    t: &'t super::tracker::TenantTracker,
    now_ms: u64,
) -> Referrers<'t> {
    let now_s = now_ms / 1_000;
    let (total, by_domain) = k.referrer_counts(now_s.saturating_sub(9), now_s);
    if total == 0 {
        return Referrers::default();
    }
    let Some((&top, &top_count)) = by_domain.iter().max_by_key(|(d, c)| (**c, u32::MAX - **d))
    else {
        return Referrers::default();
    };
    let top_share = top_count as f64 / total as f64;
    // Each domain classified once: (social, search, mail) requests.
    let (mut social, mut search, mut mail) = (0u32, 0u32, 0u32);
    for (d, c) in &by_domain {
        match t.domain_name(*d).map(referrer_class) {
            Some(ReferrerClass::Social) => social += c,
            Some(ReferrerClass::Search) => search += c,
            Some(ReferrerClass::Mail) => mail += c,
            Some(ReferrerClass::Other) | None => {}
        }
    }
    let share = |n: u32| n as f64 / total as f64;
    let (old_total, old) = k.referrer_counts(now_s.saturating_sub(59), now_s.saturating_sub(10));
    let baseline = if old_total >= MIN_BASELINE_REQUESTS {
        old.get(&top).copied().unwrap_or(0) as f64 / old_total as f64
    } else {
        t.domain_share(top)
    };
    Referrers {
        top: t.domain_name(top),
        top_share,
        social_share: share(social),
        search_share: share(search),
        mail_share: share(mail),
        lift: top_share - baseline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_share_one_order() {
        let values: [f64; FEATURE_COUNT] = std::array::from_fn(|i| i as f64);
        let features = Features::from_values(values);
        assert_eq!(features.values(), values);
        assert_eq!(features.acceleration, 3.0);
        assert_eq!(FEATURE_NAMES[3], "acceleration");
        assert!(
            !FEATURE_NAMES
                .iter()
                .any(|n| n.contains("hour") || n.contains("weekday")),
            "no calendar feature: generated traces would leak their start time"
        );
        assert_eq!(FEATURE_NAMES[FEATURE_COUNT - 1], "tenant_burstiness");
    }

    #[test]
    fn referrer_classes_match_on_parents_only() {
        use ReferrerClass::*;
        for (domain, class) in [
            ("t.co", Social),
            ("www.reddit.com", Social),
            ("old.reddit.com", Social),
            ("notreddit.com", Other),
            ("www.google.com", Search),
            ("google.com", Search),
            ("news.google.com", Social),
            ("mail.google.com", Mail),
            ("outlook.live.com", Mail),
            ("newsletter.shop.example", Mail),
            ("duckduckgo.com", Search),
            ("notgoogle.com", Other),
            ("www.shop.example", Other),
        ] {
            assert_eq!(referrer_class(domain), class, "{domain}");
        }
    }

    /// `referrer_reach`: the share of the tenant's regions the key's top referrer
    /// sent anyone from lately; 1 for a key without referrers.
    #[test]
    fn a_local_referrers_reach_is_its_share_of_the_tenants_regions() {
        use super::super::tracker::tests::event;
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        // Four regions serve the tenant; t.co refers visitors in three of them, the
        // local paper in one.
        for (i, region) in ["r0", "r1", "r2", "r3"].iter().enumerate() {
            let referrer = (i < 3).then_some("t.co");
            tracker.observe(&event(1_000, "/bg", region, referrer).borrowed());
        }
        tracker.observe(&event(1_000, "/bg", "r0", Some("news.r0.example")).borrowed());
        let keys: Vec<CacheKey> = ["/local", "/viral", "/plain"]
            .iter()
            .map(|k| k.parse().unwrap())
            .collect();
        tracker.track(&tenant, &keys, 1_000);
        for i in 0..10 {
            tracker.observe(&event(2_000 + i, "/local", "r0", Some("news.r0.example")).borrowed());
            tracker.observe(&event(2_000 + i, "/viral", "r0", Some("t.co")).borrowed());
            tracker.observe(&event(2_000 + i, "/plain", "r0", None).borrowed());
        }
        let quiet = |window| WindowStats {
            window,
            counts: Default::default(),
            total: 0,
            demand: 0,
            misses: 0,
            velocity: 0.0,
            miss_velocity: 0.0,
            miss_regions: Vec::new(),
            regions: Vec::new(),
        };
        let windows = FEATURE_WINDOWS.map(quiet);
        let reach = |key: &CacheKey| {
            extract(&windows, &tracker, &tenant, key, 2_500)
                .unwrap()
                .features
                .referrer_reach
        };
        assert_eq!(reach(&keys[0]), 0.25);
        assert_eq!(reach(&keys[1]), 0.75);
        assert_eq!(reach(&keys[2]), 1.0);
    }

    #[test]
    fn phase_counts_earlier_bursts_on_the_same_second() {
        let mut k = TrackedKey::default();
        // Bursts at :00, :01 and :30 of earlier minutes, one 2 s before the current one
        // (the same wave bursting again: no schedule), and one now at :59 of minute 9.
        for ms in [60_000, 121_000, 210_000, 597_000, 599_000] {
            k.bursts.push_back(ms);
        }
        k.in_burst = true;
        assert_eq!(phase_bursts_before(&k, 600_500), 2);
        k.in_burst = false;
        // At :00 of minute 10: the two of earlier minutes; the wave's own bursts are
        // within the minute.
        assert_eq!(phase_bursts_before(&k, 600_500), 2);
        assert_eq!(phase_bursts_before(&k, 659_500), 4);
    }
}
