//! Configuration: a serde struct with defaults, read from TOML, overridable by flags,
//! checked by [`Config::validate`] which names the bad field.
//!
//! One file per part of the node the sections configure: `client` (`[tls]`,
//! `[limits]`, `[server]`, `[http2]`), `caching` (`[cache]`, `[flight]`,
//! `[prefetch]`), `kafka`, `origin` (`[origin]`, `[[tenants]]`), `warmup` (`[warmup]`,
//! shared with the edge agent); this file the whole
//! [`Config`], its errors and its validation.
//!
//! ```
//! let config: prefetcher::Config = toml::from_str(r#"
//!     listen = "127.0.0.1:8080"
//!     [flight]
//!     wait_timeout_ms = 3000
//!     on_wait_timeout = "hedge"
//!     [[tenants]]
//!     id = "acme"
//!     hosts = ["acme.example", "www.acme.example"]
//!     origin = "http://127.0.0.1:9000"
//! "#)?;
//! config.validate()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use models::{NodeId, RegionId, TenantId};
use serde::{Deserialize, Serialize};

mod caching;
mod client;
mod hints;
mod kafka;
mod origin;
mod purge;
mod shares;
mod warmup;

pub use caching::{CacheConfig, FlightConfig, PrefetchConfig, WaitTimeoutPolicy};
pub(crate) use client::IpNetwork;
pub use client::{ConnectionLimits, Http2Config, RequestLimits, TlsListenConfig};
pub use hints::OriginHintsConfig;
pub use kafka::{KafkaConfig, OffsetReset};
pub use origin::{FillFields, OriginConfig, TenantConfig};
pub(crate) use origin::{check_forward_headers, check_tenant_hosts, parse_origin, tls_server_name};
pub use purge::PurgeConfig;
pub(crate) use shares::check_tenant_share;
pub use shares::{RouteConfig, TrafficClass, class_of};
pub use warmup::WarmupConfig;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown fields included).
    #[error("cannot parse {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, which names the field.
        message: String,
    },
    /// A field holds a value that cannot work.
    #[error("config field `{field}`: {reason}")]
    Invalid {
        /// The dotted path of the field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// `Result` with [`ConfigError`].
pub(crate) type Result<T, E = ConfigError> = std::result::Result<T, E>;

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The whole node configuration.
///
/// Deserialising it also carries deprecated fields over to their new ones (see
/// [`Config::deprecations`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, remote = "Self")]
pub struct Config {
    /// Where the proxy listens (HTTP/1.1 and h2c).
    pub listen: SocketAddr,
    /// Where `/metrics` and `/healthz` are served; off when absent.
    pub admin_listen: Option<SocketAddr>,
    /// The L1 cache.
    pub cache: CacheConfig,
    /// Single-flight behaviour.
    pub flight: FlightConfig,
    /// The origin client.
    pub origin: OriginConfig,
    /// Host name → tenant → origin: the only source of a request's tenant.
    pub tenants: Vec<TenantConfig>,
    /// The region this node serves (access events, pre-warm targeting). Required
    /// when `kafka.brokers` is set.
    pub region: Option<RegionId>,
    /// This node's id (access events, the pre-warm consumer group). Required when
    /// `kafka.brokers` is set; unique per node.
    pub node: Option<NodeId>,
    /// Pre-warm fills: the adaptive limit and queue of the prefetch class.
    pub prefetch: PrefetchConfig,
    /// Kafka: the access-event publisher and the pre-warm consumer.
    pub kafka: KafkaConfig,
    /// Size limits on client requests.
    pub limits: RequestLimits,
    /// Timeouts and limits on client connections: what a slow or greedy client can
    /// hold.
    pub server: ConnectionLimits,
    /// A TLS listener for clients (HTTP/1.1 and HTTP/2 by ALPN), beside the plain
    /// one; off when absent.
    pub tls: Option<TlsListenConfig>,
    /// Bounds on what one HTTP/2 client connection may make the node do.
    pub http2: Http2Config,
    /// Warm-up at start from pulse's hot keyset of the region; off when absent (the
    /// node is ready at once).
    pub warmup: Option<WarmupConfig>,
    /// Purges: the admin endpoint's token, the re-warm bound (`crate::purge`).
    pub purge: PurgeConfig,
}

impl Serialize for Config {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Config::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut config = Config::deserialize(deserializer)?;
        config.carry_deprecated();
        Ok(config)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: None,
            cache: CacheConfig::default(),
            flight: FlightConfig::default(),
            origin: OriginConfig::default(),
            tenants: Vec::new(),
            region: None,
            node: None,
            prefetch: PrefetchConfig::default(),
            kafka: KafkaConfig::default(),
            limits: RequestLimits::default(),
            server: ConnectionLimits::default(),
            tls: None,
            http2: Http2Config::default(),
            warmup: None,
            purge: PurgeConfig::default(),
        }
    }
}

impl Config {
    /// One tenant that answers every host, in front of `origin`.
    pub fn single_origin(listen: SocketAddr, tenant: TenantId, origin: impl Into<String>) -> Self {
        Config {
            listen,
            tenants: vec![TenantConfig {
                id: tenant,
                hosts: vec!["*".into()],
                origin: origin.into(),
                host_header: None,
                weight: 1.0,
                peak_fills: None,
                routes: Vec::new(),
                origin_hints: None,
            }],
            ..Config::default()
        }
    }

    /// Reads a TOML file (unknown fields are an error). Call [`Config::validate`] after
    /// applying overrides.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Carries deprecated fields given alone over to their new ones:
    /// `http2.send_stall_timeout_ms` to `server.send_timeout_ms` (while the latter is
    /// at its default).
    fn carry_deprecated(&mut self) {
        if let Some(stall) = self.http2.send_stall_timeout_ms
            && self.server.send_timeout_ms == ConnectionLimits::default().send_timeout_ms
        {
            self.server.send_timeout_ms = stall;
        }
    }

    /// The deprecated fields this configuration sets, each with what to write
    /// instead: to be logged when the node starts.
    pub fn deprecations(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.http2.send_stall_timeout_ms.is_some() {
            found.push(
                "config field `http2.send_stall_timeout_ms` is deprecated: set \
                 `server.send_timeout_ms`, the one send timeout of HTTP/1 and HTTP/2"
                    .to_owned(),
            );
        }
        found
    }

    /// Checks every field that could make the node misbehave; the error names it.
    pub fn validate(&self) -> Result<()> {
        self.purge.validate()?;
        if let Some(w) = &self.warmup {
            w.validate()?;
            if self.region.is_none() {
                return Err(invalid(
                    "region",
                    "required by [warmup]: the warm set is the region's",
                ));
            }
        }
        let c = &self.cache;
        if c.max_bytes == 0 {
            return Err(invalid("cache.max_bytes", "must be positive"));
        }
        if c.max_object_bytes == 0 || c.max_object_bytes > c.max_bytes {
            return Err(invalid(
                "cache.max_object_bytes",
                "must be positive and at most cache.max_bytes",
            ));
        }
        if c.max_object_bytes > u64::from(u32::MAX) / 2 {
            return Err(invalid("cache.max_object_bytes", "must be below 2 GiB"));
        }
        if c.max_variants == 0 {
            return Err(invalid("cache.max_variants", "must be positive"));
        }
        if !(0.0..1.0).contains(&c.jitter) {
            return Err(invalid("cache.jitter", "must be in [0, 1)"));
        }
        if !(0.0..=100.0).contains(&c.xfetch_beta) {
            return Err(invalid("cache.xfetch_beta", "must be in [0, 100]"));
        }
        let f = &self.flight;
        if f.wait_timeout_ms == 0 {
            return Err(invalid("flight.wait_timeout_ms", "must be positive"));
        }
        if f.max_fills == 0 {
            return Err(invalid("flight.max_fills", "must be positive"));
        }
        if f.reserved_for_user >= f.max_fills {
            return Err(invalid(
                "flight.reserved_for_user",
                "must be below flight.max_fills",
            ));
        }
        if f.max_flights == 0 {
            return Err(invalid("flight.max_flights", "must be positive"));
        }
        for (name, v) in [
            ("flight.queue_timeout_ms", f.queue_timeout_ms),
            ("flight.share_idle_ms", f.share_idle_ms),
            ("flight.origin_min_fills", f.origin_min_fills as u64),
        ] {
            if v == 0 {
                return Err(invalid(name, "must be positive"));
            }
        }
        if f.retry_after_max_s == 0 {
            return Err(invalid("flight.retry_after_max_s", "must be positive"));
        }
        let p = &self.prefetch;
        if p.min_fills == 0 || p.min_fills > p.max_fills {
            return Err(invalid(
                "prefetch.min_fills",
                "must be positive and at most prefetch.max_fills",
            ));
        }
        if p.queue_timeout_ms == 0 {
            return Err(invalid("prefetch.queue_timeout_ms", "must be positive"));
        }
        if !(p.latency_tolerance > 1.0 && p.latency_tolerance <= 100.0) {
            return Err(invalid("prefetch.latency_tolerance", "must be in (1, 100]"));
        }
        if p.latency_target_ms == Some(0) {
            return Err(invalid("prefetch.latency_target_ms", "must be positive"));
        }
        let l = &self.limits;
        if l.max_uri_bytes < 64 || l.max_header_bytes < 1024 {
            return Err(invalid(
                "limits",
                "max_uri_bytes must be at least 64 and max_header_bytes at least 1024",
            ));
        }
        self.validate_kafka()?;
        self.http2.validate()?;
        if let Some(stall) = self.http2.send_stall_timeout_ms
            && stall != self.server.send_timeout_ms
        {
            return Err(invalid(
                "http2.send_stall_timeout_ms",
                format!(
                    "deprecated, and {stall} differs from server.send_timeout_ms ({}), the \
                     one send timeout of HTTP/1 and HTTP/2: set only server.send_timeout_ms",
                    self.server.send_timeout_ms
                ),
            ));
        }
        self.server.validate()?;
        let o = &self.origin;
        for (name, v) in [
            ("origin.connect_timeout_ms", o.connect_timeout_ms),
            ("origin.header_timeout_ms", o.header_timeout_ms),
            ("origin.body_idle_timeout_ms", o.body_idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(invalid(name, "must be positive"));
            }
        }
        check_forward_headers(&o.forward_headers)?;
        if self.tenants.is_empty() {
            return Err(invalid("tenants", "at least one tenant is needed"));
        }
        let mut ids = HashSet::new();
        let mut hosts = HashSet::new();
        // TLS connections are pooled per origin authority, so one authority has one
        // server name.
        let mut server_names: std::collections::HashMap<String, String> =
            std::collections::HashMap::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !ids.insert(t.id.as_str()) {
                return Err(invalid(format!("tenants[{i}].id"), "duplicate tenant id"));
            }
            parse_origin(&t.origin).map_err(|r| invalid(format!("tenants[{i}].origin"), r))?;
            check_tenant_hosts(i, &t.hosts, &mut hosts)?;
            check_tenant_share(i, t)?;
            if let Some(hints) = &t.origin_hints {
                hints::check_origin_hints(i, hints)?;
            }
            if let Some(h) = &t.host_header
                && http::HeaderValue::from_str(h).is_err()
            {
                return Err(invalid(
                    format!("tenants[{i}].host_header"),
                    "not a valid header value",
                ));
            }
            let (base, _) = parse_origin(&t.origin).unwrap_or_default();
            if let Some(authority) = base.strip_prefix("https://") {
                let name = tls_server_name(authority, t.host_header.as_deref());
                if let Err(reason) = rustls_pki_types::ServerName::try_from(name.as_str()) {
                    return Err(invalid(
                        format!("tenants[{i}].host_header"),
                        format!("{name:?} is not a TLS server name: {reason}"),
                    ));
                }
                match server_names.get(authority) {
                    Some(other) if *other != name => {
                        return Err(invalid(
                            format!("tenants[{i}].host_header"),
                            format!(
                                "another tenant reaches {authority} as {other:?}; TLS \
                                 connections are pooled per origin, so one origin has \
                                 one server name"
                            ),
                        ));
                    }
                    _ => {
                        server_names.insert(authority.to_string(), name);
                    }
                }
            }
        }
        Ok(())
    }

    /// The pre-warm consumer group: `kafka.group_id`, else `prefetcher-{node}`.
    pub fn prewarm_group(&self) -> String {
        match (&self.kafka.group_id, &self.node) {
            (Some(g), _) => g.clone(),
            (None, Some(node)) => format!("prefetcher-{node}"),
            (None, None) => "prefetcher".into(),
        }
    }

    pub(crate) fn wait_timeout(&self) -> Duration {
        Duration::from_millis(self.flight.wait_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: &str, hosts: &[&str], origin: &str) -> TenantConfig {
        TenantConfig {
            id: TenantId::new(id).unwrap(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            origin: origin.into(),
            host_header: None,
            weight: 1.0,
            peak_fills: None,
            routes: Vec::new(),
            origin_hints: None,
        }
    }

    #[test]
    fn unknown_fields_are_refused_and_named() {
        let err = toml::from_str::<Config>("[cache]\nmax_bytez = 1\n").unwrap_err();
        assert!(err.to_string().contains("max_bytez"), "{err}");
    }

    #[test]
    fn validate_names_the_bad_field() {
        let mut c = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        c.validate().unwrap();
        c.cache.jitter = 1.5;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("cache.jitter")
        );
        c.cache.jitter = 0.1;
        c.tenants.push(tenant("u", &["*"], "ftp://x"));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("tenants[1].origin"), "{e}");
        c.tenants[1].origin = "http://x".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("tenants[1].hosts"), "{e}");
        c.tenants[1] = tenant("t", &["a.example"], "http://x");
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("tenants[1].id")
        );
    }

    #[test]
    fn http2_bounds_are_checked_and_named() {
        let mut c = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        let parsed: Config =
            toml::from_str("[http2]\nmax_concurrent_streams = 64\nsend_stall_timeout_ms = 500\n")
                .unwrap();
        assert_eq!(parsed.http2.max_concurrent_streams, 64);
        assert_eq!(parsed.http2.max_pending_accept_reset_streams, 20);
        assert!(toml::from_str::<Config>("[http2]\nmax_streams = 1\n").is_err());
        type BreakIt = fn(&mut Http2Config);
        let bad: [(&str, BreakIt); 6] = [
            ("http2.max_concurrent_streams", |h| {
                h.max_concurrent_streams = 0
            }),
            ("http2.max_header_list_bytes", |h| {
                h.max_header_list_bytes = 100
            }),
            ("http2.max_pending_accept_reset_streams", |h| {
                h.max_pending_accept_reset_streams = 0
            }),
            ("http2.max_local_error_reset_streams", |h| {
                h.max_local_error_reset_streams = 0
            }),
            ("http2.keep_alive_timeout_ms", |h| {
                h.keep_alive_timeout_ms = 0
            }),
            ("http2.send_stall_timeout_ms", |h| {
                h.send_stall_timeout_ms = Some(0)
            }),
        ];
        for (field, break_it) in bad {
            c.http2 = Http2Config::default();
            break_it(&mut c.http2);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        c.http2 = Http2Config {
            keep_alive_interval_ms: 0,
            ..Http2Config::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn the_deprecated_send_stall_timeout_sets_the_send_timeout_or_is_refused_beside_another() {
        let parse = |toml: &str| toml::from_str::<Config>(toml).unwrap();
        let with_tenant = |mut c: Config| {
            c.tenants = vec![tenant("t", &["*"], "http://127.0.0.1:1")];
            c
        };
        // Alone: it is the send timeout, and the node is told to warn.
        let alone = with_tenant(parse("[http2]\nsend_stall_timeout_ms = 500\n"));
        assert_eq!(alone.server.send_timeout_ms, 500);
        alone.validate().unwrap();
        let warnings = alone.deprecations();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("http2.send_stall_timeout_ms")
                && warnings[0].contains("server.send_timeout_ms"),
            "{warnings:?}"
        );
        // Beside the same value: accepted, still warned about.
        let same = with_tenant(parse(
            "[server]\nsend_timeout_ms = 700\n[http2]\nsend_stall_timeout_ms = 700\n",
        ));
        same.validate().unwrap();
        assert_eq!(same.deprecations().len(), 1);
        // Beside a different value: refused, naming both.
        let both = with_tenant(parse(
            "[server]\nsend_timeout_ms = 700\n[http2]\nsend_stall_timeout_ms = 500\n",
        ));
        let e = both.validate().unwrap_err().to_string();
        assert!(
            e.contains("http2.send_stall_timeout_ms") && e.contains("server.send_timeout_ms"),
            "{e}"
        );
        // The new field alone: nothing deprecated.
        let new = with_tenant(parse("[server]\nsend_timeout_ms = 700\n"));
        assert!(new.deprecations().is_empty());
        assert_eq!(new.http2.send_stall_timeout_ms, None);
        // Serialised back, the deprecated field is left out when unset.
        let text = toml::to_string(&Config::default()).unwrap();
        assert!(!text.contains("send_stall_timeout_ms"), "{text}");
    }

    #[test]
    fn forwarding_and_upload_settings_are_checked_and_named() {
        let base = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        let parsed: Config = toml::from_str(
            "[origin]\nforward_headers = [\"x-api-version\"]\nfill_fields = \"allowlist\"\n\
             [server]\ntrusted_proxies = [\"10.0.0.0/8\"]\nbody_deadline_ms = 60000\n",
        )
        .unwrap();
        assert_eq!(parsed.origin.forward_headers, ["x-api-version"]);
        assert_eq!(parsed.origin.fill_fields, FillFields::Allowlist);
        assert_eq!(base.origin.fill_fields, FillFields::EndToEnd);
        let typo = toml::from_str::<Config>("[origin]\nfill_fields = \"all\"\n");
        assert!(typo.is_err_and(|e| e.to_string().contains("fill_fields")));
        assert_eq!(parsed.server.body_deadline_ms, 60_000);
        for (name, why) in [
            ("x_forwarded_host", "underscore"),
            ("X-Api", "lower-case"),
            ("bad name", "lower-case"),
            ("host", "host_header"),
            ("x-forwarded-for", "trusted_proxies"),
            ("forwarded", "trusted_proxies"),
            ("connection", "hop-by-hop"),
        ] {
            let mut c = base.clone();
            c.origin.forward_headers = vec!["x-ok".into(), name.into()];
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("origin.forward_headers[1]") && e.contains(why),
                "{name}: {e}"
            );
        }
        type BreakIt = fn(&mut ConnectionLimits);
        let cases: [(&str, BreakIt); 4] = [
            ("server.trusted_proxies[0]", |s| {
                s.trusted_proxies = vec!["10.0.0.0/40".into()]
            }),
            ("server.body_deadline_ms", |s| s.body_deadline_ms = 0),
            ("server.max_uploads", |s| s.max_uploads = 0),
            ("server.max_uploads_per_address", |s| {
                s.max_uploads_per_address = s.max_uploads + 1
            }),
        ];
        for (field, break_it) in cases {
            let mut c = base.clone();
            break_it(&mut c.server);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn kafka_needs_region_and_node_and_sane_topics() {
        let mut c = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        c.kafka.brokers = Some("127.0.0.1:9092".into());
        assert!(c.validate().unwrap_err().to_string().contains("`region`"));
        c.region = Some(RegionId::new("eu-west").unwrap());
        assert!(c.validate().unwrap_err().to_string().contains("`node`"));
        c.node = Some(NodeId::new("edge-1").unwrap());
        c.validate().unwrap();
        assert_eq!(c.prewarm_group(), "prefetcher-edge-1");
        c.kafka.events_topic = "bad topic".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("kafka.events_topic"), "{e}");
        c.kafka.events_topic = "edge-events".into();
        c.prefetch.min_fills = c.prefetch.max_fills + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("prefetch.min_fills"), "{e}");
        let parsed: Config = toml::from_str(
            "region = \"r\"\nnode = \"n\"\n[kafka]\nbrokers = \"b:1\"\nprewarm_offset_reset = \"latest\"\n[prefetch]\nmax_fills = 4\n",
        )
        .unwrap();
        assert_eq!(parsed.kafka.prewarm_offset_reset, OffsetReset::Latest);
        assert!(toml::from_str::<Config>("[kafka]\nbrokerz = \"b\"\n").is_err());
        assert!(toml::from_str::<Config>("node = \"a b\"\n").is_err());
    }

    #[test]
    fn server_limits_are_checked_and_the_bad_field_named() {
        let base = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        base.validate().unwrap();
        type BreakIt = fn(&mut ConnectionLimits);
        let cases: [(&str, BreakIt); 10] = [
            ("server.header_timeout_ms", |s| s.header_timeout_ms = 0),
            ("server.idle_timeout_ms", |s| s.idle_timeout_ms = 86_400_000),
            ("server.body_timeout_ms", |s| s.body_timeout_ms = 0),
            ("server.max_connections", |s| s.max_connections = 0),
            ("server.max_connections_per_address", |s| {
                s.max_connections_per_address = s.max_connections + 1
            }),
            ("server.requests_per_second_per_address", |s| {
                s.requests_per_second_per_address = f64::NAN
            }),
            ("server.request_burst_per_address", |s| {
                s.requests_per_second_per_address = 10.0;
                s.request_burst_per_address = 0;
            }),
            ("server.exempt[1]", |s| {
                s.exempt = vec!["10.0.0.0/8".into(), "10.0.0.0/33".into()]
            }),
            ("server.listen_backlog", |s| s.listen_backlog = 0),
            ("server.max_headers", |s| s.max_headers = 0),
        ];
        for (field, break_it) in cases {
            let mut c = base.clone();
            break_it(&mut c.server);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        }
        let parsed: Config = toml::from_str(
            "[server]\nheader_timeout_ms = 5000\nexempt = [\"::1\", \"192.0.2.0/24\"]\n",
        )
        .unwrap();
        parsed.server.validate().unwrap();
        assert_eq!(parsed.server.header_timeout_ms, 5000);
        assert_eq!(parsed.server.idle_timeout_ms, 60_000, "the rest defaults");
        assert!(toml::from_str::<Config>("[server]\nheader_timeout = 1\n").is_err());
    }

    #[test]
    fn the_fill_bounds_of_connections_and_addresses_are_checked_by_name() {
        let base = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "http://127.0.0.1:1",
        );
        type BreakIt = fn(&mut ConnectionLimits);
        let cases: [(&str, BreakIt); 3] = [
            ("server.max_fills_per_connection", |s| {
                s.max_fills_per_connection = 0
            }),
            ("server.max_fills_per_address", |s| {
                s.max_fills_per_address = s.max_fills_per_connection - 1
            }),
            ("server.max_cancelled_fills_per_connection", |s| {
                s.max_cancelled_fills_per_connection = 0
            }),
        ];
        for (field, break_it) in cases {
            let mut c = base.clone();
            break_it(&mut c.server);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        }
        let mut off = base.clone();
        off.server.max_fills_per_address = 0;
        off.validate().unwrap();
        let parsed: Config = toml::from_str(
            "[server]\nmax_fills_per_connection = 8\n[cache]\nstore_errors = true\n",
        )
        .unwrap();
        parsed.server.validate().unwrap();
        assert_eq!(parsed.server.max_fills_per_connection, 8);
        assert_eq!(parsed.server.max_cancelled_fills_per_connection, 64);
        assert!(parsed.cache.store_errors);
        assert!(!base.cache.store_errors, "errors are not stored by default");
    }

    #[test]
    fn networks_match_their_prefix() {
        let net = IpNetwork::parse("192.0.2.0/24").unwrap();
        assert!(net.contains("192.0.2.255".parse().unwrap()));
        assert!(net.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert!(!net.contains("192.0.3.0".parse().unwrap()));
        let one = IpNetwork::parse("2001:db8::1").unwrap();
        assert!(one.contains("2001:db8::1".parse().unwrap()));
        assert!(!one.contains("2001:db8::2".parse().unwrap()));
        assert!(
            IpNetwork::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(IpNetwork::parse("example.com").is_err());
        assert!(IpNetwork::parse("::/129").is_err());
    }

    #[test]
    fn origin_urls_split_into_base_and_prefix() {
        assert_eq!(
            parse_origin("http://127.0.0.1:9000/base/").unwrap(),
            ("http://127.0.0.1:9000".into(), "/base".into())
        );
        assert_eq!(
            parse_origin("http://o.example").unwrap(),
            ("http://o.example".into(), "".into())
        );
        assert!(parse_origin("o.example").is_err());
        assert_eq!(
            parse_origin("https://o.example:8443/p").unwrap(),
            ("https://o.example:8443".into(), "/p".into())
        );
    }

    #[test]
    fn https_origins_take_their_server_name_from_the_host_header_or_the_url() {
        assert_eq!(tls_server_name("o.example:8443", None), "o.example");
        assert_eq!(
            tls_server_name("10.0.0.5", Some("WWW.Acme.example:443")),
            "www.acme.example"
        );
        assert_eq!(tls_server_name("[::1]:8443", None), "::1");
        let mut c = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("t").unwrap(),
            "https://127.0.0.1:8443",
        );
        c.tenants[0].host_header = Some("a.example".into());
        c.validate().unwrap();
        // A second tenant on the same TLS origin must use the same server name.
        let mut other = tenant("u", &["u.example"], "https://127.0.0.1:8443/u");
        other.host_header = Some("b.example".into());
        c.tenants.push(other);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("tenants[1].host_header"), "{e}");
        c.tenants[1].host_header = Some("a.example".into());
        c.validate().unwrap();
    }
}
