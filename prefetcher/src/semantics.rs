//! HTTP caching semantics that do not depend on the node's state: response and request
//! directives (RFC 9111 §5.2, the targeted fields of RFC 9213), `Age` (§5.1), `Vary`
//! and secondary keys (§4.1), hop-by-hop headers (RFC 9110 §7.6.1), conditional
//! requests answered from a stored response (RFC 9110 §13.2) and the `304` merge
//! (RFC 9111 §3.2, §4.3.4).

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The cache-control field targeted at this cache alone (RFC 9213 §2): when present it
/// replaces `CDN-Cache-Control`, which replaces `Cache-Control` and `Expires`.
pub const EDGE_PULSE_CACHE_CONTROL: &str = "edge-pulse-cache-control";
/// The field targeted at every CDN cache (RFC 9213).
pub const CDN_CACHE_CONTROL: &str = "cdn-cache-control";

/// The largest `Age` (RFC 9111 §1.2.2: delta-seconds past 2^31 are sent as 2^31).
pub const MAX_AGE_SECS: u64 = 1 << 31;

/// Response directives as this cache reads them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResponseDirectives {
    /// `public`.
    pub public: bool,
    /// `private` (with or without field names: the whole response is private).
    pub private: bool,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (with or without field names: always revalidate).
    pub no_cache: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `proxy-revalidate`.
    pub proxy_revalidate: bool,
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
    /// `stale-while-revalidate` (RFC 5861).
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error` (RFC 5861).
    pub stale_if_error: Option<u64>,
    /// The directives came from a targeted field (RFC 9213): `Expires` is ignored.
    pub targeted: bool,
}

impl ResponseDirectives {
    /// Reads the most specific field present: `Edge-Pulse-Cache-Control`, then
    /// `CDN-Cache-Control`, then `Cache-Control` (every line of it).
    pub fn parse(headers: &HeaderMap) -> ResponseDirectives {
        for (name, targeted) in [
            (EDGE_PULSE_CACHE_CONTROL, true),
            (CDN_CACHE_CONTROL, true),
            (header::CACHE_CONTROL.as_str(), false),
        ] {
            if headers.contains_key(name) {
                let mut d = ResponseDirectives {
                    targeted,
                    ..ResponseDirectives::default()
                };
                for (directive, arg) in directives(headers, name) {
                    let secs = || arg.and_then(delta_seconds);
                    match directive {
                        Directive::Unreadable => d.no_store = true,
                        Directive::Named(n) => match n.as_str() {
                            "public" => d.public = true,
                            "private" => d.private = true,
                            "no-store" => d.no_store = true,
                            "no-cache" => d.no_cache = true,
                            "must-revalidate" => d.must_revalidate = true,
                            "proxy-revalidate" => d.proxy_revalidate = true,
                            // An invalid max-age means stale (RFC 9111 §4.2.1); of
                            // duplicates, the shortest lifetime holds (conservative).
                            "max-age" => shortest(&mut d.max_age, secs().or(Some(0))),
                            "s-maxage" => shortest(&mut d.s_maxage, secs().or(Some(0))),
                            "stale-while-revalidate" => {
                                shortest(&mut d.stale_while_revalidate, secs())
                            }
                            "stale-if-error" => shortest(&mut d.stale_if_error, secs()),
                            _ => {}
                        },
                    }
                }
                return d;
            }
        }
        ResponseDirectives::default()
    }

    /// Directives that forbid serving the response stale (RFC 9111 §4.2.4, §5.2.2.2,
    /// §5.2.2.8, §5.2.2.10): the config's grace and `stale-*` extensions do not apply.
    pub fn forbids_stale(&self) -> bool {
        self.must_revalidate || self.proxy_revalidate || self.s_maxage.is_some() || self.no_cache
    }
}

/// Request directives (RFC 9111 §5.2.1), with `Pragma: no-cache` read as `no-cache`
/// when there is no `Cache-Control` (§5.4).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestDirectives {
    /// `no-cache` (or `max-age=0`): a stored response must be validated first.
    pub no_cache: bool,
    /// `no-store`: nothing of this exchange is stored.
    pub no_store: bool,
    /// `only-if-cached`: answer from the cache or 504.
    pub only_if_cached: bool,
    /// `max-age`: the client accepts no response older than this.
    pub max_age: Option<u64>,
    /// `min-fresh`: the response must stay fresh this much longer.
    pub min_fresh: Option<u64>,
}

impl RequestDirectives {
    /// `None` when the request has neither `Cache-Control` nor `Pragma` (the hit path
    /// checks two map slots and allocates nothing).
    pub fn parse(headers: &HeaderMap) -> Option<RequestDirectives> {
        if headers.contains_key(header::CACHE_CONTROL) {
            let mut d = RequestDirectives::default();
            for (directive, arg) in directives(headers, header::CACHE_CONTROL.as_str()) {
                let Directive::Named(name) = directive else {
                    continue;
                };
                match name.as_str() {
                    "no-cache" => d.no_cache = true,
                    "no-store" => d.no_store = true,
                    "only-if-cached" => d.only_if_cached = true,
                    "max-age" => d.max_age = Some(arg.and_then(delta_seconds).unwrap_or(0)),
                    "min-fresh" => d.min_fresh = arg.and_then(delta_seconds),
                    _ => {}
                }
            }
            if d.max_age == Some(0) {
                d.no_cache = true;
            }
            return Some(d);
        }
        let pragma = headers.get(header::PRAGMA)?;
        let no_cache = pragma.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("no-cache"))
        });
        Some(RequestDirectives {
            no_cache,
            ..RequestDirectives::default()
        })
    }
}

enum Directive {
    Named(String),
    Unreadable,
}

/// Every directive of every line of `name`, lower-cased, with its argument unquoted.
fn directives<'a>(
    headers: &'a HeaderMap,
    name: &'a str,
) -> impl Iterator<Item = (Directive, Option<&'a str>)> + 'a {
    headers.get_all(name).iter().flat_map(|value| {
        let parts: Vec<(Directive, Option<&str>)> = match value.to_str() {
            // Unreadable directives: assume the strictest.
            Err(_) => vec![(Directive::Unreadable, None)],
            Ok(v) => v
                .split(',')
                .filter(|d| !d.trim().is_empty())
                .map(|d| match d.split_once('=') {
                    Some((n, a)) => (
                        Directive::Named(n.trim().to_ascii_lowercase()),
                        Some(a.trim().trim_matches('"')),
                    ),
                    None => (Directive::Named(d.trim().to_ascii_lowercase()), None),
                })
                .collect(),
        };
        parts
    })
}

/// A lifetime directive met again, read conservatively (RFC 9111 §4.2.1: a cache
/// treats duplicate, conflicting directives so): the shortest lifetime wins, never
/// the last line an origin appended.
fn shortest(current: &mut Option<u64>, next: Option<u64>) {
    *current = match (*current, next) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
}

/// delta-seconds (RFC 9111 §1.2.2): digits only, saturating at 2^31.
fn delta_seconds(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<u64>().unwrap_or(MAX_AGE_SECS).min(MAX_AGE_SECS))
}

/// The `Age` a response carries (RFC 9111 §5.1), 0 when absent or invalid. A
/// list-valued `Age` (`7200, 0`, or two lines) is read from its first member, as §5.1
/// asks, so a second member can never make an old response look new.
pub fn age_of(headers: &HeaderMap) -> u64 {
    headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| delta_seconds(v.split(',').next().unwrap_or("").trim()))
        .unwrap_or(0)
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and ours, never forwarded or stored (beside
/// every field named in `Connection`).
pub(crate) const HOP_BY_HOP: [HeaderName; 10] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("x-cache"),
];

/// The fields a message's `Connection` names: hop-by-hop for this hop.
pub(crate) fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and ours, never forwarded or stored: the
/// fixed list ([`HOP_BY_HOP`]), every field named in `Connection`, and `x-cache`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        for name in connection_listed(headers) {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Request headers that let a client rewrite what an origin believes the URL, host,
/// scheme or method is. They are not part of any cache key, so an origin that
/// reflects them would let one client shape what others get (cache poisoning), and
/// on any request they can re-route it at the origin (out of the tenant's prefix,
/// past the origin's own access rules): they are never sent upstream unless the
/// operator names them (`origin.forward_headers`). `X-Forwarded-For` and
/// `X-Forwarded-Proto` are set by this node.
pub const UNKEYED_REWRITES: [&str; 24] = [
    "x-forwarded-host",
    "x-forwarded-prefix",
    "x-forwarded-path",
    "x-forwarded-server",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-forwarded-protocol",
    "x-forwarded-ssl",
    "x-forwarded-uri",
    "x-forwarded-url",
    "x-original-url",
    "x-original-uri",
    "x-original-host",
    "x-original-method",
    "x-override-url",
    "x-rewrite-url",
    "x-http-host-override",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-host",
    "x-url-scheme",
    "front-end-https",
];

/// What `Vary` says about a response (every line, list-valued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vary {
    /// No `Vary`: one response for every request.
    None,
    /// `Vary: *`: never reusable (RFC 9111 §4.1).
    Any,
    /// The selecting header names, lower-cased, in the order given, without repeats.
    Fields(Arc<[HeaderName]>),
}

impl Vary {
    /// Reads every `Vary` line.
    pub fn parse(headers: &HeaderMap) -> Vary {
        let mut names: Vec<HeaderName> = Vec::new();
        for value in headers.get_all(header::VARY) {
            let Ok(value) = value.to_str() else {
                return Vary::Any;
            };
            for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                if token == "*" {
                    return Vary::Any;
                }
                match HeaderName::from_bytes(token.as_bytes()) {
                    Ok(name) if !names.contains(&name) => names.push(name),
                    Ok(_) => {}
                    Err(_) => return Vary::Any,
                }
            }
        }
        if names.is_empty() {
            Vary::None
        } else {
            Vary::Fields(names.into())
        }
    }
}

/// The secondary key of a request for a response that varies on `names` (RFC 9111
/// §4.1): each name with the request's normalised value, absent and empty kept apart.
/// `Accept-Encoding` is reduced to the set of codings it accepts, so the many ways
/// browsers spell the same preference share one variant.
pub fn variant_of(names: &[HeaderName], request: &HeaderMap) -> Arc<str> {
    let mut key = String::with_capacity(32);
    for name in names {
        key.push_str(name.as_str());
        let mut values = request.get_all(name).iter().peekable();
        if values.peek().is_none() {
            key.push_str("\u{1}\n");
            continue;
        }
        key.push(':');
        if name == header::ACCEPT_ENCODING {
            push_accept_encoding(&mut key, request);
        } else {
            let mut first = true;
            for value in values {
                for part in value.as_bytes().split(|b| *b == b',') {
                    if !first {
                        key.push(',');
                    }
                    first = false;
                    // Whitespace around list members carries no meaning (RFC 9110 §5.6.1).
                    key.push_str(&String::from_utf8_lossy(part.trim_ascii()));
                }
            }
        }
        key.push('\n');
    }
    key.into()
}

/// The codings `Accept-Encoding` accepts (q > 0), lower-cased, sorted, deduplicated.
pub fn normalise_accept_encoding(request: &HeaderMap) -> String {
    let mut out = String::new();
    push_accept_encoding(&mut out, request);
    out
}

/// [`normalise_accept_encoding`] appended to `out`, borrowing the codings from the
/// header values (one small list, no string per coding: this runs on `Vary` hits).
fn push_accept_encoding(out: &mut String, request: &HeaderMap) {
    let mut codings: Vec<&str> = request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|member| {
            let mut parts = member.split(';');
            let coding = parts.next()?.trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                (p.starts_with("q=") || p.starts_with("Q="))
                    && p[2..].trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
            });
            (!coding.is_empty() && !refused).then_some(coding)
        })
        .collect();
    fn lower(s: &str) -> impl Iterator<Item = u8> + '_ {
        s.bytes().map(|b| b.to_ascii_lowercase())
    }
    codings.sort_unstable_by(|a, b| lower(a).cmp(lower(b)));
    codings.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    for (i, coding) in codings.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.extend(coding.chars().map(|c| c.to_ascii_lowercase()));
    }
}

/// Whether a client's conditional `GET`/`HEAD` is answered `304` by a stored `200`
/// with `stored` headers (RFC 9110 §13.2.2: `If-None-Match` first, with weak
/// comparison; `If-Modified-Since` only without it).
pub fn not_modified(request: &HeaderMap, stored: &HeaderMap) -> bool {
    if request.contains_key(header::IF_NONE_MATCH) {
        let Some(etag) = stored.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            // `*` matches any current representation.
            return request
                .get_all(header::IF_NONE_MATCH)
                .iter()
                .any(|v| v.as_bytes().trim_ascii() == b"*");
        };
        let etag = weak_form(etag.trim());
        return request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .any(|tag| tag == "*" || weak_form(tag) == etag);
    }
    let Some(since) = request
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
    else {
        return false;
    };
    let modified = stored
        .get(header::LAST_MODIFIED)
        .or_else(|| stored.get(header::DATE))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    modified.is_some_and(|m| m <= since)
}

fn weak_form(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

/// Whether the request is conditional on a validator (the hit path checks two slots).
pub fn is_conditional(request: &HeaderMap) -> bool {
    request.contains_key(header::IF_NONE_MATCH) || request.contains_key(header::IF_MODIFIED_SINCE)
}

/// The headers of a `304` built from a stored response (RFC 9110 §15.4.5): the fields
/// a `200` would carry that a `304` must repeat; no content metadata.
pub fn not_modified_headers(stored: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(8);
    for name in [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ] {
        for value in stored.get_all(&name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// Fields a `304` must not change in the stored response (RFC 9111 §3.2: the
/// stored body's framing and content metadata stay those of the body we hold).
const KEPT_ON_UPDATE: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::TRANSFER_ENCODING,
];

/// The stored response's headers updated by a `304` (RFC 9111 §3.2, §4.3.4): every
/// field the `304` carries replaces the stored one of that name, except framing.
pub fn merge_not_modified(stored: &HeaderMap, update: &HeaderMap) -> HeaderMap {
    let mut merged = stored.clone();
    for name in update.keys() {
        if KEPT_ON_UPDATE.contains(name) {
            continue;
        }
        merged.remove(name);
        for value in update.get_all(name) {
            merged.append(name.clone(), value.clone());
        }
    }
    merged
}

/// Appends `Via` for this hop.
pub fn add_via(headers: &mut HeaderMap, version: http::Version) {
    let via = match version {
        http::Version::HTTP_10 => "1.0 edge-pulse",
        http::Version::HTTP_2 => "2 edge-pulse",
        _ => "1.1 edge-pulse",
    };
    headers.append(header::VIA, HeaderValue::from_static(via));
}

/// Whether a request came through another edge-pulse node (its `Via` names one): a
/// downstream edge filling from this node as its shield.
pub(crate) fn via_edge_pulse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VIA)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains(" edge-pulse")))
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

    #[test]
    fn targeted_fields_replace_cache_control() {
        let d = ResponseDirectives::parse(&headers(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=60"),
        ]));
        assert_eq!(d.max_age, Some(60));
        assert!(!d.no_store && d.targeted);
        let d = ResponseDirectives::parse(&headers(&[
            ("cdn-cache-control", "max-age=60"),
            ("edge-pulse-cache-control", "s-maxage=5"),
        ]));
        assert_eq!((d.max_age, d.s_maxage), (None, Some(5)));
        let d = ResponseDirectives::parse(&headers(&[
            ("cache-control", "max-age=1"),
            ("cache-control", "Must-Revalidate, stale-if-error=\"30\""),
        ]));
        assert!(d.must_revalidate && d.forbids_stale());
        assert_eq!(d.stale_if_error, Some(30));
    }

    #[test]
    fn a_list_valued_age_is_read_from_its_first_member() {
        assert_eq!(age_of(&headers(&[("age", "7200, 0")])), 7200);
        assert_eq!(age_of(&headers(&[("age", "30"), ("age", "0")])), 30);
        assert_eq!(age_of(&headers(&[("age", "-1")])), 0);
        assert_eq!(age_of(&headers(&[("age", "99999999999")])), MAX_AGE_SECS);
    }

    #[test]
    fn connection_listed_fields_are_hop_by_hop() {
        let mut h = headers(&[
            ("connection", "x-secret, Keep-Alive"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
    }

    #[test]
    fn variants_normalise_accept_encoding_and_keep_absent_apart() {
        let names: Arc<[HeaderName]> = vec![header::ACCEPT_ENCODING].into();
        let a = variant_of(&names, &headers(&[("accept-encoding", "gzip, br")]));
        let b = variant_of(&names, &headers(&[("accept-encoding", "BR;q=1.0,gzip")]));
        let c = variant_of(
            &names,
            &headers(&[
                ("accept-encoding", "br"),
                ("accept-encoding", "gzip, zstd;q=0"),
            ]),
        );
        assert_eq!(a, b);
        assert_eq!(a, c);
        let none = variant_of(&names, &HeaderMap::new());
        let empty = variant_of(&names, &headers(&[("accept-encoding", "")]));
        assert_ne!(none, empty);
        assert_eq!(
            Vary::parse(&headers(&[("vary", "Accept"), ("vary", "accept, Origin")])),
            Vary::Fields(vec![header::ACCEPT, header::ORIGIN].into())
        );
        assert_eq!(Vary::parse(&headers(&[("vary", "accept, *")])), Vary::Any);
    }

    #[test]
    fn conditionals_follow_the_precedence_of_rfc9110() {
        let stored = headers(&[
            ("etag", "\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert!(not_modified(
            &headers(&[("if-none-match", "W/\"v1\"")]),
            &stored
        ));
        assert!(not_modified(&headers(&[("if-none-match", "*")]), &stored));
        // If-None-Match decides alone when present.
        assert!(!not_modified(
            &headers(&[
                ("if-none-match", "\"v0\""),
                ("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")
            ]),
            &stored
        ));
        assert!(not_modified(
            &headers(&[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
        assert!(!not_modified(
            &headers(&[("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
    }
}
