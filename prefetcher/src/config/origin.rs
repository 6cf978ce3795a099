//! The origin client (`[origin]`) and the tenants (`[[tenants]]`): host names to
//! tenants to origins, and how an origin URL and its TLS server name are read.

use std::collections::HashSet;
use std::path::PathBuf;

use http::Uri;
use models::TenantId;
use serde::{Deserialize, Serialize};

use super::{Result, RouteConfig, invalid};

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
    /// Request fields forwarded to every tenant's origin though the node would
    /// drop them: a rewrite field (`X-Forwarded-Host`, `X-Original-URL` …) named here
    /// reaches the origin, and with `fill_fields = "allowlist"` these are the only
    /// fields beside the standard ones a fill sends. Name only fields the origin
    /// varies on (`Vary`) or that cannot change its answer. Lower-case names; no
    /// underscore, hop-by-hop, framing or node-set field (checked at start).
    pub forward_headers: Vec<String>,
    /// Which of the client's fields a fill (stored for everyone) forwards.
    pub fill_fields: FillFields,
}

/// Which of the client's request fields a fill forwards (`origin.fill_fields`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FillFields {
    /// Every end-to-end field but those that rewrite the request or claim a client
    /// identity, as nginx, Varnish and Pingora forward: the origin sees what the
    /// client sent, and `Vary` on any such field selects by it.
    #[default]
    EndToEnd,
    /// The hardened mode (CloudFront's origin request policy): only the fields RFC
    /// 9110 defines for a `GET` and `forward_headers`, so a field the origin reflects
    /// without `Vary` cannot shape what others get.
    Allowlist,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            connect_timeout_ms: 2_000,
            header_timeout_ms: 15_000,
            body_idle_timeout_ms: 15_000,
            pool_max_idle: 64,
            ca_file: None,
            forward_headers: Vec::new(),
            fill_fields: FillFields::default(),
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
    /// The tenant's weight: its committed share of the node's fill slots and queue
    /// places is `weight` over the sum of every tenant's (1 each by default).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Most fill slots the tenant may hold, borrowing included; none: no peak below
    /// `flight.max_fills`.
    #[serde(default)]
    pub peak_fills: Option<usize>,
    /// Path prefix (and method) → priority class; unmatched paths are `static`.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Fill the successors its origin's responses name (`Link: rel=prefetch`),
    /// within these bounds; none: hints are ignored.
    #[serde(default)]
    pub origin_hints: Option<super::OriginHintsConfig>,
}

fn default_weight() -> f64 {
    1.0
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

/// Fields `origin.forward_headers` may not name, and why: the node sets them itself,
/// they frame or route the message, or they are hop-by-hop.
pub(crate) const NOT_FORWARDABLE: [(&str, &str); 15] = [
    (
        "host",
        "the tenant's `Host` is sent (`tenants[].host_header`)",
    ),
    ("content-length", "the node frames the body it sends"),
    (
        "transfer-encoding",
        "hop-by-hop; the node frames the body it sends",
    ),
    ("connection", "hop-by-hop"),
    ("keep-alive", "hop-by-hop"),
    ("proxy-connection", "hop-by-hop"),
    ("te", "hop-by-hop"),
    ("trailer", "hop-by-hop"),
    ("upgrade", "hop-by-hop"),
    ("proxy-authorization", "hop-by-hop"),
    ("via", "the node appends its hop"),
    (
        "x-forwarded-for",
        "set by the node (`server.trusted_proxies`)",
    ),
    (
        "x-forwarded-proto",
        "set by the node (`server.trusted_proxies`)",
    ),
    ("x-real-ip", "set by the node (`server.trusted_proxies`)"),
    (
        "true-client-ip",
        "set by the node (`server.trusted_proxies`)",
    ),
];

/// Checks `origin.forward_headers`: each a lower-case field name the node may forward.
pub(crate) fn check_forward_headers(names: &[String]) -> Result<()> {
    for (i, name) in names.iter().enumerate() {
        let field = || format!("origin.forward_headers[{i}]");
        if name.contains('_') {
            return Err(invalid(
                field(),
                format!(
                    "{name:?} has an underscore: such names are never forwarded (CGI, WSGI \
                     and PHP read `_` as `-`, so they could spoof another field)"
                ),
            ));
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || name.bytes().any(|b| b.is_ascii_uppercase())
        {
            return Err(invalid(
                field(),
                format!("{name:?} is not a lower-case header field name"),
            ));
        }
        if name == "forwarded" {
            return Err(invalid(
                field(),
                "`forwarded` is set by the node (`server.trusted_proxies`)",
            ));
        }
        if let Some((_, why)) = NOT_FORWARDABLE.iter().find(|(n, _)| n == name) {
            return Err(invalid(field(), format!("{name:?} cannot be named: {why}")));
        }
    }
    Ok(())
}
