//! RFC 9111 §4.2 (freshness): the lifetime comes from `s-maxage`, `max-age`, `Expires`
//! (with `Date`), else a heuristic only where §4.2.2 allows it; the configured
//! default TTL applies only where the origin is silent and is off by default.

mod common;

use common::{Rig, date, x_cache};
use prefetcher::testing::Scripted;

/// §4.2.1: `max-age` makes the response fresh; a second request is a hit.
#[tokio::test]
async fn s4_2_1_max_age_gives_a_freshness_lifetime() {
    let rig = Rig::start().await;
    rig.origin.script("/m", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=100")])
    });
    assert_eq!(x_cache(&rig.get("/m", &[]).await), "MISS");
    assert_eq!(x_cache(&rig.get("/m", &[]).await), "HIT");
    assert_eq!(rig.fills("/m"), 1);
}

/// §4.2.1: a shared cache uses `s-maxage` over `max-age`.
#[tokio::test]
async fn s4_2_1_s_maxage_wins_over_max_age() {
    let rig = Rig::start().await;
    rig.origin.script("/s", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=0, s-maxage=100")])
    });
    rig.get("/s", &[]).await;
    assert_eq!(x_cache(&rig.get("/s", &[]).await), "HIT");
    rig.origin.script("/s0", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=100, s-maxage=0")])
    });
    rig.get("/s0", &[]).await;
    rig.get("/s0", &[]).await;
    assert_eq!(rig.fills("/s0"), 2, "s-maxage=0 is stale at once");
}

/// §4.2.1: without `max-age`, `Expires` minus `Date` is the lifetime; an `Expires`
/// not after `Date`, or invalid (§5.3), means already stale.
#[tokio::test]
async fn s4_2_1_expires_minus_date() {
    let rig = Rig::start().await;
    rig.origin.script("/e", |_, _| {
        Scripted::new(200, &[("date", &date(0)), ("expires", &date(100))])
    });
    rig.get("/e", &[]).await;
    assert_eq!(x_cache(&rig.get("/e", &[]).await), "HIT");
    rig.origin.script("/past", |_, _| {
        Scripted::new(200, &[("date", &date(0)), ("expires", &date(-100))])
    });
    rig.get("/past", &[]).await;
    rig.get("/past", &[]).await;
    assert_eq!(rig.fills("/past"), 2);
    rig.origin
        .script("/bad", |_, _| Scripted::new(200, &[("expires", "0")]));
    rig.get("/bad", &[]).await;
    rig.get("/bad", &[]).await;
    assert_eq!(
        rig.fills("/bad"),
        2,
        "§5.3: an invalid Expires is in the past"
    );
}

/// §4.2.1: `max-age` overrides `Expires`.
#[tokio::test]
async fn s4_2_1_max_age_overrides_expires() {
    let rig = Rig::start().await;
    rig.origin.script("/o", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=0"),
                ("date", &date(0)),
                ("expires", &date(1000)),
            ],
        )
    });
    rig.get("/o", &[]).await;
    rig.get("/o", &[]).await;
    assert_eq!(rig.fills("/o"), 2);
}

/// §4.2.2: a response without explicit freshness and with `Last-Modified` gets a
/// heuristic lifetime (10 % of its age) when its status is heuristically cacheable.
#[tokio::test]
async fn s4_2_2_heuristic_freshness_from_last_modified() {
    let rig = Rig::start().await;
    rig.origin.script("/h", |_, _| {
        Scripted::new(
            200,
            &[("date", &date(0)), ("last-modified", &date(-86_400))],
        )
    });
    rig.get("/h", &[]).await;
    assert_eq!(x_cache(&rig.get("/h", &[]).await), "HIT");
    assert_eq!(rig.fills("/h"), 1);
}

/// §4.2.2: no heuristic for a status that is not heuristically cacheable (302).
#[tokio::test]
async fn s4_2_2_no_heuristic_for_a_302() {
    let rig = Rig::start().await;
    rig.origin.script("/r", |_, _| {
        Scripted::new(
            302,
            &[
                ("location", "/x"),
                ("date", &date(0)),
                ("last-modified", &date(-86_400)),
            ],
        )
    });
    rig.get("/r", &[]).await;
    rig.get("/r", &[]).await;
    assert_eq!(rig.fills("/r"), 2);
}

/// By default a silent origin's response (no freshness, no validator) is not stored;
/// an operator who wants a lifetime for it sets `cache.default_ttl_ms`.
#[tokio::test]
async fn a_silent_origin_is_not_cached_unless_the_config_says_so() {
    let rig = Rig::start().await;
    rig.origin.script("/q", |_, _| Scripted::new(200, &[]));
    rig.get("/q", &[]).await;
    assert_eq!(x_cache(&rig.get("/q", &[]).await), "MISS");
    assert_eq!(rig.fills("/q"), 2);

    let rig = Rig::start_with(|c| c.cache.default_ttl_ms = 60_000).await;
    rig.origin.script("/q", |_, _| Scripted::new(200, &[]));
    rig.get("/q", &[]).await;
    assert_eq!(x_cache(&rig.get("/q", &[]).await), "HIT");
    // The default never overrides what the origin says.
    rig.origin.script("/z", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=0")])
    });
    rig.get("/z", &[]).await;
    rig.get("/z", &[]).await;
    assert_eq!(rig.fills("/z"), 2);
}
