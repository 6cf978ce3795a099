//! Whole HTTP/1 request heads through the proxy's own checks
//! (`prefetcher::check_request_head`, which the node runs on every head it reads):
//! never a panic, and anything accepted is unambiguous when read again
//! independently with `httparse` (what hyper parses with): the same head length,
//! CRLF line ends only, exactly one authority (one `Host`, which an absolute-form
//! target agrees with), exactly one framing (no field, one plain `Content-Length`,
//! or one `Transfer-Encoding: chunked`), and a target whose cache key
//! (`prefetcher::normalise_key`), when it has one, starts with one `/`, has no `..`
//! segment (also not when percent-decoded, which is how an origin reads it) and
//! normalises to itself.
#![no_main]

use http::Uri;
use libfuzzer_sys::fuzz_target;
use models::{CacheKey, MAX_KEY_LEN};
use prefetcher::{Framing, HeadCheck, check_request_head};

/// Percent-decodes `segment` (bytes that are not a valid escape stay as they are).
fn percent_decode(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// `host` without the scheme's default port, lowercased.
fn canonical(authority: &str, https: bool) -> String {
    let default = if https { ":443" } else { ":80" };
    let lower = authority.to_ascii_lowercase();
    lower
        .strip_suffix(default)
        .map_or(lower.clone(), str::to_string)
}

fn check_key(target: &str) {
    let Ok(uri) = Uri::try_from(target) else {
        return;
    };
    let Ok(key) = prefetcher::normalise_key(&uri) else {
        return;
    };
    let s = key.as_str();
    assert_eq!(CacheKey::new(s).as_ref(), Ok(&key));
    assert!(s.len() <= MAX_KEY_LEN);
    assert!(s.starts_with('/') && !s.starts_with("//"), "{s:?}");
    let path = s.split('?').next().unwrap_or(s);
    for segment in path.split('/') {
        assert_ne!(percent_decode(segment), b"..", "'..' segment in {s:?}");
    }
    // A key is its own normal form: pre-warming it hits the same flight.
    let again = s
        .parse::<Uri>()
        .ok()
        .and_then(|u| prefetcher::normalise_key(&u).ok());
    assert_eq!(
        again.as_ref(),
        Some(&key),
        "{s:?} does not normalise to itself"
    );
}

fuzz_target!(|data: &[u8]| {
    let HeadCheck::Accepted(head) = check_request_head(data) else {
        return;
    };
    let mut fields = [httparse::EMPTY_HEADER; prefetcher::MAX_HEAD_FIELDS];
    let mut request = httparse::Request::new(&mut fields);
    let parsed = request.parse(data);
    assert_eq!(
        parsed,
        Ok(httparse::Status::Complete(head.len)),
        "httparse reads another head"
    );
    let bytes = &data[..head.len];
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && bytes[i - 1] == b'\r', "bare LF at {i}");
        }
    }
    assert_eq!(request.method, Some(head.method));
    assert_eq!(request.path, Some(head.target));
    assert_ne!(head.method, "CONNECT");

    // Exactly one authority.
    let named = |name: &str| {
        request
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect::<Vec<_>>()
    };
    let hosts = named("host");
    assert!(hosts.len() <= 1, "{} Host fields", hosts.len());
    assert!(!head.host.is_empty());
    assert!(
        head.host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b)),
        "{:?}",
        head.host
    );
    match hosts.first() {
        Some(host) => assert_eq!(*host, head.host.as_bytes()),
        None => assert_eq!(request.version, Some(0), "HTTP/1.1 without Host"),
    }
    if !head.target.starts_with('/') {
        let https = head.target[..5].eq_ignore_ascii_case("https");
        let uri = Uri::try_from(head.target).ok();
        if let Some(authority) = uri.as_ref().and_then(|u| u.authority()) {
            assert!(!authority.as_str().contains('@'));
            assert_eq!(
                canonical(authority.as_str(), https),
                canonical(head.host, https),
                "the target names another authority than Host"
            );
        }
    }

    // Exactly one framing.
    let lengths = named("content-length");
    let codings = named("transfer-encoding");
    match head.framing {
        Framing::Length(n) => {
            assert!(codings.is_empty());
            match lengths.as_slice() {
                [] => assert_eq!(n, 0),
                [one] => assert_eq!(
                    std::str::from_utf8(one).ok().and_then(|s| s.parse().ok()),
                    Some(n)
                ),
                more => panic!("{} Content-Length fields", more.len()),
            }
            if let [one] = lengths.as_slice() {
                assert!(one.iter().all(u8::is_ascii_digit), "{one:?}");
            }
        }
        Framing::Chunked => {
            assert!(lengths.is_empty());
            assert_eq!(codings.len(), 1);
            assert!(codings[0].trim_ascii().eq_ignore_ascii_case(b"chunked"));
            assert_eq!(request.version, Some(1));
        }
    }

    check_key(head.target);
});
