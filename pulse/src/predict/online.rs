//! Calibration online: the confidence recalibrated from the outcomes pulse sees where
//! it runs. Every labelled moment (did a region that had not asked ask within the
//! command TTL: what the honest scorer counts) is counted in a bin of the model's raw
//! output, for the fleet and for its tenant. A bin's probability is the share that went
//! viral, with the model's own calibration worth [`PRIOR_WEIGHT`] moments as the prior
//! (for a tenant, the probability the other tenants' moments give is its prior: its
//! own moments are counted once): with little evidence the confidence is the model's,
//! with much it is what this fleet, or tenant, saw. Bins
//! are kept monotone (pool-adjacent-violators, weighted by evidence). A new model
//! starts from no evidence: its raw outputs mean something else. Moments at a spread
//! (a region reached in the last 10 s) are counted apart from the others. The counts
//! go into the checkpoint with the model they were counted for ([`SavedCalibration`]):
//! a restarted partition keeps what it learnt, for the same model.

use std::collections::HashMap;

use models::TenantId;
use serde::{Deserialize, Serialize};

use super::model::sigmoid;

/// Raw outputs are counted in bins this wide from [`RAW_LOW`] (beyond the ends: the
/// first or last bin). The regression targets 0/1, so its outputs lie about there.
const BIN_WIDTH: f64 = 0.1;
const RAW_LOW: f64 = -0.2;
const BINS: usize = 14;

/// How many moments the prior is worth in each bin.
pub(crate) const PRIOR_WEIGHT: f64 = 20.0;

/// Tenants with counts of their own, at most (beyond, the fleet's counts alone).
const MAX_TENANTS: usize = 10_000;

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Counts {
    viral: [f64; BINS],
    moments: [f64; BINS],
}

/// Counts kept apart for moments that are, and are not, at a spread (a region reached
/// in the last 10 s): the late regions of a viral that stops are not its first.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Strata([Counts; 2]);

impl Counts {
    fn note(&mut self, raw: f64, viral: bool) {
        let b = bin(raw);
        self.moments[b] += 1.0;
        self.viral[b] += f64::from(u8::from(viral));
    }

    /// These counts without `part`'s (a tenant's, out of the fleet's).
    fn without(&self, part: &Counts) -> Counts {
        let minus = |a: &[f64; BINS], b: &[f64; BINS]| -> [f64; BINS] {
            std::array::from_fn(|i| (a[i] - b[i]).max(0.0))
        };
        Counts {
            viral: minus(&self.viral, &part.viral),
            moments: minus(&self.moments, &part.moments),
        }
    }

    /// Each bin's probability given `prior` per bin, monotone in raw output.
    ///
    /// A bin's prior carries the miscalibration seen in the bins below it (the log-odds
    /// by which their evidence moved them from the prior), weighed by how much evidence
    /// that was: monotonicity lets a bin's evidence cap the bins below it, but nothing
    /// else would stop a higher bin nobody has seen yet from keeping the model's
    /// confidence where every bin just below has shown it wrong.
    fn posterior(&self, prior: &[f64; BINS]) -> [f64; BINS] {
        let mut carried = Carried::default();
        // Pool adjacent violators over the bins: (weighted sum, weight, bins pooled).
        let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(BINS);
        for ((moments, viral), model) in self.moments.iter().zip(&self.viral).zip(prior) {
            let weight = moments + PRIOR_WEIGHT;
            let p = (viral + PRIOR_WEIGHT * carried.prior(*model)) / weight;
            carried.update(*model, p, moments / weight);
            blocks.push((p * weight, weight, 1));
            while blocks.len() >= 2 {
                let (hi, lo) = (blocks[blocks.len() - 1], blocks[blocks.len() - 2]);
                if lo.0 / lo.1 <= hi.0 / hi.1 {
                    break;
                }
                blocks.pop();
                let last = blocks.len() - 1;
                blocks[last] = (lo.0 + hi.0, lo.1 + hi.1, lo.2 + hi.2);
            }
        }
        let mut out = [0.0; BINS];
        let mut b = 0;
        for (sum, weight, len) in blocks {
            for slot in &mut out[b..b + len] {
                *slot = sum / weight;
            }
            b += len;
        }
        out
    }
}

/// The miscalibration carried from lower bins to the next: a shift in log-odds and the
/// share of the next bin's prior it moves (the evidence behind it: a bin of no moments
/// passes on what it was given, fading).
#[derive(Debug, Default)]
struct Carried {
    shift: f64,
    weight: f64,
}

impl Carried {
    fn prior(&self, model: f64) -> f64 {
        let shifted = sigmoid(logit(model) + self.shift);
        (1.0 - self.weight) * model + self.weight * shifted
    }

    /// After a bin where the model said `model` and the posterior is `posterior`, its
    /// moments `evidence` of the posterior's weight: the next bin carries this bin's
    /// shift, with this bin's evidence and half of what this bin was carried.
    fn update(&mut self, model: f64, posterior: f64, evidence: f64) {
        self.shift = logit(posterior) - logit(model);
        self.weight = evidence + (1.0 - evidence) * self.weight / 2.0;
    }
}

fn logit(p: f64) -> f64 {
    let p = p.clamp(1e-6, 1.0 - 1e-6);
    (p / (1.0 - p)).ln()
}

fn bin(raw: f64) -> usize {
    if !raw.is_finite() {
        return 0;
    }
    (((raw - RAW_LOW) / BIN_WIDTH).floor().max(0.0) as usize).min(BINS - 1)
}

/// Outcome counts of the fleet and of each tenant, for the model in use.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct OnlineCalibration {
    fleet: Strata,
    tenants: HashMap<TenantId, Strata>,
}

/// A partition's counts as the checkpoint keeps them, with the model they were
/// counted for: another model's raw outputs mean something else.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavedCalibration {
    /// The model's name and training time.
    pub(crate) model: (String, u64),
    counts: OnlineCalibration,
}

impl OnlineCalibration {
    /// The counts, for the checkpoint, as counted for `model`.
    pub(crate) fn save(&self, model: (String, u64)) -> SavedCalibration {
        SavedCalibration {
            model,
            counts: self.clone(),
        }
    }

    /// Counts a checkpoint kept for `model`; `None` when they were another model's,
    /// or are not counts at all (negative or more viral moments than moments).
    pub(crate) fn restore(saved: SavedCalibration, model: &(String, u64)) -> Option<Self> {
        let sound = |c: &Counts| {
            c.moments
                .iter()
                .zip(&c.viral)
                .all(|(n, v)| n.is_finite() && v.is_finite() && *v >= 0.0 && v <= n)
        };
        let strata = std::iter::once(&saved.counts.fleet).chain(saved.counts.tenants.values());
        let all_sound = strata.flat_map(|s| s.0.iter()).all(sound);
        (saved.model == *model && all_sound && saved.counts.tenants.len() <= MAX_TENANTS)
            .then_some(saved.counts)
    }

    /// Forgets every count (a new model).
    pub(crate) fn reset(&mut self) {
        *self = OnlineCalibration::default();
    }

    /// Counts one labelled moment the model scored `raw`.
    pub(crate) fn note(&mut self, tenant: &TenantId, spread: bool, raw: f64, viral: bool) {
        let s = usize::from(spread);
        self.fleet.0[s].note(raw, viral);
        if self.tenants.len() >= MAX_TENANTS && !self.tenants.contains_key(tenant) {
            return;
        }
        self.tenants.entry(tenant.clone()).or_default().0[s].note(raw, viral);
    }

    /// Labelled moments the fleet has seen that were not at a spread.
    pub(crate) fn first_region_evidence(&self) -> f64 {
        self.fleet.0[0].moments.iter().sum()
    }

    /// The confidence at `raw` for `tenant`, given the model's own calibration
    /// (`model_confidence`, the prior).
    pub(crate) fn confidence(
        &self,
        tenant: &TenantId,
        spread: bool,
        raw: f64,
        model_confidence: impl Fn(f64) -> f64,
    ) -> f64 {
        let b = bin(raw);
        let s = usize::from(spread);
        if self.fleet.0[s].moments.iter().all(|n| *n == 0.0) {
            return model_confidence(raw);
        }
        // The model's calibration at each bin's middle (the scored raw in its own bin,
        // so that no evidence gives exactly the model's confidence).
        let prior: [f64; BINS] = std::array::from_fn(|i| {
            if i == b {
                model_confidence(raw)
            } else {
                model_confidence(RAW_LOW + (i as f64 + 0.5) * BIN_WIDTH)
            }
        });
        let fleet = &self.fleet.0[s];
        match self.tenants.get(tenant) {
            // The tenant's prior is what the other tenants' moments say: its own are
            // in the fleet's counts too, and counted twice they would move it twice
            // (most of all where one tenant is most of the evidence).
            Some(own) => {
                let others = fleet.without(&own.0[s]).posterior(&prior);
                own.0[s].posterior(&others)[b]
            }
            None => fleet.posterior(&prior)[b],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(raw: f64) -> f64 {
        raw.clamp(0.0, 1.0)
    }

    /// Tenant `a`'s `moments` moments scored `raw`, one in `viral_every` viral.
    fn noted(moments: usize, raw: f64, viral_every: usize) -> (TenantId, OnlineCalibration) {
        let tenant: TenantId = "a".parse().unwrap();
        let mut online = OnlineCalibration::default();
        for i in 0..moments {
            online.note(&tenant, false, raw, i % viral_every == 0);
        }
        (tenant, online)
    }

    /// Without evidence the confidence is the model's; with a fleet's moments at one
    /// output going viral a third of the time, it approaches a third there; a tenant
    /// whose moments there all went viral gets more than the fleet, and one without
    /// counts of its own gets the fleet's.
    #[test]
    fn the_confidence_moves_from_the_models_to_what_the_fleet_and_tenant_saw() {
        let (a, b, c): (TenantId, TenantId, TenantId) = (
            "a".parse().unwrap(),
            "b".parse().unwrap(),
            "c".parse().unwrap(),
        );
        let mut online = OnlineCalibration::default();
        assert_eq!(online.confidence(&a, false, 0.95, model), 0.95);
        for i in 0..600 {
            online.note(&a, false, 0.95, i % 3 == 0);
        }
        for _ in 0..100 {
            online.note(&b, false, 0.95, true);
        }
        let fleet = online.confidence(&c, false, 0.95, model);
        assert!((fleet - 0.43).abs() < 0.05, "{fleet}");
        let tenant_b = online.confidence(&b, false, 0.95, model);
        assert!(tenant_b > fleet + 0.3, "{tenant_b} vs {fleet}");
        let tenant_a = online.confidence(&a, false, 0.95, model);
        assert!(tenant_a < 0.4, "{tenant_a}");
        // Moments at a spread are counted apart.
        assert_eq!(online.confidence(&c, true, 0.95, model), 0.95);
        // Elsewhere the model's calibration still holds, kept monotone.
        assert!(online.confidence(&c, false, 1.15, model) >= fleet);
        online.reset();
        assert_eq!(online.confidence(&c, false, 0.95, model), 0.95);
    }

    /// A tenant's moments are counted once: where it is the whole fleet, its
    /// confidence is the fleet's. Counted again on top of the fleet's posterior, 15
    /// moments of 15 viral in one bin, above bins of crowds, gave 0.88 where the fleet
    /// said 0.93 (c-newsletter's first-region commands).
    #[test]
    fn a_tenants_moments_are_counted_once() {
        let tenant: TenantId = "a".parse().unwrap();
        let other: TenantId = "b".parse().unwrap();
        let mut online = OnlineCalibration::default();
        for i in 0..100 {
            online.note(&tenant, false, 0.55, i % 10 == 0);
        }
        for _ in 0..15 {
            online.note(&tenant, false, 0.75, true);
        }
        let own = online.confidence(&tenant, false, 0.75, model);
        let fleet = online.confidence(&other, false, 0.75, model);
        assert!((own - fleet).abs() < 1e-9, "{own} vs the fleet's {fleet}");
        // Another tenant's evidence is the prior of the first tenant's own.
        for _ in 0..200 {
            online.note(&other, false, 0.75, false);
        }
        let after = online.confidence(&tenant, false, 0.75, model);
        assert!(after < own, "{after} vs {own}");
        assert!(after > online.confidence(&other, false, 0.75, model));
    }

    /// Counts from a checkpoint come back for the model they were counted for, and
    /// never when they are not counts (more viral moments than moments, negative).
    #[test]
    fn saved_counts_come_back_for_their_model_only_and_only_when_sound() {
        let (tenant, online) = noted(30, 0.95, 3);
        let model_id = ("default-5".to_owned(), 7);
        let json = serde_json::to_value(online.save(model_id.clone())).unwrap();
        let back = |json: &serde_json::Value, id| {
            OnlineCalibration::restore(serde_json::from_value(json.clone()).unwrap(), id)
        };
        let restored = back(&json, &model_id).expect("the same model's counts");
        assert_eq!(restored.first_region_evidence(), 30.0);
        assert_eq!(
            restored.confidence(&tenant, false, 0.95, model),
            online.confidence(&tenant, false, 0.95, model)
        );
        let retrained = ("default-5".to_owned(), 8);
        assert!(back(&json, &retrained).is_none());
        for (field, value) in [("viral", 40.0), ("viral", -1.0), ("moments", -1.0)] {
            let mut bad = json.clone();
            bad["counts"]["fleet"][0][field][11] = value.into();
            assert!(back(&bad, &model_id).is_none(), "{field} {value}");
        }
    }

    /// A fleet whose moments the model scored 0.85 went viral 1 time in 50: at 0.95,
    /// one bin up, where no moment has been judged yet, the confidence carries that
    /// miscalibration instead of keeping the model's (monotonicity alone lets a bin's
    /// evidence cap only the bins below it), and falls below the threshold.
    #[test]
    fn a_bin_not_seen_yet_carries_the_miscalibration_shown_just_below_it() {
        let (tenant, online) = noted(300, 0.85, 50);
        let below = online.confidence(&tenant, false, 0.85, model);
        assert!(below < 0.3, "{below}");
        let unseen = online.confidence(&tenant, false, 0.95, model);
        assert!(unseen < 0.7, "the model's 0.95 kept: {unseen}");
        assert!(unseen >= below - 1e-9, "kept monotone: {unseen} vs {below}");
        // Far from the evidence, the carried shift fades into the model's calibration.
        let far = online.confidence(&tenant, false, 1.15, model);
        assert!(far > unseen, "{far} vs {unseen}");
    }
}
