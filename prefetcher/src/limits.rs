//! Origin fill limits with two priority classes, user and prefetch.
//!
//! - **User** fills share `flight.max_fills` slots (a FIFO semaphore). When every slot
//!   is busy a user fill waits, but only `flight.max_queued_fills` of them: past that
//!   the node is overloaded and the fill fails with [`FillError::Overloaded`], which
//!   the proxy answers with 503 and a `Retry-After` that grows with the recent
//!   overload and carries jitter (so rejected clients do not all return together).
//! - **Prefetch** fills use only spare capacity: a slot is taken only while more than
//!   `flight.reserved_for_user` are free, no user fill is waiting, and fewer prefetches
//!   run than the adaptive prefetch limit. Otherwise the prefetch waits in a bounded
//!   queue for at most `prefetch.queue_timeout_ms`, and is *shed* (fails with
//!   [`FillError::NoCapacity`]) when the queue is full, the wait runs out, or a user
//!   fill starts waiting for a slot: queued prefetches always go before users wait.
//! - **The adaptive limit** is AIMD on fill latency: every fill reports its time to
//!   the response head; a short-run average above `latency_tolerance` × the long-run
//!   average (or above `latency_target_ms`), or an origin error, multiplies the limit
//!   by 0.8 (at most once per 100 ms); otherwise each fill adds `1/limit`, so the
//!   limit grows by about one per limit's worth of healthy fills.
//!
//! A prefetch that a user request joins is promoted by the proxy: it stops waiting in
//! the prefetch queue and takes a user slot ([`FillLimiter::acquire_user`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::{FlightConfig, PrefetchConfig};
use crate::flight::FillError;

/// The class a fill slot was taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillClass {
    /// A user request's fill (or a promoted prefetch).
    User,
    /// A pre-warm fill within spare capacity.
    Prefetch,
}

const DECREASE_FACTOR: f64 = 0.8;
const DECREASE_EVERY: Duration = Duration::from_millis(100);
const SHORT_ALPHA: f64 = 0.3;
const LONG_ALPHA: f64 = 0.02;
/// Rejections "remembered" for the Retry-After computation decay with this half-life.
const OVERLOAD_HALF_LIFE_S: f64 = 2.0;

#[derive(Debug)]
struct State {
    prefetch_active: usize,
    prefetch_queued: usize,
    user_queued: usize,
    /// Bumped whenever queued prefetches must be shed (a user fill had to wait).
    shed_generation: u64,
    limit: f64,
    short_ms: Option<f64>,
    long_ms: Option<f64>,
    last_decrease: Option<Instant>,
    /// Exponentially decaying count of overload rejections, and when it was updated.
    overload: f64,
    overload_at: Option<Instant>,
}

struct Inner {
    slots: Arc<Semaphore>,
    max_fills: usize,
    reserved_for_user: usize,
    max_queued_user: usize,
    retry_after_max_s: u32,
    min_limit: f64,
    max_limit: f64,
    max_queued_prefetch: usize,
    queue_timeout: Duration,
    tolerance: f64,
    target_ms: Option<f64>,
    /// Wakes queued prefetches: a slot was released, the limit grew, or they must shed.
    changed: Notify,
    // A std Mutex: every critical section is a few arithmetic operations, never held
    // across an `.await`.
    state: Mutex<State>,
}

/// The fill limiter shared by every fill of a node. Cheap to clone.
#[derive(Clone)]
pub struct FillLimiter {
    inner: Arc<Inner>,
}

/// One origin fill slot; released on drop. Report the fill's latency with
/// [`FillSlot::record`] so the prefetch limit adapts.
pub struct FillSlot {
    inner: Arc<Inner>,
    class: FillClass,
    permit: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for FillSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillSlot")
            .field("class", &self.class)
            .finish()
    }
}

/// Decrements a queue counter even if the waiting future is cancelled.
struct Queued<'a> {
    inner: &'a Inner,
    user: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        if self.user {
            state.user_queued -= 1;
        } else {
            state.prefetch_queued -= 1;
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections only do arithmetic: recover from poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FillLimiter {
    /// A limiter for `flight` and `prefetch` settings.
    pub fn new(flight: &FlightConfig, prefetch: &PrefetchConfig) -> FillLimiter {
        let spare = flight
            .max_fills
            .saturating_sub(flight.reserved_for_user)
            .max(1);
        let max_limit = prefetch.max_fills.min(spare).max(1) as f64;
        let min_limit = (prefetch.min_fills.max(1) as f64).min(max_limit);
        FillLimiter {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(flight.max_fills)),
                max_fills: flight.max_fills,
                reserved_for_user: flight.reserved_for_user,
                max_queued_user: flight.max_queued_fills,
                retry_after_max_s: flight.retry_after_max_s,
                min_limit,
                max_limit,
                max_queued_prefetch: prefetch.max_queued,
                queue_timeout: Duration::from_millis(prefetch.queue_timeout_ms),
                tolerance: prefetch.latency_tolerance,
                target_ms: prefetch.latency_target_ms.map(|ms| ms as f64),
                changed: Notify::new(),
                state: Mutex::new(State {
                    prefetch_active: 0,
                    prefetch_queued: 0,
                    user_queued: 0,
                    shed_generation: 0,
                    limit: max_limit,
                    short_ms: None,
                    long_ms: None,
                    last_decrease: None,
                    overload: 0.0,
                    overload_at: None,
                }),
            }),
        }
    }

    /// Most concurrent fills (`flight.max_fills`).
    pub fn max_fills(&self) -> usize {
        self.inner.max_fills
    }

    /// Fill slots free right now (either class).
    pub fn free_slots(&self) -> usize {
        self.inner.slots.available_permits()
    }

    /// The current adaptive prefetch limit (whole fills).
    pub fn prefetch_limit(&self) -> usize {
        self.inner.lock().limit.floor() as usize
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

    /// A user fill slot: at once if one is free, else after the fills queued before
    /// it. Queued prefetches are shed first. Fails with [`FillError::Overloaded`] when
    /// `max_queued_fills` user fills already wait.
    pub async fn acquire_user(&self) -> Result<FillSlot, FillError> {
        let inner = &self.inner;
        if let Ok(permit) = Arc::clone(&inner.slots).try_acquire_owned() {
            return Ok(self.slot(FillClass::User, permit));
        }
        let _queued = {
            let mut state = inner.lock();
            if state.user_queued >= inner.max_queued_user {
                return Err(FillError::Overloaded {
                    retry_after_s: self.reject(&mut state),
                });
            }
            state.user_queued += 1;
            // A user has to wait: no prefetch may keep waiting for capacity.
            if state.prefetch_queued > 0 {
                state.shed_generation += 1;
                inner.changed.notify_waiters();
            }
            Queued { inner, user: true }
        };
        let permit = Arc::clone(&inner.slots)
            .acquire_owned()
            .await
            .map_err(|_| FillError::Aborted)?;
        Ok(self.slot(FillClass::User, permit))
    }

    /// A prefetch fill slot from spare capacity, waiting at most the queue timeout;
    /// [`FillError::NoCapacity`] when shed.
    pub async fn acquire_prefetch(&self) -> Result<FillSlot, FillError> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.queue_timeout;
        let mut queued: Option<(Queued<'_>, u64)> = None;
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
                if (state.prefetch_active as f64) + 1.0 <= state.limit
                    && state.user_queued == 0
                    && inner.slots.available_permits() > inner.reserved_for_user
                    && let Ok(permit) = Arc::clone(&inner.slots).try_acquire_owned()
                {
                    state.prefetch_active += 1;
                    drop(state);
                    drop(queued);
                    return Ok(self.slot(FillClass::Prefetch, permit));
                }
                if queued.is_none() {
                    if state.prefetch_queued >= inner.max_queued_prefetch {
                        return Err(FillError::NoCapacity);
                    }
                    state.prefetch_queued += 1;
                    queued = Some((Queued { inner, user: false }, state.shed_generation));
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return Err(FillError::NoCapacity),
            }
        }
    }

    fn slot(&self, class: FillClass, permit: OwnedSemaphorePermit) -> FillSlot {
        FillSlot {
            inner: Arc::clone(&self.inner),
            class,
            permit: Some(permit),
        }
    }

    /// Records one overload rejection and returns the `Retry-After` seconds for it.
    fn reject(&self, state: &mut State) -> u32 {
        let now = Instant::now();
        let decayed = match state.overload_at {
            Some(at) => {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                state.overload * 0.5f64.powf(dt / OVERLOAD_HALF_LIFE_S)
            }
            None => 0.0,
        };
        state.overload = decayed + 1.0;
        state.overload_at = Some(now);
        let base_s = state.long_ms.map_or(1.0, |ms| ms / 1000.0);
        retry_after_secs(
            base_s,
            state.overload / self.inner.max_fills as f64,
            rand::random::<f64>(),
            self.inner.retry_after_max_s,
        )
    }
}

/// `Retry-After` seconds: the usual fill time (at least 1 s), times one plus the
/// recent overload (rejections per fill slot), times a jitter factor in [1, 1.5)
/// drawn from `u` in [0, 1), clamped to [1, `max_s`].
pub fn retry_after_secs(base_s: f64, overload: f64, u: f64, max_s: u32) -> u32 {
    let secs = base_s.max(1.0) * (1.0 + overload.max(0.0)) * (1.0 + 0.5 * u.clamp(0.0, 1.0));
    (secs.ceil() as u32).clamp(1, max_s.max(1))
}

impl FillSlot {
    /// The class the slot was taken for.
    pub fn class(&self) -> FillClass {
        self.class
    }

    /// Reports a fill's time to the origin's response head (`Some`) or an origin
    /// failure (`None`): the feedback of the adaptive prefetch limit.
    pub fn record(&self, latency: Option<Duration>) {
        let inner = &self.inner;
        let mut state = inner.lock();
        let slow = match latency {
            None => true,
            Some(latency) => {
                let ms = latency.as_secs_f64() * 1000.0;
                let short = state.short_ms.map_or(ms, |s| s + SHORT_ALPHA * (ms - s));
                let long = state.long_ms.map_or(ms, |l| l + LONG_ALPHA * (ms - l));
                state.short_ms = Some(short);
                state.long_ms = Some(long);
                // A few ms of noise on a fast origin is not a slowdown.
                short > (long * inner.tolerance).max(long + 5.0)
                    || inner.target_ms.is_some_and(|t| short > t)
            }
        };
        let before = state.limit;
        if slow {
            let now = Instant::now();
            if state
                .last_decrease
                .is_none_or(|at| now.saturating_duration_since(at) >= DECREASE_EVERY)
            {
                state.limit = (state.limit * DECREASE_FACTOR).max(inner.min_limit);
                state.last_decrease = Some(now);
            }
        } else {
            state.limit = (state.limit + 1.0 / state.limit).min(inner.max_limit);
        }
        let grew = state.limit.floor() > before.floor();
        drop(state);
        if grew {
            inner.changed.notify_waiters();
        }
    }
}

impl Drop for FillSlot {
    fn drop(&mut self) {
        // Give the slot back before waking queued prefetches, so they can take it.
        drop(self.permit.take());
        if self.class == FillClass::Prefetch {
            self.inner.lock().prefetch_active -= 1;
        }
        self.inner.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max_fills: usize, reserved: usize, prefetch_max: usize) -> FillLimiter {
        let flight = FlightConfig {
            max_fills,
            reserved_for_user: reserved,
            max_queued_fills: 2,
            ..FlightConfig::default()
        };
        let prefetch = PrefetchConfig {
            max_fills: prefetch_max,
            min_fills: 1,
            max_queued: 2,
            queue_timeout_ms: 1_000,
            ..PrefetchConfig::default()
        };
        FillLimiter::new(&flight, &prefetch)
    }

    #[tokio::test(start_paused = true)]
    async fn prefetches_use_spare_capacity_only_and_time_out_when_shed() {
        let l = limiter(4, 1, 8);
        assert_eq!(l.prefetch_limit(), 3, "capped at max_fills - reserved");
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(l.acquire_prefetch().await.unwrap());
        }
        assert_eq!(l.free_slots(), 1, "the user reserve stays free");
        let started = Instant::now();
        assert_eq!(
            l.acquire_prefetch().await.unwrap_err(),
            FillError::NoCapacity
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "waited the queue timeout"
        );
        let user = l.acquire_user().await.unwrap();
        assert_eq!(user.class(), FillClass::User);
        let waiter = tokio::spawn({
            let l = l.clone();
            async move { l.acquire_prefetch().await.map(|s| s.class()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(l.prefetch_queued(), 1);
        drop(user);
        tokio::task::yield_now().await;
        assert_eq!(l.prefetch_queued(), 1, "the freed slot is the user reserve");
        // A released prefetch slot wakes the queued prefetch.
        drop(held.pop());
        assert_eq!(waiter.await.unwrap(), Ok(FillClass::Prefetch));
        assert_eq!(l.prefetch_queued(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_user_sheds_queued_prefetches_and_the_user_queue_is_bounded() {
        let l = limiter(2, 1, 1);
        let _p = l.acquire_prefetch().await.unwrap();
        let _u = l.acquire_user().await.unwrap();
        let queued = tokio::spawn({
            let l = l.clone();
            async move { l.acquire_prefetch().await.map(|s| s.class()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(l.prefetch_queued(), 1);
        let users: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.acquire_user().await.map(|s| s.class()) })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(queued.await.unwrap(), Err(FillError::NoCapacity));
        assert_eq!(l.user_queued(), 2);
        match l.acquire_user().await.unwrap_err() {
            FillError::Overloaded { retry_after_s } => assert!(retry_after_s >= 1),
            other => panic!("{other:?}"),
        }
        drop(_u);
        drop(_p);
        for u in users {
            assert_eq!(u.await.unwrap(), Ok(FillClass::User));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_prefetch_limit_shrinks_when_latency_rises_and_recovers() {
        let l = limiter(64, 0, 16);
        let slot = l.acquire_user().await.unwrap();
        for _ in 0..50 {
            slot.record(Some(Duration::from_millis(20)));
        }
        assert_eq!(l.prefetch_limit(), 16);
        for _ in 0..10 {
            tokio::time::advance(DECREASE_EVERY).await;
            slot.record(Some(Duration::from_millis(400)));
        }
        let shrunk = l.prefetch_limit();
        assert!(shrunk < 8, "limit {shrunk}");
        for _ in 0..5 {
            tokio::time::advance(DECREASE_EVERY).await;
            slot.record(None);
        }
        assert!(l.prefetch_limit() <= shrunk);
        assert!(l.prefetch_limit() >= 1, "never below min_fills");
        for _ in 0..2_000 {
            slot.record(Some(Duration::from_millis(20)));
        }
        assert_eq!(l.prefetch_limit(), 16, "healthy fills raise it back");
    }

    #[test]
    fn retry_after_grows_with_overload_and_is_jittered_and_capped() {
        assert_eq!(retry_after_secs(0.01, 0.0, 0.0, 30), 1);
        assert_eq!(retry_after_secs(1.0, 3.0, 0.0, 30), 4);
        assert_eq!(retry_after_secs(1.0, 3.0, 0.99, 30), 6);
        assert_eq!(retry_after_secs(2.0, 100.0, 0.5, 30), 30);
        let low: u32 = (0..10)
            .map(|i| retry_after_secs(1.0, 0.5, i as f64 / 10.0, 60))
            .sum();
        let high: u32 = (0..10)
            .map(|i| retry_after_secs(1.0, 8.0, i as f64 / 10.0, 60))
            .sum();
        assert!(high > low);
    }
}
