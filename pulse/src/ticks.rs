//! When each owned partition's predictor ticks: scores the keys touched since its last
//! tick and decides on them.
//!
//! A partition with new events ticks once [`TICK_MS`] has passed since its last tick
//! in its event time (its heat map's watermark), as the backtest ticks, or in wall
//! time, whichever comes first. Event time makes the ticks a property of the events:
//! how they were batched, how far behind the instance is and how many instances share
//! the topic change neither the decisions nor their cost per event (a tick costs per
//! key touched, so ticking per polled batch made an event cost more as batches shrank,
//! with every instance added). Wall time bounds the wait when the events stop.
//! A partition without new events has nothing to decide: its clock, event time, has
//! not moved.
//!
//! Invariants:
//! 1. A partition ticks only with new events; its first tick is at once.
//! 2. Then once its watermark is [`TICK_MS`] past its last tick's, and not before…
//! 3. …or once [`TICK_MS`] of wall time has passed since its last tick.
//! 4. A tick tells since when its oldest event not yet decided on was waiting, so the
//!    decision latency counts the wait.
//! 5. [`Ticks::next_due`] says how long the poll loop may wait before a partition with
//!    events is due in wall time.
//! 6. A partition no longer owned loses its schedule; owned again, it starts afresh.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Milliseconds between two ticks of a partition with events: the backtest's tick, so
/// live pulse decides at the moments the published precision and lead were measured.
pub(crate) const TICK_MS: u64 = 10;

const TICK: Duration = Duration::from_millis(TICK_MS);

/// The tick schedule of every owned live partition.
#[derive(Debug, Default)]
pub(crate) struct Ticks {
    partitions: HashMap<i32, Schedule>,
}

#[derive(Debug, Default)]
struct Schedule {
    /// The last tick: the watermark it decided at, and when (`None`: never ticked).
    last: Option<(u64, Instant)>,
    /// When the oldest event not yet ticked on was applied (`None`: none waits).
    waiting_since: Option<Instant>,
}

impl Ticks {
    /// Notes that `partition` had events applied at `now`.
    pub(crate) fn events(&mut self, partition: i32, now: Instant) {
        self.partitions
            .entry(partition)
            .or_default()
            .waiting_since
            .get_or_insert(now);
    }

    /// Whether `partition`, its watermark at `watermark_ms`, ticks at `now`; if so,
    /// marks it ticked and returns since when its oldest event was waiting.
    pub(crate) fn take_due(
        &mut self,
        partition: i32,
        watermark_ms: u64,
        now: Instant,
    ) -> Option<Instant> {
        let schedule = self.partitions.get_mut(&partition)?;
        let since = schedule.waiting_since?;
        let due = match schedule.last {
            None => true,
            Some((last_ms, last)) => {
                watermark_ms >= last_ms.saturating_add(TICK_MS) || now >= last + TICK
            }
        };
        if !due {
            return None;
        }
        schedule.last = Some((watermark_ms, now));
        schedule.waiting_since = None;
        Some(since)
    }

    /// How long from `now` until the first partition with waiting events is due in
    /// wall time (zero if one is already); `None` when no events wait.
    pub(crate) fn next_due(&self, now: Instant) -> Option<Duration> {
        self.partitions
            .values()
            .filter(|s| s.waiting_since.is_some())
            .map(|s| {
                s.last.map_or(Duration::ZERO, |(_, last)| {
                    (last + TICK).saturating_duration_since(now)
                })
            })
            .min()
    }

    /// Keeps the schedules of the partitions `owned` says yes to.
    pub(crate) fn retain(&mut self, owned: impl Fn(i32) -> bool) {
        self.partitions.retain(|&p, _| owned(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const T0_MS: u64 = 1_764_460_740_000;

    /// A schedule whose `partition` had events and ticked at once, at t0 and `T0_MS`.
    fn ticked(partition: i32) -> (Ticks, Instant) {
        let (mut ticks, t0) = (Ticks::default(), Instant::now());
        ticks.events(partition, t0);
        assert_eq!(ticks.take_due(partition, T0_MS, t0), Some(t0));
        (ticks, t0)
    }

    #[test]
    fn only_new_events_tick_and_the_first_at_once() {
        let (mut ticks, t0) = (Ticks::default(), Instant::now());
        assert_eq!(ticks.take_due(3, T0_MS, t0), None, "nothing to decide");
        ticks.events(3, t0);
        assert_eq!(ticks.take_due(3, T0_MS, t0), Some(t0));
        assert_eq!(
            ticks.take_due(3, T0_MS + 10 * TICK_MS, t0 + 10 * TICK),
            None,
            "nothing new since"
        );
    }

    #[test]
    fn events_tick_once_their_event_time_moved_a_tick() {
        let (mut ticks, t0) = ticked(0);
        ticks.events(0, t0 + MS);
        assert_eq!(ticks.take_due(0, T0_MS + TICK_MS - 1, t0 + MS), None);
        assert_eq!(
            ticks.take_due(0, T0_MS + TICK_MS, t0 + 2 * MS),
            Some(t0 + MS),
            "a batch read behind spans ticks of event time in no wall time"
        );
    }

    #[test]
    fn events_whose_event_time_stands_still_tick_after_a_tick_of_wall_time() {
        let (mut ticks, t0) = ticked(1);
        ticks.events(1, t0 + MS);
        assert_eq!(ticks.take_due(1, T0_MS + 1, t0 + TICK - MS), None);
        assert_eq!(ticks.take_due(1, T0_MS + 1, t0 + TICK), Some(t0 + MS));
    }

    #[test]
    fn a_tick_reports_its_oldest_waiting_event() {
        let (mut ticks, t0) = ticked(0);
        ticks.events(0, t0 + 2 * MS);
        ticks.events(0, t0 + 5 * MS);
        assert_eq!(
            ticks.take_due(0, T0_MS + TICK_MS, t0 + 6 * MS),
            Some(t0 + 2 * MS)
        );
    }

    #[test]
    fn next_due_is_the_soonest_partition_with_waiting_events() {
        let (mut ticks, t0) = (Ticks::default(), Instant::now());
        assert_eq!(ticks.next_due(t0), None);
        for (p, at) in [(0, t0), (1, t0 + 4 * MS)] {
            ticks.events(p, at);
            ticks.take_due(p, T0_MS, at);
        }
        assert_eq!(
            ticks.next_due(t0),
            None,
            "idle partitions do not hurry the poll"
        );
        ticks.events(1, t0 + 5 * MS);
        assert_eq!(ticks.next_due(t0 + 5 * MS), Some(TICK - MS));
        ticks.events(0, t0 + 6 * MS);
        assert_eq!(ticks.next_due(t0 + 6 * MS), Some(TICK - 6 * MS));
        ticks.events(2, t0 + 7 * MS);
        assert_eq!(
            ticks.next_due(t0 + 7 * MS),
            Some(Duration::ZERO),
            "a new partition is due"
        );
    }

    #[test]
    fn a_partition_no_longer_owned_starts_afresh() {
        let (mut ticks, t0) = ticked(5);
        ticks.events(5, t0 + MS);
        ticks.retain(|p| p != 5);
        assert_eq!(ticks.next_due(t0 + MS), None);
        ticks.events(5, t0 + 2 * MS);
        assert_eq!(ticks.take_due(5, T0_MS, t0 + 2 * MS), Some(t0 + 2 * MS));
    }
}
