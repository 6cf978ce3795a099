//! What an origin response may be stored for ([`classify`]: RFC 9111 freshness,
//! explicit or heuristic, with jitter and the stale windows) and when a fresh entry
//! is refreshed early ([`xfetch_due`]).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header};

use super::entry::{Freshness, origin_age};
use crate::config::CacheConfig;
use crate::semantics::{ResponseDirectives, Vary};

/// XFetch (Vattani et al.): refresh early when `fill · β · −ln(u) ≥ time left`, so
/// the chance rises as expiry nears and with slower fills; `u` is uniform in [0, 1).
pub fn xfetch_due(fill: Duration, remaining: Duration, beta: f64, u: f64) -> bool {
    let u = u.clamp(f64::MIN_POSITIVE, 1.0);
    fill.as_secs_f64() * beta * -u.ln() >= remaining.as_secs_f64()
}

/// What may be done with an origin response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Storability {
    /// Store it with these windows.
    Store(Freshness),
    /// Give it to the requests already waiting on this fill, but do not store it.
    ShareOnly,
    /// Per-user (`private`, `no-store`, `Set-Cookie`, `Vary: *`): only the leader's
    /// client gets it; waiters fetch on their own.
    Private,
}

/// Statuses heuristically cacheable (RFC 9110 §15.1), less 206 (ranges are not
/// stored here), 405, 414 and 501 (rare and cheap to ask again).
fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 410
    )
}

/// Statuses this cache stores when the origin gives them explicit freshness
/// (RFC 9111 §3: a status the cache understands); redirects that are not
/// heuristically cacheable need `max-age` or `Expires`.
fn storable_with_explicit_freshness(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 307)
}

/// The share of a response's `Last-Modified` age used as heuristic freshness
/// (RFC 9111 §4.2.2 suggests 10 %), and its cap.
const HEURISTIC_FRACTION: f64 = 0.1;
const HEURISTIC_MAX: Duration = Duration::from_secs(24 * 3600);

/// Decides what to do with an origin response. A 5xx is stored only with explicit
/// freshness and `config.store_errors` on (never heuristically); the per-user check
/// comes first, whatever the status. `u` is a uniform draw in [0, 1) for the jitter.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    config: &CacheConfig,
    now: SystemTime,
    u: f64,
) -> Storability {
    // Set-Cookie responses are per user in practice, whatever the RFC allows.
    if headers.contains_key(header::SET_COOKIE) {
        return Storability::Private;
    }
    let d = ResponseDirectives::parse(headers);
    if d.private || d.no_store || Vary::parse(headers) == Vary::Any {
        return Storability::Private;
    }
    let explicit = match d.s_maxage.or(d.max_age) {
        Some(secs) => Some(Duration::from_secs(secs)),
        None if d.targeted => None,
        None => expires_ttl(headers, now),
    };
    let storable = if explicit.is_some() {
        storable_with_explicit_freshness(status)
            || (status.is_server_error() && config.store_errors)
    } else {
        heuristically_cacheable(status) || (d.public && storable_with_explicit_freshness(status))
    };
    if !storable || (status.is_server_error() && !config.store_errors) {
        return Storability::ShareOnly;
    }
    let jitter = config.jitter;
    let ttl = match explicit {
        // The origin's lifetime is a ceiling: jitter may only shorten it.
        Some(t) => t.mul_f64(1.0 - jitter * u),
        // Silent origin: the configured default, if the operator set one ...
        None if config.default_ttl_ms > 0 => {
            Duration::from_millis(config.default_ttl_ms).mul_f64(1.0 + jitter * (2.0 * u - 1.0))
        }
        // ... else a share of the time since the last modification (RFC 9111 §4.2.2).
        None => heuristic_ttl(headers, now),
    };
    // The lifetime runs from the origin's response: time it already spent in a
    // cache upstream (its `Age`) is used up, and so is that much of the stale windows
    // once it is past the lifetime.
    let age = Duration::from_secs(origin_age(headers));
    let ttl = if d.no_cache { Duration::ZERO } else { ttl };
    let overdue = age.saturating_sub(ttl);
    let ttl = ttl.saturating_sub(age);
    let validators =
        headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED);
    let config_grace = Duration::from_millis(config.stale_grace_ms);
    let (grace, if_error) = if d.forbids_stale() {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (
            d.stale_while_revalidate
                .map_or(config_grace, Duration::from_secs)
                .saturating_sub(overdue),
            d.stale_if_error
                .map_or(config_grace, Duration::from_secs)
                .saturating_sub(overdue),
        )
    };
    let keep = if validators {
        Duration::from_millis(config.keep_for_revalidation_ms)
    } else {
        Duration::ZERO
    };
    if ttl.is_zero() && grace.is_zero() && if_error.is_zero() && !validators {
        // Nothing this cache could ever do with it.
        return Storability::ShareOnly;
    }
    Storability::Store(Freshness {
        ttl,
        grace,
        if_error,
        keep,
    })
}

fn http_date(headers: &HeaderMap, name: header::HeaderName) -> Option<SystemTime> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
}

fn expires_ttl(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if !headers.contains_key(header::EXPIRES) {
        return None;
    }
    // An unparsable Expires means "already expired" (RFC 9111 §5.3).
    let Some(expires) = http_date(headers, header::EXPIRES) else {
        return Some(Duration::ZERO);
    };
    let date = http_date(headers, header::DATE).unwrap_or(now);
    Some(expires.duration_since(date).unwrap_or(Duration::ZERO))
}

fn heuristic_ttl(headers: &HeaderMap, now: SystemTime) -> Duration {
    let Some(modified) = http_date(headers, header::LAST_MODIFIED) else {
        return Duration::ZERO;
    };
    let date = http_date(headers, header::DATE).unwrap_or(now);
    date.duration_since(modified)
        .unwrap_or(Duration::ZERO)
        .mul_f64(HEURISTIC_FRACTION)
        .min(HEURISTIC_MAX)
}
