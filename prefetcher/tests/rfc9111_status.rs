//! RFC 9111 §3 and RFC 9110 §15 (status codes): what is stored by status, the
//! origin's 5xx passed to every waiter and never stored, transport failures as
//! 502/504.

mod common;

use common::{Rig, x_cache};
use http::StatusCode;
use prefetcher::testing::Scripted;

/// §3, RFC 9110 §15.1: heuristically cacheable statuses with explicit freshness are
/// stored (404, 410, 301); a 302 needs explicit freshness.
#[tokio::test]
async fn s3_statuses_stored_with_explicit_freshness() {
    let rig = Rig::start().await;
    for (path, status) in [("/404", 404), ("/410", 410), ("/301", 301), ("/302", 302)] {
        rig.origin.script(path, move |_, _| {
            Scripted::new(
                status,
                &[("cache-control", "max-age=600"), ("location", "/x")],
            )
        });
        rig.get(path, &[]).await;
        let second = rig.get(path, &[]).await;
        assert_eq!(second.status.as_u16(), status);
        assert_eq!(x_cache(&second), "HIT", "{status}");
    }
    rig.origin
        .script("/302bare", |_, _| Scripted::new(302, &[("location", "/x")]));
    rig.get("/302bare", &[]).await;
    rig.get("/302bare", &[]).await;
    assert_eq!(rig.fills("/302bare"), 2);
}

/// The origin's own 5xx (status and body) reaches every collapsed waiter and is
/// never stored, whatever its `Cache-Control`.
#[tokio::test]
async fn an_origin_5xx_goes_to_every_waiter_and_is_never_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/down", |_, _| {
        Scripted::new(
            503,
            &[("cache-control", "max-age=600"), ("retry-after", "7")],
        )
        .with_body("maintenance")
    });
    rig.origin.hold();
    let handles = rig.spawn_gets("/down", &[], 8);
    rig.wait_waiters(7).await;
    rig.origin.release();
    for h in handles {
        let r = h.await.unwrap();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.body.as_deref().unwrap(), b"maintenance");
        assert_eq!(r.headers.get("retry-after").unwrap(), "7");
    }
    assert_eq!(rig.fills("/down"), 1);
    rig.get("/down", &[]).await;
    assert_eq!(rig.fills("/down"), 2, "not stored");
}

/// A transport failure is ours to report: 502 (unreachable) with `no-store`.
#[tokio::test]
async fn a_transport_failure_is_a_502() {
    let rig = Rig::start_with(|c| c.tenants[0].origin = "http://127.0.0.1:9".into()).await;
    let r = rig.get("/x", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.headers.get("cache-control").unwrap(), "no-store");
}

/// A `206` is not stored from a full `GET` fill (ranges are served elsewhere).
#[tokio::test]
async fn a_206_is_not_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/part", |_, _| {
        Scripted::new(
            206,
            &[
                ("cache-control", "max-age=600"),
                ("content-range", "bytes 0-0/9"),
            ],
        )
        .with_body("x")
    });
    rig.get("/part", &[]).await;
    rig.get("/part", &[]).await;
    assert_eq!(rig.fills("/part"), 2);
}
