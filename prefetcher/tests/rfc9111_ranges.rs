//! Range requests (RFC 9110 §14) under the RFC 9111 rules: a range selects its variant
//! like any `GET` (§4.1), is cut from a revalidated entry (§4.3), never from a stale
//! one before it is revalidated, and a client's matching conditional gets its `304`
//! before `If-Range` and `Range` are looked at (RFC 9110 §13.2.2).

mod common;

use common::{Rig, header, x_cache};
use http::StatusCode;
use prefetcher::testing::Scripted;

/// §4.1: a range is cut from the variant its request selects, from the cache or from
/// the variant's own fill.
#[tokio::test]
async fn s4_1_a_range_is_cut_from_the_variant_it_selects() {
    let rig = Rig::start().await;
    rig.origin.script("/v", |req, _| {
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
        .with_body(format!("[{ae}] body"))
    });
    rig.get("/v", &[("accept-encoding", "gzip")]).await;
    rig.get("/v", &[]).await;
    assert_eq!(rig.fills("/v"), 2);

    let gzip = rig
        .get("/v", &[("accept-encoding", "gzip"), ("range", "bytes=0-5")])
        .await;
    assert_eq!(gzip.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(x_cache(&gzip), "HIT");
    assert_eq!(gzip.body.as_deref().unwrap(), b"[gzip]");
    assert_eq!(header(&gzip, "content-range"), Some("bytes 0-5/11"));
    let identity = rig.get("/v", &[("range", "bytes=0-1")]).await;
    assert_eq!(identity.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(x_cache(&identity), "HIT");
    assert_eq!(identity.body.as_deref().unwrap(), b"[]");
    assert_eq!(rig.fills("/v"), 2);

    // A variant not stored yet: its own fill (without `Range`), the range cut from it.
    let br = rig
        .get("/v", &[("accept-encoding", "br"), ("range", "bytes=-4")])
        .await;
    assert_eq!(br.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(x_cache(&br), "MISS");
    assert_eq!(br.body.as_deref().unwrap(), b"body");
    assert_eq!(rig.fills("/v"), 3);
    let sent = &rig.origin.received("/v")[2];
    assert_eq!(sent.headers.get("accept-encoding").unwrap(), "br");
    assert!(sent.headers.get("range").is_none());
    let whole = rig.get("/v", &[("accept-encoding", "br")]).await;
    assert_eq!(x_cache(&whole), "HIT");
    assert_eq!(whole.body.as_deref().unwrap(), b"[br] body");
}

/// §4.3.4: a range of an expired entry revalidates it (with its validators, without
/// the `Range`); the `206` is cut from the entry the `304` refreshed, which then
/// serves ranges from the cache and still advertises them.
#[tokio::test]
async fn s4_3_4_a_range_is_cut_from_the_revalidated_entry() {
    let rig = Rig::start().await;
    rig.origin.script("/r", |_, n| {
        if n == 0 {
            Scripted::new(200, &[("cache-control", "max-age=0"), ("etag", "\"v1\"")])
                .with_body("0123456789")
        } else {
            Scripted::new(304, &[("cache-control", "max-age=600"), ("etag", "\"v1\"")])
        }
    });
    rig.get("/r", &[]).await;
    let first = rig.get("/r", &[("range", "bytes=2-4")]).await;
    assert_eq!(first.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(first.body.as_deref().unwrap(), b"234");
    assert_eq!(header(&first, "content-range"), Some("bytes 2-4/10"));
    let sent = rig.origin.received("/r");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].headers.get("if-none-match").unwrap(), "\"v1\"");
    assert!(sent[1].headers.get("range").is_none());

    let hit = rig.get("/r", &[("range", "bytes=5-6")]).await;
    assert_eq!(hit.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.body.as_deref().unwrap(), b"56");
    let whole = rig.get("/r", &[]).await;
    assert_eq!(header(&whole, "accept-ranges"), Some("bytes"));
    assert_eq!(rig.fills("/r"), 2);
}

/// §4.2.4 with RFC 5861: where a plain request is served stale while the entry is
/// refreshed, a range request waits for the revalidation and is cut from its answer,
/// so its bytes never come from a representation the origin has replaced.
#[tokio::test]
async fn s4_2_4_a_range_of_a_stale_entry_is_cut_after_revalidation() {
    let rig = Rig::start().await;
    rig.origin.script("/s", |_, n| {
        if n == 0 {
            Scripted::new(
                200,
                &[
                    ("cache-control", "max-age=0, stale-while-revalidate=600"),
                    ("etag", "\"v1\""),
                ],
            )
            .with_body("abcdefghij")
        } else {
            Scripted::new(200, &[("cache-control", "max-age=600"), ("etag", "\"v2\"")])
                .with_body("ABCDEFGHIJ")
        }
    });
    rig.get("/s", &[]).await;
    let range = rig.get("/s", &[("range", "bytes=0-2")]).await;
    assert_eq!(range.status, StatusCode::PARTIAL_CONTENT);
    assert_ne!(x_cache(&range), "STALE");
    assert_eq!(range.body.as_deref().unwrap(), b"ABC");
    assert_eq!(header(&range, "etag"), Some("\"v2\""));
    let sent = rig.origin.received("/s");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].headers.get("if-none-match").unwrap(), "\"v1\"");
    let hit = rig.get("/s", &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.body.as_deref().unwrap(), b"ABCDEFGHIJ");
}

/// RFC 9110 §13.2.2 on a stale entry: a matching `If-None-Match` is answered `304`
/// from it (with the refresh in the background), as without a `Range`.
#[tokio::test]
async fn rfc9110_s13_2_2_a_stale_entry_answers_a_matching_conditional_range_with_304() {
    let rig = Rig::start().await;
    rig.origin.script("/sc", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=0, stale-while-revalidate=600"),
                ("etag", "\"v1\""),
            ],
        )
        .with_body("abcdefghij")
    });
    rig.get("/sc", &[]).await;
    let matching = rig
        .get(
            "/sc",
            &[("if-none-match", "\"v1\""), ("range", "bytes=0-2")],
        )
        .await;
    assert_eq!(matching.status, StatusCode::NOT_MODIFIED);
    assert_eq!(x_cache(&matching), "STALE");
    rig.settle().await;
}

/// RFC 9110 §13.2.2: `If-None-Match` is evaluated before `Range`: a match is a `304`
/// (not a `206`), a mismatch lets the range be served.
#[tokio::test]
async fn rfc9110_s13_2_2_a_304_wins_over_a_206() {
    let rig = Rig::start().await;
    rig.origin.script("/c", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600"), ("etag", "\"v1\"")])
            .with_body("0123456789")
    });
    rig.get("/c", &[]).await;
    let matching = rig
        .get("/c", &[("if-none-match", "\"v1\""), ("range", "bytes=0-1")])
        .await;
    assert_eq!(matching.status, StatusCode::NOT_MODIFIED);
    assert_eq!(x_cache(&matching), "HIT");
    assert!(matching.body.as_deref().unwrap().is_empty());
    let other = rig
        .get("/c", &[("if-none-match", "\"v0\""), ("range", "bytes=0-1")])
        .await;
    assert_eq!(other.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(other.body.as_deref().unwrap(), b"01");
    assert_eq!(rig.fills("/c"), 1);
}
