//! Reloading a running node's configuration without dropping a request.
//!
//! - The `prefetcher` binary under continuous load across several SIGHUPs: one that
//!   changes a limit, one with a config that fails the check (refused, the running
//!   one kept), one that changes a setting that needs a restart (reported, kept: the
//!   old address still serves), and one that moves the tenant to another origin while
//!   requests are held at the old one. Every request succeeds, those in flight finish
//!   on the old origin, new ones go to the new origin, no flight is left behind, and
//!   `prefetcher_config_reloads_total` counts each reload by its result.
//! - The TLS listener's certificate replaced by a reload: new handshakes present the
//!   new one.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestClient, wait_until};
use prefetcher::{Config, TlsListenConfig, spawn_node};

const PREFETCHER: &str = env!("CARGO_BIN_EXE_prefetcher");

/// A free loopback port (bound, then let go).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn node_config(listen: SocketAddr, admin: SocketAddr, origin: &str, extra: &str) -> String {
    format!(
        "listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n{extra}\n\
         [origin]\nheader_timeout_ms = 60000\n\
         [flight]\nwait_timeout_ms = 60000\n\
         [[tenants]]\nid = \"acme\"\nhosts = [\"*\"]\norigin = \"{origin}\"\n"
    )
}

/// The running binary, SIGKILLed on drop if the test did not stop it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name}");
    }
}

/// `prefetcher_config_reloads_total{result="…"}` and `prefetcher_flights` now.
async fn metric(client: &TestClient, admin: SocketAddr, name: &str) -> Option<f64> {
    let fetched = client.get(admin, "admin", "/metrics").await.ok()?;
    let text = String::from_utf8(fetched.body.ok()?.to_vec()).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

async fn reloads(client: &TestClient, admin: SocketAddr, result: &str) -> f64 {
    let name = format!("prefetcher_config_reloads_total{{result=\"{result}\"}}");
    metric(client, admin, &name).await.unwrap_or(-1.0)
}

/// Waits until the admin listener says `result` reloads reached `n`.
async fn wait_reloads(client: &TestClient, admin: SocketAddr, result: &str, n: f64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while reloads(client, admin, result).await < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {result} reload number {n}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    ok_alpha: AtomicUsize,
    ok_beta: AtomicUsize,
    failed: AtomicUsize,
    failures: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn ok(&self) -> usize {
        self.ok_alpha.load(Ordering::SeqCst) + self.ok_beta.load(Ordering::SeqCst)
    }
}

/// `GET` of a fresh path, judged by its body: served by which origin, or failed.
async fn fetch(client: &TestClient, addr: SocketAddr, path: &str, tally: &Tally) -> String {
    let outcome = match client.get(addr, "acme.example", path).await {
        Ok(f) if f.status == 200 => match f.body {
            Ok(body) if body.starts_with(b"alpha") => "alpha",
            Ok(body) if body.starts_with(b"beta") => "beta",
            other => return tally.fail(format!("{path}: body {other:?}")),
        },
        Ok(f) => return tally.fail(format!("{path}: status {} {:?}", f.status, f.body)),
        Err(e) => return tally.fail(format!("{path}: {e}")),
    };
    match outcome {
        "alpha" => tally.ok_alpha.fetch_add(1, Ordering::SeqCst),
        _ => tally.ok_beta.fetch_add(1, Ordering::SeqCst),
    };
    outcome.to_owned()
}

impl Tally {
    fn fail(&self, why: String) -> String {
        self.failed.fetch_add(1, Ordering::SeqCst);
        self.failures.lock().unwrap().push(why);
        "failed".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_under_load_without_a_failed_request() {
    let alpha = SyntheticOrigin::start("alpha").await;
    let beta = SyntheticOrigin::start("beta").await;
    // Nothing is stored: every request is a fill, so every request shows its origin.
    for origin in [&alpha, &beta] {
        origin.set_cache_control(Some("no-store"));
        origin.set_latency(std::time::Duration::from_millis(5));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let (listen, admin) = (free_addr(), free_addr());
    let write = |text: String| std::fs::write(&path, text).unwrap();
    write(node_config(listen, admin, &alpha.url(), ""));
    let log = std::fs::File::create(dir.path().join("node.log")).unwrap();
    let node = Running(
        Command::new(PREFETCHER)
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "prefetcher=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let client = TestClient::new();
    wait_until_answers(&client, admin).await;

    // The load: clients issuing requests continuously until told to stop.
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..6 {
        let (client, tally, stop) = (TestClient::new(), Arc::clone(&tally), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                fetch(&client, listen, &format!("/load/{c}/{n}"), &tally).await;
                n += 1;
            }
        }));
    }
    let progressed = |tally: &Tally, past: usize| tally.ok() >= past;
    wait_until(|| progressed(&tally, 50), "load before the first reload").await;

    // 1. A limit changes: in force, nothing else moves.
    write(node_config(
        listen,
        admin,
        &alpha.url(),
        "[limits]\nmax_header_bytes = 65536\n",
    ));
    node.signal("HUP");
    wait_reloads(&client, admin, "ok", 1.0).await;
    let seen = tally.ok();
    wait_until(|| progressed(&tally, seen + 50), "load after a reload").await;

    // 2. A config that fails the check: refused, the running one kept.
    write(node_config(listen, admin, "ftp://nowhere", ""));
    node.signal("HUP");
    wait_reloads(&client, admin, "refused", 1.0).await;
    let seen = tally.ok();
    wait_until(
        || progressed(&tally, seen + 50),
        "load after a refused reload",
    )
    .await;
    assert_eq!(
        fetch(&client, listen, "/after-refused", &tally).await,
        "alpha"
    );

    // 3. A setting that needs a restart: reported, kept (the old address serves).
    let elsewhere = free_addr();
    write(node_config(elsewhere, admin, &alpha.url(), ""));
    node.signal("HUP");
    wait_reloads(&client, admin, "ok", 2.0).await;
    let seen = tally.ok();
    wait_until(
        || progressed(&tally, seen + 50),
        "load after a restart-only change",
    )
    .await;

    // 4. The tenant moves to another origin while requests are held at the old one:
    // they finish there; new requests go to the new origin.
    alpha.hold();
    alpha.wait_in_flight(3).await;
    write(node_config(listen, admin, &beta.url(), ""));
    node.signal("HUP");
    wait_reloads(&client, admin, "ok", 3.0).await;
    // Every load client is held at the old origin by now or soon; these are new.
    let alphas = tally.ok_alpha.load(Ordering::SeqCst);
    for n in 0..50 {
        let path = format!("/after-move/{n}");
        assert_eq!(fetch(&client, listen, &path, &tally).await, "beta");
    }
    let held = alpha.in_flight();
    assert!(held >= 3, "the held requests went on without the origin");
    assert_eq!(
        tally.ok_alpha.load(Ordering::SeqCst),
        alphas,
        "held, not answered"
    );
    alpha.release();
    wait_until(
        || tally.ok_alpha.load(Ordering::SeqCst) >= alphas + held,
        "the requests held at the old origin to finish there",
    )
    .await;
    let betas = tally.ok_beta.load(Ordering::SeqCst);
    wait_until(
        || tally.ok_beta.load(Ordering::SeqCst) >= betas + 50,
        "the load on the new origin",
    )
    .await;

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        tally.failed.load(Ordering::SeqCst),
        0,
        "failed requests: {:?}",
        tally.failures.lock().unwrap()
    );
    // No flight is left behind: every waiter was answered, every fill ended.
    let flights = metric(&client, admin, "prefetcher_flights").await;
    assert_eq!(flights, Some(0.0));
    assert_eq!(alpha.in_flight() + beta.in_flight(), 0);
    assert_eq!(reloads(&client, admin, "ok").await, 3.0);
    assert_eq!(reloads(&client, admin, "refused").await, 1.0);
    assert!(
        client.get(elsewhere, "acme.example", "/x").await.is_err(),
        "the new listen address needs a restart"
    );

    node.signal("TERM");
    let logged = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    for said in [
        "refused",
        "needs a restart",
        "field=listen",
        "tenants[0].origin",
    ] {
        assert!(
            logged.contains(said),
            "the log does not say {said:?}:\n{logged}"
        );
    }
}

async fn wait_until_answers(client: &TestClient, admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while client.get(admin, "admin", "/healthz").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A self-signed certificate for `localhost`, written over `cert_file` and
/// `key_file`; its PEM.
fn write_cert(cert_file: &Path, key_file: &Path) -> String {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let pem = generated.cert.pem();
    std::fs::File::create(cert_file)
        .unwrap()
        .write_all(pem.as_bytes())
        .unwrap();
    std::fs::File::create(key_file)
        .unwrap()
        .write_all(generated.key_pair.serialize_pem().as_bytes())
        .unwrap();
    pem
}

/// A fresh client (a new connection, a new handshake) that trusts `pem` only.
async fn get_trusting(pem: &str, addr: SocketAddr) -> Result<u16, String> {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
        .resolve("localhost", addr)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/k", addr.port());
    match client.get(url).send().await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(e) => Err(format!("{e:?}")),
    }
}

#[tokio::test]
async fn a_reload_puts_a_renewed_certificate_in_force_for_new_handshakes() {
    let origin = SyntheticOrigin::start("origin").await;
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file): (PathBuf, PathBuf) =
        (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let old = write_cert(&cert_file, &key_file);
    let mut config = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin.url(),
    );
    config.tls = Some(TlsListenConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
    });
    let node = spawn_node(config.clone()).await.unwrap();
    let addr = node.tls_addr().unwrap();
    assert_eq!(get_trusting(&old, addr).await, Ok(200));

    // A broken key file at the same path: refused, the old certificate stays.
    std::fs::write(&key_file, "not a key\n").unwrap();
    let refused = node.reload(config.clone()).unwrap_err().to_string();
    assert!(refused.contains("tls.key_file"), "{refused}");
    assert_eq!(get_trusting(&old, addr).await, Ok(200));

    // Renewed at the same paths: new handshakes present the new certificate.
    let new = write_cert(&cert_file, &key_file);
    let reloaded = node.reload(config).unwrap();
    assert!(reloaded.needs_restart.is_empty(), "{reloaded:?}");
    assert_eq!(get_trusting(&new, addr).await, Ok(200));
    assert!(
        get_trusting(&old, addr).await.is_err(),
        "the old one is gone"
    );
    assert_eq!(node.node().metrics().config_reloads_ok.get(), 1);
    assert_eq!(node.node().metrics().config_reloads_refused.get(), 1);
    node.shutdown().await;
}
