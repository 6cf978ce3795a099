//! The node: tenant resolution, the request path (cache → single flight → origin),
//! the fill task and the `x-cache` header.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode, Uri, header};
use http_body_util::BodyExt;
use models::{CacheKey, Domain, IdError, Outcome, Priority, TenantId};
use tokio::time::Instant;

use crate::cache::{Entry, L1Cache, Lookup, Storability, classify, origin_age};
use crate::config::{Config, ConfigError, RequestLimits, WaitTimeoutPolicy};
use crate::events::{EventSink, NoopSink, OutcomeRecord};
use crate::flight::{
    Acquire, FillError, FillPermit, FlightKey, FlightRegistry, FlightSubscriber, Head, HeadOutcome,
};
use crate::limits::FillSlot;
use crate::metrics::Metrics;
use crate::origin::{OriginClient, Tenant, strip_hop_by_hop};
use crate::status::{CacheStatus, X_CACHE, X_CACHE_NAME};

/// What [`Node::prewarm`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    /// A fresh entry is already cached: nothing to do.
    Cached,
    /// A fill is already in flight: the pre-warm joined it.
    Joined,
    /// A background fill started.
    Started,
}

/// Why a pre-warm was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrewarmError {
    /// The tenant is not in this node's configuration.
    #[error("unknown tenant {0}")]
    UnknownTenant(String),
    /// The key is not a valid cache key once normalised.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// Too many keys in flight.
    #[error("too many fills in flight")]
    Full,
}

impl PrewarmError {
    /// The `reason` label it is counted under.
    pub fn reason(&self) -> &'static str {
        match self {
            PrewarmError::UnknownTenant(_) => "unknown_tenant",
            PrewarmError::InvalidKey(_) => "invalid_field",
            PrewarmError::Full => "full",
        }
    }
}

/// One edge (or shield) node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    config: Config,
    by_host: HashMap<String, Arc<Tenant>>,
    fallback: Option<Arc<Tenant>>,
    by_id: HashMap<TenantId, Arc<Tenant>>,
    cache: L1Cache,
    registry: FlightRegistry,
    origin: OriginClient,
    metrics: Metrics,
    sink: Arc<dyn EventSink>,
    /// Panics injected into fill tasks by tests (feature `testing` only).
    #[cfg(feature = "testing")]
    faults: crate::faults::FillFaults,
}

/// The proxy router: every path goes to the proxy (metrics live on the admin router).
pub fn app(node: Node) -> Router {
    Router::new().fallback(handle).with_state(node)
}

/// The admin router: `/metrics` (Prometheus text) and `/healthz`.
pub fn admin_app(node: Node) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(node)
}

async fn handle(State(node): State<Node>, request: Request) -> Response {
    node.handle(request).await
}

async fn metrics(State(node): State<Node>) -> Response {
    let limiter = node.inner.origin.limiter();
    let m = &node.inner.metrics;
    m.prefetch_limit.set(limiter.prefetch_limit() as i64);
    m.prefetch_queued.set(limiter.prefetch_queued() as i64);
    let mut response = Response::new(Body::from(node.inner.metrics.encode()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

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

fn error_response(code: StatusCode, status: Option<CacheStatus>, message: &str) -> Response {
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
fn fill_error_response(error: &FillError, status: CacheStatus) -> Response {
    let mut response = error_response(error.status(), Some(status), &error.to_string());
    if let FillError::Overloaded { retry_after_s } = error {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
    }
    response
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The head of an origin response as this node passes it on: the origin's `Age`
/// is taken out and remembered, so every response from it states its own.
fn origin_head(status: StatusCode, mut headers: http::HeaderMap) -> Head {
    let initial_age = origin_age(&headers);
    headers.remove(header::AGE);
    Head {
        status,
        headers,
        fetched_at: Instant::now(),
        initial_age,
    }
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
fn with_head(head: &Head, body: Body, status: CacheStatus) -> Response {
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

fn flight_response(
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
fn entry_response(entry: &Entry, status: CacheStatus, head_only: bool, now: Instant) -> Response {
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

fn referrer_domain(request: &Request) -> Option<Domain> {
    let referer = request.headers().get(header::REFERER)?.to_str().ok()?;
    let uri: Uri = referer.parse().ok()?;
    Domain::new(uri.host()?.to_ascii_lowercase()).ok()
}

fn millis(d: std::time::Duration) -> u32 {
    d.as_millis().min(u128::from(u32::MAX)) as u32
}

/// Per-request context carried through the miss path.
struct Ctx {
    tenant: Arc<Tenant>,
    key: FlightKey,
    head_only: bool,
    referrer: Option<Domain>,
}

impl Node {
    /// A node with no event sink.
    pub fn new(config: Config) -> Result<Node, ConfigError> {
        Node::with_sink(config, Arc::new(NoopSink))
    }

    /// A node reporting request outcomes to `sink`.
    pub fn with_sink(config: Config, sink: Arc<dyn EventSink>) -> Result<Node, ConfigError> {
        config.validate()?;
        let mut by_host = HashMap::new();
        let mut by_id = HashMap::new();
        let mut fallback = None;
        for (i, t) in config.tenants.iter().enumerate() {
            let tenant =
                Arc::new(
                    Tenant::from_config(t).map_err(|reason| ConfigError::Invalid {
                        field: format!("tenants[{i}].origin"),
                        reason,
                    })?,
                );
            for host in &t.hosts {
                if host == "*" {
                    fallback = Some(Arc::clone(&tenant));
                } else {
                    by_host.insert(host.to_ascii_lowercase(), Arc::clone(&tenant));
                }
            }
            by_id.insert(t.id.clone(), tenant);
        }
        let origin = OriginClient::new(&config.origin, &config.flight, &config.prefetch);
        let metrics = Metrics::new();
        Ok(Node {
            inner: Arc::new(NodeInner {
                cache: L1Cache::with_waste_counter(
                    &config.cache,
                    metrics.prefetches_wasted.clone(),
                ),
                registry: FlightRegistry::new(config.flight.max_flights),
                origin,
                metrics,
                sink,
                by_host,
                fallback,
                by_id,
                config,
                #[cfg(feature = "testing")]
                faults: crate::faults::FillFaults::default(),
            }),
        })
    }

    /// Testing only: the next fill of `key` panics at `at`, as a bug in the fill
    /// task would, so tests can check that its waiters are never stranded.
    #[cfg(feature = "testing")]
    pub fn panic_next_fill(&self, key: FlightKey, at: crate::faults::PanicPoint) {
        self.inner.faults.arm(key, at);
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The single-flight registry (for diagnostics and tests).
    pub fn registry(&self) -> &FlightRegistry {
        &self.inner.registry
    }

    /// The L1 cache.
    pub fn cache(&self) -> &L1Cache {
        &self.inner.cache
    }

    /// The origin client and its fill limits.
    pub fn origin(&self) -> &OriginClient {
        &self.inner.origin
    }

    fn emit(&self, record: OutcomeRecord) {
        if self.inner.sink.record(record).is_err() {
            self.inner.metrics.events_dropped.inc();
        }
    }

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
        // Credentials make a response per-user; ranges are served by the origin.
        let per_user = headers.contains_key(header::AUTHORIZATION)
            || headers.contains_key(header::COOKIE)
            || headers.contains_key(header::RANGE);
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
                self.answered(&ctx, status, entry.body.len() as u64, None);
                entry_response(&entry, status, ctx.head_only, Instant::now())
            }
            Lookup::Stale(entry) => {
                self.refresh(&ctx, false);
                self.answered(&ctx, CacheStatus::Stale, entry.body.len() as u64, None);
                entry_response(&entry, CacheStatus::Stale, ctx.head_only, Instant::now())
            }
            Lookup::Miss => self.miss(ctx).await,
        }
    }

    fn answered(&self, ctx: &Ctx, status: CacheStatus, bytes: u64, fill_ms: Option<u32>) {
        self.inner.metrics.request(status);
        if !self.inner.sink.enabled() {
            return;
        }
        if let Some(outcome) = status.outcome() {
            self.emit(OutcomeRecord {
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
                let bytes = content_length(&head.headers).unwrap_or(0);
                self.answered(ctx, CacheStatus::Miss, bytes, Some(fill_ms));
                flight_response(&head, subscriber, CacheStatus::Miss, ctx.head_only)
            }
            HeadOutcome::Bypass(Some((head, body))) => {
                let bytes = content_length(&head.headers).unwrap_or(0);
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

    /// An uncollapsed, uncached GET of the key (hedges and per-user responses).
    async fn direct(&self, ctx: &Ctx) -> Response {
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

    /// Pre-warms `key` through the same single-flight path at background priority:
    /// joins a fill in flight instead of starting another, and marks the stored entry
    /// so the first user hit reports `PREFETCHED`. The origin is the tenant's own
    /// from configuration; the key is normalised like a request's (sorted query).
    /// Counted in the `prefetches_{started,joined,cached}` metrics.
    pub fn prewarm(
        &self,
        tenant: &TenantId,
        key: CacheKey,
    ) -> Result<PrewarmOutcome, PrewarmError> {
        let Some(t) = self.inner.by_id.get(tenant) else {
            return Err(PrewarmError::UnknownTenant(tenant.to_string()));
        };
        let key = key
            .as_str()
            .parse::<Uri>()
            .map_err(|e| e.to_string())
            .and_then(|uri| normalise_key(&uri).map_err(|e| e.to_string()))
            .map_err(PrewarmError::InvalidKey)?;
        let fkey = FlightKey::new(tenant.clone(), key);
        let metrics = &self.inner.metrics;
        if self.inner.cache.get_fresh(&fkey).is_some() {
            metrics.prefetches_cached.inc();
            return Ok(PrewarmOutcome::Cached);
        }
        match self.inner.registry.acquire(&fkey, Priority::Background) {
            Acquire::Lead(permit) => {
                metrics.prefetches_started.inc();
                self.spawn_fill(permit, Arc::clone(t), false);
                Ok(PrewarmOutcome::Started)
            }
            Acquire::Join(_) => {
                metrics.prefetches_joined.inc();
                Ok(PrewarmOutcome::Joined)
            }
            Acquire::Full => Err(PrewarmError::Full),
        }
    }

    /// A fill slot for `permit`'s class. A background fill waits (bounded) for a
    /// prefetch slot; if a user request joins meanwhile, it leaves the prefetch queue
    /// and takes a user slot (priority inheritance).
    async fn fill_slot(&self, permit: &FillPermit) -> Result<FillSlot, FillError> {
        let limiter = self.inner.origin.limiter();
        if permit.priority() == Priority::User {
            return limiter.acquire_user().await;
        }
        let shed = tokio::select! {
            biased;
            () = permit.promoted() => None,
            slot = limiter.acquire_prefetch() => match slot {
                Ok(slot) => return Ok(slot),
                Err(e) => Some(e),
            },
        };
        if permit.priority() == Priority::User {
            self.inner.metrics.prefetches_promoted.inc();
            return limiter.acquire_user().await;
        }
        self.inner.metrics.prefetches_shed.inc();
        Err(shed.unwrap_or(FillError::NoCapacity))
    }

    /// Runs the fill in its own task: the leader's client may vanish, the fill goes on
    /// for the waiters and the cache. The permit's `Drop` covers a panic.
    fn spawn_fill(&self, permit: FillPermit, tenant: Arc<Tenant>, force: bool) {
        let node = self.clone();
        tokio::spawn(async move { node.fill(permit, tenant, force).await });
    }

    async fn fill(&self, permit: FillPermit, tenant: Arc<Tenant>, force: bool) {
        let inner = &self.inner;
        let key = permit.key().clone();
        // Second look (double-checked locking): a fill may have completed between the
        // caller's cache miss and its leadership.
        if !force && let Some(entry) = inner.cache.get_fresh(&key) {
            permit.publish_head(Head {
                status: entry.status,
                headers: entry.headers.clone(),
                fetched_at: entry.fetched_at(),
                initial_age: entry.initial_age(),
            });
            permit.push_chunk(entry.body.clone());
            permit.complete(|| {});
            return;
        }
        let prewarm = permit.priority() == Priority::Background;
        let slot = match self.fill_slot(&permit).await {
            Ok(slot) => slot,
            Err(e) => return self.fail(permit, e),
        };
        inner.metrics.fills_started.inc();
        inner.metrics.flights.inc();
        let _flights = scopeguard(|| {
            inner.metrics.flights.dec();
        });
        let started = Instant::now();
        let response = match inner.origin.get(&tenant, key.key()).await {
            Ok(r) => {
                slot.record(Some(started.elapsed()));
                r
            }
            Err(e) => {
                slot.record(None);
                return self.fail(permit, e);
            }
        };
        let (parts, mut body) = response.into_parts();
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        let declared = content_length(&headers);
        let storability = classify(
            parts.status,
            &headers,
            &inner.config.cache,
            SystemTime::now(),
            rand::random::<f64>(),
        );
        let max = inner.config.cache.max_object_bytes;
        let head = origin_head(parts.status, headers);
        if storability == Storability::Private || declared.is_some_and(|l| l > max) {
            permit.bypass(head, Body::new(body));
            return;
        }
        let stored_headers = head.headers.clone();
        let (fetched_at, initial_age) = (head.fetched_at, head.initial_age);
        #[cfg(feature = "testing")]
        inner
            .faults
            .check(&key, crate::faults::PanicPoint::BeforeHead);
        permit.publish_head(head);
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut received = 0u64;
        loop {
            let frame =
                match tokio::time::timeout(inner.origin.body_idle_timeout(), body.frame()).await {
                    Err(_) => return self.fail(permit, FillError::Timeout),
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        let error = match declared {
                            Some(expected) if received < expected => {
                                FillError::Truncated { expected, received }
                            }
                            _ => FillError::Body(e.to_string()),
                        };
                        return self.fail(permit, error);
                    }
                    Ok(Some(Ok(frame))) => frame,
                };
            if let Ok(data) = frame.into_data() {
                #[cfg(feature = "testing")]
                inner.faults.check(&key, crate::faults::PanicPoint::MidBody);
                received += data.len() as u64;
                if received > max {
                    return self.fail(permit, FillError::TooLarge(max));
                }
                chunks.push(data.clone());
                permit.push_chunk(data);
            }
        }
        if let Some(expected) = declared
            && expected != received
        {
            return self.fail(permit, FillError::Truncated { expected, received });
        }
        let fill_time = started.elapsed();
        inner.metrics.fill_seconds.observe(fill_time.as_secs_f64());
        // Only an entry no user has waited for is "prefetched"; a promoted fill served
        // its user already.
        let background = permit.priority() == Priority::Background;
        permit.complete(|| {
            if let Storability::Store { ttl, grace } = storability {
                let body = if chunks.len() == 1 {
                    chunks.pop().unwrap_or_default()
                } else {
                    let mut all = BytesMut::with_capacity(received as usize);
                    chunks.iter().for_each(|c| all.extend_from_slice(c));
                    all.freeze()
                };
                let entry = Entry::new(
                    parts.status,
                    stored_headers,
                    body,
                    ttl,
                    grace,
                    fill_time,
                    background,
                )
                .with_age(fetched_at, initial_age);
                inner.cache.insert(key.clone(), entry);
            }
        });
        if prewarm && inner.sink.enabled() {
            self.emit(OutcomeRecord {
                tenant: key.tenant().clone(),
                key: key.key().clone(),
                outcome: Outcome::PrefetchFill,
                bytes: received,
                fill_ms: Some(millis(fill_time)),
                referrer: None,
            });
        }
    }

    fn fail(&self, permit: FillPermit, error: FillError) {
        tracing::debug!(key = %permit.key().key(), %error, "fill failed");
        self.inner.metrics.fill_failed(&error);
        permit.fail(error);
    }
}

/// Runs a closure on drop (a gauge decrement that must survive early returns).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
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
            assert_eq!(h.len(), 3);
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
        };
        let miss = with_head(&stored, Body::empty(), CacheStatus::Miss);
        assert_eq!(miss.headers().get(header::AGE).unwrap(), "2");
        assert_eq!(miss.headers().get(X_CACHE).unwrap(), "MISS");
    }

    #[test]
    fn keys_are_normalised_and_validated() {
        let k = |s: &str| normalise_key(&s.parse::<Uri>().unwrap()).map(|k| k.to_string());
        assert_eq!(k("/a?b=2&a=1").unwrap(), "/a?a=1&b=2");
        assert_eq!(k("/a?a=1&&b=2&").unwrap(), "/a?a=1&b=2");
        assert_eq!(k("/a?").unwrap(), "/a");
        assert_eq!(k("http://h.example/x").unwrap(), "/x");
        assert!(k("/a/../b").is_err());
    }
}
