//! The single-flight registry: at most one origin fill per flight key (tenant +
//! normalised cache key), shared with every request that arrives while it runs.
//!
//! [`FlightRegistry::acquire`] atomically makes the caller the leader
//! ([`Acquire::Lead`] with a [`FillPermit`]) or a waiter ([`Acquire::Join`] with a
//! [`FlightSubscriber`]). The fill runs in its own task that owns the permit, so the
//! leader's client connection has no say in it: the leader is just the first
//! subscriber. The permit publishes the response head, then each body chunk, into a
//! shared buffer (a `watch` channel); every subscriber, however late, replays it from
//! the start, so bodies stream to everyone as they arrive.
//!
//! # Concurrent calls on the same key
//!
//! - Only the permit's owner removes the flight entry, and only its own (entries carry
//!   a generation id), so a finished flight can never remove the next wave's.
//! - On failure the entry is removed *before* the error is published: a request that
//!   arrives afterwards starts a fresh fill instead of inheriting the error.
//! - On success the end is published first (the clients' bodies complete without
//!   waiting for the cache write), then the caller stores the entry, then the flight
//!   entry goes; a request arriving in between joins the finished flight and replays it.
//! - A permit dropped without finishing (the fill task panicked or was cancelled)
//!   marks the flight [`FillError::Aborted`] in its `Drop`, so waiters never hang; a
//!   waiter that sees `Aborted` before any response byte may take over leadership.
//! - Waiters bound their own wait ([`FlightSubscriber::head`] under a timeout in the
//!   proxy); the fill is bounded by the origin client's timeouts.
//! - A per-user response ([`FillPermit::bypass`]) reaches the leader's subscriber
//!   only: a waiter gets none of it, neither head nor body, but either the word to
//!   fetch on its own or the error the fill names for it
//!   ([`FillPermit::bypass_failing`]).
//! - A response that `Vary`s is shared only with a waiter whose selecting fields
//!   match the leader's ([`VaryMatch::selects`]), however the waiter's key was made.
//! - A body too large to keep whole ([`FillPermit::share_window`]: past the largest
//!   stored object) keeps only its last `window` bytes for its subscribers, and the
//!   fill waits for the slowest of them ([`FillPermit::send_chunk`], bounded): one
//!   that still falls further behind gets [`FillError::TooLarge`], never a body with
//!   a gap. Once its first chunk is dropped the flight leaves the registry, so no
//!   one joins a stream whose start is gone.
//! - A fill led for a client is *abandoned* ([`FillPermit::abandoned`]) once every
//!   subscriber is gone; a fill no client led (a refresh, a pre-warm) never is. A
//!   request that joins an abandoned fill the fill task then drops sees
//!   [`FillError::Aborted`] before any byte, and may lead afresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use models::{CacheKey, Priority, TenantId};
use tokio::sync::{Notify, watch};

mod progress;
use progress::{Progress, Readers};

/// Why a fill produced no (complete) response. Cloned to every waiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The origin answered with a server error (the status its waiters get); never
    /// cached unless `cache.store_errors` is on.
    #[error("origin answered {0}")]
    Upstream(u16),
    /// The origin could not be reached or reset the connection before answering.
    #[error("origin unreachable: {0}")]
    Connect(String),
    /// The origin's TLS failed: its certificate is not trusted or not for its name,
    /// or the handshake failed.
    #[error("origin TLS failed: {0}")]
    Tls(String),
    /// The origin did not answer (or stalled mid-body) within its timeout.
    #[error("origin timed out")]
    Timeout,
    /// The origin's body failed mid-stream (reset, protocol error).
    #[error("origin body failed: {0}")]
    Body(String),
    /// The origin's body was shorter or longer than its `Content-Length`.
    #[error("origin body truncated: {received} of {expected} bytes")]
    Truncated {
        /// Declared length.
        expected: u64,
        /// Bytes received.
        received: u64,
    },
    /// A body without a length grew past the largest object the node collapses.
    #[error("object larger than {0} bytes")]
    TooLarge(u64),
    /// The origin's response head breaks HTTP/1.1 framing or was not asked for
    /// (RFC 9112 §6: a transfer coding other than `chunked`, `Content-Length` beside
    /// `Transfer-Encoding`, differing lengths; an unsolicited `101`): never passed on.
    #[error("origin response refused: {0}")]
    Malformed(&'static str),
    /// The fill task ended without finishing (panic or shutdown).
    #[error("fill aborted")]
    Aborted,
    /// A background (prefetch) fill was shed: no spare origin capacity in time.
    #[error("no spare origin capacity for a background fill")]
    NoCapacity,
    /// Every fill slot is busy and the user queue is full: retry later.
    #[error("origin overloaded; retry in {retry_after_s} s")]
    Overloaded {
        /// The `Retry-After` value, in seconds.
        retry_after_s: u32,
    },
}

impl FillError {
    /// The status a client gets for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            FillError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            FillError::Upstream(code) => StatusCode::from_u16(*code)
                .ok()
                .filter(StatusCode::is_server_error)
                .unwrap_or(StatusCode::BAD_GATEWAY),
            FillError::NoCapacity | FillError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// A bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            FillError::Upstream(_) => "upstream_5xx",
            FillError::Connect(_) => "connect",
            FillError::Tls(_) => "tls",
            FillError::Timeout => "timeout",
            FillError::Body(_) => "body",
            FillError::Truncated { .. } => "truncated",
            FillError::TooLarge(_) => "too_large",
            FillError::Malformed(_) => "malformed",
            FillError::Aborted => "aborted",
            FillError::NoCapacity => "no_capacity",
            FillError::Overloaded { .. } => "overloaded",
        }
    }
}

/// What a flight is for: the tenant (from trusted configuration), the normalised
/// cache key, the [`Scheme`] and, for a URL whose responses `Vary`, the variant (the secondary key
/// of RFC 9111 §4.1, from the request's selecting headers). Two tenants with the same
/// path never share a flight or an entry; two requests share one only when their
/// selecting headers match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlightKey {
    tenant: TenantId,
    key: CacheKey,
    scheme: Scheme,
    variant: Option<Arc<str>>,
}

/// The scheme a request reached the node by, part of the primary key: the origin
/// learns it (`X-Forwarded-Proto`) and may answer each differently (a redirect to
/// `https`, absolute links), so an `http` fill is never served over TLS. A byte in
/// the key, no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP (the default: keys made without a scheme).
    #[default]
    Http,
    /// HTTPS: the TLS listener, or a trusted proxy that says so.
    Https,
}

impl Scheme {
    /// `http` or `https`, as `X-Forwarded-Proto` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

impl FlightKey {
    /// The key of `tenant`'s `key` (the URL itself, no variant).
    pub fn new(tenant: TenantId, key: CacheKey) -> FlightKey {
        FlightKey {
            tenant,
            key,
            scheme: Scheme::Http,
            variant: None,
        }
    }

    /// The same key for requests that came by `scheme`.
    pub fn with_scheme(mut self, scheme: Scheme) -> FlightKey {
        self.scheme = scheme;
        self
    }

    /// The scheme the key's requests came by.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The key of one variant of this key's URL.
    pub fn with_variant(&self, variant: Arc<str>) -> FlightKey {
        FlightKey {
            tenant: self.tenant.clone(),
            key: self.key.clone(),
            scheme: self.scheme,
            variant: Some(variant),
        }
    }

    /// The URL's key, without a variant.
    pub fn primary(&self) -> FlightKey {
        FlightKey::new(self.tenant.clone(), self.key.clone()).with_scheme(self.scheme)
    }

    /// The variant (normalised selecting headers), if the URL's responses vary.
    pub fn variant(&self) -> Option<&str> {
        self.variant.as_deref()
    }

    /// The tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// The cache key.
    pub fn key(&self) -> &CacheKey {
        &self.key
    }
}

/// A response head as the fill publishes it.
#[derive(Debug, Clone)]
pub struct Head {
    /// Origin status.
    pub status: StatusCode,
    /// Origin headers (hop-by-hop and `Age` removed: each response gets its own).
    pub headers: HeaderMap,
    /// When the response came from the origin.
    pub fetched_at: tokio::time::Instant,
    /// The `Age` the origin sent, in seconds (0 if none).
    pub initial_age: u64,
    /// When the response `Vary`s: the selecting fields and the leader's variant. A
    /// waiter that joined before the `Vary` was known shares the response only when
    /// its own variant is the same.
    pub vary: Option<Arc<VaryMatch>>,
}

/// The selecting fields of a response and the variant of the request it answered.
#[derive(Debug)]
pub struct VaryMatch {
    /// The `Vary` field names.
    pub names: Arc<[http::HeaderName]>,
    /// The leader's normalised values of them.
    pub variant: Arc<str>,
}

impl VaryMatch {
    /// Whether a request with `headers`, which joined under the variant
    /// `joined_as` (its key's, if any), selects this response (RFC 9111 §4.1). A
    /// key made from the same fields is the same string, so a joiner of the
    /// leader's own variant is matched without building its variant again; one made
    /// from other fields (the origin changed its `Vary`) or none is checked against
    /// the response's.
    /// `variant` computes a request's variant from the names (the proxy's, from what
    /// its fill would send the origin).
    pub fn selects(
        &self,
        joined_as: Option<&str>,
        variant: impl FnOnce(&[http::HeaderName]) -> Arc<str>,
    ) -> bool {
        joined_as == Some(&*self.variant) || variant(&self.names) == self.variant
    }
}

impl Head {
    /// A head fetched from the origin just now, without an `Age`.
    pub fn new(status: StatusCode, headers: HeaderMap) -> Head {
        Head {
            status,
            headers,
            fetched_at: tokio::time::Instant::now(),
            initial_age: 0,
            vary: None,
        }
    }

    /// The `Age` of a response sent from this head at `now`: whole seconds since
    /// it came from the origin plus the origin's own `Age`.
    pub fn age(&self, now: tokio::time::Instant) -> u64 {
        self.initial_age
            .saturating_add(now.saturating_duration_since(self.fetched_at).as_secs())
    }
}

#[derive(Debug, Clone)]
enum End {
    Complete,
    Failed(FillError),
    /// Not shareable: the leader takes the body handed over; waiters fetch on their
    /// own (`None`) or get this error.
    Bypass(Option<FillError>),
}

const BACKGROUND: u8 = 0;
const USER: u8 = 1;

fn priority_to_u8(p: Priority) -> u8 {
    match p {
        Priority::Background => BACKGROUND,
        Priority::User => USER,
    }
}

struct Flight {
    id: u64,
    key: FlightKey,
    progress: watch::Sender<Progress>,
    priority: AtomicU8,
    promoted: Notify,
    waiters: AtomicUsize,
    /// The response handed to the leader when it is not shareable.
    leader_body: Mutex<Option<(Arc<Head>, Body)>>,
    /// A client leads this fill (its leader subscribed): once every subscriber is
    /// gone, the fill is abandoned.
    for_client: std::sync::atomic::AtomicBool,
    readers: Readers,
}

impl Flight {
    fn promote(&self) {
        if self.priority.swap(USER, Ordering::AcqRel) == BACKGROUND {
            self.promoted.notify_waiters();
        }
    }

    fn priority(&self) -> Priority {
        if self.priority.load(Ordering::Acquire) == USER {
            Priority::User
        } else {
            Priority::Background
        }
    }
}

/// The outcome of [`FlightRegistry::acquire`].
pub enum Acquire {
    /// No fill was in flight: the caller leads and must hand the permit to a fill task.
    Lead(FillPermit),
    /// A fill is in flight: the caller subscribes to it.
    Join(FlightSubscriber),
    /// `max_flights` distinct keys are already in flight.
    Full,
}

/// The map of fills in flight.
///
/// It is guarded by a `std::sync::Mutex`, not tokio's: every critical section is one
/// map operation, never held across an `.await`, so a blocking lock is cheaper and
/// cannot be held by a suspended task.
#[derive(Clone)]
pub struct FlightRegistry {
    inner: Arc<RegistryInner>,
}

struct RegistryInner {
    flights: Mutex<HashMap<FlightKey, Arc<Flight>>>,
    next_id: AtomicU64,
    max_flights: usize,
}

impl FlightRegistry {
    /// A registry holding at most `max_flights` keys in flight.
    pub fn new(max_flights: usize) -> FlightRegistry {
        FlightRegistry {
            inner: Arc::new(RegistryInner {
                flights: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                max_flights,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<FlightKey, Arc<Flight>>> {
        // Each critical section is a single map operation, so a panic elsewhere cannot
        // leave the map half-updated: recover from poisoning.
        self.inner
            .flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Atomically leads a new fill for `key` or joins the one in flight. A `User`
    /// request joining a `Background` fill promotes it.
    pub fn acquire(&self, key: &FlightKey, priority: Priority) -> Acquire {
        let mut flights = self.lock();
        if let Some(flight) = flights.get(key) {
            let flight = Arc::clone(flight);
            drop(flights);
            flight.waiters.fetch_add(1, Ordering::Relaxed);
            if priority == Priority::User {
                flight.promote();
            }
            return Acquire::Join(FlightSubscriber::new(flight, false));
        }
        if flights.len() >= self.inner.max_flights {
            return Acquire::Full;
        }
        let flight = self.new_flight(key, priority);
        flights.insert(key.clone(), Arc::clone(&flight));
        drop(flights);
        Acquire::Lead(FillPermit {
            registry: self.clone(),
            flight,
            finished: false,
        })
    }

    /// Leads a fill that no one can join: every miss fetches on its own. Only the
    /// "no collapsing" baseline of the reference scenario uses it. The flight is never
    /// in the map, so its permit's cleanup removes nothing.
    pub fn lead_alone(&self, key: &FlightKey, priority: Priority) -> FillPermit {
        FillPermit {
            registry: self.clone(),
            flight: self.new_flight(key, priority),
            finished: false,
        }
    }

    fn new_flight(&self, key: &FlightKey, priority: Priority) -> Arc<Flight> {
        Arc::new(Flight {
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            key: key.clone(),
            progress: watch::Sender::new(Progress::default()),
            priority: AtomicU8::new(priority_to_u8(priority)),
            promoted: Notify::new(),
            waiters: AtomicUsize::new(0),
            leader_body: Mutex::new(None),
            for_client: std::sync::atomic::AtomicBool::new(false),
            readers: Readers::default(),
        })
    }

    /// Leads a fill for `key` only if none is in flight (background refreshes, which
    /// must never queue behind or duplicate a fill).
    pub fn try_lead(&self, key: &FlightKey, priority: Priority) -> Option<FillPermit> {
        if self.lock().contains_key(key) {
            return None;
        }
        match self.acquire(key, priority) {
            Acquire::Lead(permit) => Some(permit),
            _ => None,
        }
    }

    /// Number of keys in flight.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no fill is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a fill for `key` is in flight.
    pub fn contains(&self, key: &FlightKey) -> bool {
        self.lock().contains_key(key)
    }

    /// Removes `key` if it still maps to flight `id` (owner-only removal).
    fn remove_if_owner(&self, key: &FlightKey, id: u64) {
        let mut flights = self.lock();
        if flights.get(key).is_some_and(|f| f.id == id) {
            flights.remove(key);
        }
    }
}

/// Leadership of one fill. Publish the head, the chunks, then exactly one of
/// [`complete`](FillPermit::complete), [`fail`](FillPermit::fail) or
/// [`bypass`](FillPermit::bypass). Dropping it unfinished aborts the flight.
pub struct FillPermit {
    registry: FlightRegistry,
    flight: Arc<Flight>,
    finished: bool,
}

impl FillPermit {
    /// The flight key.
    pub fn key(&self) -> &FlightKey {
        &self.flight.key
    }

    /// The fill's current priority (a user joining raises it to `User`).
    pub fn priority(&self) -> Priority {
        self.flight.priority()
    }

    /// Resolves when a user request promotes this background fill.
    pub async fn promoted(&self) {
        let notified = self.flight.promoted.notified();
        if self.priority() == Priority::User {
            return;
        }
        notified.await;
    }

    /// How many requests joined this flight so far.
    pub fn waiters(&self) -> usize {
        self.flight.waiters.load(Ordering::Relaxed)
    }

    /// A subscriber for the leader's own client. From now on the fill is led for a
    /// client, and abandoned once every subscriber is gone.
    pub fn subscribe(&self) -> FlightSubscriber {
        let subscriber = FlightSubscriber::new(Arc::clone(&self.flight), true);
        self.flight.for_client.store(true, Ordering::Release);
        subscriber
    }

    /// Resolves once this fill, led for a client, has no subscriber left: its leader
    /// and every waiter gave up (a cancelled stream, a closed connection). Never
    /// resolves for a fill no client led (a refresh, a pre-warm). A request may still
    /// join afterwards; if the fill is then dropped, it sees `Aborted` before any byte
    /// and leads afresh.
    /// The future holds the flight, not the permit, so the fill can finish through
    /// its permit while it waits on this.
    pub fn abandoned(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let flight = Arc::clone(&self.flight);
        async move {
            if !flight.for_client.load(Ordering::Acquire) {
                return std::future::pending().await;
            }
            flight.progress.closed().await;
        }
    }

    /// Publishes the response head; waiters start their responses.
    pub fn publish_head(&self, head: Head) {
        let head = Arc::new(head);
        self.flight.progress.send_modify(|p| p.head = Some(head));
    }

    /// Appends one body chunk for every subscriber. Once a windowed body drops its
    /// first chunk, the flight leaves the registry: no one joins a stream whose
    /// start is gone (the next request leads its own).
    pub fn push_chunk(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let mut started_dropping = false;
        self.flight.progress.send_modify(|p| {
            let first = p.first;
            p.held += chunk.len() as u64;
            p.chunks.push_back(chunk);
            p.trim();
            started_dropping = first == 0 && p.first > 0;
        });
        if started_dropping {
            self.registry
                .remove_if_owner(&self.flight.key, self.flight.id);
        }
    }

    /// The body will not be kept whole (too large to store): subscribers are kept
    /// only its last `window` bytes, and the fill paces itself by the slowest
    /// ([`send_chunk`](Self::send_chunk)).
    pub fn share_window(&self, window: u64) {
        self.flight
            .progress
            .send_modify(|p| p.window = Some(window));
    }

    /// [`push_chunk`](Self::push_chunk), once the slowest subscriber of a windowed
    /// body has room for it, or after `patience` without room (then the slowest
    /// falls behind and gets [`FillError::TooLarge`]).
    pub async fn send_chunk(&self, chunk: Bytes, patience: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let notified = self.flight.readers.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let room = {
                let p = self.flight.progress.borrow();
                let Some(window) = p.window else { break };
                let Some(slowest) = self.flight.readers.slowest(p.first) else {
                    break;
                };
                // A chunk larger than the window goes once all before it is read.
                let unread = p.unread(slowest);
                unread == 0 || unread + chunk.len() as u64 <= window
            };
            if room || tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        self.push_chunk(chunk);
    }

    /// The body is complete: publish the end, run `store` (the cache write), then
    /// remove the flight entry.
    pub fn complete(mut self, store: impl FnOnce()) {
        self.finished = true;
        self.flight
            .progress
            .send_modify(|p| p.end = Some(End::Complete));
        store();
        self.registry
            .remove_if_owner(&self.flight.key, self.flight.id);
    }

    /// The fill failed: remove the flight entry (the next request starts afresh),
    /// then give every subscriber the error.
    pub fn fail(mut self, error: FillError) {
        self.finished = true;
        self.registry
            .remove_if_owner(&self.flight.key, self.flight.id);
        self.flight
            .progress
            .send_modify(|p| p.end = Some(End::Failed(error)));
    }

    /// The response is per-user: hand it to the leader only; waiters fetch on their own.
    pub fn bypass(self, head: Head, body: Body) {
        self.hand_to_leader(head, body, None);
    }

    /// The response is per-user and an error (an origin 5xx with `Set-Cookie`): hand
    /// it to the leader only; waiters get `error`, without any of the response, and
    /// do not ask a failing origin once each.
    pub fn bypass_failing(self, head: Head, body: Body, error: FillError) {
        self.hand_to_leader(head, body, Some(error));
    }

    fn hand_to_leader(mut self, head: Head, body: Body, waiters: Option<FillError>) {
        self.finished = true;
        self.registry
            .remove_if_owner(&self.flight.key, self.flight.id);
        let head = Arc::new(head);
        *self
            .flight
            .leader_body
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((head, body));
        self.flight
            .progress
            .send_modify(|p| p.end = Some(End::Bypass(waiters)));
    }
}

impl Drop for FillPermit {
    fn drop(&mut self) {
        if !self.finished {
            self.registry
                .remove_if_owner(&self.flight.key, self.flight.id);
            self.flight.progress.send_modify(|p| {
                if p.end.is_none() {
                    p.end = Some(End::Failed(FillError::Aborted));
                }
            });
        }
    }
}

/// What a subscriber learns before any body byte.
pub enum HeadOutcome {
    /// The shared response head; read the body with [`FlightSubscriber::next_chunk`].
    Head(Arc<Head>),
    /// Not shareable. The leader gets the response itself; a waiter gets `None` and
    /// should fetch on its own.
    Bypass(Option<(Arc<Head>, Body)>),
    /// The fill failed before a response head.
    Failed(FillError),
}

/// One request's view of a flight: the head, then the body from its first chunk.
pub struct FlightSubscriber {
    flight: Arc<Flight>,
    progress: watch::Receiver<Progress>,
    next: usize,
    /// `next`, for a fill that waits for its slowest reader.
    position: Arc<AtomicUsize>,
    is_leader: bool,
}

impl Drop for FlightSubscriber {
    fn drop(&mut self) {
        // A fill waiting for its slowest reader may go on without this one.
        self.flight.readers.advanced();
    }
}

impl FlightSubscriber {
    fn new(flight: Arc<Flight>, is_leader: bool) -> FlightSubscriber {
        let progress = flight.progress.subscribe();
        let position = flight.readers.join();
        FlightSubscriber {
            flight,
            progress,
            next: 0,
            position,
            is_leader,
        }
    }

    /// Whether this is the leader's subscriber.
    pub fn is_leader(&self) -> bool {
        self.is_leader
    }

    /// Waits for the response head (callers bound this wait).
    pub async fn head(&mut self) -> HeadOutcome {
        loop {
            {
                let progress = self.progress.borrow_and_update();
                if let Some(End::Bypass(waiters)) = &progress.end {
                    if !self.is_leader {
                        return match waiters {
                            Some(e) => HeadOutcome::Failed(e.clone()),
                            None => HeadOutcome::Bypass(None),
                        };
                    }
                    drop(progress);
                    let body = self
                        .flight
                        .leader_body
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take();
                    return HeadOutcome::Bypass(body);
                }
                if let Some(head) = &progress.head {
                    return HeadOutcome::Head(Arc::clone(head));
                }
                if let Some(End::Failed(e)) = &progress.end {
                    return HeadOutcome::Failed(e.clone());
                }
            }
            if self.progress.changed().await.is_err() {
                return HeadOutcome::Failed(FillError::Aborted);
            }
        }
    }

    /// The next body chunk; `None` at the end of a complete body, an error if the
    /// fill failed (the client's response must then be aborted, never completed).
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, FillError>> {
        loop {
            {
                let progress = self.progress.borrow_and_update();
                if self.next < progress.first {
                    // Fell behind a stream that is not kept whole.
                    let window = progress.window.unwrap_or(0);
                    return Some(Err(FillError::TooLarge(window)));
                }
                if let Some(chunk) = progress.chunks.get(self.next - progress.first) {
                    self.next += 1;
                    self.position.store(self.next, Ordering::Release);
                    if progress.window.is_some() {
                        self.flight.readers.advanced();
                    }
                    return Some(Ok(chunk.clone()));
                }
                match &progress.end {
                    Some(End::Complete) => return None,
                    Some(End::Failed(e)) => return Some(Err(e.clone())),
                    Some(End::Bypass(_)) => return Some(Err(FillError::Aborted)),
                    None => {}
                }
            }
            if self.progress.changed().await.is_err() {
                return Some(Err(FillError::Aborted));
            }
        }
    }

    /// Reads the rest of the body into one buffer (tests, prefetches).
    pub async fn collect_body(&mut self) -> Result<Bytes, FillError> {
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = self.next_chunk().await {
            body.extend_from_slice(&chunk?);
        }
        Ok(body.freeze())
    }
}

#[cfg(test)]
mod tests;
