//! The scoring model: a linear regression (linfa-linear) over the [`Features`],
//! fitted to a 0/1 "viral" label and calibrated to a confidence in `[0, 1]`.
//!
//! Training standardises every (transformed) feature, fits ordinary least squares with
//! a small ridge penalty (added as extra rows, so a constant feature cannot make the
//! system singular), then fits a one-dimensional logistic calibration
//! `confidence = σ(slope · ŷ + offset)` on the regression output, so a confidence of
//! 0.85 means roughly "85 % of keys scored like this went viral".

use linfa::Dataset;
use linfa::traits::Fit;
use linfa_linear::LinearRegression;
use models::{FeatureContribution, Reason};
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::calibrate::{fit_isotonic, isotonic_at};
use super::features::{FEATURE_COUNT, FEATURE_NAMES, Features};

/// The model pulse scores with unless told otherwise: trained by
/// `scripts/train-default-model` on a generated trace and shipped in the binary.
pub fn default_model() -> ScoringModel {
    ScoringModel::from_json(include_str!("../../model/default.json"))
        .expect("the shipped model file is valid")
}

/// Largest standardised value a feature may have when scored.
pub(crate) const MAX_Z: f64 = 4.0;

/// The model file format this build reads and writes.
pub(crate) const MODEL_FORMAT: u32 = 2;

/// Why a model could not be trained or loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Training needs both viral and non-viral samples.
    #[error("training needs both labels: {positives} viral and {negatives} non-viral samples")]
    OneClass {
        /// Viral samples.
        positives: usize,
        /// Non-viral samples.
        negatives: usize,
    },
    /// The least-squares solver failed.
    #[error("regression failed: {0}")]
    Regression(String),
    /// The model file is not valid JSON for a model.
    #[error("model file: {0}")]
    Parse(#[from] serde_json::Error),
    /// The model file parses but does not fit this build.
    #[error("model file: {0}")]
    Invalid(String),
}

/// How a feature is transformed before standardising.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// The raw value.
    Identity,
    /// `ln(1 + max(x, 0))`, for rates and counts with heavy tails.
    Log1p,
}

impl Transform {
    fn apply(self, x: f64) -> f64 {
        match self {
            Transform::Identity => x,
            Transform::Log1p => x.max(0.0).ln_1p(),
        }
    }

    /// The default transform of each feature, by name.
    pub(super) fn for_feature(name: &str) -> Transform {
        if name.starts_with("velocity_") || name == "phase_bursts_before" || name == "nodes_asking"
        {
            Transform::Log1p
        } else {
            Transform::Identity
        }
    }
}

/// Maps the regression output to a probability: `σ(slope · ŷ + offset)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Multiplies the regression output.
    pub slope: f64,
    /// Added before the logistic.
    pub offset: f64,
}

/// Counts of a model's decisions at one threshold against the true labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The confidence threshold.
    pub threshold: f64,
    /// Viral and predicted viral.
    pub true_positives: usize,
    /// Not viral but predicted viral.
    pub false_positives: usize,
    /// Viral but not predicted.
    pub false_negatives: usize,
    /// Not viral and not predicted.
    pub true_negatives: usize,
}

impl Evaluation {
    /// Of the keys predicted viral, the share that were (1 when none was predicted).
    pub fn precision(&self) -> f64 {
        ratio(
            self.true_positives,
            self.true_positives + self.false_positives,
        )
    }

    /// Of the viral keys, the share that were predicted (1 when none was viral).
    pub fn recall(&self) -> f64 {
        ratio(
            self.true_positives,
            self.true_positives + self.false_negatives,
        )
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        1.0
    } else {
        part as f64 / whole as f64
    }
}

/// What the model was trained on and how it did: the model card's numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingMetrics {
    /// Samples used for fitting.
    pub samples: usize,
    /// Of which viral.
    pub positives: usize,
    /// R² of the regression on the training samples.
    pub r2: f64,
    /// Decisions at the default threshold on the training samples.
    pub train: Evaluation,
    /// Decisions at the default threshold on held-out samples, when there were any.
    pub held_out: Option<Evaluation>,
    /// The traffic families (`pulse trace --family`) it was trained on, if it was
    /// trained on generated families: every other family is held out.
    #[serde(default)]
    pub families: Vec<String>,
    /// Reliability of the confidence: per tenth of the confidence range, how many
    /// samples scored there and the share that went viral (on the held-out samples when
    /// there were any, else on the training ones).
    #[serde(default)]
    pub reliability: Vec<ReliabilityBin>,
}

/// One row of a reliability table: samples whose confidence fell in `[lower, upper)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReliabilityBin {
    /// Lowest confidence of the bin.
    pub lower: f64,
    /// Upper bound (exclusive, but 1.0 is in the last bin).
    pub upper: f64,
    /// Samples in the bin.
    pub samples: usize,
    /// Their mean confidence.
    pub mean_confidence: f64,
    /// The share of them that went viral: close to `mean_confidence` when calibrated.
    pub viral_share: f64,
}

/// A reliability table in tenths from (confidence, outcome) pairs; empty bins are left
/// out.
pub(crate) fn reliability(scored: &[(f64, bool)]) -> Vec<ReliabilityBin> {
    (0..10)
        .filter_map(|i| {
            let (lower, upper) = (i as f64 / 10.0, (i + 1) as f64 / 10.0);
            let inside: Vec<_> = scored
                .iter()
                .filter(|(c, _)| *c >= lower && (*c < upper || (i == 9 && *c <= 1.0)))
                .collect();
            (!inside.is_empty()).then(|| ReliabilityBin {
                lower,
                upper,
                samples: inside.len(),
                mean_confidence: inside.iter().map(|(c, _)| c).sum::<f64>() / inside.len() as f64,
                viral_share: inside.iter().filter(|(_, v)| *v).count() as f64 / inside.len() as f64,
            })
        })
        .collect()
}

/// A confidence with its explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// Calibrated confidence in `[0, 1]`.
    pub confidence: f64,
    /// The regression output before calibration.
    pub raw: f64,
    /// The regression's intercept and each feature's part in `raw`.
    pub reason: Reason,
}

/// Options for [`ScoringModel::train`].
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The model's name, recorded in every decision it makes.
    pub name: String,
    /// When it was trained, ms since the epoch.
    pub trained_at_ms: u64,
    /// Ridge penalty on standardised coefficients: strong by default, so features that
    /// merely tell training traces apart (time of day in a generated trace) stay small.
    pub ridge: f64,
    /// The threshold the card's precision and recall are computed at.
    pub threshold: f64,
    /// What the ridge pulls each coefficient toward, as a slope per unit of the
    /// transformed feature ([`ScoringModel::slopes`]); `None` pulls toward 0. An online
    /// retrain pulls toward the model it may replace, so a feature its few minutes of
    /// moments say nothing about (no local-news crowd among them) keeps its weight.
    pub prior: Option<Vec<f64>>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            name: "model".into(),
            trained_at_ms: 0,
            ridge: 1.0,
            threshold: 0.85,
            prior: None,
        }
    }
}

/// A trained, versioned scoring model; serialises to the JSON model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoringModel {
    /// File format version ([`MODEL_FORMAT`]).
    pub format: u32,
    /// The model's name, such as `default-1`.
    pub name: String,
    /// When it was trained, ms since the epoch.
    pub trained_at_ms: u64,
    /// Feature names, in [`FEATURE_NAMES`] order.
    pub features: Vec<String>,
    /// Per-feature transform.
    pub transforms: Vec<Transform>,
    /// Per-feature mean of the transformed value.
    pub means: Vec<f64>,
    /// Per-feature standard deviation of the transformed value (1 when constant).
    pub stds: Vec<f64>,
    /// Regression coefficient per standardised feature.
    pub coefficients: Vec<f64>,
    /// Regression intercept.
    pub intercept: f64,
    /// Regression output → confidence.
    pub calibration: Calibration,
    /// Isotonic calibration, when fitted on held-out moments
    /// ([`ScoringModel::calibrate`]): breakpoints `[raw output, probability]`; it
    /// replaces the logistic one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isotonic: Vec<[f64; 2]>,
    /// The model card's numbers.
    pub metrics: TrainingMetrics,
}

pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl ScoringModel {
    /// Fits a model to labelled samples (`true` = went viral); `held_out` samples only
    /// measure it.
    pub fn train(
        samples: &[(Features, bool)],
        held_out: &[(Features, bool)],
        options: &TrainOptions,
    ) -> Result<Self, ModelError> {
        let positives = samples.iter().filter(|(_, viral)| *viral).count();
        if positives == 0 || positives == samples.len() {
            return Err(ModelError::OneClass {
                positives,
                negatives: samples.len() - positives,
            });
        }
        let transforms: Vec<Transform> = FEATURE_NAMES
            .iter()
            .map(|n| Transform::for_feature(n))
            .collect();
        let n = samples.len();
        let transformed = Array2::from_shape_fn((n, FEATURE_COUNT), |(i, j)| {
            transforms[j].apply(samples[i].0.values()[j])
        });
        let means: Vec<f64> = (0..FEATURE_COUNT)
            .map(|j| transformed.column(j).mean().unwrap_or(0.0))
            .collect();
        let stds: Vec<f64> = (0..FEATURE_COUNT)
            .map(|j| {
                let sd = transformed.column(j).std(0.0);
                if sd > 1e-12 { sd } else { 1.0 }
            })
            .collect();

        // Ridge as data augmentation: sqrt(λ·n) on the diagonal, target 0.
        let penalty = (options.ridge * n as f64).sqrt();
        let mut records = Array2::zeros((n + FEATURE_COUNT, FEATURE_COUNT));
        let mut targets = Array1::zeros(n + FEATURE_COUNT);
        for i in 0..n {
            for j in 0..FEATURE_COUNT {
                records[(i, j)] = (transformed[(i, j)] - means[j]) / stds[j];
            }
            targets[i] = if samples[i].1 { 1.0 } else { 0.0 };
        }
        for j in 0..FEATURE_COUNT {
            records[(n + j, j)] = penalty;
            // The fitted intercept is added to these rows too; aim them at it, plus
            // the prior's coefficient in this fit's standardisation.
            let prior = options.prior.as_ref().and_then(|p| p.get(j)).copied();
            targets[n + j] = positives as f64 / n as f64 + penalty * prior.unwrap_or(0.0) * stds[j];
        }
        let fitted = LinearRegression::new()
            .fit(&Dataset::new(records, targets))
            .map_err(|e| ModelError::Regression(e.to_string()))?;

        let mut model = ScoringModel {
            format: MODEL_FORMAT,
            name: options.name.clone(),
            trained_at_ms: options.trained_at_ms,
            features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
            transforms,
            means,
            stds,
            coefficients: fitted.params().to_vec(),
            intercept: fitted.intercept(),
            calibration: Calibration {
                slope: 1.0,
                offset: 0.0,
            },
            isotonic: Vec::new(),
            metrics: TrainingMetrics::default(),
        };
        if model.coefficients.iter().any(|c| !c.is_finite()) || !model.intercept.is_finite() {
            return Err(ModelError::Regression("non-finite coefficients".into()));
        }

        let raw: Vec<(f64, bool)> = samples
            .iter()
            .map(|(f, viral)| (model.raw(f), *viral))
            .collect();
        model.calibration = fit_calibration(&raw);
        let mean_label = positives as f64 / n as f64;
        let (ss_res, ss_tot) = raw.iter().fold((0.0, 0.0), |(res, tot), (y_hat, viral)| {
            let y = if *viral { 1.0 } else { 0.0 };
            (res + (y - y_hat).powi(2), tot + (y - mean_label).powi(2))
        });
        model.metrics = TrainingMetrics {
            samples: n,
            positives,
            r2: 1.0 - ss_res / ss_tot,
            train: model.evaluate(samples, options.threshold),
            held_out: (!held_out.is_empty()).then(|| model.evaluate(held_out, options.threshold)),
            families: Vec::new(),
            reliability: Vec::new(),
        };
        let measured = if held_out.is_empty() {
            samples
        } else {
            held_out
        };
        let scored: Vec<(f64, bool)> = measured
            .iter()
            .map(|(f, viral)| (model.confidence_of(model.raw(f)), *viral))
            .collect();
        model.metrics.reliability = reliability(&scored);
        Ok(model)
    }

    /// Standardised, transformed feature values, clamped to ±[`MAX_Z`]: a value far
    /// outside what training saw must not swamp every other feature.
    fn standardised(&self, features: &Features) -> [f64; FEATURE_COUNT] {
        let values = features.values();
        std::array::from_fn(|j| {
            let z = (self.transforms[j].apply(values[j]) - self.means[j]) / self.stds[j];
            if z.is_finite() {
                z.clamp(-MAX_Z, MAX_Z)
            } else {
                0.0
            }
        })
    }

    /// Each coefficient as a slope per unit of its transformed feature (coefficient over
    /// standard deviation): comparable across fits of other standardisations.
    pub(crate) fn slopes(&self) -> Vec<f64> {
        self.coefficients
            .iter()
            .zip(&self.stds)
            .map(|(c, sd)| c / sd)
            .collect()
    }

    /// The regression output before calibration.
    pub(crate) fn raw(&self, features: &Features) -> f64 {
        self.standardised(features)
            .iter()
            .zip(&self.coefficients)
            .map(|(z, c)| z * c)
            .sum::<f64>()
            + self.intercept
    }

    /// Scores one key: its confidence and each feature's contribution.
    pub fn score(&self, features: &Features) -> Score {
        let z = self.standardised(features);
        let values = features.values();
        let contributions: Vec<FeatureContribution> = (0..FEATURE_COUNT)
            .map(|j| FeatureContribution {
                name: FEATURE_NAMES[j].to_owned(),
                value: if values[j].is_finite() {
                    values[j]
                } else {
                    0.0
                },
                contribution: z[j] * self.coefficients[j],
            })
            .collect();
        let raw = self.intercept + contributions.iter().map(|c| c.contribution).sum::<f64>();
        Score {
            confidence: self.confidence_of(raw),
            raw,
            reason: Reason {
                model: self.name.clone(),
                intercept: self.intercept,
                features: contributions,
            },
        }
    }

    pub(crate) fn confidence_of(&self, raw: f64) -> f64 {
        if self.isotonic.is_empty() {
            sigmoid(self.calibration.slope * raw + self.calibration.offset)
        } else {
            isotonic_at(&self.isotonic, raw)
        }
    }

    /// Calibrates the confidence on labelled moments the regression did not learn
    /// from (isotonic: the share of alike-scored moments that went viral) and measures
    /// the reliability table on them. Too few moments, or one label, change nothing;
    /// returns whether it calibrated.
    pub fn calibrate(&mut self, moments: &[(Features, bool)]) -> bool {
        let raw: Vec<(f64, bool)> = moments.iter().map(|(f, v)| (self.raw(f), *v)).collect();
        let points = fit_isotonic(&raw);
        if points.is_empty() {
            return false;
        }
        self.isotonic = points;
        let scored: Vec<(f64, bool)> = raw
            .iter()
            .map(|(x, v)| (self.confidence_of(*x), *v))
            .collect();
        self.metrics.reliability = reliability(&scored);
        true
    }

    /// Counts decisions at `threshold` against the labels.
    pub fn evaluate(&self, samples: &[(Features, bool)], threshold: f64) -> Evaluation {
        let mut e = Evaluation {
            threshold,
            ..Evaluation::default()
        };
        for (features, viral) in samples {
            let predicted = self.confidence_of(self.raw(features)) >= threshold;
            match (predicted, *viral) {
                (true, true) => e.true_positives += 1,
                (true, false) => e.false_positives += 1,
                (false, true) => e.false_negatives += 1,
                (false, false) => e.true_negatives += 1,
            }
        }
        e
    }
}

/// One-dimensional logistic regression of the label on the regression output, by
/// Newton's method with a small L2 penalty so separable data keeps a finite slope.
fn fit_calibration(raw: &[(f64, bool)]) -> Calibration {
    const PENALTY: f64 = 1e-2;
    let (mut slope, mut offset) = (1.0, 0.0);
    for _ in 0..50 {
        let (mut g0, mut g1, mut h00, mut h01, mut h11) = (PENALTY * slope, 0.0, PENALTY, 0.0, 0.0);
        for (x, viral) in raw {
            let p = sigmoid(slope * x + offset);
            let y = if *viral { 1.0 } else { 0.0 };
            let w = (p * (1.0 - p)).max(1e-12);
            g0 += (p - y) * x;
            g1 += p - y;
            h00 += w * x * x;
            h01 += w * x;
            h11 += w;
        }
        let det = h00 * h11 - h01 * h01;
        if det.abs() < 1e-18 {
            break;
        }
        let step_slope = (h11 * g0 - h01 * g1) / det;
        let step_offset = (h00 * g1 - h01 * g0) / det;
        slope -= step_slope;
        offset -= step_offset;
        if step_slope.abs() + step_offset.abs() < 1e-9 {
            break;
        }
    }
    Calibration { slope, offset }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Viral keys accelerate across many regions; quiet ones do not. A tiny
    /// deterministic generator keeps the test free of a random-number dependency.
    fn samples(n: usize, seed: u64) -> Vec<(Features, bool)> {
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|i| {
                let viral = i % 3 == 0;
                let mut f = Features::default();
                let base = 1.0 + 20.0 * next();
                f.velocity_10s = base;
                f.velocity_200ms = if viral {
                    base * (5.0 + 20.0 * next())
                } else {
                    base * (0.5 + next())
                };
                f.velocity_1s = (f.velocity_200ms + f.velocity_10s) / 2.0;
                f.acceleration = ((1.0 + f.velocity_200ms) / (1.0 + f.velocity_10s)).ln();
                f.new_regions_10s = if viral {
                    2.0 + (4.0 * next()).floor()
                } else {
                    (2.0 * next()).floor()
                };
                f.miss_share_1s = next();
                f.tenant_burstiness = next();
                (f, viral)
            })
            .collect()
    }

    #[test]
    fn learns_to_separate_viral_from_quiet_keys() {
        let model =
            ScoringModel::train(&samples(600, 1), &samples(300, 2), &TrainOptions::default())
                .unwrap();
        let held_out = model.metrics.held_out.unwrap();
        assert!(held_out.precision() >= 0.95, "{held_out:?}");
        assert!(held_out.recall() >= 0.95, "{held_out:?}");
        // Acceleration must push the score up, not down.
        let accel = FEATURE_NAMES
            .iter()
            .position(|n| *n == "acceleration")
            .unwrap();
        assert!(model.coefficients[accel] > 0.0, "{:?}", model.coefficients);
    }

    /// An online retrain pulls its coefficients toward the model it may replace: a
    /// feature its moments say nothing about keeps that model's weight. Here the model
    /// learnt elsewhere that virals' referrers reach every region and crowds' one; the
    /// moments of the retrain hold no crowd, so reach is constant among them. Pulled
    /// toward 0, the retrain forgets reach and scores a one-region crowd as a viral.
    #[test]
    fn a_retrain_keeps_the_weight_of_what_its_moments_do_not_show() {
        let reach = FEATURE_NAMES
            .iter()
            .position(|n| *n == "referrer_reach")
            .unwrap();
        let with_reach = |samples: Vec<(Features, bool)>, crowds: bool| -> Vec<_> {
            samples
                .into_iter()
                .map(|(mut f, viral)| {
                    f.referrer_reach = if viral || !crowds { 1.0 } else { 1.0 / 6.0 };
                    (f, viral)
                })
                .collect()
        };
        let elsewhere = ScoringModel::train(
            &with_reach(samples(600, 1), true),
            &[],
            &TrainOptions::default(),
        )
        .unwrap();
        let learnt = elsewhere.slopes()[reach];
        assert!(learnt > 0.0, "{learnt}");
        let here = with_reach(samples(600, 3), false);
        let forgetful = ScoringModel::train(&here, &[], &TrainOptions::default()).unwrap();
        let pulled = TrainOptions {
            prior: Some(elsewhere.slopes()),
            ..TrainOptions::default()
        };
        let retrained = ScoringModel::train(&here, &[], &pulled).unwrap();
        assert!(forgetful.slopes()[reach].abs() < 0.01 * learnt, "{learnt}");
        assert!(
            (retrained.slopes()[reach] - learnt).abs() < 0.05 * learnt,
            "{} against {learnt}",
            retrained.slopes()[reach]
        );
        // A viral's features, from a one-region local news crowd.
        let mut crowd = with_reach(samples(3, 5), false)[0].0;
        crowd.referrer_reach = 1.0 / 6.0;
        assert!(
            retrained.raw(&crowd) < forgetful.raw(&crowd) - 0.05,
            "{} against {}",
            retrained.raw(&crowd),
            forgetful.raw(&crowd)
        );
    }

    #[test]
    fn contributions_add_up_to_the_score() {
        let data = samples(300, 3);
        let model = ScoringModel::train(&data, &[], &TrainOptions::default()).unwrap();
        for (features, _) in data.iter().take(20) {
            let score = model.score(features);
            let sum: f64 = score.reason.intercept
                + score
                    .reason
                    .features
                    .iter()
                    .map(|c| c.contribution)
                    .sum::<f64>();
            assert!((sum - score.raw).abs() < 1e-9);
            assert!((0.0..=1.0).contains(&score.confidence));
            assert_eq!(score.reason.features.len(), FEATURE_COUNT);
        }
    }

    #[test]
    fn calibration_orders_viral_above_quiet() {
        let data = samples(300, 4);
        let model = ScoringModel::train(&data, &[], &TrainOptions::default()).unwrap();
        let mean = |viral: bool| {
            let scores: Vec<f64> = data
                .iter()
                .filter(|(_, v)| *v == viral)
                .map(|(f, _)| model.score(f).confidence)
                .collect();
            scores.iter().sum::<f64>() / scores.len() as f64
        };
        assert!(
            mean(true) > 0.85 && mean(false) < 0.15,
            "{} {}",
            mean(true),
            mean(false)
        );
    }

    #[test]
    fn refuses_one_class_training() {
        let quiet: Vec<_> = samples(30, 5)
            .into_iter()
            .map(|(f, _)| (f, false))
            .collect();
        let err = ScoringModel::train(&quiet, &[], &TrainOptions::default()).unwrap_err();
        assert!(matches!(
            err,
            ModelError::OneClass {
                positives: 0,
                negatives: 30
            }
        ));
    }

    #[test]
    fn model_file_round_trips_and_bad_files_are_named() {
        let model = ScoringModel::train(&samples(200, 6), &[], &TrainOptions::default()).unwrap();
        let json = model.to_json();
        assert_eq!(ScoringModel::from_json(&json).unwrap(), model);

        let mut other = model.clone();
        other.coefficients.pop();
        let err = ScoringModel::from_json(&other.to_json()).unwrap_err();
        assert!(err.to_string().contains("coefficients"), "{err}");

        let mut other = model.clone();
        other.features[0] = "renamed".into();
        assert!(
            ScoringModel::from_json(&other.to_json())
                .unwrap_err()
                .to_string()
                .contains("features")
        );

        let mut other = model.clone();
        other.stds[2] = 0.0;
        assert!(
            ScoringModel::from_json(&other.to_json())
                .unwrap_err()
                .to_string()
                .contains("stds")
        );

        let err =
            ScoringModel::from_json(&json.replace("\"format\": 2", "\"format\": 9")).unwrap_err();
        assert!(err.to_string().contains("format 9"), "{err}");
        assert!(matches!(
            ScoringModel::from_json("{"),
            Err(ModelError::Parse(_))
        ));
    }

    /// A file written before a feature existed still reads: the feature weighs 0, the
    /// others keep their order by name, so every score is the file's.
    #[test]
    fn an_older_file_without_a_feature_reads_with_that_feature_weighed_zero() {
        let mut model =
            ScoringModel::train(&samples(200, 6), &[], &TrainOptions::default()).unwrap();
        let mail = FEATURE_NAMES
            .iter()
            .position(|f| *f == "referrer_mail_share")
            .unwrap();
        model.coefficients[mail] = 0.0;
        let mut older = model.clone();
        for list in [&mut older.means, &mut older.stds, &mut older.coefficients] {
            list.remove(mail);
        }
        older.transforms.remove(mail);
        older.features.remove(mail);
        // Written in another order, too.
        older.features.swap(0, 1);
        older.means.swap(0, 1);
        older.stds.swap(0, 1);
        older.coefficients.swap(0, 1);
        older.transforms.swap(0, 1);
        let read = ScoringModel::from_json(&older.to_json()).unwrap();
        assert_eq!(read.features, FEATURE_NAMES);
        for (features, _) in samples(50, 9) {
            let mut with_mail = features;
            with_mail.referrer_mail_share = 0.9;
            assert!((read.raw(&with_mail) - model.raw(&features)).abs() < 1e-9);
        }
    }

    #[test]
    fn reliability_bins_count_and_share() {
        let bins = reliability(&[(0.05, false), (0.95, true), (0.92, false), (1.0, true)]);
        assert_eq!(bins.len(), 2);
        assert_eq!((bins[0].samples, bins[0].viral_share), (1, 0.0));
        assert_eq!(bins[1].samples, 3);
        assert!((bins[1].viral_share - 2.0 / 3.0).abs() < 1e-12);
        assert!((bins[1].mean_confidence - (0.95 + 0.92 + 1.0) / 3.0).abs() < 1e-12);
        let model = ScoringModel::train(&samples(300, 8), &[], &TrainOptions::default()).unwrap();
        let total: usize = model.metrics.reliability.iter().map(|b| b.samples).sum();
        assert_eq!(total, 300);
    }

    #[test]
    fn constant_features_do_not_break_training() {
        // Every sample has the same weekday: a zero-variance column.
        let data: Vec<_> = samples(200, 7)
            .into_iter()
            .map(|(mut f, v)| {
                f.tenant_burstiness = 1.0;
                (f, v)
            })
            .collect();
        let model = ScoringModel::train(&data, &[], &TrainOptions::default()).unwrap();
        assert!(model.coefficients.iter().all(|c| c.is_finite()));
    }
}
