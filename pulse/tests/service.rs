//! The assembly as `pulse serve` runs it, on its own embedded broker: config checks
//! name the field, events reach the API over a real socket, the bearer token guards
//! `/api/*`, shutdown writes the final checkpoint, and a restart restores it.

use std::time::Duration;

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use pulse::{PulseConfig, PulseHandle};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T0: u64 = 1_764_470_000_000;

fn local() -> PulseConfig {
    PulseConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..PulseConfig::default()
    }
}

/// One HTTP/1.1 GET over a fresh connection: the status code and the body.
async fn get(pulse: &PulseHandle, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(pulse.api_addr())
        .await
        .expect("connecting to the API");
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nhost: pulse\r\n{auth}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

fn produce(brokers: &str, topic: &str, n: u64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    for i in 0..n {
        let event = AccessEvent::new(
            T0 + i * 10,
            TenantId::new("acme").unwrap(),
            CacheKey::new("/live/score.json").unwrap(),
            RegionId::new("eu-west").unwrap(),
            NodeId::new("edge-1").unwrap(),
            Outcome::Miss,
        );
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&event.partition_key())
                    .payload(&encode(&event)),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

async fn wait_consumed(pulse: &PulseHandle, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while pulse.metrics().consumed.get() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled at {} of {n}: {}",
            pulse.metrics().consumed.get(),
            pulse.metrics().encode()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_bad_config_is_refused_naming_the_field() {
    assert_eq!(PulseConfig::default().validate(), Ok(()));
    let cases: [(&str, PulseConfig); 11] = [
        (
            "brokers",
            PulseConfig {
                brokers: Some("nohost".into()),
                ..PulseConfig::default()
            },
        ),
        (
            "topic",
            PulseConfig {
                topic: " ".into(),
                ..PulseConfig::default()
            },
        ),
        (
            "dead_letter_topic",
            PulseConfig {
                dead_letter_topic: Some(pulse::EVENTS_TOPIC.into()),
                ..PulseConfig::default()
            },
        ),
        (
            "checkpoint_interval_secs",
            PulseConfig {
                checkpoint_interval_secs: 0,
                ..PulseConfig::default()
            },
        ),
        (
            "heat.top_k",
            PulseConfig {
                heat: pulse::HeatConfig {
                    top_k: 0,
                    ..pulse::HeatConfig::default()
                },
                ..PulseConfig::default()
            },
        ),
        (
            "threshold",
            PulseConfig {
                threshold: 1.5,
                ..PulseConfig::default()
            },
        ),
        (
            "tenant_burst",
            PulseConfig {
                tenant_burst: 0.5,
                ..PulseConfig::default()
            },
        ),
        (
            "prewarm_topic",
            PulseConfig {
                prewarm_topic: pulse::EVENTS_TOPIC.into(),
                ..PulseConfig::default()
            },
        ),
        (
            "prewarm_signing_key_id",
            PulseConfig {
                prewarm_signing_keys: Some("/etc/edge-pulse/prewarm.keys".into()),
                ..PulseConfig::default()
            },
        ),
        (
            "prewarm_signing_key_id",
            PulseConfig {
                prewarm_signing_key_id: Some("k1".into()),
                ..PulseConfig::default()
            },
        ),
        (
            "prewarm_signing_key_id",
            PulseConfig {
                prewarm_signing_keys: Some("/etc/edge-pulse/prewarm.keys".into()),
                prewarm_signing_key_id: Some("k 1".into()),
                ..PulseConfig::default()
            },
        ),
    ];
    for (field, config) in cases {
        let error = config.validate().expect_err(field);
        assert_eq!(error.field, field, "{error}");
    }
}

#[test]
fn the_config_file_format_refuses_unknown_fields_and_fills_defaults() {
    let config: PulseConfig =
        serde_json::from_str(r#"{"topic":"events","retrain_interval_secs":0}"#).unwrap();
    assert_eq!(config.topic, "events");
    assert_eq!(config.retrain_interval_secs, 0);
    assert_eq!(config.group, PulseConfig::default().group);
    assert!(serde_json::from_str::<PulseConfig>(r#"{"topik":"events"}"#).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_fails_the_start() {
    let result = pulse::start(PulseConfig {
        threshold: -1.0,
        ..local()
    })
    .await;
    assert!(
        matches!(&result, Err(pulse::StartError::Config(e)) if e.field == "threshold"),
        "{:?}",
        result.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_api_and_a_restart_restores_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("pulse.ckpt");
    let config = PulseConfig {
        checkpoint: Some(checkpoint.clone()),
        checkpoint_interval_secs: 1,
        api_token: Some("s3cret".into()),
        ..local()
    };

    let first = pulse::start(config.clone()).await.expect("starting pulse");
    assert!(first.embedded_broker(), "no brokers: an embedded one");
    assert!(
        first.partitions().read().unwrap().prediction_on(),
        "prediction is on by default"
    );
    let brokers = first.brokers().to_owned();
    tokio::task::spawn_blocking(move || produce(&brokers, pulse::EVENTS_TOPIC, 50))
        .await
        .unwrap();
    wait_consumed(&first, 50).await;

    let (status, _) = get(&first, "/api/tenants", None).await;
    assert_eq!(status, 401, "the token guards /api/*");
    let (status, _) = get(&first, "/healthz", None).await;
    assert_eq!(status, 200, "health stays open");
    let (status, body) = get(&first, "/api/keys/acme/live/score.json", Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":50"), "{body}");

    first.shutdown().await;
    assert!(checkpoint.exists(), "shutdown writes the final checkpoint");
    // With each partition's online calibration, for the model in use.
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    let snapshots = written["partitions"].as_array().expect("partitions");
    assert!(!snapshots.is_empty());
    for snapshot in snapshots {
        let model = &snapshot["calibration"]["model"];
        assert_eq!(
            model[0],
            pulse::default_model().name.as_str(),
            "{}",
            snapshot["calibration"]
        );
    }

    // A new embedded broker with an empty topic: whatever the API shows comes from the
    // checkpoint, restored as each partition is assigned.
    let second = pulse::start(config).await.expect("restarting pulse");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !second.partitions().read().unwrap().complete() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partitions never assigned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = get(&second, "/api/keys/acme/live/score.json", Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":50"), "{body}");
    assert_eq!(second.metrics().consumed.get(), 0);
    // The snapshot's offset is past the new topic's end: new events at the topic's
    // first offsets are applied, not taken for ones the snapshot holds.
    let brokers = second.brokers().to_owned();
    tokio::task::spawn_blocking(move || produce(&brokers, pulse::EVENTS_TOPIC, 10))
        .await
        .unwrap();
    wait_consumed(&second, 10).await;
    let (status, body) = get(&second, "/api/keys/acme/live/score.json", Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":60"), "{body}");
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prewarm_there_is_no_predictor() {
    let pulse = pulse::start(PulseConfig {
        prewarm: false,
        ..local()
    })
    .await
    .expect("starting pulse");
    assert!(!pulse.partitions().read().unwrap().prediction_on());
    let (status, _) = get(&pulse, "/api/tenants", None).await;
    assert_eq!(status, 200, "no token configured: open");
    pulse.shutdown().await;
}
