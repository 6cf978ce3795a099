//! Fitting a model on replayed traces ([`train_on`]): generated traffic families and
//! recorded event files together. The regression fits the moments of four keys in
//! five; the fifth key's moments (chosen by a hash of tenant and key, so all of a
//! key's moments fall on one side) calibrate its confidence, moments it never learned
//! from. Of a recorded file only its first `events_share` in time is learned from (a
//! moment counts only if its label's horizon ends in that part), so the rest of the
//! file stays unseen for the backtest.

use models::AccessEvent;

use super::backtest::{ReplayOptions, replay};
use super::commands::{EventOrder, EventSource, OfflineError, load_events};
use super::trace::{Family, generate as generate_trace};
use crate::predict::{Sample, ScoringModel, TrainOptions, split_moments};

/// What to learn from.
#[derive(Debug, Clone, Default)]
pub struct TrainingSet {
    /// Generated families, one trace per seed each.
    pub families: Vec<&'static Family>,
    /// Their seeds.
    pub seeds: Vec<u64>,
    /// Recorded events.
    pub events: Vec<EventSource>,
    /// Share of each recorded source, from its start in time, that is learned from (1:
    /// all of it).
    pub events_share: f64,
}

/// The labelled moments a replay of `events` collects, those labelled by `until_ms`.
fn moments(events: &[AccessEvent], until_ms: Option<u64>) -> Vec<Sample> {
    let options = ReplayOptions::default();
    let horizon = options.predictor.policy.command_ttl_ms;
    let run = replay(events, None, &options);
    let mut samples = run.samples;
    if let Some(until) = until_ms {
        samples.retain(|s| s.ts_ms + horizon <= until);
    }
    tracing::info!(events = events.len(), samples = samples.len(), "replayed");
    samples
}

/// Fits a model on `set` and measures it on `held_out`'s moments (all of them).
pub fn train_on(
    set: &TrainingSet,
    held_out: Option<&EventSource>,
    options: &TrainOptions,
) -> Result<ScoringModel, OfflineError> {
    let mut samples = Vec::new();
    for family in &set.families {
        for seed in &set.seeds {
            samples.extend(moments(&generate_trace(&family.spec(*seed)).events, None));
        }
    }
    for source in &set.events {
        let events = load_events(source, "events", EventOrder::ByTime)?;
        let until = (set.events_share < 1.0).then(|| {
            let (first, last) = (events[0].ts_ms, events[events.len() - 1].ts_ms);
            first + ((last - first) as f64 * set.events_share.max(0.0)) as u64
        });
        samples.extend(moments(&events, until));
    }
    let (fit, calibrate) = split_moments(&samples);
    let held_out = match held_out {
        Some(source) => moments(&load_events(source, "held_out", EventOrder::ByTime)?, None)
            .into_iter()
            .map(|s| (s.features, s.viral))
            .collect(),
        None => Vec::new(),
    };
    let mut model = ScoringModel::train(&fit, &held_out, options)?;
    model.calibrate(&calibrate);
    model.metrics.families = set.families.iter().map(|f| f.name.to_owned()).collect();
    if !held_out.is_empty() {
        model.metrics.held_out = Some(model.evaluate(&held_out, options.threshold));
    }
    Ok(model)
}

/// Fits a model on the moments of `train` (every event of each).
pub fn train_model(
    train: &[EventSource],
    held_out: Option<&EventSource>,
    options: &TrainOptions,
) -> Result<ScoringModel, OfflineError> {
    let set = TrainingSet {
        events: train.to_vec(),
        events_share: 1.0,
        ..TrainingSet::default()
    };
    train_on(&set, held_out, options)
}

/// Fits a model on each family's trace at each seed; the model card lists the
/// families.
pub fn train_on_families(
    families: &[&'static Family],
    seeds: &[u64],
    held_out: Option<&EventSource>,
    options: &TrainOptions,
) -> Result<ScoringModel, OfflineError> {
    let set = TrainingSet {
        families: families.to_vec(),
        seeds: seeds.to_vec(),
        events_share: 1.0,
        ..TrainingSet::default()
    };
    train_on(&set, held_out, options)
}

/// A model's moments replayed: for tests that train on generated traces.
#[cfg(test)]
pub(crate) fn fit_on(events: &[AccessEvent]) -> std::sync::Arc<ScoringModel> {
    let (fit, calibrate) = split_moments(&moments(events, None));
    let mut model = ScoringModel::train(&fit, &[], &TrainOptions::default()).unwrap();
    model.calibrate(&calibrate);
    std::sync::Arc::new(model)
}
