//! RFC 9111 §4.3 (validation) and RFC 9110 §13 (conditional requests): stale entries
//! are revalidated with their validators, a `304` is merged into the stored response,
//! clients' conditionals are answered from the cache, revalidations collapse.

mod common;

use common::{Rig, header, x_cache};
use http::StatusCode;
use prefetcher::testing::Scripted;

/// §4.3.1: a stale entry with an `ETag` is validated with `If-None-Match`, one with
/// `Last-Modified` with `If-Modified-Since`.
#[tokio::test]
async fn s4_3_1_validation_sends_the_stored_validators() {
    let rig = Rig::start().await;
    rig.origin.script("/etag", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=0"), ("etag", "\"v1\"")])
    });
    rig.get("/etag", &[]).await;
    rig.get("/etag", &[]).await;
    let sent = rig.origin.received("/etag");
    assert_eq!(sent.len(), 2);
    assert!(sent[0].headers.get("if-none-match").is_none());
    assert_eq!(sent[1].headers.get("if-none-match").unwrap(), "\"v1\"");

    let lm = "Sun, 06 Nov 1994 08:49:37 GMT";
    rig.origin.script("/lm", move |_, _| {
        Scripted::new(
            200,
            &[("cache-control", "max-age=0"), ("last-modified", lm)],
        )
    });
    rig.get("/lm", &[]).await;
    rig.get("/lm", &[]).await;
    let sent = rig.origin.received("/lm");
    assert_eq!(sent[1].headers.get("if-modified-since").unwrap(), lm);
}

/// §4.3.4: a `304` freshens the stored response; its fields replace the stored ones
/// and the body is the stored one; the updated response is then served fresh.
#[tokio::test]
async fn s4_3_4_a_304_updates_the_stored_response() {
    let rig = Rig::start().await;
    rig.origin.script("/u", |req, n| {
        if n == 0 {
            Scripted::new(
                200,
                &[
                    ("cache-control", "max-age=0"),
                    ("etag", "\"v1\""),
                    ("x-version", "1"),
                ],
            )
            .with_body("the body")
        } else {
            assert_eq!(req.get("if-none-match").unwrap(), "\"v1\"");
            Scripted::new(
                304,
                &[
                    ("cache-control", "max-age=600"),
                    ("etag", "\"v1\""),
                    ("x-version", "2"),
                ],
            )
        }
    });
    rig.get("/u", &[]).await;
    let revalidated = rig.get("/u", &[]).await;
    assert_eq!(revalidated.status, StatusCode::OK);
    assert_eq!(revalidated.body.as_deref().unwrap(), b"the body");
    assert_eq!(header(&revalidated, "x-version"), Some("2"));
    assert_eq!(header(&revalidated, "content-length"), Some("8"));
    let hit = rig.get("/u", &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(header(&hit, "x-version"), Some("2"));
    assert_eq!(header(&hit, "cache-control"), Some("max-age=600"));
    assert_eq!(rig.fills("/u"), 2);
}

/// §4.3.2 and RFC 9110 §13.2.2: a client's `If-None-Match` (weak comparison, `*`)
/// and, without it, `If-Modified-Since` are answered `304` from a fresh entry.
#[tokio::test]
async fn s4_3_2_client_conditionals_are_answered_from_the_cache() {
    let rig = Rig::start().await;
    let lm = "Sun, 06 Nov 1994 08:49:37 GMT";
    rig.origin.script("/c", move |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("etag", "\"c\""),
                ("last-modified", lm),
            ],
        )
    });
    rig.get("/c", &[]).await;
    for h in [
        ("if-none-match", "\"x\", W/\"c\""),
        ("if-none-match", "*"),
        ("if-modified-since", lm),
    ] {
        let r = rig.get("/c", &[h]).await;
        assert_eq!(r.status, StatusCode::NOT_MODIFIED, "{h:?}");
        assert!(r.body.as_ref().unwrap().is_empty());
        assert_eq!(header(&r, "etag"), Some("\"c\""));
        assert_eq!(header(&r, "cache-control"), Some("max-age=600"));
    }
    for h in [
        ("if-none-match", "\"other\""),
        ("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT"),
    ] {
        let r = rig.get("/c", &[h]).await;
        assert_eq!(r.status, StatusCode::OK, "{h:?}");
    }
    // If-None-Match decides alone when present (RFC 9110 §13.2.2).
    let r = rig
        .get(
            "/c",
            &[("if-none-match", "\"other\""), ("if-modified-since", lm)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(rig.fills("/c"), 1, "all from the cache");
    // The client's validators never reach the origin on a fill.
    assert!(
        rig.origin.received("/c")[0]
            .headers
            .get("if-none-match")
            .is_none()
    );
}

/// Revalidations collapse like fills: one conditional request for many clients.
#[tokio::test]
async fn revalidations_are_collapsed() {
    let rig = Rig::start().await;
    rig.origin.script("/k", |req, _| {
        if req.get("if-none-match").is_some() {
            Scripted::new(304, &[("cache-control", "max-age=0"), ("etag", "\"k\"")])
        } else {
            Scripted::new(200, &[("cache-control", "max-age=0"), ("etag", "\"k\"")])
        }
    });
    rig.get("/k", &[]).await;
    rig.origin.hold();
    let handles = rig.spawn_gets("/k", &[], 10);
    rig.wait_waiters(9).await;
    rig.origin.release();
    for h in handles {
        let r = h.await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.body.unwrap(),
            prefetcher::testing::SyntheticOrigin::body_for("origin", "/k", 1024)
        );
    }
    assert_eq!(rig.fills("/k"), 2, "one fill, one revalidation");
}
