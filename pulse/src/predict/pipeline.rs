//! The decision pipeline: whether, and where, a pre-warm command goes.
//!
//! Each tick, every key the tick extracted features for is one *candidate* and goes
//! through four stages, in order, from [`Predictor::decide`]; each stage passes the key
//! on or refuses it with a [`Skip`] reason, counted in `pulse_prewarm_skipped{reason}`
//! and kept as the key's last decision for `/api/predictions`:
//!
//! 1. **Candidate** ([`candidate`]): the key has regions left to warm
//!    (`nothing_to_warm`) and has reached as many regions as the waits ask
//!    ([`regions_needed`], `awaiting_regions`).
//! 2. **Score** ([`Predictor::score`]): the model's confidence, recalibrated online and
//!    weighed by the trust its step's commands earned ([`super::trust`]), is at the
//!    threshold (`below_threshold`) for enough scorings in a row (`unconfirmed`).
//! 3. **Regions worth a fill** ([`Predictor::regions`]): a key in its cooldown has none
//!    (`cooldown`: its last command's regions are warm); of the unreached regions
//!    sharing an audience with a reached one, those whose chance of asking in time pays
//!    for their fill (the cost rule; `nothing_to_warm`, `not_worth_it`).
//! 4. **Gate** ([`Decider::gate`]): the tenant's token bucket (`over_budget`); the
//!    command is then recorded as sent. In `pulse serve` the partition's bucket is
//!    unlimited and the fleet's gate (`crate::gate`) applies the tenant's one budget,
//!    the cooldown and a dedupe by id across the fleet.
//!
//! A commanded key that keeps spreading gets follow-ups ([`Predictor::follow_up`]):
//! its score (the first command's calibrated confidence times the trust of follow-ups),
//! then stages 3 and 4 again, for the regions it has not reached yet. Every constant of
//! the decision is in [`policy`].

pub(crate) mod policy;

use models::{CacheKey, PrewarmCommand, RegionId, TenantId};
use serde::Serialize;

#[cfg(doc)]
use super::decide::Decider;
use super::decide::Proposal;
use super::features::Extracted;
use super::pace::{self, Pace, Paces};
use super::tracker::Tracker;
use super::trust::Step;

use super::{Features, MIN_REGION_DEMAND, Predictor, Score, ScoringModel, at_spread, retrain};
use policy::{COLD_START_MOMENTS, FOLLOW_UP_REACHED_MS, SPREAD_LOOKBACK_MS, SPREAD_STEP_MS};

/// The stage of the pipeline where a key's decision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Whether the key is decided on yet.
    Candidate,
    /// The model's confidence.
    Score,
    /// The regions worth a fill.
    Regions,
    /// The tenant's budget; a command that passes it is sent.
    Gate,
}

impl Stage {
    /// Its name in `/api/predictions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Candidate => "candidate",
            Stage::Score => "score",
            Stage::Regions => "regions",
            Stage::Gate => "gate",
        }
    }
}

/// Why a candidate key got no command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Confidence below the threshold.
    BelowThreshold,
    /// At the threshold, not yet for [`DecisionPolicy::confirmations`] scorings in a row.
    ///
    /// [`DecisionPolicy::confirmations`]: policy::DecisionPolicy::confirmations
    Unconfirmed,
    /// The misses a command would save do not outweigh the fills it may waste.
    NotWorthIt,
    /// No region is left to warm: every one has asked, or none shares the key's audience.
    NothingToWarm,
    /// The key had a command within the cooldown.
    Cooldown,
    /// The tenant's budget is spent.
    OverBudget,
    /// Fewer regions reached than the waits ask ([`regions_needed`]).
    AwaitingRegions,
}

impl Skip {
    /// Every reason, in declaration order: `Skip as usize` indexes
    /// [`DecisionCounts::skipped`](super::DecisionCounts::skipped).
    pub const ALL: [Skip; 7] = [
        Skip::BelowThreshold,
        Skip::Unconfirmed,
        Skip::NotWorthIt,
        Skip::NothingToWarm,
        Skip::Cooldown,
        Skip::OverBudget,
        Skip::AwaitingRegions,
    ];

    /// The metric label `reason`, and the key in `/api/predictions`' totals.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::BelowThreshold => "below_threshold",
            Skip::Unconfirmed => "unconfirmed",
            Skip::NotWorthIt => "not_worth_it",
            Skip::NothingToWarm => "nothing_to_warm",
            Skip::Cooldown => "cooldown",
            Skip::OverBudget => "over_budget",
            Skip::AwaitingRegions => "awaiting_regions",
        }
    }
}

/// A key's last decision: where it ended, and why (`None`: a command was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastDecision {
    /// When (event time, ms).
    pub at_ms: u64,
    /// The stage it ended at ([`Stage::Gate`] for a command sent).
    pub stage: Stage,
    /// The refusal, if it was one.
    pub skip: Option<Skip>,
}

/// What makes a key wait for more regions than [`DecisionPolicy::min_regions_reached`]
/// before it is scored: each a signal about this key that its first region is no
/// evidence. (How far the fleet's commands at a first or second region are to be
/// trusted is no wait: the score stage learns it, [`super::trust`].)
///
/// [`DecisionPolicy::min_regions_reached`]: policy::DecisionPolicy::min_regions_reached
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waits {
    /// The online calibration has judged fewer than [`COLD_START_MOMENTS`] first-region
    /// moments, and the model was not retrained on this traffic: crowds and virals look
    /// alike at a first region, in proportions that differ from fleet to fleet.
    pub(crate) cold: bool,
    /// One node's burst where the tenant's clients use several: one client's (a bot, a
    /// retry loop), no evidence that people elsewhere want the key.
    pub(crate) one_node: bool,
    /// The key burst before at the same second of an earlier minute: a schedule.
    pub(crate) scheduled: bool,
    /// The key's last command was wasted (within [`policy::MEMORY_MS`]).
    pub(crate) last_wasted: bool,
    /// One of the tenant's first-region commands is unanswered long past the fleet's
    /// answers (`decide::memory`).
    pub(crate) tenant_quiet: bool,
}

/// Regions that must have asked for a key before it is scored: `min`, and at least 2
/// under any wait.
pub(crate) fn regions_needed(min: usize, waits: &Waits) -> usize {
    let wary =
        waits.cold || waits.one_node || waits.scheduled || waits.last_wasted || waits.tenant_quiet;
    min.max(if wary { 2 } else { 1 })
}

/// Stage 1: whether a key is decided on: some region left to warm, and as many regions
/// reached as the waits ask.
pub(crate) fn candidate(x: &Extracted, min: usize, waits: &Waits) -> Result<(), Skip> {
    if x.unseen.is_empty() {
        return Err(Skip::NothingToWarm);
    }
    if x.reached.len() < regions_needed(min, waits) {
        return Err(Skip::AwaitingRegions);
    }
    Ok(())
}

impl Predictor {
    /// Runs one candidate through the stages in order. A command, or `None` with the
    /// refusal counted; either way the key's last decision is noted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        x: Extracted,
        burst_start: Option<u64>,
        model: &ScoringModel,
        audience: &mut Option<Vec<bool>>,
    ) -> Option<PrewarmCommand> {
        match self.stages(now_ms, tenant, key, x, burst_start, model, audience) {
            Ok(command) => Some(command),
            Err((stage, skip)) => {
                self.decider.refuse(now_ms, tenant, key, stage, skip);
                None
            }
        }
    }

    /// The four stages, in order: the command, or the stage that refused and why.
    #[allow(clippy::too_many_arguments)]
    fn stages(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        x: Extracted,
        burst_start: Option<u64>,
        model: &ScoringModel,
        audience: &mut Option<Vec<bool>>,
    ) -> Result<PrewarmCommand, (Stage, Skip)> {
        let at = |stage: Stage| move |skip: Skip| (stage, skip);
        let min = self.decider.policy().min_regions_reached;
        let waits = self.waits(tenant, key, &x.features, now_ms);
        candidate(&x, min, &waits).map_err(at(Stage::Candidate))?;
        let step = Step::at(x.reached.len());
        let (score, calibrated) = self
            .score(now_ms, tenant, key, &x.features, step, model)
            .map_err(at(Stage::Score))?;
        let proposal = self
            .regions(now_ms, tenant, key, x, &score, burst_start, audience)
            .map_err(at(Stage::Regions))?;
        let proposal = Proposal {
            calibrated,
            ..proposal
        };
        self.decider.gate(now_ms, proposal).map_err(at(Stage::Gate))
    }

    /// The waits' signals for a key (stage 1).
    fn waits(&self, tenant: &TenantId, key: &CacheKey, features: &Features, now_ms: u64) -> Waits {
        Waits {
            cold: self.calibrate_online
                && self.calibration.first_region_evidence() < COLD_START_MOMENTS
                && !self.model.as_deref().is_some_and(retrain::retrained_online),
            one_node: self.tracker.one_node_of_several(tenant, key),
            scheduled: features.phase_bursts_before >= 1.0,
            last_wasted: self.decider.last_command_wasted(tenant, key, now_ms),
            tenant_quiet: self.decider.tenant_quiet(tenant, now_ms),
        }
    }

    /// Stage 2: the model's score, its confidence recalibrated on the fleet's own
    /// labelled moments and weighed by the trust its step's commands earned (the
    /// score, and the calibrated confidence before the trust), at the threshold for
    /// enough scorings in a row.
    fn score(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        features: &Features,
        step: Step,
        model: &ScoringModel,
    ) -> Result<(Score, f64), Skip> {
        self.scored += 1;
        let mut score = model.score(features);
        let calibrated =
            self.calibration
                .confidence(tenant, at_spread(features), score.raw, |raw| {
                    model.confidence_of(raw)
                });
        score.confidence = (calibrated * self.decider.trust(tenant, step, now_ms)).clamp(0.0, 1.0);
        self.decider
            .confirm(now_ms, tenant, key, score.confidence)?;
        Ok((score, calibrated))
    }

    /// Stage 3: the regions worth a fill. A key in its cooldown is refused first, before
    /// its pace is measured: a key that cannot get a command does not teach its
    /// tenant's pace. Then the unreached regions of the audiences reached, each with
    /// its chance of asking in time at the key's pace, weighed by the cost rule.
    #[allow(clippy::too_many_arguments)]
    fn regions(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        x: Extracted,
        score: &Score,
        burst_start: Option<u64>,
        audience: &mut Option<Vec<bool>>,
    ) -> Result<Proposal, Skip> {
        if self
            .decider
            .cooling_down(&(tenant.clone(), key.clone()), now_ms)
        {
            return Err(Skip::Cooldown);
        }
        let in_audience = audience_of(&self.tracker, tenant, &x, audience);
        let ids: Vec<usize> = x
            .unseen_counts
            .iter()
            .zip(in_audience)
            .filter_map(|((i, _), keep)| keep.then_some(*i))
            .collect();
        let start = burst_start.or_else(|| self.tracker.last_burst(tenant, key));
        let (unseen, chances) = self.chances_at_pace(tenant, key, start, now_ms, &ids);
        let saved = saved_misses(
            &x.features,
            x.reached.len(),
            self.tracker.fill_seconds(tenant),
        );
        let named = self
            .decider
            .name_regions(tenant, score.confidence, saved, unseen, &chances)?;
        Ok(Proposal {
            tenant: tenant.clone(),
            key: key.clone(),
            score: score.clone(),
            calibrated: score.confidence, // the caller's, before the trust
            named,
            saved_misses: saved,
            burst_start_ms: burst_start.unwrap_or(now_ms),
            reached: x.reached,
        })
    }

    /// The unreached regions `ids` (tracker indices) as region ids, each with its
    /// chance of asking within a command's TTL at the key's pace measured since
    /// `burst_start_ms`: what the cost rule weighs, for a first command and a follow-up.
    fn chances_at_pace(
        &mut self,
        tenant: &TenantId,
        key: &CacheKey,
        burst_start_ms: Option<u64>,
        now_ms: u64,
        ids: &[usize],
    ) -> (Vec<RegionId>, Vec<f64>) {
        let measured = measured_pace(&self.tracker, tenant, key, burst_start_ms, now_ms);
        let ttl_ms = self.decider.policy().command_ttl_ms;
        let chances = chances_of(
            &self.tracker,
            &mut self.paces,
            tenant,
            measured,
            ids,
            ttl_ms,
        );
        let regions = ids
            .iter()
            .map(|i| self.tracker.regions[*i].clone())
            .collect();
        (regions, chances)
    }

    /// A follow-up for a followed key that spread since its last command
    /// (`decide::follow`): a region it had not reached then has asked at least
    /// [`MIN_REGION_DEMAND`] times. Stages 3 and 4 again, for the tenant's regions the
    /// burst has not reached (none of their clients asked since it began, or within
    /// [`FOLLOW_UP_REACHED_MS`]: a pre-warm is no request, so a region warmed but not
    /// asked is named again; one that asked and went quiet is past its demand) and that
    /// share an audience with a reached one. Its refusals are counted once per reason
    /// per followed command: the key is looked at every tick until its command expires.
    pub(super) fn follow_up(
        &mut self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> Option<PrewarmCommand> {
        let (before, burst_start_ms) = self.decider.follow_up_due(tenant, key, now_ms)?;
        let t = self.tracker.tenants.get(tenant)?;
        let k = t.keys.get(key)?;
        let since = now_ms
            .saturating_sub(FOLLOW_UP_REACHED_MS)
            .min(burst_start_ms);
        let (mut reached, mut unseen) = (Vec::new(), Vec::new());
        for i in t.regions(now_ms) {
            let asked = k
                .regions
                .get(i)
                .is_some_and(|r| r.count > 0 && r.last_ms >= since);
            if asked {
                reached.push(i);
            } else {
                unseen.push(i);
            }
        }
        let spread = reached
            .iter()
            .any(|r| !before.contains(r) && k.region_count(*r) >= MIN_REGION_DEMAND);
        if !spread {
            return None; // no follow-up due: not a decision
        }
        if unseen.is_empty() {
            self.decider
                .refuse_follow_up(now_ms, tenant, key, Stage::Regions, Skip::NothingToWarm);
            return None;
        }
        let keep = t.same_audience(&reached, &unseen);
        let unseen: Vec<usize> = unseen
            .iter()
            .zip(keep)
            .filter_map(|(i, keep)| keep.then_some(*i))
            .collect();
        let (unseen, chances) =
            self.chances_at_pace(tenant, key, Some(burst_start_ms), now_ms, &unseen);
        match self
            .decider
            .follow_up(now_ms, tenant, key, reached, unseen, &chances)?
        {
            Ok(command) => Some(command),
            Err((stage, skip)) => {
                self.decider
                    .refuse_follow_up(now_ms, tenant, key, stage, skip);
                None
            }
        }
    }
}

/// Which of a candidate's unseen regions share an audience with its reached ones,
/// computed at most once per candidate (for its label or its decision, whichever
/// wants it first).
pub(super) fn audience_of(
    tracker: &Tracker,
    tenant: &TenantId,
    x: &Extracted,
    cached: &mut Option<Vec<bool>>,
) -> Vec<bool> {
    cached
        .get_or_insert_with(|| {
            let ids: Vec<usize> = x.unseen_counts.iter().map(|(i, _)| *i).collect();
            tracker.tenants[tenant].same_audience(&x.reached, &ids)
        })
        .clone()
}

/// How far and how fast the key spread in its burst begun at `burst_start_ms`.
fn measured_pace(
    tracker: &Tracker,
    tenant: &TenantId,
    key: &CacheKey,
    burst_start_ms: Option<u64>,
    now_ms: u64,
) -> Option<Pace> {
    let k = tracker.tenants.get(tenant)?.keys.get(key)?;
    let noticed = burst_start_ms?;
    // A new key's spread began when its demand did, which a slow ramp makes seconds
    // before its burst is noticed: the busy seconds (5 requests or more each) that lead
    // up to now, not a trickle before them. An old key's burst began when it was noticed.
    // Timed from the notice, a slow ramp looks faster than it is (b-slow-spread: a
    // region in 5 s after the notice, 20 s after its demand began).
    let first_request = k
        .regions
        .iter()
        .filter(|r| r.count > 0)
        .map(|r| r.first_ms)
        .min();
    let new_key = first_request.is_some_and(|first| first + SPREAD_LOOKBACK_MS >= noticed);
    let start = k
        .busy_since_ms(MIN_REGION_DEMAND)
        .filter(|_| new_key)
        .map_or(noticed, |busy| busy.min(noticed));
    // As `Tracker::spread_lately` counts a spread: a step or more after the start.
    let since = start + SPREAD_STEP_MS;
    let newest = k.newest_region_since(since, SPREAD_STEP_MS, MIN_REGION_DEMAND);
    Some(Pace {
        spread: k.regions_new_since(since, SPREAD_STEP_MS, MIN_REGION_DEMAND),
        elapsed_ms: now_ms.saturating_sub(start),
        silent_ms: now_ms.saturating_sub(newest.unwrap_or(start)),
    })
}

/// Each of `regions`' (tracker ids) chance of asking for a key within `ttl_ms`
/// (`pace::chances`): at its `measured` pace (remembered as its tenant's), or else at
/// its tenant's typical one, weighed by the tenant's recent requests from each region.
fn chances_of(
    tracker: &Tracker,
    paces: &mut Paces,
    tenant: &TenantId,
    measured: Option<Pace>,
    regions: &[usize],
    ttl_ms: u64,
) -> Vec<f64> {
    let t = tracker.tenants.get(tenant);
    let weights: Vec<f64> = regions
        .iter()
        .map(|r| t.map_or(0.0, |t| t.region_requests(*r)))
        .collect();
    pace::chances(paces.judge(tenant, measured), ttl_ms, &weights)
}

/// Client misses one warmed region would be spared if it then asks: its first miss,
/// and the requests that would arrive while that miss's fill runs, at the key's current
/// rate per region that asks for it.
fn saved_misses(features: &Features, reached: usize, fill_seconds: f64) -> f64 {
    let per_region_rps = features.velocity_1s / reached.max(1) as f64;
    1.0 + per_region_rps * fill_seconds
}

/// One test per stage: each refuses with its reason and passes what it should.
#[cfg(test)]
#[path = "pipeline/tests.rs"]
mod tests;
