//! A client request's path: request limits, tenant routing by host, the cache
//! lookup, then leading, joining or bypassing the key's fill.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, Uri, header};
use models::{Domain, Priority};
use tokio::time::Instant;

use super::fill::FillRequest;
use super::range::RangeRequest;
use super::response::{
    content_length, entry_response, error_response, fill_error_response, flight_response,
    not_modified_response, origin_head, with_head,
};
use super::{Live, Node, millis};
use crate::cache::{Entry, Lookup};
use crate::cache_key::normalise_key;
use crate::config::{RequestLimits, WaitTimeoutPolicy};
use crate::events::{OutcomeRecord, unix_now_ms};
use crate::flight::{Acquire, FillError, FlightKey, FlightSubscriber, HeadOutcome};
use crate::forward::{ForwardFields, Peer};
use crate::listener::{ConnGuard, LeadTicket};
use crate::origin::{ClientAddr, Tenant, strip_hop_by_hop};
use crate::request_head::RefusalReason;
use crate::semantics::{self, RequestDirectives, is_conditional};
use crate::status::{CacheStatus, ClientLimit};

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
    /// The key this request looks up and collapses on: the URL, or its variant.
    key: FlightKey,
    head_only: bool,
    referrer: Option<Domain>,
    /// The client's request head, for the fill request and the variant.
    headers: http::HeaderMap,
    version: http::Version,
    /// The client as the node judges it (its hops, the scheme in the key).
    peer: Peer,
    /// A `GET` with a `Range` the node can serve (`None` for every other request).
    range: Option<Box<RangeRequest>>,
    /// `limits.max_body_bytes` as this request read it.
    max_body_bytes: u64,
    /// The client connection's guard (a proxy listener's): its fill bounds.
    conn: Option<Arc<ConnGuard>>,
}

impl Ctx {
    fn fill_request(&self, fields: &ForwardFields, stale: Option<Arc<Entry>>) -> FillRequest {
        FillRequest {
            headers: fields.fill_headers(&self.headers, self.version, &self.peer),
            stale,
            peers: Arc::from([]),
        }
    }

    /// The request's secondary key for a response varying on `names`: from what its
    /// fill sends, as the fill's own is.
    fn variant(&self, fields: &ForwardFields, names: &[http::HeaderName]) -> Arc<str> {
        fields.variant(names, &self.headers, self.version, &self.peer)
    }
}

/// Whether a `GET`/`HEAD` carries a body (a "fat GET"). The head checks refuse one
/// (`get_with_body`) before this runs; should one get past them, it is passed to the
/// origin without its body and never collapsed or stored.
fn has_body(headers: &http::HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || content_length(headers).is_some_and(|n| n > 0)
}

/// A ticket to lead a fill within the bounds of the request's connection (none for a
/// request that came on no proxy connection), or the limit (counted) that refuses it.
fn lead_ticket(ctx: &Ctx) -> Result<Option<LeadTicket<'_>>, ClientLimit> {
    let Some(fills) = ctx.conn.as_deref().and_then(ConnGuard::fills) else {
        return Ok(None);
    };
    fills.try_lead().map(Some)
}

/// Unsafe methods (RFC 9110 §9.2.1) whose success invalidates the URL (RFC 9111 §4.4).
pub(super) fn is_unsafe(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
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
    fn tenant_for(live: &Live, request: &Request) -> Option<Arc<Tenant>> {
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
                live.by_host.get(&name.to_ascii_lowercase())
            } else {
                live.by_host.get(name)
            };
            if let Some(t) = found {
                return Some(Arc::clone(t));
            }
        }
        live.fallback.clone()
    }

    /// Answers one client request (its client's address unknown: no hop is added to
    /// `X-Forwarded-For`).
    pub async fn handle(&self, request: Request) -> Response {
        self.handle_from(request, None).await
    }

    /// Answers one request from the client at `client_addr`.
    pub async fn handle_from(&self, request: Request, client_addr: Option<ClientAddr>) -> Response {
        self.handle_guarded(request, client_addr, None, None).await
    }

    /// Answers one request whose raw HTTP/1 head the connection's head guard may
    /// have checked already (`head_verdict`); without a verdict the parsed request is
    /// checked. A refused request gets `400` before anything else runs. A miss leads
    /// a fill within the bounds of its connection (`conn`), if it came on one.
    pub(crate) async fn handle_guarded(
        &self,
        request: Request,
        client_addr: Option<ClientAddr>,
        head_verdict: Option<crate::listener::Verdict>,
        conn: Option<Arc<ConnGuard>>,
    ) -> Response {
        let verdict = head_verdict.unwrap_or_else(|| {
            crate::request_head::check_request_parts(
                request.method(),
                request.uri(),
                request.version(),
                request.headers(),
            )
        });
        if let Err(reason) = verdict {
            return self.refuse(reason, request.version());
        }
        // Read once: this request, and the fill it may start, keep this configuration
        // whatever a reload puts in force meanwhile.
        let live = self.live();
        let limits = &live.config.limits;
        if let Some(response) = over_limits(&request, limits) {
            return response;
        }
        let Some(tenant) = Self::tenant_for(&live, &request) else {
            return error_response(StatusCode::MISDIRECTED_REQUEST, None, "unknown host");
        };
        let max_body_bytes = limits.max_body_bytes;
        drop(live);
        let peer = self.inner.trusted.peer(client_addr, request.headers());
        let method = request.method();
        let cacheable_method = method == Method::GET || method == Method::HEAD;
        let headers = request.headers();
        // Credentials make a response per-user.
        let per_user =
            headers.contains_key(header::AUTHORIZATION) || headers.contains_key(header::COOKIE);
        if !cacheable_method || per_user || has_body(headers) {
            return self
                .pass_through(&tenant, request, &peer, max_body_bytes)
                .await;
        }
        let key = match normalise_key(request.uri()) {
            Ok(k) => k,
            Err(e) => {
                self.inner.metrics.refused(RefusalReason::BadTarget);
                return error_response(StatusCode::BAD_REQUEST, None, &e.to_string());
            }
        };
        let referrer = if self.inner.sink.enabled() {
            referrer_domain(&request)
        } else {
            None
        };
        let (parts, _empty_body) = request.into_parts();
        let range = match parts.headers.get(header::RANGE) {
            None => None,
            Some(range) => {
                RangeRequest::from_request(&parts.method, &parts.uri, &parts.headers, range)
            }
        };
        let primary = FlightKey::new(tenant.id.clone(), key).with_scheme(peer.scheme());
        // A URL without `Vary` is stored under its own key: one lookup and no copy of
        // the key on a hit. Only when that misses is the URL's `Vary` consulted for
        // the variant's key.
        let mut lookup = self.inner.cache.lookup(&primary);
        let key = if matches!(lookup, Lookup::Miss) {
            let fields = self.inner.origin.fields();
            let key = self.inner.cache.key_for_with(&primary, |names| {
                fields.variant(names, &parts.headers, parts.version, &peer)
            });
            if key.variant().is_some() {
                lookup = self.inner.cache.lookup(&key);
            }
            key
        } else {
            primary
        };
        let ctx = Ctx {
            head_only: parts.method == Method::HEAD,
            referrer,
            key,
            tenant,
            version: parts.version,
            peer,
            headers: parts.headers,
            range,
            max_body_bytes,
            conn,
        };
        let directives = RequestDirectives::parse(&ctx.headers);
        let now = Instant::now();
        // What the client's own `Cache-Control` accepts (RFC 9111 §5.2.1).
        let acceptable = |entry: &Entry, stale: bool| match &directives {
            None => true,
            Some(d) => {
                !d.no_cache
                    && d.max_age.is_none_or(|max| entry.age(now) <= max)
                    && d.min_fresh.is_none_or(|min| {
                        !stale && entry.fresh_for(now) >= std::time::Duration::from_secs(min)
                    })
            }
        };
        let stored = match lookup {
            Lookup::Fresh {
                entry,
                refresh_early,
            } if acceptable(&entry, false) => {
                if refresh_early {
                    self.refresh(&ctx, true, Some(Arc::clone(&entry)));
                }
                let status = if entry.take_prefetched() {
                    self.inner.metrics.prefetches_useful.inc();
                    // A user reached a pre-warmed entry: its origin hints lead on.
                    if entry.status.is_success() {
                        self.follow_hints(ctx.key.tenant(), ctx.key.key(), &entry.headers);
                    }
                    CacheStatus::Prefetched
                } else {
                    CacheStatus::Hit
                };
                return self.serve_entry(&ctx, &entry, status, now);
            }
            // A range of a stale entry is cut only after revalidation: the parts of a
            // representation the client assembles must come from one that is current.
            // A conditional that matches comes first (RFC 9110 §13.2.2): its `304`.
            // A soft-purged entry's refresh is its scheduled re-warm; another
            // edge-pulse node (an edge filling from this shield) gets a fresh copy.
            Lookup::Stale(entry)
                if acceptable(&entry, true)
                    && !(entry.awaits_rewarm() && semantics::via_edge_pulse(&ctx.headers))
                    && (ctx.range.is_none()
                        || self.client_has_it(&ctx, entry.status, &entry.headers)) =>
            {
                if !entry.awaits_rewarm() {
                    self.refresh(&ctx, false, Some(Arc::clone(&entry)));
                }
                return self.serve_entry(&ctx, &entry, CacheStatus::Stale, now);
            }
            Lookup::Fresh { entry, .. } | Lookup::Stale(entry) | Lookup::Expired(entry) => {
                Some(entry)
            }
            Lookup::Miss => None,
        };
        if let Some(d) = &directives {
            if d.only_if_cached {
                self.inner.metrics.request(CacheStatus::Miss);
                return error_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    Some(CacheStatus::Miss),
                    "only-if-cached: not in the cache",
                );
            }
            if d.no_store {
                // Nothing of this exchange may be stored (RFC 9111 §5.2.1.5).
                return self.direct(&ctx).await;
            }
        }
        // A fresh entry the client would not take: the fill must ask the origin.
        let force = stored.as_ref().is_some_and(|e| e.is_fresh(now));
        self.miss(ctx, stored, force).await
    }

    /// The `400` for a refused request, counted; an HTTP/1 connection is closed after
    /// it, since the client's framing can no longer be trusted.
    fn refuse(&self, reason: RefusalReason, version: http::Version) -> Response {
        self.inner.metrics.refused(reason);
        tracing::debug!(%reason, "request refused");
        let mut response = error_response(
            StatusCode::BAD_REQUEST,
            None,
            &format!("request refused: {reason}"),
        );
        if version < http::Version::HTTP_2 {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// A response from a stored entry: a `304` when the client's validators match it,
    /// else the ranges asked for, else the whole entry. The conditional is evaluated
    /// before `If-Range` and `Range` (RFC 9110 §13.2.2), so a `304` wins over a `206`.
    fn serve_entry(&self, ctx: &Ctx, entry: &Entry, status: CacheStatus, now: Instant) -> Response {
        if self.client_has_it(ctx, entry.status, &entry.headers) {
            self.answered(ctx, status, 0, None);
            return not_modified_response(entry, status, now);
        }
        if let Some(range) = &ctx.range
            && let Some(response) = range.entry_response(entry, status, now)
        {
            self.answered(ctx, status, body_len(&response), None);
            return response;
        }
        self.answered(ctx, status, entry.body.len() as u64, None);
        entry_response(entry, status, ctx.head_only, now)
    }

    /// Whether the client's conditional request matches a `status` response with
    /// `headers` (RFC 9110 §13.2.2): it holds the current representation already.
    fn client_has_it(&self, ctx: &Ctx, status: StatusCode, headers: &http::HeaderMap) -> bool {
        is_conditional(&ctx.headers)
            && status == StatusCode::OK
            && semantics::not_modified(&ctx.headers, headers)
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
        if self.client_has_it(ctx, head.status, &head.headers) {
            // The conditional comes before the range (RFC 9110 §13.2.2); a flight
            // answers it as a plain request.
            return FromFlight::Full(subscriber);
        }
        let max = self.inner.config.cache.max_object_bytes;
        match range.flight_response(head, subscriber, status, max) {
            Some(Ok(response)) => FromFlight::Answer(response),
            Some(Err(subscriber)) => FromFlight::Full(subscriber),
            None => {
                if content_length(&head.headers).is_some_and(|l| l > max) {
                    self.inner.too_large.remember(&ctx.key);
                }
                FromFlight::Origin
            }
        }
    }

    /// A range request the cache cannot serve, passed to the origin unchanged.
    async fn range_to_origin(&self, ctx: &Ctx, range: &RangeRequest) -> Response {
        self.pass_through(
            &ctx.tenant,
            range.to_origin_request(),
            &ctx.peer,
            ctx.max_body_bytes,
        )
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

    /// Starts one background refresh (conditional when `stale` has validators) unless
    /// a fill for the key is already in flight.
    fn refresh(&self, ctx: &Ctx, force: bool, stale: Option<Arc<Entry>>) {
        if let Some(permit) = self.inner.registry.try_lead(&ctx.key, Priority::User) {
            let request = ctx.fill_request(self.inner.origin.fields(), stale);
            self.spawn_fill(permit, Arc::clone(&ctx.tenant), request, force);
        }
    }

    async fn miss(&self, mut ctx: Ctx, stored: Option<Arc<Entry>>, force: bool) -> Response {
        if let Some(range) = &ctx.range
            && self.inner.too_large.contains(&ctx.key)
        {
            return self.range_to_origin(&ctx, range).await;
        }
        for attempt in 0..3 {
            if attempt > 0 {
                // A response seen meanwhile may have taught the URL's `Vary`.
                let fields = self.inner.origin.fields();
                ctx.key = self
                    .inner
                    .cache
                    .key_for_with(&ctx.key.primary(), |names| ctx.variant(fields, names));
            }
            if !self.inner.config.flight.collapse || self.inner.unshared.contains(&ctx.key) {
                // Nothing to share (the baseline without collapsing, or a key whose
                // last response was per-user): a fill of its own, bounded by the
                // fill slots, stored if it turns out shareable.
                let permit = self.inner.registry.lead_alone(&ctx.key, Priority::User);
                let subscriber = permit.subscribe();
                let request = ctx.fill_request(self.inner.origin.fields(), stored);
                self.spawn_fill(permit, Arc::clone(&ctx.tenant), request, force);
                return self.lead(subscriber, &ctx).await;
            }
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
                    let ticket = match lead_ticket(&ctx) {
                        Ok(ticket) => ticket,
                        // Dropping the permit frees the key: a waiter may lead.
                        Err(limit) => return super::response::lead_refused(limit),
                    };
                    let subscriber = permit.subscribe();
                    let request = ctx.fill_request(self.inner.origin.fields(), stored.clone());
                    self.spawn_fill(permit, Arc::clone(&ctx.tenant), request, force);
                    let response = self.lead(subscriber, &ctx).await;
                    if let Some(ticket) = ticket {
                        ticket.answered();
                    }
                    return response;
                }
                Acquire::Join(subscriber) => {
                    self.inner.metrics.waiters_joined.inc();
                    if let Some(response) = self.wait(subscriber, &ctx).await {
                        return response;
                    }
                    // The fill aborted before any byte, or answered another variant:
                    // try again (as leader, or on the variant's own flight).
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
                if self.inner.unshared.contains(&ctx.key) {
                    // Shareable again: the next burst collapses.
                    self.inner.unshared.forget(&ctx.key);
                }
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
                } else if !head.status.is_server_error() {
                    // Per-user (an error is transient): the next burst fetches one
                    // by one at once instead of waiting on a leader to learn it.
                    self.inner.unshared.remember(&ctx.key);
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
    /// the fill aborted before any byte, or answered a variant this request does not
    /// select, and the caller may try again.
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
                        // Not read from now on: a fill paced by its readers must not
                        // wait for this one.
                        drop(subscriber);
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
                if let Some(vary) = &head.vary
                    && !vary.selects(ctx.key.variant(), |names| {
                        ctx.variant(self.inner.origin.fields(), names)
                    })
                {
                    // Joined before the URL's `Vary` was known (or while it varied on
                    // other fields), and the response is for other selecting headers:
                    // never shared (RFC 9111 §4.1). The variant's own flight, if the
                    // key now has one, else a fetch of its own.
                    let fields = self.inner.origin.fields();
                    let key = self
                        .inner
                        .cache
                        .key_for_with(&ctx.key.primary(), |names| ctx.variant(fields, names));
                    drop(subscriber);
                    return if key.variant().is_some() && key != ctx.key {
                        None
                    } else {
                        Some(self.direct(ctx).await)
                    };
                }
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

    /// An uncollapsed, uncached GET of the key with the client's forwarded headers
    /// (hedges, per-user responses, `no-store` requests); a range request goes to the
    /// origin as the client sent it.
    async fn direct(&self, ctx: &Ctx) -> Response {
        if let Some(range) = &ctx.range {
            return self.range_to_origin(ctx, range).await;
        }
        let started = Instant::now();
        let limiter = self.inner.origin.limiter();
        let tenant = &ctx.tenant.id;
        let class = limiter.class_of(tenant, "GET", ctx.key.key().as_str());
        let response = match limiter.acquire_user(tenant, class).await {
            Ok(_slot) => {
                let fields = self.inner.origin.fields();
                let headers = fields.fill_headers(&ctx.headers, ctx.version, &ctx.peer);
                self.inner
                    .origin
                    .get(&ctx.tenant, ctx.key.key(), headers)
                    .await
            }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::CacheKey;

    use crate::status::X_CACHE;

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
