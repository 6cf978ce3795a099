//! Operators' warm-ups (`POST /api/warm`, issue #55) end to end on the real broker:
//! pulse in-process with its fleet gate and a signing key, a prefetcher node that
//! acts only on signed commands, a synthetic origin.
//!
//! - `a_warm_up_goes_through_the_gate_and_its_bad_inputs_are_refused`: the token is
//!   required; a list of keys and a prefix (expanded from the heat map) are warmed
//!   through the gate, signed (the node fills them); their progress counts the
//!   node's `prefetch_fill` and `prefetch_cached` reports by region (the latter not
//!   counted as demand); each bad input gets a 4xx whose message starts with its
//!   field; `pulse warm --follow` (the binary) does the same through the socket.
//! - `warm_ups_and_predictions_spend_separate_budgets`: proposals on the decisions
//!   topic (as the partitions and the warm desk write them): a warm-up that spends its
//!   class's whole budget leaves the predictions theirs, and the reverse.
//!
//! Needs a real broker (`KAFKA_BOOTSTRAP_SERVERS`); a few seconds each.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use models::{CommandClass, PrewarmCommand, Reason, RegionTargets, encode};
use prefetcher::testing::{SyntheticOrigin, TestClient, wait_until};
use prefetcher::{Config, NodeHandle, spawn_node};
use pulse::testing::send_json;
use pulse::{PulseConfig, PulseHandle};
use serde_json::{Value, json};
use tests::fleet::{pulse_bin, read_commands};
use tests::{TestKafka, produce, wall_ms};

const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";
const TOKEN: &str = "warm-test-token";
const SECRET: &str = "6b1d6a0f0e8c2f4e9a7b3c5d1e2f30415263748596a7b8c9dae0f1021324354f";
/// The budgets: small, so that one test spends them.
const TENANT_BURST: f64 = 2.0;
const WARM_BURST: f64 = 4.0;
const WARM_RATE: f64 = 20.0;

struct World {
    kafka: TestKafka,
    pulse: PulseHandle,
    events_topic: String,
    prewarm_topic: String,
    decisions_topic: String,
    _dir: tempfile::TempDir,
}

async fn world(name: &str) -> World {
    let kafka = TestKafka::start();
    assert!(
        kafka.is_real(),
        "set KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 (scripts/kafka start)"
    );
    let events_topic = kafka.unique_topic(&format!("{name}-events"));
    let prewarm_topic = kafka.unique_topic(&format!("{name}-prewarm"));
    kafka.create_topic(&events_topic, 2).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("prewarm.keys");
    std::fs::write(&keys, format!("k1 {SECRET}\n")).unwrap();
    let config = PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: format!("{events_topic}-pulse"),
        topic: events_topic.clone(),
        prewarm_topic: prewarm_topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        prewarm_signing_keys: Some(keys),
        prewarm_signing_key_id: Some("k1".into()),
        api_token: Some(TOKEN.into()),
        tenant_burst: TENANT_BURST,
        tenant_rate_per_s: 0.001,
        warm_burst: WARM_BURST,
        warm_rate_per_s: WARM_RATE,
        topic_partitions: 1,
        ..PulseConfig::default()
    };
    let decisions_topic = config.decisions_topic();
    let pulse = pulse::start(config).await.expect("starting pulse");
    World {
        kafka,
        pulse,
        events_topic,
        prewarm_topic,
        decisions_topic,
        _dir: dir,
    }
}

async fn node(world: &World, origin: &SyntheticOrigin) -> NodeHandle {
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TENANT.parse().unwrap(),
        origin.url(),
    );
    config.region = Some(REGION.parse().unwrap());
    config.node = Some("edge-1".parse().unwrap());
    config.kafka.group_id = Some(format!("{}-edge-1", world.prewarm_topic));
    config.kafka.brokers = Some(world.kafka.bootstrap_servers().to_owned());
    config.kafka.events_topic = world.events_topic.clone();
    config.kafka.prewarm_topic = world.prewarm_topic.clone();
    config.kafka.linger_ms = 5;
    config.kafka.prewarm_keys_file = Some(world._dir.path().join("prewarm.keys"));
    spawn_node(config).await.expect("starting the node")
}

/// `method uri` on pulse's router, with the token unless `token` is false.
async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
    token: bool,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if token {
        request = request.header("authorization", format!("Bearer {TOKEN}"));
    }
    let body = match body {
        Some(v) => {
            request = request.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    send_json(app, request.body(body).unwrap()).await
}

async fn progress(app: &Router, id: &str) -> Value {
    let (status, body) = call(app, "GET", &format!("/api/warm/{id}"), None, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Polls the progress of `id` until `done` holds for it (30 s bound).
async fn until_progress(app: &Router, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let body = progress(app, id).await;
        if done(&body["progress"]) {
            return body;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_goes_through_the_gate_and_its_bad_inputs_are_refused() {
    let world = world("warm-api").await;
    let app = world.pulse.router();
    let origin = SyntheticOrigin::start("origin").await;
    origin.set_cache_control(Some("public, max-age=300"));
    let node = node(&world, &origin).await;
    // User traffic makes the tenant and its keys known to the heat map.
    for path in ["/img/a.png", "/img/b.png", "/css/site.css"] {
        let got = TestClient::new()
            .get(node.addr(), HOST, path)
            .await
            .unwrap();
        assert_eq!(got.status, 200);
    }
    let heatmap = || async {
        let (_, body) = call(
            &app,
            "GET",
            "/api/heatmap?tenant=acme&window=60s&n=10",
            None,
            true,
        )
        .await;
        body
    };
    let known = || async { heatmap().await["keys"].as_array().map_or(0, Vec::len) };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while known().await < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pulse never saw the user traffic"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The token is required.
    let keys = json!({"tenant": TENANT, "keys": ["/launch/1", "/launch/2", "/launch/3"],
        "regions": [REGION], "pace": WARM_RATE});
    let (status, _) = call(&app, "POST", "/api/warm", Some(keys.clone()), false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A list of keys: proposed, admitted, signed, filled once each.
    let (status, accepted) = call(&app, "POST", "/api/warm", Some(keys), true).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    wait_until(
        || (1..=3).all(|i| origin.fills_for(&format!("/launch/{i}")) == 1),
        "the warm-up's fills",
    )
    .await;
    // Progress: the node's `prefetch_fill` events, credited per region.
    let done = until_progress(&app, &id, |p| p["regions"][REGION]["filled"] == 3).await;
    assert_eq!(done["progress"]["regions"][REGION]["cached"], 0, "{done}");
    assert_eq!(
        (
            done["progress"]["sent"].as_u64(),
            done["progress"]["failed"].as_u64()
        ),
        (Some(3), Some(0)),
        "{done}"
    );

    // A prefix: the heat map's known keys that start with it, nothing else.
    let fills_before = origin.fills();
    let (status, accepted) = call(
        &app,
        "POST",
        "/api/warm",
        Some(json!({"tenant": TENANT, "prefix": "/img/"})),
        true,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let prefix_id = accepted["id"].as_str().unwrap().to_owned();
    // The node held both: it says so (`prefetch_cached`), and fetches nothing.
    let p = until_progress(&app, &prefix_id, |p| p["regions"][REGION]["cached"] == 2).await;
    assert_eq!(
        (
            &p["progress"]["keys"],
            &p["progress"]["sent"],
            &p["progress"]["phase"]
        ),
        (&json!(2), &json!(2), &json!("sent")),
        "{p}"
    );
    assert_eq!(p["progress"]["regions"][REGION]["filled"], 0, "{p}");
    assert_eq!(origin.fills(), fills_before, "the keys were cached already");
    // The acknowledgements are no demand: the heat map's counts did not move.
    let heat = heatmap().await;
    let img: u64 = heat["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["key"].as_str().unwrap().starts_with("/img/"))
        .map(|row| row["count"].as_u64().unwrap())
        .sum();
    assert_eq!(img, 2, "one user request each: {heat}");

    // The commands on the prewarm topic: warm class, the job's ids.
    let commands = read_commands(&world.kafka, &world.prewarm_topic);
    let warm: Vec<&PrewarmCommand> = commands.iter().filter(|c| c.id.starts_with(&id)).collect();
    assert_eq!(warm.len(), 3, "{commands:?}");
    assert!(warm.iter().all(|c| c.class == CommandClass::Warm));

    // Bad inputs: a 4xx whose message starts with the field.
    let many: Vec<String> = (0..=1000).map(|i| format!("/k{i}")).collect();
    let cases = [
        (
            json!({"tenant": "nobody", "keys": ["/a"]}),
            StatusCode::NOT_FOUND,
            "tenant:",
        ),
        (
            json!({"tenant": "a b", "keys": ["/a"]}),
            StatusCode::BAD_REQUEST,
            "tenant:",
        ),
        (
            json!({"tenant": TENANT, "prefix": "/nothing/"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "prefix:",
        ),
        (
            json!({"tenant": TENANT, "keys": ["/a"], "pace": WARM_RATE * 2.0}),
            StatusCode::BAD_REQUEST,
            "pace:",
        ),
        (
            json!({"tenant": TENANT, "keys": ["/a"], "not_before": wall_ms() - 60_000}),
            StatusCode::BAD_REQUEST,
            "not_before:",
        ),
        (
            json!({"tenant": TENANT, "keys": []}),
            StatusCode::BAD_REQUEST,
            "keys:",
        ),
        (
            json!({"tenant": TENANT, "keys": many}),
            StatusCode::BAD_REQUEST,
            "keys:",
        ),
        (
            json!({"tenant": TENANT, "keys": ["/ok", "http://evil.example/x"]}),
            StatusCode::BAD_REQUEST,
            "keys[1]:",
        ),
        (
            json!({"tenant": TENANT, "keys": ["/a"], "regions": ["eu west"]}),
            StatusCode::BAD_REQUEST,
            "regions[0]:",
        ),
    ];
    for (body, status, field) in cases {
        let (got, answer) = call(&app, "POST", "/api/warm", Some(body.clone()), true).await;
        assert_eq!(got, status, "{body}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{body}: {answer}");
    }
    let (status, answer) = call(&app, "GET", "/api/warm/warm-0-nope", None, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    // `pulse warm` against the same pulse's socket: the id, then the progress until
    // the region has the key; without the token, a refusal that says so.
    let api = format!("http://{}", world.pulse.api_addr());
    let warm = |token: Option<&str>| {
        let mut command = tokio::process::Command::new(pulse_bin());
        command.args(["warm", "--api", &api, "--tenant", TENANT, "--key", "/cli/1"]);
        command.args(["--region", REGION, "--follow", "--wait-secs", "20"]);
        command.env_remove("PULSE_API_TOKEN");
        if let Some(token) = token {
            command.env("PULSE_API_TOKEN", token);
        }
        command.output()
    };
    let refused = warm(None).await.unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    let followed = warm(Some(TOKEN)).await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&followed.stdout),
        String::from_utf8_lossy(&followed.stderr),
    );
    assert!(followed.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.trim().starts_with("warm-"), "{stdout}");
    assert!(
        stderr.contains(&format!("{REGION} filled 1 cached 0")),
        "{stderr}"
    );
    assert_eq!(origin.fills_for("/cli/1"), 1);
    drop(node);
    world.pulse.shutdown().await;
}

/// A proposal as the partitions (`Prediction`) or the warm desk (`Warm`) write it.
fn proposal(id: &str, tenant: &str, key: &str, class: CommandClass, at_ms: u64) -> PrewarmCommand {
    PrewarmCommand {
        class,
        ..PrewarmCommand::new(
            id.to_owned(),
            tenant.parse().unwrap(),
            key.parse().unwrap(),
            1.0,
            at_ms,
            at_ms + 60_000,
            RegionTargets::All,
            Reason {
                model: "test".into(),
                intercept: 0.0,
                features: Vec::new(),
            },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_ups_and_predictions_spend_separate_budgets() {
    let world = world("warm-budget").await;
    let producer = world.kafka.producer();
    let at = wall_ms();
    let mut expected = Vec::new();
    // "launch": a warm-up spends its whole bucket (and more), then predictions come.
    // "steady": predictions spend theirs, then a warm-up comes.
    for (tenant, first, then) in [
        ("launch", CommandClass::Warm, CommandClass::Prediction),
        ("steady", CommandClass::Prediction, CommandClass::Warm),
    ] {
        let budget = |class| match class {
            CommandClass::Warm => WARM_BURST as usize,
            CommandClass::Prediction => TENANT_BURST as usize,
        };
        for i in 0..budget(first) + 3 {
            let id = format!("{tenant}-{first:?}-{i}");
            let c = proposal(&id, tenant, &format!("/first/{i}"), first, at);
            produce(&producer, &world.decisions_topic, tenant, &encode(&c)).await;
            if i < budget(first) {
                expected.push(id);
            }
        }
        for i in 0..budget(then) {
            let id = format!("{tenant}-{then:?}-{i}");
            let c = proposal(&id, tenant, &format!("/then/{i}"), then, at);
            produce(&producer, &world.decisions_topic, tenant, &encode(&c)).await;
            expected.push(id);
        }
    }
    let mut sent: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sent.len() < expected.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "admitted so far: {sent:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        sent = read_commands(&world.kafka, &world.prewarm_topic)
            .into_iter()
            .map(|c| c.id)
            .collect();
    }
    sent.sort();
    expected.sort();
    assert_eq!(
        sent, expected,
        "each class within its own budget, neither starved"
    );
    world.pulse.shutdown().await;
}
