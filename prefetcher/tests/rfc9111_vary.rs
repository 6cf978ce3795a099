//! RFC 9111 §4.1 (`Vary`): a stored response is reused only for requests whose
//! selecting header fields match; one fill per variant; `Vary: *` never matches.

mod common;

use common::{Rig, x_cache};
use models::{CacheKey, TenantId};
use prefetcher::PrewarmOutcome;
use prefetcher::testing::Scripted;

/// The origin answers with the request's `Accept-Encoding` in the body, and
/// `Vary: Accept-Encoding`.
fn negotiating(rig: &Rig, path: &str) {
    rig.origin.script(path, |req, _| {
        let ae = req
            .get("accept-encoding")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("vary", "Accept-Encoding"),
            ],
        )
        .with_body(format!("encoded for [{ae}]"))
    });
}

/// §4.1: each variant is stored and served only to requests that select it;
/// `Accept-Encoding` is normalised, so equivalent spellings share a variant.
#[tokio::test]
async fn s4_1_variants_are_selected_by_their_headers() {
    let rig = Rig::start().await;
    negotiating(&rig, "/v");
    let gzip = rig.get("/v", &[("accept-encoding", "gzip")]).await;
    let br = rig.get("/v", &[("accept-encoding", "br")]).await;
    assert_eq!(gzip.body.as_deref().unwrap(), b"encoded for [gzip]");
    assert_eq!(br.body.as_deref().unwrap(), b"encoded for [br]");
    let again = rig.get("/v", &[("accept-encoding", "gzip")]).await;
    assert_eq!(
        (x_cache(&again).as_str(), again.body.as_deref().unwrap()),
        ("HIT", &b"encoded for [gzip]"[..])
    );
    let none = rig.get("/v", &[]).await;
    assert_eq!(none.body.as_deref().unwrap(), b"encoded for []");
    assert_eq!(rig.fills("/v"), 3);
    // Same set of codings, other spelling: the same variant.
    rig.get("/v", &[("accept-encoding", "gzip, br")]).await;
    let same = rig
        .get("/v", &[("accept-encoding", "BR;q=0.9 , gzip, zstd;q=0")])
        .await;
    assert_eq!(x_cache(&same), "HIT");
    assert_eq!(rig.fills("/v"), 4);
}

/// §4.1: every `Vary` line counts, and each is a list.
#[tokio::test]
async fn s4_1_every_vary_line_is_read() {
    let rig = Rig::start().await;
    rig.origin.script("/m", |req, _| {
        let lang = req
            .get("accept-language")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("vary", "Accept-Encoding"),
                ("vary", "Accept, Accept-Language"),
            ],
        )
        .with_body(lang)
    });
    let en = rig.get("/m", &[("accept-language", "en")]).await;
    let fr = rig.get("/m", &[("accept-language", "fr")]).await;
    assert_eq!(en.body.as_deref().unwrap(), b"en");
    assert_eq!(fr.body.as_deref().unwrap(), b"fr");
    assert_eq!(rig.fills("/m"), 2);
    assert_eq!(
        x_cache(&rig.get("/m", &[("accept-language", "fr")]).await),
        "HIT"
    );
}

/// §4.1: `Vary: *` always fails to match: never stored.
#[tokio::test]
async fn s4_1_vary_star_is_never_reused() {
    let rig = Rig::start().await;
    rig.origin.script("/star", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600"), ("vary", "*")])
    });
    rig.get("/star", &[]).await;
    rig.get("/star", &[]).await;
    assert_eq!(rig.fills("/star"), 2);
}

/// Single flight per variant: concurrent requests of one variant share one fill,
/// and a request of another variant never gets it, even when it joined before the
/// URL's `Vary` was known.
#[tokio::test]
async fn one_fill_per_variant_under_concurrency() {
    let rig = Rig::start().await;
    negotiating(&rig, "/c");
    rig.origin.hold();
    let gzip = rig.spawn_gets("/c", &[("accept-encoding", "gzip")], 1);
    rig.wait_fills("/c", 1).await;
    let mut gzips = rig.spawn_gets("/c", &[("accept-encoding", "gzip")], 5);
    let brs = rig.spawn_gets("/c", &[("accept-encoding", "br")], 5);
    rig.wait_waiters(10).await;
    rig.origin.release();
    gzips.extend(gzip);
    for h in gzips {
        assert_eq!(h.await.unwrap().body.unwrap(), &b"encoded for [gzip]"[..]);
    }
    for h in brs {
        assert_eq!(h.await.unwrap().body.unwrap(), &b"encoded for [br]"[..]);
    }
    assert_eq!(rig.fills("/c"), 2, "one fill per variant");

    // Once the Vary is known, a wave of one variant collapses on its own flight.
    rig.origin.hold();
    let joined = rig.node.node.metrics().waiters_joined.get();
    let zstd = rig.spawn_gets("/c", &[("accept-encoding", "zstd")], 6);
    rig.wait_waiters(joined + 5).await;
    rig.origin.release();
    for h in zstd {
        assert_eq!(h.await.unwrap().body.unwrap(), &b"encoded for [zstd]"[..]);
    }
    assert_eq!(rig.fills("/c"), 3);
}

/// Memory stays bounded: past `cache.max_variants` the oldest variant of a URL goes.
#[tokio::test]
async fn variants_per_url_are_capped() {
    let rig = Rig::start_with(|c| c.cache.max_variants = 2).await;
    negotiating(&rig, "/cap");
    for ae in ["gzip", "br", "zstd"] {
        rig.get("/cap", &[("accept-encoding", ae)]).await;
    }
    assert_eq!(
        x_cache(&rig.get("/cap", &[("accept-encoding", "zstd")]).await),
        "HIT"
    );
    assert_eq!(
        x_cache(&rig.get("/cap", &[("accept-encoding", "br")]).await),
        "HIT"
    );
    assert_eq!(
        x_cache(&rig.get("/cap", &[("accept-encoding", "gzip")]).await),
        "MISS"
    );
}

/// A pre-warm fills the variant a plain `GET` (no preferences) selects.
#[tokio::test]
async fn a_prewarm_fills_the_plain_variant() {
    let rig = Rig::start().await;
    negotiating(&rig, "/p");
    rig.get("/p", &[("accept-encoding", "gzip")]).await;
    let tenant = TenantId::new("acme").unwrap();
    let outcome = rig
        .node
        .node
        .prewarm(&tenant, CacheKey::new("/p").unwrap())
        .unwrap();
    assert_eq!(outcome, PrewarmOutcome::Started);
    rig.settle().await;
    let plain = rig.get("/p", &[]).await;
    assert_eq!(x_cache(&plain), "PREFETCHED");
    assert_eq!(plain.body.as_deref().unwrap(), b"encoded for []");
    assert_eq!(rig.fills("/p"), 2);
}

/// The origin answers `Vary: {vary}` with `ETag: "<foo>"`, and the values of the
/// custom fields it varies on in the body: fields no standard names, which a fill
/// forwards by default as the client sent them.
fn varying_on(rig: &Rig, path: &str, vary: &'static str) {
    rig.origin.script(path, move |req, _| {
        let value = |n: &str| req.get(n).map_or("-", |v| v.to_str().unwrap()).to_string();
        let body = ["foo", "bar", "baz"].map(value).join(",");
        let etag = format!("\"{}\"", value("foo"));
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("vary", vary),
                ("etag", &etag),
            ],
        )
        .with_body(body)
    });
}

/// §4.1 with a field of the origin's own: omitted on both requests (a hit), omitted
/// on one (a miss each way), not matching (a miss), and each answer is the one the
/// origin gave for that value.
#[tokio::test]
async fn s4_1_a_custom_field_selects_omitted_or_not() {
    let rig = Rig::start().await;
    varying_on(&rig, "/omit", "Foo");
    rig.get("/omit", &[]).await;
    let both = rig.get("/omit", &[]).await;
    assert_eq!(x_cache(&both), "HIT", "omitted on both");
    let one = rig.get("/omit", &[("foo", "1")]).await;
    assert_eq!(x_cache(&one), "MISS", "omitted on the stored one only");
    assert_eq!(one.body.as_deref().unwrap(), b"1,-,-");
    let other = rig.get("/omit", &[("foo", "2")]).await;
    assert_eq!(x_cache(&other), "MISS", "not matching");
    assert_eq!(other.body.as_deref().unwrap(), b"2,-,-");
    let none = rig.get("/omit", &[]).await;
    assert_eq!(none.body.as_deref().unwrap(), b"-,-,-");
    assert_eq!(x_cache(&none), "HIT");
    assert_eq!(rig.fills("/omit"), 3);
    let sent = &rig.origin.received("/omit")[1].headers;
    assert_eq!(sent.get("foo").unwrap(), "1", "the fill forwards it");
}

/// §4.1: two and three selecting fields, the request sending them in another order
/// than `Vary` lists them: a hit; one differing or omitted: a miss.
#[tokio::test]
async fn s4_1_several_custom_fields_match_in_any_order() {
    let rig = Rig::start().await;
    varying_on(&rig, "/two", "Foo, Bar");
    rig.get("/two", &[("foo", "1"), ("bar", "a")]).await;
    let swapped = rig.get("/two", &[("bar", "a"), ("foo", "1")]).await;
    assert_eq!(x_cache(&swapped), "HIT");
    let differs = rig.get("/two", &[("bar", "b"), ("foo", "1")]).await;
    assert_eq!(x_cache(&differs), "MISS");
    assert_eq!(differs.body.as_deref().unwrap(), b"1,b,-");
    assert_eq!(rig.fills("/two"), 2);

    varying_on(&rig, "/three", "Foo, Bar, Baz");
    rig.get("/three", &[("foo", "1"), ("bar", "a"), ("baz", "x")])
        .await;
    let order = rig
        .get("/three", &[("baz", "x"), ("foo", "1"), ("bar", "a")])
        .await;
    assert_eq!(x_cache(&order), "HIT");
    let differs = rig
        .get("/three", &[("baz", "y"), ("foo", "1"), ("bar", "a")])
        .await;
    assert_eq!(x_cache(&differs), "MISS");
    assert_eq!(differs.body.as_deref().unwrap(), b"1,a,y");
    let omitted = rig.get("/three", &[("foo", "1"), ("bar", "a")]).await;
    assert_eq!(x_cache(&omitted), "MISS");
    assert_eq!(omitted.body.as_deref().unwrap(), b"1,a,-");
    assert_eq!(rig.fills("/three"), 3);
}

/// §4.1 with §4.3.2: a conditional request is answered `304` from the variant it
/// selects only; one of another variant is not validated against the stored one.
#[tokio::test]
async fn s4_1_a_conditional_request_is_validated_against_its_own_variant() {
    let rig = Rig::start().await;
    varying_on(&rig, "/cond", "Foo");
    rig.get("/cond", &[("foo", "1")]).await;
    let same = rig
        .get("/cond", &[("foo", "1"), ("if-none-match", "\"1\"")])
        .await;
    assert_eq!(same.status, 304);
    assert_eq!(x_cache(&same), "HIT");
    let other = rig
        .get("/cond", &[("foo", "2"), ("if-none-match", "\"1\"")])
        .await;
    assert_eq!(other.status, 200, "the foo=2 variant's ETag is \"2\"");
    assert_eq!(other.body.as_deref().unwrap(), b"2,-,-");
    assert_eq!(rig.fills("/cond"), 2);
}
