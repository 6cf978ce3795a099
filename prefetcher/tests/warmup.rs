//! The warm-up at start (`warmup`): a node with `[warmup]` asks a stub pulse for its
//! region's warm set, fills exactly those keys from a scripted origin, and `/readyz`
//! answers 503 `warming` until they are in (or the deadline passes), then 200. Without
//! a pulse that answers, the node is ready at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::routing::get;
use prefetcher::testing::SyntheticOrigin;
use prefetcher::{Config, NodeHandle, WarmupConfig, spawn_node};
use serde_json::{Value, json};

/// A request's query and its `Authorization`.
type Asked = (String, Option<String>);

/// A pulse that answers `/api/warmset` with `rows` and remembers what it was asked.
#[derive(Clone, Default)]
struct StubPulse {
    rows: Arc<Mutex<Vec<(String, String)>>>,
    asked: Arc<Mutex<Vec<Asked>>>,
}

async fn warmset(
    State(pulse): State<StubPulse>,
    uri: Uri,
    headers: HeaderMap,
) -> axum::Json<Value> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    pulse
        .asked
        .lock()
        .unwrap()
        .push((uri.query().unwrap_or("").to_owned(), auth));
    let keys: Vec<Value> = pulse
        .rows
        .lock()
        .unwrap()
        .iter()
        .map(|(t, k)| json!({"tenant": t, "key": k, "count": 60, "rate": 1.0}))
        .collect();
    axum::Json(
        json!({"region": "eu-west", "window": "60s", "now_ms": 0, "keys": keys, "coverage": {}}),
    )
}

impl StubPulse {
    async fn start(rows: &[(&str, &str)]) -> (StubPulse, String) {
        let pulse = StubPulse::default();
        *pulse.rows.lock().unwrap() = rows
            .iter()
            .map(|(t, k)| (t.to_string(), k.to_string()))
            .collect();
        let app = Router::new()
            .route("/api/warmset", get(warmset))
            .with_state(pulse.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (pulse, url)
    }
}

fn config(origin: &SyntheticOrigin, pulse: &str, tweak: impl FnOnce(&mut WarmupConfig)) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        "acme".parse().unwrap(),
        origin.url(),
    );
    c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    c.region = Some("eu-west".parse().unwrap());
    let mut w = WarmupConfig {
        pulse: pulse.to_owned(),
        deadline_ms: 20_000,
        ..WarmupConfig::default()
    };
    tweak(&mut w);
    c.warmup = Some(w);
    c
}

async fn readyz(node: &NodeHandle) -> (u16, Value) {
    let url = format!("http://{}/readyz", node.admin_addr().unwrap());
    let response = reqwest::get(&url).await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn until_ready(node: &NodeHandle) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = readyz(node).await;
        if status == 200 {
            return body;
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["state"], "warming", "{body}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn metric(node: &NodeHandle, line: &str) -> bool {
    let url = format!("http://{}/metrics", node.admin_addr().unwrap());
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    text.lines().any(|l| l == line)
}

#[tokio::test]
async fn warming_until_the_warm_set_is_in_then_ready_and_only_it_fetched() {
    let origin = SyntheticOrigin::start("o").await;
    origin.set_latency(Duration::from_millis(300));
    let (pulse, url) = StubPulse::start(&[("acme", "/a"), ("other", "/x"), ("acme", "/b")]).await;
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret\n").unwrap();
    let node = spawn_node(config(&origin, &url, |w| {
        w.token_file = Some(token.path().to_owned())
    }))
    .await
    .unwrap();
    let (status, body) = readyz(&node).await;
    assert_eq!((status, &body["state"]), (503, &json!("warming")), "{body}");
    let body = until_ready(&node).await;
    assert_eq!(
        body,
        json!({"state": "ready", "done": 2, "of": 2, "reason": "warmed"})
    );
    // The tenant's keys, once each; nothing of a tenant the node does not serve.
    assert_eq!((origin.fills_for("/a"), origin.fills_for("/b")), (1, 1));
    assert_eq!(origin.fills(), 2);
    let asked = pulse.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].0.contains("region=eu-west"), "{asked:?}");
    assert!(asked[0].0.contains("tenant=acme"), "{asked:?}");
    assert_eq!(asked[0].1.as_deref(), Some("Bearer s3cret"));
    assert!(metric(&node, "prefetcher_warmup_keys_total{result=\"filled\"} 2").await);
    assert!(metric(&node, "prefetcher_warmup_warming 0").await);
    // Served from the cache at once.
    let got = reqwest::Client::new()
        .get(format!("{}/a", node.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(got.headers()["x-cache"], "PREFETCHED");
    assert_eq!(origin.fills(), 2);
    node.shutdown().await;
}

#[tokio::test]
async fn the_deadline_makes_the_node_ready_anyway_and_is_counted() {
    let origin = SyntheticOrigin::start("o").await;
    origin.hold();
    let (_pulse, url) = StubPulse::start(&[("acme", "/slow")]).await;
    let node = spawn_node(config(&origin, &url, |w| w.deadline_ms = 300))
        .await
        .unwrap();
    let body = until_ready(&node).await;
    assert_eq!(body["reason"], "deadline", "{body}");
    assert_eq!(
        (body["done"].as_u64(), body["of"].as_u64()),
        (Some(0), Some(1))
    );
    assert!(metric(&node, "prefetcher_warmup_deadline_hit_total 1").await);
    origin.release();
    node.shutdown().await;
}

#[tokio::test]
async fn no_pulse_answering_means_ready_at_once() {
    let origin = SyntheticOrigin::start("o").await;
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let node = spawn_node(config(&origin, &url, |_| {})).await.unwrap();
    let body = until_ready(&node).await;
    assert_eq!(body["reason"], "pulse_unreachable", "{body}");
    assert_eq!(origin.fills(), 0);
    node.shutdown().await;

    // And without [warmup] at all.
    let mut c = config(&origin, &url, |_| {});
    c.warmup = None;
    let node = spawn_node(c).await.unwrap();
    let (status, body) = readyz(&node).await;
    assert_eq!(
        (status, &body["reason"]),
        (200, &json!("no_warmup")),
        "{body}"
    );
    node.shutdown().await;
}

/// With `warmup.peers`, a key a region peer holds comes from the peer's cache (asked
/// `only-if-cached`, so the peer fetches nothing), the rest from the origin; a peer
/// that is down is passed over.
#[tokio::test]
async fn a_peers_cached_copy_spares_the_origin() {
    let origin = SyntheticOrigin::start("o").await;
    let (_pulse, url) = StubPulse::start(&[("acme", "/held"), ("acme", "/not-held")]).await;
    let mut peer_config = config(&origin, &url, |_| {});
    peer_config.warmup = None;
    let peer = spawn_node(peer_config).await.unwrap();
    let got = reqwest::get(format!("{}/held", peer.url())).await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(origin.fills(), 1);

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let node = spawn_node(config(&origin, &url, |w| w.peers = vec![down, peer.url()]))
        .await
        .unwrap();
    let body = until_ready(&node).await;
    assert_eq!(body["reason"], "warmed", "{body}");
    assert_eq!(
        origin.fills_for("/held"),
        1,
        "the peer's copy, not a second fill"
    );
    assert_eq!(origin.fills_for("/not-held"), 1);
    assert_eq!(origin.fills(), 2);
    assert!(metric(&node, "prefetcher_warmup_peer_asks_total{result=\"hit\"} 1").await);
    let got = reqwest::get(format!("{}/held", node.url())).await.unwrap();
    assert_eq!(got.headers()["x-cache"], "PREFETCHED");
    assert_eq!(origin.fills(), 2);
    node.shutdown().await;
    peer.shutdown().await;
}

#[tokio::test]
async fn bounded_by_count_and_by_bytes() {
    let origin = SyntheticOrigin::start("o").await;
    origin.set_body_size(1_000);
    let rows = [
        ("acme", "/1"),
        ("acme", "/2"),
        ("acme", "/3"),
        ("acme", "/4"),
    ];
    let (_pulse, url) = StubPulse::start(&rows).await;
    let node = spawn_node(config(&origin, &url, |w| w.max_keys = 3))
        .await
        .unwrap();
    let body = until_ready(&node).await;
    assert_eq!(body["of"], 3, "{body}");
    assert_eq!(origin.fills_for("/4"), 0);
    assert_eq!(origin.fills(), 3);
    node.shutdown().await;

    // One fill at a time, so the bytes are counted before the next starts: the
    // second reaches 1500 bytes and the rest are skipped.
    let origin = SyntheticOrigin::start("p").await;
    origin.set_body_size(1_000);
    let mut c = config(&origin, &url, |w| w.max_bytes = 1_500);
    c.prefetch.max_fills = 1;
    c.prefetch.min_fills = 1;
    let node = spawn_node(c).await.unwrap();
    let body = until_ready(&node).await;
    assert_eq!(
        (body["done"].as_u64(), body["of"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(origin.fills(), 2);
    assert!(metric(&node, "prefetcher_warmup_keys_total{result=\"skipped\"} 2").await);
    node.shutdown().await;
}

/// The edge agent warms its local cache (here a synthetic one) through its pre-warm
/// requests before its `/readyz` says ready.
#[tokio::test]
async fn the_edge_agent_warms_its_cache_before_it_is_ready() {
    let cache = SyntheticOrigin::start("cache").await;
    cache.set_latency(Duration::from_millis(200));
    let (_pulse, url) = StubPulse::start(&[("acme", "/a"), ("acme", "/b?y=2&x=1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    let config = prefetcher::AgentConfig {
        region: Some("eu-west".parse().unwrap()),
        node: Some("agent-1".parse().unwrap()),
        log_path: log,
        state_path: dir.path().join("state"),
        cache_url: cache.url(),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        tenants: vec![prefetcher::AgentTenant {
            id: "acme".parse().unwrap(),
            hosts: vec!["acme.example".into()],
        }],
        kafka: prefetcher::KafkaConfig {
            brokers: Some(
                std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or("127.0.0.1:9092".into()),
            ),
            ..prefetcher::KafkaConfig::default()
        },
        warmup: Some(WarmupConfig {
            pulse: url,
            ..WarmupConfig::default()
        }),
        ..prefetcher::AgentConfig::default()
    };
    let agent = prefetcher::spawn_agent(config).await.unwrap();
    let readyz = format!("http://{}/readyz", agent.admin_addr().unwrap());
    let first = reqwest::get(&readyz).await.unwrap();
    assert_eq!(first.status(), 503);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let body: Value = loop {
        let response = reqwest::get(&readyz).await.unwrap();
        if response.status() == 200 {
            break response.json().await.unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        body,
        json!({"state": "ready", "done": 2, "of": 2, "reason": "warmed"})
    );
    // Each key once, normalised, with the tenant's host.
    let a = cache.received("/a");
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].headers["host"], "acme.example");
    assert_eq!(cache.received("/b?x=1&y=2").len(), 1);
    assert_eq!(cache.fills(), 2);
    agent.shutdown().await;
}
