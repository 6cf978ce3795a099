//! A request target's cache key: the rule the proxy keys its cache and flights by,
//! and the edge agent keys the access events it reads from a log line by, so the two
//! always agree.
//!
//! A leaf: it names no other module of the crate.

use http::Uri;
use models::{CacheKey, IdError};

/// The normalised cache key of a request URI: the path, plus the query with its
/// parameters sorted and empty ones dropped, so `?b=2&a=1` and `?a=1&b=2&` share.
pub fn normalise_key(uri: &Uri) -> Result<CacheKey, IdError> {
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    let mut params: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .collect();
    if params.is_empty() {
        return CacheKey::new(path);
    }
    params.sort_unstable();
    CacheKey::new(format!("{path}?{}", params.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_normalised_and_validated() {
        let k = |s: &str| normalise_key(&s.parse::<Uri>().unwrap()).map(|k| k.to_string());
        assert_eq!(k("/a?b=2&a=1").unwrap(), "/a?a=1&b=2");
        assert_eq!(k("/a?a=1&&b=2&").unwrap(), "/a?a=1&b=2");
        assert_eq!(k("/a?").unwrap(), "/a");
        assert_eq!(k("http://h.example/x").unwrap(), "/x");
        assert!(k("/a/../b").is_err());
    }
}
