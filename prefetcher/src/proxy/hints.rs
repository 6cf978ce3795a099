//! Origin hints: a response that names its successors (`Link: <…>; rel=prefetch`
//! or `rel=next`, or `CDN-Origin-Assist-Prefetch-Path`) makes the node pre-warm
//! them, for the tenants whose `[tenants.origin_hints]` opts in.
//!
//! Rules (each refusal counted in `prefetcher_origin_hints_total{result}`):
//! - hints are read from a 2xx response a **user** reaches: a user's fill (or a
//!   pre-warm a user joined), or a pre-warmed entry at its first user hit. A pre-warm
//!   nobody asked for is not read, so hints run at most one object ahead of the
//!   users: no loop through the origin, no amplification past one level;
//! - a target is a path of the **same tenant and origin**: an absolute path or a
//!   relative one (resolved against the response's path). A scheme, `//host`, a
//!   backslash or a control character is `other_host`/`bad_path`; a `.` or `..`
//!   segment (encoded or not) is `bad_path`; the response's own key is `loop`;
//! - at most `max_per_response` targets per response (`over_count` for the rest),
//!   and at most `fills_per_s` hinted fills started per second per tenant
//!   (`over_rate`);
//! - a target is filled **once**: as a pre-warm ([`Node::prewarm`]), so a cached or
//!   in-flight target is not fetched again (`cached`), and the fill is the tenant's
//!   lowest class within spare capacity (`crate::limits`); its size is bounded as
//!   every fill's (`cache.max_object_bytes`: a larger body is not stored, and with
//!   nobody reading it the fill stops).

use std::sync::Mutex;

use http::HeaderMap;
use models::{CacheKey, TenantId};
use tokio::time::Instant;

use super::Node;
use super::prewarm::PrewarmOutcome;
use crate::config::OriginHintsConfig;

/// Akamai's origin-assist header: successor paths, comma-separated.
pub(crate) const ASSIST_PREFETCH_PATH: &str = "cdn-origin-assist-prefetch-path";

/// What became of one hint (the `result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HintResult {
    Started,
    Cached,
    OtherHost,
    BadPath,
    Loop,
    OverCount,
    OverRate,
    Refused,
}

impl HintResult {
    pub(crate) const ALL: [HintResult; 8] = [
        HintResult::Started,
        HintResult::Cached,
        HintResult::OtherHost,
        HintResult::BadPath,
        HintResult::Loop,
        HintResult::OverCount,
        HintResult::OverRate,
        HintResult::Refused,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HintResult::Started => "started",
            HintResult::Cached => "cached",
            HintResult::OtherHost => "other_host",
            HintResult::BadPath => "bad_path",
            HintResult::Loop => "loop",
            HintResult::OverCount => "over_count",
            HintResult::OverRate => "over_rate",
            HintResult::Refused => "refused",
        }
    }
}

/// One tenant's hint settings and its token bucket of hinted fills.
pub(crate) struct HintBudget {
    config: OriginHintsConfig,
    /// Tokens, and when they were last topped up.
    bucket: Mutex<(f64, Instant)>,
}

impl HintBudget {
    pub(crate) fn new(config: &OriginHintsConfig) -> HintBudget {
        HintBudget {
            config: config.clone(),
            bucket: Mutex::new((config.fills_per_s.max(1.0), Instant::now())),
        }
    }

    fn capacity(&self) -> f64 {
        self.config.fills_per_s.max(1.0)
    }

    /// Whether a hinted fill may start now (a token is there).
    fn has_token(&self) -> bool {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.saturating_duration_since(b.1).as_secs_f64() * self.config.fills_per_s;
        *b = ((b.0 + refill).min(self.capacity()), now);
        b.0 >= 1.0
    }

    fn take_token(&self) {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        b.0 -= 1.0;
    }
}

/// The hint targets of a response's headers, in order: `Link` entries whose `rel`
/// includes `prefetch` or `next`, then `CDN-Origin-Assist-Prefetch-Path` paths.
pub(crate) fn hint_targets(headers: &HeaderMap) -> Vec<String> {
    let mut targets = Vec::new();
    for value in headers.get_all(http::header::LINK) {
        let Ok(value) = value.to_str() else { continue };
        for (target, params) in link_entries(value) {
            if params.iter().any(|(name, v)| {
                name.eq_ignore_ascii_case("rel")
                    && v.split_ascii_whitespace().any(|r| {
                        r.eq_ignore_ascii_case("prefetch") || r.eq_ignore_ascii_case("next")
                    })
            }) {
                targets.push(target);
            }
        }
    }
    for value in headers.get_all(ASSIST_PREFETCH_PATH) {
        let Ok(value) = value.to_str() else { continue };
        targets.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
        );
    }
    targets
}

/// `<target>; name=value; name="quoted, value"` entries of one `Link` field value
/// (RFC 8288 §3); a malformed entry ends the parse.
fn link_entries(value: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        let Some(after) = rest.strip_prefix('<') else {
            return out;
        };
        let Some(end) = after.find('>') else {
            return out;
        };
        let target = after[..end].to_owned();
        rest = &after[end + 1..];
        let mut params = Vec::new();
        loop {
            rest = rest.trim_start_matches([' ', '\t']);
            let Some(after) = rest.strip_prefix(';') else {
                break;
            };
            let after = after.trim_start_matches([' ', '\t']);
            let name_end = after.find(['=', ';', ',']).unwrap_or(after.len());
            let name = after[..name_end].trim().to_owned();
            rest = &after[name_end..];
            let mut v = String::new();
            if let Some(after) = rest.strip_prefix('=') {
                let after = after.trim_start_matches([' ', '\t']);
                if let Some(quoted) = after.strip_prefix('"') {
                    let Some(close) = quoted.find('"') else {
                        out.push((target, params));
                        return out;
                    };
                    v = quoted[..close].to_owned();
                    rest = &quoted[close + 1..];
                } else {
                    let end = after.find([';', ',']).unwrap_or(after.len());
                    v = after[..end].trim().to_owned();
                    rest = &after[end..];
                }
            }
            params.push((name, v));
        }
        out.push((target, params));
    }
}

/// The key a hint `target` names for a response to `base` (a cache key: a path with
/// its query), or why it is refused.
pub(crate) fn resolve(base: &str, target: &str) -> Result<String, HintResult> {
    let target = target.split('#').next().unwrap_or_default();
    if target.starts_with("//") || has_scheme(target) {
        return Err(HintResult::OtherHost);
    }
    if target.is_empty()
        || target
            .chars()
            .any(|c| c.is_control() || c == '\\' || c == ' ')
    {
        return Err(HintResult::BadPath);
    }
    let resolved = if target.starts_with('/') {
        target.to_owned()
    } else {
        let base_path = base.split('?').next().unwrap_or_default();
        let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        format!("{}{target}", if dir.is_empty() { "/" } else { dir })
    };
    let path = resolved.split('?').next().unwrap_or_default();
    let dot = |s: &str| {
        let s = s.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    };
    if path.split('/').any(dot) {
        return Err(HintResult::BadPath);
    }
    if resolved == base {
        return Err(HintResult::Loop);
    }
    Ok(resolved)
}

/// Whether `target` starts with a URI scheme (`http:`, `data:`, …).
fn has_scheme(target: &str) -> bool {
    let head = target.split(['/', '?']).next().unwrap_or_default();
    match head.split_once(':') {
        Some((scheme, _)) => {
            scheme
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

impl Node {
    /// Pre-warms the successors a response to `key` that a user reached names, for
    /// a tenant that opts in (the rules in the module docs).
    pub(super) fn follow_hints(&self, tenant: &TenantId, key: &CacheKey, headers: &HeaderMap) {
        let live = self.live();
        let Some(budget) = live.hints.get(tenant) else {
            return;
        };
        let targets = hint_targets(headers);
        if targets.is_empty() {
            return;
        }
        let count = |result: HintResult, n: u64| self.inner.metrics.origin_hint(result.as_str(), n);
        let max = budget.config.max_per_response;
        if targets.len() > max {
            count(HintResult::OverCount, (targets.len() - max) as u64);
        }
        for target in targets.into_iter().take(max) {
            let resolved = match resolve(key.as_str(), &target) {
                Ok(resolved) => resolved,
                Err(refused) => {
                    count(refused, 1);
                    continue;
                }
            };
            if !budget.has_token() {
                count(HintResult::OverRate, 1);
                continue;
            }
            let Ok(hinted) = CacheKey::new(&resolved) else {
                count(HintResult::BadPath, 1);
                continue;
            };
            match self.prewarm(tenant, hinted) {
                Ok(PrewarmOutcome::Started) => {
                    budget.take_token();
                    count(HintResult::Started, 1);
                }
                Ok(PrewarmOutcome::Cached | PrewarmOutcome::Joined) => count(HintResult::Cached, 1),
                Err(_) => count(HintResult::Refused, 1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    #[test]
    fn link_prefetch_and_next_and_the_assist_header_are_read() {
        let h = headers(&[
            (
                "link",
                r#"<seg2.ts>; rel=prefetch, </style.css>; rel="preload"; as=style, </a,b.js>; rel="next prefetch"; title="x, y""#,
            ),
            ("link", "<seg3.ts>;rel=NEXT"),
            ("cdn-origin-assist-prefetch-path", "/v/seg4.ts, /v/seg5.ts"),
        ]);
        assert_eq!(
            hint_targets(&h),
            ["seg2.ts", "/a,b.js", "seg3.ts", "/v/seg4.ts", "/v/seg5.ts"]
        );
        assert!(hint_targets(&headers(&[("link", "seg2.ts; rel=prefetch")])).is_empty());
    }

    #[test]
    fn targets_resolve_against_the_response_path_and_stay_on_its_origin() {
        assert_eq!(
            resolve("/v/seg1.ts?q=1", "seg2.ts"),
            Ok("/v/seg2.ts".into())
        );
        assert_eq!(
            resolve("/v/seg1.ts", "/w/x.ts?a=b#f"),
            Ok("/w/x.ts?a=b".into())
        );
        assert_eq!(resolve("/v/seg1.ts", "sub/x.ts"), Ok("/v/sub/x.ts".into()));
        for other in [
            "http://evil.example/x",
            "//evil.example/x",
            "https:x",
            "data:,x",
        ] {
            assert_eq!(
                resolve("/v/a", other),
                Err(HintResult::OtherHost),
                "{other}"
            );
        }
        for bad in [
            "../etc/passwd",
            "/v/../x",
            "/v/%2E%2e/x",
            "./x",
            "a\\b",
            "a b",
            "",
        ] {
            assert_eq!(resolve("/v/a", bad), Err(HintResult::BadPath), "{bad:?}");
        }
        assert_eq!(resolve("/v/a.ts", "a.ts"), Err(HintResult::Loop));
        assert_eq!(resolve("/v/a.ts", "/v/a.ts"), Err(HintResult::Loop));
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_holds_one_second_of_fills_and_refills() {
        let b = HintBudget::new(&OriginHintsConfig {
            max_per_response: 4,
            fills_per_s: 2.0,
        });
        for _ in 0..2 {
            assert!(b.has_token());
            b.take_token();
        }
        assert!(!b.has_token(), "two per second");
        tokio::time::advance(std::time::Duration::from_millis(500)).await;
        assert!(b.has_token(), "one more after half a second");
    }
}
