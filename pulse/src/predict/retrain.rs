//! Online retraining: fit a candidate on the older part of the labelled samples,
//! compare it with the current model on the newest part (held out), and keep it only
//! if it is not worse.

use models::{Evaluation, ScoringModel, TrainOptions};

use super::Sample;

/// What a retrain decided.
#[derive(Debug, Clone)]
pub enum RetrainOutcome {
    /// The candidate is not worse on the held-out samples: use it.
    Replace {
        /// The new model.
        model: Box<ScoringModel>,
        /// The current model on the held-out samples.
        current: Evaluation,
        /// The new model on the same samples.
        candidate: Evaluation,
    },
    /// The candidate is worse: keep the current model.
    Keep {
        /// The current model on the held-out samples.
        current: Evaluation,
        /// The candidate on the same samples.
        candidate: Evaluation,
    },
    /// Too few samples, or only one label among them.
    NotEnoughData(String),
}

/// F1 at the threshold: one number that punishes both misses and false alarms.
fn f1(e: &Evaluation) -> f64 {
    let (p, r) = (e.precision(), e.recall());
    if p + r == 0.0 {
        0.0
    } else {
        2.0 * p * r / (p + r)
    }
}

/// Retrains on `samples` (oldest first); the newest `held_out_share` only measure.
pub fn retrain(
    current: &ScoringModel,
    samples: &[Sample],
    held_out_share: f64,
    options: &TrainOptions,
) -> RetrainOutcome {
    let split = ((samples.len() as f64) * (1.0 - held_out_share)) as usize;
    let pairs = |s: &[Sample]| -> Vec<_> { s.iter().map(|s| (s.features, s.viral)).collect() };
    let (train, held_out) = (pairs(&samples[..split]), pairs(&samples[split..]));
    if held_out.iter().all(|(_, v)| !*v) {
        return RetrainOutcome::NotEnoughData("no viral sample among the held-out ones".into());
    }
    let model = match ScoringModel::train(&train, &held_out, options) {
        Ok(model) => model,
        Err(e) => return RetrainOutcome::NotEnoughData(e.to_string()),
    };
    let current_eval = current.evaluate(&held_out, options.threshold);
    let candidate_eval = model.evaluate(&held_out, options.threshold);
    if f1(&candidate_eval) >= f1(&current_eval) {
        RetrainOutcome::Replace {
            model: Box::new(model),
            current: current_eval,
            candidate: candidate_eval,
        }
    } else {
        RetrainOutcome::Keep {
            current: current_eval,
            candidate: candidate_eval,
        }
    }
}
