//! RFC 9111 §4.4 (invalidation): a successful response to an unsafe method
//! invalidates the target URL and same-origin `Location`/`Content-Location`;
//! unsafe requests pass through and are never collapsed.

mod common;

use common::{HOST, Rig, x_cache};
use http::{Method, StatusCode};
use prefetcher::testing::Scripted;

fn cached(rig: &Rig, path: &str) {
    rig.origin.script(path, |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")])
    });
}

async fn post(rig: &Rig, method: Method, path: &str) -> prefetcher::testing::Fetched {
    rig.client
        .send(method, rig.node.addr, HOST, path, &[], "payload")
        .await
        .unwrap()
}

/// §4.4: a 2xx to POST, PUT, DELETE or PATCH invalidates the URL's stored responses.
#[tokio::test]
async fn s4_4_a_successful_unsafe_method_invalidates_the_url() {
    let rig = Rig::start().await;
    let mut expected = 1;
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
        cached(&rig, "/doc");
        rig.get("/doc", &[]).await;
        assert_eq!(x_cache(&rig.get("/doc", &[]).await), "HIT");
        let r = post(&rig, method.clone(), "/doc").await;
        assert_eq!(x_cache(&r), "BYPASS");
        expected += 1; // the unsafe request itself
        assert_eq!(x_cache(&rig.get("/doc", &[]).await), "MISS", "{method}");
        expected += 1;
        assert_eq!(rig.fills("/doc"), expected);
    }
    let sent = rig.origin.received("/doc");
    assert!(sent.iter().any(|r| r.method == Method::PATCH));
}

/// §4.4: an error response to an unsafe method invalidates nothing.
#[tokio::test]
async fn s4_4_an_unsuccessful_unsafe_method_invalidates_nothing() {
    let rig = Rig::start().await;
    rig.origin.script("/keep", |_, n| {
        if n == 0 {
            Scripted::new(200, &[("cache-control", "max-age=600")])
        } else {
            Scripted::new(403, &[])
        }
    });
    rig.get("/keep", &[]).await;
    let r = post(&rig, Method::POST, "/keep").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(x_cache(&rig.get("/keep", &[]).await), "HIT");
}

/// §4.4: `Location` and `Content-Location` of the same origin are invalidated too;
/// another origin's are not (they could be a way to invalidate someone else's).
#[tokio::test]
async fn s4_4_location_and_content_location_of_the_same_origin() {
    let rig = Rig::start().await;
    for p in ["/a", "/b", "/c"] {
        cached(&rig, p);
        rig.get(p, &[]).await;
    }
    rig.origin.script("/form", |_, _| {
        Scripted::new(
            201,
            &[
                ("location", "/a"),
                ("content-location", &format!("http://{HOST}/b")),
            ],
        )
    });
    post(&rig, Method::POST, "/form").await;
    assert_eq!(x_cache(&rig.get("/a", &[]).await), "MISS");
    assert_eq!(x_cache(&rig.get("/b", &[]).await), "MISS");
    rig.origin.script("/form2", |_, _| {
        Scripted::new(201, &[("location", "http://elsewhere.example/c")])
    });
    post(&rig, Method::POST, "/form2").await;
    assert_eq!(x_cache(&rig.get("/c", &[]).await), "HIT");
}

/// Unsafe methods are never collapsed: each reaches the origin with its body.
#[tokio::test]
async fn unsafe_methods_pass_through_uncollapsed() {
    let rig = Rig::start().await;
    rig.origin.script("/w", |_, _| Scripted::new(200, &[]));
    rig.origin.hold();
    let handles: Vec<_> = (0..5)
        .map(|_| {
            let (client, addr) = (rig.client.clone(), rig.node.addr);
            tokio::spawn(async move {
                client
                    .send(Method::POST, addr, HOST, "/w", &[], "x")
                    .await
                    .unwrap()
            })
        })
        .collect();
    rig.wait_fills("/w", 5).await;
    rig.origin.release();
    for h in handles {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(rig.fills("/w"), 5);
    let sent = rig.origin.received("/w");
    assert!(
        sent.iter()
            .all(|r| r.headers.get("content-length").unwrap() == "1")
    );
}
