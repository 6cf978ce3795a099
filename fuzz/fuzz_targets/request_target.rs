//! The proxy's request target → cache key step (`prefetcher::normalise_key`) on any
//! request target hyper would accept: it never panics, and any key it produces is a
//! valid `CacheKey` that starts with one `/`, has no `..` segment (also not when
//! percent-decoded, which is how an origin reads it), and normalises to itself.
#![no_main]

use http::Uri;
use libfuzzer_sys::fuzz_target;
use models::{CacheKey, MAX_KEY_LEN};

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

fuzz_target!(|data: &[u8]| {
    let Ok(uri) = Uri::try_from(data) else {
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
});
