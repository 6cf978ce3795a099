//! What one run measured, and the reference table.

use pulse::DecisionCounts;
use serde::Serialize;

use super::config::SimConfig;
use super::fill::Client;
use super::stats::{Histogram, PerSecond};
use crate::scenario::Setup;

/// Latency of a cache hit at the edge.
const HIT_MS: f64 = 1.0;

/// Counts read from the production types as they ran (and the simulator's own).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Fills led (`Acquire::Lead` from a registry, or a `lead_alone` permit).
    pub fills_led: u64,
    /// Misses the registries made join a fill in flight (`Acquire::Join`).
    pub joins: u64,
    /// Most flights the registries held at once (sampled each virtual second).
    pub registry_peak_in_flight: u64,
    /// User fills the limiters refused (`FillError::Overloaded`).
    pub limiter_overloaded: u64,
    /// Pre-warm fills the limiters shed (`FillError::NoCapacity`).
    pub prefetch_shed: u64,
    /// Pre-warm fills started at the nodes.
    pub prefetch_fills: u64,
    /// Commands that reached the nodes.
    pub commands_delivered: u64,
    /// Events the heat map applied / refused.
    pub pulse_events: u64,
    /// Events the heat map refused.
    pub pulse_refused: u64,
    /// Client requests that timed out.
    pub timeouts: u64,
    /// Retries sent.
    pub retries: u64,
    /// Most fills the origin served at once (sampled tail fills weigh several).
    pub origin_peak_active: f64,
    /// Virtual ms the origin served more fills than its capacity (read each tick).
    pub origin_over_capacity_ms: u64,
}

/// The figures of one set-up.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Which set-up.
    pub setup: Setup,
    /// Client requests (hits in bulk included, retries counted again).
    pub requests: f64,
    /// Requests that failed after their last retry.
    pub errors: f64,
    /// Origin requests per second in the 10 s before the viral key.
    pub origin_baseline_rps: f64,
    /// Most origin requests in one second from the viral key on.
    pub origin_peak_rps: f64,
    /// Peak over baseline (baseline floored at 1).
    pub peak_over_baseline: f64,
    /// Share of hot-key requests answered from cache from the viral key on.
    pub hot_hit_ratio: f64,
    /// Client latency from the viral key on.
    pub p50_ms: f64,
    /// 99th percentile of it.
    pub p99_ms: f64,
    /// Median time from a pre-warmed entry being stored to its first request.
    pub prewarm_lead_ms: Option<f64>,
    /// Pre-warmed entries requested before they expired.
    pub prewarm_useful: u64,
    /// Pre-warmed entries that expired (or were replaced) unrequested.
    pub prewarm_wasted: u64,
    /// Origin bytes spent on fills a pre-warm caused.
    pub prewarm_origin_bytes: f64,
    /// Commands pulse sent.
    pub commands_sent: u64,
    /// Counters of the production types.
    pub counters: Counters,
}

/// Accumulates a run's figures.
pub(super) struct Recorder {
    window_ms: u64,
    end_ms: u64,
    viral_at_s: usize,
    object_bytes: f64,
    origin: PerSecond,
    latency: Histogram,
    requests: f64,
    errors: f64,
    hot_total: f64,
    hot_hits: f64,
    leads: Vec<u64>,
    useful: u64,
    pub prewarm_wasted: u64,
    prewarm_bytes: f64,
    pub counters: Counters,
}

impl Recorder {
    pub(super) fn new(cfg: &SimConfig) -> Recorder {
        Recorder {
            window_ms: cfg.viral_at_s * 1000,
            end_ms: cfg.duration_s * 1000,
            viral_at_s: cfg.viral_at_s as usize,
            object_bytes: cfg.origin.object_bytes as f64,
            origin: PerSecond::default(),
            latency: Histogram::default(),
            requests: 0.0,
            errors: 0.0,
            hot_total: 0.0,
            hot_hits: 0.0,
            leads: Vec::new(),
            useful: 0,
            prewarm_wasted: 0,
            prewarm_bytes: 0.0,
            counters: Counters::default(),
        }
    }

    fn in_window(&self, now: u64) -> bool {
        now >= self.window_ms
    }

    /// A request arrived (before knowing how it is answered).
    pub(super) fn request(&mut self, now: u64, count: f64, hot: bool) {
        self.requests += count;
        if hot && self.in_window(now) {
            self.hot_total += count;
        }
    }

    /// The request was a hit.
    pub(super) fn hit(&mut self, now: u64, client: &Client, hot: bool) {
        if self.in_window(now) {
            self.latency
                .add((now - client.first_ms) as f64 + HIT_MS, client.count);
            if hot {
                self.hot_hits += client.count;
            }
        }
    }

    /// Hits an entry stored at `from` serves until `to`, at `rate` per second, counted
    /// in bulk: a node with a fresh entry draws no request one by one.
    pub(super) fn bulk_hits(&mut self, from: u64, to: u64, rate: f64, hot: bool) {
        let to = to.min(self.end_ms);
        if to <= from {
            return;
        }
        self.requests += rate * (to - from) as f64 / 1000.0;
        let seen_from = from.max(self.window_ms);
        if to > seen_from {
            let n = rate * (to - seen_from) as f64 / 1000.0;
            self.latency.add(HIT_MS, n);
            if hot {
                self.hot_total += n;
                self.hot_hits += n;
            }
        }
    }

    /// The request waited on a fill that completed at `now`.
    pub(super) fn served(&mut self, now: u64, client: &Client, _hot: bool) {
        if self.in_window(now) {
            self.latency
                .add((now - client.first_ms) as f64 + HIT_MS, client.count);
        }
    }

    /// The request gave up after its last retry.
    pub(super) fn failed(&mut self, now: u64, client: &Client) {
        self.errors += client.count;
        if self.in_window(now) {
            self.latency
                .add((now - client.first_ms) as f64, client.count);
        }
    }

    /// A pre-warmed entry got its first request `lead_ms` after it was stored.
    pub(super) fn prewarm_used(&mut self, lead_ms: u64) {
        self.useful += 1;
        self.leads.push(lead_ms);
    }

    /// A fill went to the origin.
    pub(super) fn origin_fill(&mut self, now: u64, weight: f64, prefetch_cause: bool) {
        self.origin.add(now, weight);
        if prefetch_cause {
            self.prewarm_bytes += weight * self.object_bytes;
        }
    }

    pub(super) fn report(mut self, setup: Setup, counts: Option<DecisionCounts>) -> SimReport {
        let v = self.viral_at_s;
        let baseline = self.origin.mean(v.saturating_sub(10).max(1), v);
        let peak = self.origin.peak(v);
        self.leads.sort_unstable();
        SimReport {
            setup,
            requests: self.requests,
            errors: self.errors,
            origin_baseline_rps: baseline,
            origin_peak_rps: peak,
            peak_over_baseline: peak / baseline.max(1.0),
            hot_hit_ratio: self.hot_hits / self.hot_total.max(1.0),
            p50_ms: self.latency.quantile(0.5),
            p99_ms: self.latency.quantile(0.99),
            prewarm_lead_ms: self.leads.get(self.leads.len() / 2).map(|l| *l as f64),
            prewarm_useful: self.useful,
            prewarm_wasted: self.prewarm_wasted,
            prewarm_origin_bytes: self.prewarm_bytes,
            commands_sent: counts.map_or(0, |c| c.sent),
            counters: self.counters,
        }
    }
}

/// The reference table: one row per set-up.
pub fn table(rows: &[SimReport]) -> String {
    let mut out = format!(
        "{:<28} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>7} {:>11} {:>11} {:>10}\n",
        "set-up",
        "origin/s",
        "peak/s",
        "peak/base",
        "hot hit",
        "p50 ms",
        "p99 ms",
        "lead ms",
        "useful",
        "wasted",
        "prewarm MB",
        "origin max",
        "over cap s"
    );
    for r in rows {
        let pre = r.setup == Setup::Prewarm;
        let opt = |v: String| if pre { v } else { "-".to_owned() };
        out.push_str(&format!(
            "{:<28} {:>10.0} {:>10.0} {:>8.1}x {:>7.2}% {:>9.0} {:>9.0} {:>8} {:>7} {:>7} {:>11} {:>11.0} {:>10.1}\n",
            r.setup.as_str(),
            r.origin_baseline_rps,
            r.origin_peak_rps,
            r.peak_over_baseline,
            100.0 * r.hot_hit_ratio,
            r.p50_ms,
            r.p99_ms,
            opt(r.prewarm_lead_ms.map_or("-".into(), |l| format!("{l:.0}"))),
            opt(r.prewarm_useful.to_string()),
            opt(r.prewarm_wasted.to_string()),
            opt(format!("{:.1}", r.prewarm_origin_bytes / 1e6)),
            r.counters.origin_peak_active,
            r.counters.origin_over_capacity_ms as f64 / 1000.0,
        ));
    }
    out
}
