//! How late a partition's events arrive behind its watermark: how far behind it a tick
//! may measure a key's last second to find it complete.
//!
//! An edge agent that batches or retries delivers its events late. The watermark (the
//! newest event time) runs ahead of them, and a second measured at the watermark holds
//! only the requests already here: with events up to 3 s late, about a sixth of them. A
//! burst near the threshold is then seen only once it is several times the threshold,
//! or at its second region. A stream processor closes its windows a grace period behind
//! the watermark; a tick measures a key's last second at the watermark and
//! [`Lateness::grace_ms`] behind it, and keeps the busier (see `Predictor::run_tick`), so
//! lead is lost only where the lateness costs completeness.
//!
//! Invariants:
//! 1. Events in time order give no grace: ticks measure at the watermark, as before.
//! 2. The grace is how far behind the watermark the [`QUANTILE`] of recent events
//!    arrived, to the [`BIN_MS`] below,
//! 3. and at most [`MAX_GRACE_MS`]: the fine ring holds a second's window ending that
//!    far behind the watermark, and no further.
//! 4. Old lateness fades: the counts halve every [`HALVE_EVERY`] events, so events in
//!    time order again bring the grace back to 0.

use crate::heat::{FINE_SPAN_MS, Window};

/// How late the events a grace covers may be: all but the latest tenth.
pub(crate) const QUANTILE: f64 = 0.9;
/// The resolution of the lateness counts.
pub(crate) const BIN_MS: u64 = 50;
/// The longest grace: a 1 s window ending there still lies in the fine ring.
pub(crate) const MAX_GRACE_MS: u64 = FINE_SPAN_MS - Window::S1.millis();
/// Events after which the counts halve: the last few thousand events count.
pub(crate) const HALVE_EVERY: u32 = 4_096;

/// One bin per [`BIN_MS`] up to [`MAX_GRACE_MS`]; the last holds that and later.
const BINS: usize = (MAX_GRACE_MS / BIN_MS) as usize + 1;

/// One partition's lateness: counts of how far behind the watermark its events came.
#[derive(Debug)]
pub(crate) struct Lateness {
    watermark_ms: Option<u64>,
    bins: [u32; BINS],
    since_halved: u32,
}

impl Default for Lateness {
    fn default() -> Self {
        Lateness {
            watermark_ms: None,
            bins: [0; BINS],
            since_halved: 0,
        }
    }
}

impl Lateness {
    /// Notes an event stamped `ts_ms`, in the order it was delivered.
    pub(crate) fn observe(&mut self, ts_ms: u64) {
        let late_ms = self.watermark_ms.map_or(0, |w| w.saturating_sub(ts_ms));
        self.watermark_ms = Some(self.watermark_ms.map_or(ts_ms, |w| w.max(ts_ms)));
        let bin = ((late_ms / BIN_MS) as usize).min(BINS - 1);
        self.bins[bin] += 1;
        self.since_halved += 1;
        if self.since_halved == HALVE_EVERY {
            self.bins.iter_mut().for_each(|count| *count /= 2);
            self.since_halved = 0;
        }
    }

    /// How far behind the watermark a tick measures a key's second besides at it.
    pub(crate) fn grace_ms(&self) -> u64 {
        let total: u64 = self.bins.iter().map(|&c| u64::from(c)).sum();
        let covered = (QUANTILE * total as f64).ceil() as u64;
        let mut seen = 0;
        for (bin, &count) in self.bins.iter().enumerate() {
            seen += u64::from(count);
            if seen >= covered {
                return (bin as u64 * BIN_MS).min(MAX_GRACE_MS);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_460_740_000;

    /// `n` events 10 ms apart, every `late_every`-th of them stamped `late_ms` behind
    /// the watermark instead.
    fn fed(lateness: &mut Lateness, n: u64, late_every: u64, late_ms: u64) {
        let start = lateness.watermark_ms.unwrap_or(T0);
        for i in 1..=n {
            match lateness.watermark_ms {
                Some(watermark) if late_every > 0 && i % late_every == 0 => {
                    lateness.observe(watermark - late_ms)
                }
                _ => lateness.observe(start + i * 10),
            }
        }
    }

    #[test]
    fn events_in_time_order_give_no_grace() {
        let mut lateness = Lateness::default();
        assert_eq!(lateness.grace_ms(), 0, "no events");
        fed(&mut lateness, 10_000, 0, 0);
        // Events of the same millisecond, and one a few ms behind: jitter, not delay.
        lateness.observe(T0 + 100_000);
        lateness.observe(T0 + 100_000);
        lateness.observe(T0 + 99_990);
        assert_eq!(lateness.grace_ms(), 0);
    }

    #[test]
    fn the_grace_covers_all_but_the_latest_tenth_of_the_events() {
        let mut lateness = Lateness::default();
        fed(&mut lateness, 1_000, 5, 420);
        assert_eq!(lateness.grace_ms(), 400, "a fifth 420 ms late");
        let mut lateness = Lateness::default();
        fed(&mut lateness, 1_000, 20, 420);
        assert_eq!(lateness.grace_ms(), 0, "a twentieth late is left out");
    }

    #[test]
    fn the_grace_stays_where_the_fine_ring_holds_a_second() {
        let mut lateness = Lateness::default();
        fed(&mut lateness, 1_000, 2, 3_000);
        assert_eq!(lateness.grace_ms(), MAX_GRACE_MS);
        assert_eq!(MAX_GRACE_MS + Window::S1.millis(), FINE_SPAN_MS);
    }

    /// A node whose clock runs fast, as far as the heat map accepts by default, puts
    /// the watermark that far ahead of the other nodes' events: a grace reaches back
    /// to them.
    #[test]
    fn the_grace_reaches_behind_a_fast_clock_the_heat_map_accepts() {
        let skew = crate::heat::HeatConfig::default().max_clock_skew_ms;
        assert!(
            skew <= MAX_GRACE_MS,
            "{skew} ms accepted, {MAX_GRACE_MS} ms measured"
        );
        let mut lateness = Lateness::default();
        for i in 1..=1_000 {
            // Every tenth event from the fast node.
            let ts = T0 + i * 10 + if i % 10 == 0 { skew } else { 0 };
            lateness.observe(ts);
        }
        assert!(
            lateness.grace_ms() >= skew - 2 * BIN_MS,
            "{}",
            lateness.grace_ms()
        );
    }

    #[test]
    fn old_lateness_fades_once_events_come_in_time_again() {
        let mut lateness = Lateness::default();
        fed(&mut lateness, 3 * u64::from(HALVE_EVERY), 2, 700);
        assert_eq!(lateness.grace_ms(), 700);
        fed(&mut lateness, u64::from(HALVE_EVERY), 0, 0);
        assert_eq!(lateness.grace_ms(), 700, "a quarter still late");
        fed(&mut lateness, 2 * u64::from(HALVE_EVERY), 0, 0);
        assert_eq!(lateness.grace_ms(), 0);
    }
}
