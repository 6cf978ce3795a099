//! What the processes' answers say, and where two answers differ.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Fields that legitimately differ between an instance and the reference, at any depth
/// of an answer: which partitions and peers an answer covers (checked on its own), and
/// the memory an instance holds and may hold (its own share of the partitions).
/// Nothing else may differ: every count and time in these answers is event time.
pub const IGNORED_FIELDS: [&str; 3] = ["coverage", "memory_bytes", "memory_budget_bytes"];

/// One partition as `/healthz` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedPartition {
    /// The partition.
    pub partition: i32,
    /// The next offset the owner will apply.
    pub next_offset: i64,
    /// The first offset applied live (before it: replayed).
    pub live_from: i64,
    /// Whether the owner is still rebuilding it from the topic.
    pub replaying: bool,
}

/// `/healthz`'s `partition_count` and `partitions` (FLEET.md). A body without them
/// breaks the contract: that fails at once, it is not waited out.
pub fn parse_health(name: &str, body: &Value) -> (i64, Vec<OwnedPartition>) {
    let contract = || {
        format!(
            "{name}: /healthz must carry `partition_count` and \
             `partitions: [{{partition, next_offset, live_from, replaying}}]` (FLEET.md); \
             it answered {body}"
        )
    };
    let count = body["partition_count"]
        .as_i64()
        .unwrap_or_else(|| panic!("{}", contract()));
    let partitions = body["partitions"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", contract()))
        .iter()
        .map(|p| OwnedPartition {
            partition: p["partition"]
                .as_i64()
                .unwrap_or_else(|| panic!("{}", contract())) as i32,
            next_offset: p["next_offset"]
                .as_i64()
                .unwrap_or_else(|| panic!("{}", contract())),
            live_from: p["live_from"]
                .as_i64()
                .unwrap_or_else(|| panic!("{}", contract())),
            replaying: p["replaying"]
                .as_bool()
                .unwrap_or_else(|| panic!("{}", contract())),
        })
        .collect();
    (count, partitions)
}

/// What an answer says it covers.
#[derive(Debug)]
pub struct Coverage {
    /// The partitions it counts.
    pub partitions: BTreeSet<i32>,
    /// The topic's partition count as the instance knows it.
    pub partition_count: i64,
    /// Whether it says it is whole.
    pub complete: bool,
    /// The peers it could not ask.
    pub missing_peers: Vec<String>,
}

impl Coverage {
    /// Every one of `partitions` partitions, once; and complete, unless the only peers
    /// missing are the instances in `down`: whether a peer that is down but owns
    /// nothing makes an answer incomplete is the implementation's call, so either is
    /// accepted; a live peer missing never is.
    pub fn is_whole(&self, partitions: i32, down: &[String]) -> bool {
        let missing_only_down = self
            .missing_peers
            .iter()
            .all(|peer| down.contains(&peer.trim_end_matches('/').to_owned()));
        let complete = self.complete || !self.missing_peers.is_empty();
        complete
            && missing_only_down
            && self.partition_count == i64::from(partitions)
            && self.partitions == (0..partitions).collect()
    }
}

/// The `coverage` every `/api/*` answer carries (FLEET.md); its absence fails at once.
pub fn parse_coverage(name: &str, route: &str, body: &Value) -> Coverage {
    let c = &body["coverage"];
    let contract = || {
        format!(
            "{name}: GET {route} must carry `coverage: {{partitions, partition_count, \
             complete, missing_peers}}` (FLEET.md); it answered {}",
            short(body)
        )
    };
    Coverage {
        partitions: c["partitions"]
            .as_array()
            .unwrap_or_else(|| panic!("{}", contract()))
            .iter()
            .map(|p| p.as_i64().unwrap_or_else(|| panic!("{}", contract())) as i32)
            .collect(),
        partition_count: c["partition_count"]
            .as_i64()
            .unwrap_or_else(|| panic!("{}", contract())),
        complete: c["complete"]
            .as_bool()
            .unwrap_or_else(|| panic!("{}", contract())),
        missing_peers: c["missing_peers"]
            .as_array()
            .unwrap_or_else(|| panic!("{}", contract()))
            .iter()
            .map(|p| p.as_str().unwrap_or_default().to_owned())
            .collect(),
    }
}

/// Per tenant: (`events`, `events_60s`) from a `/api/tenants` answer.
pub fn tenant_counts(body: &Value) -> BTreeMap<String, (u64, u64)> {
    body["tenants"]
        .as_array()
        .map(|tenants| {
            tenants
                .iter()
                .map(|t| {
                    (
                        t["tenant"].as_str().unwrap_or_default().to_owned(),
                        (
                            t["events"].as_u64().unwrap_or_default(),
                            t["events_60s"].as_u64().unwrap_or_default(),
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A body cut to a readable length for a failure message.
pub fn short(body: &Value) -> String {
    let text = body.to_string();
    if text.chars().count() > 600 {
        format!("{}…", text.chars().take(600).collect::<String>())
    } else {
        text
    }
}

/// `value` without [`IGNORED_FIELDS`], at any depth.
pub fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !IGNORED_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

/// Where `got` differs from `want`, as `path: want X, got Y` lines: exactly, but for
/// fractions, which may differ by rounding.
pub fn differences(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let keys: BTreeSet<&String> = w.keys().chain(g.keys()).collect();
            for k in keys {
                let (wv, gv) = (
                    w.get(k).unwrap_or(&Value::Null),
                    g.get(k).unwrap_or(&Value::Null),
                );
                differences(&format!("{path}.{k}"), wv, gv, out);
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                differences(&format!("{path}[{i}]"), wv, gv, out);
            }
        }
        // Fractions (rates, bounds) summed over partitions in another grouping may
        // differ in the last bits; counts are integers and compared exactly.
        (Value::Number(w), Value::Number(g)) if w.is_f64() || g.is_f64() => {
            let (w, g) = (w.as_f64().unwrap(), g.as_f64().unwrap());
            if (w - g).abs() > 1e-9 * w.abs().max(g.abs()) {
                out.push(format!("{path}: want {w}, got {g}"));
            }
        }
        _ if want != got => out.push(format!("{path}: want {}, got {}", short(want), short(got))),
        _ => {}
    }
}
