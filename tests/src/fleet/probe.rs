//! Asking the processes: one answer, waiting until the fleet has settled, and every
//! instance's answers against the reference's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prefetcher::testing::TestClient;
use serde_json::Value;

use super::answers::{OwnedPartition, differences, parse_coverage, parse_health, short, strip};
use super::process::{PROCESS_BOUND, PulseProcess};

/// Longest wait for the fleet to settle after a step (a correctness bound: the step
/// failed if it takes longer; speed is the bench's business).
pub const SETTLE_BOUND: Duration = Duration::from_secs(90);

/// The client that asks the processes of a fleet reading a topic of `partitions`
/// partitions.
pub struct FleetProbe {
    client: TestClient,
    partitions: i32,
}

impl FleetProbe {
    /// A probe for a topic of `partitions` partitions.
    pub fn new(partitions: i32) -> Self {
        FleetProbe {
            client: TestClient::new(),
            partitions,
        }
    }

    /// `GET path`: the status and the body as JSON (or as a JSON string when it is not).
    pub async fn get(&self, addr: SocketAddr, path: &str) -> Result<(u16, Value), String> {
        let fetched = tokio::time::timeout(
            Duration::from_secs(10),
            self.client.get(addr, "127.0.0.1", path),
        )
        .await
        .map_err(|_| format!("GET {path}: no answer within 10 s"))??;
        let body = fetched.body?;
        let value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        Ok((fetched.status.as_u16(), value))
    }

    /// The sum of `process`'s metric samples whose line starts with `prefix` (a name,
    /// or a name and labels), from its `/metrics`; 0 when they cannot be read.
    pub async fn metric_sum(&self, process: &PulseProcess, prefix: &str) -> f64 {
        match self.get(process.addr(), "/metrics").await {
            Ok((200, Value::String(text))) => text
                .lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
            _ => 0.0,
        }
    }

    /// Waits until `process` answers `/healthz` with 200.
    pub async fn wait_healthy(&self, process: &mut PulseProcess) {
        let deadline = Instant::now() + PROCESS_BOUND;
        loop {
            process.expect_running();
            if let Ok((200, _)) = self.get(process.addr(), "/healthz").await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer /healthz within {PROCESS_BOUND:?}\n{}",
                process.name,
                process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the live instances have settled (each partition owned by exactly
    /// one of them, its `next_offset` at the high watermark `hwm`, not replaying, and
    /// every instance's `/api/tenants` whole, `down` being the peers allowed missing)
    /// and returns how long that took from `since`. Each poll's unmet condition is
    /// kept for the failure message.
    pub async fn settle(
        &self,
        fleet: &mut [&mut PulseProcess],
        down: &[String],
        hwm: &[i64],
        since: Instant,
        step: &str,
    ) -> Duration {
        let mut last_problem;
        loop {
            for process in fleet.iter_mut() {
                process.expect_running();
            }
            match self.settled(fleet, down, hwm).await {
                Ok(()) => return since.elapsed(),
                Err(problem) => last_problem = problem,
            }
            if since.elapsed() > SETTLE_BOUND {
                let logs: Vec<String> = fleet.iter().map(|p| p.log_tail()).collect();
                panic!(
                    "{step}: the fleet did not settle within {SETTLE_BOUND:?}: {last_problem}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Ok` when each partition is owned by exactly one live instance, at the high
    /// watermark and not replaying, and every instance's answer covers all partitions.
    async fn settled(
        &self,
        fleet: &[&mut PulseProcess],
        down: &[String],
        hwm: &[i64],
    ) -> Result<(), String> {
        let partitions = self.partitions;
        let mut owners: BTreeMap<i32, Vec<(&str, OwnedPartition)>> = BTreeMap::new();
        for process in fleet {
            let (status, body) = self
                .get(process.addr(), "/healthz")
                .await
                .map_err(|e| format!("{}: {e}", process.name))?;
            if status != 200 {
                return Err(format!("{}: /healthz answered {status}", process.name));
            }
            let (count, owned) = parse_health(process.name, &body);
            // 0 until the first assignment tells the instance the topic's partition count.
            if count != i64::from(partitions) {
                return Err(format!(
                    "{}: /healthz partition_count {count}",
                    process.name
                ));
            }
            for p in owned {
                owners
                    .entry(p.partition)
                    .or_default()
                    .push((process.name, p));
            }
            let route = "/api/tenants";
            let (status, body) = self
                .get(process.addr(), route)
                .await
                .map_err(|e| format!("{}: {e}", process.name))?;
            if status != 200 {
                return Err(format!(
                    "{}: {route} answered {status}: {}",
                    process.name,
                    short(&body)
                ));
            }
            let coverage = parse_coverage(process.name, route, &body);
            if !coverage.is_whole(partitions, down) {
                return Err(format!("{}: {route} covers {coverage:?}", process.name));
            }
        }
        for partition in 0..partitions {
            let Some(owned) = owners.get(&partition) else {
                return Err(format!("partition {partition}: no live instance owns it"));
            };
            let [(name, p)] = owned.as_slice() else {
                return Err(format!(
                    "partition {partition}: owned by several: {owned:?}"
                ));
            };
            let high = hwm[partition as usize];
            if p.replaying || p.next_offset != high {
                return Err(format!(
                    "partition {partition} on {name}: {p:?}, high watermark {high}"
                ));
            }
            assert!(
                p.next_offset <= high && p.live_from <= p.next_offset,
                "partition {partition} on {name}: offsets out of order: {p:?}, high watermark {high}"
            );
        }
        if let Some(extra) = owners.keys().find(|p| !(0..partitions).contains(*p)) {
            panic!("an instance claims partition {extra}, the topic has {partitions}");
        }
        Ok(())
    }

    /// Asks the reference and every instance `routes`; returns one line per difference
    /// (but for [`IGNORED_FIELDS`](super::IGNORED_FIELDS)), `down` being the peers an
    /// answer may miss.
    pub async fn compare(
        &self,
        reference: &PulseProcess,
        fleet: &[&PulseProcess],
        down: &[String],
        routes: &[String],
    ) -> Vec<String> {
        let mut mismatches = Vec::new();
        for route in routes {
            let (want_status, want) = self
                .get(reference.addr(), route)
                .await
                .unwrap_or_else(|e| panic!("reference: {e}"));
            // A key's answer comes from its owner (the producers' partitioner, learnt
            // from the messages): one partition, the same one from every instance.
            let one_key = route.starts_with("/api/keys/");
            let mut key_partitions = None;
            if want_status == 200 {
                let coverage = parse_coverage("reference", route, &want);
                if one_key {
                    let owners = key_owners(&want);
                    assert!(
                        coverage.complete && owners.len() == 1,
                        "reference: GET {route} covers {coverage:?}, asks {owners:?}"
                    );
                    key_partitions = Some(owners);
                } else {
                    assert!(
                        coverage.is_whole(self.partitions, &[]),
                        "reference: GET {route} covers {coverage:?}"
                    );
                }
            }
            let want = strip(&want);
            for process in fleet {
                let (status, got) = self
                    .get(process.addr(), route)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", process.name));
                if status == 200 {
                    let coverage = parse_coverage(process.name, route, &got);
                    let covered = match &key_partitions {
                        Some(owner) => {
                            // Whole, from the owner alone or from everyone.
                            (coverage.complete || coverage.is_whole(self.partitions, down))
                                && key_owners(&got) == *owner
                        }
                        None => coverage.is_whole(self.partitions, down),
                    };
                    if !covered {
                        let want = key_partitions
                            .as_ref()
                            .map_or_else(String::new, |p| format!(" (the reference: {p:?})"));
                        mismatches.push(format!(
                            "{} GET {route}: covers {coverage:?}{want}",
                            process.name
                        ));
                    }
                }
                if status != want_status {
                    mismatches.push(format!(
                        "{} GET {route}: status {status}, the reference {want_status}: {}",
                        process.name,
                        short(&got)
                    ));
                    continue;
                }
                let mut diffs = Vec::new();
                differences("", &want, &strip(&got), &mut diffs);
                for diff in diffs.iter().take(5) {
                    mismatches.push(format!("{} GET {route}: {diff}", process.name));
                }
                if diffs.len() > 5 {
                    mismatches.push(format!(
                        "{} GET {route}: and {} more differences",
                        process.name,
                        diffs.len() - 5
                    ));
                }
            }
        }
        mismatches
    }
}

/// The partitions a key answer added (`ownership.partitions`).
fn key_owners(answer: &serde_json::Value) -> Vec<i32> {
    answer["ownership"]["partitions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_i64())
                .map(|p| p as i32)
                .collect()
        })
        .unwrap_or_default()
}
