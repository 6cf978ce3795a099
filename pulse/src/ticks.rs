//! When each owned partition's predictor ticks: scores the keys touched since its last
//! tick and decides on them.
//!
//! A partition ticks on a grid of its event time: right before the event that moves its
//! watermark into a new [`TICK_MS`] cell (ingest asks before each such event,
//! mid-batch), so a tick decides on whole cells, as the backtest ticks. The ticks are then a property of the
//! events, in the partition's order: however they were batched, however far behind the
//! instance is and however many instances share the topic, the same events are decided
//! on at the same moments, with the same state, and give the same commands and ids (a
//! replay after a crash included). When the events stop, the last ones wait at most
//! [`IDLE_MS`] of wall time with none applied (an *idle* tick: where the pause falls
//! between cells, as when edges send a quarter second at a time, it decides on what
//! the grid tick would have, and sends the same commands).
//! A partition without new events has nothing to decide: its clock, event time, has
//! not moved.
//!
//! Invariants:
//! 1. A partition ticks only with new events: right before the event that moves its
//!    watermark into a new [`TICK_MS`] cell ([`Ticks::take_crossed`], asked by ingest);
//! 2. or once its watermark is in a later cell than its last tick's (a batch whose
//!    cells ingest did not follow, the end of a replay), and not before…
//! 3. …or once [`IDLE_MS`] of wall time has passed since its last event was applied.
//! 4. A tick tells since when its oldest event not yet decided on was waiting, so the
//!    decision latency counts the wait.
//! 5. [`Ticks::next_due`] says how long the poll loop may wait before a partition with
//!    events is due in wall time.
//! 6. A partition no longer owned loses its schedule; owned again, it starts afresh.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Milliseconds of event time between two ticks of a partition with events: the
/// backtest's tick, so live pulse decides at the moments the published precision and
/// lead were measured.
pub(crate) const TICK_MS: u64 = 10;

/// Wall time with no new event after which the events waiting are decided on: the
/// bound on the decision wait when a partition's events stop.
pub(crate) const IDLE_MS: u64 = 20;

const IDLE: Duration = Duration::from_millis(IDLE_MS);

/// The tick cell of an event time.
pub(crate) fn cell(ms: u64) -> u64 {
    ms / TICK_MS
}

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
    /// When the newest was.
    last_event: Option<Instant>,
}

impl Ticks {
    /// Notes that `partition` had events applied at `now`.
    pub(crate) fn events(&mut self, partition: i32, now: Instant) {
        let schedule = self.partitions.entry(partition).or_default();
        schedule.waiting_since.get_or_insert(now);
        schedule.last_event = Some(now);
    }

    /// Whether `partition`, its watermark at `watermark_ms`, ticks at `now` (its
    /// watermark is in a later cell than its last tick's, or it is idle); if so, marks
    /// it ticked and returns since when its oldest event was waiting.
    pub(crate) fn take_due(
        &mut self,
        partition: i32,
        watermark_ms: u64,
        now: Instant,
    ) -> Option<Instant> {
        let schedule = self.partitions.get_mut(&partition)?;
        schedule.waiting_since?;
        let idle = schedule.last_event.is_none_or(|last| now >= last + IDLE);
        let later_cell = schedule
            .last
            .is_some_and(|(last_ms, _)| cell(watermark_ms) > cell(last_ms));
        if !(later_cell || idle) {
            return None;
        }
        self.take_crossed(partition, watermark_ms, now)
    }

    /// Ticks `partition` now, if it has events waiting: the next event opens a new
    /// cell.
    pub(crate) fn take_crossed(
        &mut self,
        partition: i32,
        watermark_ms: u64,
        now: Instant,
    ) -> Option<Instant> {
        let schedule = self.partitions.get_mut(&partition)?;
        let since = schedule.waiting_since.take()?;
        schedule.last = Some((watermark_ms, now));
        Some(since)
    }

    /// How long from `now` until the first partition with waiting events is due in
    /// wall time (zero if one is already); `None` when no events wait.
    pub(crate) fn next_due(&self, now: Instant) -> Option<Duration> {
        self.partitions
            .values()
            .filter(|s| s.waiting_since.is_some())
            .map(|s| {
                s.last_event.map_or(Duration::ZERO, |event| {
                    (event + IDLE).saturating_duration_since(now)
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

    /// A schedule whose `partition` had events and ticked on crossing into `T0_MS`'s
    /// cell at t0.
    fn ticked(partition: i32) -> (Ticks, Instant) {
        let (mut ticks, t0) = (Ticks::default(), Instant::now());
        ticks.events(partition, t0);
        assert_eq!(ticks.take_crossed(partition, T0_MS, t0), Some(t0));
        (ticks, t0)
    }

    #[test]
    fn only_new_events_tick() {
        let (mut ticks, t0) = (Ticks::default(), Instant::now());
        assert_eq!(ticks.take_due(3, T0_MS, t0), None, "nothing to decide");
        assert_eq!(ticks.take_crossed(3, T0_MS, t0), None, "nothing to decide");
        ticks.events(3, t0);
        assert_eq!(
            ticks.take_due(3, T0_MS, t0),
            None,
            "not before a crossing or idle"
        );
        assert_eq!(ticks.take_crossed(3, T0_MS, t0), Some(t0));
        assert_eq!(
            ticks.take_due(3, T0_MS + 10 * TICK_MS, t0 + 10 * IDLE),
            None,
            "nothing new since"
        );
    }

    #[test]
    fn events_tick_once_their_watermark_enters_a_later_cell() {
        let (mut ticks, t0) = ticked(0);
        ticks.events(0, t0 + MS);
        assert_eq!(ticks.take_due(0, T0_MS + TICK_MS - 1, t0 + MS), None);
        assert_eq!(
            ticks.take_due(0, T0_MS + TICK_MS, t0 + 2 * MS),
            Some(t0 + MS),
            "a batch read behind spans ticks of event time in no wall time"
        );
        // On the grid, not TICK_MS after the last tick: a tick late in its cell is
        // followed by the next cell's first event.
        ticks.events(0, t0 + 3 * MS);
        assert_eq!(
            ticks.take_due(0, T0_MS + 2 * TICK_MS - 1, t0 + 3 * MS),
            None
        );
        ticks.events(0, t0 + 4 * MS);
        assert_eq!(
            ticks.take_due(0, T0_MS + 2 * TICK_MS, t0 + 4 * MS),
            Some(t0 + 3 * MS)
        );
    }

    #[test]
    fn events_whose_event_time_stands_still_tick_once_idle() {
        let (mut ticks, t0) = ticked(1);
        ticks.events(1, t0 + MS);
        assert_eq!(ticks.take_due(1, T0_MS + 1, t0 + IDLE), None);
        // A steady stream keeps the grid: no idle tick while events keep coming.
        ticks.events(1, t0 + IDLE);
        assert_eq!(ticks.take_due(1, T0_MS + 2, t0 + IDLE + IDLE - MS), None);
        assert_eq!(ticks.take_due(1, T0_MS + 2, t0 + 2 * IDLE), Some(t0 + MS));
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
            ticks.take_crossed(p, T0_MS, at);
        }
        assert_eq!(
            ticks.next_due(t0),
            None,
            "idle partitions do not hurry the poll"
        );
        ticks.events(1, t0 + 5 * MS);
        assert_eq!(ticks.next_due(t0 + 5 * MS), Some(IDLE));
        ticks.events(0, t0 + 6 * MS);
        assert_eq!(ticks.next_due(t0 + 7 * MS), Some(IDLE - 2 * MS));
        assert_eq!(
            ticks.next_due(t0 + 30 * MS),
            Some(Duration::ZERO),
            "overdue"
        );
    }

    #[test]
    fn a_partition_no_longer_owned_starts_afresh() {
        let (mut ticks, t0) = ticked(5);
        ticks.events(5, t0 + MS);
        ticks.retain(|p| p != 5);
        assert_eq!(ticks.next_due(t0 + MS), None);
        ticks.events(5, t0 + 2 * MS);
        assert_eq!(
            ticks.take_due(5, T0_MS + TICK_MS, t0 + 2 * MS),
            None,
            "no last tick left to be a cell past"
        );
        assert_eq!(ticks.take_crossed(5, T0_MS, t0 + 2 * MS), Some(t0 + 2 * MS));
    }
}
