//! Configuration: a serde struct with defaults, read from TOML, overridable by flags,
//! checked by [`Config::validate`] which names the bad field.
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
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use models::{NodeId, RegionId, TenantId};
use serde::{Deserialize, Serialize};

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

/// Checks tenant `i`'s host names (no port, no path) and that no other tenant maps
/// them: the host map is how a request finds its tenant, so it must be a function.
pub(crate) fn check_tenant_hosts(
    i: usize,
    tenant_hosts: &[String],
    seen: &mut HashSet<String>,
) -> Result<()> {
    for h in tenant_hosts {
        let h = h.to_ascii_lowercase();
        if h.is_empty() || h.contains(['/', ' ', ':']) {
            return Err(invalid(
                format!("tenants[{i}].hosts"),
                format!("{h:?} is not a host name (no port, no path)"),
            ));
        }
        if !seen.insert(h.clone()) {
            return Err(invalid(
                format!("tenants[{i}].hosts"),
                format!("{h:?} already belongs to another tenant"),
            ));
        }
    }
    Ok(())
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
}

/// The TLS listener: where, and the PEM certificate chain and private key it serves.
/// Both files are read when the node starts; a missing, unreadable or mismatched
/// file fails the start and names its field.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsListenConfig {
    /// Where the TLS listener binds.
    pub listen: SocketAddr,
    /// PEM file: the server certificate first, then its chain.
    pub cert_file: PathBuf,
    /// PEM file: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
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
        }
    }
}

/// Size limits on client requests, checked before anything else: past them a request
/// gets 414, 431 or 413 and never reaches the cache, a flight or the origin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestLimits {
    /// Longest request target (path and query, or absolute form), in bytes: 414.
    pub max_uri_bytes: usize,
    /// Most bytes of header names and values together (plus 32 per header, as
    /// HTTP/2 counts them): 431. Also bounds what hyper buffers for a request head.
    pub max_header_bytes: usize,
    /// Largest request body forwarded to the origin: 413 when `Content-Length` says
    /// more; a longer streamed body is cut off and the request fails.
    pub max_body_bytes: u64,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_uri_bytes: 8 * 1024,
            max_header_bytes: 32 * 1024,
            max_body_bytes: 16 * 1024 * 1024,
        }
    }
}

/// HTTP/2 on both client listeners (h2c by prior knowledge on the plain one, h2 by
/// ALPN on the TLS one): what one connection may open, send and hold. A client past
/// a connection bound gets `GOAWAY` and the connection ends, counted by reason in
/// `prefetcher_h2_connection_errors_total`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Config {
    /// Streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`);
    /// a client that opens more has them refused.
    pub max_concurrent_streams: u32,
    /// Largest request header list, counted as HTTP/2 does (name + value + 32 per
    /// field): past it the stream gets 431. It also caps the `CONTINUATION` frames of
    /// one header block (a `CONTINUATION` flood, CVE-2024-27316, ends the connection).
    pub max_header_list_bytes: u32,
    /// Streams a client may open and reset before the node accepted them (rapid
    /// reset, CVE-2023-44487); past it the connection ends (`ENHANCE_YOUR_CALM`).
    pub max_pending_accept_reset_streams: usize,
    /// Streams the node may reset on one connection for the client's errors
    /// (malformed requests, oversized headers); past it the connection ends.
    pub max_local_error_reset_streams: usize,
    /// An idle connection is pinged this often, and closed when a ping is not
    /// answered within `keep_alive_timeout_ms`; 0 sends no pings.
    pub keep_alive_interval_ms: u64,
    /// How long a keep-alive ping may go unanswered.
    pub keep_alive_timeout_ms: u64,
    /// Deprecated: `server.send_timeout_ms`, the one send timeout of HTTP/1 and
    /// HTTP/2 alike, now also bounds a client that leaves a response waiting for
    /// flow-control window. Still read: given alone, it sets `server.send_timeout_ms`
    /// (a warning at start names the new field); given beside a different
    /// `server.send_timeout_ms`, validation refuses both. A `server.send_timeout_ms` at
    /// its default counts as not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_stall_timeout_ms: Option<u64>,
}

impl Default for Http2Config {
    fn default() -> Self {
        Http2Config {
            max_concurrent_streams: 256,
            max_header_list_bytes: 64 * 1024,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            keep_alive_interval_ms: 20_000,
            keep_alive_timeout_ms: 20_000,
            send_stall_timeout_ms: None,
        }
    }
}

/// Timeouts and limits on the client connections of the proxy listeners (plain and
/// TLS together): how long a slow client may hold a connection, how many connections
/// the node and one client address may hold, how fast one address may send requests.
/// Each limit that acts is counted in `prefetcher_client_limits_total{reason}`.
///
/// Timeouts close the connection (an HTTP/2 one with `GOAWAY` when idle); a refused
/// connection is accepted and closed at once; a refused request gets 429 or 431.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Longest a request head may take to arrive: from the accept (TLS handshake
    /// included) for a connection's first request, from its first byte for a later
    /// one. Past it the connection is closed (`header_timeout`).
    pub header_timeout_ms: u64,
    /// Longest a connection may stay open with no request in flight (HTTP/1.1 between
    /// keep-alive requests, HTTP/2 with no open stream); then it is closed
    /// (`idle_timeout`).
    pub idle_timeout_ms: u64,
    /// Longest a response may wait on a client that takes none of its bytes (the
    /// socket's send buffer full, nothing written since); then the connection is
    /// closed (`send_timeout`).
    pub send_timeout_ms: u64,
    /// Longest gap between two reads of a request body the node forwards to the
    /// origin (a pass-through upload): past it the client gets 408 (or, if the origin
    /// answered already, a closed connection) and the origin request is aborted
    /// (`body_timeout`).
    pub body_timeout_ms: u64,
    /// Most open client connections, plain and TLS listeners together; more are
    /// accepted and closed at once (`max_connections`). Lowered at start to what the
    /// open-file limit (`ulimit -n`) leaves after a reserve for origin connections.
    pub max_connections: usize,
    /// Most open connections from one client address (an IPv6 client: its /64); more
    /// are accepted and closed at once (`address_connections`). 0 turns it off.
    pub max_connections_per_address: usize,
    /// Requests per second one client address may sustain (a token bucket refilled at
    /// this rate): past it 429 with `Retry-After` (`address_rate`). 0 (the default)
    /// turns it off: many users may share one address (NAT).
    pub requests_per_second_per_address: f64,
    /// Requests one client address may send at once before the rate applies (the
    /// bucket's size).
    pub request_burst_per_address: u32,
    /// Most client addresses tracked at once (memory: about 100 bytes each); at least
    /// `max_connections`, so every open connection's address fits.
    pub max_tracked_addresses: usize,
    /// Addresses or networks (`10.0.0.0/8`, `2001:db8::/32`, `127.0.0.1`) free of the
    /// per-address limits: the edges in front of a shield, a trusted load balancer.
    pub exempt: Vec<String>,
    /// The listen backlog of the proxy listeners: connections the kernel completes
    /// before the node accepts them (Linux caps it at `net.core.somaxconn`). A flood
    /// of reconnects past it drops SYNs, which clients retry after a second.
    pub listen_backlog: u32,
    /// Most header fields in a request: past it 431 (`too_many_headers`; an HTTP/1.1
    /// head is refused by the parser and counted `head_too_large`). Above 100 every
    /// HTTP/1.1 request head costs a heap allocation.
    pub max_headers: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 30_000,
            body_timeout_ms: 10_000,
            max_connections: 16_384,
            max_connections_per_address: 1_024,
            requests_per_second_per_address: 0.0,
            request_burst_per_address: 200,
            max_tracked_addresses: 65_536,
            exempt: Vec::new(),
            listen_backlog: 4096,
            max_headers: 100,
        }
    }
}

impl Http2Config {
    fn validate(&self) -> Result<()> {
        if !(1..=100_000).contains(&self.max_concurrent_streams) {
            return Err(invalid(
                "http2.max_concurrent_streams",
                "must be in [1, 100000]",
            ));
        }
        if !(1024..=16 * 1024 * 1024).contains(&self.max_header_list_bytes) {
            return Err(invalid(
                "http2.max_header_list_bytes",
                "must be in [1024, 16777216]",
            ));
        }
        for (name, v) in [
            (
                "http2.max_pending_accept_reset_streams",
                self.max_pending_accept_reset_streams,
            ),
            (
                "http2.max_local_error_reset_streams",
                self.max_local_error_reset_streams,
            ),
        ] {
            if v == 0 {
                return Err(invalid(name, "must be positive"));
            }
        }
        if self.keep_alive_timeout_ms == 0 {
            return Err(invalid("http2.keep_alive_timeout_ms", "must be positive"));
        }
        if self.send_stall_timeout_ms == Some(0) {
            return Err(invalid("http2.send_stall_timeout_ms", "must be positive"));
        }
        Ok(())
    }
}

impl ConnectionLimits {
    /// Checks every field; the error names it (`server.<field>`).
    pub(crate) fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("server.header_timeout_ms", self.header_timeout_ms),
            ("server.idle_timeout_ms", self.idle_timeout_ms),
            ("server.send_timeout_ms", self.send_timeout_ms),
            ("server.body_timeout_ms", self.body_timeout_ms),
        ] {
            if !(10..=3_600_000).contains(&v) {
                return Err(invalid(name, "must be in [10, 3600000] ms"));
            }
        }
        if !(1..=10_000_000).contains(&self.max_connections) {
            return Err(invalid(
                "server.max_connections",
                "must be in [1, 10000000]",
            ));
        }
        if self.max_connections_per_address > self.max_connections {
            return Err(invalid(
                "server.max_connections_per_address",
                "must be at most server.max_connections (0 turns it off)",
            ));
        }
        let rate = self.requests_per_second_per_address;
        if !(rate.is_finite() && (0.0..=1_000_000.0).contains(&rate)) {
            return Err(invalid(
                "server.requests_per_second_per_address",
                "must be in [0, 1000000] (0 turns it off)",
            ));
        }
        if rate > 0.0 && self.request_burst_per_address == 0 {
            return Err(invalid(
                "server.request_burst_per_address",
                "must be positive when a rate is set",
            ));
        }
        if self.max_tracked_addresses < self.max_connections {
            return Err(invalid(
                "server.max_tracked_addresses",
                "must be at least server.max_connections",
            ));
        }
        for (i, network) in self.exempt.iter().enumerate() {
            IpNetwork::parse(network).map_err(|r| invalid(format!("server.exempt[{i}]"), r))?;
        }
        if !(1..=65_535).contains(&self.listen_backlog) {
            return Err(invalid("server.listen_backlog", "must be in [1, 65535]"));
        }
        if !(1..=1000).contains(&self.max_headers) {
            return Err(invalid("server.max_headers", "must be in [1, 1000]"));
        }
        Ok(())
    }
}

/// An address or a network in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpNetwork {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNetwork {
    /// `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, or one with `/n`.
    pub(crate) fn parse(text: &str) -> std::result::Result<IpNetwork, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: std::net::IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: the prefix must be 0-{max}"))?,
        };
        Ok(IpNetwork { addr, prefix })
    }

    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as IPv4).
    pub(crate) fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The L1 cache: size bounds, TTLs, stale-while-revalidate and early refresh.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Total bytes the cache may hold (bodies, headers and keys).
    pub max_bytes: u64,
    /// Largest object that is cached or collapsed; larger ones pass through.
    pub max_object_bytes: u64,
    /// Freshness lifetime when the origin gives none (no `s-maxage`, `max-age` or
    /// `Expires`): used instead of the RFC 9111 heuristic. 0 (the default) turns it
    /// off, so only what the origin says, or the heuristic it allows, applies.
    pub default_ttl_ms: u64,
    /// Spread of TTLs as a fraction: the default TTL moves by ± this much, origin TTLs
    /// only shorten by up to this much, so entries stored together do not expire
    /// together. 0 turns it off.
    pub jitter: f64,
    /// How long past expiry an entry may be served stale while one refresh runs, or
    /// instead of an origin error, when the origin sends no `stale-while-revalidate` /
    /// `stale-if-error` and nothing that forbids stale (`must-revalidate`,
    /// `proxy-revalidate`, `s-maxage`, `no-cache`). 0 (the default) turns it off.
    pub stale_grace_ms: u64,
    /// Most stored variants of one URL whose responses `Vary`; past it the oldest goes.
    pub max_variants: usize,
    /// How long an expired entry with a validator (`ETag`, `Last-Modified`) is kept
    /// past its last usable moment, to be revalidated with a conditional request.
    pub keep_for_revalidation_ms: u64,
    /// XFetch β for probabilistic early refresh; 0 turns it off, 1 is the usual value.
    pub xfetch_beta: f64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: 256 * 1024 * 1024,
            max_object_bytes: 16 * 1024 * 1024,
            default_ttl_ms: 0,
            jitter: 0.1,
            stale_grace_ms: 0,
            max_variants: 16,
            keep_for_revalidation_ms: 3_600_000,
            xfetch_beta: 0.0,
        }
    }
}

/// What a waiter does when a fill takes longer than `wait_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum WaitTimeoutPolicy {
    /// Fetch from the origin on its own (uncached).
    Hedge,
    /// Answer 504.
    Fail,
}

/// Single-flight settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlightConfig {
    /// Whether concurrent misses for one key share one origin fill (the default).
    /// `false` makes every miss fetch on its own, as plain cache-aside does: only
    /// for measuring the baseline that collapsing is compared with.
    pub collapse: bool,
    /// Longest a waiter waits for the leader's response head.
    pub wait_timeout_ms: u64,
    /// What a waiter does then.
    pub on_wait_timeout: WaitTimeoutPolicy,
    /// Most origin fills (and hedges) in progress at once.
    pub max_fills: usize,
    /// Fill slots background (pre-warm) fills may never take.
    pub reserved_for_user: usize,
    /// Most distinct keys in flight at once; past it a request gets 503.
    pub max_flights: usize,
    /// User fills that may wait for a fill slot when all `max_fills` are busy; past it
    /// a request gets 503 with a `Retry-After` instead of queueing without bound.
    pub max_queued_fills: usize,
    /// Largest `Retry-After` (seconds) an overloaded node sends.
    pub retry_after_max_s: u32,
}

impl Default for FlightConfig {
    fn default() -> Self {
        FlightConfig {
            collapse: true,
            wait_timeout_ms: 3_000,
            on_wait_timeout: WaitTimeoutPolicy::Hedge,
            max_fills: 256,
            reserved_for_user: 64,
            max_flights: 100_000,
            max_queued_fills: 1024,
            retry_after_max_s: 30,
        }
    }
}

/// The prefetch (pre-warm) class of origin fills. It uses only spare capacity: at
/// most a limit that adapts to origin latency (additive increase while fills are as
/// fast as usual, multiplicative decrease when they slow down or fail), never the
/// `flight.reserved_for_user` slots, and never while a user fill waits for a slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefetchConfig {
    /// Upper bound of the adaptive prefetch limit (and its starting value); capped at
    /// `flight.max_fills - flight.reserved_for_user`.
    pub max_fills: usize,
    /// Lower bound of the adaptive prefetch limit.
    pub min_fills: usize,
    /// Prefetches that may wait for a prefetch slot; more are shed at once.
    pub max_queued: usize,
    /// Longest a prefetch waits for a slot before it is shed.
    pub queue_timeout_ms: u64,
    /// The limit shrinks when recent fill latency exceeds this multiple of the
    /// long-run latency.
    pub latency_tolerance: f64,
    /// The limit also shrinks while recent fill latency is above this, if set.
    pub latency_target_ms: Option<u64>,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            max_fills: 32,
            min_fills: 1,
            max_queued: 1024,
            queue_timeout_ms: 10_000,
            latency_tolerance: 2.0,
            latency_target_ms: None,
        }
    }
}

/// Where a new pre-warm consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetReset {
    /// From the oldest retained command (expired ones are dropped and counted).
    Earliest,
    /// Only commands produced after the group first joins.
    Latest,
}

impl OffsetReset {
    /// The librdkafka `auto.offset.reset` value.
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        }
    }
}

/// Kafka settings. Without `brokers` the node uses no Kafka at all: it serves, but
/// publishes no access events and reads no pre-warm commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `bootstrap.servers` (comma-separated `host:port`); `None` turns Kafka off.
    pub brokers: Option<String>,
    /// Topic the access events go to.
    pub events_topic: String,
    /// Topic the pre-warm commands come from.
    pub prewarm_topic: String,
    /// Consumer group of the pre-warm consumer; default `prefetcher-{node}`, so every
    /// node reads every command.
    pub group_id: Option<String>,
    /// Where a new consumer group starts reading the pre-warm topic.
    pub prewarm_offset_reset: OffsetReset,
    /// Access events buffered between the proxy and the publisher; past it events are
    /// dropped (and counted), never waited for.
    pub event_buffer: usize,
    /// librdkafka `queue.buffering.max.messages`: events queued inside the producer.
    pub queue_max_messages: usize,
    /// librdkafka `linger.ms`: how long the producer waits to fill a batch.
    pub linger_ms: u64,
    /// librdkafka `message.timeout.ms`: an event not delivered by then is dropped.
    pub message_timeout_ms: u64,
    /// Extra librdkafka properties for both clients (security settings and the like);
    /// they override the event producer's own settings (lz4, `acks=1`, the fields above).
    pub properties: std::collections::BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: None,
            events_topic: models::EVENTS_TOPIC.into(),
            prewarm_topic: models::PREWARM_TOPIC.into(),
            group_id: None,
            prewarm_offset_reset: OffsetReset::Earliest,
            event_buffer: 16_384,
            queue_max_messages: 100_000,
            linger_ms: 20,
            message_timeout_ms: 10_000,
            properties: std::collections::BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// Whether Kafka is on.
    pub fn enabled(&self) -> bool {
        self.brokers.is_some()
    }
}

/// Origin client timeouts and pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    /// TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// Longest wait for the response head once connected.
    pub header_timeout_ms: u64,
    /// Longest gap between two body chunks.
    pub body_idle_timeout_ms: u64,
    /// Idle keep-alive connections kept per origin.
    pub pool_max_idle: usize,
    /// PEM file of the CAs that `https://` origins are verified against, instead of
    /// the system's roots (a private PKI); read when the node starts.
    pub ca_file: Option<PathBuf>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            connect_timeout_ms: 2_000,
            header_timeout_ms: 15_000,
            body_idle_timeout_ms: 15_000,
            pool_max_idle: 64,
            ca_file: None,
        }
    }
}

/// One tenant: the host names that select it and its origin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant id (used in flight keys and events, never as a metric label).
    pub id: TenantId,
    /// Host names (without port) that select this tenant; `"*"` makes it the fallback.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// `http://` or `https://host[:port][/prefix]`: the origin, or a regional
    /// prefetcher (shield). An `https://` origin is verified against the system's
    /// roots (or `origin.ca_file`) for the name in `host_header`, else the URL's host,
    /// which is also the SNI sent.
    pub origin: String,
    /// `Host` sent to the origin; defaults to the origin URL's authority. Set it when
    /// the origin is a shield that maps host names to tenants. For an `https://`
    /// origin its host name (without port) is the TLS server name.
    #[serde(default)]
    pub host_header: Option<String>,
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

    fn validate_kafka(&self) -> Result<()> {
        let k = &self.kafka;
        let Some(brokers) = &k.brokers else {
            return Ok(());
        };
        if brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must name at least one host:port"));
        }
        if self.region.is_none() {
            return Err(invalid(
                "region",
                "is required when kafka.brokers is set (events and pre-warm targeting)",
            ));
        }
        if self.node.is_none() {
            return Err(invalid(
                "node",
                "is required when kafka.brokers is set (events and the consumer group)",
            ));
        }
        for (name, topic) in [
            ("kafka.events_topic", &k.events_topic),
            ("kafka.prewarm_topic", &k.prewarm_topic),
        ] {
            if !models::is_topic_name(topic) {
                return Err(invalid(
                    name,
                    "must be 1-249 characters of A-Z a-z 0-9 . _ -",
                ));
            }
        }
        if k.group_id.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(invalid("kafka.group_id", "must not be empty"));
        }
        if k.event_buffer == 0 {
            return Err(invalid("kafka.event_buffer", "must be positive"));
        }
        if !(1..=10_000_000).contains(&k.queue_max_messages) {
            return Err(invalid(
                "kafka.queue_max_messages",
                "must be in [1, 10000000]",
            ));
        }
        if k.linger_ms > 900_000 {
            return Err(invalid("kafka.linger_ms", "must be at most 900000"));
        }
        if k.message_timeout_ms == 0 {
            return Err(invalid("kafka.message_timeout_ms", "must be positive"));
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

/// The TLS server name (SNI, and the name the certificate must carry) of an
/// `https://` origin at `authority`: the host of `host_header` when set, else the
/// authority's host; without port or IPv6 brackets.
pub(crate) fn tls_server_name(authority: &str, host_header: Option<&str>) -> String {
    let host = host_header.unwrap_or(authority);
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    name.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// The parts of an origin URL: `http://authority` (or `https://`) and a path prefix
/// without a trailing '/'.
pub(crate) fn parse_origin(origin: &str) -> std::result::Result<(String, String), String> {
    let uri: Uri = origin.parse().map_err(|e| format!("not a URL: {e}"))?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        Some(other) => {
            return Err(format!(
                "scheme {other:?} is not supported (use http or https)"
            ));
        }
        None => return Err("must start with http:// or https://".into()),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| "must name a host".to_string())?;
    if uri.query().is_some() {
        return Err("must not have a query".into());
    }
    let prefix = uri.path().trim_end_matches('/').to_string();
    Ok((format!("{scheme}://{authority}"), prefix))
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
