//! The client side: the TLS listener (`[tls]`), request size limits (`[limits]`),
//! connection timeouts and limits (`[server]`) and HTTP/2 bounds (`[http2]`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Result, invalid};

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
    /// Longest a response may wait on a client that takes none of its bytes, HTTP/1
    /// and HTTP/2 alike: the socket's send buffer full with nothing written since
    /// (`send_timeout`), or an HTTP/2 response body ready while the client polls no
    /// body of its connection, its flow-control window never opened (counted in
    /// `prefetcher_h2_connection_errors_total{reason="send_stall"}`); then the
    /// connection is closed. (It replaces `http2.send_stall_timeout_ms`.)
    pub send_timeout_ms: u64,
    /// Longest gap between two reads of a request body the node forwards to the
    /// origin (a pass-through upload): past it the client gets 408 (or, if the origin
    /// answered already, a closed connection) and the origin request is aborted
    /// (`body_timeout`).
    pub body_timeout_ms: u64,
    /// Longest a forwarded request body may take as a whole, from its request head to
    /// its last byte, however steadily it trickles in: past it the client gets 408 and
    /// the origin request is aborted (`body_deadline`).
    pub body_deadline_ms: u64,
    /// Most forwarded request bodies (pass-through uploads) in flight at once, each
    /// holding an origin connection: past it 503 with `Retry-After` (`max_uploads`).
    pub max_uploads: usize,
    /// Most uploads in flight from one client address (an IPv6 client: its /64):
    /// past it 429 with `Retry-After` (`address_uploads`); `exempt` addresses are
    /// free of it. 0 turns it off.
    pub max_uploads_per_address: usize,
    /// Addresses or networks of proxies in front of the node (a load balancer, the
    /// edges of a shield) whose forwarding fields are believed: their
    /// `X-Forwarded-For` and `Forwarded` are appended to, their `X-Real-IP` and
    /// `True-Client-IP` kept, and their `X-Forwarded-Proto: https` makes the request
    /// an `https` one (cache key and origin). From any other client these fields are
    /// replaced by what the node saw.
    pub trusted_proxies: Vec<String>,
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
    /// Most origin fills one connection may lead at once (requests of it that missed
    /// and started a fill, until their response head): past it 429 with `Retry-After`
    /// (`connection_fills`). Joining a fill in flight and hits are not counted.
    pub max_fills_per_connection: usize,
    /// Most origin fills the connections of one client address (an IPv6 client: its
    /// /64) may lead at once: past it 429 (`address_fills`). 0 turns it off; exempt
    /// addresses are not counted.
    pub max_fills_per_address: usize,
    /// Fills a connection may lead and then cancel (the request gone before its
    /// response head: an HTTP/2 stream reset, a closed connection) while its cancelled
    /// fills outnumber its answered ones; past it the connection leads no more fills
    /// (429) and is closed gracefully (HTTP/2 `GOAWAY`; `cancelled_fills`).
    pub max_cancelled_fills_per_connection: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 30_000,
            body_timeout_ms: 10_000,
            body_deadline_ms: 120_000,
            max_uploads: 512,
            max_uploads_per_address: 16,
            trusted_proxies: Vec::new(),
            max_connections: 16_384,
            max_connections_per_address: 1_024,
            requests_per_second_per_address: 0.0,
            request_burst_per_address: 200,
            max_tracked_addresses: 65_536,
            exempt: Vec::new(),
            listen_backlog: 4096,
            max_headers: 100,
            max_fills_per_connection: 128,
            max_fills_per_address: 1_024,
            max_cancelled_fills_per_connection: 64,
        }
    }
}

impl Http2Config {
    pub(super) fn validate(&self) -> Result<()> {
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
            ("server.body_deadline_ms", self.body_deadline_ms),
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
        if !(1..=100_000).contains(&self.max_fills_per_connection) {
            return Err(invalid(
                "server.max_fills_per_connection",
                "must be in [1, 100000]",
            ));
        }
        if self.max_fills_per_address != 0
            && self.max_fills_per_address < self.max_fills_per_connection
        {
            return Err(invalid(
                "server.max_fills_per_address",
                "must be at least server.max_fills_per_connection (0 turns it off)",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_cancelled_fills_per_connection) {
            return Err(invalid(
                "server.max_cancelled_fills_per_connection",
                "must be in [1, 1000000]",
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
        for (i, network) in self.trusted_proxies.iter().enumerate() {
            IpNetwork::parse(network)
                .map_err(|r| invalid(format!("server.trusted_proxies[{i}]"), r))?;
        }
        if !(1..=1_000_000).contains(&self.max_uploads) {
            return Err(invalid("server.max_uploads", "must be in [1, 1000000]"));
        }
        if self.max_uploads_per_address > self.max_uploads {
            return Err(invalid(
                "server.max_uploads_per_address",
                "must be at most server.max_uploads (0 turns it off)",
            ));
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
