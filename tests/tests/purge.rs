//! Purges end to end (`docs/warming.md#purges`): a region of two edges behind a
//! shield, all in-process, reading one command topic on the real broker. A signed
//! soft purge with a re-warm refills each purged key from the origin once for the
//! region; unsigned and badly signed purges are refused and counted, and purge
//! nothing. `POST /purge` on the admin listener refuses each bad input with the
//! status that says what is wrong. `POST /api/purge` on pulse signs a purge and
//! sends it to the fleet, and refuses its bad inputs naming the field.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, StatusCode};
use models::{
    CacheKey, PurgeCommand, PurgeMode, RegionId, RegionTargets, SigningKeys, TenantId, encode,
};
use prefetcher::testing::{SyntheticOrigin, TestClient, wait_until};
use prefetcher::{CacheStatus, Config, NodeHandle, RejectReason, spawn_node};
use pulse::PulseConfig;
use pulse::testing::send_json;
use serde_json::{Value, json};
use tests::{TestKafka, produce_signed, wall_ms};

const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";
const SECRET: &str = "6b1d6a0f0e8c2f4e9a7b3c5d1e2f30415263748596a7b8c9dae0f1021324354f";
const FORGED: &str = "0000000000000000000000000000000000000000000000000000000000000001";
const KEYS: usize = 12;

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn node_config(origin: &str, kafka: &TestKafka, topic: &str, keys: &Path) -> Config {
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin,
    );
    let group = unique("purge-node");
    config.region = Some(RegionId::new(REGION).unwrap());
    config.node = Some(group.parse().unwrap());
    config.kafka.group_id = Some(group);
    config.kafka.brokers = Some(kafka.bootstrap_servers().to_owned());
    config.kafka.events_topic = kafka.unique_topic("purge-events");
    config.kafka.prewarm_topic = topic.to_owned();
    config.kafka.prewarm_offset_reset = prefetcher::OffsetReset::Earliest;
    config.kafka.prewarm_keys_file = Some(keys.to_owned());
    config
}

fn purge(id: &str, window_ms: u64) -> PurgeCommand {
    let mut p = PurgeCommand::new(
        id.into(),
        TenantId::new(TENANT).unwrap(),
        CacheKey::new("/p/").unwrap(),
        wall_ms(),
        120_000,
        RegionTargets::Only(vec![RegionId::new(REGION).unwrap()]),
    );
    p.mode = PurgeMode::Soft;
    p.rewarm_window_ms = Some(window_ms);
    p
}

fn rewarmed(node: &NodeHandle) -> u64 {
    let m = &node.node().metrics().purge;
    m.rewarmed("filled") + m.rewarmed("cached") + m.rewarmed("failed")
}

/// Rules: each purged key is refilled once per region (the shield fills it from the
/// origin once, the edges from the shield); a purge with a bad signature, or none,
/// is refused, counted, and purges nothing; between the purge and the re-warm an
/// edge serves the key stale, never a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_refills_each_purged_key_once_and_refuses_forged_purges() {
    let kafka = TestKafka::start();
    let topic = kafka.unique_topic("purge-commands");
    kafka.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("command.keys");
    std::fs::write(&keys, format!("k1 {SECRET}\n")).unwrap();
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_cache_control(Some("public, max-age=3600"));
    let shield = spawn_node(node_config(&origin.url(), &kafka, &topic, &keys))
        .await
        .unwrap();
    let mut edges = Vec::new();
    for _ in 0..2 {
        let config = node_config(&shield.url(), &kafka, &topic, &keys);
        edges.push(spawn_node(config).await.unwrap());
    }
    let client = TestClient::new();
    let paths: Vec<String> = (0..KEYS).map(|i| format!("/p/{i}")).collect();
    for edge in &edges {
        for path in paths.iter().chain(["/q/kept".to_owned()].iter()) {
            let got = client.get(edge.addr(), HOST, path).await.unwrap();
            assert_eq!(got.status, 200);
        }
    }
    assert_eq!(origin.fills(), KEYS + 1, "one fill per key for the region");

    let signer = SigningKeys::parse(&format!("k1 {SECRET}"))
        .unwrap()
        .signer("k1")
        .unwrap();
    let forger = SigningKeys::parse(&format!("k1 {FORGED}"))
        .unwrap()
        .signer("k1")
        .unwrap();
    let producer = kafka.producer();
    let unsigned = encode(&purge("pg-unsigned", 500));
    produce_signed(&producer, &topic, "acme/p/", &unsigned, None).await;
    let forged = encode(&purge("pg-forged", 500));
    produce_signed(
        &producer,
        &topic,
        "acme/p/",
        &forged,
        Some(&forger.sign(&forged)),
    )
    .await;
    let nodes = [&shield, &edges[0], &edges[1]];
    for node in nodes {
        let m = &node.node().metrics().purge;
        wait_until(
            || m.rejected_count(RejectReason::Unsigned) == 1,
            "the unsigned purge refused",
        )
        .await;
        wait_until(
            || m.rejected_count(RejectReason::BadSignature) == 1,
            "the forged purge refused",
        )
        .await;
    }
    let hit = client.get(edges[0].addr(), HOST, "/p/0").await.unwrap();
    assert_eq!(hit.x_cache(), Some(CacheStatus::Hit), "nothing was purged");

    let good = encode(&purge("pg-good", 1_500));
    produce_signed(
        &producer,
        &topic,
        "acme/p/",
        &good,
        Some(&signer.sign(&good)),
    )
    .await;
    for node in nodes {
        wait_until(
            || node.node().metrics().purge.rewarm_pending.get() > 0 || rewarmed(node) > 0,
            "the purge applied",
        )
        .await;
    }
    // Before the re-warm of every key is done, the edges serve the purged keys stale.
    let during = client.get(edges[1].addr(), HOST, "/p/1").await.unwrap();
    assert!(
        matches!(
            during.x_cache(),
            Some(CacheStatus::Stale | CacheStatus::Hit | CacheStatus::Prefetched)
        ),
        "{:?}",
        during.x_cache()
    );
    for node in nodes {
        wait_until(|| rewarmed(node) == KEYS as u64, "every key re-warmed").await;
        assert_eq!(node.node().metrics().purge.rewarmed("failed"), 0);
        assert_eq!(node.node().metrics().purge.rewarm_pending.get(), 0);
    }
    for path in &paths {
        assert_eq!(origin.fills_for(path), 2, "{path}: once before, once after");
        for edge in &edges {
            let got = client.get(edge.addr(), HOST, path).await.unwrap();
            assert_ne!(got.x_cache(), Some(CacheStatus::Miss), "{path}");
            assert_ne!(got.x_cache(), Some(CacheStatus::Stale), "{path}");
        }
    }
    assert_eq!(origin.fills_for("/q/kept"), 1, "outside the prefix");
    for node in [shield].into_iter().chain(edges) {
        node.shutdown().await;
    }
}

/// Rule: `POST /purge` is bounded and says what is wrong: no token 401, an unknown
/// tenant 404, a prefix over 1024 bytes or a tag with a comma 400 naming it, a body
/// over 4 KiB 413; a good one purges (by tag: only what carries it) and reports.
#[tokio::test]
async fn the_purge_endpoint_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("purge-token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_cache_control(Some("public, max-age=3600"));
    origin.add_header("surrogate-key", "site launch");
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin.url(),
    );
    config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    config.purge.token_file = Some(token);
    let node = spawn_node(config).await.unwrap();
    let admin = node.admin_addr().unwrap();
    let client = TestClient::new();
    client.get(node.addr(), HOST, "/a/1").await.unwrap();
    let post = |body: String, auth: Option<&'static str>| {
        let client = client.clone();
        async move {
            let headers: Vec<(&str, &str)> = auth
                .map(|a| vec![("authorization", a), ("content-type", "application/json")])
                .unwrap_or_default();
            client
                .send(Method::POST, admin, "admin", "/purge", &headers, body)
                .await
                .unwrap()
        }
    };
    let good = r#"{"tenant":"acme","prefix":"/a/"}"#.to_owned();
    assert_eq!(post(good.clone(), None).await.status, 401);
    assert_eq!(post(good.clone(), Some("Bearer wrong")).await.status, 401);
    let auth = Some("Bearer s3cret");
    let unknown = post(r#"{"tenant":"globex","prefix":"/a/"}"#.into(), auth).await;
    assert_eq!(unknown.status, 404);
    let long = format!(r#"{{"tenant":"acme","prefix":"/{}"}}"#, "a".repeat(1_100));
    let long = post(long, auth).await;
    assert_eq!(long.status, 400);
    assert!(String::from_utf8_lossy(long.body.as_ref().unwrap()).contains("prefix:"));
    let huge = format!(
        r#"{{"tenant":"acme","prefix":"/a/","pad":"{}"}}"#,
        "x".repeat(5_000)
    );
    assert_eq!(post(huge, auth).await.status, 413);
    let bad_tag = r#"{"tenant":"acme","prefix":"/","tag":"a,b"}"#.to_owned();
    let bad_tag = post(bad_tag, auth).await;
    assert_eq!(bad_tag.status, 400);
    assert!(String::from_utf8_lossy(bad_tag.body.as_ref().unwrap()).contains("tag:"));
    let other = post(
        r#"{"tenant":"acme","prefix":"/","tag":"other"}"#.into(),
        auth,
    )
    .await;
    assert_eq!(other.status, 200);
    assert!(String::from_utf8_lossy(other.body.as_ref().unwrap()).contains(r#""removed":0"#));
    let done = post(
        r#"{"tenant":"acme","prefix":"/","tag":"launch"}"#.into(),
        auth,
    )
    .await;
    assert_eq!(done.status, 200);
    let report: serde_json::Value = serde_json::from_slice(done.body.as_ref().unwrap()).unwrap();
    assert_eq!(report["removed"], 1, "{report}");
    let again = client.get(node.addr(), HOST, "/a/1").await.unwrap();
    assert_eq!(again.x_cache(), Some(CacheStatus::Miss));
    let m = &node.node().metrics().purge;
    assert_eq!(
        m.rejected_count(RejectReason::BadSignature),
        2,
        "the two 401s"
    );
    assert_eq!(m.rejected_count(RejectReason::UnknownTenant), 1);
    node.shutdown().await;
}

/// Rule: pulse's `POST /api/purge` sends one signed purge the fleet's nodes apply; an
/// unknown tenant is 404, a soft purge without a window, a prefix over 1024 bytes and
/// an unknown field are 400 naming the field, no token is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulse_purges_the_fleet_and_refuses_bad_purges() {
    const TOKEN: &str = "purge-test-token";
    let kafka = TestKafka::start();
    let events = kafka.unique_topic("purge-api-events");
    let topic = kafka.unique_topic("purge-api-commands");
    kafka.create_topic(&events, 1).await;
    kafka.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("command.keys");
    std::fs::write(&keys, format!("k1 {SECRET}\n")).unwrap();
    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: format!("{events}-pulse"),
        topic: events.clone(),
        prewarm_topic: topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        prewarm_signing_keys: Some(keys.clone()),
        prewarm_signing_key_id: Some("k1".into()),
        api_token: Some(TOKEN.into()),
        topic_partitions: 1,
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse");
    let app = pulse.router();
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_cache_control(Some("public, max-age=3600"));
    let mut config = node_config(&origin.url(), &kafka, &topic, &keys);
    config.kafka.events_topic = events.clone();
    config.kafka.linger_ms = 5;
    let node = spawn_node(config).await.unwrap();
    let client = TestClient::new();
    for path in ["/img/a.png", "/css/site.css"] {
        assert_eq!(
            client.get(node.addr(), HOST, path).await.unwrap().status,
            200
        );
    }
    let call = |body: Value, token: bool| {
        let app = app.clone();
        async move {
            let mut request = Request::builder()
                .method("POST")
                .uri("/api/purge")
                .header("content-type", "application/json");
            if token {
                request = request.header("authorization", format!("Bearer {TOKEN}"));
            }
            send_json(&app, request.body(Body::from(body.to_string())).unwrap()).await
        }
    };
    // The tenant becomes known to the heat map through the node's events.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = call(json!({"tenant": TENANT, "prefix": "/img/"}), true).await;
        if status == StatusCode::ACCEPTED {
            assert_eq!(body["kind"], "purge", "{body}");
            break;
        }
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = node.node().metrics();
    wait_until(
        || {
            m.encode()
                .contains("prefetcher_purges_total{source=\"command\"} 1")
        },
        "the node applied the purge",
    )
    .await;
    let again = client.get(node.addr(), HOST, "/img/a.png").await.unwrap();
    assert_eq!(again.x_cache(), Some(CacheStatus::Miss), "purged");
    let kept = client
        .get(node.addr(), HOST, "/css/site.css")
        .await
        .unwrap();
    assert_eq!(kept.x_cache(), Some(CacheStatus::Hit), "outside the prefix");

    let (status, _) = call(json!({"tenant": TENANT, "prefix": "/img/"}), false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = call(json!({"tenant": "globex", "prefix": "/img/"}), true).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let bad = [
        json!({"tenant": TENANT, "prefix": "/img/", "mode": "soft"}),
        json!({"tenant": TENANT, "prefix": format!("/{}", "a".repeat(1_100))}),
        json!({"tenant": TENANT, "prefix": "img/"}),
        json!({"tenant": TENANT, "prefix": "/img/", "rewarm_window_ms": 0}),
    ];
    for (body, field) in bad.into_iter().zip([
        "rewarm_window_ms:",
        "prefix:",
        "prefix:",
        "rewarm_window_ms:",
    ]) {
        let (status, answer) = call(body, true).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().starts_with(field),
            "{answer}"
        );
    }
    let (status, _) = call(json!({"tenant": TENANT, "prefix": "/img/", "x": 1}), true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    node.shutdown().await;
    pulse.shutdown().await;
}
