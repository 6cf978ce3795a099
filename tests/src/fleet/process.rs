//! One `pulse serve` process, and the binary it runs.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Longest wait for a process to answer `/healthz` or to exit after SIGTERM.
pub const PROCESS_BOUND: Duration = Duration::from_secs(60);

/// The `pulse` binary, built once per test run.
///
/// A `tests` crate test has no `CARGO_BIN_EXE_pulse` (that exists only for the
/// package's own binaries), and a `pulse` lying in the target dir may be stale. So the
/// test asks cargo (`$CARGO`, set by `cargo test`) to build it, in the same profile and
/// target dir, and takes the path cargo reports: up to date by construction, a no-op
/// when it already is. Cargo releases its build lock before it runs tests, so the
/// nested build does not wait on the outer one. `PULSE_BIN` overrides it (a release
/// binary, an installed one).
pub fn pulse_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("PULSE_BIN") {
            return PathBuf::from(bin);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(&cargo);
        command
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .args(["build", "--locked", "-p", "pulse", "--bin", "pulse"])
            .arg("--message-format=json-render-diagnostics")
            .stderr(Stdio::inherit());
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {cargo} build -p pulse: {e}"));
        assert!(
            output.status.success(),
            "building pulse failed ({}); cargo's messages are above",
            output.status
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "pulse")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported no pulse executable")
    })
}

/// Where the processes log, and the variables they get (nothing else `PULSE_`).
pub struct ProcessEnv {
    /// The directory of the log files.
    pub dir: PathBuf,
    /// Environment variables set for every process.
    pub vars: Vec<(String, String)>,
}

/// One `pulse serve` process on a fixed port. SIGKILLed (and reaped) on drop; its
/// stdout and stderr go to a log file (kept across restarts) whose tail goes into
/// every failure message about it.
pub struct PulseProcess {
    /// Its name in logs and failure messages.
    pub name: &'static str,
    port: u16,
    args: Vec<String>,
    vars: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Drop for PulseProcess {
    fn drop(&mut self) {
        self.sigkill();
    }
}

impl PulseProcess {
    /// Starts `pulse serve ARGS --listen 127.0.0.1:PORT`.
    pub fn start(name: &'static str, port: u16, args: Vec<String>, env: &ProcessEnv) -> Self {
        let mut process = PulseProcess {
            name,
            port,
            args,
            vars: env.vars.clone(),
            log: env.dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        self.starts += 1;
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        writeln!(log, "--- start {} of {}", self.starts, self.name).unwrap();
        let mut command = Command::new(pulse_bin());
        command
            .arg("serve")
            .args(&self.args)
            .args(["--listen", &self.addr().to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env("RUST_LOG", "info");
        // The test's own environment must not configure the instances.
        for (var, _) in std::env::vars() {
            if var.starts_with("PULSE_") {
                command.env_remove(var);
            }
        }
        command.envs(self.vars.iter().map(|(k, v)| (k, v)));
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        self.child = Some(child);
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        format!(
            "--- {} ({}), last lines:\n{tail}",
            self.name,
            self.log.display()
        )
    }

    /// Panics with its log when the process has exited on its own.
    pub fn expect_running(&mut self) {
        let Some(child) = self.child.as_mut() else {
            panic!("{} is not running", self.name);
        };
        if let Some(status) = child.try_wait().unwrap() {
            self.child = None;
            panic!(
                "{} exited on its own with {status}\n{}",
                self.name,
                self.log_tail()
            );
        }
    }

    /// Restarts it on the same port (its peers know it by that URL).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// SIGKILL, and reaps it.
    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit (it must come within [`PROCESS_BOUND`]).
    pub fn sigterm(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {}", self.name);
        let deadline = Instant::now() + PROCESS_BOUND;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit within {PROCESS_BOUND:?} of SIGTERM\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
