//! Learned trust: of the commands like this one, how many did the fleet's own traffic
//! make useful?
//!
//! The calibrated confidence says how often moments scored alike went viral; a command
//! is judged on more than that (its named regions must ask while it is valid), and a
//! world unlike the model's training makes the two part. Pulse sees the verdict of
//! every command it sent, so it learns, for each step of a spread a command is sent at
//! ([`Step`]: at a first region, at a second, later, or as a follow-up), how the
//! useful share of its commands compares with the confidence they were sent at: the
//! *trust* of that step, by which the score stage multiplies a key's calibrated
//! confidence. Where first-region commands are useful less often than they claim, a
//! key waits for a second region because its confidence there is below the threshold,
//! not because a rule says so; where follow-ups fill regions nobody asks, follow-ups
//! stop; where commands do as they claim, nothing changes.
//!
//! Per tenant, with the fleet's other tenants as its prior, and with a prior of 1 (the
//! calibration is right) worth [`TRUST_PRIOR_COMMANDS`] commands that a fresh pulse
//! starts from. Outcomes fade with a half-life of [`TRUST_HALF_LIFE_MS`], so a world
//! that changed is forgotten and a step no longer sent at is tried again. Only
//! outcomes of commands sent teach it, never proposals.

use std::collections::HashMap;

use models::TenantId;
use serde::{Deserialize, Serialize};

use super::pipeline::policy::{TRUST_HALF_LIFE_MS, TRUST_PRIOR_COMMANDS};

/// Tenants with tallies of their own, at most (beyond, the fleet's alone).
const MAX_TENANTS: usize = 10_000;

/// The step of its spread a command was sent at: commands at each are trusted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A follow-up of an earlier command for the same burst.
    FollowUp,
    /// The key had reached one region.
    First,
    /// Two regions.
    Second,
    /// Three or more.
    Later,
}

impl Step {
    /// The step of a first command sent at `reached` regions (0: a follow-up).
    pub(crate) fn at(reached: usize) -> Step {
        match reached {
            0 => Step::FollowUp,
            1 => Step::First,
            2 => Step::Second,
            _ => Step::Later,
        }
    }
}

const STEPS: usize = 4;

/// Commands' outcomes, faded to `at_ms`: how many were useful, and how many their
/// confidence promised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Tally {
    useful: f64,
    promised: f64,
    at_ms: u64,
}

impl Tally {
    fn faded(&self, now_ms: u64) -> Tally {
        let age_ms = now_ms.saturating_sub(self.at_ms) as f64;
        let keep = 0.5_f64.powf(age_ms / TRUST_HALF_LIFE_MS as f64);
        Tally {
            useful: self.useful * keep,
            promised: self.promised * keep,
            at_ms: self.at_ms.max(now_ms),
        }
    }

    fn note(&mut self, now_ms: u64, confidence: f64, useful: bool) {
        *self = self.faded(now_ms);
        self.useful += f64::from(u8::from(useful));
        self.promised += confidence;
    }
}

impl Tally {
    /// Whether it can be counts: finite and not negative.
    fn is_counts(&self) -> bool {
        [self.useful, self.promised]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
    }
}

/// The trust of each step, per tenant and for the fleet.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Trust {
    fleet: [Tally; STEPS],
    tenants: HashMap<TenantId, [Tally; STEPS]>,
}

impl Trust {
    /// What a checkpoint kept, if every tally is counts (else `None`: the prior).
    pub(crate) fn restore(saved: Trust) -> Option<Trust> {
        let ok = saved
            .fleet
            .iter()
            .chain(saved.tenants.values().flatten())
            .all(Tally::is_counts)
            && saved.tenants.len() <= MAX_TENANTS;
        ok.then_some(saved)
    }

    /// Notes a sent command's verdict: sent at `step`, at calibrated `confidence`.
    pub(crate) fn note(
        &mut self,
        tenant: &TenantId,
        step: Step,
        confidence: f64,
        useful: bool,
        now_ms: u64,
    ) {
        let confidence = confidence.clamp(0.0, 1.0);
        self.fleet[step as usize].note(now_ms, confidence, useful);
        if self.tenants.len() < MAX_TENANTS || self.tenants.contains_key(tenant) {
            self.tenants.entry(tenant.clone()).or_default()[step as usize]
                .note(now_ms, confidence, useful);
        }
    }

    /// What a calibrated confidence is worth for a command of `tenant`'s at `step`: its
    /// tenant's useful commands over what their confidence promised, shrunk toward the
    /// other tenants' ratio, itself shrunk toward 1; each prior worth
    /// [`TRUST_PRIOR_COMMANDS`] commands.
    pub(crate) fn factor(&self, tenant: &TenantId, step: Step, now_ms: u64) -> f64 {
        let fleet = self.fleet[step as usize].faded(now_ms);
        let own = self
            .tenants
            .get(tenant)
            .map(|t| t[step as usize].faded(now_ms))
            .unwrap_or_default();
        let others = (
            (fleet.useful - own.useful).max(0.0),
            (fleet.promised - own.promised).max(0.0),
        );
        let shrunk = |useful: f64, promised: f64, prior: f64| {
            (useful + TRUST_PRIOR_COMMANDS * prior) / (promised + TRUST_PRIOR_COMMANDS)
        };
        shrunk(own.useful, own.promised, shrunk(others.0, others.1, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[test]
    fn a_fresh_pulse_trusts_the_calibration() {
        let trust = Trust::default();
        for step in [Step::FollowUp, Step::First, Step::Second, Step::Later] {
            assert_eq!(trust.factor(&tenant("t"), step, 1_000), 1.0);
        }
    }

    #[test]
    fn it_learns_from_the_outcomes_of_commands_sent_at_each_step() {
        let mut trust = Trust::default();
        let t = tenant("t");
        // First-region commands at 0.95 that warm nothing; follow-ups that do.
        for i in 0..20 {
            trust.note(&t, Step::First, 0.95, false, i * 1_000);
            trust.note(&t, Step::FollowUp, 0.9, true, i * 1_000);
        }
        let first = trust.factor(&t, Step::First, 20_000);
        assert!(first < 0.6, "first-region trust {first}");
        assert!(0.95 * first < 0.85, "a first region is no longer enough");
        assert!(trust.factor(&t, Step::FollowUp, 20_000) > 1.0);
        // Untouched steps keep the prior; as good as promised stays about 1.
        assert_eq!(trust.factor(&t, Step::Second, 20_000), 1.0);
        let mut honest = Trust::default();
        for i in 0..100 {
            honest.note(&t, Step::First, 0.8, i % 5 != 0, i * 1_000);
        }
        let factor = honest.factor(&t, Step::First, 100_000);
        assert!((factor - 1.0).abs() < 0.05, "{factor}");
    }

    #[test]
    fn a_tenant_with_little_history_follows_the_fleet() {
        let mut trust = Trust::default();
        for i in 0..30 {
            trust.note(&tenant("a"), Step::First, 1.0, false, i * 1_000);
        }
        // Another tenant, never commanded, borrows the fleet's evidence.
        let fresh = trust.factor(&tenant("b"), Step::First, 30_000);
        assert!(fresh < 0.6, "{fresh}");
        // With its own useful commands it parts from the fleet.
        for i in 30..60 {
            trust.note(&tenant("b"), Step::First, 1.0, true, i * 1_000);
        }
        assert!(trust.factor(&tenant("b"), Step::First, 60_000) > 0.7);
        assert!(trust.factor(&tenant("a"), Step::First, 60_000) < 0.6);
    }

    #[test]
    fn it_forgets_a_world_that_changed() {
        let mut trust = Trust::default();
        let t = tenant("t");
        for i in 0..30 {
            trust.note(&t, Step::First, 1.0, false, i * 1_000);
        }
        assert!(trust.factor(&t, Step::First, 30_000) < 0.6);
        // Four half-lives later the old outcomes weigh a sixteenth: near the prior.
        let later = 30_000 + 4 * TRUST_HALF_LIFE_MS;
        assert!(trust.factor(&t, Step::First, later) > 0.9);
        // And new outcomes outweigh them.
        for i in 0..30 {
            trust.note(&t, Step::First, 1.0, true, later + i * 1_000);
        }
        assert!(trust.factor(&t, Step::First, later + 30_000) > 0.95);
    }
}
