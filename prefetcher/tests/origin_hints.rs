//! Origin hints through the proxy: a response's `Link: rel=prefetch` successors are
//! pre-warmed once for a tenant that opts in, and hostile hints are refused and
//! counted (`prefetcher_origin_hints_total{result}`).

use http::StatusCode;
use models::TenantId;
use prefetcher::testing::{Scripted, SyntheticOrigin, TestClient, TestNode, wait_until};
use prefetcher::{CacheStatus, Config, OriginHintsConfig};

const HOST: &str = "edge.test";
const CACHEABLE: (&str, &str) = ("cache-control", "public, max-age=300");

fn config(origin: &str, hints: Option<OriginHintsConfig>) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("video").unwrap(),
        origin,
    );
    c.tenants[0].origin_hints = hints;
    c
}

/// An HLS-like origin: segment N names segment N+1. A player that asks for each
/// segment after the previous one finds it pre-warmed; each segment is fetched once.
#[tokio::test]
async fn a_player_finds_each_next_segment_pre_warmed() {
    let origin = SyntheticOrigin::start("origin").await;
    const SEGMENTS: usize = 8;
    for n in 0..SEGMENTS {
        let link = format!("<seg{}.ts>; rel=prefetch", n + 1);
        origin.script(&format!("/live/seg{n}.ts"), move |_, _| {
            Scripted::new(200, &[CACHEABLE, ("link", &link)])
        });
    }
    let node = TestNode::start(config(&origin.url(), Some(OriginHintsConfig::default()))).await;
    let client = TestClient::new();
    let first = client.get(node.addr, HOST, "/live/seg0.ts").await.unwrap();
    assert_eq!(first.x_cache(), Some(CacheStatus::Miss));
    let mut statuses = Vec::new();
    for n in 1..SEGMENTS {
        let path = format!("/live/seg{n}.ts");
        // The player's next request comes after the hinted fill started.
        wait_until(|| origin.fills_for(&path) == 1, "the hinted fill").await;
        let r = client.get(node.addr, HOST, &path).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        statuses.push(r.x_cache());
        assert_eq!(origin.fills_for(&path), 1, "{path} fetched once");
    }
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, Some(CacheStatus::Prefetched | CacheStatus::Collapsed))),
        "every next segment was pre-warmed: {statuses:?}"
    );
    let metrics = node.node.metrics();
    assert_eq!(metrics.origin_hints("started"), SEGMENTS as u64);
}

/// Hints are opt-in per tenant.
#[tokio::test]
async fn a_tenant_without_origin_hints_ignores_them() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.script("/a", |_, _| {
        Scripted::new(200, &[CACHEABLE, ("link", "</b>; rel=prefetch")])
    });
    let node = TestNode::start(config(&origin.url(), None)).await;
    let r = TestClient::new().get(node.addr, HOST, "/a").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.fills_for("/b"), 0);
    assert_eq!(node.node.metrics().origin_hints("started"), 0);
}

/// Another host, a path out of the tree, the response itself, and a loop through
/// a hinted response: each refused and counted. A pre-warm nobody asked for has its
/// hints ignored; a user reaching it leads on one step, and a key already cached is
/// not fetched again.
#[tokio::test]
async fn hostile_hints_are_refused_and_counted() {
    let origin = SyntheticOrigin::start("origin").await;
    origin.script("/page", |_, _| {
        Scripted::new(
            200,
            &[
                CACHEABLE,
                (
                    "link",
                    "<http://evil.example/x>; rel=prefetch, <//evil.example/y>; rel=next, \
                     <../etc/passwd>; rel=prefetch, </page>; rel=prefetch, <loop-b>; rel=prefetch",
                ),
            ],
        )
    });
    origin.script("/loop-b", |_, _| {
        Scripted::new(
            200,
            &[
                CACHEABLE,
                ("link", "</page>; rel=prefetch, </c>; rel=prefetch"),
            ],
        )
    });
    let hints = OriginHintsConfig {
        max_per_response: 5,
        fills_per_s: 1_000.0,
    };
    let node = TestNode::start(config(&origin.url(), Some(hints))).await;
    let client = TestClient::new();
    let metrics = node.node.metrics();

    let r = client.get(node.addr, HOST, "/page").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    wait_until(
        || origin.fills_for("/loop-b") == 1 && metrics.flights.get() == 0,
        "the one good hint, filled",
    )
    .await;
    assert_eq!(metrics.origin_hints("other_host"), 2);
    assert_eq!(metrics.origin_hints("bad_path"), 1);
    assert_eq!(metrics.origin_hints("loop"), 1);
    assert_eq!(metrics.origin_hints("started"), 1);
    assert_eq!(origin.fills_for("/c"), 0, "nobody asked for /loop-b yet");

    let r = client.get(node.addr, HOST, "/loop-b").await.unwrap();
    assert_eq!(r.x_cache(), Some(CacheStatus::Prefetched));
    wait_until(|| origin.fills_for("/c") == 1, "one step on").await;
    assert_eq!(
        metrics.origin_hints("cached"),
        1,
        "/page is not fetched again"
    );
    assert_eq!(origin.fills_for("/page"), 1);
    assert_eq!(origin.fills_for("/x") + origin.fills_for("/y"), 0);
}

/// 10 000 links in one response: `max_per_response` are read, and the tenant's
/// rate starts no more than its bucket holds.
#[tokio::test]
async fn a_flood_of_hints_is_bounded_per_response_and_per_second() {
    let origin = SyntheticOrigin::start("origin").await;
    let flood: String = (0..10_000)
        .map(|i| format!("</f/{i}>; rel=prefetch"))
        .collect::<Vec<_>>()
        .join(", ");
    origin.script("/flood", move |_, _| {
        Scripted::new(200, &[CACHEABLE, ("link", &flood)])
    });
    let hints = OriginHintsConfig {
        max_per_response: 5,
        // A bucket of one fill that refills once in 1 000 s.
        fills_per_s: 0.001,
    };
    let node = TestNode::start(config(&origin.url(), Some(hints))).await;
    let metrics = node.node.metrics();
    let r = TestClient::new()
        .get(node.addr, HOST, "/flood")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(metrics.origin_hints("over_count"), 10_000 - 5);
    assert_eq!(metrics.origin_hints("started"), 1);
    assert_eq!(metrics.origin_hints("over_rate"), 4);
    wait_until(|| origin.fills() == 2, "the one hinted fill").await;
    let text = metrics.encode();
    assert!(
        text.contains("prefetcher_origin_hints_total{result=\"over_count\"} 9995"),
        "{text}"
    );
}

/// Hints naming a 5 GiB object and an endless chunked one: each pre-warm reads no
/// more than the cache could store (`cache.max_object_bytes`, here 1 MiB) before it
/// drops the origin connection, stores nothing, and counts the fill as failed.
#[tokio::test]
async fn a_hinted_object_too_large_to_store_is_dropped_early() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const FIVE_GIB: u64 = 5 << 30;
    let sent = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let counter = Arc::clone(&sent);
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let sent = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head);
                if line.starts_with("GET /page ") {
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncache-control: public, max-age=300\r\n\
                              link: </big>; rel=prefetch, </endless>; rel=prefetch\r\n\
                              content-length: 2\r\n\
                              connection: close\r\n\r\nok",
                        )
                        .await;
                    return;
                }
                let chunked = line.starts_with("GET /endless ");
                let (framing, mut chunk) = if chunked {
                    let mut c = b"10000\r\n".to_vec();
                    c.extend(vec![b'x'; 64 * 1024]);
                    c.extend(b"\r\n");
                    ("transfer-encoding: chunked".to_owned(), c)
                } else {
                    (format!("content-length: {FIVE_GIB}"), vec![b'x'; 64 * 1024])
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncache-control: public, max-age=300\r\n{framing}\r\n\r\n"
                );
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                chunk.shrink_to_fit();
                while conn.write_all(&chunk).await.is_ok() {
                    sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    let hints = OriginHintsConfig {
        max_per_response: 4,
        fills_per_s: 10.0,
    };
    let mut c = config(&origin, Some(hints));
    c.cache.max_object_bytes = 1 << 20;
    let node = TestNode::start(c).await;
    let metrics = node.node.metrics();
    let client = TestClient::new();
    let r = client.get(node.addr, HOST, "/page").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(metrics.origin_hints("started"), 2);
    wait_until(|| metrics.flights.get() == 0, "the hinted fills, ended").await;
    // What the origin could push into the socket buffers before the node stopped
    // reading, on top of the 1 MiB: far from 5 GiB.
    let pushed = sent.load(Ordering::Relaxed);
    assert!(pushed < 128 << 20, "{pushed} bytes sent");
    let text = metrics.encode();
    assert!(
        text.contains("prefetcher_fill_failures_total{reason=\"too_large\"} 2"),
        "{text}"
    );
    let r = client.get(node.addr, HOST, "/page").await.unwrap();
    assert_eq!(r.x_cache(), Some(CacheStatus::Hit));
}
