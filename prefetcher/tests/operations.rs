//! The `prefetcher` and `edge-agent` binaries as operators run them: their own logs
//! written to a file as JSON lines (each an object with `level`, `target` and
//! `message`) or as text without a single escape code; `--check-config` exiting 0
//! with one OK line naming the config, or 1 naming the bad field, binding nothing
//! (the configured port is held by the test meanwhile). The edge agent's old
//! variable for its access-log format is refused with its new name.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PREFETCHER: &str = env!("CARGO_BIN_EXE_prefetcher");
const EDGE_AGENT: &str = env!("CARGO_BIN_EXE_edge-agent");

/// The broker the agent's clients are pointed at (nothing needs to reach it).
fn brokers() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A node config: one tenant, a deprecated field (so a warning is logged too).
fn node_config(listen: &str, extra: &str) -> String {
    format!(
        "listen = \"{listen}\"\n{extra}\n[http2]\nsend_stall_timeout_ms = 10000\n\
         [[tenants]]\nid = \"acme\"\nhosts = [\"*\"]\norigin = \"http://127.0.0.1:9\"\n"
    )
}

fn agent_config(dir: &Path, extra_top: &str, extra_kafka: &str) -> String {
    let unique = format!(
        "ops-{}-{}",
        std::process::id(),
        dir.display().to_string().len()
    );
    format!(
        "region = \"eu-west\"\nnode = \"n1\"\nlog_path = \"{log}\"\n\
         state_path = \"{state}\"\ncache_url = \"http://127.0.0.1:9\"\n{extra_top}\n\
         [kafka]\nbrokers = \"{brokers}\"\nevents_topic = \"{unique}-events\"\n\
         prewarm_topic = \"{unique}-prewarm\"\n{extra_kafka}\n\
         [[tenants]]\nid = \"acme\"\nhosts = [\"acme.example\"]\n",
        log = dir.join("access.log").display(),
        state = dir.join("position.json").display(),
        brokers = brokers(),
    )
}

/// Runs `program args`, its stderr into `log`, until `ready` is in the log; then
/// SIGTERM, and waits for it to exit. Returns the log's bytes.
fn run_until(program: &str, args: &[&str], log: &Path, ready: &str) -> Vec<u8> {
    let file = std::fs::File::create(log).unwrap();
    let mut child = Command::new(program)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("EDGE_PULSE_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(ready) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{program} exited ({status}) before logging {ready:?}:\n{text}");
        }
        assert!(
            Instant::now() < deadline,
            "{program} never logged {ready:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{program} after SIGTERM: {status}");
    std::fs::read(log).unwrap()
}

/// Every line is a JSON object with string `level`, `target` and `message`.
fn assert_json_lines(bytes: &[u8], want_levels: &[&str]) {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let mut levels = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{text}"));
        for field in ["level", "target", "message", "timestamp"] {
            assert!(value[field].is_string(), "no {field} in {line}");
        }
        levels.push(value["level"].as_str().unwrap().to_owned());
    }
    assert!(text.lines().count() >= 2, "too few lines:\n{text}");
    for level in want_levels {
        assert!(
            levels.iter().any(|l| l == level),
            "no {level} line:\n{text}"
        );
    }
}

fn assert_plain_text(bytes: &[u8], want: &str) {
    assert!(
        !bytes.contains(&0x1b),
        "an escape byte in a log written to a file:\n{}",
        String::from_utf8_lossy(bytes)
    );
    let text = String::from_utf8_lossy(bytes);
    assert!(text.contains(want) && text.contains("INFO"), "{text}");
}

#[test]
fn the_prefetcher_logs_json_lines_or_plain_text_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "node.toml", &node_config("127.0.0.1:0", ""));
    let config = config.to_str().unwrap();
    let json = run_until(
        PREFETCHER,
        &["--config", config, "--log-format", "json"],
        &dir.path().join("json.log"),
        "proxy listening",
    );
    assert_json_lines(&json, &["INFO", "WARN"]);
    let text = run_until(
        PREFETCHER,
        &["--config", config],
        &dir.path().join("text.log"),
        "proxy listening",
    );
    assert_plain_text(&text, "proxy listening");
}

#[test]
fn the_edge_agent_logs_json_lines_or_plain_text_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("access.log"), "").unwrap();
    let config = write(dir.path(), "agent.toml", &agent_config(dir.path(), "", ""));
    let config = config.to_str().unwrap();
    let json = run_until(
        EDGE_AGENT,
        &["--config", config, "--log-format", "json"],
        &dir.path().join("json.log"),
        "edge agent running",
    );
    assert_json_lines(&json, &["INFO"]);
    let text = run_until(
        EDGE_AGENT,
        &["--config", config],
        &dir.path().join("text.log"),
        "edge agent running",
    );
    assert_plain_text(&text, "edge agent running");
}

fn check(program: &str, config: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(program)
        .args(["--check-config", "--config", config.to_str().unwrap()])
        .envs(env.iter().copied())
        .env_remove("EDGE_PULSE_LOG_FORMAT")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `--check-config` on `text`: exits 0 with the OK line naming the file, or, when
/// `field` is given, 1 with the field in stderr.
fn assert_check(program: &str, dir: &Path, text: &str, field: Option<&str>) {
    let path = write(dir, "check.toml", text);
    let out = check(program, &path, &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    match field {
        None => {
            assert!(out.status.success(), "{stdout}{stderr}");
            assert_eq!(stdout.lines().count(), 1, "{stdout}");
            assert!(
                stdout.contains("OK") && stdout.contains(path.to_str().unwrap()),
                "{stdout}"
            );
        }
        Some(field) => {
            assert_eq!(out.status.code(), Some(1), "{field}: {stdout}{stderr}");
            assert!(stderr.contains(field), "{field} not named: {stderr}");
        }
    }
}

#[test]
fn prefetcher_check_config_passes_a_good_config_binding_nothing_and_names_a_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    // The configured port is taken: a check that bound it would fail.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let d = dir.path();
    assert_check(PREFETCHER, d, &node_config(&listen, ""), None);
    let kafka = "region = \"eu-west\"\nnode = \"n1\"\n[kafka]\nbrokers = \"127.0.0.1:1\"\n";
    assert_check(PREFETCHER, d, &node_config(&listen, kafka), None);
    let missing_cert = format!(
        "[tls]\nlisten = \"{listen}\"\ncert_file = \"{0}/none.pem\"\nkey_file = \"{0}/none.key\"\n",
        d.display()
    );
    let cases = [
        ("cache.jitter", "[cache]\njitter = 5.0\n".to_owned()),
        ("listn", "listn = \"127.0.0.1:1\"\n".to_owned()),
        ("limits", "[limits]\nmax_uri_bytes = 1\n".to_owned()),
        ("tls.cert_file", missing_cert),
        (
            "kafka.properties",
            format!("{kafka}properties = {{ \"no.such.property\" = \"1\" }}\n"),
        ),
        (
            "origin.ca_file",
            "[origin]\nca_file = \"/none/ca.pem\"\n".into(),
        ),
    ];
    for (field, extra) in cases {
        assert_check(PREFETCHER, d, &node_config(&listen, &extra), Some(field));
    }
    assert_check(
        PREFETCHER,
        d,
        &node_config(&listen, "").replace("http://127.0.0.1:9", "ftp://x"),
        Some("tenants[0].origin"),
    );
}

#[test]
fn edge_agent_check_config_passes_a_good_config_and_names_a_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = format!("admin_listen = \"{}\"", taken.local_addr().unwrap());
    assert_check(EDGE_AGENT, d, &agent_config(d, &admin, ""), None);
    let no_folder = agent_config(d, "", "").replace(
        &d.join("position.json").display().to_string(),
        "/none/position.json",
    );
    assert_check(EDGE_AGENT, d, &no_folder, Some("state_path"));
    let cases = [
        (
            "cache_url",
            agent_config(d, "", "").replace("http://127.0.0.1:9", "ftp://x"),
        ),
        ("max_line_bytes", agent_config(d, "max_line_bytes = 3", "")),
        (
            "kafka.properties",
            agent_config(d, "", "properties = { \"socket.timeout.ms\" = \"soon\" }"),
        ),
        ("regin", agent_config(d, "regin = \"x\"", "")),
    ];
    for (field, text) in cases {
        assert_check(EDGE_AGENT, d, &text, Some(field));
    }
    // The access log's format has its own variable now; the old one is refused.
    let path = write(d, "agent.toml", &agent_config(d, "", ""));
    let out = check(
        EDGE_AGENT,
        &path,
        &[("EDGE_AGENT_LOG_FORMAT", "nginx_json")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("EDGE_AGENT_ACCESS_LOG_FORMAT"), "{stderr}");
}

/// One access-log line of `host`, as the shipped nginx `log_format` writes it.
fn access_line(host: &str, n: usize) -> String {
    format!(
        "{{\"ts\":\"1700000000.5\",\"host\":\"{host}\",\"uri\":\"/k/{n}\",\"method\":\"GET\",\
         \"status\":\"200\",\"cache\":\"MISS\",\"referer\":\"\",\"bytes\":\"10\",\
         \"upstream_time\":\"0.020\",\"prewarm\":\"\"}}\n"
    )
}

/// A metric's value on the agent's admin listener (blocking HTTP/1.0 by hand).
fn agent_metric(admin: std::net::SocketAddr, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(admin).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: admin\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

fn wait_metric(admin: std::net::SocketAddr, name: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent_metric(admin, name).is_none_or(|v| v < at_least) {
        assert!(Instant::now() < deadline, "{name} never reached {at_least}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_gives_the_edge_agent_new_tenants_and_refuses_a_bad_config() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let access = d.join("access.log");
    std::fs::write(&access, "").unwrap();
    let admin = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let admin_line = format!("admin_listen = \"{admin}\"");
    let with_globex =
        |text: String| text + "\n[[tenants]]\nid = \"globex\"\nhosts = [\"globex.example\"]\n";
    let config = d.join("agent.toml");
    std::fs::write(&config, agent_config(d, &admin_line, "")).unwrap();
    let log = std::fs::File::create(d.join("agent.log")).unwrap();
    let mut child = Command::new(EDGE_AGENT)
        .args(["--config", config.to_str().unwrap()])
        .env("RUST_LOG", "prefetcher=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let signal = |name: &str| {
        let _ = Command::new("kill")
            .args([&format!("-{name}"), &child.id().to_string()])
            .status();
    };
    let append = |host: &str, n: usize| {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&access)
            .unwrap();
        file.write_all(access_line(host, n).as_bytes()).unwrap();
    };
    const QUEUED: &str = "edge_agent_events_queued_total";
    const UNKNOWN: &str = "edge_agent_lines_skipped_total{reason=\"unknown_host\"}";
    const OK: &str = "prefetcher_config_reloads_total{result=\"ok\"}";
    const REFUSED: &str = "prefetcher_config_reloads_total{result=\"refused\"}";
    wait_metric(admin, QUEUED, 0.0);
    append("acme.example", 0);
    append("globex.example", 1);
    wait_metric(admin, QUEUED, 1.0);
    wait_metric(admin, UNKNOWN, 1.0);

    // A config that fails the check: refused, acme alone still mapped.
    std::fs::write(
        &config,
        with_globex(agent_config(d, &admin_line, "")).replace("http://127.0.0.1:9", "ftp://x"),
    )
    .unwrap();
    signal("HUP");
    wait_metric(admin, REFUSED, 1.0);
    append("globex.example", 2);
    wait_metric(admin, UNKNOWN, 2.0);

    // A new tenant, and a node id that needs a restart: the tenant is in force.
    let renamed = agent_config(d, &admin_line, "").replace("node = \"n1\"", "node = \"n2\"");
    std::fs::write(&config, with_globex(renamed)).unwrap();
    signal("HUP");
    wait_metric(admin, OK, 1.0);
    append("globex.example", 3);
    wait_metric(admin, QUEUED, 2.0);
    assert_eq!(agent_metric(admin, UNKNOWN), Some(2.0));

    signal("TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let logged = std::fs::read_to_string(d.join("agent.log")).unwrap();
    for said in ["refused", "cache_url", "needs a restart", "field=node"] {
        assert!(
            logged.contains(said),
            "the log does not say {said:?}:\n{logged}"
        );
    }
}
