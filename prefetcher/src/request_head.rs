//! Request heads that could be read two ways are refused, never interpreted: the
//! checks against request smuggling and ambiguous requests, run before the cache, a
//! flight or the origin sees the request.
//!
//! Two entries share one set of rules ([`check_fields`]):
//! - [`check_request_head`]: the raw bytes of an HTTP/1 head, parsed with `httparse`
//!   as hyper parses them. Run by the connection's head guard (`listener`) on
//!   the bytes as they arrive, because hyper hides some ambiguities once it has
//!   parsed a head: it drops a `Content-Length` sent beside `Transfer-Encoding`,
//!   merges equal duplicate `Content-Length`s and takes bare-LF line ends.
//! - [`check_request_parts`]: a parsed request (HTTP/2, or HTTP/1 when the guard
//!   could not follow the connection).
//!
//! # What is refused (every rule a [`RefusalReason`])
//! - `Content-Length` beside `Transfer-Encoding`; more than one `Content-Length`
//!   (equal values too); one that is not a plain decimal number.
//! - `Transfer-Encoding` other than one line `chunked` on HTTP/1.1 (`chunked,
//!   identity`, `gzip, chunked`, `chunked` twice, any on HTTP/1.0 or HTTP/2): the node
//!   removes the framing before forwarding, so any other coding would change the body.
//! - Bare-LF line ends; obs-fold, bare CR and control characters (`httparse` and the
//!   value check).
//! - No `Host` (HTTP/1.x; HTTP/2 may name its authority in `:authority` instead), more
//!   than one, one that is not `host[:port]`, and an absolute-form target or
//!   `:authority` naming another authority than `Host`: the tenant comes from the
//!   one authority the request names.
//! - Targets other than origin-form and `http(s)` absolute-form without user info;
//!   `CONNECT`.
//! - A body on `GET`, `HEAD` or `TRACE` (`Content-Length` above 0, or
//!   `Transfer-Encoding`): refused rather than forwarded without it, since a body
//!   dropped in silence changes what the client asked (a search without its query).
//!
//! An accepted head has exactly one authority and one framing ([`CheckedHead`]).
//!
//! A leaf: pure functions of the bytes and the parsed parts, naming no other module
//! of the crate, so both the listener (raw heads) and the proxy (parsed requests)
//! use it without depending on each other.

use std::mem::MaybeUninit;

use http::{HeaderMap, Method, Uri, Version};

/// Most fields an HTTP/1 head may have here: hyper's own default (past it hyper
/// answers 431 itself).
pub const MAX_HEAD_FIELDS: usize = 100;

/// Why a client request was refused with `400` before the cache, a flight or the
/// origin saw it (request smuggling and ambiguous heads): the `reason` label of
/// `prefetcher_requests_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Not an HTTP/1 head the parser accepts (obs-fold, a bare CR, a control
    /// character, a bad request line or field name).
    Malformed,
    /// A line ends in a bare LF instead of CRLF.
    BareLf,
    /// A field value holds a control character (NUL, CR, LF, DEL …).
    ControlChar,
    /// HTTP/1.1 without `Host`.
    MissingHost,
    /// More than one `Host`.
    DuplicateHost,
    /// A `Host` (or `:authority`) that is not `host[:port]`.
    InvalidHost,
    /// An absolute-form target (or `:authority`) naming another authority than `Host`.
    HostMismatch,
    /// A target that is neither origin-form nor an `http(s)` absolute-form without
    /// user info, or one whose path does not normalise to a cache key.
    BadTarget,
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthAndChunked,
    /// More than one `Content-Length` (equal values too).
    DuplicateLength,
    /// A `Content-Length` that is not one decimal number (a list, a sign, spaces).
    InvalidLength,
    /// A `Transfer-Encoding` other than one `chunked` on HTTP/1.1.
    TransferEncoding,
    /// `CONNECT`: the node is no tunnel.
    Connect,
    /// A `GET`, `HEAD` or `TRACE` that declares a body (`Content-Length` above 0, or
    /// `Transfer-Encoding`): such a body has no meaning (RFC 9110 §9.3.1, §9.3.8), and
    /// an origin that ignores it would read it as the next request on a pooled
    /// connection (a CL.0 desync).
    GetWithBody,
}

impl RefusalReason {
    /// Every reason, in declaration order (metrics pre-create one series each).
    pub const ALL: [RefusalReason; 14] = [
        RefusalReason::Malformed,
        RefusalReason::BareLf,
        RefusalReason::ControlChar,
        RefusalReason::MissingHost,
        RefusalReason::DuplicateHost,
        RefusalReason::InvalidHost,
        RefusalReason::HostMismatch,
        RefusalReason::BadTarget,
        RefusalReason::LengthAndChunked,
        RefusalReason::DuplicateLength,
        RefusalReason::InvalidLength,
        RefusalReason::TransferEncoding,
        RefusalReason::Connect,
        RefusalReason::GetWithBody,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Malformed => "malformed",
            RefusalReason::BareLf => "bare_lf",
            RefusalReason::ControlChar => "control_char",
            RefusalReason::MissingHost => "missing_host",
            RefusalReason::DuplicateHost => "duplicate_host",
            RefusalReason::InvalidHost => "invalid_host",
            RefusalReason::HostMismatch => "host_mismatch",
            RefusalReason::BadTarget => "bad_target",
            RefusalReason::LengthAndChunked => "length_and_chunked",
            RefusalReason::DuplicateLength => "duplicate_length",
            RefusalReason::InvalidLength => "invalid_length",
            RefusalReason::TransferEncoding => "transfer_encoding",
            RefusalReason::Connect => "connect",
            RefusalReason::GetWithBody => "get_with_body",
        }
    }

    /// The reason with this label.
    pub fn parse(label: &str) -> Option<RefusalReason> {
        RefusalReason::ALL.into_iter().find(|r| r.as_str() == label)
    }

    /// Position in [`RefusalReason::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n` (no field: 0).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// An HTTP/1 head that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedHead<'a> {
    /// Bytes of the head, up to and including its empty line.
    pub len: usize,
    /// The method.
    pub method: &'a str,
    /// The request target as sent.
    pub target: &'a str,
    /// The one authority the request names: its `Host` (an absolute-form target
    /// agrees with it), or an HTTP/1.0 absolute-form target's.
    pub host: &'a str,
    /// How its body is delimited.
    pub framing: Framing,
}

/// What [`check_request_head`] makes of the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadCheck<'a> {
    /// Not a whole head yet.
    Partial,
    /// More fields than [`MAX_HEAD_FIELDS`]: hyper refuses it itself.
    TooManyFields,
    /// A head that passed.
    Accepted(CheckedHead<'a>),
    /// A head to refuse with `400`.
    Refused(RefusalReason),
}

/// Checks the HTTP/1 request head at the start of `bytes` (parsed as hyper parses
/// it: `httparse` with its default, strict settings).
///
/// ```
/// use prefetcher::{Framing, HeadCheck, RefusalReason, check_request_head};
/// let head = b"POST /a HTTP/1.1\r\nHost: edge.example\r\nContent-Length: 3\r\n\r\nabc";
/// let HeadCheck::Accepted(checked) = check_request_head(head) else { panic!() };
/// assert_eq!((checked.host, checked.framing), ("edge.example", Framing::Length(3)));
/// let smuggled = b"POST /a HTTP/1.1\r\nHost: edge.example\r\nContent-Length: 3\r\n\
///                  Transfer-Encoding: chunked\r\n\r\n";
/// assert_eq!(
///     check_request_head(smuggled),
///     HeadCheck::Refused(RefusalReason::LengthAndChunked)
/// );
/// ```
pub fn check_request_head(bytes: &[u8]) -> HeadCheck<'_> {
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEAD_FIELDS];
    let mut request = httparse::Request::new(&mut []);
    let len = match request.parse_with_uninit_headers(bytes, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return HeadCheck::Partial,
        Err(httparse::Error::TooManyHeaders) => return HeadCheck::TooManyFields,
        Err(_) => return HeadCheck::Refused(RefusalReason::Malformed),
    };
    let head = &bytes[..len];
    if head
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
    {
        return HeadCheck::Refused(RefusalReason::BareLf);
    }
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return HeadCheck::Refused(RefusalReason::Malformed);
    };
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    if method == "CONNECT" {
        return HeadCheck::Refused(RefusalReason::Connect);
    }
    let target_authority = match target_form(target) {
        Ok(authority) => authority,
        Err(reason) => return HeadCheck::Refused(reason),
    };
    let https = target
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("https:"));
    let checked = check_fields(
        version,
        target_authority,
        https,
        request.headers.iter().map(|h| (h.name.as_bytes(), h.value)),
        false,
        matches!(method, "GET" | "HEAD" | "TRACE"),
    );
    match checked {
        Ok((host, framing)) => HeadCheck::Accepted(CheckedHead {
            len,
            method,
            target,
            // Every byte of a valid authority is ASCII.
            host: std::str::from_utf8(host).unwrap_or_default(),
            framing,
        }),
        Err(reason) => HeadCheck::Refused(reason),
    }
}

/// Checks a parsed request (HTTP/2, or HTTP/1 the head guard did not see) by the
/// rules of [`check_request_head`] that still apply to it.
pub(crate) fn check_request_parts(
    method: &Method,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
) -> Result<(), RefusalReason> {
    if method == Method::CONNECT {
        return Err(RefusalReason::Connect);
    }
    let authority = match uri.authority() {
        Some(authority) => {
            if !matches!(uri.scheme_str(), Some("http" | "https")) {
                return Err(RefusalReason::BadTarget);
            }
            Some(authority.as_str().as_bytes())
        }
        None if uri.path().starts_with('/') => None,
        None => return Err(RefusalReason::BadTarget),
    };
    let https = uri.scheme_str() == Some("https");
    let fields = headers
        .iter()
        .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()));
    let bodiless = matches!(*method, Method::GET | Method::HEAD | Method::TRACE);
    check_fields(version, authority, https, fields, true, bodiless).map(|_| ())
}

/// The authority of an absolute-form target (`None` for origin-form); anything else
/// is refused.
fn target_form(target: &str) -> Result<Option<&[u8]>, RefusalReason> {
    if target.starts_with('/') {
        return Ok(None);
    }
    let rest = ["http://", "https://"].iter().find_map(|scheme| {
        target
            .get(..scheme.len())
            .filter(|s| s.eq_ignore_ascii_case(scheme))
            .map(|_| &target[scheme.len()..])
    });
    let Some(rest) = rest else {
        return Err(RefusalReason::BadTarget);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(RefusalReason::BadTarget);
    }
    Ok(Some(authority.as_bytes()))
}

/// The rules on the fields of a head, shared by both entries: returns its one
/// authority and its framing. `check_values`: look for control characters in the
/// values (`httparse` already refuses them in an HTTP/1 head). `bodiless`: the
/// method's body has no meaning (`GET`, `HEAD`, `TRACE`), so one is refused.
fn check_fields<'a>(
    version: Version,
    target_authority: Option<&'a [u8]>,
    https: bool,
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    check_values: bool,
    bodiless: bool,
) -> Result<(&'a [u8], Framing), RefusalReason> {
    let mut host: Option<&[u8]> = None;
    let mut length: Option<&[u8]> = None;
    let mut chunked: Option<&[u8]> = None;
    for (name, value) in fields {
        if check_values && value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(RefusalReason::ControlChar);
        }
        // Only three names matter; their lengths tell most others apart at once.
        let (seen, duplicate) = match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => (&mut host, RefusalReason::DuplicateHost),
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                (&mut length, RefusalReason::DuplicateLength)
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                (&mut chunked, RefusalReason::TransferEncoding)
            }
            _ => continue,
        };
        if seen.replace(value).is_some() {
            return Err(duplicate);
        }
    }
    let framing = match (length, chunked) {
        (Some(_), Some(_)) => return Err(RefusalReason::LengthAndChunked),
        (None, Some(coding)) => {
            if version != Version::HTTP_11 || !coding.trim_ascii().eq_ignore_ascii_case(b"chunked")
            {
                return Err(RefusalReason::TransferEncoding);
            }
            Framing::Chunked
        }
        (Some(length), None) => Framing::Length(decimal(length)?),
        (None, None) => Framing::Length(0),
    };
    if bodiless && framing != Framing::Length(0) {
        return Err(RefusalReason::GetWithBody);
    }
    let host = match (host, target_authority) {
        (Some(host), authority) => {
            if !valid_authority(host) {
                return Err(RefusalReason::InvalidHost);
            }
            if let Some(authority) = authority
                && !same_authority(host, authority, https)
            {
                return Err(if valid_authority(authority) {
                    RefusalReason::HostMismatch
                } else {
                    RefusalReason::InvalidHost
                });
            }
            host
        }
        // HTTP/1.1 must send `Host` (RFC 9112 §3.2); HTTP/2 may name the authority
        // in `:authority` alone, and HTTP/1.0 in an absolute-form target.
        (None, Some(authority)) if version != Version::HTTP_11 => {
            if !valid_authority(authority) {
                return Err(RefusalReason::InvalidHost);
            }
            authority
        }
        (None, _) => return Err(RefusalReason::MissingHost),
    };
    Ok((host, framing))
}

/// A `Content-Length`: 1 to 19 digits, nothing else (no sign, list or space).
fn decimal(value: &[u8]) -> Result<u64, RefusalReason> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(RefusalReason::InvalidLength);
    }
    Ok(value
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// Splits `host[:port]` (the host may be an IP literal in brackets).
fn split_port(authority: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let (host, port) = if authority.first() == Some(&b'[') {
        let close = authority.iter().position(|&b| b == b']')?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            [] => (host, None),
            [b':', port @ ..] => (host, Some(port)),
            _ => return None,
        }
    } else {
        match authority.iter().rposition(|&b| b == b':') {
            Some(i) => (&authority[..i], Some(&authority[i + 1..])),
            None => (authority, None),
        }
    };
    Some((host, port))
}

/// `host[:port]` with a DNS-style name, an IPv4 address or an IP literal, and a port
/// of 1 to 5 digits up to 65535: nothing else routes to a tenant.
fn valid_authority(authority: &[u8]) -> bool {
    let Some((host, port)) = split_port(authority) else {
        return false;
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.iter().all(u8::is_ascii_digit)
            && p.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) <= 65535
    });
    let host_ok = match host {
        [b'[', literal @ .., b']'] => {
            !literal.is_empty()
                && literal
                    .iter()
                    .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        }
        _ => {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        }
    };
    port_ok && host_ok
}

/// Whether two authorities name the same host and port (case-insensitive, the
/// scheme's default port when none is given).
fn same_authority(a: &[u8], b: &[u8], https: bool) -> bool {
    let default: &[u8] = if https { b"443" } else { b"80" };
    match (split_port(a), split_port(b)) {
        (Some((host_a, port_a)), Some((host_b, port_b))) => {
            host_a.eq_ignore_ascii_case(host_b)
                && port_a.unwrap_or(default) == port_b.unwrap_or(default)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(head: &str) -> Option<RefusalReason> {
        match check_request_head(head.as_bytes()) {
            HeadCheck::Refused(reason) => Some(reason),
            HeadCheck::Accepted(_) => None,
            other => panic!("{head:?}: {other:?}"),
        }
    }

    #[test]
    fn a_plain_head_passes_with_its_one_host_and_framing() {
        let head = "GET /a?b=1 HTTP/1.1\r\nHost: Edge.Example:8080\r\n\r\nrest";
        let HeadCheck::Accepted(checked) = check_request_head(head.as_bytes()) else {
            panic!()
        };
        assert_eq!(checked.len, head.len() - 4);
        assert_eq!(checked.host, "Edge.Example:8080");
        assert_eq!(checked.framing, Framing::Length(0));
        assert_eq!(checked.target, "/a?b=1");
        let chunked = "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding:  Chunked \r\n\r\n";
        let HeadCheck::Accepted(checked) = check_request_head(chunked.as_bytes()) else {
            panic!()
        };
        assert_eq!(checked.framing, Framing::Chunked);
        assert_eq!(
            check_request_head(b"GET / HTTP/1.1\r\nHost: a\r\n"),
            HeadCheck::Partial
        );
    }

    #[test]
    fn framing_must_be_unambiguous() {
        use RefusalReason::*;
        let cases = [
            (
                "Content-Length: 3\r\nTransfer-Encoding: chunked",
                LengthAndChunked,
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 3",
                LengthAndChunked,
            ),
            ("Content-Length: 3\r\nContent-Length: 3", DuplicateLength),
            ("Content-Length: 3\r\nContent-Length: 4", DuplicateLength),
            ("Content-Length: 3, 3", InvalidLength),
            ("Content-Length: +3", InvalidLength),
            ("Content-Length: 99999999999999999999", InvalidLength),
            ("Transfer-Encoding: chunked, identity", TransferEncoding),
            ("Transfer-Encoding: xchunked", TransferEncoding),
            ("Transfer-Encoding: chunked, chunked", TransferEncoding),
            ("Transfer-Encoding: gzip, chunked", TransferEncoding),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
                TransferEncoding,
            ),
        ];
        for (fields, reason) in cases {
            let head = format!("POST / HTTP/1.1\r\nHost: a\r\n{fields}\r\n\r\n");
            assert_eq!(refused(&head), Some(reason), "{fields}");
        }
        let http10 = "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(refused(http10), Some(TransferEncoding));
    }

    #[test]
    fn line_ends_and_characters_must_be_strict() {
        use RefusalReason::*;
        assert_eq!(refused("GET / HTTP/1.1\nHost: a\n\n"), Some(BareLf));
        assert_eq!(refused("GET / HTTP/1.1\r\nHost: a\n\r\n"), Some(BareLf));
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"),
            Some(Malformed)
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n"),
            Some(Malformed)
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n"),
            Some(Malformed)
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
            Some(Malformed)
        );
    }

    #[test]
    fn the_request_names_exactly_one_valid_authority() {
        use RefusalReason::*;
        assert_eq!(refused("GET / HTTP/1.1\r\n\r\n"), Some(MissingHost));
        assert_eq!(refused("GET / HTTP/1.0\r\n\r\n"), Some(MissingHost));
        assert_eq!(refused("GET http://a/ HTTP/1.0\r\n\r\n"), None);
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"),
            Some(DuplicateHost)
        );
        for bad in [
            "", "a b", "a@b", "a/b", "a:x", "a:99999", "[zz]", "a:", "a%2eb",
        ] {
            let head = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(refused(&head), Some(InvalidHost), "{bad:?}");
        }
        for good in [
            "a",
            "A.example:8080",
            "[::1]:80",
            "10.0.0.1",
            "under_score.example",
        ] {
            let head = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
            assert_eq!(refused(&head), None, "{good:?}");
        }
        let absolute = |target: &str, host: &str| {
            refused(&format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n"))
        };
        assert_eq!(
            absolute("http://other.example/x", "edge.example"),
            Some(HostMismatch)
        );
        assert_eq!(absolute("http://EDGE.example:80/x", "edge.example"), None);
        assert_eq!(absolute("https://edge.example/x", "edge.example:443"), None);
        assert_eq!(
            absolute("http://edge.example:81/x", "edge.example"),
            Some(HostMismatch)
        );
        assert_eq!(
            absolute("http://u@edge.example/x", "edge.example"),
            Some(BadTarget)
        );
        assert_eq!(
            absolute("ftp://edge.example/x", "edge.example"),
            Some(BadTarget)
        );
        assert_eq!(absolute("*", "edge.example"), Some(BadTarget));
        assert_eq!(
            refused("CONNECT edge.example:443 HTTP/1.1\r\nHost: edge.example:443\r\n\r\n"),
            Some(Connect)
        );
    }

    #[test]
    fn parsed_requests_follow_the_same_rules() {
        let check = |uri: &str, version, headers: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(v).unwrap(),
                );
            }
            check_request_parts(&Method::GET, &uri.parse().unwrap(), version, &map)
        };
        use RefusalReason::*;
        let h2 = Version::HTTP_2;
        assert_eq!(check("http://a.example/x", h2, &[]), Ok(()));
        assert_eq!(
            check("http://a.example/x", h2, &[("host", "a.example")]),
            Ok(())
        );
        assert_eq!(
            check("http://a.example/x", h2, &[("host", "b.example")]),
            Err(HostMismatch)
        );
        assert_eq!(check("/x", h2, &[]), Err(MissingHost));
        assert_eq!(
            check(
                "http://a.example/x",
                h2,
                &[("transfer-encoding", "chunked")]
            ),
            Err(TransferEncoding)
        );
        assert_eq!(
            check(
                "http://a.example/x",
                h2,
                &[("content-length", "1"), ("content-length", "1")]
            ),
            Err(DuplicateLength)
        );
        assert_eq!(check("/x", Version::HTTP_11, &[("host", "a")]), Ok(()));
        assert_eq!(
            check_fields(
                Version::HTTP_11,
                None,
                false,
                [(&b"host"[..], &b"a"[..]), (b"x", b"a\x00b")].into_iter(),
                true,
                false
            ),
            Err(ControlChar)
        );
        assert_eq!(
            check(
                "/x",
                Version::HTTP_11,
                &[("host", "a"), ("content-length", "1")]
            ),
            Err(GetWithBody)
        );
        assert_eq!(
            check("/x", h2, &[("host", "a"), ("content-length", "0")]),
            Ok(())
        );
    }
}
