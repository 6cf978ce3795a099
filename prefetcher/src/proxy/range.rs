//! Range requests (RFC 9110 §14) answered by the node: `206 Partial Content` cut
//! from a cached full response or from a fill's streamed body, `multipart/byteranges`
//! for several ranges, `416` with `Content-Range: bytes */len` when none is
//! satisfiable, and `If-Range` (§13.1.5) falling back to the full `200`.
//!
//! A request's `Range` is parsed once ([`RangeRequest::from_request`]); a request
//! without one never reaches this module, so the plain hit path pays nothing for it.
//! A `Range` the node cannot read (another unit, bad syntax, `last < first`) is
//! ignored, as §14.2 allows: the request is a plain `GET`. So is a range set that asks
//! for more bytes than the representation has (overlapping ranges: the amplification
//! §17.15 warns of) or more than [`MAX_RANGES`] ranges.
//!
//! On a miss a range request joins or leads the key's plain-`GET` flight and cuts
//! its answer from the streamed body, when the object is within
//! `cache.max_object_bytes` (its `Content-Length` says so). A larger object, one
//! without a `Content-Length`, or one not shareable, is fetched for the range
//! request by passing it to the origin unchanged (not collapsed, not stored); a key
//! once seen too large is remembered for a while (a [`RecentKeys`](super::recent::RecentKeys)), so later range
//! requests for it go straight to the origin.
//!
//! A `multipart/byteranges` answer is never a copy of the object: it is a body of
//! frames ([`MultipartBody`]), each part's few header bytes then that part's slice
//! of the stored body (or of the fill's chunks), so a client that reads none of it
//! holds a reference to the one stored copy and its part heads, nothing more.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::TryStreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use tokio::time::Instant;

use super::response::{entry_response, with_head};
use crate::cache::Entry;
use crate::flight::{FillError, FlightSubscriber, Head};
use crate::status::CacheStatus;

/// Most ranges one request may ask for; past it the `Range` is ignored (full 200).
pub(super) const MAX_RANGES: usize = 32;

/// One `range-spec` of a `Range: bytes=` header (RFC 9110 §14.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    /// `first-last` or `first-`.
    From { first: u64, last: Option<u64> },
    /// `-suffix_length`: the last `suffix_length` bytes.
    Suffix(u64),
}

/// The `Range` header's specs, or `None` when the header is to be ignored (another
/// range unit, invalid syntax, an `int-range` whose last is below its first).
fn parse_specs(value: &HeaderValue) -> Option<Vec<Spec>> {
    let value = value.to_str().ok()?;
    let (unit, set) = value.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let digits = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // A position past u64 is no byte of any representation: saturate, so it is
        // simply unsatisfiable.
        Some(s.parse().unwrap_or(u64::MAX))
    };
    let mut specs = Vec::new();
    // `1#range-spec`: empty list elements are allowed and skipped (RFC 9110 §5.6.1).
    for spec in set.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (first, last) = spec.split_once('-')?;
        let spec = if first.is_empty() {
            Spec::Suffix(digits(last)?)
        } else {
            let first = digits(first)?;
            let last = if last.is_empty() {
                None
            } else {
                Some(digits(last)?)
            };
            if last.is_some_and(|l| l < first) {
                return None;
            }
            Spec::From { first, last }
        };
        specs.push(spec);
        if specs.len() > MAX_RANGES {
            return None;
        }
    }
    if specs.is_empty() { None } else { Some(specs) }
}

/// The specs against a representation of `len` bytes (RFC 9110 §14.1.2-3).
#[derive(Debug, PartialEq, Eq)]
enum Resolved {
    /// Serve the whole representation (the range set is not worth honouring).
    Full,
    /// No range is satisfiable: 416.
    Unsatisfiable,
    /// The satisfiable ranges, in request order, as inclusive byte positions.
    Ranges(Vec<RangeInclusive<u64>>),
}

fn resolve(specs: &[Spec], len: u64) -> Resolved {
    if len == 0 {
        // Only a suffix range could be satisfied, by zero bytes: a 206 of nothing
        // helps nobody, so the (empty) representation is sent whole.
        return Resolved::Full;
    }
    let ranges: Vec<RangeInclusive<u64>> = specs
        .iter()
        .filter_map(|spec| match *spec {
            Spec::From { first, .. } if first >= len => None,
            Spec::From { first, last } => Some(first..=last.map_or(len - 1, |l| l.min(len - 1))),
            Spec::Suffix(0) => None,
            Spec::Suffix(n) => Some(len.saturating_sub(n)..=len - 1),
        })
        .collect();
    if ranges.is_empty() {
        return Resolved::Unsatisfiable;
    }
    let total: u64 = ranges.iter().map(|r| r.end() - r.start() + 1).sum();
    if ranges.len() > 1 && total > len {
        return Resolved::Full;
    }
    Resolved::Ranges(ranges)
}

/// Whether `If-Range` lets the range be served from a response with `headers`
/// (RFC 9110 §13.1.5): an entity-tag matches only by strong comparison; a date only
/// when it equals `Last-Modified` exactly and that is a strong validator (at least a
/// second before the response's `Date`, §8.8.2.2). Anything else does not match.
fn if_range_matches(if_range: &HeaderValue, headers: &HeaderMap) -> bool {
    let Ok(condition) = if_range.to_str() else {
        return false;
    };
    let condition = condition.trim();
    if condition.starts_with('"') || condition.starts_with("W/") {
        let Some(etag) = headers.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let strong = |tag: &str| tag.len() >= 2 && tag.starts_with('"') && tag.ends_with('"');
        return strong(condition) && strong(etag.trim()) && condition == etag.trim();
    }
    let date = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
    };
    let (Ok(condition), Some(modified), Some(sent)) = (
        httpdate::parse_http_date(condition),
        date(header::LAST_MODIFIED),
        date(header::DATE),
    ) else {
        return false;
    };
    condition == modified && modified + Duration::from_secs(1) <= sent
}

/// A `GET` with a readable `Range`: what it asks for, and the request itself should
/// it have to go to the origin.
pub(super) struct RangeRequest {
    specs: Vec<Spec>,
    if_range: Option<HeaderValue>,
    uri: Uri,
    headers: HeaderMap,
}

impl RangeRequest {
    /// The range request of a `GET` whose `Range` is `range`; `None` when the
    /// `Range` is to be ignored (only `GET` has range semantics, §14.2).
    pub(super) fn from_request(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        range: &HeaderValue,
    ) -> Option<Box<RangeRequest>> {
        if method != Method::GET {
            return None;
        }
        Some(Box::new(RangeRequest {
            specs: parse_specs(range)?,
            if_range: headers.get(header::IF_RANGE).cloned(),
            uri: uri.clone(),
            headers: headers.clone(),
        }))
    }

    /// The request as the client sent it (without a body: a `GET`'s body has no
    /// meaning), for passing to the origin unchanged.
    pub(super) fn to_origin_request(&self) -> axum::extract::Request {
        let mut request = axum::extract::Request::new(Body::empty());
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }

    /// The ranges to serve from a `200` of `len` bytes with `headers`, or `None`
    /// for the full response (`If-Range` failed, or the set is not worth honouring).
    fn select(&self, status: StatusCode, headers: &HeaderMap, len: u64) -> Option<Resolved> {
        if status != StatusCode::OK {
            return None;
        }
        if let Some(condition) = &self.if_range
            && !if_range_matches(condition, headers)
        {
            return None;
        }
        match resolve(&self.specs, len) {
            Resolved::Full => None,
            other => Some(other),
        }
    }

    /// The response to this request from a cached entry: `None` to answer in full.
    pub(super) fn entry_response(
        &self,
        entry: &Entry,
        status: CacheStatus,
        now: Instant,
    ) -> Option<Response> {
        let len = entry.body.len() as u64;
        let resolved = self.select(entry.status, &entry.headers, len)?;
        let mut response = entry_response(entry, status, true, now);
        Some(match resolved {
            Resolved::Ranges(ranges) => {
                let content_type = entry.headers.get(header::CONTENT_TYPE).cloned();
                partial(&mut response, &entry.body, &ranges, content_type);
                response
            }
            _ => unsatisfiable(response, len),
        })
    }

    /// The response to this request from a flight's head: `None` when the flight
    /// cannot give it (no `Content-Length`, or beyond `max_object_bytes`, where the
    /// request goes to the origin itself); `Some(Err(subscriber))` to answer in full.
    pub(super) fn flight_response(
        &self,
        head: &Head,
        subscriber: FlightSubscriber,
        status: CacheStatus,
        max_object_bytes: u64,
    ) -> Option<Result<Response, FlightSubscriber>> {
        let len = super::response::content_length(&head.headers)?;
        if len > max_object_bytes {
            return None;
        }
        let Some(resolved) = self.select(head.status, &head.headers, len) else {
            return Some(Err(subscriber));
        };
        let response = with_head(head, Body::empty(), status);
        Some(Ok(match resolved {
            Resolved::Ranges(ranges) if ranges.len() == 1 => {
                let range = ranges[0].clone();
                let mut response = response;
                set_single_range(response.headers_mut(), &range, len);
                *response.status_mut() = StatusCode::PARTIAL_CONTENT;
                *response.body_mut() = Body::from_stream(cut_stream(subscriber, range));
                response
            }
            Resolved::Ranges(ranges) => {
                // Several ranges of an object within max_object_bytes: wait for it
                // whole, then cut the parts as from the cache. The length is known
                // before the body.
                let content_type = head.headers.get(header::CONTENT_TYPE).cloned();
                let length = multipart_length(&ranges, len, content_type.as_ref());
                let mut response = response;
                *response.status_mut() = StatusCode::PARTIAL_CONTENT;
                let headers = response.headers_mut();
                headers.remove(header::CONTENT_RANGE);
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
                headers.insert(header::CONTENT_TYPE, multipart_type());
                let parts = futures::stream::once(async move {
                    let chunks = collect(subscriber).await?;
                    let body = MultipartBody::new(&chunks, len, &ranges, content_type.as_ref());
                    Ok::<_, FillError>(futures::stream::iter(
                        body.frames.into_iter().map(Ok::<Bytes, FillError>),
                    ))
                });
                *response.body_mut() = Body::from_stream(parts.try_flatten());
                response
            }
            _ => unsatisfiable(response, len),
        }))
    }
}

/// The stream of bytes `range` (inclusive) of a flight's body.
fn cut_stream(
    subscriber: FlightSubscriber,
    range: RangeInclusive<u64>,
) -> impl futures::Stream<Item = Result<Bytes, FillError>> + Send {
    let (start, end) = (*range.start(), *range.end() + 1);
    futures::stream::unfold(
        (subscriber, 0u64),
        move |(mut subscriber, mut offset)| async move {
            loop {
                if offset >= end {
                    return None;
                }
                let chunk = match subscriber.next_chunk().await? {
                    Ok(chunk) => chunk,
                    Err(e) => return Some((Err(e), (subscriber, end))),
                };
                let (from, to) = (offset, offset + chunk.len() as u64);
                offset = to;
                if to <= start {
                    continue;
                }
                let lo = start.saturating_sub(from) as usize;
                let hi = (end.min(to) - from) as usize;
                return Some((Ok(chunk.slice(lo..hi)), (subscriber, offset)));
            }
        },
    )
}

/// A flight's whole body, as the chunks it came in (shared, not copied).
async fn collect(mut subscriber: FlightSubscriber) -> Result<Vec<Bytes>, FillError> {
    let mut chunks = Vec::new();
    while let Some(chunk) = subscriber.next_chunk().await {
        chunks.push(chunk?);
    }
    Ok(chunks)
}

fn set_single_range(headers: &mut HeaderMap, range: &RangeInclusive<u64>, len: u64) {
    let (start, end) = (*range.start(), *range.end());
    headers.insert(
        header::CONTENT_RANGE,
        HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")).expect("ASCII digits"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start + 1));
}

/// The boundary of every `multipart/byteranges` body. RFC 2046 asks that it occur in
/// no part: a fixed 38-character string of this shape is as unlikely in a cached
/// object as a fresh random one, and each part's `Content-Range` states its length.
const BOUNDARY: &str = "edge-pulse-byteranges-7f3c9a51d2e84b06";

fn multipart_type() -> HeaderValue {
    HeaderValue::from_static(concat!(
        "multipart/byteranges; boundary=",
        "edge-pulse-byteranges-7f3c9a51d2e84b06"
    ))
}

fn part_head(range: &RangeInclusive<u64>, len: u64, content_type: Option<&HeaderValue>) -> String {
    let mut head = format!("\r\n--{BOUNDARY}\r\n");
    if let Some(ct) = content_type.and_then(|v| v.to_str().ok()) {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str(&format!(
        "Content-Range: bytes {}-{}/{len}\r\n\r\n",
        range.start(),
        range.end()
    ));
    head
}

fn multipart_length(
    ranges: &[RangeInclusive<u64>],
    len: u64,
    content_type: Option<&HeaderValue>,
) -> u64 {
    let parts: u64 = ranges
        .iter()
        .map(|r| part_head(r, len, content_type).len() as u64 + (r.end() - r.start() + 1))
        .sum();
    parts + format!("\r\n--{BOUNDARY}--\r\n").len() as u64
}

/// Makes `response` a 206 of `ranges` of `body`: one range as itself, several as
/// `multipart/byteranges` (RFC 9110 §14.6) in request order.
fn partial(
    response: &mut Response,
    body: &Bytes,
    ranges: &[RangeInclusive<u64>],
    content_type: Option<HeaderValue>,
) {
    *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    let len = body.len() as u64;
    if let [range] = ranges {
        set_single_range(response.headers_mut(), range, len);
        *response.body_mut() =
            Body::from(body.slice(*range.start() as usize..=*range.end() as usize));
        return;
    }
    let out = MultipartBody::new(
        std::slice::from_ref(body),
        len,
        ranges,
        content_type.as_ref(),
    );
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_RANGE);
    headers.insert(header::CONTENT_TYPE, multipart_type());
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(out.remaining));
    *response.body_mut() = Body::new(out);
}

/// The `multipart/byteranges` body of some ranges of a stored body, in request
/// order, as frames: each part's head, then its slices of the body's chunks
/// (`Bytes::slice`: the stored bytes are shared, never copied), then the closing
/// boundary. Its exact length is known, so it is sent with a `Content-Length`.
struct MultipartBody {
    frames: VecDeque<Bytes>,
    remaining: u64,
}

impl MultipartBody {
    /// The parts of `ranges` of the body made of `chunks` (`len` bytes in all).
    fn new(
        chunks: &[Bytes],
        len: u64,
        ranges: &[RangeInclusive<u64>],
        content_type: Option<&HeaderValue>,
    ) -> MultipartBody {
        let mut frames = VecDeque::with_capacity(ranges.len() * 2 + 1);
        for range in ranges {
            frames.push_back(Bytes::from(part_head(range, len, content_type)));
            frames.extend(slices(chunks, range));
        }
        frames.push_back(Bytes::from(format!("\r\n--{BOUNDARY}--\r\n")));
        let remaining = frames.iter().map(|f| f.len() as u64).sum();
        MultipartBody { frames, remaining }
    }
}

/// The slices of `chunks` (one body, in order) that make bytes `range` of it.
fn slices<'a>(
    chunks: &'a [Bytes],
    range: &RangeInclusive<u64>,
) -> impl Iterator<Item = Bytes> + 'a {
    let (start, end) = (*range.start(), *range.end() + 1);
    let mut offset = 0u64;
    chunks.iter().filter_map(move |chunk| {
        let (from, to) = (offset, offset + chunk.len() as u64);
        offset = to;
        if to <= start || from >= end {
            return None;
        }
        let lo = start.saturating_sub(from) as usize;
        let hi = (end.min(to) - from) as usize;
        Some(chunk.slice(lo..hi))
    })
}

impl http_body::Body for MultipartBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let frame = self.frames.pop_front();
        if let Some(frame) = &frame {
            self.remaining -= frame.len() as u64;
        }
        Poll::Ready(frame.map(|f| Ok(http_body::Frame::data(f))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// `response` made a 416 for a representation of `len` bytes (RFC 9110 §15.5.17).
fn unsatisfiable(mut response: Response, len: u64) -> Response {
    *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_RANGE,
        HeaderValue::from_str(&format!("bytes */{len}")).expect("ASCII digits"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0u32));
    headers.remove(header::CONTENT_TYPE);
    *response.body_mut() = Body::empty();
    response
}

/// Marks a stored `200` as one the node serves ranges of.
pub(super) fn advertise(status: StatusCode, headers: &mut HeaderMap) {
    if status == StatusCode::OK {
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(v: &str) -> Option<Vec<Spec>> {
        parse_specs(&HeaderValue::from_str(v).unwrap())
    }

    fn ranges(v: &str, len: u64) -> Resolved {
        resolve(&specs(v).expect("valid"), len)
    }

    #[test]
    fn range_syntax_follows_rfc_9110_14_1_1_and_bad_syntax_is_ignored() {
        assert_eq!(
            specs("bytes=0-499"),
            Some(vec![Spec::From {
                first: 0,
                last: Some(499)
            }])
        );
        assert_eq!(
            specs("Bytes = 9500-, -500 ,"),
            Some(vec![
                Spec::From {
                    first: 9500,
                    last: None
                },
                Spec::Suffix(500)
            ])
        );
        for bad in [
            "bytes=5-4",
            "bytes=",
            "bytes=-",
            "bytes=a-b",
            "bytes=1-2-3",
            "items=0-1",
            "bytes 0-1",
            "bytes=+1-2",
            "bytes=0x1-2",
        ] {
            assert_eq!(specs(bad), None, "{bad}");
        }
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(specs(&many), None);
    }

    #[test]
    fn ranges_resolve_against_the_length_as_rfc_9110_14_1_2_says() {
        assert_eq!(
            ranges("bytes=0-499", 10_000),
            Resolved::Ranges(vec![0..=499])
        );
        assert_eq!(
            ranges("bytes=9500-", 10_000),
            Resolved::Ranges(vec![9500..=9999])
        );
        assert_eq!(
            ranges("bytes=-500", 10_000),
            Resolved::Ranges(vec![9500..=9999])
        );
        // A last-pos past the end is clipped; a suffix longer than the whole, too.
        assert_eq!(
            ranges("bytes=9000-20000", 10_000),
            Resolved::Ranges(vec![9000..=9999])
        );
        assert_eq!(ranges("bytes=-20000", 100), Resolved::Ranges(vec![0..=99]));
        assert_eq!(ranges("bytes=10000-", 10_000), Resolved::Unsatisfiable);
        assert_eq!(ranges("bytes=-0", 10_000), Resolved::Unsatisfiable);
        // Unsatisfiable specs are dropped from a set with a satisfiable one.
        assert_eq!(
            ranges("bytes=20000-,0-0,-1", 10_000),
            Resolved::Ranges(vec![0..=0, 9999..=9999])
        );
        // More bytes than the representation (overlap): served whole.
        assert_eq!(ranges("bytes=0-,0-", 10), Resolved::Full);
        assert_eq!(ranges("bytes=0-", 0), Resolved::Full);
        assert_eq!(
            ranges("bytes=18446744073709551616-", 10),
            Resolved::Unsatisfiable
        );
    }

    #[test]
    fn if_range_needs_a_strong_match_per_rfc_9110_13_1_5() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        headers.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Dec 2026 00:00:00 GMT"),
        );
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Dec 2026 00:10:00 GMT"),
        );
        let m = |v: &str, h: &HeaderMap| if_range_matches(&HeaderValue::from_str(v).unwrap(), h);
        assert!(m("\"v1\"", &headers));
        assert!(!m("\"v2\"", &headers));
        assert!(!m("W/\"v1\"", &headers));
        assert!(m("Tue, 01 Dec 2026 00:00:00 GMT", &headers));
        assert!(!m("Tue, 01 Dec 2026 00:00:01 GMT", &headers));
        assert!(!m("not a date", &headers));
        // A weak stored ETag never matches; a Last-Modified as late as Date is weak.
        headers.insert(header::ETAG, HeaderValue::from_static("W/\"v1\""));
        assert!(!m("\"v1\"", &headers));
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Dec 2026 00:00:00 GMT"),
        );
        assert!(!m("Tue, 01 Dec 2026 00:00:00 GMT", &headers));
    }

    #[tokio::test]
    async fn a_range_is_cut_across_the_chunks_of_a_streamed_body() {
        use futures::StreamExt;
        use models::{CacheKey, Priority, TenantId};

        use crate::flight::{Acquire, FlightKey, FlightRegistry};

        let registry = FlightRegistry::new(8);
        let key = FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new("/a").unwrap());
        let Acquire::Lead(permit) = registry.acquire(&key, Priority::User) else {
            panic!("the first request leads");
        };
        let subscribers: Vec<_> = (0..5).map(|_| permit.subscribe()).collect();
        permit.publish_head(Head::new(StatusCode::OK, HeaderMap::new()));
        for chunk in ["0123", "4567", "89"] {
            permit.push_chunk(Bytes::from_static(chunk.as_bytes()));
        }
        permit.complete(|| {});
        let mut got = Vec::new();
        for (subscriber, range) in subscribers
            .into_iter()
            .zip([0..=9, 2..=5, 4..=7, 9..=9, 3..=3])
        {
            let parts: Vec<Bytes> = cut_stream(subscriber, range)
                .map(|c| c.unwrap())
                .collect()
                .await;
            got.push(parts.concat());
        }
        let want: [&[u8]; 5] = [b"0123456789", b"2345", b"4567", b"9", b"3"];
        assert_eq!(got, want);
    }

    #[test]
    fn several_ranges_make_a_multipart_body_of_the_stated_length() {
        let body = Bytes::from_static(b"0123456789");
        let mut response = Response::new(Body::empty());
        let ct = HeaderValue::from_static("text/plain");
        partial(&mut response, &body, &[7..=9, 0..=1], Some(ct.clone()));
        assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
        let length: u64 = response.headers()[header::CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, multipart_length(&[7..=9, 0..=1], 10, Some(&ct)));
        let Some(bytes) = http_body::Body::size_hint(response.body()).exact() else {
            panic!("a sized body");
        };
        assert_eq!(bytes, length);
    }

    #[tokio::test]
    async fn several_ranges_are_sent_as_slices_of_the_stored_body_never_a_copy() {
        use http_body_util::BodyExt;

        let stored = Bytes::from(vec![7u8; 1 << 20]);
        let inside = |f: &Bytes| {
            let base = stored.as_ptr() as usize;
            let at = f.as_ptr() as usize;
            at >= base && at + f.len() <= base + stored.len()
        };
        let ranges = [0..=524_287, 600_000..=1_048_575];
        let mut response = Response::new(Body::empty());
        partial(&mut response, &stored, &ranges, None);
        let mut body = response.into_body();
        let mut from_stored = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            if inside(&data) {
                from_stored += data.len();
            } else {
                assert!(data.len() < 200, "only part heads are made: {}", data.len());
            }
        }
        assert_eq!(from_stored, 524_288 + 448_576);

        // From a fill's chunks: a range across two chunks is two slices.
        let chunks = [stored.slice(..1000), stored.slice(1000..3000)];
        let got: Vec<Bytes> = slices(&chunks, &(500..=1499)).collect();
        assert_eq!(got.iter().map(Bytes::len).collect::<Vec<_>>(), [500, 500]);
        assert!(got.iter().all(inside));
    }
}
