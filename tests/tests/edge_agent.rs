//! The edge agent with real nginx and Varnish (Debian packages) running the shipped
//! configs (`prefetcher/deploy/`) in front of a counting synthetic origin, and a real
//! broker: user traffic reaches `edge-events` with each request's outcome; a pre-warm
//! command makes exactly one origin fill through the real cache and the next user
//! request is a hit; a rename rotation and a copy-truncate mid-run lose no line;
//! forged, expired, foreign and unknown-tenant commands reach no origin; a restarted
//! agent resumes at its saved read position; every event names its kind of edge, and
//! pulse, reading the same topic, counts them under that kind (`GET /api/edges`).
//! An operator's warm-up (`POST /api/warm`) reaches nginx through pulse's gate and the
//! agent, and the agent's `prefetch_fill` and `prefetch_cached` events are its progress.
//!
//! nginx, varnishd and varnishncsa must be installed (`scripts/install-deps`): a test
//! without them fails, it is never skipped. Servers run as child processes on
//! 127.0.0.1 ports picked free, with their files in a temporary directory, and are
//! killed when the test ends.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use models::{
    AccessEvent, CacheKey, EdgeKind, Outcome, PrewarmCommand, Reason, RegionId, RegionTargets,
    TenantId, decode, encode,
};
use prefetcher::testing::{SyntheticOrigin, TestClient, wait_until};
use prefetcher::{AgentConfig, AgentHandle, AgentTenant, LogFormat, SkipReason, spawn_agent};
use pulse::PulseConfig;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use tests::{TestKafka, free_port, produce, wall_ms};

const TENANT: &str = "acme";
const HOST: &str = "acme.example";
const REGION: &str = "eu-west";

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../prefetcher/deploy")
        .join(path)
}

/// Fails the test loudly when `program` is not installed.
fn require(program: &str, version_flag: &str) {
    match Command::new(program)
        .arg(version_flag)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) => panic!(
            "{program} is required by this test and could not be run ({e}): \
             install the Debian packages nginx and varnish (scripts/install-deps)"
        ),
    }
}

/// `text` with every `from` replaced, failing if `from` is absent (the shipped
/// config changed under the test).
fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the shipped config no longer has {from:?}"
    );
    text.replace(from, to)
}

/// A server process, killed (and reaped) on drop: a child, or a daemon by its pid.
struct Running {
    child: Option<Child>,
    pid: u32,
    name: &'static str,
}

impl Drop for Running {
    fn drop(&mut self) {
        match self.child.as_mut() {
            // SIGTERM first: nginx's master then stops its workers (a SIGKILL would
            // orphan them).
            Some(child) => {
                let _ = Command::new("kill").arg(self.pid.to_string()).status();
                for _ in 0..100 {
                    if matches!(child.try_wait(), Ok(Some(_))) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            None => {
                let _ = Command::new("kill").arg(self.pid.to_string()).status();
            }
        }
    }
}

impl Running {
    fn spawn(name: &'static str, command: &mut Command, logs: &Path) -> Running {
        let out = std::fs::File::create(logs.join(format!("{name}.out"))).unwrap();
        let child = command
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Running {
            pid: child.id(),
            child: Some(child),
            name,
        }
    }

    /// A daemon that writes its pid to `pid_file` once it runs.
    async fn daemon(name: &'static str, command: &mut Command, pid_file: &Path) -> Running {
        let status = command
            .status()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        assert!(status.success(), "{name} failed to start: {status}");
        let read_pid = || {
            std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
        };
        wait_until(|| read_pid().is_some(), &format!("{name}'s pid file")).await;
        Running {
            child: None,
            pid: read_pid().unwrap(),
            name,
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }
}

async fn wait_for_port(port: u16, what: &str) {
    wait_until(
        || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        &format!("{what} to listen on {port}"),
    )
    .await;
}

/// A cache node (nginx or Varnish) with its access log.
struct Edge {
    addr: SocketAddr,
    log: PathBuf,
    format: LogFormat,
    /// The process that writes the log and reopens it on `reopen_signal`.
    logger_is_server: bool,
    reopen_signal: &'static str,
    processes: Vec<Running>,
}

impl Edge {
    fn logger(&self) -> &Running {
        if self.logger_is_server {
            &self.processes[0]
        } else {
            &self.processes[1]
        }
    }

    /// Renames the log away and has the writer reopen it: logrotate's default way.
    fn rotate(&self) {
        std::fs::rename(&self.log, self.log.with_extension("json.1")).unwrap();
        self.logger().signal(self.reopen_signal);
    }

    /// Copies the log away and truncates it in place (logrotate's `copytruncate`):
    /// the writer keeps its file, appending from 0 again.
    fn copy_truncate(&self) {
        std::fs::copy(&self.log, self.log.with_extension("json.2")).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.log)
            .unwrap()
            .set_len(0)
            .unwrap();
    }
}

async fn start_nginx(dir: &Path, origin: SocketAddr) -> Edge {
    require("nginx", "-v");
    let port = free_port();
    let log = dir.join("access.json");
    let text = std::fs::read_to_string(deploy("nginx/edge.conf")).unwrap();
    let text = replace(&text, "127.0.0.1:9000", &origin.to_string());
    let text = replace(&text, "127.0.0.1:8081", &format!("127.0.0.1:{port}"));
    let text = replace(
        &text,
        "/run/nginx-edge.pid",
        &dir.join("nginx.pid").display().to_string(),
    );
    let text = replace(
        &text,
        "/var/log/nginx/edge-error.log",
        &dir.join("error.log").display().to_string(),
    );
    let text = replace(
        &text,
        "/var/log/nginx/edge-pulse.json",
        &log.display().to_string(),
    );
    let text = replace(
        &text,
        "/var/cache/nginx/edge-pulse",
        &dir.join("cache").display().to_string(),
    );
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, text).unwrap();
    let nginx = Running::spawn(
        "nginx",
        Command::new("nginx")
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"]),
        dir,
    );
    wait_for_port(port, "nginx").await;
    Edge {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        log,
        format: LogFormat::NginxJson,
        logger_is_server: true,
        reopen_signal: "USR1",
        processes: vec![nginx],
    }
}

async fn start_varnish(dir: &Path, origin: SocketAddr) -> Edge {
    require("varnishd", "-V");
    require("varnishncsa", "-V");
    let port = free_port();
    let log = dir.join("access.json");
    let text = std::fs::read_to_string(deploy("varnish/edge.vcl")).unwrap();
    let text = replace(
        &text,
        ".port = \"9000\"",
        &format!(".port = \"{}\"", origin.port()),
    );
    let vcl = dir.join("edge.vcl");
    std::fs::write(&vcl, text).unwrap();
    let workdir = dir.join("varnish");
    let varnishd = Running::spawn(
        "varnishd",
        Command::new("varnishd")
            .arg("-F")
            .arg("-n")
            .arg(&workdir)
            .arg("-f")
            .arg(&vcl)
            .args(["-a", &format!("127.0.0.1:{port}"), "-s", "malloc,32m"]),
        dir,
    );
    wait_for_port(port, "varnishd").await;
    // Daemon mode (-D): only then does varnishncsa reopen its file on SIGHUP; append
    // (-a), so a copy-truncate leaves no hole where it wrote before.
    let pid_file = dir.join("varnishncsa.pid");
    let ncsa = Running::daemon(
        "varnishncsa",
        Command::new("varnishncsa")
            .arg("-n")
            .arg(&workdir)
            .arg("-D")
            .arg("-P")
            .arg(&pid_file)
            .arg("-a")
            .arg("-j")
            .arg("-f")
            .arg(deploy("varnish/varnishncsa.format"))
            .arg("-w")
            .arg(&log),
        &pid_file,
    )
    .await;
    let edge = Edge {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        log,
        format: LogFormat::VarnishncsaJson,
        logger_is_server: false,
        reopen_signal: "HUP",
        processes: vec![varnishd, ncsa],
    };
    // varnishncsa logs only what happens once it is attached: knock (with a host no
    // tenant maps, so the agent skips it) until a line appears.
    let client = TestClient::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while std::fs::metadata(&edge.log).map_or(0, |m| m.len()) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "varnishncsa never logged"
        );
        n += 1;
        let _ = client
            .get(edge.addr, "warmup.invalid", &format!("/__warmup/{n}"))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    edge
}

/// The events of one topic, read in the background.
struct Events(Arc<Mutex<Vec<AccessEvent>>>);

impl Events {
    fn start(kafka: &TestKafka, topic: &str) -> Events {
        let consumer = kafka.consumer(&format!("{topic}-reader"));
        consumer.subscribe(&[topic]).unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&events);
        tokio::spawn(async move {
            loop {
                let message = consumer.recv().await.expect("reading edge-events");
                let event: AccessEvent =
                    decode(message.payload().unwrap_or_default()).expect("a valid event");
                sink.lock().unwrap().push(event);
            }
        });
        Events(events)
    }

    fn of(&self, key: &str) -> Vec<Outcome> {
        let mut events: Vec<AccessEvent> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.key.as_str() == key)
            .cloned()
            .collect();
        events.sort_by_key(|e| e.ts_ms);
        events.into_iter().map(|e| e.outcome).collect()
    }

    fn all(&self) -> Vec<AccessEvent> {
        self.0.lock().unwrap().clone()
    }

    async fn wait_for(&self, key: &str, n: usize) -> Vec<Outcome> {
        wait_until(|| self.of(key).len() >= n, &format!("{n} events for {key}")).await;
        self.of(key)
    }
}

fn command(tenant: &str, key: &str, region: &str, expires_at_ms: u64) -> Vec<u8> {
    let now = wall_ms();
    encode(&PrewarmCommand::new(
        format!("c-{}", key.trim_start_matches('/')),
        TenantId::new(tenant).unwrap(),
        CacheKey::new(key).unwrap(),
        0.9,
        expires_at_ms.min(now) - 1,
        expires_at_ms,
        RegionTargets::Only(vec![RegionId::new(region).unwrap()]),
        Reason {
            model: "test".into(),
            intercept: 0.0,
            features: Vec::new(),
        },
    ))
}

async fn start_agent(
    dir: &Path,
    edge: &Edge,
    kafka: &TestKafka,
    events_topic: &str,
    prewarm_topic: &str,
) -> AgentHandle {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let node = format!(
        "agent-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mut config = AgentConfig {
        region: Some(RegionId::new(REGION).unwrap()),
        node: Some(node.parse().unwrap()),
        log_path: edge.log.clone(),
        log_format: edge.format,
        state_path: dir.join("position.json"),
        poll_ms: 20,
        rotate_grace_ms: 1_500,
        cache_url: format!("http://{}", edge.addr),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        tenants: vec![AgentTenant {
            id: TenantId::new(TENANT).unwrap(),
            hosts: vec![HOST.into()],
        }],
        ..AgentConfig::default()
    };
    config.kafka.brokers = Some(kafka.bootstrap_servers().into());
    config.kafka.events_topic = events_topic.into();
    config.kafka.prewarm_topic = prewarm_topic.into();
    config.kafka.group_id = Some(format!("{prewarm_topic}-{node}"));
    config.kafka.linger_ms = 5;
    spawn_agent(config).await.expect("starting the agent")
}

/// The whole story against one kind of edge.
async fn edge_feeds_pulse_and_takes_prewarms(kind: &str) {
    let kafka = TestKafka::start();
    let events_topic = kafka.unique_topic("edge-events");
    let prewarm_topic = kafka.unique_topic("prewarm");
    kafka.create_topic(&events_topic, 3).await;
    kafka.create_topic(&prewarm_topic, 2).await;
    let events = Events::start(&kafka, &events_topic);
    // Pulse itself on the same topic (its heat map and API only: no commands).
    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: format!("{events_topic}-pulse"),
        topic: events_topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        prewarm: false,
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse");

    let dir = worker_dir();
    let origin = SyntheticOrigin::start(kind).await;
    origin.set_cache_control(Some("public, max-age=300"));
    let edge = match kind {
        "nginx" => start_nginx(dir.path(), origin.addr()).await,
        _ => start_varnish(dir.path(), origin.addr()).await,
    };
    let agent = start_agent(dir.path(), &edge, &kafka, &events_topic, &prewarm_topic).await;
    let client = TestClient::new();
    let get = |host: &'static str, path: String| {
        let client = client.clone();
        let addr = edge.addr;
        async move {
            let response = client.get(addr, host, &path).await.expect("a response");
            assert_eq!(response.status, 200, "GET {path} via {kind}");
            response
        }
    };

    // User traffic: each request's outcome, keys normalised as the prefetcher's.
    get(HOST, "/a".into()).await;
    get(HOST, "/a".into()).await;
    get(HOST, "/b?z=1&a=2".into()).await;
    get("unmapped.example", "/u".into()).await;
    assert_eq!(
        events.wait_for("/a", 2).await,
        [Outcome::Miss, Outcome::Hit]
    );
    assert_eq!(events.wait_for("/b?a=2&z=1", 1).await, [Outcome::Miss]);
    wait_until(
        || agent.agent_metrics().skips(SkipReason::UnknownHost) >= 1,
        "the unmapped host skipped",
    )
    .await;
    assert!(
        events.of("/u").is_empty(),
        "an unmapped host is no tenant's"
    );

    // A pre-warm: one origin fill through the real cache, then a user hit.
    let producer = kafka.producer();
    let valid = command(TENANT, "/warm", REGION, wall_ms() + 120_000);
    produce(&producer, &prewarm_topic, "acme/warm", &valid).await;
    assert_eq!(events.wait_for("/warm", 1).await, [Outcome::PrefetchFill]);
    assert_eq!(origin.fills_for("/warm"), 1);
    get(HOST, "/warm".into()).await;
    assert_eq!(
        events.wait_for("/warm", 2).await,
        [Outcome::PrefetchFill, Outcome::Hit]
    );
    assert_eq!(origin.fills_for("/warm"), 1, "the user request was a hit");

    // Forged, expired, foreign and unknown-tenant commands reach no origin.
    let forged: [(&str, Vec<u8>); 5] = [
        ("garbage", b"{\"key\":\"http://evil.example/x\"}".to_vec()),
        ("not-json", b"\xff\xfe".to_vec()),
        (
            "expired",
            command(TENANT, "/forged-expired", REGION, wall_ms() - 1),
        ),
        (
            "foreign",
            command(TENANT, "/forged-foreign", "ap-south", wall_ms() + 120_000),
        ),
        (
            "unknown",
            command("evil", "/forged-unknown", REGION, wall_ms() + 120_000),
        ),
    ];
    for (key, payload) in &forged {
        produce(&producer, &prewarm_topic, key, payload).await;
    }
    let metrics = agent.metrics();
    let rejected = || {
        [
            "malformed",
            "invalid_field",
            "expired",
            "other_region",
            "unknown_tenant",
        ]
        .iter()
        .map(|r| metrics.prewarm_rejections(r))
        .sum::<u64>()
    };
    wait_until(|| rejected() == 5, "five refused commands").await;
    for reason in ["expired", "other_region", "unknown_tenant"] {
        assert_eq!(metrics.prewarm_rejections(reason), 1, "{reason}");
    }
    for path in [
        "/forged-expired",
        "/forged-foreign",
        "/forged-unknown",
        "/x",
    ] {
        assert_eq!(origin.fills_for(path), 0, "{path} reached the origin");
    }

    // A rename rotation mid-run loses no line.
    for i in 0..10 {
        get(HOST, format!("/r/{i}")).await;
    }
    edge.rotate();
    for i in 10..20 {
        get(HOST, format!("/r/{i}")).await;
    }
    for i in 0..20 {
        assert_eq!(
            events.wait_for(&format!("/r/{i}"), 1).await,
            [Outcome::Miss],
            "/r/{i}"
        );
    }
    wait_until(
        || agent.agent_metrics().rotations.get() >= 1,
        "the agent to follow the rotation",
    )
    .await;

    // A copy-truncate: the agent notices the shorter file and reads it from 0.
    edge.copy_truncate();
    wait_until(
        || agent.agent_metrics().truncations.get() >= 1,
        "the agent to notice the truncation",
    )
    .await;
    for i in 0..5 {
        get(HOST, format!("/t/{i}")).await;
    }
    for i in 0..5 {
        assert_eq!(
            events.wait_for(&format!("/t/{i}"), 1).await,
            [Outcome::Miss],
            "/t/{i}"
        );
    }

    // The admin listener: both registries, and health.
    let admin = agent.admin_addr().expect("admin listener");
    let metrics_text = client.get(admin, "localhost", "/metrics").await.unwrap();
    let metrics_text = String::from_utf8_lossy(metrics_text.body.as_ref().unwrap()).into_owned();
    for series in [
        "prefetcher_events_published_total",
        "prefetcher_prefetches_rejected_total{reason=\"unknown_tenant\"} 1",
        "edge_agent_lines_read_total",
        "edge_agent_lines_skipped_total{reason=\"unknown_host\"}",
        "edge_agent_truncations_total 1",
    ] {
        assert!(
            metrics_text.contains(series),
            "/metrics lacks {series}:\n{metrics_text}"
        );
    }
    assert_eq!(metrics_text.matches("# EOF").count(), 1, "one exposition");
    let health = client.get(admin, "localhost", "/healthz").await.unwrap();
    assert_eq!(health.status, 200);

    // A graceful stop saves the read position; a restart resumes there: the next
    // request is the only line it publishes.
    let position = agent.shutdown().await;
    assert!(position.offset > 0);
    let agent = start_agent(dir.path(), &edge, &kafka, &events_topic, &prewarm_topic).await;
    get(HOST, "/after-restart".into()).await;
    assert_eq!(events.wait_for("/after-restart", 1).await, [Outcome::Miss]);
    assert_eq!(
        agent.agent_metrics().events_queued.get(),
        1,
        "the restarted agent read only the new line"
    );
    agent.shutdown().await;

    // Nothing twice, nothing unexpected: every event is one of the requests above.
    let mut per_key: BTreeMap<String, usize> = BTreeMap::new();
    for event in events.all() {
        assert_eq!(event.tenant.as_str(), TENANT);
        assert_eq!(event.region.as_str(), REGION);
        *per_key.entry(event.key.as_str().to_owned()).or_default() += 1;
    }
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    expected.insert("/a".into(), 2);
    expected.insert("/b?a=2&z=1".into(), 1);
    expected.insert("/warm".into(), 2);
    expected.insert("/after-restart".into(), 1);
    for i in 0..20 {
        expected.insert(format!("/r/{i}"), 1);
    }
    for i in 0..5 {
        expected.insert(format!("/t/{i}"), 1);
    }
    assert_eq!(per_key, expected);

    // Every event names the kind of edge that wrote the log, and pulse counts them
    // under that kind alone.
    let all = events.all();
    let kind = match kind {
        "nginx" => EdgeKind::Nginx,
        _ => EdgeKind::Varnish,
    };
    for event in &all {
        assert_eq!(event.edge, Some(kind), "{event:?}");
    }
    let consumed = pulse.metrics().consumed.clone();
    wait_until(
        || consumed.get() >= all.len() as u64,
        "pulse to apply every event",
    )
    .await;
    let response = client
        .get(pulse.api_addr(), "localhost", "/api/edges")
        .await
        .expect("GET /api/edges");
    assert_eq!(response.status, 200);
    let body: serde_json::Value =
        serde_json::from_slice(response.body.as_ref().expect("a body")).expect("JSON");
    for summary in body["edges"].as_array().expect("edges") {
        let name = summary["edge"].as_str().unwrap();
        if name != kind.as_str() {
            assert_eq!(summary["events"], 0, "{name}: {body}");
            continue;
        }
        let count =
            |wanted: fn(Outcome) -> bool| all.iter().filter(|e| wanted(e.outcome)).count() as u64;
        assert_eq!(summary["events"], all.len() as u64, "{body}");
        assert_eq!(
            summary["hits"],
            count(|o| matches!(o, Outcome::Hit | Outcome::PrefetchUseful)),
            "{body}"
        );
        assert_eq!(summary["misses"], count(Outcome::is_miss), "{body}");
        assert_eq!(
            summary["prefetch_fills"],
            count(|o| o == Outcome::PrefetchFill),
            "{body}"
        );
        // Two agents ran (the restarted one under a new node id); the second at least
        // sent within the last minute.
        let nodes = summary["nodes"].as_u64().unwrap();
        assert!((1..=2).contains(&nodes), "{body}");
    }
    pulse.shutdown().await;
    drop(edge);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_edge_feeds_pulse_and_takes_prewarms() {
    edge_feeds_pulse_and_takes_prewarms("nginx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn varnish_edge_feeds_pulse_and_takes_prewarms() {
    edge_feeds_pulse_and_takes_prewarms("varnish").await;
}

/// A temporary folder for an nginx or Varnish node's files: its worker processes run
/// as an unprivileged user, so they must reach them.
fn worker_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// An operator's warm-up (`POST /api/warm`, issue #55) through the edge agent in front
/// of nginx: pulse's gate sends the commands, the agent warms nginx, and its events
/// (`prefetch_fill` for the key it filled, `prefetch_cached` for the one nginx held)
/// are the warm-up's progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_edge_takes_an_operators_warm_up() {
    let kafka = TestKafka::start();
    let events_topic = kafka.unique_topic("warm-edge-events");
    let prewarm_topic = kafka.unique_topic("warm-prewarm");
    kafka.create_topic(&events_topic, 2).await;
    kafka.create_topic(&prewarm_topic, 1).await;
    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        group: format!("{events_topic}-pulse"),
        topic: events_topic.clone(),
        prewarm_topic: prewarm_topic.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        topic_partitions: 1,
        ..PulseConfig::default()
    })
    .await
    .expect("starting pulse");
    let dir = worker_dir();
    let origin = SyntheticOrigin::start("nginx").await;
    origin.set_cache_control(Some("public, max-age=300"));
    let edge = start_nginx(dir.path(), origin.addr()).await;
    let _agent = start_agent(dir.path(), &edge, &kafka, &events_topic, &prewarm_topic).await;
    // A user request: the tenant known to pulse, the key in nginx's cache.
    let client = TestClient::new();
    let got = client.get(edge.addr, HOST, "/held").await.unwrap();
    assert_eq!(got.status, 200);
    let app = pulse.router();
    let api = |uri: String, body: Option<serde_json::Value>| {
        let app = app.clone();
        async move {
            let request = match body {
                Some(body) => http::Request::post(uri)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body.to_string())),
                None => http::Request::get(uri).body(axum::body::Body::empty()),
            };
            pulse::testing::send_json(&app, request.unwrap()).await
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let id = loop {
        let body = serde_json::json!({"tenant": TENANT, "keys": ["/op/new", "/held"], "regions": [REGION]});
        let (status, answer) = api("/api/warm".into(), Some(body)).await;
        if status == 202 {
            break answer["id"].as_str().unwrap().to_owned();
        }
        // Until pulse has read the user request, the tenant is unknown.
        assert_eq!(answer["error"], "unknown_tenant", "{answer}");
        assert!(tokio::time::Instant::now() < deadline, "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, answer) = api(format!("/api/warm/{id}"), None).await;
        let region = &answer["progress"]["regions"][REGION];
        if region["filled"] == 1 && region["cached"] == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(origin.fills_for("/op/new"), 1);
    assert_eq!(origin.fills_for("/held"), 1, "the user's fill only");
    pulse.shutdown().await;
    drop(edge);
}
