//! The edge agent's configuration: TOML, defaults, [`AgentConfig::validate`] naming
//! the bad field.
//!
//! ```
//! let config: prefetcher::AgentConfig = toml::from_str(r#"
//!     region = "eu-west"
//!     node = "nginx-1"
//!     log_path = "/var/log/nginx/edge-pulse.json"
//!     log_format = "nginx_json"
//!     state_path = "/var/lib/edge-agent/position.json"
//!     cache_url = "http://127.0.0.1:8081"
//!     admin_listen = "127.0.0.1:9101"
//!     [kafka]
//!     brokers = "127.0.0.1:9092"
//!     [[tenants]]
//!     id = "acme"
//!     hosts = ["acme.example", "www.acme.example"]
//! "#)?;
//! config.validate()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http::Uri;
use models::{NodeId, RegionId, TenantId};
use serde::{Deserialize, Serialize};

use super::formats::LogFormat;
use crate::config::{
    ConfigError, FlightConfig, KafkaConfig, PrefetchConfig, check_tenant_hosts, invalid,
};

/// One tenant as the agent sees it: the host names that select it. The first host is
/// the `Host` of the tenant's pre-warm requests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTenant {
    /// The tenant id.
    pub id: TenantId,
    /// Host names (without port); `"*"` makes it the fallback for any other host.
    pub hosts: Vec<String>,
}

/// Pre-warm requests to the local cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmConfig {
    /// The adaptive limit of concurrent pre-warm requests: the prefetcher's own
    /// settings (`max_fills` is the ceiling and start, `min_fills` the floor,
    /// `max_queued` and `queue_timeout_ms` bound the wait, latency rules as there).
    pub limit: PrefetchConfig,
    /// Longest a pre-warm request may take (head and body); past it, it counts as
    /// an error for the adaptive limit.
    pub timeout_ms: u64,
    /// Header (name) the shipped configs recognise as a pre-warm; value `1`.
    pub header: String,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            limit: PrefetchConfig {
                max_fills: 8,
                ..PrefetchConfig::default()
            },
            timeout_ms: 30_000,
            header: "x-edge-pulse-prewarm".into(),
        }
    }
}

/// The whole agent configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The region of the node the agent runs beside.
    pub region: Option<RegionId>,
    /// The node's id (events, the pre-warm consumer group `edge-agent-{node}`).
    pub node: Option<NodeId>,
    /// The access log to follow.
    pub log_path: PathBuf,
    /// Its format.
    pub log_format: LogFormat,
    /// Where the read position is kept across restarts.
    pub state_path: PathBuf,
    /// How often the read position is saved, in milliseconds.
    pub checkpoint_ms: u64,
    /// How often the log is polled for new lines when idle, in milliseconds.
    pub poll_ms: u64,
    /// How long a renamed log is still read before switching to the new file (the
    /// server writes to the old one until it reopens).
    pub rotate_grace_ms: u64,
    /// Longest line read; longer ones are skipped and counted.
    pub max_line_bytes: usize,
    /// The local cache's address (`http://host:port`) pre-warm requests go to.
    pub cache_url: String,
    /// Where `/metrics` and `/healthz` are served; off when absent.
    pub admin_listen: Option<SocketAddr>,
    /// Host name → tenant: the only source of an event's tenant.
    pub tenants: Vec<AgentTenant>,
    /// Kafka: events out, pre-warm commands in (`brokers` required).
    pub kafka: KafkaConfig,
    /// Pre-warm requests.
    pub warm: WarmConfig,
    /// Warm-up at start: the region's warm set from pulse, requested of the local
    /// cache before `/readyz` says ready; off when absent.
    pub warmup: Option<crate::config::WarmupConfig>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            region: None,
            node: None,
            log_path: PathBuf::new(),
            log_format: LogFormat::NginxJson,
            state_path: PathBuf::new(),
            checkpoint_ms: 1_000,
            poll_ms: 100,
            rotate_grace_ms: 2_000,
            max_line_bytes: 64 * 1024,
            cache_url: "http://127.0.0.1:80".into(),
            admin_listen: None,
            tenants: Vec::new(),
            kafka: KafkaConfig::default(),
            warm: WarmConfig::default(),
            warmup: None,
        }
    }
}

impl AgentConfig {
    /// Reads a TOML file (unknown fields are an error). Call
    /// [`AgentConfig::validate`] after applying overrides.
    pub fn from_file(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The pre-warm consumer group: `kafka.group_id`, else `edge-agent-{node}`, so
    /// every agent reads every command.
    pub fn prewarm_group(&self) -> String {
        match (&self.kafka.group_id, &self.node) {
            (Some(group), _) => group.clone(),
            (None, Some(node)) => format!("edge-agent-{node}"),
            (None, None) => "edge-agent".into(),
        }
    }

    /// The fill limits the adaptive pre-warm limit is built from: every slot is the
    /// agent's (the node's own user traffic never passes through the agent).
    pub(crate) fn warm_flight(&self) -> FlightConfig {
        FlightConfig {
            max_fills: self.warm.limit.max_fills,
            reserved_for_user: 0,
            ..FlightConfig::default()
        }
    }

    /// Checks every field that could make the agent misbehave; the error names it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.region.is_none() {
            return Err(invalid("region", "required"));
        }
        if let Some(warmup) = &self.warmup {
            warmup.validate()?;
            warmup.token()?;
            if !warmup.peers.is_empty() {
                // The agent's cache is nginx's or Varnish's: it fills through them.
                return Err(invalid(
                    "warmup.peers",
                    "the edge agent warms through its own cache, from no peer",
                ));
            }
        }
        if self.node.is_none() {
            return Err(invalid("node", "required"));
        }
        if self.log_path.as_os_str().is_empty() {
            return Err(invalid("log_path", "required"));
        }
        if self.state_path.as_os_str().is_empty() {
            return Err(invalid("state_path", "required"));
        }
        if self.state_path == self.log_path {
            return Err(invalid("state_path", "must not be the log itself"));
        }
        for (field, value) in [
            ("checkpoint_ms", self.checkpoint_ms),
            ("poll_ms", self.poll_ms),
            ("warm.timeout_ms", self.warm.timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if self.max_line_bytes < 256 {
            return Err(invalid("max_line_bytes", "must be at least 256"));
        }
        let uri: Uri = self
            .cache_url
            .parse()
            .map_err(|e| invalid("cache_url", format!("not a URL: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(invalid("cache_url", "must be http://host[:port]"));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(invalid("cache_url", "must have no path"));
        }
        if self.tenants.is_empty() {
            return Err(invalid("tenants", "at least one tenant is required"));
        }
        let mut ids = HashSet::new();
        let mut hosts = HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !ids.insert(&t.id) {
                return Err(invalid(format!("tenants[{i}].id"), "duplicate tenant id"));
            }
            if t.hosts.is_empty() {
                return Err(invalid(format!("tenants[{i}].hosts"), "at least one host"));
            }
            check_tenant_hosts(i, &t.hosts, &mut hosts)?;
        }
        let kafka = &self.kafka;
        if kafka.brokers.as_deref().is_none_or(|b| b.trim().is_empty()) {
            return Err(invalid("kafka.brokers", "required"));
        }
        for (field, topic) in [
            ("kafka.events_topic", &kafka.events_topic),
            ("kafka.prewarm_topic", &kafka.prewarm_topic),
        ] {
            if !models::is_topic_name(topic) {
                return Err(invalid(field, "not a legal Kafka topic name"));
            }
        }
        if kafka.queue_max_messages == 0 {
            return Err(invalid("kafka.queue_max_messages", "must be positive"));
        }
        if kafka.message_timeout_ms == 0 {
            return Err(invalid("kafka.message_timeout_ms", "must be positive"));
        }
        let limit = &self.warm.limit;
        if limit.max_fills == 0 {
            return Err(invalid("warm.limit.max_fills", "must be positive"));
        }
        if limit.min_fills == 0 || limit.min_fills > limit.max_fills {
            return Err(invalid(
                "warm.limit.min_fills",
                "must be between 1 and warm.limit.max_fills",
            ));
        }
        if !(limit.latency_tolerance.is_finite() && limit.latency_tolerance >= 1.0) {
            return Err(invalid(
                "warm.limit.latency_tolerance",
                "must be at least 1",
            ));
        }
        if http::HeaderName::from_bytes(self.warm.header.as_bytes()).is_err() {
            return Err(invalid("warm.header", "not a header name"));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal valid configuration (one tenant), shared by the agent's tests.
    pub(crate) fn valid() -> AgentConfig {
        toml::from_str(
            r#"
            region = "eu-west"
            node = "n1"
            log_path = "/tmp/a.log"
            state_path = "/tmp/a.state"
            cache_url = "http://127.0.0.1:8081"
            [kafka]
            brokers = "127.0.0.1:9092"
            [[tenants]]
            id = "acme"
            hosts = ["acme.example"]
            "#,
        )
        .unwrap()
    }

    fn field_of(config: &AgentConfig) -> String {
        match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn a_complete_config_is_valid() {
        valid().validate().unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        type Breaker = fn(&mut AgentConfig);
        let cases: [(&str, Breaker); 9] = [
            ("region", |c| c.region = None),
            ("log_path", |c| c.log_path = PathBuf::new()),
            ("cache_url", |c| c.cache_url = "ftp://x".into()),
            ("tenants", |c| c.tenants.clear()),
            ("tenants[0].hosts", |c| {
                c.tenants[0].hosts = vec!["a b".into()]
            }),
            ("kafka.brokers", |c| c.kafka.brokers = None),
            ("kafka.events_topic", |c| {
                c.kafka.events_topic = "a/b".into()
            }),
            ("warm.limit.min_fills", |c| c.warm.limit.min_fills = 99),
            ("warmup.peers", |c| {
                c.warmup = Some(crate::config::WarmupConfig {
                    pulse: "http://pulse:8081".into(),
                    peers: vec!["http://peer:8080".into()],
                    ..Default::default()
                })
            }),
        ];
        for (field, break_it) in cases {
            let mut config = valid();
            break_it(&mut config);
            assert_eq!(field_of(&config), field);
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = "region = \"r\"\nlog_pth = \"/x\"\n";
        let error = toml::from_str::<AgentConfig>(text).unwrap_err().to_string();
        assert!(error.contains("log_pth"), "{error}");
    }
}
