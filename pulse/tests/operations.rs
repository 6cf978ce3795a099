//! `pulse serve` as operators run it: its logs written to a file as JSON lines (each
//! an object with `level`, `target` and `message`) or as text without a single escape
//! code; `--check-config` exiting 0 with one OK line, or 1 naming the bad flag,
//! starting nothing (no broker, the configured port held by the test meanwhile).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PULSE: &str = env!("CARGO_BIN_EXE_pulse");

/// Runs `pulse serve args` (its own embedded broker), stderr into `log`, until the
/// API listens; then SIGTERM, and waits for it to exit. Returns the log's bytes.
fn serve_until_listening(args: &[&str], log: &Path) -> Vec<u8> {
    let file = std::fs::File::create(log).unwrap();
    let mut child = Command::new(PULSE)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-prewarm"])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("EDGE_PULSE_LOG_FORMAT")
        .env_remove("PULSE_BROKERS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("dashboard API listening") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("pulse exited ({status}) before listening:\n{text}");
        }
        assert!(Instant::now() < deadline, "pulse never listened:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "pulse after SIGTERM: {status}");
    std::fs::read(log).unwrap()
}

#[test]
fn pulse_logs_json_lines_or_plain_text_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let json = serve_until_listening(&["--log-format", "json"], &dir.path().join("json.log"));
    let text = String::from_utf8(json).unwrap();
    assert!(text.lines().count() >= 2, "{text}");
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{text}"));
        for field in ["level", "target", "message", "timestamp"] {
            assert!(value[field].is_string(), "no {field} in {line}");
        }
    }
    let plain = serve_until_listening(&[], &dir.path().join("text.log"));
    assert!(
        !plain.contains(&0x1b),
        "an escape byte in a log written to a file:\n{}",
        String::from_utf8_lossy(&plain)
    );
    let plain = String::from_utf8_lossy(&plain);
    assert!(
        plain.contains("INFO") && plain.contains("dashboard API listening"),
        "{plain}"
    );
}

fn check(args: &[&str]) -> Output {
    Command::new(PULSE)
        .args(["serve", "--check-config"])
        .args(args)
        .env_remove("PULSE_BROKERS")
        .env_remove("PULSE_KAFKA_PROPERTIES")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn serve_check_config_passes_good_settings_starting_nothing_and_names_a_bad_flag() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    // Nothing listens on port 1: a check that connected would not be quick to say OK,
    // and one that bound the taken port would fail.
    let base = ["--brokers", "127.0.0.1:1", "--listen", listen.as_str()];
    let good = check(&base);
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(
        good.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("OK"), "{stdout}");
    // A config with every file: still good.
    let tenants = dir.path().join("tenants.txt");
    std::fs::write(&tenants, "acme\n# a comment\nglobex\n").unwrap();
    let properties = dir.path().join("client.properties");
    std::fs::write(&properties, "socket.timeout.ms=30000\n").unwrap();
    let checkpoint = dir.path().join("pulse.ckpt");
    let with_files = [
        "--tenants-file",
        tenants.to_str().unwrap(),
        "--kafka-properties",
        properties.to_str().unwrap(),
        "--checkpoint",
        checkpoint.to_str().unwrap(),
    ];
    let good = check(&[&base[..], &with_files[..]].concat());
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );

    let bad_tenants = dir.path().join("bad-tenants.txt");
    std::fs::write(&bad_tenants, "not a tenant!\n").unwrap();
    let bad_properties = dir.path().join("bad.properties");
    std::fs::write(&bad_properties, "socket.timeout.ms=soon\n").unwrap();
    let bad_model = dir.path().join("model.json");
    std::fs::write(&bad_model, "{").unwrap();
    let cases: [(&str, Vec<&str>); 7] = [
        ("--threshold", vec!["--threshold", "3"]),
        ("--top-k", vec!["--top-k", "0"]),
        ("--model", vec!["--model", bad_model.to_str().unwrap()]),
        ("--model", vec!["--model", "/none/model.json"]),
        (
            "--tenants-file",
            vec!["--tenants-file", bad_tenants.to_str().unwrap()],
        ),
        (
            "--kafka-properties",
            vec!["--kafka-properties", bad_properties.to_str().unwrap()],
        ),
        ("--checkpoint", vec!["--checkpoint", "/none/pulse.ckpt"]),
    ];
    for (flag, args) in cases {
        let out = check(&[&base[..], &args[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag} not named: {stderr}");
    }
}
