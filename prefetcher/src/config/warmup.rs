//! `[warmup]`: what a node (or the edge agent) warms before it reports ready, shared by
//! both binaries' configurations.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Result, invalid};

/// Most keys one warm-up may ask pulse for (pulse's own bound on `/api/warmset`).
const MAX_WARMUP_KEYS: usize = 1_000;

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
        Ok(())
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
        let cases: [(&str, Spoil); 6] = [
            ("warmup.pulse", |c| c.pulse = "ftp://x".into()),
            ("warmup.pulse", |c| c.pulse = String::new()),
            ("warmup.deadline_ms", |c| c.deadline_ms = 0),
            ("warmup.request_timeout_ms", |c| c.request_timeout_ms = 0),
            ("warmup.max_keys", |c| c.max_keys = 1_001),
            ("warmup.max_bytes", |c| c.max_bytes = 0),
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
