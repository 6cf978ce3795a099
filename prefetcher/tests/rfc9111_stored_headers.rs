//! RFC 9111 §3.1 (storing header fields), RFC 9110 §7.6 (forwarding: hop-by-hop
//! fields, `Via`, the request a fill sends), §9.3.2 (`HEAD` from a stored `GET`),
//! and cache poisoning: unkeyed header tricks and a `GET` with a body.

mod common;

use common::{HOST, Rig, header, x_cache};
use http::{Method, StatusCode};
use prefetcher::testing::Scripted;

/// §3.1: hop-by-hop fields and those named in `Connection` are neither stored nor
/// forwarded downstream; responses name this hop in `Via`.
#[tokio::test]
async fn s3_1_connection_listed_fields_are_not_stored_or_forwarded() {
    let rig = Rig::start().await;
    rig.origin.script("/h", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=600"),
                ("connection", "x-internal"),
                ("x-internal", "secret"),
                ("x-public", "ok"),
            ],
        )
    });
    let miss = rig.get("/h", &[]).await;
    let hit = rig.get("/h", &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    for r in [&miss, &hit] {
        assert!(r.headers.get("x-internal").is_none(), "{:?}", r.headers);
        assert_eq!(header(r, "x-public"), Some("ok"));
        // RFC 9110 §7.6.3: this hop is in `Via`, once.
        let via: Vec<_> = r.headers.get_all("via").iter().collect();
        assert_eq!(via, ["1.1 edge-pulse"]);
    }
    let stored = rig
        .node
        .node
        .cache()
        .get_fresh(&prefetcher::FlightKey::new(
            models::TenantId::new("acme").unwrap(),
            models::CacheKey::new("/h").unwrap(),
        ))
        .unwrap();
    assert!(stored.headers.get("x-internal").is_none());
}

/// RFC 9110 §7.6: the fill request carries the client's end-to-end fields, not its
/// hop-by-hop or `Connection`-listed ones, with `Via`, `X-Forwarded-For` (the peer
/// the node saw: a client's own claim is appended to only from a trusted proxy),
/// `X-Forwarded-Proto` and the tenant's `Host`.
#[tokio::test]
async fn rfc9110_s7_6_the_fill_request_is_forwarded_as_a_proxy_should() {
    let rig = Rig::start().await;
    rig.origin.script("/f", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")])
    });
    rig.get(
        "/f",
        &[
            ("accept-language", "de"),
            ("user-agent", "test-agent"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-forwarded-for", "203.0.113.9"),
        ],
    )
    .await;
    let sent = &rig.origin.received("/f")[0];
    assert_eq!(sent.method, Method::GET);
    let h = &sent.headers;
    assert_eq!(h.get("accept-language").unwrap(), "de");
    assert_eq!(h.get("user-agent").unwrap(), "test-agent");
    assert!(h.get("x-hop").is_none());
    assert!(
        h.get("via")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("edge-pulse")
    );
    assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.1");
    assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
    assert_eq!(
        h.get("host").unwrap().to_str().unwrap(),
        rig.origin.url().trim_start_matches("http://")
    );
}

/// RFC 9110 §9.3.2: `HEAD` is answered from a stored `GET`; a `HEAD` miss fills with
/// a `GET` and stores it.
#[tokio::test]
async fn rfc9110_s9_3_2_head_is_answered_from_a_stored_get() {
    let rig = Rig::start().await;
    rig.origin.script("/g", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")])
    });
    let head = rig.request(Method::HEAD, "/g", &[]).await;
    assert!(head.body.unwrap().is_empty());
    assert_eq!(rig.origin.received("/g")[0].method, Method::GET);
    let get = rig.get("/g", &[]).await;
    assert_eq!(x_cache(&get), "HIT");
    let head = rig.request(Method::HEAD, "/g", &[]).await;
    assert_eq!(x_cache(&head), "HIT");
    assert_eq!(header(&head, "content-length"), Some("1024"));
    assert_eq!(rig.fills("/g"), 1);
}

/// Cache poisoning: headers that rewrite the host, scheme or URL at an origin are
/// not part of the key, so they are never sent upstream, and the `Host` a client
/// sends never chooses the origin.
#[tokio::test]
async fn unkeyed_rewrite_headers_never_reach_the_origin() {
    let rig = Rig::start().await;
    rig.origin.script("/home", |req, _| {
        // An origin that reflects them, as vulnerable applications do.
        let reflected: Vec<String> = [
            "x-forwarded-host",
            "x-forwarded-scheme",
            "x-original-url",
            "x-rewrite-url",
            "forwarded",
            "x-http-method-override",
        ]
        .iter()
        .filter_map(|n| req.get(*n).map(|v| format!("{n}={}", v.to_str().unwrap())))
        .collect();
        Scripted::new(200, &[("cache-control", "max-age=600")]).with_body(reflected.join(";"))
    });
    let poisoned = rig
        .get(
            "/home",
            &[
                ("x-forwarded-host", "evil.example"),
                ("x-forwarded-scheme", "nothttps"),
                ("x-original-url", "/admin"),
                ("x-rewrite-url", "/admin"),
                ("forwarded", "host=evil.example"),
                ("x-http-method-override", "DELETE"),
            ],
        )
        .await;
    assert_eq!(poisoned.body.as_deref().unwrap(), b"");
    let victim = rig.get("/home", &[]).await;
    assert_eq!(x_cache(&victim), "HIT");
    assert_eq!(victim.body.as_deref().unwrap(), b"");
    // The Host header selects the tenant from configuration only; the origin's Host
    // is the tenant's.
    let sent = &rig.origin.received("/home")[0];
    assert_ne!(sent.headers.get("host").unwrap(), HOST);
}

/// Cache poisoning: a `GET` with a body (a "fat GET") is refused with `400`, so a
/// body the key does not see can neither shape what other clients get nor reach a
/// pooled origin connection (where an origin that ignores it would read it as the
/// next request).
#[tokio::test]
async fn a_fat_get_is_refused_and_never_stored() {
    let rig = Rig::start().await;
    rig.origin.script("/fat", |req, _| {
        let len = req
            .get("content-length")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Scripted::new(200, &[("cache-control", "max-age=600")]).with_body(format!("len={len}"))
    });
    let fat = rig
        .client
        .send(
            Method::GET,
            rig.node.addr,
            HOST,
            "/fat",
            &[],
            "callback=evil",
        )
        .await
        .unwrap();
    assert_eq!(fat.status, StatusCode::BAD_REQUEST);
    assert_eq!(rig.fills("/fat"), 0);
    let plain = rig.get("/fat", &[]).await;
    assert_eq!(x_cache(&plain), "MISS");
    assert_eq!(plain.body.as_deref().unwrap(), b"len=");
    assert_eq!(rig.fills("/fat"), 1);
}
