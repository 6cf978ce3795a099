//! Supervision of client connections: the timeouts a slow client meets (request
//! head, idle keep-alive, a response it does not take) and the drain at shutdown.
//! (The per-request checks, the address's rate and the header count, are the
//! connection's `gate`.)
//!
//! One sweeper thread per listener looks at every connection's [`Activity`] a few
//! times per timeout and tells a connection to close when one has passed. So the
//! request path arms no timer and takes no lock: a read, a call and the end of a
//! response each bump a counter of their connection, nothing more.
//!
//! Invariants:
//! - A connection's phase is one of: its request head is due (from the accept, or
//!   from the first byte after an idle spell), idle (no request in flight), busy (a
//!   request in flight, from the call until its response body is dropped). Only the
//!   head phase has the header timeout, only the idle phase the idle timeout.
//! - A connection is closed at the send timeout only when its client takes none of
//!   a response for that long, in either of the two ways one can: its socket's
//!   writes blocked with nothing written (HTTP/1 and HTTP/2 alike;
//!   `send_timeout`), or, on HTTP/2, a response body ready for it while no body of
//!   the connection is polled, its flow-control window never opened (counted as the
//!   HTTP/2 abuse `send_stall`; pings and settings still flow, so the socket shows
//!   nothing). A request waiting on a slow origin is bounded by the origin timeouts,
//!   not here. One detector, one setting (`server.send_timeout_ms`).
//! - Once told to close, a connection closes: idle ones gracefully (HTTP/2 `GOAWAY`),
//!   and are dropped if that takes longer than the header timeout; a late head is
//!   dropped at once.
//! - Every registered connection deregisters when its task ends, so the drain at
//!   shutdown ends when the last connection does.
//!
//! Timeouts never fire early, and at most a quarter of the timeout plus one sweep
//! period (a sixteenth of the shortest timeout, at most 100 ms) late: each
//! connection's timeouts are stretched by its own random factor in [1, 1.25), so
//! connections opened together are not all closed, and reopened, together.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::activity::{ABORT, Activity, CLOSE, RUN};
use crate::config::ConnectionLimits;
use crate::metrics::ClientCounters;
use crate::status::{ClientLimit, H2Abuse};

/// The timeouts the sweeper applies.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
    send: Duration,
    /// The sweep period.
    tick: Duration,
    /// Each connection's timeouts are stretched by a random factor in
    /// `[1, 1 + jitter)`, so connections opened together (a flood, a reconnecting
    /// attacker) are not all closed, and reopened, in the same instant.
    jitter: f32,
}

/// The production [`Timeouts::jitter`].
const JITTER: f32 = 0.25;

impl Timeouts {
    fn new(limits: &ConnectionLimits, jitter: f32) -> Timeouts {
        let header = Duration::from_millis(limits.header_timeout_ms);
        let idle = Duration::from_millis(limits.idle_timeout_ms);
        let send = Duration::from_millis(limits.send_timeout_ms);
        let tick = (header.min(idle).min(send) / 16)
            .clamp(Duration::from_millis(5), Duration::from_millis(100));
        Timeouts {
            header,
            idle,
            send,
            tick,
            jitter,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// A request head is due by `deadline`.
    Head { deadline: Instant },
    /// No request in flight; closed at `deadline`; `reads` was the read count when
    /// the spell began.
    Idle { deadline: Instant, reads: u64 },
    /// A request in flight.
    Busy,
}

/// The sweeper's view of one connection.
struct Watched {
    activity: Arc<Activity>,
    /// This connection's timeouts, each stretched by its own factor (see
    /// [`Timeouts::jitter`]).
    header: Duration,
    idle: Duration,
    send: Duration,
    phase: Phase,
    /// `finished` at the last sweep: a change means a request came and went.
    finished: u64,
    /// `writes` at the last sweep, and when blocked writes with no progress since
    /// will have lasted the send timeout.
    writes: u64,
    blocked_deadline: Option<Instant>,
    /// `body_polls` at the last sweep, and when HTTP/2 bodies owed to the client
    /// with no poll since will have waited the send timeout.
    body_polls: u64,
    owed_deadline: Option<Instant>,
    /// Told to close gracefully; dropped if still open at this instant.
    close_by: Option<Instant>,
    /// Told to close by the shutdown (the listener's grace period applies instead).
    draining: bool,
}

/// Connection ids are a counter, not client input: no need for SipHash.
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: spreads consecutive ids over the high bits.
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ById<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

struct Table {
    next_id: u64,
    connections: ById<Watched>,
    shutting_down: bool,
}

/// The connections of one listener, their sweeper and their drain.
pub(crate) struct Supervisor {
    timeouts: Timeouts,
    counters: ClientCounters,
    table: Mutex<Table>,
    drained: Notify,
}

impl Supervisor {
    /// A supervisor for `limits`' timeouts, counting into `counters`, with its sweeper
    /// running until the supervisor is dropped.
    pub(crate) fn start(limits: &ConnectionLimits, counters: ClientCounters) -> Arc<Supervisor> {
        let supervisor = Supervisor::new(limits, counters, JITTER);
        let weak = Arc::downgrade(&supervisor);
        let tick = supervisor.timeouts.tick;
        // A thread of its own, not a tokio timer: a timer in the runtime's wheel makes
        // every worker park (about one per request under light load) look it up.
        let spawned = std::thread::Builder::new()
            .name("conn-sweeper".into())
            .spawn(move || sweep_until_dropped(&weak, tick));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no connection sweeper: client timeouts are off");
        }
        supervisor
    }

    /// A supervisor without a sweeper (tests sweep by hand).
    fn new(limits: &ConnectionLimits, counters: ClientCounters, jitter: f32) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            timeouts: Timeouts::new(limits, jitter),
            counters,
            table: Mutex::new(Table {
                next_id: 0,
                connections: ById::default(),
                shutting_down: false,
            }),
            drained: Notify::new(),
        })
    }

    /// Registers a connection accepted just now, whose activity is `activity`.
    pub(crate) fn register(self: &Arc<Self>, activity: Arc<Activity>) -> Supervised {
        let mut table = lock(&self.table);
        let id = table.next_id;
        table.next_id += 1;
        let draining = table.shutting_down;
        if draining {
            activity.tell(CLOSE);
        }
        let stretch = 1.0 + rand::random::<f32>() * self.timeouts.jitter;
        let header = self.timeouts.header.mul_f32(stretch);
        table.connections.insert(
            id,
            Watched {
                activity: Arc::clone(&activity),
                header,
                idle: self.timeouts.idle.mul_f32(stretch),
                send: self.timeouts.send.mul_f32(stretch),
                phase: Phase::Head {
                    deadline: Instant::now() + header,
                },
                finished: 0,
                writes: 0,
                blocked_deadline: None,
                body_polls: 0,
                owed_deadline: None,
                close_by: None,
                draining,
            },
        );
        Supervised {
            supervisor: Arc::clone(self),
            id,
            activity,
        }
    }

    /// Tells every connection to close gracefully; new ones are told at once.
    pub(crate) fn shutdown(&self) {
        let mut table = lock(&self.table);
        table.shutting_down = true;
        for watched in table.connections.values_mut() {
            watched.draining = true;
            watched.activity.tell(CLOSE);
        }
    }

    /// Resolves when no connection is left.
    pub(crate) async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.table).connections.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Drops every connection still open.
    pub(crate) fn abort_all(&self) {
        for watched in lock(&self.table).connections.values() {
            watched.activity.tell(ABORT);
        }
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.table).connections.len()
    }

    fn sweep(&self, now: Instant) {
        let t = self.timeouts;
        let mut table = lock(&self.table);
        for w in table.connections.values_mut() {
            let a = &w.activity;
            if let Some(close_by) = w.close_by {
                if now >= close_by {
                    a.tell(ABORT);
                }
                continue;
            }
            if w.draining {
                continue;
            }
            // `finished` first: it never passes `started`, so busy is never missed.
            let finished = a.finished.load(Ordering::Acquire);
            let started = a.started.load(Ordering::Acquire);
            let reads = a.reads.load(Ordering::Relaxed);
            let writes = a.writes.load(Ordering::Relaxed);
            if a.write_blocked.load(Ordering::Relaxed) && writes == w.writes {
                let deadline = *w.blocked_deadline.get_or_insert(now + w.send);
                if now >= deadline {
                    self.counters.count(ClientLimit::SendTimeout);
                    a.tell(ABORT);
                    w.close_by = Some(now);
                    continue;
                }
            } else {
                w.blocked_deadline = None;
            }
            w.writes = writes;
            let body_polls = a.body_polls.load(Ordering::Relaxed);
            if a.bodies_owed.load(Ordering::Relaxed) > 0 && body_polls == w.body_polls {
                let deadline = *w.owed_deadline.get_or_insert(now + w.send);
                if now >= deadline {
                    // Dropped, not closed gracefully: the stalled streams can never
                    // finish, so a GOAWAY would wait for nothing.
                    self.counters.h2_connection_error(H2Abuse::SendStall);
                    a.tell(ABORT);
                    w.close_by = Some(now);
                    continue;
                }
            } else {
                w.owed_deadline = None;
            }
            w.body_polls = body_polls;
            if started != finished {
                w.phase = Phase::Busy;
                w.finished = finished;
                continue;
            }
            if matches!(w.phase, Phase::Busy) || finished != w.finished {
                w.phase = Phase::Idle {
                    deadline: now + w.idle,
                    reads,
                };
            }
            w.finished = finished;
            match w.phase {
                Phase::Idle { reads: before, .. }
                    if reads != before && !a.h2.load(Ordering::Relaxed) =>
                {
                    w.phase = Phase::Head {
                        deadline: now + w.header,
                    };
                }
                Phase::Idle { deadline, .. } if now >= deadline => {
                    self.counters.count(ClientLimit::IdleTimeout);
                    a.tell(CLOSE);
                    w.close_by = Some(now + t.header.max(Duration::from_secs(1)));
                }
                Phase::Head { deadline } if now >= deadline => {
                    self.counters.count(ClientLimit::HeaderTimeout);
                    a.tell(ABORT);
                    w.close_by = Some(now);
                }
                _ => {}
            }
        }
    }
}

fn sweep_until_dropped(supervisor: &Weak<Supervisor>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        let Some(supervisor) = supervisor.upgrade() else {
            return;
        };
        supervisor.sweep(Instant::now());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One registered connection; deregisters on drop.
pub(crate) struct Supervised {
    supervisor: Arc<Supervisor>,
    id: u64,
    activity: Arc<Activity>,
}

impl Supervised {
    /// The connection's activity, for its socket and its service.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Runs `work` (a TLS handshake) until it ends or the connection is told to
    /// close (`None`).
    pub(crate) async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        self.run_graceful(work, |_| {}).await
    }

    /// Runs `connection` until it ends; when told to close gracefully, calls
    /// `graceful` on it once and runs it on; when told to abort, drops it (`None`).
    pub(crate) async fn run_graceful<C: Future>(
        &self,
        connection: C,
        graceful: impl FnOnce(Pin<&mut C>),
    ) -> Option<C::Output> {
        let mut connection = std::pin::pin!(connection);
        let mut graceful = Some(graceful);
        // A task polls with the same waker every time: register it once, not per poll.
        let mut registered: Option<std::task::Waker> = None;
        std::future::poll_fn(|cx| {
            if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                self.activity.waker.register(cx.waker());
                registered = Some(cx.waker().clone());
            }
            match self.activity.signal.load(Ordering::Acquire) {
                RUN => {}
                CLOSE => {
                    if let Some(graceful) = graceful.take() {
                        graceful(connection.as_mut());
                    }
                }
                _ => return Poll::Ready(None),
            }
            connection.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let mut table = lock(&self.supervisor.table);
        table.connections.remove(&self.id);
        if table.connections.is_empty() && table.shutting_down {
            self.supervisor.drained.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn limits(header_ms: u64, idle_ms: u64, send_ms: u64) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout_ms: header_ms,
            idle_timeout_ms: idle_ms,
            send_timeout_ms: send_ms,
            ..ConnectionLimits::default()
        }
    }

    fn signal(s: &Supervised) -> u8 {
        s.activity.signal.load(Ordering::Acquire)
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_does_not_arrive_in_time_is_dropped_and_counted() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 60_000, 60_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        sup.sweep(Instant::now() + Duration::from_millis(999));
        assert_eq!(signal(&conn), RUN);
        sup.sweep(Instant::now() + Duration::from_millis(1_000));
        assert_eq!(signal(&conn), ABORT);
        assert_eq!(counters.get(ClientLimit::HeaderTimeout), 1);
        assert_eq!(counters.get(ClientLimit::IdleTimeout), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_runs_from_the_end_of_the_last_request_and_a_later_head_has_its_own_timeout() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 5_000, 60_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        let a = conn.activity();
        let t0 = Instant::now();
        // A request comes and goes: busy, then idle from the next sweep.
        Activity::bump(&a.started);
        sup.sweep(t0 + Duration::from_millis(500));
        a.finished.fetch_add(1, Ordering::Release);
        sup.sweep(t0 + Duration::from_millis(600));
        // Well past the header timeout, but idle: not closed.
        sup.sweep(t0 + Duration::from_millis(5_500));
        assert_eq!(signal(&conn), RUN);
        // A byte arrives: the head's own timeout runs from here.
        Activity::bump(&a.reads);
        sup.sweep(t0 + Duration::from_millis(5_550));
        sup.sweep(t0 + Duration::from_millis(6_500));
        assert_eq!(signal(&conn), RUN);
        sup.sweep(t0 + Duration::from_millis(6_550));
        assert_eq!(signal(&conn), ABORT);
        assert_eq!(counters.get(ClientLimit::HeaderTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_gracefully_then_dropped_if_it_lingers() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 2_000, 60_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        let a = conn.activity();
        let t0 = Instant::now();
        Activity::bump(&a.started);
        a.finished.fetch_add(1, Ordering::Release);
        sup.sweep(t0);
        sup.sweep(t0 + Duration::from_millis(1_999));
        assert_eq!(signal(&conn), RUN);
        sup.sweep(t0 + Duration::from_millis(2_000));
        assert_eq!(signal(&conn), CLOSE);
        assert_eq!(counters.get(ClientLimit::IdleTimeout), 1);
        sup.sweep(t0 + Duration::from_millis(3_000));
        assert_eq!(signal(&conn), ABORT, "dropped after the close grace");
        assert_eq!(counters.get(ClientLimit::IdleTimeout), 1, "counted once");
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_are_no_request_head() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 5_000, 60_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        let a = conn.activity();
        let t0 = Instant::now();
        a.h2.store(true, Ordering::Relaxed);
        Activity::bump(&a.started);
        a.finished.fetch_add(1, Ordering::Release);
        sup.sweep(t0);
        for ms in (100..4_900).step_by(100) {
            Activity::bump(&a.reads);
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN, "pings keep no idle connection open ...");
        sup.sweep(t0 + Duration::from_millis(5_000));
        assert_eq!(signal(&conn), CLOSE, "... but do not close it early either");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_closed_only_when_the_client_takes_nothing() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 1_000, 3_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        let a = conn.activity();
        let t0 = Instant::now();
        Activity::bump(&a.started);
        // Waiting on the origin: no IO at all, far past every timeout but the send one.
        for ms in (0..10_000).step_by(250) {
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN);
        // Writing slowly but steadily: not closed.
        a.write_blocked.store(true, Ordering::Relaxed);
        for ms in (10_000..20_000).step_by(250) {
            Activity::bump(&a.writes);
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN);
        // Blocked with no progress for the send timeout: dropped.
        for ms in (20_000..23_250).step_by(250) {
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), ABORT);
        assert_eq!(counters.get(ClientLimit::SendTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_body_the_client_never_takes_is_cut_off_at_the_send_timeout() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 1_000, 3_000), counters.clone(), 0.0);
        let conn = sup.register(Arc::default());
        let a = conn.activity();
        let t0 = Instant::now();
        a.h2.store(true, Ordering::Relaxed);
        Activity::bump(&a.started);
        // A body owed and taken bit by bit (a window opened now and then): kept.
        a.bodies_owed.fetch_add(1, Ordering::Relaxed);
        for ms in (0..10_000).step_by(250) {
            a.body_polls.fetch_add(1, Ordering::Relaxed);
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN);
        // Its source pending (a slow origin): nothing owed, never closed here.
        a.bodies_owed.fetch_sub(1, Ordering::Relaxed);
        for ms in (10_000..20_000).step_by(250) {
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN);
        // Owed and never polled while pings are answered (the socket takes bytes):
        // dropped at the send timeout, counted as an HTTP/2 stall.
        a.bodies_owed.fetch_add(1, Ordering::Relaxed);
        for ms in (20_000..23_000).step_by(250) {
            Activity::bump(&a.writes);
            sup.sweep(t0 + Duration::from_millis(ms));
        }
        assert_eq!(signal(&conn), RUN, "not early");
        sup.sweep(t0 + Duration::from_millis(23_000));
        assert_eq!(signal(&conn), ABORT);
        assert_eq!(counters.h2_connection_errors(H2Abuse::SendStall), 1);
        assert_eq!(counters.get(ClientLimit::SendTimeout), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_never_closes_early_and_spreads_a_flood_over_a_quarter_of_the_timeout() {
        let counters = ClientCounters::default();
        let sup = Supervisor::new(&limits(1_000, 60_000, 60_000), counters.clone(), JITTER);
        let t0 = Instant::now();
        let conns: Vec<_> = (0..200).map(|_| sup.register(Arc::default())).collect();
        let closed = |conns: &[Supervised]| conns.iter().filter(|c| signal(c) == ABORT).count();
        sup.sweep(t0 + Duration::from_millis(999));
        assert_eq!(closed(&conns), 0, "never early");
        sup.sweep(t0 + Duration::from_millis(1_125));
        let by_middle = closed(&conns);
        assert!(
            (20..180).contains(&by_middle),
            "spread, not all at once: {by_middle}"
        );
        sup.sweep(t0 + Duration::from_millis(1_250));
        assert_eq!(closed(&conns), 200, "all by a quarter late");
        assert_eq!(counters.get(ClientLimit::HeaderTimeout), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_when_the_last_connection_deregisters() {
        let sup = Supervisor::new(&limits(1_000, 1_000, 1_000), ClientCounters::default(), 0.0);
        let a = sup.register(Arc::default());
        let b = sup.register(Arc::default());
        sup.shutdown();
        assert_eq!((signal(&a), signal(&b)), (CLOSE, CLOSE));
        let late = sup.register(Arc::default());
        assert_eq!(
            signal(&late),
            CLOSE,
            "a connection accepted during shutdown"
        );
        // The shutdown's own grace governs draining connections, not the timeouts.
        sup.sweep(Instant::now() + Duration::from_secs(60));
        assert_eq!(signal(&a), CLOSE);
        let drained = tokio::spawn({
            let sup = Arc::clone(&sup);
            async move { sup.drained().await }
        });
        drop((a, b));
        tokio::task::yield_now().await;
        assert!(!drained.is_finished());
        drop(late);
        drained.await.unwrap();
        assert_eq!(sup.len(), 0);
    }

    #[tokio::test]
    async fn a_connection_told_to_abort_is_dropped_and_one_told_to_close_is_closed_gracefully() {
        let sup = Supervisor::new(&limits(1_000, 1_000, 1_000), ClientCounters::default(), 0.0);
        let conn = sup.register(Arc::default());
        conn.activity.tell(CLOSE);
        let closed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&closed);
        let out = conn
            .run_graceful(
                std::future::poll_fn(|_| {
                    if closed.load(Ordering::Relaxed) {
                        Poll::Ready("closed")
                    } else {
                        Poll::Pending
                    }
                }),
                move |_| flag.store(true, Ordering::Relaxed),
            )
            .await;
        assert_eq!(out, Some("closed"));
        conn.activity.tell(ABORT);
        assert_eq!(conn.run(std::future::pending::<()>()).await, None);
    }
}
