//! Prediction: from the heat map's candidates to pre-warm commands.
//!
//! Every tick, for each tenant, the heat map's candidates (its Top-K of the last two
//! seconds) become *tracked* keys; each tracked key that saw events since the last
//! tick is scored: its [`Features`] are extracted from the sketch
//! windows and the tracker, the [`ScoringModel`] gives a confidence, and the
//! [`Decider`] turns a confident score into a [`PrewarmCommand`] for the regions that
//! have not asked for the key yet. Keys outside the candidates are never scored.
//!
//! The same code serves `pulse serve` (ticks after each ingested batch), `pulse
//! backtest` and `pulse train` (ticks on the replayed trace's event time).
//!
//! # Layout
//! - `tracker`: exact, bounded per-key history the sketches do not hold (regions,
//!   referrers, bursts) and per-tenant baselines.
//! - `features`: [`Features`], the feature vector of one key, and its extraction.
//! - `model`: [`ScoringModel`] (linfa-linear regression, calibrated), its file format,
//!   its model card and training; [`default_model`], the one shipped in the binary.
//! - `pipeline`: the decision, stage by stage (candidate, score, regions worth a fill,
//!   gate), every refusal a [`Skip`]; `pipeline::policy`, every constant of it.
//! - `decide`: [`Decider`], the decision's state (streaks, token buckets, cooldowns,
//!   follow-ups) and the useful/wasted verdict of each command.
//! - `labels`: labels each scoring moment by whether demand came, for training.
//! - `lateness`: how late the partition's events arrive, so how far behind the
//!   watermark a key's last second is complete.
//! - `pace`: each unreached region's chance of asking while a command is valid, from
//!   how fast the key spreads and where the tenant's audience lives.
//! - `retrain`: [`retrain`], fits a candidate model and keeps it only if it is not worse.
//! - `trust`: what each step's commands (at a first region, a second, later, a
//!   follow-up) earned: their useful share against the confidence they were sent at,
//!   learnt from the verdicts of the commands sent, per tenant with the fleet's prior.

mod calibrate;
mod decide;
mod features;
mod labels;
mod lateness;
mod model;
mod model_file;
mod online;
mod pace;
mod pipeline;
mod retrain;
mod tracker;
mod trust;

use std::sync::Arc;

use models::{AccessEventRef, CacheKey, PrewarmCommand, TenantId};

pub(crate) use calibrate::split_moments;
pub(crate) use decide::Decider;
pub use decide::{Decision, DecisionCounts, Verdict};
pub use features::{FEATURE_COUNT, Features};
pub(crate) use labels::MIN_REGION_DEMAND;
pub use labels::Sample;
pub(crate) use model::reliability;
pub use model::{
    Calibration, Evaluation, ModelError, ReliabilityBin, Score, ScoringModel, TrainOptions,
    TrainingMetrics, Transform, default_model,
};
pub use retrain::RETRAIN_INTERVAL_SECS;
pub(crate) use retrain::{HELD_OUT_SHARE, RetrainOutcome, next_generation, retrain};
use serde::{Deserialize, Serialize};

use crate::heat::{HeatMap, Window};
use features::{FEATURE_WINDOWS, extract, is_bursting};
use labels::Labeler;
use lateness::Lateness;
use online::OnlineCalibration;
pub(crate) use online::SavedCalibration;
use pace::Paces;
pub use pipeline::policy::DecisionPolicy;
use pipeline::policy::EARLY_BURST_MS;
pub use pipeline::{LastDecision, Skip, Stage};
use tracker::Tracker;
use trust::Trust;

/// The predictor's settings.
#[derive(Debug, Clone)]
pub struct PredictorConfig {
    /// The decision rules.
    pub policy: DecisionPolicy,
    /// Keys tracked per tenant.
    pub max_tracked_keys: usize,
    /// At most one training sample per key per this long.
    pub sample_every_ms: u64,
    /// Labelled samples kept for retraining.
    pub sample_capacity: usize,
    /// Recalibrate the confidence from the labelled moments seen (`predict::online`).
    pub calibrate_online: bool,
    /// Replays only (`pulse backtest`): retrain on the labelled moments every this
    /// much event time, as `pulse serve --retrain-interval-secs` does every this much
    /// wall time from its own thread (which ignores this field); `None`: never.
    pub replay_retrain_every_ms: Option<u64>,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            policy: DecisionPolicy::default(),
            max_tracked_keys: 2_048,
            sample_every_ms: 500,
            sample_capacity: 50_000,
            calibrate_online: true,
            replay_retrain_every_ms: None,
        }
    }
}

/// The prediction state. Not thread-safe by itself: one owner feeds it events and
/// ticks it (the ingest thread, or a replay).
pub struct Predictor {
    model: Option<Arc<ScoringModel>>,
    decider: Decider,
    tracker: Tracker,
    labeler: Labeler,
    calibration: OnlineCalibration,
    /// How fast the tenants' keys spread: which regions a command will reach in time.
    paces: Paces,
    /// Counts a checkpoint kept for another model than the one in use, put back if
    /// that model comes next (the fleet's, read from its topic after the partition
    /// was assigned).
    pending_calibration: Option<SavedCalibration>,
    calibrate_online: bool,
    scored: u64,
    /// The oldest event seen: the heat map's minute holds only what came since.
    first_event_ms: Option<u64>,
    lateness: Lateness,
}

impl Predictor {
    /// A predictor that scores with `model`; with `None` it only collects labelled
    /// samples (for `pulse train`).
    pub fn new(model: Option<Arc<ScoringModel>>, config: PredictorConfig) -> Self {
        Predictor {
            model,
            tracker: Tracker::new(config.max_tracked_keys),
            labeler: Labeler::new(
                // What the honest scorer counts: a region asks while a command sent
                // then would still be valid.
                config.policy.command_ttl_ms,
                config.sample_every_ms,
                config.sample_capacity,
            ),
            decider: Decider::new(config.policy),
            calibration: OnlineCalibration::default(),
            paces: Paces::default(),
            pending_calibration: None,
            calibrate_online: config.calibrate_online,
            scored: 0,
            first_event_ms: None,
            lateness: Lateness::default(),
        }
    }

    /// Feeds one applied event.
    pub fn observe(&mut self, event: &AccessEventRef<'_>) {
        self.first_event_ms = Some(
            self.first_event_ms
                .map_or(event.ts_ms, |f| f.min(event.ts_ms)),
        );
        self.lateness.observe(event.ts_ms);
        if self.tracker.observe(event) {
            self.decider.observe(
                event.ts_ms,
                event.tenant.as_str(),
                event.key.as_str(),
                &event.region,
                event.outcome,
            );
        }
    }

    /// Scores the candidates that saw events since the last tick and returns the
    /// commands to send.
    pub fn tick(&mut self, heat: &HeatMap, now_ms: u64) -> Vec<PrewarmCommand> {
        self.run_tick(heat, now_ms, true)
    }

    /// A tick for replayed events (a partition rebuilding its windows): keys are
    /// tracked and bursts noted as a tick would, so the tracker is where it would have
    /// been, but nothing is scored, labelled or sent, and no decision changes.
    pub fn warm(&mut self, heat: &HeatMap, now_ms: u64) {
        let none = self.run_tick(heat, now_ms, false);
        debug_assert!(none.is_empty());
    }

    fn run_tick(&mut self, heat: &HeatMap, now_ms: u64, decide: bool) -> Vec<PrewarmCommand> {
        let mut commands = Vec::new();
        // Ids only: the summaries (`HeatMap::tenants`) compute error bounds, and a tick
        // runs per partition after every batch.
        // In a fixed order (the maps' is random): a decision reads what earlier ones in
        // the tick noted (a burst, a pace, a token), and a replay must decide alike.
        let mut tenants: Vec<TenantId> = heat
            .tenant_ids()
            .filter_map(|t| TenantId::new(t).ok())
            .collect();
        tenants.sort_unstable();
        let grace_ms = self.lateness.grace_ms();
        for tenant in &tenants {
            if let Ok(candidates) = heat.candidates(tenant, now_ms) {
                self.tracker.track(tenant, &candidates, now_ms);
            }
            let mut touched: Vec<_> = match self.tracker.tenants.get_mut(tenant) {
                Some(t) => t
                    .keys
                    .iter_mut()
                    .filter(|(_, k)| k.touched)
                    .map(|(key, k)| {
                        k.touched = false;
                        key.clone()
                    })
                    .collect(),
                None => continue,
            };
            touched.sort_unstable();
            // A key's minute average over the part of the minute its tenant has been
            // seen: at start, or when a tenant's traffic arrives (a new tenant, a switch
            // from another CDN), every popular key's minute looks quiet, and every one
            // would seem to burst.
            let first_ms = self.tracker.first_seen(tenant).max(self.first_event_ms);
            let seen_ms = now_ms.saturating_sub(first_ms.unwrap_or(now_ms));
            let minute_share = (seen_ms as f64 / 60_000.0).clamp(1.0 / 60.0, 1.0);
            for key in touched {
                // First whether the key bursts, from its last second (and, only when
                // that is busy, its minute): every touched key needs that, and few
                // need more. Its windows end where that second was measured.
                let Ok((v1, measured_ms)) = last_second(heat, tenant, &key, now_ms, grace_ms)
                else {
                    continue;
                };
                let velocity = |window| heat.key_velocity(tenant, &key, window, measured_ms);
                let bursting =
                    is_bursting(v1, || velocity(Window::S60).unwrap_or(0.0) / minute_share);
                let burst_start = self.tracker.burst_start(tenant, &key, bursting, now_ms);
                // Only the first seconds of a burst, with regions left to warm, can
                // become a command: only those moments are scored, and only those teach
                // the model (a long burst would otherwise outweigh many short ones).
                // So are the first seconds after the key reached a new region while
                // busy: a spread the first region could not foretell (a crowd and a
                // viral look alike there) is decided at its second region.
                let early = burst_start.is_some_and(|start| now_ms < start + EARLY_BURST_MS)
                    || (v1 >= pipeline::policy::BURST_MIN_RPS
                        && self
                            .tracker
                            .spread_lately(tenant, &key, now_ms, EARLY_BURST_MS));
                // Features as of before this tick's burst is noted.
                let extracted = (decide && early)
                    .then(|| {
                        heat.key_windows(tenant, &key, FEATURE_WINDOWS, measured_ms)
                            .ok()
                    })
                    .flatten()
                    .and_then(|windows| extract(&windows, &self.tracker, tenant, &key, now_ms));
                self.tracker.note_burst(tenant, &key, bursting, now_ms);
                if decide && let Some(command) = self.follow_up(tenant, &key, now_ms) {
                    commands.push(command);
                }
                let Some(x) = extracted else {
                    continue;
                };
                // Which unseen regions share an audience with the reached ones:
                // computed at most once, for the label or the decision.
                let mut audience = None;
                // A label over the regions a command would name only: a late moment of
                // a viral that reached all its audience names none, though another
                // audience's silence would teach the calibration that such moments do
                // not spread.
                if !x.unseen.is_empty() {
                    let tracker = &self.tracker;
                    self.labeler.offer(now_ms, tenant, &key, &x.features, || {
                        x.unseen_counts
                            .iter()
                            .zip(pipeline::audience_of(tracker, tenant, &x, &mut audience))
                            .filter_map(|(count, named)| named.then_some(*count))
                            .collect()
                    });
                }
                // Without a model (`pulse train`) there is nothing to decide.
                let Some(model) = self.model.clone() else {
                    continue;
                };
                let command =
                    self.decide(now_ms, tenant, &key, x, burst_start, &model, &mut audience);
                commands.extend(command);
            }
        }
        if decide {
            let settled = self.labeler.settle(now_ms, &self.tracker);
            if let Some(model) = self.model.as_ref().filter(|_| self.calibrate_online) {
                let labelled = self.labeler.labelled();
                let skip = labelled.len() - settled;
                for s in labelled.skip(skip) {
                    self.calibration.note(
                        &s.tenant,
                        at_spread(&s.features),
                        model.raw(&s.features),
                        s.viral,
                    );
                }
            }
            self.decider.expire(now_ms);
        }
        commands
    }

    /// How far behind its watermark a tick also measures a key's last second: how late
    /// this partition's events arrive ([`lateness`]; 0 in time order).
    pub fn lateness_grace_ms(&self) -> u64 {
        self.lateness.grace_ms()
    }

    /// The decision rules in force.
    pub fn policy(&self) -> &DecisionPolicy {
        self.decider.policy()
    }

    /// The model in use.
    pub fn model(&self) -> Option<&Arc<ScoringModel>> {
        self.model.as_ref()
    }

    /// The online calibration's counts for the checkpoint; `None` without a model or
    /// with the recalibration off.
    pub(crate) fn saved_calibration(&self) -> Option<SavedCalibration> {
        let model = self.model.as_ref().filter(|_| self.calibrate_online)?;
        Some(self.calibration.save(model_identity(model)))
    }

    /// What the predictor learnt of its traffic whatever the model, for the checkpoint.
    pub(crate) fn saved_traffic(&self) -> SavedTraffic {
        SavedTraffic {
            paces: self.paces.clone(),
            trust: self.decider.trust_learnt().clone(),
        }
    }

    /// Puts back what a checkpoint kept of the traffic: the trust of each step if its
    /// tallies are counts, and the paces if they are paces. Whether the paces were put
    /// back.
    pub(crate) fn restore_traffic(&mut self, saved: SavedTraffic) -> bool {
        if let Some(trust) = Trust::restore(saved.trust) {
            self.decider.restore_trust(trust);
        }
        match Paces::restore(saved.paces) {
            Some(paces) => {
                self.paces = paces;
                true
            }
            None => false,
        }
    }

    /// Puts back counts a checkpoint kept, if they were counted for the model in use
    /// (otherwise they wait for the next model, in case it is theirs): a restarted
    /// partition then need not wait for first-region outcomes again. Whether they were
    /// put back.
    pub(crate) fn restore_calibration(&mut self, saved: SavedCalibration) -> bool {
        if !self.calibrate_online {
            return false;
        }
        let in_use = self.model.as_deref().map(model_identity);
        let Some(in_use) = in_use.filter(|m| *m == saved.model) else {
            self.pending_calibration = Some(saved);
            return false;
        };
        match OnlineCalibration::restore(saved, &in_use) {
            Some(counts) => {
                self.calibration = counts;
                true
            }
            None => false,
        }
    }

    /// Replaces the model (after a retrain).
    pub fn set_model(&mut self, model: Arc<ScoringModel>) {
        let identity = model_identity(&model);
        // Another model's raw outputs mean something else: what was seen of the last
        // one's goes (the same model again, as the fleet's topic replays it, keeps it).
        if self.model.as_deref().map(model_identity).as_ref() != Some(&identity) {
            self.calibration.reset();
        }
        self.model = Some(model);
        // Counts waiting for a model: put back if this is theirs, dropped if not (never
        // kept for a model that may not come).
        if let Some(counts) = self
            .pending_calibration
            .take()
            .and_then(|saved| OnlineCalibration::restore(saved, &identity))
        {
            self.calibration = counts;
        }
    }

    /// Recent decisions, newest first.
    pub fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.decider.recent()
    }

    /// The last decision of a key with a recent decision (one of [`Self::decisions`]):
    /// the stage it ended at, and why it was refused if it was.
    pub fn last_decision(&self, tenant: &TenantId, key: &CacheKey) -> Option<LastDecision> {
        self.decider.last_decision(tenant, key)
    }

    /// Decision totals.
    pub fn counts(&self) -> DecisionCounts {
        self.decider.counts()
    }

    /// Keys scored so far.
    pub fn scored(&self) -> u64 {
        self.scored
    }

    /// Labelled samples so far, oldest first.
    pub fn samples(&self) -> impl ExactSizeIterator<Item = &Sample> {
        self.labeler.labelled()
    }

    /// Takes the labelled samples out.
    pub fn take_samples(&mut self) -> Vec<Sample> {
        self.labeler.take()
    }
}

/// A key's demand per second over its last second, and where that second ends: at the
/// watermark `now_ms`, or `grace_ms` behind it when late events make that one busier
/// (a second at the watermark holds only the requests already delivered).
fn last_second(
    heat: &HeatMap,
    tenant: &TenantId,
    key: &CacheKey,
    now_ms: u64,
    grace_ms: u64,
) -> Result<(f64, u64), crate::heat::QueryError> {
    let at_watermark = heat.key_velocity(tenant, key, Window::S1, now_ms)?;
    if grace_ms == 0 {
        return Ok((at_watermark, now_ms));
    }
    let behind_ms = now_ms.saturating_sub(grace_ms);
    let behind = heat.key_velocity(tenant, key, Window::S1, behind_ms)?;
    Ok(if behind > at_watermark {
        (behind, behind_ms)
    } else {
        (at_watermark, now_ms)
    })
}

/// What a partition's predictor learnt of its traffic, whatever the model: its tenants'
/// typical paces and the trust of each step's commands. A checkpoint keeps it beside
/// the heat map (the calibration's counts go apart: they hold for one model only).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SavedTraffic {
    paces: Paces,
    /// Absent from a checkpoint an older build wrote (which kept records of first- and
    /// second-region commands instead, now ignored): the prior.
    #[serde(default)]
    trust: Trust,
}

/// What the online calibration's counts are tied to: the model's name and training time.
fn model_identity(model: &ScoringModel) -> (String, u64) {
    (model.name.clone(), model.trained_at_ms)
}

/// Whether a scoring moment is at a spread (a region reached in the last 10 s): the
/// online calibration counts those apart.
fn at_spread(features: &Features) -> bool {
    features.new_regions_10s > 0.0
}
