//! Signed pre-warm commands against a real broker: with `kafka.prewarm_keys_file` set,
//! a node and an edge agent act only on commands whose `edge-pulse-sig` header is an
//! HMAC of the exact payload by one of their keys; unsigned, badly signed, tampered and
//! unknown-key commands are refused and counted, reach no origin, and do not stall the
//! partition (a good command after them is applied). A key is rolled end to end as the
//! docs say (add the new key to the verifiers, switch the signer, remove the old key)
//! with pulse's own producer signing, and `pulse serve` with its signing flags signs
//! every command it sends.
//!
//! Every test uses its own topics and consumer groups.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use models::{
    CacheKey, PrewarmCommand, Reason, RegionId, RegionTargets, SIGNATURE_HEADER, SignatureError,
    Signer, SigningKeys, TenantId, decode, encode,
};
use prefetcher::testing::{SyntheticOrigin, wait_until};
use prefetcher::{
    AgentConfig, AgentTenant, CacheStatus, Config, FlightKey, NodeHandle, spawn_agent, spawn_node,
};
use pulse::{BurstKind, KafkaClients, PrewarmPublisher, TraceSpec, generate_trace};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::Headers;
use tests::fleet::{ProcessEnv, PulseProcess};
use tests::{TestKafka, free_port, produce_signed, wall_ms};

const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";
/// Two secrets, as `openssl rand -hex 32` makes them.
const SECRET_1: &str = "6b1d6a0f0e8c2f4e9a7b3c5d1e2f30415263748596a7b8c9dae0f1021324354f";
const SECRET_2: &str = "f0e1d2c3b4a5968778695a4b3c2d1e0ff0e1d2c3b4a5968778695a4b3c2d1e0f";
/// A secret nobody configured.
const SECRET_FORGED: &str = "0000000000000000000000000000000000000000000000000000000000000001";

/// Writes a key file of `lines` to `path` and returns the set it holds.
fn key_file(path: &Path, lines: &[(&str, &str)]) -> SigningKeys {
    let text: String = lines
        .iter()
        .map(|(id, secret)| format!("{id} {secret}\n"))
        .collect();
    std::fs::write(path, format!("# pre-warm signing keys\n{text}")).unwrap();
    SigningKeys::parse(&text).unwrap()
}

fn signer(id: &str, secret: &str) -> Signer {
    SigningKeys::parse(&format!("{id} {secret}"))
        .unwrap()
        .signer(id)
        .unwrap()
}

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A node for `origin` reading `prewarm_topic` with the keys of `keys_file`, in
/// consumer group `group` (a restarted node resumes where it stopped).
fn node_config(
    origin: &SyntheticOrigin,
    kafka: &TestKafka,
    prewarm_topic: &str,
    events_topic: &str,
    group: &str,
    keys_file: &Path,
) -> Config {
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin.url(),
    );
    config.region = Some(RegionId::new(REGION).unwrap());
    config.node = Some(group.parse().unwrap());
    config.kafka.group_id = Some(group.to_owned());
    config.kafka.brokers = Some(kafka.bootstrap_servers().to_owned());
    config.kafka.events_topic = events_topic.to_owned();
    config.kafka.prewarm_topic = prewarm_topic.to_owned();
    config.kafka.linger_ms = 5;
    config.kafka.prewarm_keys_file = Some(keys_file.to_owned());
    config
}

fn command(key: &str) -> PrewarmCommand {
    let now = wall_ms();
    PrewarmCommand::new(
        format!("c-{key}"),
        TenantId::new(TENANT).unwrap(),
        CacheKey::new(key).unwrap(),
        0.9,
        now,
        now + 120_000,
        RegionTargets::Only(vec![RegionId::new(REGION).unwrap()]),
        Reason {
            model: "test".into(),
            intercept: 0.0,
            features: Vec::new(),
        },
    )
}

/// The forged commands every verifier must refuse, each for a key of its own, with
/// the reason it is counted under: no signature; a signature by a secret nobody
/// holds under a configured id; a payload changed after signing; a key id nobody
/// configured. The good command each test sends after them is `/ok`.
fn forgeries(good: &Signer) -> Vec<(&'static str, &'static str, Vec<u8>, Option<String>)> {
    // It takes the id of the good command sent after it: refused before its id is
    // remembered, it cannot make that one a `duplicate`.
    let mut unsigned = command("/unsigned");
    unsigned.id = command("/ok").id;
    let unsigned = encode(&unsigned);
    let forged = encode(&command("/forged"));
    let forged_sig = signer(good.key_id(), SECRET_FORGED).sign(&forged);
    let original = encode(&command("/original"));
    let tampered = encode(&command("/tampered"));
    let tampered_sig = good.sign(&original);
    let unknown = encode(&command("/unknown"));
    let unknown_sig = signer("k-never-issued", SECRET_1).sign(&unknown);
    vec![
        ("/unsigned", "unsigned", unsigned, None),
        ("/forged", "bad_signature", forged, Some(forged_sig)),
        ("/tampered", "bad_signature", tampered, Some(tampered_sig)),
        ("/unknown", "unknown_key", unknown, Some(unknown_sig)),
    ]
}

fn cached(node: &NodeHandle, path: &str) -> bool {
    let key = FlightKey::new(TenantId::new(TENANT).unwrap(), CacheKey::new(path).unwrap());
    node.node().cache().get_fresh(&key).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_keys_applies_signed_commands_only_and_counts_the_rest() {
    let kafka = TestKafka::start();
    let prewarm = kafka.unique_topic("prewarm-signed");
    let events = kafka.unique_topic("edge-events-signed");
    // One partition: the good command is read after every forgery.
    kafka.create_topic(&prewarm, 1).await;
    kafka.create_topic(&events, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("prewarm.keys");
    key_file(&keys, &[("k1", SECRET_1)]);
    let origin = SyntheticOrigin::start("origin").await;
    let node = spawn_node(node_config(
        &origin,
        &kafka,
        &prewarm,
        &events,
        &unique("edge"),
        &keys,
    ))
    .await
    .unwrap();

    let good = signer("k1", SECRET_1);
    let producer = kafka.producer();
    let forged = forgeries(&good);
    for (_, _, payload, signature) in &forged {
        produce_signed(&producer, &prewarm, "acme/x", payload, signature.as_deref()).await;
    }
    let ok = encode(&command("/ok"));
    produce_signed(&producer, &prewarm, "acme/x", &ok, Some(&good.sign(&ok))).await;

    let m = node.node().metrics();
    wait_until(|| m.prefetches_received.get() == 5, "every command read").await;
    wait_until(|| cached(&node, "/ok"), "the signed pre-warm").await;
    assert_eq!(m.prewarm_rejections("unsigned"), 1);
    assert_eq!(m.prewarm_rejections("bad_signature"), 2);
    assert_eq!(m.prewarm_rejections("unknown_key"), 1);
    for (key, _, _, _) in &forged {
        assert_eq!(origin.fills_for(key), 0, "{key} reached the origin");
        assert!(!cached(&node, key), "{key} was cached");
    }
    assert_eq!(origin.fills_for("/original"), 0);
    assert_eq!((m.prefetches_started.get(), origin.fills()), (1, 1));
    let text = m.encode();
    for reason in ["unsigned", "bad_signature", "unknown_key"] {
        assert!(
            text.contains(&format!(
                "prefetcher_prefetches_rejected_total{{reason=\"{reason}\"}}"
            )),
            "{text}"
        );
    }
    let served = prefetcher::testing::TestClient::new()
        .get(node.addr(), HOST, "/ok")
        .await
        .unwrap();
    assert_eq!(served.x_cache(), Some(CacheStatus::Prefetched));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_agent_with_keys_warms_for_signed_commands_only() {
    let kafka = TestKafka::start();
    let prewarm = kafka.unique_topic("prewarm-signed-agent");
    let events = kafka.unique_topic("edge-events-signed-agent");
    kafka.create_topic(&prewarm, 1).await;
    kafka.create_topic(&events, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("prewarm.keys");
    key_file(&keys, &[("k1", SECRET_1)]);
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    // The agent's pre-warms are GETs to the local cache: a counting server stands in.
    let cache = SyntheticOrigin::start("cache").await;
    let group = unique("agent");
    let mut config = AgentConfig {
        region: Some(RegionId::new(REGION).unwrap()),
        node: Some(group.parse().unwrap()),
        log_path: log,
        state_path: dir.path().join("position.json"),
        cache_url: cache.url(),
        tenants: vec![AgentTenant {
            id: TenantId::new(TENANT).unwrap(),
            hosts: vec![HOST.into()],
        }],
        ..AgentConfig::default()
    };
    config.kafka.brokers = Some(kafka.bootstrap_servers().into());
    config.kafka.events_topic = events.clone();
    config.kafka.prewarm_topic = prewarm.clone();
    config.kafka.group_id = Some(group);
    config.kafka.prewarm_keys_file = Some(keys);
    let agent = spawn_agent(config).await.expect("starting the agent");

    let good = signer("k1", SECRET_1);
    let producer = kafka.producer();
    let forged = forgeries(&good);
    for (_, _, payload, signature) in &forged {
        produce_signed(&producer, &prewarm, "acme/x", payload, signature.as_deref()).await;
    }
    let ok = encode(&command("/ok"));
    produce_signed(&producer, &prewarm, "acme/x", &ok, Some(&good.sign(&ok))).await;

    let m = agent.metrics();
    wait_until(|| m.prefetches_received.get() == 5, "every command read").await;
    wait_until(|| cache.fills_for("/ok") == 1, "the signed pre-warm").await;
    assert_eq!(m.prewarm_rejections("unsigned"), 1);
    assert_eq!(m.prewarm_rejections("bad_signature"), 2);
    assert_eq!(m.prewarm_rejections("unknown_key"), 1);
    for (key, _, _, _) in &forged {
        assert_eq!(cache.fills_for(key), 0, "{key} was warmed");
    }
    assert_eq!(cache.fills(), 1);
    agent.shutdown().await;
}

/// What a node did with a stage's commands: for each, whether it was applied (the
/// origin filled it), and how many were refused as an unknown key and otherwise.
#[derive(Debug, PartialEq, Eq)]
struct StageOutcome {
    applied: Vec<bool>,
    unknown_key: u64,
    other_refusals: u64,
}

/// One stage of a key roll: the node runs with `verifier_keys` (restarted, in the same
/// group, so it reads on from where it stopped) and pulse's own producer sends one
/// command per `(key, key id, secret)` of `sent`, signed with that key.
async fn stage(
    kafka: &TestKafka,
    origin: &SyntheticOrigin,
    config: &Config,
    keys_path: &Path,
    verifier_keys: &[(&str, &str)],
    sent: &[(&str, &str, &str)],
) -> StageOutcome {
    key_file(keys_path, verifier_keys);
    let node = spawn_node(config.clone()).await.unwrap();
    let clients = KafkaClients::new(kafka.bootstrap_servers().to_owned());
    for (path, id, secret) in sent {
        let publisher = PrewarmPublisher::new(&clients, &config.kafka.prewarm_topic)
            .unwrap()
            .with_signer(signer(id, secret));
        publisher.send(&command(path)).unwrap();
        publisher.flush(Duration::from_secs(30));
    }
    let m = node.node().metrics();
    let refusals = || {
        ["unsigned", "bad_signature", "unknown_key"]
            .map(|r| m.prewarm_rejections(r))
            .iter()
            .sum::<u64>()
    };
    let fills = || {
        sent.iter()
            .map(|(path, _, _)| origin.fills_for(path) as u64)
            .sum::<u64>()
    };
    let n = sent.len() as u64;
    wait_until(
        || m.prefetches_received.get() == n,
        "the stage's commands read",
    )
    .await;
    wait_until(
        || refusals() + fills() == n,
        "each command refused or filled",
    )
    .await;
    let outcome = StageOutcome {
        applied: sent
            .iter()
            .map(|(path, _, _)| origin.fills_for(path) == 1)
            .collect(),
        unknown_key: m.prewarm_rejections("unknown_key"),
        other_refusals: refusals() - m.prewarm_rejections("unknown_key"),
    };
    node.shutdown().await;
    outcome
}

/// The roll procedure of the docs, end to end: (1) every verifier gets the new key
/// beside the old, (2) the signer switches to the new key, (3) the old key is removed.
/// No command is refused during the roll; after it, one signed with the old key is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_rolled_with_both_keys_valid_and_the_old_one_then_refused() {
    let kafka = TestKafka::start();
    let prewarm = kafka.unique_topic("prewarm-roll");
    let events = kafka.unique_topic("edge-events-roll");
    kafka.create_topic(&prewarm, 1).await;
    kafka.create_topic(&events, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("prewarm.keys");
    let origin = SyntheticOrigin::start("origin").await;
    let config = node_config(
        &origin,
        &kafka,
        &prewarm,
        &events,
        &unique("edge-roll"),
        &keys,
    );
    let old = ("k-2026-11", SECRET_1);
    let new = ("k-2026-12", SECRET_2);

    // Before: the old key everywhere.
    let before = stage(
        &kafka,
        &origin,
        &config,
        &keys,
        &[old],
        &[("/before", old.0, old.1)],
    )
    .await;
    assert_eq!(
        before,
        StageOutcome {
            applied: vec![true],
            unknown_key: 0,
            other_refusals: 0
        }
    );
    // (1) The new key beside the old at the verifiers; pulse still signs with the old,
    // (2) then with the new: both applied.
    let during = stage(
        &kafka,
        &origin,
        &config,
        &keys,
        &[old, new],
        &[("/during-old", old.0, old.1), ("/during-new", new.0, new.1)],
    )
    .await;
    assert_eq!(
        during,
        StageOutcome {
            applied: vec![true, true],
            unknown_key: 0,
            other_refusals: 0
        }
    );
    // (3) The old key removed: its commands are an unknown key, the new key's applied.
    let after = stage(
        &kafka,
        &origin,
        &config,
        &keys,
        &[new],
        &[("/after-old", old.0, old.1), ("/after-new", new.0, new.1)],
    )
    .await;
    assert_eq!(
        after,
        StageOutcome {
            applied: vec![false, true],
            unknown_key: 1,
            other_refusals: 0
        }
    );
    assert_eq!(origin.fills_for("/after-old"), 0);
}

/// `pulse serve --prewarm-signing-keys FILE --prewarm-signing-key-id ID` signs every
/// command it sends: each on the prewarm topic carries one signature header that
/// verifies against the exact payload with the file's keys, by the named key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulse_serve_with_a_signing_key_signs_every_command() {
    let kafka = TestKafka::start();
    let events_topic = kafka.unique_topic("pulse-signed-events");
    let prewarm_topic = kafka.unique_topic("pulse-signed-commands");
    kafka.create_topic(&events_topic, 1).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let keys_path = dir.path().join("prewarm.keys");
    let keys = key_file(&keys_path, &[("k-old", SECRET_1), ("k-new", SECRET_2)]);

    let trace = generate_trace(&TraceSpec {
        duration_ms: 60_000,
        background_rps: 50.0,
        virals: 1,
        noise: 0,
        crons: 0,
        flash_crowds: 0,
        ..TraceSpec::default()
    });
    let viral = trace
        .bursts
        .iter()
        .find(|b| b.kind == BurstKind::Viral)
        .unwrap()
        .clone();
    let env = ProcessEnv {
        dir: dir.path().to_owned(),
        vars: Vec::new(),
    };
    let args = [
        "--brokers",
        kafka.bootstrap_servers(),
        "--topic",
        &events_topic,
        "--group",
        &format!("{events_topic}-pulse"),
        "--prewarm-topic",
        &prewarm_topic,
        "--no-model-topic",
        "--prewarm-signing-keys",
        keys_path.to_str().unwrap(),
        "--prewarm-signing-key-id",
        "k-new",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut pulse = PulseProcess::start("pulse-signing", free_port(), args, &env);

    let consumer = kafka.consumer(&format!("{prewarm_topic}-edge"));
    consumer.subscribe(&[&prewarm_topic]).unwrap();
    let producer = kafka.producer();
    let events = trace.events.clone();
    let topic = events_topic.clone();
    let produced =
        tokio::spawn(
            async move { pulse::testing::produce_paced(&producer, &topic, &events, 4).await },
        );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut read = 0;
    loop {
        let message = match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(message) => message.expect("consuming the prewarm topic"),
            Err(_) => panic!(
                "no pre-warm command for {} after {read}; pulse's log:\n{}",
                viral.key,
                pulse.log_tail()
            ),
        };
        read += 1;
        let payload = message.payload().unwrap_or_default();
        let signatures: Vec<&[u8]> = message
            .headers()
            .map(|h| {
                h.iter()
                    .filter(|h| h.key == SIGNATURE_HEADER)
                    .filter_map(|h| h.value)
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(signatures.len(), 1, "one signature header");
        assert_eq!(keys.verify(Some(signatures[0]), payload), Ok("k-new"));
        // The signature covers the payload: any change to it is refused.
        let mut tampered = payload.to_vec();
        tampered.push(b' ');
        assert_eq!(
            keys.verify(Some(signatures[0]), &tampered),
            Err(SignatureError::BadSignature)
        );
        let command: PrewarmCommand = decode(payload).expect("a valid command");
        if command.key == viral.key {
            break;
        }
    }
    pulse.expect_running();
    produced.await.expect("producing the trace");
    let log = pulse.log_tail();
    assert!(log.contains("pre-warm commands are signed"), "{log}");
}

/// A key file that would leave the edge unable to check commands (a short secret, a
/// key id twice, bad hex, no file) fails the start of a node and of an edge agent,
/// naming the setting and the line, and never printing a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_file_fails_the_start_naming_the_setting() {
    let kafka = TestKafka::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("prewarm.keys");
    let origin = SyntheticOrigin::start("origin").await;
    let cases = [
        (format!("k1 {}\n", &SECRET_1[..40]), "line 1"),
        (format!("k1 {SECRET_1}\nk1 {SECRET_2}\n"), "line 2"),
        (format!("k1 {}\n", SECRET_1.replace('6', "x")), "not hex"),
    ];
    for (text, want) in cases {
        std::fs::write(&keys, &text).unwrap();
        let config = node_config(
            &origin,
            &kafka,
            "prewarm",
            "edge-events",
            &unique("edge-bad"),
            &keys,
        );
        let error = spawn_node(config)
            .await
            .expect_err("a bad key file")
            .to_string();
        assert!(
            error.contains("kafka.prewarm_keys_file") && error.contains(want),
            "{error}"
        );
        assert!(!error.contains(&SECRET_1[4..30]), "{error}");

        let mut agent = AgentConfig {
            region: Some(RegionId::new(REGION).unwrap()),
            node: Some("agent-bad".parse().unwrap()),
            log_path: dir.path().join("access.log"),
            state_path: dir.path().join("position.json"),
            tenants: vec![AgentTenant {
                id: TenantId::new(TENANT).unwrap(),
                hosts: vec![HOST.into()],
            }],
            ..AgentConfig::default()
        };
        agent.kafka.brokers = Some(kafka.bootstrap_servers().into());
        agent.kafka.prewarm_keys_file = Some(keys.clone());
        let error = spawn_agent(agent)
            .await
            .expect_err("a bad key file")
            .to_string();
        assert!(
            error.contains("kafka.prewarm_keys_file") && error.contains(want),
            "{error}"
        );
    }
    std::fs::remove_file(&keys).unwrap();
    let config = node_config(
        &origin,
        &kafka,
        "prewarm",
        "edge-events",
        &unique("edge-bad"),
        &keys,
    );
    let error = spawn_node(config)
        .await
        .expect_err("no key file")
        .to_string();
    assert!(error.contains("kafka.prewarm_keys_file"), "{error}");
}
