//! [`HeatConfig`]: how big and how exact the sketches are, how much memory they may
//! take, how far producers' clocks are trusted; its check ([`ConfigError`]) and the
//! sketch dimensions and error bounds it implies.

use serde::{Deserialize, Serialize};

use super::sketch::Cell;
use super::top::{REGION_TOP_SKETCH, TOP_DEPTH, TOP_WIDTH, TopKey};
use super::{COARSE_BUCKETS, FINE_BUCKETS, MAX_REGIONS};

/// How big and how exact the sketches are, how much memory they may take, and how far
/// producers' clocks are trusted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeatConfig {
    /// Additive error as a fraction of the window's events (ε), in (0, 1), of a
    /// tenant's own sketches.
    pub error: f64,
    /// Probability that an estimate stays within the error (1 − δ), in (0, 1).
    pub confidence: f64,
    /// Keys tracked per tenant per coarse bucket (the heat map's candidates).
    pub top_k: usize,
    /// Keys tracked per region per coarse bucket.
    pub region_top_k: usize,
    /// Tenants with fewer events than this in the last 60 s share one sketch; a tenant
    /// that reaches it gets its own (and goes back under half of it). 0: every tenant
    /// has its own sketches (the layout before the shared sketch).
    pub shared_sketch_below: u64,
    /// Additive error of the shared sketch, as a fraction of the *whole shared
    /// stream's* events in the window, in (0, 1).
    pub shared_error: f64,
    /// Bytes the heat map may hold (sketches, trackers, keys); a new tenant, or a
    /// promotion to own sketches, that would pass it is refused (`memory_budget`).
    pub memory_budget_bytes: u64,
    /// How far ahead of the clock an event may be stamped; further is `from_future`,
    /// and the watermark never passes the clock plus this. One edge node whose clock
    /// runs fast moves the watermark ahead of every other node's events: the default
    /// accepts no more than the predictor measures behind the watermark (1 s, its
    /// longest grace), so such a node cannot blind it.
    pub max_clock_skew_ms: u64,
}

impl Default for HeatConfig {
    fn default() -> Self {
        HeatConfig {
            error: 0.005,
            confidence: 0.99,
            top_k: 64,
            region_top_k: 16,
            shared_sketch_below: 5_000,
            shared_error: 0.0005,
            memory_budget_bytes: 1 << 30,
            max_clock_skew_ms: 1_000,
        }
    }
}

/// Why a [`HeatConfig`] was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid heat map config: {field}: {reason}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl HeatConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_owned(),
            })
        };
        if !(self.error > 0.0 && self.error < 1.0 && (2.0 / self.error).is_finite()) {
            return bad("error", "must be in (0, 1)");
        }
        if self.error < 1e-5 {
            return bad("error", "below 1e-5 the sketches get too large");
        }
        if !(self.confidence > 0.0 && self.confidence < 1.0) {
            return bad("confidence", "must be in (0, 1)");
        }
        if self.depth() > 16 {
            return bad("confidence", "more than 16 rows; use at most 0.99998");
        }
        if !(1..=10_000).contains(&self.top_k) {
            return bad("top_k", "must be in 1..=10000");
        }
        if !(1..=1_000).contains(&self.region_top_k) {
            return bad("region_top_k", "must be in 1..=1000");
        }
        if !(self.shared_error > 0.0 && self.shared_error < 1.0) {
            return bad("shared_error", "must be in (0, 1)");
        }
        if self.shared_error < 1e-5 {
            return bad(
                "shared_error",
                "below 1e-5 the shared sketch gets too large",
            );
        }
        if self.max_clock_skew_ms > 3_600_000 {
            return bad("max_clock_skew_ms", "at most one hour");
        }
        let floor = self.shared_bytes() + self.own_tenant_bytes();
        if self.memory_budget_bytes < floor as u64 {
            return bad(
                "memory_budget_bytes",
                &format!(
                    "below {floor} bytes: the shared sketch and one tenant of its own must fit"
                ),
            );
        }
        Ok(())
    }

    /// Whether a heat map made with `other` has sketches this config can read (the
    /// limits may differ).
    pub fn same_sketches(&self, other: &HeatConfig) -> bool {
        (
            self.width(),
            self.depth(),
            self.top_k,
            self.region_top_k,
            self.shared_width(),
        ) == (
            other.width(),
            other.depth(),
            other.top_k,
            other.region_top_k,
            other.shared_width(),
        )
    }

    /// Columns per sketch row, as streaming_algorithms computes them.
    pub fn width(&self) -> usize {
        ((2.0 / self.error).round() as usize)
            .max(2)
            .next_power_of_two()
    }

    /// Columns per row of the shared sketch.
    pub fn shared_width(&self) -> usize {
        ((2.0 / self.shared_error).round() as usize)
            .max(2)
            .next_power_of_two()
    }

    /// Rows per sketch, as streaming_algorithms computes them.
    pub fn depth(&self) -> usize {
        (((1.0 - self.confidence).ln() / 0.5_f64.ln()).floor() as usize).max(1)
    }

    /// The effective additive error of a tenant's own sketches, as a fraction of the
    /// tenant's events in the window: `2 / width` (at most `error`).
    pub fn error_bound(&self) -> f64 {
        2.0 / self.width() as f64
    }

    /// The effective additive error of the shared sketch, as a fraction of the events
    /// of *all* tenants in it in the window: `2 / shared_width`.
    pub fn shared_error_bound(&self) -> f64 {
        2.0 / self.shared_width() as f64
    }

    /// Probability that one estimate exceeds the bound: `2^-depth` (streaming_algorithms
    /// rounds the depth down, so this is up to twice `1 - confidence`).
    pub fn failure_probability(&self) -> f64 {
        0.5_f64.powi(self.depth() as i32)
    }

    /// Bytes of the shared sketch, every bucket in use.
    pub fn shared_bytes(&self) -> usize {
        (FINE_BUCKETS + COARSE_BUCKETS)
            * self.shared_width()
            * self.depth()
            * std::mem::size_of::<Cell>()
    }

    /// Bytes of one tenant's own sketches, every bucket in use (trackers not counted).
    pub fn own_tenant_bytes(&self) -> usize {
        (FINE_BUCKETS + COARSE_BUCKETS) * self.width() * self.depth() * std::mem::size_of::<Cell>()
    }

    /// Worst-case bytes of one tenant with its own sketches: every bucket's sketch,
    /// every Top-K (for [`MAX_REGIONS`] regions) and its keys at [`models::MAX_KEY_LEN`].
    pub fn max_bytes_per_tenant(&self) -> usize {
        let top = |k: usize, width: usize, depth: usize| {
            // map entry + list node + the key, plus the Top's own sketch.
            k * (64 + 2 * std::mem::size_of::<TopKey>() + models::MAX_KEY_LEN / 8)
                + width * depth * std::mem::size_of::<usize>()
        };
        let (tw, td) = self.top_sketch();
        let (rw, rd) = REGION_TOP_SKETCH;
        self.own_tenant_bytes()
            + COARSE_BUCKETS
                * (top(self.top_k, tw, td) + MAX_REGIONS * top(self.region_top_k, rw, rd))
    }

    /// Top-K trackers keep their own small sketch for keys outside the top.
    pub(super) fn top_sketch(&self) -> (usize, usize) {
        // (tolerance, probability) -> (width, depth) as in CountMinSketch::new.
        (TOP_WIDTH, TOP_DEPTH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_the_field() {
        let mut c = HeatConfig::default();
        assert!(c.validate().is_ok());
        c.error = 0.0;
        assert_eq!(c.validate().unwrap_err().field, "error");
        c = HeatConfig {
            confidence: 1.0,
            ..HeatConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "confidence");
        c = HeatConfig {
            top_k: 0,
            ..HeatConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("top_k"));
    }

    #[test]
    fn dimensions_follow_error_and_confidence() {
        let c = HeatConfig::default();
        assert_eq!(c.width(), 512);
        assert_eq!(c.depth(), 6);
        assert!(c.error_bound() <= c.error);
        // streaming_algorithms rounds the depth down: the failure probability is
        // 2^-depth, within a factor 2 of 1 - confidence.
        assert!(c.failure_probability() <= 2.0 * (1.0 - c.confidence));
    }
}
