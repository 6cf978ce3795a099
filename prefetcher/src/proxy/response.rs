//! Building responses: from a cached entry (hit, stale, prefetched), from a flight's
//! head (miss, collapsed), and errors; each states its `Age` and `x-cache`.

use std::sync::OnceLock;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use tokio::time::Instant;

use crate::cache::{Entry, origin_age};
use crate::flight::{FillError, FlightSubscriber, Head};
use crate::status::{CacheStatus, X_CACHE, X_CACHE_NAME};

pub(super) fn error_response(
    code: StatusCode,
    status: Option<CacheStatus>,
    message: &str,
) -> Response {
    let mut response = Response::new(Body::from(format!("{message}\n")));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    // Errors are never cached, here or by a node in front of this one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(s) = status {
        headers.insert(X_CACHE, HeaderValue::from_static(s.as_str()));
    }
    response
}

/// The response for a failed fill; an overloaded origin adds `Retry-After`.
pub(super) fn fill_error_response(error: &FillError, status: CacheStatus) -> Response {
    let mut response = error_response(error.status(), Some(status), &error.to_string());
    if let FillError::Overloaded { retry_after_s } = error {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
    }
    response
}

/// The 429 for a request that would lead a fill past its connection's or address's
/// bound (`limit`, counted): it starts no fill; a second later it may.
pub(super) fn lead_refused(limit: crate::status::ClientLimit) -> Response {
    let mut response = error_response(
        StatusCode::TOO_MANY_REQUESTS,
        Some(CacheStatus::Miss),
        &format!(
            "too many origin fills from this client ({})",
            limit.as_str()
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
    response
}

pub(super) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The head of an origin response as this node passes it on: the origin's `Age`
/// is taken out and remembered, so every response from it states its own, and this
/// hop is added to `Via` (RFC 9110 §7.6.3; stored with the entry, so a hit pays
/// nothing for it).
pub(super) fn origin_head(status: StatusCode, mut headers: http::HeaderMap) -> Head {
    let initial_age = origin_age(&headers);
    headers.remove(header::AGE);
    crate::semantics::add_via(&mut headers, http::Version::HTTP_11);
    Head {
        status,
        headers,
        fetched_at: Instant::now(),
        initial_age,
        vary: None,
    }
}

/// A `304 Not Modified` for a client whose validators match `entry` (RFC 9110
/// §15.4.5): the fields a `200` would repeat, `x-cache` and `Age`, no body.
pub(super) fn not_modified_response(entry: &Entry, status: CacheStatus, now: Instant) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NOT_MODIFIED;
    let headers = response.headers_mut();
    *headers = crate::semantics::not_modified_headers(&entry.headers);
    headers.insert(X_CACHE, HeaderValue::from_static(status.as_str()));
    headers.insert(header::AGE, age_value(entry.age(now)));
    response
}

/// The `Age` header value for `secs`. Values up to an hour are made once and shared
/// (static bytes: cloning one neither allocates nor touches a reference count), so a
/// hit does not allocate for its `Age`.
fn age_value(secs: u64) -> HeaderValue {
    const SHARED: u64 = 3600;
    static TABLE: OnceLock<Box<[HeaderValue]>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=SHARED)
            .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
            .collect()
    });
    match usize::try_from(secs).ok().and_then(|i| table.get(i)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(secs),
    }
}

/// A response from a flight's head. A response served from the cache (`COLLAPSED`,
/// or a leader answered from an entry stored meanwhile) carries its `Age`; a fresh
/// `MISS` carries only the origin's, if it sent one.
pub(super) fn with_head(head: &Head, body: Body, status: CacheStatus) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    let headers = response.headers_mut();
    *headers = head.headers.clone();
    headers.insert(X_CACHE, HeaderValue::from_static(status.as_str()));
    let age = head.age(Instant::now());
    if status == CacheStatus::Miss && age == 0 {
        headers.remove(header::AGE);
    } else {
        headers.insert(header::AGE, age_value(age));
    }
    response
}

pub(super) fn flight_response(
    head: &Head,
    subscriber: FlightSubscriber,
    status: CacheStatus,
    head_only: bool,
) -> Response {
    let body = if head_only {
        Body::empty()
    } else {
        // An error from the flight aborts the client's response: a truncated body is
        // never presented as complete.
        Body::from_stream(futures::stream::unfold(subscriber, |mut s| async move {
            s.next_chunk().await.map(|chunk| (chunk, s))
        }))
    };
    with_head(head, body, status)
}

/// A response from a cached entry at `now`: one clone of the entry's prebuilt header
/// map, whose `x-cache` and `Age` slots are overwritten in place.
pub(super) fn entry_response(
    entry: &Entry,
    status: CacheStatus,
    head_only: bool,
    now: Instant,
) -> Response {
    let body = if head_only {
        Body::empty()
    } else {
        Body::from(entry.body.clone())
    };
    let mut response = Response::new(body);
    *response.status_mut() = entry.status;
    let headers = response.headers_mut();
    *headers = entry.headers.clone();
    set_slot(
        headers,
        &X_CACHE_NAME,
        HeaderValue::from_static(status.as_str()),
    );
    set_slot(headers, &header::AGE, age_value(entry.age(now)));
    response
}

/// Overwrites a header the map already holds without `insert`'s capacity check,
/// which grows (reallocates and copies) a cloned map that is exactly full even when
/// the name is present; inserts it otherwise.
fn set_slot(headers: &mut http::HeaderMap, name: &http::HeaderName, value: HeaderValue) {
    match headers.get_mut(name) {
        Some(slot) => *slot = value,
        None => {
            headers.insert(name.clone(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn cached_responses_state_their_age_and_status() {
        let mut origin = http::HeaderMap::new();
        origin.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        origin.insert(header::AGE, HeaderValue::from_static("7"));
        let head = origin_head(StatusCode::OK, origin);
        assert_eq!(head.initial_age, 7);
        let entry = Entry::new(
            StatusCode::OK,
            head.headers.clone(),
            Bytes::from_static(b"body"),
            std::time::Duration::from_secs(60),
            std::time::Duration::ZERO,
            std::time::Duration::from_millis(1),
            false,
        )
        .with_age(head.fetched_at, head.initial_age);
        let at = |secs| head.fetched_at + std::time::Duration::from_secs(secs);
        for (status, secs, age) in [
            (CacheStatus::Hit, 0, "7"),
            (CacheStatus::Stale, 3, "10"),
            (CacheStatus::Prefetched, 5_000, "5007"),
        ] {
            let response = entry_response(&entry, status, false, at(secs));
            let h = response.headers();
            let ages: Vec<_> = h.get_all(header::AGE).iter().collect();
            assert_eq!(ages, [age], "{status:?}");
            assert_eq!(h.get(X_CACHE).unwrap(), status.as_str());
            assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "text/plain");
            assert_eq!(h.get(header::VIA).unwrap(), "1.1 edge-pulse");
            assert_eq!(h.len(), 4);
        }

        // From a flight: a waiter's response is served from the node (Age from the
        // fetch); a leader's fresh MISS passes on only the origin's Age.
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        let collapsed = with_head(&head, Body::empty(), CacheStatus::Collapsed);
        assert_eq!(collapsed.headers().get(header::AGE).unwrap(), "9");
        let fresh = origin_head(StatusCode::OK, http::HeaderMap::new());
        let miss = with_head(&fresh, Body::empty(), CacheStatus::Miss);
        assert!(miss.headers().get(header::AGE).is_none());
        assert_eq!(miss.headers().get(X_CACHE).unwrap(), "MISS");
        let collapsed = with_head(&fresh, Body::empty(), CacheStatus::Collapsed);
        assert_eq!(collapsed.headers().get(header::AGE).unwrap(), "0");
        // A leader answered from an entry stored meanwhile: its Age, not a stale slot.
        let stored = Head {
            status: entry.status,
            headers: entry.headers.clone(),
            fetched_at: entry.fetched_at(),
            initial_age: 0,
            vary: None,
        };
        let miss = with_head(&stored, Body::empty(), CacheStatus::Miss);
        assert_eq!(miss.headers().get(header::AGE).unwrap(), "2");
        assert_eq!(miss.headers().get(X_CACHE).unwrap(), "MISS");
    }
}
