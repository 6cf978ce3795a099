//! What a fill shares with the requests collapsed behind it: nothing per-user (a
//! `Set-Cookie` on a `304` revalidation or on an origin error reaches its leader
//! only), nothing of another variant (a `Vary` the leader's response brings is checked
//! for every joiner), and an origin error is never stored by default, so the next
//! wave refills.

mod common;

use common::{Rig, header, x_cache};
use http::StatusCode;
use prefetcher::testing::Scripted;

/// Requests in one wave.
const WAVE: usize = 12;

/// A `304` that carries `Set-Cookie` answers a revalidation: the leader gets its
/// cookie, no joiner gets it (each fetches on its own, as for a `200` with
/// `Set-Cookie`).
#[tokio::test]
async fn a_revalidation_304_with_set_cookie_reaches_only_its_leader() {
    let rig = Rig::start().await;
    rig.origin.script("/page", |headers, _| {
        if headers.contains_key("if-none-match") {
            Scripted::new(
                304,
                &[
                    ("etag", "\"v1\""),
                    ("cache-control", "max-age=0"),
                    ("set-cookie", "sid=leader"),
                ],
            )
        } else {
            Scripted::new(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")])
                .with_body("page")
        }
    });
    let first = rig.get("/page", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(header(&first, "set-cookie").is_none());
    rig.origin.hold();
    let handles = rig.spawn_gets("/page", &[], 4);
    rig.wait_waiters(3).await;
    rig.origin.release();
    let mut cookies = Vec::new();
    for h in handles {
        let r = h.await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), b"page");
        cookies.extend(r.headers.get_all("set-cookie").iter().cloned());
    }
    // The leader's revalidation, then one fetch of its own per joiner (the origin
    // answers those, unconditional, without a cookie).
    assert_eq!(
        cookies,
        ["sid=leader"],
        "the cookie reached only its leader"
    );
    assert_eq!(
        rig.fills("/page"),
        1 + 1 + 3,
        "each joiner fetched on its own"
    );
}

/// An origin `503` with `Set-Cookie`: the leader gets it as the origin sent it, the
/// joiners get the error without the cookie, and the origin sees one fill (a failing
/// origin is not asked once per joiner).
#[tokio::test]
async fn an_origin_error_with_set_cookie_reaches_joiners_without_the_cookie() {
    let rig = Rig::start().await;
    rig.origin.script("/down", |_, n| {
        Scripted::new(503, &[("set-cookie", &format!("sid=s{n}"))]).with_body("busy")
    });
    rig.origin.hold();
    let handles = rig.spawn_gets("/down", &[], 4);
    rig.wait_waiters(3).await;
    rig.origin.release();
    let mut cookies = Vec::new();
    for h in handles {
        let r = h.await.unwrap();
        assert!(r.status.is_server_error(), "{}", r.status);
        cookies.extend(
            r.headers
                .get_all("set-cookie")
                .iter()
                .map(|v| v.to_str().unwrap().to_string()),
        );
    }
    assert_eq!(cookies, ["sid=s0"], "the cookie reached only its leader");
    assert_eq!(rig.fills("/down"), 1);
}

/// The origin starts varying on `Accept-Language` while requests of two languages
/// are collapsed on a URL that varied on `Accept-Encoding` only: the `fr` joiner of
/// the `en` leader's flight is never served the `en` body.
#[tokio::test]
async fn a_joiner_is_served_a_varying_response_only_when_its_selecting_fields_match() {
    let rig = Rig::start().await;
    rig.origin.script("/home", |headers, n| {
        let lang = headers
            .get("accept-language")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string();
        let vary = if n == 0 {
            "accept-encoding"
        } else {
            "accept-encoding, accept-language"
        };
        Scripted::new(200, &[("cache-control", "max-age=60"), ("vary", vary)])
            .with_body(format!("body-{lang}"))
    });
    // The URL's `Vary` is learned (accept-encoding only) and a variant stored; the
    // next requests will not take it (`no-cache`), so they fill, collapsed.
    rig.get("/home", &[]).await;
    rig.origin.hold();
    let en = rig.spawn_gets(
        "/home",
        &[("accept-language", "en"), ("cache-control", "no-cache")],
        1,
    );
    rig.origin.wait_in_flight(1).await;
    let fr = rig.spawn_gets(
        "/home",
        &[("accept-language", "fr"), ("cache-control", "no-cache")],
        3,
    );
    rig.wait_waiters(3).await;
    rig.origin.release();
    for h in en {
        assert_eq!(h.await.unwrap().body.as_deref().unwrap(), b"body-en");
    }
    for h in fr {
        let r = h.await.unwrap();
        assert_eq!(r.body.as_deref().unwrap(), b"body-fr", "{}", x_cache(&r));
    }
}

/// The origin starts varying on `Accept-Language` in the `304` that revalidates an
/// entry stored without `Vary`: the `fr` joiners of the `en` leader's revalidation
/// are not served the entry the `en` request validated.
#[tokio::test]
async fn a_revalidation_that_starts_varying_is_shared_only_with_matching_joiners() {
    let rig = Rig::start().await;
    rig.origin.script("/doc", |headers, n| {
        let lang = headers
            .get("accept-language")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string();
        if n == 0 {
            return Scripted::new(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")])
                .with_body("unvaried");
        }
        let varied = [("cache-control", "max-age=60"), ("vary", "accept-language")];
        if lang == "en" && headers.contains_key("if-none-match") {
            Scripted::new(304, &[varied[0], varied[1], ("etag", "\"v1\"")])
        } else {
            Scripted::new(200, &[varied[0], varied[1], ("etag", "\"v2\"")])
                .with_body(format!("body-{lang}"))
        }
    });
    assert_eq!(rig.get("/doc", &[]).await.body.unwrap(), "unvaried");
    rig.origin.hold();
    let en = rig.spawn_gets("/doc", &[("accept-language", "en")], 1);
    rig.origin.wait_in_flight(1).await;
    let fr = rig.spawn_gets("/doc", &[("accept-language", "fr")], 3);
    rig.wait_waiters(3).await;
    rig.origin.release();
    for h in en {
        assert_eq!(h.await.unwrap().body.as_deref().unwrap(), b"unvaried");
    }
    for h in fr {
        let r = h.await.unwrap();
        assert_eq!(r.body.as_deref().unwrap(), b"body-fr", "{}", x_cache(&r));
    }
    // Each language is stored as its own variant now.
    let en = rig.get("/doc", &[("accept-language", "en")]).await;
    assert_eq!(
        (x_cache(&en), en.body.unwrap()),
        ("HIT".into(), "unvaried".into())
    );
    let fr = rig.get("/doc", &[("accept-language", "fr")]).await;
    assert_eq!(
        (x_cache(&fr), fr.body.unwrap()),
        ("HIT".into(), "body-fr".into())
    );
}

/// A `500` marked `public, max-age=60` goes to every waiter of its wave from one
/// fill and is not stored: the next wave makes one new fill and gets the origin's
/// `200`s.
#[tokio::test]
async fn an_origin_5xx_with_freshness_is_not_stored_and_the_next_wave_refills() {
    let rig = Rig::start().await;
    rig.origin.script("/flaky", |_, n| {
        if n == 0 {
            Scripted::new(500, &[("cache-control", "public, max-age=60")]).with_body("oops")
        } else {
            Scripted::new(200, &[("cache-control", "max-age=60")]).with_body("fine")
        }
    });
    for (wave, status, body) in [
        (1, StatusCode::INTERNAL_SERVER_ERROR, "oops"),
        (2, StatusCode::OK, "fine"),
    ] {
        rig.origin.hold();
        let handles = rig.spawn_gets("/flaky", &[], WAVE);
        rig.wait_waiters(((WAVE - 1) * wave) as u64).await;
        rig.origin.release();
        for h in handles {
            let r = h.await.unwrap();
            assert_eq!(r.status, status, "wave {wave}");
            assert_eq!(r.body.as_deref().unwrap(), body.as_bytes());
        }
        assert_eq!(rig.fills("/flaky"), wave, "one fill per wave");
    }
    assert_eq!(x_cache(&rig.get("/flaky", &[]).await), "HIT");
}

/// `caching.store_errors` on: an origin error with explicit freshness is stored as
/// the origin asks.
#[tokio::test]
async fn store_errors_honours_the_origins_freshness_on_a_5xx() {
    let rig = Rig::start_with(|c| c.cache.store_errors = true).await;
    rig.origin.script("/err", |_, _| {
        Scripted::new(500, &[("cache-control", "public, max-age=60")]).with_body("oops")
    });
    rig.get("/err", &[]).await;
    let second = rig.get("/err", &[]).await;
    assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(x_cache(&second), "HIT");
    assert_eq!(rig.fills("/err"), 1);
}

/// A URL just answered per-user: the next burst goes straight to the origin, each
/// request on its own at once (none waits on a leader whose answer it could not
/// share); once the URL answers shareably again, the next burst collapses.
#[tokio::test]
async fn a_burst_on_a_url_just_answered_per_user_goes_straight_to_the_origin() {
    let rig = Rig::start().await;
    rig.origin.script("/me", |_, n| {
        if n < 5 {
            Scripted::new(200, &[("cache-control", "private")]).with_body("mine")
        } else {
            Scripted::new(200, &[("cache-control", "max-age=0")]).with_body("ours")
        }
    });
    assert_eq!(rig.get("/me", &[]).await.body.as_deref().unwrap(), b"mine");
    let joined = || rig.node.node.metrics().waiters_joined.get();
    assert_eq!(joined(), 0);
    rig.origin.hold();
    let handles = rig.spawn_gets("/me", &[], 4);
    rig.origin.wait_in_flight(4).await;
    rig.origin.release();
    for h in handles {
        assert_eq!(h.await.unwrap().body.as_deref().unwrap(), b"mine");
    }
    assert_eq!(joined(), 0, "no request waited on a leader");
    assert_eq!(rig.fills("/me"), 5);

    assert_eq!(rig.get("/me", &[]).await.body.as_deref().unwrap(), b"ours");
    rig.origin.hold();
    let handles = rig.spawn_gets("/me", &[], 4);
    rig.wait_waiters(3).await;
    rig.origin.release();
    for h in handles {
        assert_eq!(h.await.unwrap().body.as_deref().unwrap(), b"ours");
    }
    assert_eq!(
        rig.fills("/me"),
        7,
        "shareable again: one fill for the burst"
    );
}
