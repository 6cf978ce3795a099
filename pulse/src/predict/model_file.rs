//! The model file: [`ScoringModel`] as pretty JSON, read back with every field checked,
//! and a file of an earlier build that lacks a feature aligned to this build's.

use super::calibrate::valid as valid_isotonic;
use super::features::{FEATURE_COUNT, FEATURE_NAMES};
use super::model::{MODEL_FORMAT, ModelError, ScoringModel, Transform};

impl ScoringModel {
    /// The model file: pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a model always serialises")
    }

    /// Reads and checks a model file written by [`ScoringModel::to_json`].
    /// A file from an earlier build that lacks some of this build's features reads as
    /// that model with those features weighed 0 (a fleet upgrading one instance at a
    /// time keeps the model its topic carries); a feature this build does not know is
    /// an error.
    pub fn from_json(json: &str) -> Result<Self, ModelError> {
        let mut model: ScoringModel = serde_json::from_str(json)?;
        model.align_features()?;
        model.check()?;
        Ok(model)
    }

    /// Reorders the per-feature vectors into [`FEATURE_NAMES`] order, a missing
    /// feature weighed 0.
    fn align_features(&mut self) -> Result<(), ModelError> {
        if self.features == FEATURE_NAMES {
            return Ok(());
        }
        let n = self.features.len();
        if [
            self.transforms.len(),
            self.means.len(),
            self.stds.len(),
            self.coefficients.len(),
        ]
        .iter()
        .any(|len| *len != n)
        {
            return Err(ModelError::Invalid(format!(
                "{n} features but transforms, means, stds or coefficients of another length"
            )));
        }
        if let Some(unknown) = self
            .features
            .iter()
            .find(|f| !FEATURE_NAMES.contains(&f.as_str()))
        {
            return Err(ModelError::Invalid(format!(
                "features: {unknown:?} is not one of this build's {FEATURE_NAMES:?}"
            )));
        }
        let at = |name: &str| self.features.iter().position(|f| f == name);
        let mut aligned = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for name in FEATURE_NAMES {
            let (transform, mean, std, coefficient) = match at(name) {
                Some(j) => (
                    self.transforms[j],
                    self.means[j],
                    self.stds[j],
                    self.coefficients[j],
                ),
                None => (Transform::for_feature(name), 0.0, 1.0, 0.0),
            };
            aligned.0.push(transform);
            aligned.1.push(mean);
            aligned.2.push(std);
            aligned.3.push(coefficient);
        }
        (self.transforms, self.means, self.stds, self.coefficients) = aligned;
        self.features = FEATURE_NAMES.iter().map(|s| s.to_string()).collect();
        Ok(())
    }

    /// Checks a model whose features [`Self::align_features`] put in this build's order.
    fn check(&self) -> Result<(), ModelError> {
        let invalid = |m: String| Err(ModelError::Invalid(m));
        if self.format != MODEL_FORMAT {
            return invalid(format!(
                "format {} (this build reads {MODEL_FORMAT})",
                self.format
            ));
        }
        for (field, len) in [
            ("transforms", self.transforms.len()),
            ("means", self.means.len()),
            ("stds", self.stds.len()),
            ("coefficients", self.coefficients.len()),
        ] {
            if len != FEATURE_COUNT {
                return invalid(format!("{field}: {len} values, expected {FEATURE_COUNT}"));
            }
        }
        let numbers = self.means.iter().chain(&self.coefficients).chain([
            &self.intercept,
            &self.calibration.slope,
            &self.calibration.offset,
        ]);
        if numbers.into_iter().any(|x| !x.is_finite()) {
            return invalid("a coefficient, mean or calibration value is not finite".into());
        }
        if !valid_isotonic(&self.isotonic) {
            return invalid("isotonic: breakpoints must be finite and not decreasing".into());
        }
        if self.stds.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return invalid("stds: every value must be positive".into());
        }
        Ok(())
    }
}
