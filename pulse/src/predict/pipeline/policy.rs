//! Every constant of the decision, each named once with why it has its value. The
//! settings an operator may change are [`DecisionPolicy`]'s (flags of `pulse serve`
//! and `pulse backtest`); the rest are fixed here. The stage that reads each is named
//! first in its comment.

use std::collections::HashMap;

use models::TenantId;

/// The decision rules an operator sets.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionPolicy {
    /// Score: minimum confidence to send a command.
    pub threshold: f64,
    /// Regions: after a command, the same key gets no other for this long.
    pub cooldown_ms: u64,
    /// How long a command stays valid at the edges.
    pub command_ttl_ms: u64,
    /// Gate: each tenant's committed rate of commands per second.
    pub tenant_rate_per_s: f64,
    /// Gate: each tenant's burst allowance, in commands.
    pub tenant_burst: f64,
    /// How many recent decisions to keep for the API.
    pub history: usize,
    /// Score: a key needs this many consecutive scorings (ticks) at or above the
    /// threshold before it gets a command: one noisy crossing is not enough.
    pub confirmations: u32,
    /// Regions: what a wasted pre-warm fill costs, in client misses: a region is named
    /// only when `p × saved misses ≥ (1 − p) × cost` (the cost rule).
    pub wasted_fill_cost: f64,
    /// Per-tenant overrides of [`DecisionPolicy::wasted_fill_cost`].
    pub tenant_fill_costs: HashMap<TenantId, f64>,
    /// Candidate: a key is scored for a command only once this many of the tenant's
    /// regions asked for it in the last minute: 2 waits for spread evidence (a
    /// one-region crowd never gets a command) at the cost of the second region's warm-up.
    pub min_regions_reached: usize,
    /// Follow-up commands per burst, while the key keeps spreading, each with a fresh
    /// TTL for the regions it has not reached yet (0: none).
    pub follow_ups: u32,
}

impl Default for DecisionPolicy {
    fn default() -> Self {
        DecisionPolicy {
            threshold: 0.85,
            cooldown_ms: 60_000,
            command_ttl_ms: 60_000,
            tenant_rate_per_s: 2.0,
            tenant_burst: 20.0,
            history: 500,
            // 2 would need a second scoring within a second: a backlog read in big
            // batches scores a key once per burst, so live pulse keeps 1 (see README).
            confirmations: 1,
            min_regions_reached: 1,
            // A fleet of 12 regions crossed slowly needs a few; each needs new spread.
            follow_ups: 6,
            // A wasted fill costs about what one client miss does: the threshold binds
            // first; a tenant with a costly origin raises it.
            wasted_fill_cost: 1.0,
            tenant_fill_costs: HashMap::new(),
        }
    }
}

/// Candidate: a key bursts while its last second runs at least this many requests per
/// second… A floor against counting noise only: the model, not the floor, tells a
/// spread from a crowd, and a higher floor scores a fast viral too late for the regions
/// it reaches in its first second (fast-spread at seed 1000, threshold 0.85: recall
/// 0.783 at 12, 0.800 at 8, its first command 0.1 s sooner; precision 1.000 at both).
pub(crate) const BURST_MIN_RPS: f64 = 8.0;
/// Candidate: …and at least this many times its minute average: a key as busy as it
/// usually is does not burst.
pub(crate) const BURST_FACTOR: f64 = 4.0;

/// Candidate, regions and follow-ups: requests that make a region one the key reached
/// (a spread's step, a follow-up's new region), and the label's definition of demand
/// (`predict::labels`): a stray request or two is no audience.
pub(crate) const MIN_REGION_DEMAND: u32 = 5;

/// Candidate: how long after a key starts bursting (or reaches a new region while
/// busy) it is still decided on: a command later than that arrives after the regions it
/// would warm have asked, and a long burst would outweigh many short ones in training.
pub(crate) const EARLY_BURST_MS: u64 = 5_000;

/// Candidate: the calibration's first-region evidence (labelled moments) below which a
/// key waits for a second region: the calibration's own prior weight, the point where
/// the fleet's outcomes outweigh what the model learnt elsewhere.
pub(crate) const COLD_START_MOMENTS: f64 = super::super::online::PRIOR_WEIGHT;

/// Candidate: how long a wasted command keeps its key waiting for a second region: an
/// hour, so an hourly job's next run still finds it (a round value, not measured).
pub(crate) const MEMORY_MS: u64 = 3_600_000;

/// Score: how many commands the trust's prior (the calibrated confidence is right, or
/// for a tenant, what the fleet's other tenants showed) is worth
/// (`predict::trust`): as many as the moments the online calibration's prior is
/// worth, so that a fresh pulse needs about as much evidence to doubt its calibration
/// as to move it (four wasted commands in a row at 0.99 bring 0.99 below 0.85).
pub(crate) const TRUST_PRIOR_COMMANDS: f64 = super::super::online::PRIOR_WEIGHT;
/// Score: the half-life of a command's outcome in the trust: a quarter hour, some
/// fifteen retrains of the model, so that an hour forgets a world that changed (a
/// round value, not measured).
pub(crate) const TRUST_HALF_LIFE_MS: u64 = 900_000;

/// Candidate: answer delays of the fleet's commands kept to judge an unanswered one,
/// as many as a record's outcomes.
pub(crate) const ANSWERS_LEN: usize = 20;
/// Candidate: delays needed before an unanswered command says anything.
pub(crate) const ANSWERS_NEEDED: usize = 5;
/// Candidate: how much longer than the longest answer a first-region command must wait
/// unanswered before its tenant's first regions are no evidence: twice, so that a
/// viral's slower answer is not taken for a crowd's silence.
pub(crate) const QUIET_FACTOR: u64 = 2;

/// Score: two scorings of a key further apart than this are not consecutive (ticks of
/// a busy key come every 10 ms; a second without one is a pause).
pub(crate) const STREAK_GAP_MS: u64 = 1_000;

/// Regions: a region whose taste is at least this share as alike a reached region's as
/// the most alike region's shares its audience: regions of one taste come out within
/// 0.85 of the best, of other tastes below 0.45; 0.6 lies between.
pub(crate) const SAME_AUDIENCE_SHARE: f64 = 0.6;
/// Regions: a region's taste is known once it asked for the tenant's tracked keys this
/// often; below it the region is named, for want of evidence.
pub(crate) const MIN_AUDIENCE_REQUESTS: f64 = 200.0;

/// Regions: how long before its burst was noticed a key's first request may be for the
/// key to count as new, its spread timed from when its demand began: a minute, the
/// reach of the tracker's per-key history.
pub(crate) const SPREAD_LOOKBACK_MS: u64 = 60_000;
/// Regions: a region counts as a step of a spread when it first asked at least this
/// long after the burst began (and after the previous step), as the tracker counts a
/// spread: one second, the resolution of the key's history.
pub(crate) const SPREAD_STEP_MS: u64 = 1_000;
/// Regions: gaps of silence a spread may keep before its chances fade: one missed gap
/// is chance, two say little more.
pub(crate) const STALL_GRACE_GAPS: f64 = 2.0;
/// Regions: weight of each newly measured pace in a tenant's (and the fleet's) typical
/// one: it follows about the last five spreads (a round value, not measured).
pub(crate) const PACE_ALPHA: f64 = 0.2;

/// Regions: the fill time assumed for a tenant no miss has reported one for yet (saved
/// misses = 1 + requests per second per region × fill time): a typical origin's.
pub(crate) const DEFAULT_FILL_MS: f64 = 100.0;
/// Regions: weight of each new fill time in the tenant's fill-time average: it follows
/// the last twenty or so misses.
pub(crate) const FILL_ALPHA: f64 = 0.05;

/// Follow-ups: a follow-up waits until its key's last command is 1/this of its TTL old:
/// halfway, when a slow viral's later regions would find the first command expired.
pub(crate) const FOLLOW_UP_WAIT_DIVISOR: u64 = 2;
/// Follow-ups: a region that asked within this long (or since the burst began) counts
/// as reached: a minute, as for a first command.
pub(crate) const FOLLOW_UP_REACHED_MS: u64 = 60_000;
