//! A request target's cache key: the rule the proxy keys its cache and flights by,
//! and the edge agent keys the access events it reads from a log line by, so the two
//! always agree; and [`check_target`], the one check of every target the node
//! forwards to an origin (cacheable or not, any method).
//!
//! A leaf: it names no other module of the crate.

use http::Uri;
use models::{CacheKey, IdError};

/// Why a request target is refused (`400`, `bad_target`) before anything is
/// forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// A `..` segment in some spelling an origin may resolve: the target could climb
    /// out of the tenant's origin prefix.
    #[error(
        "the request target has a '..' segment (also percent-encoded, behind an encoded \
         slash or a ';'): it could climb out of the origin's path"
    )]
    DotSegment,
    /// The target does not make a cache key.
    #[error(transparent)]
    Key(#[from] IdError),
}

/// The normalised cache key of a request URI: the path, plus the query with its
/// parameters sorted by name and empty ones dropped, so `?b=2&a=1` and `?a=1&b=2&`
/// share. The sort is stable: the values of a repeated name keep their order
/// (`?sort=price&sort=date` is not `?sort=date&sort=price` to an origin), and the
/// key is also the target a fill sends. The path passes [`check_target`] first.
pub fn normalise_key(uri: &Uri) -> Result<CacheKey, TargetError> {
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    check_target(path)?;
    let mut params: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .collect();
    if params.is_empty() {
        return Ok(CacheKey::new(path)?);
    }
    params.sort_by_key(|p| param_name(p));
    Ok(CacheKey::new(format!("{path}?{}", params.join("&")))?)
}

/// The name of a query parameter (`a` of `a=1`, all of `a`): what keys sort by.
pub(crate) fn param_name(param: &str) -> &str {
    param.split_once('=').map_or(param, |(name, _)| name)
}

/// The one check of every request target the node forwards (its path, without the
/// query): refused when any segment is `..` as some origin reads it. Origins differ
/// in what they decode before they resolve dot segments, so the check takes the
/// widest reading: `%2e` (any case) is a dot, `%2f`, `%5c` and `\` separate segments,
/// each of them double-encoded (`%252e`) too, and a segment ends at `;` (servlet
/// containers drop path parameters first: `/..;/` is `/../`). A single `.` segment
/// cannot climb and is left alone. One pass over the bytes, no allocation.
///
/// ```
/// use prefetcher::check_target;
/// assert!(check_target("/a/b.js").is_ok());
/// for climbing in ["/../t2/x", "/%2e%2e/t2/x", "/..%2ft2/x", "/a/..;/x", "/%252e%252e/x"] {
///     assert!(check_target(climbing).is_err(), "{climbing}");
/// }
/// ```
pub fn check_target(path: &str) -> Result<(), TargetError> {
    let bytes = path.as_bytes();
    // Dots in the current segment's name, whether the name held anything else, and
    // whether a `;` ended the name (the rest is a parameter).
    let (mut dots, mut other, mut parameter) = (0usize, false, false);
    let mut i = 0;
    while i <= bytes.len() {
        let (unit, len) = match bytes.get(i) {
            None => (Unit::Separator, 1),
            Some(b'/' | b'\\') => (Unit::Separator, 1),
            Some(b'.') => (Unit::Dot, 1),
            Some(b';') => (Unit::Parameter, 1),
            Some(b'%') => decoded(&bytes[i..]),
            Some(_) => (Unit::Other, 1),
        };
        match unit {
            Unit::Separator => {
                if dots == 2 && !other {
                    return Err(TargetError::DotSegment);
                }
                (dots, other, parameter) = (0, false, false);
            }
            _ if parameter => {}
            Unit::Parameter => parameter = true,
            Unit::Dot if !other => dots += 1,
            Unit::Dot | Unit::Other => other = true,
        }
        i += len;
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Unit {
    Separator,
    Dot,
    Parameter,
    Other,
}

/// What a `%` escape at the start of `bytes` decodes to (once or twice), and its
/// length.
fn decoded(bytes: &[u8]) -> (Unit, usize) {
    let unit = |hex: &[u8]| match hex {
        [b'2', b'e' | b'E'] => Some(Unit::Dot),
        [b'2', b'f' | b'F'] | [b'5', b'c' | b'C'] => Some(Unit::Separator),
        [b'3', b'b' | b'B'] => Some(Unit::Parameter),
        _ => None,
    };
    if let Some(u) = bytes.get(1..3).and_then(unit) {
        return (u, 3);
    }
    // `%25` is `%`: `%252e` is `%2e` to an origin that decodes twice.
    if bytes.get(1..3) == Some(b"25")
        && let Some(u) = bytes.get(3..5).and_then(unit)
    {
        return (u, 5);
    }
    (Unit::Other, 1)
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
        assert_eq!(
            k("/a?sort=price&b=1&sort=date").unwrap(),
            "/a?b=1&sort=price&sort=date"
        );
        assert_ne!(k("/a?s=2&s=1").unwrap(), k("/a?s=1&s=2").unwrap());
        assert_eq!(k("http://h.example/x").unwrap(), "/x");
        assert!(k("/a/../b").is_err());
        assert_eq!(k("/..%2fb"), Err(TargetError::DotSegment));
    }

    #[test]
    fn every_spelling_of_a_climbing_segment_is_refused() {
        for climbing in [
            "/..",
            "/../t2/x",
            "/a/..",
            "/%2e%2e/t2/x",
            "/%2E./x",
            "/.%2e/x",
            "/..%2ft2/x",
            "/..%2Ft2/x",
            "/a%2f..%2f..%2fx",
            "/..%5cx",
            "/..\\x",
            "/a/..;/x",
            "/a/..;jsessionid=1/x",
            "/a/..%3b/x",
            "/%252e%252e/x",
            "/..%252fx",
        ] {
            assert_eq!(
                check_target(climbing),
                Err(TargetError::DotSegment),
                "{climbing}"
            );
        }
        for fine in [
            "/",
            "/a/b.js",
            "/a/./b",
            "/.well-known/x",
            "/a..b/c.",
            "/a/...",
            "/a/..x/",
            "/a/x..;/",
            "/a;..",
            "/a/.;/b",
            "/%2e/x",
            "/50%25/x",
            "/a%2fb",
            "/%",
            "/%2",
        ] {
            assert_eq!(check_target(fine), Ok(()), "{fine}");
        }
    }
}
