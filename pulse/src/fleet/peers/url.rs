//! The peer list's rules and the question's address: [`PeerUrl`] (one validated
//! `http://host:port` entry), [`PeersError`] (why a list or its settings were
//! refused), and the `scope=local` rewrite every question to a peer goes through.

use std::fmt;
use std::sync::Arc;

use axum::http::Uri;
use axum::http::uri::PathAndQuery;

/// Why a peer list or its settings were refused; each message names its config field.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    /// An entry is not an `http://host:port` base URL.
    #[error("peers: {entry:?} is not a peer base URL like http://10.0.0.2:8080: {reason}")]
    InvalidPeer {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The same peer is listed twice (it would be asked twice and counted twice).
    #[error("peers: {0:?} is listed twice")]
    Duplicate(String),
    /// A zero timeout would fail every peer.
    #[error("peer_timeout: must be more than zero")]
    ZeroTimeout,
    /// A zero body limit would refuse every answer.
    #[error("peer_max_body_bytes: must be more than zero")]
    ZeroMaxBody,
    /// The token cannot be sent in an `Authorization` header.
    #[error("api_token: not usable in an Authorization header (control characters?)")]
    InvalidToken,
}

/// A validated peer: `http://host:port`, without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerUrl(Arc<str>);

impl PeerUrl {
    /// Checks one entry: scheme `http`, a host, an explicit port, no user, path, or
    /// query. A trailing `/` is accepted and dropped.
    pub fn parse(entry: &str) -> Result<Self, PeersError> {
        let invalid = |reason| PeersError::InvalidPeer {
            entry: entry.to_owned(),
            reason,
        };
        let trimmed = entry.trim();
        if trimmed.is_empty() {
            return Err(invalid("empty entry"));
        }
        let uri: Uri = trimmed.parse().map_err(|_| invalid("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(invalid("the scheme must be http")),
            None => return Err(invalid("missing http:// scheme")),
        }
        let authority = uri.authority().ok_or_else(|| invalid("missing host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid(
                "user info is not allowed (the token is --api-token)",
            ));
        }
        if authority.host().is_empty() {
            return Err(invalid("missing host"));
        }
        match authority.port_u16() {
            Some(0) => return Err(invalid("port 0")),
            Some(_) => {}
            None => return Err(invalid("missing port")),
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid("a base URL has no path or query"));
        }
        Ok(PeerUrl(format!("http://{authority}").into()))
    }

    /// The base URL, `http://host:port`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PeerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `path_and_query` with every `scope` parameter replaced by one `scope=local`, so a
/// peer answers from its own partitions and never fans out again.
pub(super) fn with_local_scope(path_and_query: &str) -> Result<String, &'static str> {
    if !path_and_query.starts_with('/') {
        return Err("the path must start with /");
    }
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut tail = String::with_capacity(path_and_query.len() + 12);
    tail.push_str(path);
    tail.push('?');
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        if !is_scope(name) {
            tail.push_str(pair);
            tail.push('&');
        }
    }
    tail.push_str("scope=local");
    tail.parse::<PathAndQuery>()
        .map_err(|_| "not a valid path and query")?;
    Ok(tail)
}

/// Whether a raw query parameter name decodes to `scope` (`sc%6Fpe` included: the
/// peer's query parser decodes it, and two scopes would be refused).
fn is_scope(raw_name: &str) -> bool {
    let bytes = raw_name.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                decoded.push(value);
                i += 3;
                continue;
            }
        }
        decoded.push(if byte == b'+' { b' ' } else { byte });
        i += 1;
    }
    decoded == b"scope"
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fleet::peers::{DEFAULT_PEER_TIMEOUT, Peers, PeersConfig};

    fn config(timeout: Duration) -> PeersConfig {
        PeersConfig {
            timeout,
            ..PeersConfig::default()
        }
    }

    #[test]
    fn a_bad_peer_entry_is_refused_naming_the_field_and_the_entry() {
        for (entry, why) in [
            ("", "empty entry"),
            ("10.0.0.2:8080", "missing http:// scheme"),
            ("https://10.0.0.2:8080", "the scheme must be http"),
            ("http://10.0.0.2", "missing port"),
            ("http://10.0.0.2:0", "port 0"),
            ("http://user:pw@10.0.0.2:8080", "user info"),
            ("http://10.0.0.2:8080/api", "no path or query"),
            ("http://10.0.0.2:8080/?a=1", "no path or query"),
            ("http://10.0.0.2:8080 x", "not a URL"),
        ] {
            let e = Peers::new(&[entry], PeersConfig::default()).unwrap_err();
            let text = e.to_string();
            assert!(text.starts_with("peers: "), "{entry:?}: {text}");
            assert!(text.contains(&format!("{entry:?}")), "{entry:?}: {text}");
            assert!(text.contains(why), "{entry:?}: {text}");
        }
        let e = Peers::new(&["http://a:1", "http://a:1/"], PeersConfig::default()).unwrap_err();
        assert!(matches!(e, PeersError::Duplicate(_)), "{e}");
        assert!(matches!(
            Peers::new(&["http://a:1"], config(Duration::ZERO)).unwrap_err(),
            PeersError::ZeroTimeout
        ));
        let token = PeersConfig {
            api_token: Some("line\nbreak".into()),
            ..PeersConfig::default()
        };
        let e = Peers::new(&["http://a:1"], token).unwrap_err();
        assert!(e.to_string().starts_with("api_token: "), "{e}");
    }

    #[test]
    fn good_peer_entries_are_normalised_and_keep_their_order() {
        let peers = Peers::from_list(
            " http://10.0.0.3:8080/ ,http://pulse-b:9000,, http://[::1]:7000",
            PeersConfig::default(),
        )
        .unwrap();
        let found = peers.urls();
        let urls: Vec<&str> = found.iter().map(PeerUrl::as_str).collect();
        assert_eq!(
            urls,
            [
                "http://10.0.0.3:8080",
                "http://pulse-b:9000",
                "http://[::1]:7000"
            ]
        );
        assert!(
            Peers::from_list("", PeersConfig::default())
                .unwrap()
                .is_empty()
        );
        assert_eq!(peers.timeout(), DEFAULT_PEER_TIMEOUT);
    }

    #[test]
    fn scope_local_is_set_exactly_once() {
        for (given, sent) in [
            ("/api/tenants", "/api/tenants?scope=local"),
            ("/api/tenants?", "/api/tenants?scope=local"),
            (
                "/api/heatmap?tenant=a&",
                "/api/heatmap?tenant=a&scope=local",
            ),
            (
                "/api/heatmap?tenant=a&window=1m",
                "/api/heatmap?tenant=a&window=1m&scope=local",
            ),
            (
                "/api/rates?scope=fleet&tenant=a",
                "/api/rates?tenant=a&scope=local",
            ),
            ("/api/rates?scope=local", "/api/rates?scope=local"),
            (
                "/api/rates?scope&scope=x&sc%6Fpe=fleet",
                "/api/rates?scope=local",
            ),
            (
                "/api/rates?scopes=1&myscope=2",
                "/api/rates?scopes=1&myscope=2&scope=local",
            ),
        ] {
            assert_eq!(with_local_scope(given).as_deref(), Ok(sent), "{given}");
        }
        assert!(with_local_scope("api/tenants").is_err());
        assert!(with_local_scope("/api/a b").is_err());
    }
}
