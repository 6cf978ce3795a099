//! What the node tells an origin about a request: which of the client's fields it
//! forwards ([`ForwardFields`]), which client hops it vouches for and by which scheme
//! the request came ([`TrustedProxies`], [`Peer`]).
//!
//! - **Every request** keeps the client's end-to-end fields but the rewrite fields
//!   ([`UNKEYED_REWRITES`], unless named in `origin.forward_headers`), the client-IP
//!   fields ([`CLIENT_HOPS`]) and names with an underscore: those re-route a request
//!   at the origin or spoof who sent it, which matters for a request nobody else
//!   sees too.
//! - **Fills** (a response stored for everyone) also leave out what the node sends
//!   on its own account ([`NOT_ON_FILLS`]: validators, `Range`, body fields,
//!   credentials). With `origin.fill_fields = "allowlist"` (the hardened mode) a
//!   fill forwards only [`FILL_FIELDS`] and the named fields.
//! - **Hops**: `X-Forwarded-For`, `X-Real-IP` and `True-Client-IP` name the peer the
//!   node saw, and a client's `Forwarded` is dropped, unless the peer is one of
//!   `server.trusted_proxies`: then its `X-Forwarded-For` and `Forwarded` are appended
//!   to, its `X-Real-IP`/`True-Client-IP` kept, and its `X-Forwarded-Proto: https`
//!   believed. `X-Forwarded-Proto` is always the request's [`Scheme`], the one in its
//!   cache key.
//! - **Variants** of a fill's response are selected by what the fill sent
//!   ([`ForwardFields::variant`]): the client's own value for every field it
//!   forwards (by default every end-to-end one, RFC 9111 §4.1), the node's for one it
//!   sets, absent for one it drops. So a value the origin never saw cannot name the
//!   variant its answer is stored under.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Version, header};

use crate::config::{FillFields, IpNetwork};
use crate::flight::Scheme;
use crate::semantics::{HOP_BY_HOP, UNKEYED_REWRITES, add_via, connection_listed, variant_of};

/// The request fields a fill forwards as the client sent them (beside the operator's
/// `origin.forward_headers`): content negotiation (RFC 9110 §12.5), request context
/// (§10.1: `From`, `Referer`, `User-Agent`; `Max-Forwards`, `Date`), `Origin` (RFC
/// 6454, what CORS answers vary on) and the client's cache directives (RFC 9111
/// §5.2.1, `Pragma`). Validators, `Range` and body fields are the node's own on a
/// fill; `Via` is appended to.
pub const FILL_FIELDS: [HeaderName; 12] = [
    header::ACCEPT,
    header::ACCEPT_CHARSET,
    header::ACCEPT_ENCODING,
    header::ACCEPT_LANGUAGE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::DATE,
    header::FROM,
    header::MAX_FORWARDS,
    header::ORIGIN,
    header::REFERER,
    header::USER_AGENT,
];

/// Fields a fill never takes from its client: the node validates with its stored
/// validators and fetches the whole object (the client's conditionals and `Range`
/// are answered by the node), a fill has no body, and a request with credentials
/// never fills (it passes through).
pub const NOT_ON_FILLS: [HeaderName; 10] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
    header::CONTENT_LENGTH,
    header::EXPECT,
    header::AUTHORIZATION,
    header::COOKIE,
];

/// Fields that name the client's address: never forwarded as a client sent them. The
/// first four are set by the node ([module docs](self)); the rest are dropped.
pub const CLIENT_HOPS: [&str; 15] = [
    "x-forwarded-for",
    "x-real-ip",
    "true-client-ip",
    "forwarded",
    "x-client-ip",
    "x-cluster-client-ip",
    "client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-originating-ip",
    "x-remote-ip",
    "x-remote-addr",
    "x-proxyuser-ip",
    "x-original-forwarded-for",
    "forwarded-for",
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const TRUE_CLIENT_IP: HeaderName = HeaderName::from_static("true-client-ip");

/// The client's connection as the listener saw it: its address becomes the hop this
/// node names in `X-Forwarded-For`, and whether it came over TLS sets the scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr {
    /// The client's socket address.
    pub addr: SocketAddr,
    /// The connection came through the TLS listener.
    pub tls: bool,
}

/// The peer of one request as the node judges it: its address (unknown for a request
/// handed in without one), whether it is a trusted proxy, and the request's scheme.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    addr: Option<SocketAddr>,
    trusted: bool,
    scheme: Scheme,
}

impl Peer {
    /// The scheme the request came by (the one in its cache key).
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The peer's address, if known.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }
}

/// `server.trusted_proxies`: the peers whose forwarding fields are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Box<[IpNetwork]>);

impl TrustedProxies {
    /// The validated `server.trusted_proxies` (an entry that does not parse is left
    /// out; `validate()` refuses it).
    pub fn new(networks: &[String]) -> TrustedProxies {
        TrustedProxies(
            networks
                .iter()
                .filter_map(|n| IpNetwork::parse(n).ok())
                .collect(),
        )
    }

    /// How the node judges the request from `client` with `headers`: no allocation,
    /// and no look at the fields unless the peer is trusted.
    pub fn peer(&self, client: Option<ClientAddr>, headers: &HeaderMap) -> Peer {
        let Some(client) = client else {
            return Peer::default();
        };
        let trusted = self.0.iter().any(|n| n.contains(client.addr.ip()));
        let https = client.tls
            || (trusted
                && headers
                    .get(X_FORWARDED_PROTO)
                    .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"https")));
        Peer {
            addr: Some(client.addr),
            trusted,
            scheme: if https { Scheme::Https } else { Scheme::Http },
        }
    }
}

/// Which request fields go to the origin ([module docs](self)): every end-to-end
/// field but the rewrite and client-IP fields and underscore names (those the
/// operator names go), less [`NOT_ON_FILLS`] on a fill; in the allowlist mode a fill
/// sends [`FILL_FIELDS`] and the named fields only.
#[derive(Debug, Clone, Default)]
pub struct ForwardFields {
    named: Box<[HeaderName]>,
    fill: FillFields,
}

impl ForwardFields {
    /// The validated `origin.forward_headers` (a name that does not parse is left
    /// out; `validate()` refuses it), with fills forwarding as `fill` says.
    pub fn new(names: &[String], fill: FillFields) -> ForwardFields {
        ForwardFields {
            named: names
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
            fill,
        }
    }

    fn named(&self, name: &HeaderName) -> bool {
        self.named.contains(name)
    }

    /// Whether a fill forwards the client's `name` as it came.
    fn fill_keeps(&self, name: &HeaderName) -> bool {
        if NOT_ON_FILLS.contains(name) {
            return false;
        }
        match self.fill {
            // The standard fields first: the usual `Vary` is decided in one short scan.
            FillFields::EndToEnd => FILL_FIELDS.contains(name) || self.pass_through_keeps(name),
            FillFields::Allowlist => FILL_FIELDS.contains(name) || self.named(name),
        }
    }

    /// Whether a pass-through request forwards the client's `name` as it came.
    fn pass_through_keeps(&self, name: &HeaderName) -> bool {
        if self.named(name) {
            return true;
        }
        let n = name.as_str();
        !(HOP_BY_HOP.contains(name)
            || name == header::HOST
            || name == header::VIA
            || n.contains('_')
            || UNKEYED_REWRITES.contains(&n)
            || CLIENT_HOPS.contains(&n))
    }

    /// The headers of a fill for a client request with `client` headers: the fields
    /// a fill keeps ([module docs](self)) less any the client's
    /// `Connection` names, then `Via` and the hops ([module docs](self)). `Host` is
    /// set per tenant when sent.
    pub fn fill_headers(&self, client: &HeaderMap, version: Version, peer: &Peer) -> HeaderMap {
        self.forwarded(client, version, peer, |name| self.fill_keeps(name))
    }

    /// The headers of a pass-through request with `client` headers (its body fields
    /// included), then `Via` and the hops. `Host` is set per tenant when sent.
    pub fn pass_through_headers(
        &self,
        client: &HeaderMap,
        version: Version,
        peer: &Peer,
    ) -> HeaderMap {
        self.forwarded(client, version, peer, |name| self.pass_through_keeps(name))
    }

    fn forwarded(
        &self,
        client: &HeaderMap,
        version: Version,
        peer: &Peer,
        keeps: impl Fn(&HeaderName) -> bool,
    ) -> HeaderMap {
        let listed = if client.contains_key(header::CONNECTION) {
            connection_listed(client)
        } else {
            Vec::new()
        };
        let mut headers = HeaderMap::with_capacity(client.len() + 4);
        for (name, value) in client {
            if keeps(name) && !listed.contains(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        for via in client.get_all(header::VIA) {
            headers.append(header::VIA, via.clone());
        }
        add_via(&mut headers, version);
        add_hops(&mut headers, client, peer);
        headers
    }

    /// The secondary key of a request with `client` headers for a response that
    /// varies on `names`, from what the request's fill sends (`fill_headers`): a
    /// field the fill drops selects as absent, one it rewrites by the value sent.
    /// When every name is one the fill forwards as it came (the usual `Vary`), the
    /// client's headers are read directly, without building the fill's.
    pub fn variant(
        &self,
        names: &[HeaderName],
        client: &HeaderMap,
        version: Version,
        peer: &Peer,
    ) -> Arc<str> {
        if !client.contains_key(header::CONNECTION) && names.iter().all(|n| self.fill_keeps(n)) {
            variant_of(names, client)
        } else {
            variant_of(names, &self.fill_headers(client, version, peer))
        }
    }
}

/// Adds the client hops and `X-Forwarded-Proto` for `peer` to `headers`.
fn add_hops(headers: &mut HeaderMap, client: &HeaderMap, peer: &Peer) {
    if let Some(addr) = peer.addr {
        let ip = addr.ip();
        if peer.trusted {
            let mut chain = String::new();
            for value in client.get_all(X_FORWARDED_FOR) {
                if let Ok(v) = value.to_str() {
                    chain.push_str(v.trim());
                    chain.push_str(", ");
                }
            }
            chain.push_str(&ip.to_string());
            if let Ok(value) = HeaderValue::from_str(&chain) {
                headers.insert(X_FORWARDED_FOR.clone(), value);
            }
            if client.contains_key(header::FORWARDED) {
                for value in client.get_all(header::FORWARDED) {
                    headers.append(header::FORWARDED, value.clone());
                }
                let node = match ip {
                    std::net::IpAddr::V4(v4) => format!("for={v4}"),
                    std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
                };
                let element = format!("{node};proto={}", peer.scheme.as_str());
                if let Ok(value) = HeaderValue::from_str(&element) {
                    headers.append(header::FORWARDED, value);
                }
            }
            for name in [X_REAL_IP, TRUE_CLIENT_IP] {
                for value in client.get_all(&name) {
                    headers.append(name.clone(), value.clone());
                }
            }
        } else if let Ok(value) = HeaderValue::from_str(&ip.to_string()) {
            headers.insert(X_FORWARDED_FOR, value.clone());
            headers.insert(X_REAL_IP, value.clone());
            headers.insert(TRUE_CLIENT_IP, value);
        }
    }
    headers.insert(
        X_FORWARDED_PROTO,
        HeaderValue::from_static(peer.scheme.as_str()),
    );
}

/// The headers of a pre-warm fill: a plain `GET` as a client without preferences
/// sends it over `scheme`, so it fills the variant such a request selects.
pub fn prewarm_headers(scheme: Scheme) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("edge-pulse-prefetcher"),
    );
    add_via(&mut headers, http::Version::HTTP_11);
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme.as_str()));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn peer(trusted: &[&str], ip: &str, tls: bool, client: &HeaderMap) -> Peer {
        let trusted: Vec<String> = trusted.iter().map(|s| s.to_string()).collect();
        TrustedProxies::new(&trusted).peer(
            Some(ClientAddr {
                addr: SocketAddr::new(ip.parse().unwrap(), 40000),
                tls,
            }),
            client,
        )
    }

    #[test]
    fn a_fill_forwards_every_end_to_end_field_but_rewrites_hops_and_its_own() {
        let client = headers(&[
            ("accept-encoding", "gzip"),
            ("x-api-version", "2"),
            ("x-device", "phone"),
            ("x_forwarded_host", "evil.example"),
            ("x-original-uri", "/admin"),
            ("x-client-ip", "10.6.6.6"),
            ("if-none-match", "\"v1\""),
            ("range", "bytes=0-1"),
            ("connection", "x-device"),
        ]);
        let p = peer(&[], "203.0.113.7", false, &client);
        let sent = ForwardFields::default().fill_headers(&client, Version::HTTP_11, &p);
        let names: Vec<&str> = sent.keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "accept-encoding",
                "x-api-version",
                "via",
                "x-forwarded-for",
                "x-real-ip",
                "true-client-ip",
                "x-forwarded-proto"
            ]
        );
    }

    #[test]
    fn a_fill_forwards_the_standard_fields_and_the_named_ones_only() {
        let client = headers(&[
            ("accept-encoding", "gzip"),
            ("user-agent", "ua"),
            ("x-api-version", "2"),
            ("x_forwarded_host", "evil.example"),
            ("x-original-uri", "/admin"),
            ("if-none-match", "\"v1\""),
            ("cookie", "a=1"),
            ("connection", "user-agent"),
        ]);
        let p = peer(&[], "203.0.113.7", false, &client);
        let fields = ForwardFields::new(&["x-api-version".into()], FillFields::Allowlist);
        let sent = fields.fill_headers(&client, Version::HTTP_11, &p);
        let names: Vec<&str> = sent.keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "accept-encoding",
                "x-api-version",
                "via",
                "x-forwarded-for",
                "x-real-ip",
                "true-client-ip",
                "x-forwarded-proto"
            ]
        );
        let plain = ForwardFields::new(&[], FillFields::Allowlist);
        let plain = plain.fill_headers(&client, Version::HTTP_11, &p);
        assert!(plain.get("x-api-version").is_none());
    }

    #[test]
    fn pass_through_drops_rewrites_hops_and_underscores_unless_named() {
        let client = headers(&[
            ("cookie", "a=1"),
            ("content-type", "text/plain"),
            ("x-csrf-token", "t"),
            ("x_forwarded_host", "evil.example"),
            ("x-forwarded-host", "evil.example"),
            ("x-original-url", "/admin"),
            ("x-real-ip", "10.9.9.9"),
            ("cf-connecting-ip", "10.9.9.9"),
            ("forwarded", "for=10.9.9.9"),
            ("x-forwarded-for", "10.9.9.9"),
        ]);
        let p = peer(&[], "203.0.113.7", false, &client);
        let sent = ForwardFields::default().pass_through_headers(&client, Version::HTTP_11, &p);
        for kept in ["cookie", "content-type", "x-csrf-token"] {
            assert!(sent.contains_key(kept), "{kept}");
        }
        for dropped in [
            "x_forwarded_host",
            "x-forwarded-host",
            "x-original-url",
            "cf-connecting-ip",
            "forwarded",
        ] {
            assert!(!sent.contains_key(dropped), "{dropped}");
        }
        for hop in ["x-forwarded-for", "x-real-ip", "true-client-ip"] {
            assert_eq!(sent.get(hop).unwrap(), "203.0.113.7", "{hop}");
        }
        let named = ForwardFields::new(&["x-forwarded-host".into()], FillFields::EndToEnd);
        let sent = named.pass_through_headers(&client, Version::HTTP_11, &p);
        assert_eq!(sent.get("x-forwarded-host").unwrap(), "evil.example");
    }

    #[test]
    fn a_trusted_proxy_is_believed_and_appended_to() {
        let client = headers(&[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-proto", "https"),
            ("x-real-ip", "198.51.100.1"),
            ("forwarded", "for=198.51.100.1;proto=https"),
        ]);
        let p = peer(&["10.0.0.0/8"], "10.1.2.3", false, &client);
        assert_eq!(p.scheme(), Scheme::Https);
        let sent = ForwardFields::default().fill_headers(&client, Version::HTTP_11, &p);
        assert_eq!(
            sent.get("x-forwarded-for").unwrap(),
            "198.51.100.1, 10.1.2.3"
        );
        assert_eq!(sent.get("x-real-ip").unwrap(), "198.51.100.1");
        assert!(sent.get("true-client-ip").is_none());
        assert_eq!(sent.get("x-forwarded-proto").unwrap(), "https");
        let forwarded: Vec<_> = sent.get_all("forwarded").iter().collect();
        assert_eq!(
            forwarded,
            ["for=198.51.100.1;proto=https", "for=10.1.2.3;proto=https"]
        );
        // The same fields from anyone else: replaced, and the scheme is the listener's.
        let p = peer(&["10.0.0.0/8"], "203.0.113.7", false, &client);
        assert_eq!(p.scheme(), Scheme::Http);
        let sent = ForwardFields::default().fill_headers(&client, Version::HTTP_11, &p);
        assert_eq!(sent.get("x-forwarded-for").unwrap(), "203.0.113.7");
        assert_eq!(sent.get("x-forwarded-proto").unwrap(), "http");
        assert!(sent.get("forwarded").is_none());
        // Unknown peer: no hop is vouched for.
        let sent =
            ForwardFields::default().fill_headers(&client, Version::HTTP_11, &Peer::default());
        assert!(sent.get("x-forwarded-for").is_none() && sent.get("x-real-ip").is_none());
    }

    #[test]
    fn the_variant_is_the_one_of_what_the_fill_sends() {
        for mode in [FillFields::EndToEnd, FillFields::Allowlist] {
            variants_follow_what_is_sent(ForwardFields::new(&["x-device".into()], mode));
        }
    }

    fn variants_follow_what_is_sent(fields: ForwardFields) {
        let cases: [&[(&str, &str)]; 5] = [
            &[
                ("accept-encoding", "br, gzip"),
                ("x-forwarded-proto", "https"),
            ],
            &[("x-device", "phone"), ("x-theme", "dark")],
            &[
                ("connection", "accept-encoding"),
                ("accept-encoding", "gzip"),
            ],
            &[("x-forwarded-for", "1.2.3.4"), ("via", "1.1 other")],
            &[("x-original-url", "/admin"), ("if-none-match", "\"a\"")],
        ];
        let names: Vec<HeaderName> = [
            "accept-encoding",
            "x-forwarded-proto",
            "x-forwarded-for",
            "x-device",
            "x-theme",
            "via",
            "host",
            "x-original-url",
            "if-none-match",
        ]
        .iter()
        .map(|n| HeaderName::from_static(n))
        .collect();
        for pairs in cases {
            let client = headers(pairs);
            for tls in [false, true] {
                let p = peer(&[], "203.0.113.7", tls, &client);
                let sent = fields.fill_headers(&client, Version::HTTP_2, &p);
                for n in 1..=names.len() {
                    for window in names.windows(n) {
                        assert_eq!(
                            fields.variant(window, &client, Version::HTTP_2, &p),
                            variant_of(window, &sent),
                            "{pairs:?} {window:?}"
                        );
                    }
                }
            }
        }
    }
}
