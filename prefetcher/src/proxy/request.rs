//! A client request's path: request limits, tenant routing by host, the cache
//! lookup, then leading, joining or bypassing the key's fill.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, Uri, header};
use models::{CacheKey, Domain, IdError, Priority};
use tokio::time::Instant;

use super::range::RangeRequest;
use super::response::{
    content_length, entry_response, error_response, fill_error_response, flight_response,
    origin_head, with_head,
};
use super::{Node, millis};
use crate::cache::{Entry, Lookup};
use crate::config::{RequestLimits, WaitTimeoutPolicy};
use crate::events::{OutcomeRecord, unix_now_ms};
use crate::flight::{Acquire, FillError, FlightKey, FlightSubscriber, HeadOutcome};
use crate::origin::{Tenant, strip_hop_by_hop};
use crate::status::{CacheStatus, X_CACHE};

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

/// The 414, 431 or 413 for a request past `limits`, checked before any other work;
/// `None` when it fits.
fn over_limits(request: &Request, limits: &RequestLimits) -> Option<Response> {
    let uri = request.uri();
    let uri_bytes = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.scheme_str().map_or(0, |s| s.len() + 3);
    if uri_bytes > limits.max_uri_bytes {
        return Some(error_response(
            StatusCode::URI_TOO_LONG,
            None,
            &format!("request target longer than {} bytes", limits.max_uri_bytes),
        ));
    }
    // Counted as HTTP/2 does (name + value + 32 per field), for both protocols.
    let header_bytes: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    if header_bytes > limits.max_header_bytes {
        return Some(error_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            None,
            &format!("headers larger than {} bytes", limits.max_header_bytes),
        ));
    }
    if content_length(request.headers()).is_some_and(|n| n > limits.max_body_bytes) {
        return Some(error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
            &format!("body larger than {} bytes", limits.max_body_bytes),
        ));
    }
    None
}

fn referrer_domain(request: &Request) -> Option<Domain> {
    let referer = request.headers().get(header::REFERER)?.to_str().ok()?;
    let uri: Uri = referer.parse().ok()?;
    Domain::new(uri.host()?.to_ascii_lowercase()).ok()
}

/// Per-request context carried through the miss path.
struct Ctx {
    tenant: Arc<Tenant>,
    key: FlightKey,
    head_only: bool,
    referrer: Option<Domain>,
    /// A `GET` with a `Range` the node can serve (`None` for every other request).
    range: Option<Box<RangeRequest>>,
}

/// What a range request makes of a flight's head.
enum FromFlight {
    /// Its 206 or 416.
    Answer(Response),
    /// The full response (no range asked, `If-Range` failed, range set ignored).
    Full(FlightSubscriber),
    /// The flight cannot give it: the range request goes to the origin itself.
    Origin,
}

/// The exact length of a response body built by the node.
fn body_len(response: &Response) -> u64 {
    http_body::Body::size_hint(response.body())
        .exact()
        .unwrap_or(0)
}

impl Node {
    /// The tenant selected by the request's host, from configuration only.
    fn tenant_for(&self, request: &Request) -> Option<Arc<Tenant>> {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().host());
        if let Some(host) = host {
            let name = host.rsplit_once(':').map_or(host, |(name, port)| {
                if port.bytes().all(|b| b.is_ascii_digit()) {
                    name
                } else {
                    host
                }
            });
            let found = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                self.inner.by_host.get(&name.to_ascii_lowercase())
            } else {
                self.inner.by_host.get(name)
            };
            if let Some(t) = found {
                return Some(Arc::clone(t));
            }
        }
        self.inner.fallback.clone()
    }

    /// Answers one client request.
    pub async fn handle(&self, request: Request) -> Response {
        if let Some(response) = over_limits(&request, &self.inner.config.limits) {
            return response;
        }
        let Some(tenant) = self.tenant_for(&request) else {
            return error_response(StatusCode::MISDIRECTED_REQUEST, None, "unknown host");
        };
        let method = request.method();
        let cacheable_method = method == Method::GET || method == Method::HEAD;
        let headers = request.headers();
        // Credentials make a response per-user.
        let per_user =
            headers.contains_key(header::AUTHORIZATION) || headers.contains_key(header::COOKIE);
        if !cacheable_method || per_user {
            return self.pass_through(&tenant, request).await;
        }
        let key = match normalise_key(request.uri()) {
            Ok(k) => k,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, None, &e.to_string()),
        };
        let ctx = Ctx {
            head_only: request.method() == Method::HEAD,
            referrer: if self.inner.sink.enabled() {
                referrer_domain(&request)
            } else {
                None
            },
            key: FlightKey::new(tenant.id.clone(), key),
            tenant,
            range: match request.headers().get(header::RANGE) {
                None => None,
                Some(range) => RangeRequest::from_request(
                    request.method(),
                    request.uri(),
                    request.headers(),
                    range,
                ),
            },
        };
        match self.inner.cache.lookup(&ctx.key) {
            Lookup::Fresh {
                entry,
                refresh_early,
            } => {
                if refresh_early {
                    self.refresh(&ctx, true);
                }
                let status = if entry.take_prefetched() {
                    self.inner.metrics.prefetches_useful.inc();
                    CacheStatus::Prefetched
                } else {
                    CacheStatus::Hit
                };
                self.cached(&ctx, &entry, status)
            }
            Lookup::Stale(entry) => {
                self.refresh(&ctx, false);
                self.cached(&ctx, &entry, CacheStatus::Stale)
            }
            Lookup::Miss => self.miss(ctx).await,
        }
    }

    /// The response from a cached entry: the whole of it, or the ranges asked for.
    fn cached(&self, ctx: &Ctx, entry: &Entry, status: CacheStatus) -> Response {
        let now = Instant::now();
        if let Some(range) = &ctx.range
            && let Some(response) = range.entry_response(entry, status, now)
        {
            self.answered(ctx, status, body_len(&response), None);
            return response;
        }
        self.answered(ctx, status, entry.body.len() as u64, None);
        entry_response(entry, status, ctx.head_only, now)
    }

    /// What `ctx`'s range request (if any) makes of a flight's `head`.
    fn range_of_flight(
        &self,
        ctx: &Ctx,
        head: &crate::flight::Head,
        subscriber: FlightSubscriber,
        status: CacheStatus,
    ) -> FromFlight {
        let Some(range) = &ctx.range else {
            return FromFlight::Full(subscriber);
        };
        let max = self.inner.config.cache.max_object_bytes;
        match range.flight_response(head, subscriber, status, max) {
            Some(Ok(response)) => FromFlight::Answer(response),
            Some(Err(subscriber)) => FromFlight::Full(subscriber),
            None => FromFlight::Origin,
        }
    }

    /// A range request the cache cannot serve, passed to the origin unchanged.
    async fn range_to_origin(&self, ctx: &Ctx, range: &RangeRequest) -> Response {
        self.pass_through(&ctx.tenant, range.to_origin_request())
            .await
    }

    fn answered(&self, ctx: &Ctx, status: CacheStatus, bytes: u64, fill_ms: Option<u32>) {
        self.inner.metrics.request(status);
        if !self.inner.sink.enabled() {
            return;
        }
        if let Some(outcome) = status.outcome() {
            self.emit(OutcomeRecord {
                ts_ms: unix_now_ms(),
                tenant: ctx.key.tenant().clone(),
                key: ctx.key.key().clone(),
                outcome,
                bytes: if ctx.head_only { 0 } else { bytes },
                fill_ms,
                referrer: ctx.referrer.clone(),
            });
        }
    }

    /// Starts one background refresh unless a fill for the key is already in flight.
    fn refresh(&self, ctx: &Ctx, force: bool) {
        if let Some(permit) = self.inner.registry.try_lead(&ctx.key, Priority::User) {
            self.spawn_fill(permit, Arc::clone(&ctx.tenant), force);
        }
    }

    async fn miss(&self, ctx: Ctx) -> Response {
        if let Some(range) = &ctx.range
            && self.inner.too_large.contains(&ctx.key)
        {
            return self.range_to_origin(&ctx, range).await;
        }
        if !self.inner.config.flight.collapse {
            let permit = self.inner.registry.lead_alone(&ctx.key, Priority::User);
            let subscriber = permit.subscribe();
            self.spawn_fill(permit, Arc::clone(&ctx.tenant), false);
            return self.lead(subscriber, &ctx).await;
        }
        for _ in 0..3 {
            match self.inner.registry.acquire(&ctx.key, Priority::User) {
                Acquire::Full => {
                    self.inner.metrics.request(CacheStatus::Miss);
                    let mut response = error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Some(CacheStatus::Miss),
                        "too many fills in flight",
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
                    return response;
                }
                Acquire::Lead(permit) => {
                    let subscriber = permit.subscribe();
                    self.spawn_fill(permit, Arc::clone(&ctx.tenant), false);
                    return self.lead(subscriber, &ctx).await;
                }
                Acquire::Join(subscriber) => {
                    self.inner.metrics.waiters_joined.inc();
                    if let Some(response) = self.wait(subscriber, &ctx).await {
                        return response;
                    }
                    // The fill aborted before any byte: try to take over leadership.
                }
            }
        }
        error_response(
            StatusCode::BAD_GATEWAY,
            Some(CacheStatus::Collapsed),
            "origin fill aborted",
        )
    }

    async fn lead(&self, mut subscriber: FlightSubscriber, ctx: &Ctx) -> Response {
        let started = Instant::now();
        match subscriber.head().await {
            HeadOutcome::Head(head) => {
                let fill_ms = millis(started.elapsed());
                let subscriber =
                    match self.range_of_flight(ctx, &head, subscriber, CacheStatus::Miss) {
                        FromFlight::Full(subscriber) => subscriber,
                        FromFlight::Answer(response) => {
                            self.answered(
                                ctx,
                                CacheStatus::Miss,
                                body_len(&response),
                                Some(fill_ms),
                            );
                            return response;
                        }
                        FromFlight::Origin => return self.direct(ctx).await,
                    };
                let bytes = content_length(&head.headers).unwrap_or(0);
                self.answered(ctx, CacheStatus::Miss, bytes, Some(fill_ms));
                flight_response(&head, subscriber, CacheStatus::Miss, ctx.head_only)
            }
            HeadOutcome::Bypass(Some((head, body))) => {
                let bytes = content_length(&head.headers).unwrap_or(0);
                if bytes > self.inner.config.cache.max_object_bytes {
                    self.inner.too_large.remember(&ctx.key);
                }
                if ctx.range.is_some() {
                    // The whole object, too large to share: the range goes to the
                    // origin instead (dropping `body` closes that fetch).
                    return self.direct(ctx).await;
                }
                self.answered(
                    ctx,
                    CacheStatus::Miss,
                    bytes,
                    Some(millis(started.elapsed())),
                );
                let body = if ctx.head_only { Body::empty() } else { body };
                with_head(&head, body, CacheStatus::Miss)
            }
            HeadOutcome::Bypass(None) => self.direct(ctx).await,
            HeadOutcome::Failed(e) => {
                self.inner.metrics.request(CacheStatus::Miss);
                fill_error_response(&e, CacheStatus::Miss)
            }
        }
    }

    /// A waiter: bounded wait for the head, then share, hedge or fail. `None` means
    /// the fill aborted before any byte and the caller may lead a new one.
    async fn wait(&self, mut subscriber: FlightSubscriber, ctx: &Ctx) -> Option<Response> {
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(self.inner.config.wait_timeout(), subscriber.head()).await;
        let waited = started.elapsed();
        self.inner
            .metrics
            .wait_seconds
            .observe(waited.as_secs_f64());
        match outcome {
            Err(_) => {
                self.inner.metrics.wait_timeouts.inc();
                match self.inner.config.flight.on_wait_timeout {
                    WaitTimeoutPolicy::Hedge => {
                        self.inner.metrics.hedges.inc();
                        Some(self.direct(ctx).await)
                    }
                    WaitTimeoutPolicy::Fail => {
                        self.inner.metrics.request(CacheStatus::Collapsed);
                        Some(error_response(
                            StatusCode::GATEWAY_TIMEOUT,
                            Some(CacheStatus::Collapsed),
                            "timed out waiting for the origin fill",
                        ))
                    }
                }
            }
            Ok(HeadOutcome::Head(head)) => {
                let status = CacheStatus::Collapsed;
                let subscriber = match self.range_of_flight(ctx, &head, subscriber, status) {
                    FromFlight::Full(subscriber) => subscriber,
                    FromFlight::Answer(response) => {
                        self.answered(ctx, status, body_len(&response), Some(millis(waited)));
                        return Some(response);
                    }
                    FromFlight::Origin => return Some(self.direct(ctx).await),
                };
                let bytes = content_length(&head.headers).unwrap_or(0);
                self.answered(ctx, CacheStatus::Collapsed, bytes, Some(millis(waited)));
                Some(flight_response(
                    &head,
                    subscriber,
                    CacheStatus::Collapsed,
                    ctx.head_only,
                ))
            }
            Ok(HeadOutcome::Bypass(_)) => Some(self.direct(ctx).await),
            // An aborted fill, or a prefetch shed just before this request could
            // promote it: lead a fresh fill at user priority.
            Ok(HeadOutcome::Failed(FillError::Aborted | FillError::NoCapacity)) => None,
            Ok(HeadOutcome::Failed(e)) => {
                self.inner.metrics.request(CacheStatus::Collapsed);
                Some(fill_error_response(&e, CacheStatus::Collapsed))
            }
        }
    }

    /// An uncollapsed, uncached GET of the key (hedges and per-user responses); a
    /// range request goes to the origin as the client sent it.
    async fn direct(&self, ctx: &Ctx) -> Response {
        if let Some(range) = &ctx.range {
            return self.range_to_origin(ctx, range).await;
        }
        let started = Instant::now();
        let response = match self.inner.origin.limiter().acquire_user().await {
            Ok(_slot) => self.inner.origin.get(&ctx.tenant, ctx.key.key()).await,
            Err(e) => Err(e),
        };
        match response {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let bytes = content_length(&parts.headers).unwrap_or(0);
                self.answered(
                    ctx,
                    CacheStatus::Miss,
                    bytes,
                    Some(millis(started.elapsed())),
                );
                let head = origin_head(parts.status, parts.headers);
                let body = if ctx.head_only {
                    Body::empty()
                } else {
                    Body::new(body)
                };
                with_head(&head, body, CacheStatus::Miss)
            }
            Err(e) => {
                self.inner.metrics.request(CacheStatus::Miss);
                fill_error_response(&e, CacheStatus::Miss)
            }
        }
    }

    async fn pass_through(&self, tenant: &Tenant, request: Request) -> Response {
        self.inner.metrics.request(CacheStatus::Bypass);
        // A streamed (chunked) body past the limit is cut off: the upload fails.
        let max_body =
            usize::try_from(self.inner.config.limits.max_body_bytes).unwrap_or(usize::MAX);
        let request = request.map(|body| Body::new(http_body_util::Limited::new(body, max_body)));
        match self.inner.origin.forward(tenant, request).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                parts.headers.insert(
                    X_CACHE,
                    HeaderValue::from_static(CacheStatus::Bypass.as_str()),
                );
                Response::from_parts(parts, Body::new(body))
            }
            Err(e) => error_response(e.status(), Some(CacheStatus::Bypass), &e.to_string()),
        }
    }
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

    #[tokio::test]
    async fn an_access_event_keeps_its_answer_time_while_it_waits_in_the_queue() {
        use std::time::Duration;

        use bytes::Bytes;
        use models::{NodeId, RegionId, TenantId};

        use crate::cache::Entry;
        use crate::config::Config;
        use crate::events::ChannelSink;

        let tenant = TenantId::new("t").unwrap();
        let config = Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            tenant.clone(),
            "http://127.0.0.1:9",
        );
        let (sink, mut events_rx) = ChannelSink::new(4);
        let node = Node::with_sink(config, Arc::new(sink)).unwrap();
        let entry = Entry::new(
            StatusCode::OK,
            http::HeaderMap::new(),
            Bytes::from_static(b"a"),
            Duration::from_secs(60),
            Duration::ZERO,
            Duration::from_millis(1),
            false,
        );
        let key = FlightKey::new(tenant, CacheKey::new("/a").unwrap());
        node.cache().insert(key, entry);

        let before = unix_now_ms();
        let request = Request::get("/a")
            .header(header::HOST, "edge.example")
            .body(Body::empty())
            .unwrap();
        let response = node.handle(request).await;
        let answered_by = unix_now_ms();
        assert_eq!(response.headers().get(X_CACHE).unwrap(), "HIT");
        // The record sits in the queue, as behind a publisher backlog, then is
        // published the way the publisher does it.
        std::thread::sleep(Duration::from_millis(20));
        let event = events_rx
            .try_recv()
            .unwrap()
            .into_event(RegionId::new("r").unwrap(), NodeId::new("n").unwrap());
        assert!(
            (before..=answered_by).contains(&event.ts_ms),
            "ts_ms {} outside the answer window {before}..={answered_by}",
            event.ts_ms
        );
    }
}
