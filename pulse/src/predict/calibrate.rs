//! Isotonic calibration: the regression's output mapped to the share of moments that
//! went viral among those scored alike, fitted on moments the regression did not learn
//! from (keys held out of its fit, or the labelled moments pulse saw since). The
//! logistic calibration assumes the share grows like a sigmoid of the output; on
//! traffic unlike the training traces it does not, and a confidence of 0.99 meant 0.36
//! useful. Isotonic assumes only that a higher output is not less likely viral.

use super::{Features, Sample};

/// One key in this many calibrates instead of fitting.
const CALIBRATION_EVERY: u64 = 5;

/// Whether a moment's key calibrates (else it fits): a hash of tenant and key, so all
/// of a key's moments fall on one side.
fn calibrates(sample: &Sample) -> bool {
    // FNV-1a over tenant and key: stable across builds and runs.
    let hash = [sample.tenant.as_str(), sample.key.as_str()]
        .iter()
        .flat_map(|s| s.bytes().chain([0]))
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    hash % CALIBRATION_EVERY == 0
}

/// Moments' features with their labels.
pub(crate) type Labelled = Vec<(Features, bool)>;

/// Labelled moments split by key: (to fit the regression, to calibrate it).
pub(crate) fn split_moments(samples: &[Sample]) -> (Labelled, Labelled) {
    let (calibrate, fit): (Vec<&Sample>, Vec<&Sample>) =
        samples.iter().partition(|s| calibrates(s));
    let pairs = |s: Vec<&Sample>| s.into_iter().map(|s| (s.features, s.viral)).collect();
    (pairs(fit), pairs(calibrate))
}

/// Fewer labelled moments than this leave the calibration as it was.
pub(crate) const MIN_CALIBRATION_SAMPLES: usize = 200;

/// Fits a monotone map from raw output to probability by pool-adjacent-violators over
/// `(raw, viral)` pairs: breakpoints `[raw, probability]`, raw increasing. Each block's
/// share is shrunk towards 1/2 by one pseudo-moment (half viral), so a block of three
/// viral moments says 0.875, not certainty. Empty with too few pairs or one label.
pub(crate) fn fit_isotonic(pairs: &[(f64, bool)]) -> Vec<[f64; 2]> {
    let positives = pairs.iter().filter(|(_, v)| *v).count();
    if pairs.len() < MIN_CALIBRATION_SAMPLES || positives == 0 || positives == pairs.len() {
        return Vec::new();
    }
    let mut sorted: Vec<(f64, bool)> = pairs
        .iter()
        .filter(|(x, _)| x.is_finite())
        .copied()
        .collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Blocks: (lowest raw, highest raw, viral count, moments).
    let mut blocks: Vec<(f64, f64, f64, f64)> = Vec::new();
    for (x, viral) in sorted {
        blocks.push((x, x, f64::from(u8::from(viral)), 1.0));
        while blocks.len() >= 2 {
            let (b, a) = (blocks[blocks.len() - 1], blocks[blocks.len() - 2]);
            if a.2 / a.3 < b.2 / b.3 {
                break;
            }
            blocks.pop();
            let last = blocks.len() - 1;
            blocks[last] = (a.0, b.1, a.2 + b.2, a.3 + b.3);
        }
    }
    // A block is flat from its lowest raw output to its highest; only between blocks
    // does the probability climb.
    let mut floor: f64 = 0.0;
    let mut points = Vec::new();
    for (low, high, viral, n) in blocks {
        floor = floor.max((viral + 0.5) / (n + 1.0));
        points.push([low, floor]);
        if high > low {
            points.push([high, floor]);
        }
    }
    points
}

/// The probability at `raw`: linear between breakpoints, flat beyond the ends.
pub(crate) fn isotonic_at(points: &[[f64; 2]], raw: f64) -> f64 {
    let Some(first) = points.first() else {
        return 0.5;
    };
    if raw <= first[0] {
        return first[1];
    }
    for pair in points.windows(2) {
        let ([x0, y0], [x1, y1]) = (pair[0], pair[1]);
        if raw <= x1 {
            let t = if x1 > x0 { (raw - x0) / (x1 - x0) } else { 1.0 };
            return y0 + t * (y1 - y0);
        }
    }
    points[points.len() - 1][1]
}

/// Whether `points` is a valid calibration: finite, raw and probability not
/// decreasing, probabilities in [0, 1].
pub(crate) fn valid(points: &[[f64; 2]]) -> bool {
    points
        .iter()
        .all(|[x, p]| x.is_finite() && (0.0..=1.0).contains(p))
        && points
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moments whose true chance of going viral is known per raw output: the fitted
    /// probability follows that chance (within sampling error), not a sigmoid of it.
    #[test]
    fn the_calibrated_probability_is_the_share_that_went_viral() {
        // Raw 0..1 in ten steps; at step i a share i/10 goes viral (every tenth moment
        // pattern, deterministic), except the top step which is only half viral: a
        // step no sigmoid of raw follows.
        let mut pairs = Vec::new();
        for i in 0..10 {
            let share = if i == 9 { 5 } else { i };
            for j in 0..100 {
                pairs.push((i as f64 / 10.0, j % 10 < share));
            }
        }
        let points = fit_isotonic(&pairs);
        assert!(valid(&points), "{points:?}");
        for (raw, expected) in [(0.1, 0.1), (0.3, 0.3), (0.6, 0.6)] {
            let p = isotonic_at(&points, raw);
            assert!((p - expected).abs() < 0.05, "at {raw}: {p} vs {expected}");
        }
        // The top step pools with the one below: never above what was seen.
        assert!(isotonic_at(&points, 0.9) < 0.7, "{points:?}");
        assert!(isotonic_at(&points, 5.0) < 0.7, "flat beyond the ends");
    }

    /// Moments at four rates: at the three lower ones half go viral, at the top one
    /// all do. A sigmoid of the regression output cannot follow a plateau then a jump
    /// (the logistic calibration is off by more than 0.1 somewhere); the isotonic one
    /// is within 0.1 of the share that went viral at every rate.
    #[test]
    fn a_calibrated_confidence_is_the_share_of_alike_moments_that_went_viral() {
        use crate::predict::{ScoringModel, TrainOptions};
        let moments = |offset: usize| -> Vec<(Features, bool)> {
            (0..4_000)
                .map(|i| {
                    let level = (i + offset) % 4;
                    let f = Features {
                        velocity_1s: 10.0 * (level + 1) as f64,
                        ..Features::default()
                    };
                    let viral = level == 3 || (i / 4) % 2 == 0;
                    (f, viral)
                })
                .collect()
        };
        let mut model = ScoringModel::train(&moments(0), &[], &TrainOptions::default()).unwrap();
        let worst_error = |model: &ScoringModel| {
            (0..4)
                .map(|level| {
                    let f = Features {
                        velocity_1s: 10.0 * (level + 1) as f64,
                        ..Features::default()
                    };
                    let share = if level == 3 { 1.0 } else { 0.5 };
                    (model.score(&f).confidence - share).abs()
                })
                .fold(0.0, f64::max)
        };
        assert!(
            worst_error(&model) > 0.1,
            "the logistic calibration fits a plateau"
        );
        assert!(model.calibrate(&moments(1)));
        assert!(worst_error(&model) <= 0.1, "{:?}", model.isotonic);
    }

    #[test]
    fn too_few_moments_or_one_label_leave_no_calibration() {
        assert!(fit_isotonic(&[(0.5, true); 50]).is_empty());
        assert!(fit_isotonic(&vec![(0.5, true); 500]).is_empty());
        assert_eq!(isotonic_at(&[], 3.0), 0.5);
    }
}
