//! Validated identifiers. Each is a string newtype whose constructor is the only way
//! in, so code holding one never re-checks it.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// Why an identifier was refused. The message names the kind of identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {reason}")]
pub struct IdError {
    /// Which identifier: "tenant", "cache key", "region", "node" or "domain".
    pub kind: &'static str,
    /// What rule the value broke.
    pub reason: String,
}

impl IdError {
    fn new(kind: &'static str, reason: impl Into<String>) -> Self {
        IdError {
            kind,
            reason: reason.into(),
        }
    }
}

/// Longest tenant, region or node id, in bytes.
pub const MAX_ID_LEN: usize = 64;
/// Longest cache key, in bytes.
pub const MAX_KEY_LEN: usize = 2048;
/// Longest referrer domain (the DNS limit).
pub const MAX_DOMAIN_LEN: usize = 253;

/// Ids use a character set that is safe in logs, metric labels, file names and URLs.
fn check_id(kind: &'static str, value: &str) -> Result<(), IdError> {
    // Fast path for the per-message decoder: a byte scan that accepts only what the
    // rules below accept; anything else takes the full check, which names the error.
    if (1..=MAX_ID_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Ok(());
    }
    check_id_slow(kind, value)
}

fn check_id_slow(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::new(kind, "must not be empty"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(IdError::new(
            kind,
            format!("{} bytes, longer than {MAX_ID_LEN}", value.len()),
        ));
    }
    match value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(c) => Err(IdError::new(
            kind,
            format!("character {c:?} is not one of A-Z a-z 0-9 - _ ."),
        )),
        None => Ok(()),
    }
}

/// A cache key is an origin-relative path (with an optional query), never a URL: a
/// key must not be able to name another host or climb out of the tenant's tree.
fn check_key(value: &str) -> Result<(), IdError> {
    if key_is_plainly_valid(value) {
        return Ok(());
    }
    check_key_slow(value)
}

/// Fast path of [`check_key`] for the per-message decoder: true only for a key the
/// full check accepts (printable ASCII, one leading '/', no '\\' or '#', no '..'
/// segment in the path, in one pass over the bytes). False sends the key through the
/// full check, which gives the verdict and names the error.
fn key_is_plainly_valid(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_KEY_LEN || bytes.first() != Some(&b'/') || bytes.get(1) == Some(&b'/') {
        return false;
    }
    let mut in_path = true;
    // Length of the current path segment and whether it is only dots so far.
    let (mut seg_len, mut seg_dots) = (0usize, true);
    for &b in &bytes[1..] {
        // Printable ASCII other than space: no control, whitespace or non-ASCII char.
        if !(0x21..0x7f).contains(&b) || b == b'\\' || b == b'#' {
            return false;
        }
        // '%' could spell "%2e%2e": leave that to the full check.
        if in_path && b == b'%' {
            return false;
        }
        if !in_path {
            continue;
        }
        match b {
            b'/' | b'?' => {
                if seg_len == 2 && seg_dots {
                    return false;
                }
                if b == b'?' {
                    in_path = false;
                }
                (seg_len, seg_dots) = (0, true);
            }
            _ => {
                seg_len += 1;
                seg_dots &= b == b'.';
            }
        }
    }
    !(in_path && seg_len == 2 && seg_dots)
}

fn check_key_slow(value: &str) -> Result<(), IdError> {
    const KIND: &str = "cache key";
    if value.len() > MAX_KEY_LEN {
        return Err(IdError::new(
            KIND,
            format!("{} bytes, longer than {MAX_KEY_LEN}", value.len()),
        ));
    }
    if !value.starts_with('/') {
        return Err(IdError::new(KIND, "must be a path starting with '/'"));
    }
    if value.starts_with("//") {
        return Err(IdError::new(
            KIND,
            "must not start with '//' (that names a host)",
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || matches!(c, '\\' | '#'))
    {
        return Err(IdError::new(
            KIND,
            format!("character {c:?} is not allowed"),
        ));
    }
    let path = value.split('?').next().unwrap_or(value);
    if path.split('/').any(is_dot_dot) {
        return Err(IdError::new(KIND, "must not contain a '..' segment"));
    }
    Ok(())
}

/// `..`, also with either dot percent-encoded (`.%2e`, `%2E.`, `%2e%2e`): origins decode
/// `%2e` before they resolve dot segments, so each of these climbs a level.
fn is_dot_dot(segment: &str) -> bool {
    let s = segment.as_bytes();
    let dot = |b: &[u8]| b == b"." || b.eq_ignore_ascii_case(b"%2e");
    match s.len() {
        2 => s == b"..",
        4 => (dot(&s[..1]) && dot(&s[1..])) || (dot(&s[..3]) && dot(&s[3..])),
        6 => dot(&s[..3]) && dot(&s[3..]),
        _ => false,
    }
}

fn check_domain(value: &str) -> Result<(), IdError> {
    if (1..=MAX_DOMAIN_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'))
    {
        return Ok(());
    }
    check_domain_slow(value)
}

fn check_domain_slow(value: &str) -> Result<(), IdError> {
    const KIND: &str = "domain";
    if value.is_empty() {
        return Err(IdError::new(KIND, "must not be empty"));
    }
    if value.len() > MAX_DOMAIN_LEN {
        return Err(IdError::new(
            KIND,
            format!("{} bytes, longer than {MAX_DOMAIN_LEN}", value.len()),
        ));
    }
    match value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.')))
    {
        Some(c) => Err(IdError::new(
            KIND,
            format!("character {c:?} is not one of A-Z a-z 0-9 - ."),
        )),
        None => Ok(()),
    }
}

macro_rules! validated_string {
    ($(#[$doc:meta])* $name:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                $check(&value)?;
                Ok($name(value))
            }

            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                $name::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(value: &str) -> Result<Self, IdError> {
                $name::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                $name::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // Maps keyed by the id can be searched with a borrowed `&str` (same hash).
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

/// A validated identifier borrowed from a message's bytes: the zero-copy twin of an
/// owned id, for the per-message path. It is checked by the very same rule, and its
/// `Deserialize` reports errors exactly as the owned id's does (same words, same
/// position), so a message is accepted or refused identically either way.
macro_rules! validated_str_ref {
    ($(#[$doc:meta])* $name:ident, $owned:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash)]
        pub struct $name<'a>(Cow<'a, str>);

        impl<'a> $name<'a> {
            /// Validates `value` and borrows it.
            pub fn new(value: &'a str) -> Result<Self, IdError> {
                $check(value)?;
                Ok($name(Cow::Borrowed(value)))
            }

            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The owned id, without checking again.
            pub fn to_owned_id(&self) -> $owned {
                $owned(self.0.clone().into_owned())
            }
        }

        impl $owned {
            /// The id borrowed, without checking again.
            pub fn borrowed(&self) -> $name<'_> {
                $name(Cow::Borrowed(&self.0))
            }
        }

        impl<'de: 'a, 'a> Deserialize<'de> for $name<'a> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl<'de> serde::de::Visitor<'de> for Visitor {
                    type Value = Cow<'de, str>;
                    // The owned ids deserialise through `String`: same expectation.
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_borrowed_str<E: serde::de::Error>(
                        self,
                        v: &'de str,
                    ) -> Result<Self::Value, E> {
                        Ok(Cow::Borrowed(v))
                    }
                    // A string with escapes cannot be borrowed: it is unescaped into a copy.
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                        Ok(Cow::Owned(v.to_owned()))
                    }
                    fn visit_string<E: serde::de::Error>(
                        self,
                        v: String,
                    ) -> Result<Self::Value, E> {
                        Ok(Cow::Owned(v))
                    }
                }
                let value = deserializer.deserialize_string(Visitor)?;
                $check(&value).map_err(serde::de::Error::custom)?;
                Ok($name(value))
            }
        }

        impl AsRef<str> for $name<'_> {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl PartialEq<$owned> for $name<'_> {
            fn eq(&self, other: &$owned) -> bool {
                *self.0 == other.0
            }
        }
    };
}

validated_string!(
    /// A tenant (a customer of the CDN): 1–64 characters of `A-Z a-z 0-9 - _ .`.
    TenantId,
    |v: &str| check_id("tenant", v)
);
validated_string!(
    /// A region of edge nodes, such as `eu-west`: same rules as [`TenantId`].
    RegionId,
    |v: &str| check_id("region", v)
);
validated_string!(
    /// One edge node: same rules as [`TenantId`].
    NodeId,
    |v: &str| check_id("node", v)
);
validated_string!(
    /// A normalised cache key: an origin-relative path with an optional query, at most
    /// 2 KiB, starting with a single `/`, with no `..` segment, whitespace, control
    /// character, backslash or fragment.
    CacheKey,
    check_key
);
validated_string!(
    /// A referrer's host name, such as `news.example.com`.
    Domain,
    check_domain
);

validated_str_ref!(
    /// A borrowed [`TenantId`].
    TenantRef,
    TenantId,
    |v: &str| check_id("tenant", v)
);
validated_str_ref!(
    /// A borrowed [`RegionId`].
    RegionRef,
    RegionId,
    |v: &str| check_id("region", v)
);
validated_str_ref!(
    /// A borrowed [`NodeId`].
    NodeRef,
    NodeId,
    |v: &str| check_id("node", v)
);
validated_str_ref!(
    /// A borrowed [`CacheKey`].
    CacheKeyRef,
    CacheKey,
    check_key
);
validated_str_ref!(
    /// A borrowed [`Domain`].
    DomainRef,
    Domain,
    check_domain
);

/// Whether `name` is a legal Kafka topic name: 1 to 249 of `A-Z a-z 0-9 . _ -`, and
/// neither `.` nor `..`. Pulse, the prefetcher and the edge agent check their
/// configured topics with it, so a bad one fails at start, not at the first send.
pub fn is_topic_name(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids() {
        for id in [
            "acme",
            "eu-west",
            "edge_1",
            "a.b-c_9",
            &"x".repeat(MAX_ID_LEN),
        ] {
            assert!(TenantId::new(id).is_ok(), "{id}");
        }
    }

    #[test]
    fn rejects_bad_ids_and_names_the_kind() {
        let too_long = "x".repeat(MAX_ID_LEN + 1);
        for bad in ["", too_long.as_str(), "a b", "a/b", "ünï", "a\n"] {
            let err = RegionId::new(bad).unwrap_err();
            assert_eq!(err.kind, "region", "{bad:?}");
            assert!(err.to_string().starts_with("invalid region: "), "{err}");
        }
    }

    #[test]
    fn accepts_paths_with_queries() {
        for key in [
            "/",
            "/img/logo.png",
            "/a/b?c=d&e=f",
            "/%E2%9C%93",
            "/a..b/c.",
            "/a/%2e/b",
            "/a/.%2ex/b",
            "/a/...",
        ] {
            assert!(CacheKey::new(key).is_ok(), "{key}");
        }
    }

    #[test]
    fn rejects_urls_traversal_and_oversized_keys() {
        let huge = format!("/{}", "a".repeat(MAX_KEY_LEN));
        let cases = [
            ("", "starting with '/'"),
            ("img.png", "starting with '/'"),
            ("http://evil.example/x", "starting with '/'"),
            ("//evil.example/x", "names a host"),
            ("/a/../../etc/passwd", "'..' segment"),
            ("/a/%2E%2E/b", "'..' segment"),
            // Found by fuzzing (fuzz/ target request_target): one dot encoded.
            ("/a/.%2e/b", "'..' segment"),
            ("/a/%2E./b", "'..' segment"),
            ("/.%2E", "'..' segment"),
            ("/..", "'..' segment"),
            ("/a b", "not allowed"),
            ("/a\\b", "not allowed"),
            ("/a#frag", "not allowed"),
            ("/a\0", "not allowed"),
            (huge.as_str(), "longer than 2048"),
        ];
        for (key, expected) in cases {
            let err = CacheKey::new(key).unwrap_err();
            assert!(err.to_string().contains(expected), "{key:?}: {err}");
        }
    }

    proptest::proptest! {
        /// The fast paths never accept what the full checks refuse, and accept the
        /// ordinary keys and ids they exist for.
        #[test]
        fn fast_paths_agree_with_the_full_checks(
            key in "(/|//|[a-z%?#\\\\. ]){0,3}([a-zA-Z0-9._~%?=&#/\\\\ \u{0}\u{85}é-]|\\.\\.|%2[eE]%2[eE]){0,12}",
            id in "[A-Za-z0-9._/ é-]{0,70}",
        ) {
            if key_is_plainly_valid(&key) {
                proptest::prop_assert!(check_key_slow(&key).is_ok(), "{key:?}");
            }
            proptest::prop_assert_eq!(check_key(&key), check_key_slow(&key));
            proptest::prop_assert_eq!(check_id("node", &id), check_id_slow("node", &id));
            proptest::prop_assert_eq!(check_domain(&id), check_domain_slow(&id));
        }
    }

    #[test]
    fn fast_path_takes_ordinary_keys() {
        for key in [
            "/",
            "/img/logo.png",
            "/a/b?c=d&e=f",
            "/a..b/c.",
            "/a/b?x=/../",
            "/.../x",
        ] {
            assert!(key_is_plainly_valid(key), "{key}");
        }
        for key in ["/..", "/a/../b", "/a/..?q", "/%2e%2e", "//h", "/a b", "/é"] {
            assert!(!key_is_plainly_valid(key), "{key}");
        }
    }

    #[test]
    fn rejects_bad_domains() {
        assert!(Domain::new("news.example.com").is_ok());
        for bad in ["", "a/b", "a b", &"d".repeat(MAX_DOMAIN_LEN + 1)] {
            assert_eq!(Domain::new(bad).unwrap_err().kind, "domain");
        }
    }

    #[test]
    fn topic_names_are_kafkas() {
        for good in ["edge-events", "a", "a.b_c-9", &"x".repeat(249)] {
            assert!(is_topic_name(good), "{good:?}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "é", &"x".repeat(250)] {
            assert!(!is_topic_name(bad), "{bad:?}");
        }
    }
}
