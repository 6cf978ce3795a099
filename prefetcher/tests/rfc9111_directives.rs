//! RFC 9111 §5.2 (Cache-Control), RFC 5861 (`stale-while-revalidate`,
//! `stale-if-error`) and RFC 9213 (targeted fields).

mod common;

use common::{Rig, x_cache};
use http::StatusCode;
use prefetcher::testing::Scripted;

/// §5.2.2.5: `no-store` is never stored.
#[tokio::test]
async fn s5_2_2_5_no_store_is_not_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/n", |_, _| {
        Scripted::new(200, &[("cache-control", "no-store, max-age=60")])
    });
    rig.get("/n", &[]).await;
    rig.get("/n", &[]).await;
    assert_eq!(rig.fills("/n"), 2);
}

/// §5.2.2.7: a shared cache never stores `private`.
#[tokio::test]
async fn s5_2_2_7_private_is_not_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/p", |_, _| {
        Scripted::new(200, &[("cache-control", "private, max-age=60")])
    });
    rig.get("/p", &[]).await;
    rig.get("/p", &[]).await;
    assert_eq!(rig.fills("/p"), 2);
}

/// §5.2.2.4: `no-cache` may be stored but is validated before every use.
#[tokio::test]
async fn s5_2_2_4_no_cache_is_revalidated_before_every_use() {
    let rig = Rig::start().await;
    rig.origin.script("/nc", |req, n| {
        if n > 0 && req.get("if-none-match").is_some_and(|v| v == "\"a\"") {
            Scripted::new(304, &[("etag", "\"a\"")])
        } else {
            Scripted::new(200, &[("cache-control", "no-cache"), ("etag", "\"a\"")])
        }
    });
    let first = rig.get("/nc", &[]).await;
    let second = rig.get("/nc", &[]).await;
    assert_eq!(rig.fills("/nc"), 2);
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body, first.body);
    let sent = rig.origin.received("/nc");
    assert_eq!(sent[1].headers.get("if-none-match").unwrap(), "\"a\"");
}

/// §4.2.4, §5.2.2.2, §5.2.2.8, §5.2.2.10: `must-revalidate`, `proxy-revalidate` and
/// `s-maxage` forbid serving stale, even with the config's grace window on.
#[tokio::test]
async fn s4_2_4_must_revalidate_proxy_revalidate_and_s_maxage_switch_off_grace() {
    let rig = Rig::start_with(|c| c.cache.stale_grace_ms = 600_000).await;
    for (path, cc) in [
        ("/mr", "max-age=10, must-revalidate"),
        ("/pr", "max-age=10, proxy-revalidate"),
        ("/sm", "s-maxage=10"),
    ] {
        rig.origin.script(path, move |_, _| {
            Scripted::new(200, &[("cache-control", cc), ("age", "20")])
        });
        rig.get(path, &[]).await;
        let second = rig.get(path, &[]).await;
        assert_ne!(x_cache(&second), "STALE", "{cc}");
        assert_eq!(rig.fills(path), 2, "{cc}");
    }
    // Without them the configured grace serves stale while one refresh runs.
    rig.origin.script("/ok", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=10"), ("age", "20")])
    });
    rig.get("/ok", &[]).await;
    assert_eq!(x_cache(&rig.get("/ok", &[]).await), "STALE");
}

/// RFC 5861 §3: `stale-while-revalidate` serves stale while one refresh runs.
#[tokio::test]
async fn rfc5861_s3_stale_while_revalidate() {
    let rig = Rig::start().await;
    rig.origin.script("/swr", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=10, stale-while-revalidate=600"),
                ("age", "20"),
            ],
        )
    });
    rig.get("/swr", &[]).await;
    assert_eq!(x_cache(&rig.get("/swr", &[]).await), "STALE");
    rig.wait_fills("/swr", 2).await;
}

/// RFC 5861 §4: `stale-if-error` serves the stored response instead of an origin
/// error; without it the origin's error goes through.
#[tokio::test]
async fn rfc5861_s4_stale_if_error() {
    let rig = Rig::start().await;
    rig.origin.script("/sie", |_, n| {
        if n == 0 {
            Scripted::new(
                200,
                &[
                    ("cache-control", "max-age=10, stale-if-error=600"),
                    ("age", "20"),
                ],
            )
            .with_body("stored")
        } else {
            Scripted::new(503, &[]).with_body("down")
        }
    });
    rig.get("/sie", &[]).await;
    let second = rig.get("/sie", &[]).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body.as_deref().unwrap(), b"stored");

    rig.origin.script("/plain", |_, n| {
        if n == 0 {
            Scripted::new(200, &[("cache-control", "max-age=10"), ("age", "20")])
        } else {
            Scripted::new(503, &[]).with_body("down")
        }
    });
    rig.get("/plain", &[]).await;
    let second = rig.get("/plain", &[]).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.body.as_deref().unwrap(), b"down");
}

/// §5.2.1.4: a request's `no-cache` (and §5.2.1.1 `max-age=0`) makes the cache
/// validate the stored response with the origin first.
#[tokio::test]
async fn s5_2_1_4_request_no_cache_and_max_age_0_validate_first() {
    let rig = Rig::start().await;
    rig.origin.script("/r", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600"), ("etag", "\"r\"")])
    });
    rig.get("/r", &[]).await;
    rig.get("/r", &[("cache-control", "no-cache")]).await;
    rig.get("/r", &[("cache-control", "max-age=0")]).await;
    rig.get("/r", &[("pragma", "no-cache")]).await;
    assert_eq!(rig.fills("/r"), 4);
    let sent = rig.origin.received("/r");
    assert!(
        sent[1..]
            .iter()
            .all(|r| r.headers.get("if-none-match").is_some())
    );
    assert_eq!(x_cache(&rig.get("/r", &[]).await), "HIT");
}

/// §5.2.1.7: `only-if-cached` answers from the cache or 504, never the origin.
#[tokio::test]
async fn s5_2_1_7_only_if_cached() {
    let rig = Rig::start().await;
    rig.origin.script("/o", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")])
    });
    let miss = rig.get("/o", &[("cache-control", "only-if-cached")]).await;
    assert_eq!(miss.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(rig.fills("/o"), 0);
    rig.get("/o", &[]).await;
    let hit = rig.get("/o", &[("cache-control", "only-if-cached")]).await;
    assert_eq!(
        (hit.status, x_cache(&hit).as_str()),
        (StatusCode::OK, "HIT")
    );
}

/// §5.2.1.5: a request's `no-store` stores nothing of the exchange.
#[tokio::test]
async fn s5_2_1_5_request_no_store() {
    let rig = Rig::start().await;
    rig.origin.script("/ns", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")])
    });
    rig.get("/ns", &[("cache-control", "no-store")]).await;
    assert_eq!(x_cache(&rig.get("/ns", &[]).await), "MISS");
    assert_eq!(rig.fills("/ns"), 2);
}

/// RFC 9213 §2: `CDN-Cache-Control`, and `Edge-Pulse-Cache-Control` targeted at this
/// cache, replace `Cache-Control` here.
#[tokio::test]
async fn rfc9213_targeted_fields_override_cache_control() {
    let rig = Rig::start().await;
    rig.origin.script("/cdn", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=600"),
            ],
        )
    });
    rig.get("/cdn", &[]).await;
    let hit = rig.get("/cdn", &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    // Forwarded as RFC 9213 allows, for a cache further down.
    assert_eq!(hit.headers.get("cdn-cache-control").unwrap(), "max-age=600");
    rig.origin.script("/ours", |_, _| {
        Scripted::new(
            200,
            &[
                ("cdn-cache-control", "no-store"),
                ("edge-pulse-cache-control", "max-age=600"),
            ],
        )
    });
    rig.get("/ours", &[]).await;
    assert_eq!(x_cache(&rig.get("/ours", &[]).await), "HIT");
    rig.origin.script("/off", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("edge-pulse-cache-control", "no-store"),
            ],
        )
    });
    rig.get("/off", &[]).await;
    rig.get("/off", &[]).await;
    assert_eq!(rig.fills("/off"), 2);
}

/// A response that sets a cookie is per-user here (a deliberate deviation).
#[tokio::test]
async fn set_cookie_responses_are_not_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/c", |_, _| {
        Scripted::new(
            200,
            &[("cache-control", "max-age=600"), ("set-cookie", "s=1")],
        )
    });
    rig.get("/c", &[]).await;
    rig.get("/c", &[]).await;
    assert_eq!(rig.fills("/c"), 2);
}

/// §5.2.1.1 and §5.2.1.3: a request's `max-age` refuses an older stored response,
/// its `min-fresh` one that will not stay fresh long enough; both go to the origin.
#[tokio::test]
async fn s5_2_1_1_request_max_age_and_s5_2_1_3_min_fresh() {
    let rig = Rig::start().await;
    rig.origin.script("/a", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600"), ("age", "100")])
    });
    rig.get("/a", &[]).await;
    assert_eq!(
        x_cache(&rig.get("/a", &[("cache-control", "max-age=300")]).await),
        "HIT"
    );
    rig.get("/a", &[("cache-control", "max-age=50")]).await;
    assert_eq!(rig.fills("/a"), 2, "older than the client accepts");
    assert_eq!(
        x_cache(&rig.get("/a", &[("cache-control", "min-fresh=10")]).await),
        "HIT"
    );
    rig.get("/a", &[("cache-control", "min-fresh=10000")]).await;
    assert_eq!(rig.fills("/a"), 3, "not fresh long enough");
}
