//! Broker faults: the broker stops and comes back while pulse and a prefetcher run.
//!
//! - pulse keeps serving its API during the outage; once the group session times out
//!   its assignment is lost and it says so (`503 owner_unavailable` for a key, an
//!   incomplete `coverage`), its partitions parked for the checkpoint; a pulse
//!   restarted *during* the outage owns no partition until the group is back, and says
//!   so too; once the broker is back
//!   each partition is assigned and restored from its checkpoint snapshot, which is
//!   ahead of the committed offset (its commit failed), so the partition goes on live
//!   from the snapshot: nothing is lost, and nothing is counted twice (at most the
//!   events consumed after the last commit, the documented at-least-once window);
//! - a prefetcher keeps answering every request at once and counts the events it
//!   could not deliver as dropped, then publishes again;
//! - nothing crashes and every shutdown finishes in bounded time.
//!
//! Which broker:
//! - `KAFKA_FAULTS=1` with `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT` (and `KAFKA_RUN_DIR`):
//!   a real Apache Kafka that the test stops and restarts with `scripts/kafka stop` /
//!   `KAFKA_KEEP_DATA=1 scripts/kafka start` (started first if it is not running, and
//!   then stopped at the end). It must be a private broker: the test refuses port 9092,
//!   the shared one. For example:
//!   `KAFKA_FAULTS=1 KAFKA_PORT=19092 KAFKA_RUN_DIR=/tmp/kafka-faults
//!   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 cargo test -p tests --test faults_broker`.
//! - otherwise: librdkafka's mock cluster in this process, whose broker is taken down
//!   (connections closed, new ones refused, as for a stopped broker or a closed port)
//!   and brought back up with its log and committed offsets intact. Same scenario,
//!   same assertions.

use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, encode};
use prefetcher::testing::{SyntheticOrigin, TestClient};
use prefetcher::{Config, NodeHandle, spawn_node};
use pulse::{PulseConfig, PulseHandle};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use tests::{committed_offsets, wall_ms};
use tower::ServiceExt;

const T0: u64 = 1_764_470_000_000;
const TENANT: &str = "acme";
const HOST: &str = "acme.example";
/// The shared broker of `scripts/test`: never stopped by this test.
const SHARED_PORT: u16 = 9092;

/// The broker under test and how to stop and restart it.
enum Broker {
    Real {
        servers: String,
        port: u16,
        run_dir: PathBuf,
        started_here: bool,
    },
    Mock {
        servers: String,
        requests_tx: mpsc::Sender<MockRequest>,
    },
}

enum MockRequest {
    Topic(String, i32),
    Down,
    Up,
}

fn scripts_kafka() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka")
}

impl Broker {
    fn start() -> Broker {
        let faults = std::env::var("KAFKA_FAULTS").is_ok_and(|v| v == "1");
        let broker = if faults { Self::real() } else { Self::mock() };
        eprintln!(
            "kafka under test: {} at {}",
            match broker {
                Broker::Real { .. } => "real broker (stopped and restarted by this test)",
                Broker::Mock { .. } => "mock cluster (broker taken down and up in process)",
            },
            broker.servers()
        );
        broker
    }

    fn real() -> Broker {
        let servers = std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_default();
        let port: u16 = servers
            .trim()
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "KAFKA_FAULTS=1 needs KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT naming a \
                     private broker, got {servers:?}"
                )
            });
        assert_ne!(
            port, SHARED_PORT,
            "KAFKA_FAULTS=1 stops the broker: refusing the shared one on {SHARED_PORT}; \
             use KAFKA_PORT=19092 KAFKA_RUN_DIR=/tmp/kafka-faults"
        );
        if let Ok(p) = std::env::var("KAFKA_PORT") {
            assert_eq!(
                p,
                port.to_string(),
                "KAFKA_PORT differs from the bootstrap port"
            );
        }
        let run_dir = std::env::var("KAFKA_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(format!("/tmp/kafka-faults-{port}")));
        let started_here = !answers(port);
        let broker = Broker::Real {
            servers,
            port,
            run_dir,
            started_here,
        };
        broker.script("start");
        broker
    }

    fn mock() -> Broker {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (requests_tx, requests_rx) = mpsc::channel::<MockRequest>();
        // The cluster handle is not `Send`: one thread owns it.
        std::thread::spawn(move || {
            let cluster = MockCluster::new(1).expect("starting a mock cluster");
            ready_tx.send(cluster.bootstrap_servers()).unwrap();
            for request in requests_rx {
                match request {
                    MockRequest::Topic(name, partitions) => {
                        cluster.create_topic(&name, partitions, 1).unwrap()
                    }
                    MockRequest::Down => cluster.broker_down(1).unwrap(),
                    MockRequest::Up => cluster.broker_up(1).unwrap(),
                }
            }
        });
        Broker::Mock {
            servers: ready_rx.recv().expect("mock cluster thread"),
            requests_tx,
        }
    }

    fn servers(&self) -> &str {
        match self {
            Broker::Real { servers, .. } | Broker::Mock { servers, .. } => servers,
        }
    }

    fn script(&self, action: &str) {
        let Broker::Real { port, run_dir, .. } = self else {
            unreachable!()
        };
        assert_ne!(*port, SHARED_PORT);
        let started = Instant::now();
        let status = Command::new(scripts_kafka())
            .arg(action)
            .env("KAFKA_PORT", port.to_string())
            .env("KAFKA_RUN_DIR", run_dir)
            // A restart keeps the log and the committed offsets, as a real one does.
            .env("KAFKA_KEEP_DATA", "1")
            .status()
            .expect("running scripts/kafka");
        assert!(status.success(), "scripts/kafka {action}: {status}");
        eprintln!("scripts/kafka {action}: {:?}", started.elapsed());
    }

    fn mock_request(&self, request: MockRequest) {
        let Broker::Mock { requests_tx, .. } = self else {
            unreachable!()
        };
        requests_tx.send(request).expect("mock cluster thread");
    }

    async fn create_topic(&self, name: &str, partitions: i32) {
        match self {
            Broker::Mock { .. } => self.mock_request(MockRequest::Topic(name.into(), partitions)),
            Broker::Real { .. } => {
                let admin: AdminClient<DefaultClientContext> =
                    self.config().create().expect("admin client");
                let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
                for result in admin
                    .create_topics([&topic], &AdminOptions::new())
                    .await
                    .expect("CreateTopics")
                {
                    result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
                }
            }
        }
    }

    fn down(&self) {
        match self {
            Broker::Mock { .. } => self.mock_request(MockRequest::Down),
            Broker::Real { .. } => self.script("stop"),
        }
    }

    fn up(&self) {
        match self {
            Broker::Mock { .. } => self.mock_request(MockRequest::Up),
            Broker::Real { .. } => self.script("start"),
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.servers());
        config
    }

    /// The sum of `group`'s committed offsets on `topic`, or `None` while the broker
    /// cannot say.
    fn committed(&self, group: &str, topic: &str, partitions: i32) -> Option<i64> {
        let committed = committed_offsets(
            &self.config(),
            group,
            topic,
            partitions,
            Duration::from_secs(5),
        )
        .ok()?;
        Some(committed.into_iter().map(|o| o.unwrap_or(0)).sum())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Broker::Real {
            started_here: true, ..
        } = self
        {
            self.script("stop");
        }
    }
}

fn answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        .is_ok()
}

fn event(i: u64) -> AccessEvent {
    AccessEvent::new(
        T0 + i * 10,
        TenantId::new(TENANT).unwrap(),
        CacheKey::new("/live/score.json").unwrap(),
        RegionId::new(["eu-west", "us-east"][i as usize % 2]).unwrap(),
        NodeId::new("edge-1").unwrap(),
        Outcome::Miss,
    )
}

async fn produce(producer: &FutureProducer, topic: &str, range: std::ops::Range<u64>) {
    for i in range {
        let e = event(i);
        producer
            .send(
                FutureRecord::to(topic)
                    .key(&e.partition_key())
                    .payload(&encode(&e)),
                Duration::from_secs(30),
            )
            .await
            .expect("producing an event");
    }
}

/// Polls `done` every 50 ms for at most `limit`; panics naming `what` otherwise.
async fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET uri` on pulse's dashboard API: the status and the JSON body.
async fn api_get(pulse: &PulseHandle, uri: &str) -> (StatusCode, Value) {
    let response = pulse
        .router()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

/// The key's count in the 60 s window, read through pulse's dashboard API.
async fn api_count(pulse: &PulseHandle) -> u64 {
    let (status, stats) = api_get(pulse, &format!("/api/keys/{TENANT}/live/score.json")).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["windows"][3]["window"], "60s");
    stats["windows"][3]["total"].as_u64().unwrap()
}

/// Stops pulse (final checkpoint and commit included) within `limit`.
async fn stop_pulse(pulse: PulseHandle, limit: Duration) {
    let started = Instant::now();
    tokio::time::timeout(limit, pulse.shutdown())
        .await
        .unwrap_or_else(|_| panic!("pulse did not stop within {limit:?}"));
    eprintln!("pulse stopped in {:?}", started.elapsed());
}

async fn node(
    broker: &Broker,
    origin: &SyntheticOrigin,
    events: &str,
    prewarm: &str,
) -> NodeHandle {
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new(TENANT).unwrap(),
        origin.url(),
    );
    config.region = Some(RegionId::new("eu-west").unwrap());
    config.node = Some(NodeId::new(format!("faults-{}", std::process::id())).unwrap());
    config.kafka.brokers = Some(broker.servers().to_owned());
    config.kafka.events_topic = events.to_owned();
    config.kafka.prewarm_topic = prewarm.to_owned();
    config.kafka.group_id = Some(format!("{prewarm}-node"));
    config.kafka.linger_ms = 5;
    config.kafka.message_timeout_ms = 2_000;
    spawn_node(config).await.expect("starting a prefetcher")
}

/// `n` requests, each answered 200 within a second whatever Kafka does.
async fn serve_requests(node: &NodeHandle, prefix: &str, n: usize) {
    let client = TestClient::new();
    for i in 0..n {
        let started = Instant::now();
        let path = format!("/{prefix}/{}", i % 4);
        let r = tokio::time::timeout(Duration::from_secs(5), client.get(node.addr(), HOST, &path))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer in 5 s"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body.is_ok(), "{path}: body");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{path} took {:?}: a request waited on Kafka",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_stop_and_restart_loses_nothing_and_double_counts_within_the_window() {
    let broker = Broker::start();
    let unique = format!("faults-{}-{}", std::process::id(), wall_ms());
    let (topic, node_events, prewarm) = (
        format!("{unique}-pulse"),
        format!("{unique}-edge"),
        format!("{unique}-prewarm"),
    );
    const PARTITIONS: i32 = 2;
    broker.create_topic(&topic, PARTITIONS).await;
    broker.create_topic(&node_events, PARTITIONS).await;
    broker.create_topic(&prewarm, 1).await;
    let producer: FutureProducer = broker
        .config()
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();

    let checkpoint = std::env::temp_dir().join(format!("{unique}.ckpt"));
    let group = format!("{unique}-group");
    let pulse_config = PulseConfig {
        brokers: Some(broker.servers().to_owned()),
        topic: topic.clone(),
        group: group.clone(),
        checkpoint: Some(checkpoint.clone()),
        checkpoint_interval_secs: 1,
        listen: "127.0.0.1:0".parse().unwrap(),
        // As before the assembly: ingest, checkpoint and API under test; no pre-warm
        // command may reach the node and change its event counts.
        prewarm: false,
        ..PulseConfig::default()
    };
    let pulse1 = pulse::start(pulse_config.clone()).await.unwrap();
    let metrics1 = pulse1.metrics().clone();

    let origin = SyntheticOrigin::start("origin").await;
    let edge = node(&broker, &origin, &node_events, &prewarm).await;
    let m = edge.node().metrics();

    // 1. Broker up: 100 events applied, checkpointed and committed.
    produce(&producer, &topic, 0..100).await;
    wait_for(Duration::from_secs(60), "pulse consumed 100", || {
        metrics1.consumed.get() == 100
    })
    .await;
    wait_for(
        Duration::from_secs(30),
        "offsets committed up to 100",
        || broker.committed(&group, &topic, PARTITIONS) == Some(100),
    )
    .await;
    serve_requests(&edge, "before", 8).await;
    wait_for(
        Duration::from_secs(30),
        "the node's events acknowledged",
        || m.events_published.get() == 8,
    )
    .await;
    assert_eq!(m.events_dropped.get(), 0);

    // 2. 40 more events consumed; the broker stops before their commit is certain.
    const WINDOW: u64 = 40;
    produce(&producer, &topic, 100..100 + WINDOW).await;
    wait_for(Duration::from_secs(30), "pulse consumed 140", || {
        metrics1.consumed.get() == 100 + WINDOW
    })
    .await;
    broker.down();
    let outage = Instant::now();

    // 3. During the outage: the prefetcher serves every request at once and counts
    //    the events it cannot deliver; pulse serves its API. Once the group session
    //    times out, librdkafka declares the assignment lost: pulse parks its partitions
    //    (not served, kept for the checkpoint) and says so.
    serve_requests(&edge, "during", 12).await;
    wait_for(
        Duration::from_secs(30),
        "undeliverable events counted as dropped",
        || m.events_dropped.get() >= 1,
    )
    .await;
    wait_for(Duration::from_secs(60), "the assignment lost", || {
        pulse1.partitions().read().unwrap().states().is_empty()
    })
    .await;
    let (status, body) = api_get(&pulse1, &format!("/api/keys/{TENANT}/live/score.json")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("owner_unavailable")),
        "{body}"
    );
    let (status, body) = api_get(&pulse1, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["partitions"], serde_json::json!([]), "{body}");

    // 4. Pulse restarts during the outage: the final checkpoint is written (its commit
    //    fails). The new pulse owns no partition until the group is back, and its API
    //    says so rather than answering with nothing.
    stop_pulse(pulse1, Duration::from_secs(60)).await;
    let pulse2 = pulse::start(pulse_config.clone()).await.unwrap();
    let metrics2 = pulse2.metrics().clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = api_get(&pulse2, &format!("/api/keys/{TENANT}/live/score.json")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("owner_unavailable")),
        "{body}"
    );
    let (status, body) = api_get(&pulse2, "/api/tenants").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["coverage"]["complete"], false, "{body}");

    // 5. The broker comes back: each partition is assigned and restored from its
    //    snapshot, new events arrive, the prefetcher publishes again.
    broker.up();
    eprintln!("broker was down for {:?}", outage.elapsed());
    wait_for(Duration::from_secs(90), "every partition assigned", || {
        pulse2.partitions().read().unwrap().complete()
    })
    .await;
    assert_eq!(api_count(&pulse2).await, 100 + WINDOW, "restored on assign");
    const AFTER: u64 = 20;
    produce(&producer, &topic, 100 + WINDOW..100 + WINDOW + AFTER).await;
    let total = 100 + WINDOW + AFTER;
    wait_for(
        Duration::from_secs(90),
        "offsets committed up to every event",
        || broker.committed(&group, &topic, PARTITIONS) == Some(total as i64),
    )
    .await;
    let count = api_count(&pulse2).await;
    let replayed = metrics2.consumed.get() - AFTER;
    eprintln!(
        "after the restart: count {count} for {total} events ({replayed} replayed from the last commit)"
    );
    assert!(count >= total, "lost events: {count} < {total}");
    assert!(
        count <= total + WINDOW,
        "double counting beyond the at-least-once window: {count} > {total} + {WINDOW}"
    );
    assert_eq!(
        count,
        total + replayed,
        "every replayed event counted once more"
    );

    // The node publishes again (its producer may need a few reconnect attempts), and
    // every recorded event ends up delivered or counted as dropped.
    let published = m.events_published.get();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut recorded = 8 + 12;
    while m.events_published.get() == published {
        assert!(Instant::now() < deadline, "the node never published again");
        serve_requests(&edge, "after", 4).await;
        recorded += 4;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_for(
        Duration::from_secs(30),
        "every event delivered or dropped",
        || m.events_published.get() + m.events_dropped.get() == recorded,
    )
    .await;
    let dropped = m.events_dropped.get();
    eprintln!(
        "prefetcher: {recorded} events, {} published, {dropped} dropped",
        m.events_published.get()
    );
    assert!(dropped >= 1, "nothing counted as dropped");

    // 6. Nothing crashed, and everything stops in bounded time.
    stop_pulse(pulse2, Duration::from_secs(30)).await;
    tokio::time::timeout(Duration::from_secs(30), edge.shutdown())
        .await
        .expect("the prefetcher stops within 30 s");
    let _ = std::fs::remove_file(&checkpoint);
}
