//! Load replayed from an access log in one of the edge agent's formats (nginx or
//! varnishncsa JSON), read with the agent's own [`LineMapper`]: each line that makes
//! an event is one request at its time, replayed at `scale` nodes of the fleet.
//! Lines that make no event are counted and skipped.

use std::collections::HashMap;
use std::path::Path;

use models::TenantId;
use prefetcher::{AgentConfig, AgentTenant, Line, LineMapper, LogFormat};

/// A log's requests: per line, ms since the first line and the key's index (keys
/// ordered by how often the log asks for them, the most requested first).
#[derive(Debug, Clone, Default)]
pub struct LogLoad {
    /// (ms since the first line, key index), in time order.
    pub requests: Vec<(u64, u32)>,
    /// The keys' paths.
    pub keys: Vec<String>,
    /// Well-formed lines that make no event (not cached, unknown status…).
    pub skipped: u64,
    /// Lines not of the format.
    pub malformed: u64,
    /// Each line is replayed at this many nodes.
    pub scale: u32,
}

impl LogLoad {
    /// Virtual seconds the log spans (at least 1).
    pub fn span_s(&self) -> u64 {
        self.requests.last().map_or(0, |(ms, _)| ms / 1000) + 1
    }
}

/// Reads `path` as `format`; every host is the one tenant.
pub fn read_log(path: &Path, format: LogFormat, scale: u32) -> std::io::Result<LogLoad> {
    let text = std::fs::read(path)?;
    let config = AgentConfig {
        log_format: format,
        tenants: vec![AgentTenant {
            id: TenantId::new("sim").expect("valid tenant"),
            hosts: vec!["*".to_owned()],
        }],
        ..AgentConfig::default()
    };
    let mapper = LineMapper::new(&config);
    let mut load = LogLoad {
        scale: scale.max(1),
        ..LogLoad::default()
    };
    let mut lines: Vec<(u64, String)> = Vec::new();
    for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match mapper.map(line) {
            Line::Event(record) => lines.push((record.ts_ms, record.key.as_str().to_owned())),
            Line::Skip(_) => load.skipped += 1,
            Line::Malformed(_) => load.malformed += 1,
        }
    }
    lines.sort_by_key(|(ts, _)| *ts);
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for (_, key) in &lines {
        *counts.entry(key).or_insert(0) += 1;
    }
    let mut keys: Vec<(&str, u64)> = counts.into_iter().collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let index: HashMap<&str, u32> = keys
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (*k, i as u32))
        .collect();
    let start = lines.first().map_or(0, |(ts, _)| *ts);
    load.requests = lines
        .iter()
        .map(|(ts, k)| (ts - start, index[k.as_str()]))
        .collect();
    load.keys = keys.iter().map(|(k, _)| (*k).to_owned()).collect();
    Ok(load)
}
