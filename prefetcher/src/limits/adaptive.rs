//! [`AdaptiveLimit`]: a concurrency limit that follows the latency of what it
//! guards (Vegas-style, on latency against its no-load latency), one per origin for
//! user fills and one per node for pre-warm fills.
//!
//! Every fill reports its time to the response head. The limit compares a short-run
//! average with the origin's *no-load* latency: the lowest the short-run average has
//! been, which follows a faster origin at once and a slower one only over
//! `BASE_RISE` (30 s), so a sustained overload stays visible instead of becoming
//! the new normal. The origin may queue `tolerance - 1` × the no-load latency (at
//! least 5 ms: noise on a fast origin is not a queue):
//! - past all of it (or past the target, if set), or on an origin error, the limit
//!   shrinks ×0.8, at most once per 100 ms so one slow burst counts once;
//! - past half of it a queue is building: the limit holds (Vegas's band between
//!   alpha and beta) and a slow start ends (as HyStart ends TCP's); one fill past
//!   it ends a slow start too, before the average has moved;
//! - below half of it the limit grows, by one per fill in slow start and by
//!   `1/limit` after, but only on a fill that was itself below half of it and was
//!   sent while at least half of the limit was in use (TCP's congestion window
//!   validation): fills sent before a herd, when a node ran a few, say nothing
//!   about the herd.
//!
//! A slow-starting limit (an origin's) less than half used decays ×0.8 per 100 ms
//! toward twice what is used and slow-starts again from there (as TCP after idle), so a herd reaching every node at
//! once is let through with what the nodes were using, not with what their bursts
//! once validated. An origin whose latency grows with its load is thus held below
//! the load where its latency reaches `tolerance` × its no-load one, and a recovered
//! one is given its fills back as fast as it answers them.

use std::time::Duration;

use tokio::time::Instant;

const DECREASE_FACTOR: f64 = 0.8;
pub(crate) const DECREASE_EVERY: Duration = Duration::from_millis(100);
const SHORT_ALPHA: f64 = 0.3;
const LONG_ALPHA: f64 = 0.02;
/// Where a slow-starting limit starts (TCP's initial window).
const INITIAL: f64 = 10.0;
/// How slowly the no-load latency follows an origin that got slower for good.
const BASE_RISE: Duration = Duration::from_secs(30);

/// Where recent latency stands against the no-load latency.
enum Reading {
    /// Within half the tolerated queueing delay: room to grow, if the fill itself
    /// was within it too (a slow fill is no evidence of room, even before the
    /// average has moved).
    Headroom { evidence: bool },
    /// Past half of it: a queue is building.
    Queueing,
    /// Past all of it (or past the target), or the origin failed.
    Slow,
}

/// An adaptive concurrency limit in `[min, max]`, starting at `max`.
#[derive(Debug, Clone)]
pub(crate) struct AdaptiveLimit {
    limit: f64,
    min: f64,
    max: f64,
    tolerance: f64,
    target_ms: Option<f64>,
    short_ms: Option<f64>,
    long_ms: Option<f64>,
    /// The no-load latency, and when it was last updated.
    base_ms: Option<f64>,
    base_at: Option<Instant>,
    last_decrease: Option<Instant>,
    /// Until the first slowdown the limit grows by one per healthy fill (doubling
    /// each round of fills, as TCP's slow start), from a few fills.
    slow_start: bool,
    /// A slow-starting limit decays while less than half used (one that starts at
    /// `max`, the pre-warm class's cap on spare capacity, does not).
    decays: bool,
}

impl AdaptiveLimit {
    /// A limit between `min` and `max` (at least 1) that shrinks when recent
    /// latency exceeds `tolerance` × the usual one, or `target_ms` when set.
    pub(crate) fn new(min: usize, max: usize, tolerance: f64, target_ms: Option<u64>) -> Self {
        let max = max.max(1) as f64;
        AdaptiveLimit {
            limit: max,
            min: (min.max(1) as f64).min(max),
            max,
            tolerance,
            target_ms: target_ms.map(|ms| ms as f64),
            short_ms: None,
            long_ms: None,
            base_ms: None,
            base_at: None,
            last_decrease: None,
            slow_start: false,
            decays: false,
        }
    }

    /// A limit between `min` and `max` that starts at `INITIAL` fills and grows by
    /// one per healthy fill until the first slowdown: a new origin is not sent
    /// `max` fills before its latency has said anything.
    pub(crate) fn slow_start(
        min: usize,
        max: usize,
        tolerance: f64,
        target_ms: Option<u64>,
    ) -> Self {
        let mut limit = AdaptiveLimit::new(min, max, tolerance, target_ms);
        limit.limit = INITIAL.clamp(limit.min, limit.max);
        limit.slow_start = true;
        limit.decays = true;
        limit
    }

    /// A limit that never moves from `max` (the fixed baseline).
    pub(crate) fn fixed(max: usize) -> Self {
        let mut limit = AdaptiveLimit::new(max, max, f64::INFINITY, None);
        limit.min = limit.max;
        limit
    }

    /// Whole fills allowed now.
    pub(crate) fn get(&self) -> usize {
        self.limit.floor() as usize
    }

    /// The usual latency (the long-run average), once a fill has reported.
    pub(crate) fn usual_ms(&self) -> Option<f64> {
        self.long_ms
    }

    /// How far recent latency is above the no-load one (0 when it is not): the
    /// controller's error, which `Retry-After` grows with.
    pub(crate) fn error(&self) -> f64 {
        match (self.short_ms, self.base_ms) {
            (Some(short), Some(base)) if base > 0.0 => (short / base - 1.0).max(0.0),
            _ => 0.0,
        }
    }

    /// Feeds one fill's time to the response head (`Some`) or an origin failure
    /// (`None`), with `sent_with` fills running when it was sent (itself included)
    /// and `in_flight` now; returns whether the whole-fill limit grew. Only a fill sent under a limit at
    /// least half used is evidence for growth (as TCP's congestion window
    /// validation): quiet hours, and fills sent before a herd, do not build up a
    /// limit that the herd would be let through with before its latency comes back.
    pub(crate) fn record(
        &mut self,
        latency: Option<Duration>,
        now: Instant,
        sent_with: usize,
        in_flight: usize,
    ) -> bool {
        let reading = match latency {
            None => Reading::Slow,
            Some(latency) => {
                let ms = latency.as_secs_f64() * 1000.0;
                let short = self.short_ms.map_or(ms, |s| s + SHORT_ALPHA * (ms - s));
                let long = self.long_ms.map_or(ms, |l| l + LONG_ALPHA * (ms - l));
                let rise = self.base_at.map_or(1.0, |at| {
                    (now.saturating_duration_since(at).as_secs_f64() / BASE_RISE.as_secs_f64())
                        .min(1.0)
                });
                let base = match self.base_ms {
                    Some(base) if short > base => base + rise * (short - base),
                    _ => short,
                };
                self.short_ms = Some(short);
                self.long_ms = Some(long);
                self.base_ms = Some(base);
                self.base_at = Some(now);
                // The queueing delay tolerated above the no-load latency (a few ms
                // of noise on a fast origin is not queueing).
                let tolerated = (base * (self.tolerance - 1.0)).max(5.0);
                if short > base + tolerated || self.target_ms.is_some_and(|t| short > t) {
                    Reading::Slow
                } else if short > base + tolerated / 2.0 {
                    Reading::Queueing
                } else {
                    Reading::Headroom {
                        evidence: ms <= base + tolerated / 2.0,
                    }
                }
            }
        };
        let before = self.limit;
        match reading {
            Reading::Slow => {
                if self.may_decrease(now) {
                    self.limit = (self.limit * DECREASE_FACTOR).max(self.min);
                    self.last_decrease = Some(now);
                }
                self.slow_start = false;
            }
            // A queue is building: hold the limit, and stop doubling it.
            Reading::Queueing if 2.0 * in_flight as f64 >= self.limit => self.slow_start = false,
            Reading::Headroom { evidence: true } if 2.0 * sent_with as f64 >= self.limit => {
                let step = if self.slow_start {
                    1.0
                } else {
                    1.0 / self.limit
                };
                self.limit = (self.limit + step).min(self.max);
            }
            // The fill itself queued: no evidence of room, and the end of a slow
            // start (as HyStart judges each round, not an average).
            Reading::Headroom { evidence: false } if 2.0 * in_flight as f64 >= self.limit => {
                self.slow_start = false
            }
            Reading::Headroom { .. } if 2.0 * in_flight as f64 >= self.limit => {}
            // Less than half used: the limit decays toward twice what is used, so
            // a herd arriving at every node at once is let through with what the
            // nodes were using, not with what their bursts once validated.
            _ if self.decays && self.may_decrease(now) => {
                let used = 2.0 * in_flight as f64;
                self.limit = (self.limit * DECREASE_FACTOR).max(used).max(self.min);
                self.last_decrease = Some(now);
                // As TCP after idle: back to what is used, then slow start again
                // (it ends at the first sign of a queue).
                self.slow_start = true;
            }
            _ => {}
        }
        self.limit.floor() > before.floor()
    }

    /// At most one decrease per `DECREASE_EVERY`: one slow burst counts once.
    fn may_decrease(&self, now: Instant) -> bool {
        self.last_decrease
            .is_none_or(|at| now.saturating_duration_since(at) >= DECREASE_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Option<Duration> {
        Some(Duration::from_millis(v))
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_shrinks_on_a_slowing_origin_and_grows_back_when_it_recovers() {
        let mut l = AdaptiveLimit::new(1, 16, 2.0, None);
        for _ in 0..50 {
            l.record(ms(20), Instant::now(), l.get(), l.get());
        }
        assert_eq!(l.get(), 16);
        for _ in 0..10 {
            tokio::time::advance(DECREASE_EVERY).await;
            l.record(ms(400), Instant::now(), l.get(), l.get());
        }
        let shrunk = l.get();
        assert!(shrunk < 8, "limit {shrunk}");
        assert!(l.error() > 1.0, "recent latency far above the usual");
        for _ in 0..5 {
            tokio::time::advance(DECREASE_EVERY).await;
            l.record(None, Instant::now(), l.get(), l.get());
        }
        assert!(l.get() <= shrunk && l.get() >= 1, "never below min");
        for _ in 0..2_000 {
            l.record(ms(20), Instant::now(), l.get(), l.get());
        }
        assert_eq!(l.get(), 16, "healthy fills raise it back");
        assert_eq!(l.error(), 0.0);
    }

    /// A slow-starting limit begins at a few fills, doubles per round of healthy
    /// fills, and holds an origin whose latency grows with its load between the load
    /// where a queue starts to show and the one where its latency reaches
    /// `tolerance` × the no-load one: under its capacity.
    #[tokio::test(start_paused = true)]
    async fn a_slow_start_finds_where_a_loaded_origin_slows_down() {
        let mut l = AdaptiveLimit::slow_start(1, 1_000, 1.5, None);
        assert_eq!(l.get(), 10);
        // An origin answering in 50 ms × (1 + (fills / 100)²): 2× at its capacity, 100.
        let latency = |fills: usize| {
            let load = fills as f64 / 100.0;
            ms((50.0 * (1.0 + load * load)) as u64)
        };
        for _ in 0..2_000 {
            tokio::time::advance(Duration::from_millis(5)).await;
            let fills = l.get();
            l.record(latency(fills), Instant::now(), fills, fills);
        }
        let held = l.get();
        assert!((40..100).contains(&held), "held at {held} fills");
        let mut fixed = AdaptiveLimit::fixed(1_000);
        fixed.record(latency(fixed.get()), Instant::now(), 1_000, 1_000);
        assert_eq!(
            fixed.get(),
            1_000,
            "a fixed limit would send 10× the capacity"
        );
    }

    /// Healthy fills far below the limit do not raise it: it decays toward twice
    /// what is used, then slow-starts again once it is used.
    #[tokio::test(start_paused = true)]
    async fn a_limit_grows_only_while_it_is_used_and_decays_when_it_is_not() {
        let mut l = AdaptiveLimit::slow_start(1, 256, 1.5, None);
        for _ in 0..1_000 {
            tokio::time::advance(Duration::from_millis(10)).await;
            l.record(ms(20), Instant::now(), 2, 2);
        }
        let decayed = l.get();
        assert!(
            decayed <= 5,
            "two fills at a time keep about twice that: {decayed}"
        );
        for _ in 0..100 {
            l.record(ms(20), Instant::now(), l.get(), l.get());
        }
        assert_eq!(
            l.get(),
            decayed + 100,
            "slow start: +1 per healthy fill once in use"
        );
    }

    /// Latency past half the tolerated queueing delay holds the limit and ends the
    /// slow start; below it the limit grows again, by 1/limit per fill.
    #[tokio::test(start_paused = true)]
    async fn a_building_queue_holds_the_limit_and_ends_the_slow_start() {
        let mut l = AdaptiveLimit::slow_start(1, 256, 1.5, None);
        for _ in 0..10 {
            l.record(ms(100), Instant::now(), l.get(), l.get());
        }
        assert_eq!(l.get(), 20, "slow start at the no-load latency");
        // 100 ms no-load, 50 ms tolerated: 130 ms is a queue, not yet a slowdown.
        for _ in 0..10 {
            l.record(ms(130), Instant::now(), l.get(), l.get());
        }
        let held = l.get();
        for _ in 0..20 {
            l.record(ms(130), Instant::now(), l.get(), l.get());
        }
        assert_eq!(l.get(), held, "held while the queue builds");
        assert!(held < 30, "growth stopped early: {held}");
        for _ in 0..40 {
            l.record(ms(100), Instant::now(), l.get(), l.get());
        }
        let grown = l.get();
        assert!(
            grown > held && grown < held + 5,
            "no slow start after a queue: {held} → {grown}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_slow_burst_shrinks_the_limit_once_and_a_fixed_limit_never_moves() {
        let mut l = AdaptiveLimit::new(1, 100, 2.0, None);
        l.record(ms(20), Instant::now(), l.get(), l.get());
        for _ in 0..20 {
            l.record(ms(2_000), Instant::now(), l.get(), l.get());
        }
        assert_eq!(l.get(), 80, "one decrease per 100 ms");
        let mut fixed = AdaptiveLimit::fixed(100);
        for _ in 0..20 {
            tokio::time::advance(DECREASE_EVERY).await;
            fixed.record(ms(20 * 1_000), Instant::now(), 100, 100);
            fixed.record(None, Instant::now(), 100, 100);
        }
        assert_eq!(fixed.get(), 100);
    }
}
