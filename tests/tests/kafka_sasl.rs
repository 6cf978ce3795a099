//! pulse, a prefetcher node and the edge agent through a broker that requires SASL
//! (mechanism PLAIN) over TLS (SASL_SSL, the shape of a managed Kafka) or over
//! plaintext (SASL_PLAINTEXT), each given the credentials and the CA as librdkafka
//! properties (pulse's `kafka_properties`, the edges' `kafka.properties`):
//! - events flow edge → pulse: a node's user requests and the lines of a log the agent
//!   follows reach the events topic, and pulse counts them;
//! - a pre-warm command flows pulse → edge: one sent by pulse's own producer
//!   ([`PrewarmPublisher`], built from the same properties) makes the node fill the key
//!   and the agent warm it;
//! - pulse given a wrong password does not count nothing in silence: its ingest
//!   consumer counts the broker's refusal (`pulse_consume_errors_total{reason=
//!   "authentication"}`);
//! - over TLS, pulse that does not trust the broker's CA (no `ssl.ca.location`,
//!   certificate verification on) counts the failed handshakes the same way
//!   (`pulse_consume_errors_total{reason="tls"}`: librdkafka's `SSL` error) and
//!   consumes nothing.
//!
//! The broker: `KAFKA_SASL_BOOTSTRAP_SERVERS` (`scripts/test` starts one with
//! `KAFKA_SASL=1 KAFKA_TLS=1 KAFKA_PORT=29092 scripts/kafka start`), the user and
//! password in `KAFKA_SASL_USERNAME` / `KAFKA_SASL_PASSWORD` (default: the script's test
//! user, `edge-pulse` / `edge-pulse-secret`). `KAFKA_SASL_CA` names the CA certificate
//! the broker's is signed by (`$KAFKA_RUN_DIR/tls/ca.pem`, which `scripts/test` sets):
//! with it every client speaks SASL_SSL and trusts that CA; without it, SASL_PLAINTEXT
//! (a broker started without `KAFKA_TLS=1`). Without the servers variable the test
//! fails, naming it: it is never skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use models::{CacheKey, PrewarmCommand, Reason, RegionId, RegionTargets, TenantId};
use prefetcher::testing::{SyntheticOrigin, TestClient, wait_until};
use prefetcher::{
    AgentConfig, AgentTenant, Config, FlightKey, LogFormat, NodeHandle, spawn_agent, spawn_node,
};
use pulse::testing::unique_name;
use pulse::{KafkaClients, PrewarmPublisher, PulseConfig, PulseHandle};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const SERVERS_ENV: &str = "KAFKA_SASL_BOOTSTRAP_SERVERS";
const CA_ENV: &str = "KAFKA_SASL_CA";
const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";

/// The SASL broker's address; panics naming the variable when it is not set.
fn servers() -> String {
    match std::env::var(SERVERS_ENV) {
        Ok(s) if !s.trim().is_empty() => s,
        _ => panic!(
            "{SERVERS_ENV} is not set: this test needs a broker that requires SASL \
             (KAFKA_SASL=1 KAFKA_TLS=1 KAFKA_PORT=29092 \
             KAFKA_RUN_DIR=/tmp/edge-pulse-kafka-sasl scripts/kafka start; \
             {SERVERS_ENV}=127.0.0.1:29092 {CA_ENV}=/tmp/edge-pulse-kafka-sasl/tls/ca.pem)"
        ),
    }
}

/// The CA certificate the broker's is signed by, when its listener speaks TLS.
fn ca() -> Option<String> {
    std::env::var(CA_ENV).ok().filter(|s| !s.trim().is_empty())
}

/// The librdkafka properties of a SASL/PLAIN client with `password`: over TLS,
/// trusting [`ca`], when there is one.
fn sasl(password: &str) -> BTreeMap<String, String> {
    let mut properties = sasl_untrusted(password);
    if let Some(ca) = ca() {
        properties.insert("ssl.ca.location".into(), ca);
    }
    properties
}

/// [`sasl`] without the CA: over TLS, a client that cannot verify the broker.
fn sasl_untrusted(password: &str) -> BTreeMap<String, String> {
    let user = std::env::var("KAFKA_SASL_USERNAME").unwrap_or_else(|_| "edge-pulse".into());
    let protocol = if ca().is_some() {
        "SASL_SSL"
    } else {
        "SASL_PLAINTEXT"
    };
    [
        ("security.protocol", protocol),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", user.as_str()),
        ("sasl.password", password),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn password() -> String {
    std::env::var("KAFKA_SASL_PASSWORD").unwrap_or_else(|_| "edge-pulse-secret".into())
}

/// Creates `topics` on the broker, through SASL.
async fn create_topics(servers: &str, topics: &[&str]) {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", servers);
    for (k, v) in sasl(&password()) {
        config.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> = config.create().expect("an admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 2, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    for result in admin
        .create_topics(&new, &options)
        .await
        .expect("creating topics through SASL")
    {
        result.unwrap_or_else(|(topic, e)| panic!("creating {topic}: {e}"));
    }
}

async fn start_pulse(
    servers: &str,
    properties: BTreeMap<String, String>,
    events: &str,
    prewarm: &str,
) -> PulseHandle {
    pulse::start(PulseConfig {
        brokers: Some(servers.to_owned()),
        kafka_properties: properties,
        topic: events.to_owned(),
        prewarm_topic: prewarm.to_owned(),
        group: format!("{events}-pulse"),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse")
}

fn command(key: &str) -> PrewarmCommand {
    let now = pulse::wall_clock_ms();
    PrewarmCommand::new(
        unique_name("sasl-command"),
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

fn cached(node: &NodeHandle, path: &str) -> bool {
    let key = FlightKey::new(TenantId::new(TENANT).unwrap(), CacheKey::new(path).unwrap());
    node.node().cache().get_fresh(&key).is_some()
}

/// An nginx access-log line (`deploy/nginx/edge.conf`'s JSON format) for `uri`, now.
fn nginx_line(uri: &str) -> String {
    let now = pulse::wall_clock_ms();
    format!(
        r#"{{"ts":"{}.{:03}","host":"{HOST}","uri":"{uri}","method":"GET","status":"200","cache":"MISS","referer":"","bytes":"512","upstream_time":"0.010","prewarm":""}}"#,
        now / 1000,
        now % 1000
    ) + "\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulse_and_the_edges_run_through_a_sasl_broker() {
    let servers = servers();
    let events_topic = unique_name("sasl-edge-events");
    let prewarm_topic = unique_name("sasl-prewarm");
    create_topics(&servers, &[&events_topic, &prewarm_topic]).await;
    let pulse = start_pulse(&servers, sasl(&password()), &events_topic, &prewarm_topic).await;

    // A prefetcher node, its Kafka clients through SASL.
    let origin = SyntheticOrigin::start("origin").await;
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin.url(),
    );
    let node_id = unique_name("sasl-node");
    config.region = Some(RegionId::new(REGION).unwrap());
    config.node = Some(node_id.parse().unwrap());
    config.kafka.brokers = Some(servers.clone());
    config.kafka.events_topic = events_topic.clone();
    config.kafka.prewarm_topic = prewarm_topic.clone();
    config.kafka.group_id = Some(format!("{prewarm_topic}-{node_id}"));
    config.kafka.linger_ms = 5;
    config.kafka.properties = sasl(&password());
    let node = spawn_node(config).await.expect("starting the node");

    // The edge agent following a log file, warming a stand-in for its cache.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    let cache = SyntheticOrigin::start("cache").await;
    let agent_node = unique_name("sasl-agent");
    let mut agent_config = AgentConfig {
        region: Some(RegionId::new(REGION).unwrap()),
        node: Some(agent_node.parse().unwrap()),
        log_path: log.clone(),
        log_format: LogFormat::NginxJson,
        state_path: dir.path().join("position.json"),
        poll_ms: 20,
        cache_url: cache.url(),
        tenants: vec![AgentTenant {
            id: TenantId::new(TENANT).unwrap(),
            hosts: vec![HOST.into()],
        }],
        ..AgentConfig::default()
    };
    agent_config.kafka.brokers = Some(servers.clone());
    agent_config.kafka.events_topic = events_topic.clone();
    agent_config.kafka.prewarm_topic = prewarm_topic.clone();
    agent_config.kafka.group_id = Some(format!("{prewarm_topic}-{agent_node}"));
    agent_config.kafka.linger_ms = 5;
    agent_config.kafka.properties = sasl(&password());
    let agent = spawn_agent(agent_config).await.expect("starting the agent");

    // Edge → pulse: three user requests at the node, three lines in the agent's log.
    for path in ["/n1", "/n2", "/n3"] {
        let fetched = TestClient::new()
            .get(node.addr(), HOST, path)
            .await
            .expect("a request to the node");
        assert_eq!(fetched.status, 200);
    }
    let lines: String = ["/a1", "/a2", "/a3"]
        .iter()
        .map(|u| nginx_line(u))
        .collect();
    std::fs::write(&log, lines).unwrap();
    let consumed = || pulse.metrics().consumed.get();
    // Pulse counts the six (its partitions are assigned first, then it reads the topic
    // from the beginning of the group).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while consumed() < 6 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pulse counted {} of the 6 events through SASL (node published {}, agent queued {})",
            consumed(),
            node.node().metrics().events_published.get(),
            agent.agent_metrics().events_queued.get()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(consumed(), 6, "each event counted once");
    assert_eq!(node.node().metrics().events_dropped.get(), 0);

    // Pulse → edge: a command from pulse's own producer, built from the same properties.
    let kafka = KafkaClients::new(servers.clone())
        .with_properties(sasl(&password()))
        .unwrap();
    let publisher = PrewarmPublisher::new(&kafka, &prewarm_topic).expect("pulse's producer");
    publisher
        .send(&command("/warm"))
        .expect("queueing the command");
    publisher.flush(Duration::from_secs(30));
    wait_until(|| cached(&node, "/warm"), "the node's pre-warm fill").await;
    assert_eq!(origin.fills_for("/warm"), 1);
    wait_until(
        || agent.agent_metrics().warms_ok.get() >= 1,
        "the agent's pre-warm",
    )
    .await;
    assert_eq!(cache.fills_for("/warm"), 1);
    assert_eq!(
        consume_errors(&pulse, "authentication").await,
        0,
        "no authentication error with the right password"
    );
    if ca().is_some() {
        assert_eq!(
            consume_errors(&pulse, "tls").await,
            0,
            "no TLS error with the CA trusted"
        );
    }

    agent.shutdown().await;
    node.shutdown().await;
    pulse.shutdown().await;

    // A wrong password: pulse starts (the broker may be away for a while), counts the
    // broker's refusal and says so in /metrics, and consumes nothing.
    let wrong = start_pulse(
        &servers,
        sasl("not-the-password"),
        &events_topic,
        &prewarm_topic,
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while consume_errors(&wrong, "authentication").await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pulse with a wrong password did not report the broker's refusal in /metrics"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(wrong.metrics().consumed.get(), 0);
    assert_eq!(wrong.metrics().partitions_owned.get(), 0);
    wrong.shutdown().await;

    // Over TLS, a CA pulse does not trust: the right password, but no ssl.ca.location and
    // certificate verification on. Every handshake fails (librdkafka's `SSL` error, which
    // pulse counts as `tls`), pulse says so in /metrics and consumes nothing.
    if ca().is_some() {
        let mut properties = sasl_untrusted(&password());
        properties.insert("enable.ssl.certificate.verification".into(), "true".into());
        let untrusting = start_pulse(&servers, properties, &events_topic, &prewarm_topic).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while consume_errors(&untrusting, "tls").await == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "pulse that does not trust the broker's CA did not report the failed \
                 handshakes in /metrics"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(consume_errors(&untrusting, "authentication").await, 0);
        assert_eq!(untrusting.metrics().consumed.get(), 0);
        assert_eq!(untrusting.metrics().partitions_owned.get(), 0);
        untrusting.shutdown().await;
    }
}

/// `pulse_consume_errors_total{reason="<reason>"}` from `pulse`'s `GET /metrics` (0
/// before the first).
async fn consume_errors(pulse: &PulseHandle, reason: &str) -> u64 {
    let fetched = TestClient::new()
        .get(pulse.api_addr(), "pulse", "/metrics")
        .await
        .expect("GET /metrics");
    assert_eq!(fetched.status, 200);
    let text = String::from_utf8(fetched.body.unwrap_or_default().to_vec()).unwrap();
    let prefix = format!("pulse_consume_errors_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// This build's librdkafka has TLS and the SASL mechanisms a managed Kafka asks for
/// (rdkafka's `ssl` feature: OpenSSL, SCRAM and OAUTHBEARER come with it), read from
/// librdkafka's own `builtin.features`.
#[test]
fn librdkafka_is_built_with_tls_and_sasl() {
    let native = ClientConfig::new()
        .create_native_config()
        .expect("a librdkafka configuration");
    let features = native
        .get("builtin.features")
        .expect("the builtin.features property");
    let features: Vec<&str> = features.split(',').collect();
    for wanted in ["ssl", "sasl_plain", "sasl_scram", "sasl_oauthbearer"] {
        assert!(
            features.contains(&wanted),
            "librdkafka lacks {wanted}: builtin.features={features:?}"
        );
    }
}
