//! Origin fill limits: user fills in per-tenant shares, pre-warm fills in spare
//! capacity, and an adaptive limit per origin.
//!
//! - **User** fills share `flight.max_fills` slots by tenant ([`shares`]): each
//!   tenant has a committed share (its `weight` over the sum of the weights) and
//!   borrows idle tenants' slots up to its `peak_fills`. A fill that finds no room
//!   waits in its tenant's queue (its committed share of `flight.max_queued_fills`
//!   places, highest priority class first); released slots go to the queued fills
//!   in deficit round robin across tenants, so the tenant whose fills pile up is the
//!   one that waits. A fill refused by a full queue, pushed out of it by a higher
//!   class, or still waiting after `flight.queue_timeout_ms` fails with
//!   [`FillError::Overloaded`]: the proxy answers 503 with a `Retry-After` that grows
//!   with the tenant's recent refusals and its origin's slowdown, with jitter (so
//!   refused clients do not all return together).
//! - **Each origin** runs at most its [`adaptive`] limit of user fills: it shrinks
//!   when the origin slows down and grows back as it recovers.
//! - **Prefetch** (pre-warm) fills use only spare capacity, below every user class:
//!   a slot is taken only while more than `flight.reserved_for_user` are free, no user
//!   fill is waiting, fewer prefetches run than the node's adaptive prefetch limit
//!   (the same [`adaptive`] rule on every fill's latency), and the fill's tenant has
//!   room for a `background` fill (within its committed share, never borrowing, and
//!   under its origin's adaptive limit; the fill then counts in both). Otherwise the
//!   prefetch waits in a bounded queue for at most
//!   `prefetch.queue_timeout_ms`, and is *shed* (fails with [`FillError::NoCapacity`])
//!   when the queue is full, the wait runs out, or a user fill starts waiting for a
//!   slot: queued prefetches always go before users wait.
//!
//! A prefetch that a user request joins is promoted by the proxy: it stops waiting in
//! the prefetch queue and takes a user slot ([`FillLimiter::acquire_user`]).

mod adaptive;
mod shares;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use models::TenantId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::config::{FlightConfig, PrefetchConfig, TenantConfig, TrafficClass};
use crate::flight::FillError;
use adaptive::AdaptiveLimit;
pub use shares::TenantFills;
use shares::{Shares, Waiter};

/// The class a fill slot was taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillClass {
    /// A user request's fill (or a promoted prefetch).
    User,
    /// A pre-warm fill within spare capacity (its tenant's lowest class).
    Prefetch,
}

/// The labels of refused user fills: a configured tenant (never one read from a
/// request) and a bounded reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TenantReasonLabels {
    /// A tenant id from the configuration.
    pub tenant: String,
    /// `queue_full`, `pushed_out` or `deadline`.
    pub reason: &'static str,
}

/// Why a user fill was refused (the `reason` label of `fills_refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    QueueFull,
    PushedOut,
    Deadline,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::PushedOut => "pushed_out",
            Refusal::Deadline => "deadline",
        }
    }
}

struct State {
    shares: Shares,
    /// Slots taken, both classes.
    active: usize,
    user_queued: usize,
    prefetch_active: usize,
    prefetch_queued: usize,
    /// Bumped whenever queued prefetches must be shed (a user fill had to wait).
    shed_generation: u64,
    prefetch_limit: AdaptiveLimit,
    next_waiter: u64,
}

struct Inner {
    max_fills: usize,
    reserved_for_user: usize,
    retry_after_max_s: u32,
    queue_timeout: Duration,
    max_queued_prefetch: usize,
    prefetch_queue_timeout: Duration,
    /// Wakes queued prefetches: a slot was released, the limit grew, or they must shed.
    changed: Notify,
    refusals: OnceLock<Family<TenantReasonLabels, Counter>>,
    // A std Mutex: every critical section is short bookkeeping, never held across an
    // `.await`.
    state: Mutex<State>,
}

/// The fill limiter shared by every fill of a node. Cheap to clone.
#[derive(Clone)]
pub struct FillLimiter {
    inner: Arc<Inner>,
}

/// One origin fill slot; released on drop. Report the fill's latency with
/// [`FillSlot::record`] so the limits adapt.
pub struct FillSlot {
    inner: Arc<Inner>,
    class: FillClass,
    /// The tenant the slot counts against (every user slot; a tenant's pre-warm).
    tenant: Option<TenantId>,
    /// Fills its origin ran when it was granted, itself included (a user slot): only
    /// a fill sent under a used limit is evidence that the limit may grow.
    sent_with: usize,
}

impl std::fmt::Debug for FillSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillSlot")
            .field("class", &self.class)
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// Decrements the prefetch queue counter even if the waiting future is cancelled.
struct QueuedPrefetch<'a> {
    inner: &'a Inner,
}

impl Drop for QueuedPrefetch<'_> {
    fn drop(&mut self) {
        self.inner.lock().prefetch_queued -= 1;
    }
}

/// A queued user fill: leaves the queue if the waiting future is cancelled, and
/// gives back a slot granted to it that it never took.
struct QueuedUser<'a> {
    inner: &'a Inner,
    tenant: &'a TenantId,
    id: u64,
    answer: oneshot::Receiver<Result<usize, u32>>,
    done: bool,
}

impl Drop for QueuedUser<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.inner.lock();
        let t = state.shares.index_of(self.tenant);
        if state.shares.remove_waiter(t, self.id) {
            state.user_queued -= 1;
        } else if let Ok(Ok(_)) = self.answer.try_recv() {
            self.inner.release_user(&mut state, t);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections only do bookkeeping: recover from poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, state: &State, t: usize, why: Refusal) {
        if let (Some(family), Some(tenant)) = (self.refusals.get(), state.shares.label(t)) {
            family
                .get_or_create(&TenantReasonLabels {
                    tenant: tenant.to_string(),
                    reason: why.as_str(),
                })
                .inc();
        }
    }

    /// Records a refusal of tenant `t`'s fill; the `Retry-After` seconds for it.
    fn refuse(&self, state: &mut State, t: usize, why: Refusal) -> u32 {
        self.count(state, t, why);
        let u = rand::random::<f64>();
        state
            .shares
            .refuse(t, Instant::now(), u, self.retry_after_max_s)
    }

    /// Hands free slots to queued user fills, in fair order across tenants.
    fn dispatch(&self, state: &mut State) {
        let now = Instant::now();
        while state.active < self.max_fills && state.user_queued > 0 {
            let free = self.max_fills - state.active;
            let Some(t) = state.shares.next_fair(free, now) else {
                break;
            };
            let Some(waiter) = state.shares.pop(t) else {
                break;
            };
            state.user_queued -= 1;
            state.active += 1;
            let sent_with = state.shares.start(t);
            if waiter.grant.send(Ok(sent_with)).is_err() {
                state.active -= 1;
                state.shares.finish(t);
            }
        }
    }

    fn release_user(&self, state: &mut State, t: usize) {
        state.active -= 1;
        state.shares.finish(t);
        state.shares.prune(t);
        self.dispatch(state);
    }
}

impl FillLimiter {
    /// A limiter for `flight` and `prefetch` settings; every tenant is unconfigured
    /// (weight 1, its own origin) until [`FillLimiter::set_tenants`].
    pub fn new(flight: &FlightConfig, prefetch: &PrefetchConfig) -> FillLimiter {
        let spare = flight
            .max_fills
            .saturating_sub(flight.reserved_for_user)
            .max(1);
        let prefetch_limit = AdaptiveLimit::new(
            prefetch.min_fills,
            prefetch.max_fills.min(spare),
            prefetch.latency_tolerance,
            prefetch.latency_target_ms,
        );
        FillLimiter {
            inner: Arc::new(Inner {
                max_fills: flight.max_fills,
                reserved_for_user: flight.reserved_for_user,
                retry_after_max_s: flight.retry_after_max_s,
                queue_timeout: Duration::from_millis(flight.queue_timeout_ms),
                max_queued_prefetch: prefetch.max_queued,
                prefetch_queue_timeout: Duration::from_millis(prefetch.queue_timeout_ms),
                changed: Notify::new(),
                refusals: OnceLock::new(),
                state: Mutex::new(State {
                    shares: Shares::new(flight, prefetch),
                    active: 0,
                    user_queued: 0,
                    prefetch_active: 0,
                    prefetch_queued: 0,
                    shed_generation: 0,
                    prefetch_limit,
                    next_waiter: 0,
                }),
            }),
        }
    }

    /// Puts `tenants`' shares, routes and origins in force (at start and on reload);
    /// fills running or queued keep going.
    pub fn set_tenants(&self, tenants: &[TenantConfig]) {
        let mut state = self.inner.lock();
        state.shares.set_tenants(tenants);
        self.inner.dispatch(&mut state);
    }

    /// Counts refused user fills in `family`, by configured tenant and reason.
    pub fn count_refusals_in(&self, family: Family<TenantReasonLabels, Counter>) {
        let _ = self.inner.refusals.set(family);
    }

    /// The priority class of `tenant`'s request for `method` and `path`.
    pub fn class_of(&self, tenant: &TenantId, method: &str, path: &str) -> TrafficClass {
        self.inner.lock().shares.class_of(tenant, method, path)
    }

    /// Most concurrent fills (`flight.max_fills`).
    pub fn max_fills(&self) -> usize {
        self.inner.max_fills
    }

    /// Fill slots free right now (either class).
    pub fn free_slots(&self) -> usize {
        self.inner.max_fills - self.inner.lock().active
    }

    /// The current adaptive prefetch limit (whole fills).
    pub fn prefetch_limit(&self) -> usize {
        self.inner.lock().prefetch_limit.get()
    }

    /// Prefetch fills running now.
    pub fn prefetch_active(&self) -> usize {
        self.inner.lock().prefetch_active
    }

    /// Prefetch fills waiting for a slot now.
    pub fn prefetch_queued(&self) -> usize {
        self.inner.lock().prefetch_queued
    }

    /// User fills waiting for a slot now.
    pub fn user_queued(&self) -> usize {
        self.inner.lock().user_queued
    }

    /// Each configured tenant's share, fills and origin limit now.
    pub fn tenants(&self) -> Vec<TenantFills> {
        self.inner.lock().shares.snapshot()
    }

    /// One tenant's share, fills and origin limit now, configured or not; `None`
    /// while an unconfigured tenant has no fill.
    pub fn tenant_fills(&self, tenant: &TenantId) -> Option<TenantFills> {
        self.inner.lock().shares.fills_of(tenant)
    }

    /// A user fill slot for `tenant`, for a request of `class`: at once if its share
    /// has room, else after the fills queued before it (fair order across tenants).
    /// Queued prefetches are shed first. Fails with [`FillError::Overloaded`] when its
    /// tenant's queue is full, when a higher class pushes it out, or when it has
    /// waited `flight.queue_timeout_ms`.
    pub async fn acquire_user(
        &self,
        tenant: &TenantId,
        class: TrafficClass,
    ) -> Result<FillSlot, FillError> {
        let inner = &*self.inner;
        let now = Instant::now();
        let (id, answer) = {
            let mut state = inner.lock();
            let t = state.shares.index_of(tenant);
            state.shares.touch(t, now);
            let free = inner.max_fills - state.active;
            if !state.shares.queued_at_or_above(t, class)
                && state.shares.has_room(t, class, free, now)
            {
                state.active += 1;
                let sent_with = state.shares.start(t);
                return Ok(self.user_slot(tenant, sent_with));
            }
            let id = state.next_waiter;
            state.next_waiter += 1;
            let (grant, answer) = oneshot::channel();
            match state.shares.enqueue(t, Waiter { id, class, grant }) {
                Err(_refused) => {
                    let retry_after_s = inner.refuse(&mut state, t, Refusal::QueueFull);
                    return Err(FillError::Overloaded { retry_after_s });
                }
                Ok(Some(pushed_out)) => {
                    let retry_after_s = inner.refuse(&mut state, t, Refusal::PushedOut);
                    let _ = pushed_out.grant.send(Err(retry_after_s));
                }
                Ok(None) => state.user_queued += 1,
            }
            // A user has to wait: no prefetch may keep waiting for capacity.
            if state.prefetch_queued > 0 {
                state.shed_generation += 1;
                inner.changed.notify_waiters();
            }
            (id, answer)
        };
        let mut queued = QueuedUser {
            inner,
            tenant,
            id,
            answer,
            done: false,
        };
        let deadline = now + inner.queue_timeout;
        let answer = match tokio::time::timeout_at(deadline, &mut queued.answer).await {
            Ok(answer) => answer.ok(),
            Err(_elapsed) => {
                let mut state = inner.lock();
                let t = state.shares.index_of(tenant);
                if state.shares.remove_waiter(t, id) {
                    state.user_queued -= 1;
                    queued.done = true;
                    let retry_after_s = inner.refuse(&mut state, t, Refusal::Deadline);
                    return Err(FillError::Overloaded { retry_after_s });
                }
                // Answered just now.
                queued.answer.try_recv().ok()
            }
        };
        queued.done = true;
        match answer {
            Some(Ok(sent_with)) => Ok(self.user_slot(tenant, sent_with)),
            Some(Err(retry_after_s)) => Err(FillError::Overloaded { retry_after_s }),
            None => Err(FillError::Aborted),
        }
    }

    /// A prefetch fill slot from spare capacity, waiting at most the queue timeout;
    /// [`FillError::NoCapacity`] when shed. A pre-warm fill of `tenant` also needs
    /// room in the tenant's share as its lowest class, and counts there and at its
    /// origin; `None` (the edge agent's warmer, which fills a cache that is not its
    /// own) counts in the node-wide spare capacity only.
    pub async fn acquire_prefetch(&self, tenant: Option<&TenantId>) -> Result<FillSlot, FillError> {
        let inner = &*self.inner;
        let deadline = Instant::now() + inner.prefetch_queue_timeout;
        let mut queued: Option<(QueuedPrefetch<'_>, u64)> = None;
        loop {
            let notified = inner.changed.notified();
            tokio::pin!(notified);
            // Register for wake-ups before looking, so a release in between is not lost.
            notified.as_mut().enable();
            {
                let mut state = inner.lock();
                if let Some((_, generation)) = &queued
                    && state.shed_generation != *generation
                {
                    return Err(FillError::NoCapacity);
                }
                let free = inner.max_fills - state.active;
                let now = Instant::now();
                let share = tenant.map(|tenant| state.shares.index_of(tenant));
                if state.prefetch_active < state.prefetch_limit.get()
                    && state.user_queued == 0
                    && free > inner.reserved_for_user
                    && share.is_none_or(|t| {
                        state
                            .shares
                            .has_room(t, TrafficClass::Background, free, now)
                    })
                {
                    state.active += 1;
                    state.prefetch_active += 1;
                    let sent_with = share.map_or(0, |t| state.shares.start_prefetch(t));
                    drop(state);
                    drop(queued);
                    return Ok(FillSlot {
                        inner: Arc::clone(&self.inner),
                        class: FillClass::Prefetch,
                        tenant: tenant.cloned(),
                        sent_with,
                    });
                }
                if queued.is_none() {
                    if state.prefetch_queued >= inner.max_queued_prefetch {
                        return Err(FillError::NoCapacity);
                    }
                    state.prefetch_queued += 1;
                    queued = Some((QueuedPrefetch { inner }, state.shed_generation));
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return Err(FillError::NoCapacity),
            }
        }
    }

    fn user_slot(&self, tenant: &TenantId, sent_with: usize) -> FillSlot {
        FillSlot {
            inner: Arc::clone(&self.inner),
            class: FillClass::User,
            tenant: Some(tenant.clone()),
            sent_with,
        }
    }
}

/// `Retry-After` seconds: the usual fill time (at least 1 s), times one plus the
/// controller's error (recent refusals per slot, the origin's slowdown), times a
/// jitter factor in [1, 1.5) drawn from `u` in [0, 1), clamped to [1, `max_s`].
pub fn retry_after_secs(base_s: f64, error: f64, u: f64, max_s: u32) -> u32 {
    let secs = base_s.max(1.0) * (1.0 + error.max(0.0)) * (1.0 + 0.5 * u.clamp(0.0, 1.0));
    (secs.ceil() as u32).clamp(1, max_s.max(1))
}

impl FillSlot {
    /// The class the slot was taken for.
    pub fn class(&self) -> FillClass {
        self.class
    }

    /// Reports a fill's time to the origin's response head (`Some`) or an origin
    /// failure (`None`): the feedback of the node's prefetch limit and of the user
    /// slot's origin limit.
    pub fn record(&self, latency: Option<Duration>) {
        let inner = &self.inner;
        let now = Instant::now();
        let mut state = inner.lock();
        let prefetching = state.prefetch_active;
        let mut grew = state
            .prefetch_limit
            .record(latency, now, prefetching, prefetching);
        if let Some(tenant) = &self.tenant {
            let t = state.shares.index_of(tenant);
            if state.shares.record(t, latency, now, self.sent_with) {
                inner.dispatch(&mut state);
                grew = true;
            }
        }
        drop(state);
        if grew {
            inner.changed.notify_waiters();
        }
    }
}

impl Drop for FillSlot {
    fn drop(&mut self) {
        let inner = &self.inner;
        {
            let mut state = inner.lock();
            let share = self.tenant.as_ref().map(|t| state.shares.index_of(t));
            match (self.class, share) {
                (FillClass::User, Some(t)) => inner.release_user(&mut state, t),
                // A prefetch slot (a user slot always has its tenant).
                (_, share) => {
                    state.active -= 1;
                    state.prefetch_active -= 1;
                    if let Some(t) = share {
                        state.shares.finish_prefetch(t);
                        state.shares.prune(t);
                    }
                    inner.dispatch(&mut state);
                }
            }
        }
        inner.changed.notify_waiters();
    }
}
