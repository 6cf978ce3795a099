//! A log line to an access event ([`LineMapper`]): the host mapped to its tenant as
//! the prefetcher maps it, the target to its cache key by the prefetcher's rule
//! (`crate::cache_key`), with fast paths for the common shapes that give what the
//! slow path gives.

use std::collections::HashMap;

use http::Uri;
use models::{CacheKeyRef, DomainRef, Outcome, TenantId};

use crate::cache_key::{normalise_key, param_name};
use crate::events::{OutcomeRecord, OutcomeRef};

use super::formats::{outcome, parse_line};
use super::{AgentConfig, LogFormat, MalformedLine, SkipReason};

/// Host → tenant, as the prefetcher maps them: exact host names (lower case, port
/// stripped), then the `"*"` fallback.
#[derive(Debug, Clone)]
struct TenantMap {
    by_host: HashMap<String, TenantId>,
    fallback: Option<TenantId>,
}

impl TenantMap {
    fn new(config: &AgentConfig) -> TenantMap {
        let mut by_host = HashMap::new();
        let mut fallback = None;
        for t in &config.tenants {
            for host in &t.hosts {
                if host == "*" {
                    fallback = Some(t.id.clone());
                } else {
                    by_host.insert(host.to_ascii_lowercase(), t.id.clone());
                }
            }
        }
        TenantMap { by_host, fallback }
    }

    /// The tenant of `host`; `lower` is room for its lower-case copy, made only when
    /// it has an upper-case letter.
    fn tenant(&self, host: &str, lower: &mut String) -> Option<&TenantId> {
        let host = host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lower.clear();
            lower.push_str(host);
            lower.make_ascii_lowercase();
            lower.as_str()
        } else {
            host
        };
        self.by_host.get(host).or(self.fallback.as_ref())
    }
}

/// Bytes a request target or a referrer may hold for the fast paths below: the URI
/// characters (RFC 3986 unreserved, sub-delims, `:`, `@`, `/`, `?`, `%`) that
/// `http::Uri` reads as they are. Anything else (`#`, a space, a quote, non-ASCII)
/// takes `http::Uri`'s own parse.
const URI_SAFE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=:@/?%";
    let mut i = 0;
    while i < extra.len() {
        table[extra[i] as usize] = true;
        i += 1;
    }
    table
};

fn uri_safe(text: &str) -> bool {
    text.bytes().all(|b| URI_SAFE[usize::from(b)])
}

/// The cache key of a logged request target, normalised as the prefetcher's
/// [`normalise_key`] does (path plus non-empty query parameters sorted by name); `None` for
/// an absolute or invalid target. It borrows the line when the target is already
/// normal, else writes into `scratch`.
fn request_key<'a>(uri: &'a str, scratch: &'a mut String) -> Option<CacheKeyRef<'a>> {
    if !(uri.starts_with('/') && uri_safe(uri)) {
        // A target `http::Uri` must read (a fragment, an odd character): its own way.
        let key = uri
            .parse::<Uri>()
            .ok()
            .filter(|uri| uri.scheme().is_none())
            .and_then(|uri| normalise_key(&uri).ok())?;
        *scratch = String::from(key);
        return CacheKeyRef::new(scratch).ok();
    }
    let Some((path, query)) = uri.split_once('?') else {
        return CacheKeyRef::new(uri).ok();
    };
    let mut params = query.split('&').filter(|p| !p.is_empty());
    let mut sorted = true;
    let mut count = 0;
    let mut previous = "";
    for param in params.by_ref() {
        sorted &= count == 0 || param_name(previous) <= param_name(param);
        previous = param;
        count += 1;
    }
    if count == 0 {
        return CacheKeyRef::new(path).ok();
    }
    // Already normal: sorted, and no empty parameter to drop.
    if sorted && !query.starts_with('&') && !query.ends_with('&') && !query.contains("&&") {
        return CacheKeyRef::new(uri).ok();
    }
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    params.sort_by_key(|p| param_name(p));
    scratch.clear();
    scratch.push_str(path);
    scratch.push('?');
    for (i, param) in params.iter().enumerate() {
        if i > 0 {
            scratch.push('&');
        }
        scratch.push_str(param);
    }
    CacheKeyRef::new(scratch).ok()
}

/// The host of a logged `Referer`, lower case, as the prefetcher takes it (through
/// `http::Uri`); `None` when there is none or it is no valid domain. The plain
/// `http(s)://host/...` form is read here, borrowing the line (or `scratch`, for an
/// upper-case host); any other form is `http::Uri`'s to read.
fn referrer_host<'a>(referer: &'a str, scratch: &'a mut String) -> Option<DomainRef<'a>> {
    let rest = referer
        .strip_prefix("https://")
        .or_else(|| referer.strip_prefix("http://"));
    let fast = rest.filter(|_| uri_safe(referer)).and_then(|rest| {
        let host = rest.split(['/', '?']).next().unwrap_or(rest);
        // A port, user info or an IP literal: `http::Uri`'s to read.
        (!host.contains([':', '@', '['])).then_some(host)
    });
    let host = match fast {
        Some(host) if !host.bytes().any(|b| b.is_ascii_uppercase()) => host,
        Some(host) => {
            scratch.clear();
            scratch.push_str(host);
            scratch.make_ascii_lowercase();
            scratch.as_str()
        }
        None if referer.is_empty() || referer == "-" => return None,
        None => {
            let uri: Uri = referer.parse().ok()?;
            scratch.clear();
            scratch.push_str(uri.host()?);
            scratch.make_ascii_lowercase();
            scratch.as_str()
        }
    };
    DomainRef::new(host).ok()
}

/// Room for what one line's event cannot borrow from the line: a lower-case host,
/// a normalised key, a lower-case referrer host. Reused from line to line.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    host: String,
    key: String,
    referrer: String,
}

/// Turns log lines into access events.
#[derive(Debug, Clone)]
pub struct LineMapper {
    format: LogFormat,
    tenants: TenantMap,
}

/// What one line became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// An event to publish.
    Event(OutcomeRecord),
    /// A well-formed line that makes no event.
    Skip(SkipReason),
    /// Not a line of the format.
    Malformed(MalformedLine),
}

/// Why a line makes no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoEvent {
    /// Well formed, but no event ([`Line::Skip`]).
    Skip(SkipReason),
    /// Not a line of the format ([`Line::Malformed`]).
    Malformed(MalformedLine),
}

impl LineMapper {
    /// A mapper for a validated config.
    pub fn new(config: &AgentConfig) -> LineMapper {
        LineMapper {
            format: config.log_format,
            tenants: TenantMap::new(config),
        }
    }

    /// Maps one line (without its newline).
    pub fn map(&self, text: &[u8]) -> Line {
        match self.map_with(text, &mut Scratch::default(), |r| r.to_owned_record()) {
            Ok(record) => Line::Event(record),
            Err(NoEvent::Skip(reason)) => Line::Skip(reason),
            Err(NoEvent::Malformed(error)) => Line::Malformed(error),
        }
    }

    /// Maps one line and hands its event, borrowed from the line (and `scratch`), to
    /// `publish`: the follower's path, which copies no string that it need not.
    pub(crate) fn map_with<R>(
        &self,
        text: &[u8],
        scratch: &mut Scratch,
        publish: impl FnOnce(&OutcomeRef<'_>) -> R,
    ) -> Result<R, NoEvent> {
        let parsed = parse_line(text).map_err(NoEvent::Malformed)?;
        let outcome = outcome(self.format, &parsed.line).map_err(NoEvent::Skip)?;
        let Some(tenant) = self.tenants.tenant(&parsed.line.host, &mut scratch.host) else {
            return Err(NoEvent::Skip(SkipReason::UnknownHost));
        };
        let Some(key) = request_key(&parsed.line.uri, &mut scratch.key) else {
            return Err(NoEvent::Skip(SkipReason::InvalidKey));
        };
        let referrer = referrer_host(&parsed.line.referer, &mut scratch.referrer);
        // Only a request that went to the origin has a fill time.
        let fill_ms = match outcome {
            Outcome::Miss | Outcome::PrefetchFill => parsed.upstream_ms,
            _ => None,
        };
        Ok(publish(&OutcomeRef {
            ts_ms: parsed.ts_ms,
            tenant: tenant.borrowed(),
            key,
            outcome,
            bytes: parsed.bytes,
            fill_ms,
            referrer,
        }))
    }
}

#[cfg(test)]
mod tests {
    use models::Domain;

    use super::*;

    fn mapper(format: LogFormat) -> LineMapper {
        let mut config: AgentConfig = toml::from_str(
            r#"
            [[tenants]]
            id = "acme"
            hosts = ["acme.example"]
            "#,
        )
        .unwrap();
        config.log_format = format;
        LineMapper::new(&config)
    }

    fn line(host: &str, uri: &str, cache: &str) -> String {
        format!(
            r#"{{"ts":"1700000000.5","host":"{host}","uri":"{uri}","method":"GET","status":"200","cache":"{cache}","referer":"https://News.Example/a","bytes":"10","upstream_time":"0.020","prewarm":""}}"#
        )
    }

    #[test]
    fn a_line_becomes_an_event_of_the_mapped_tenant_with_a_normalised_key() {
        let text = line("ACME.example:8080", "/p?z=1&a=2", "MISS");
        let Line::Event(record) = mapper(LogFormat::NginxJson).map(text.as_bytes()) else {
            panic!("expected an event");
        };
        assert_eq!(record.tenant.as_str(), "acme");
        assert_eq!(record.key.as_str(), "/p?a=2&z=1");
        assert_eq!(record.outcome, Outcome::Miss);
        assert_eq!(record.ts_ms, 1_700_000_000_500);
        assert_eq!(record.bytes, 10);
        assert_eq!(record.fill_ms, Some(20));
        assert_eq!(record.referrer.unwrap().as_str(), "news.example");
    }

    /// The prefetcher's way to a key: `http::Uri`, then `normalise_key`.
    fn slow_key(uri: &str) -> Option<String> {
        let uri = uri.parse::<Uri>().ok().filter(|u| u.scheme().is_none())?;
        normalise_key(&uri).ok().map(String::from)
    }

    /// The prefetcher's way to a referrer: `http::Uri`'s host, lower case; but a log's
    /// `-` (varnishncsa's "no header") is no referrer, where `http::Uri` would read a
    /// host named `-`.
    fn slow_referrer(referer: &str) -> Option<String> {
        if referer == "-" {
            return None;
        }
        let uri: Uri = referer.parse().ok()?;
        Domain::new(uri.host()?.to_ascii_lowercase())
            .ok()
            .map(String::from)
    }

    #[test]
    fn keys_and_referrers_are_read_as_the_prefetcher_reads_them() {
        let mut scratch = String::new();
        for uri in [
            "/a",
            "/a?",
            "/a?b=1",
            "/a?b=1&a=2",
            "/a?&b=1",
            "/a?b=1&",
            "/a?b&&a",
            "/a#f",
            "/a?b=1#f",
            "/a b",
            "//evil/x",
            "http://h/x",
            "*",
            "/../x",
            "/%2e%2e/x",
            "",
            "/caf\u{e9}",
            "/a?z=\"q\"",
        ] {
            let fast = request_key(uri, &mut scratch).map(|k| k.as_str().to_owned());
            assert_eq!(fast, slow_key(uri), "{uri:?}");
        }
        for referer in [
            "https://news.example/a",
            "http://News.Example",
            "https://a.example?x",
            "https://a.example:8443/x",
            "https://user@a.example/",
            "https://[::1]/",
            "android-app://com.example/x",
            "https://a b/",
            "https://a.example/#f",
            "",
            "-",
            "news.example",
            "https:///x",
            "https://bad_host/x",
        ] {
            let fast = referrer_host(referer, &mut scratch).map(|d| d.as_str().to_owned());
            assert_eq!(fast, slow_referrer(referer), "{referer:?}");
        }
        assert_eq!(referrer_host("-", &mut scratch), None);
        assert!("-".parse::<Uri>().is_ok_and(|u| u.host() == Some("-")));
    }

    proptest::proptest! {
        /// Targets and referrers made of URI characters and some that are not: the
        /// fast paths give what `http::Uri` and `normalise_key` give.
        #[test]
        fn the_fast_key_and_referrer_agree_with_the_uri_parser(
            uri in "(/|//|http://h/|\\*)?[a-zA-Z0-9/?&=.%#~ _\"<>@:!$',;*+()\\[\\]-]{0,24}",
            referer in "(https?://|ftp://|//)?[a-zA-Z0-9/?&=.%#~ _\"@:\\[\\]-]{0,24}",
        ) {
            let mut scratch = String::new();
            let fast = request_key(&uri, &mut scratch).map(|k| k.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_key(&uri), "{:?}", uri);
            let fast = referrer_host(&referer, &mut scratch).map(|d| d.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_referrer(&referer), "{:?}", referer);
        }

        /// The same on inputs that mostly take the fast paths.
        #[test]
        fn the_fast_paths_agree_on_plain_targets_and_referrers(
            uri in "/[a-z0-9/.%~_@:!$',;*+()-]{0,12}(\\?[a-z0-9&=.%@:/?-]{0,16})?",
            referer in "https?://[a-zA-Z0-9._-]{0,12}([/?][a-z0-9/?&=.:@-]{0,12})?",
        ) {
            let mut scratch = String::new();
            let fast = request_key(&uri, &mut scratch).map(|k| k.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_key(&uri), "{:?}", uri);
            let fast = referrer_host(&referer, &mut scratch).map(|d| d.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_referrer(&referer), "{:?}", referer);
        }
    }

    #[test]
    fn a_hit_has_no_fill_time() {
        let text = line("acme.example", "/p", "HIT");
        let Line::Event(record) = mapper(LogFormat::NginxJson).map(text.as_bytes()) else {
            panic!("expected an event");
        };
        assert_eq!(record.fill_ms, None);
    }

    #[test]
    fn an_unmapped_host_is_no_tenant() {
        let text = line("evil.example", "/p", "HIT");
        assert_eq!(
            mapper(LogFormat::NginxJson).map(text.as_bytes()),
            Line::Skip(SkipReason::UnknownHost)
        );
    }

    #[test]
    fn an_absolute_or_escaping_target_is_no_key() {
        for uri in ["http://other.example/p", "/../etc/passwd"] {
            let text = line("acme.example", uri, "HIT");
            assert_eq!(
                mapper(LogFormat::NginxJson).map(text.as_bytes()),
                Line::Skip(SkipReason::InvalidKey),
                "{uri}"
            );
        }
    }
}
