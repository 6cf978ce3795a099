//! `[warmup]`: what a node (or the edge agent) warms before it reports ready, shared by
//! both binaries' configurations.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Result, invalid};

/// Most keys one warm-up may ask pulse for (pulse's own bound on `/api/warmset`).
const MAX_WARMUP_KEYS: usize = 1_000;

/// Most peers a warm-up asks: a region's nodes, each asked at most once per key.
const MAX_WARMUP_PEERS: usize = 16;

/// Warm-up at start: the region's hot keyset, asked of pulse, filled at background
/// priority before `/readyz` answers 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupConfig {
    /// Pulse's API base URL (`http://host:port`); any instance answers for the fleet.
    pub pulse: String,
    /// A file holding pulse's API bearer token (its first line); none: no token sent.
    pub token_file: Option<PathBuf>,
    /// Longest `/readyz` says `warming`, from the start: past it the node reports
    /// ready anyway (counted in `prefetcher_warmup_deadline_hit_total`).
    pub deadline_ms: u64,
    /// How long pulse may take to answer; unanswered, the node is ready at once.
    pub request_timeout_ms: u64,
    /// Most keys warmed (1 to 1000), split among the tenants by their `weight`.
    pub max_keys: usize,
    /// Most bytes warmed, split among the tenants by their `weight`: past a tenant's
    /// part no further key of it is started.
    pub max_bytes: u64,
    /// The region's other nodes (`http://host:port`, their client listeners): each
    /// warm-set key is asked of them from their caches only (`only-if-cached`)
    /// before the origin, so a restart costs the origin what no peer holds. At most
    /// 16; the edge agent takes none (its cache fills through its own proxy).
    pub peers: Vec<String>,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        WarmupConfig {
            pulse: String::new(),
            token_file: None,
            deadline_ms: 30_000,
            request_timeout_ms: 2_000,
            max_keys: 500,
            max_bytes: 256 << 20,
            peers: Vec::new(),
        }
    }
}

impl WarmupConfig {
    /// Checks every field; the error names it (`warmup.<field>`).
    pub fn validate(&self) -> Result<()> {
        let url: http::Uri = self
            .pulse
            .parse()
            .map_err(|e| invalid("warmup.pulse", format!("{:?}: {e}", self.pulse)))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(invalid(
                "warmup.pulse",
                format!("{:?}: must be http://host[:port]", self.pulse),
            ));
        }
        if url.query().is_some() {
            return Err(invalid("warmup.pulse", "must have no query"));
        }
        for (field, v) in [
            ("warmup.deadline_ms", self.deadline_ms),
            ("warmup.request_timeout_ms", self.request_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&v) {
                return Err(invalid(field, format!("{v}: must be in 1..=3600000")));
            }
        }
        if !(1..=MAX_WARMUP_KEYS).contains(&self.max_keys) {
            return Err(invalid(
                "warmup.max_keys",
                format!("{}: must be in 1..={MAX_WARMUP_KEYS}", self.max_keys),
            ));
        }
        if self.max_bytes == 0 {
            return Err(invalid("warmup.max_bytes", "must be positive"));
        }
        self.peer_urls()?;
        Ok(())
    }

    /// `peers`, parsed: each `http://host[:port]` with nothing after it.
    pub fn peer_urls(&self) -> Result<Vec<http::Uri>> {
        if self.peers.len() > MAX_WARMUP_PEERS {
            return Err(invalid(
                "warmup.peers",
                format!("{} peers: at most {MAX_WARMUP_PEERS}", self.peers.len()),
            ));
        }
        self.peers
            .iter()
            .map(|peer| {
                let bad = |why: &str| invalid("warmup.peers", format!("{peer:?}: {why}"));
                let url: http::Uri = peer.parse().map_err(|_| bad("not a URL"))?;
                if url.scheme_str() != Some("http") || url.host().is_none() {
                    return Err(bad("must be http://host[:port]"));
                }
                if url.path_and_query().is_some_and(|p| p.as_str() != "/") {
                    return Err(bad("must have no path or query"));
                }
                Ok(url)
            })
            .collect()
    }

    /// Reads `token_file`: its first line, trimmed. A file that cannot be read or is
    /// empty is an error naming the field, never the token.
    pub fn token(&self) -> Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("warmup.token_file", format!("{}: {e}", path.display())))?;
        let token = text.lines().next().unwrap_or("").trim();
        if token.is_empty() {
            return Err(invalid(
                "warmup.token_file",
                format!("{}: empty", path.display()),
            ));
        }
        Ok(Some(token.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_field_is_named() {
        let good = WarmupConfig {
            pulse: "http://127.0.0.1:8081".into(),
            ..WarmupConfig::default()
        };
        good.validate().unwrap();
        type Spoil = fn(&mut WarmupConfig);
        let cases: [(&str, Spoil); 9] = [
            ("warmup.pulse", |c| c.pulse = "ftp://x".into()),
            ("warmup.pulse", |c| c.pulse = String::new()),
            ("warmup.deadline_ms", |c| c.deadline_ms = 0),
            ("warmup.request_timeout_ms", |c| c.request_timeout_ms = 0),
            ("warmup.max_keys", |c| c.max_keys = 1_001),
            ("warmup.max_bytes", |c| c.max_bytes = 0),
            ("warmup.peers", |c| {
                c.peers = vec!["https://peer:8080".into()]
            }),
            ("warmup.peers", |c| {
                c.peers = vec!["http://peer:8080/x".into()]
            }),
            ("warmup.peers", |c| {
                c.peers = vec!["http://peer:8080".into(); MAX_WARMUP_PEERS + 1]
            }),
        ];
        for (field, spoil) in cases {
            let mut c = good.clone();
            spoil(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        }
        let c = WarmupConfig {
            token_file: Some("/nonexistent/token".into()),
            ..good
        };
        let e = c.token().unwrap_err().to_string();
        assert!(e.contains("warmup.token_file"), "{e}");
    }
}
