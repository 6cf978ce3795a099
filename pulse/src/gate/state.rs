//! One tenant's gate state: its token bucket, its keys' cooldowns and the ids it let
//! through, as the gate keeps it in memory and writes it, as JSON keyed by tenant, to
//! the compacted state topic after every change.
//!
//! Invariants (one test each):
//! 1. Per tenant, at most `burst` commands at once and `rate` a second after that, in
//!    the event time of the decisions, whichever partition decided them.
//! 2. A key that had a command gets no other first command within the cooldown; a
//!    follow-up of the same burst (same burst start in its id) may pass.
//! 3. An id decided on once (let through or refused) is refused again as a duplicate
//!    (a decision made again: a replay after a crash or a move).
//! 4. The state read back from its record refuses what the state it was written from
//!    refuses: a partition move or a crash neither refills the bucket nor forgets.
//! 5. What is remembered is bounded: cooldowns and ids older than they matter go.
//! 6. One bucket per [`CommandClass`]: operators' warm-ups spend only the warm bucket
//!    and predictions only theirs, so neither can starve the other; cooldowns and
//!    dedupe are shared (a key warmed either way is not warmed again at once).

use std::collections::BTreeMap;

use models::{CommandClass, PrewarmCommand};
use serde::{Deserialize, Serialize};

/// The fleet-wide rules the gate applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GateRules {
    /// Each tenant's committed rate of commands per second.
    pub rate_per_s: f64,
    /// Each tenant's burst allowance, in commands.
    pub burst: f64,
    /// Each tenant's rate for operators' warm-ups ([`CommandClass::Warm`]), a bucket
    /// of its own.
    pub warm_rate_per_s: f64,
    /// Each tenant's burst allowance for warm-ups, in commands.
    pub warm_burst: f64,
    /// After a command, the key gets no other first command for this long.
    pub cooldown_ms: u64,
    /// How long an id is remembered: a repeat older than this is stale anyway.
    pub remember_ms: u64,
}

/// What the gate did with one decision (the metric label `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Sent to the prewarm topic.
    Admitted,
    /// The key had a command within the cooldown.
    Cooldown,
    /// The tenant's fleet budget is spent.
    OverBudget,
    /// This id was decided on before (a decision made again after a crash or a move).
    Duplicate,
}

impl Admission {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Admission::Admitted => "admitted",
            Admission::Cooldown => "cooldown",
            Admission::OverBudget => "over_budget",
            Admission::Duplicate => "duplicate",
        }
    }
}

impl GateRules {
    /// A class's committed rate and burst.
    fn budget(&self, class: CommandClass) -> (f64, f64) {
        match class {
            CommandClass::Prediction => (self.rate_per_s, self.burst),
            CommandClass::Warm => (self.warm_rate_per_s, self.warm_burst),
        }
    }
}

/// One class's token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Bucket {
    /// Tokens left (fractions carry over: a rate below one a second still earns).
    tokens: f64,
    /// Event time the bucket was last refilled to.
    updated_ms: u64,
}

impl Bucket {
    /// Refills for the time since the last refill, then takes one token if there is one.
    fn take(&mut self, (rate_per_s, burst): (f64, f64), now_ms: u64) -> bool {
        let elapsed_s = now_ms.saturating_sub(self.updated_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed_s * rate_per_s).min(burst);
        self.updated_ms = self.updated_ms.max(now_ms);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// One tenant's state. Serialised as the state topic's record for the tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TenantGate {
    /// The predictions' bucket (its fields at the top of the record, as before classes).
    #[serde(flatten)]
    prediction: Bucket,
    /// The warm-ups' bucket, made full on the tenant's first warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warm: Option<Bucket>,
    /// Per key: the last first command's time and the burst start it was for.
    cooldowns: BTreeMap<String, (u64, u64)>,
    /// Ids decided on (let through or refused), with when.
    seen: BTreeMap<String, u64>,
}

/// The burst start a command id names (`pw-{burst_start_ms}-{hash}`, see
/// `predict::decide::command_id`): a first command and its follow-ups share it.
pub(crate) fn burst_of(id: &str) -> Option<u64> {
    id.strip_prefix("pw-")?.split('-').next()?.parse().ok()
}

impl TenantGate {
    /// A tenant never seen: a full bucket.
    pub(crate) fn fresh(rules: &GateRules, now_ms: u64) -> Self {
        TenantGate {
            prediction: Bucket {
                tokens: rules.burst,
                updated_ms: now_ms,
            },
            warm: None,
            cooldowns: BTreeMap::new(),
            seen: BTreeMap::new(),
        }
    }

    /// Applies the rules to one decision, at its issue time (event time).
    pub(crate) fn admit(&mut self, rules: &GateRules, command: &PrewarmCommand) -> Admission {
        let now_ms = command.issued_at_ms;
        self.forget(rules, now_ms);
        if self.seen.contains_key(&command.id) {
            return Admission::Duplicate;
        }
        self.seen.insert(command.id.clone(), now_ms);
        let burst = burst_of(&command.id);
        let key = command.key.as_str();
        let follow_up = match self.cooldowns.get(key) {
            Some(&(last, last_burst)) if now_ms < last + rules.cooldown_ms => {
                if burst != Some(last_burst) {
                    return Admission::Cooldown;
                }
                true
            }
            _ => false,
        };
        let budget = rules.budget(command.class);
        let bucket = match command.class {
            CommandClass::Prediction => &mut self.prediction,
            CommandClass::Warm => self.warm.get_or_insert(Bucket {
                tokens: budget.1,
                updated_ms: now_ms,
            }),
        };
        if !bucket.take(budget, now_ms) {
            return Admission::OverBudget;
        }
        if !follow_up {
            self.cooldowns
                .insert(key.to_owned(), (now_ms, burst.unwrap_or(now_ms)));
        }
        Admission::Admitted
    }

    /// Drops cooldowns that have run out and ids older than `remember_ms`.
    fn forget(&mut self, rules: &GateRules, now_ms: u64) {
        self.cooldowns
            .retain(|_, (last, _)| now_ms < *last + rules.cooldown_ms);
        self.seen
            .retain(|_, at| now_ms < *at + rules.remember_ms.max(rules.cooldown_ms));
    }

    /// The state topic's record for the tenant.
    pub(crate) fn to_record(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a gate state serialises")
    }

    /// A record read back (`None`: not a gate state; the gate counts and skips it).
    pub(crate) fn from_record(bytes: &[u8]) -> Option<Self> {
        let state: TenantGate = serde_json::from_slice(bytes).ok()?;
        let finite = |b: &Bucket| b.tokens.is_finite();
        (finite(&state.prediction) && state.warm.as_ref().is_none_or(finite)).then_some(state)
    }
}

#[cfg(test)]
mod tests {
    use models::{Reason, RegionTargets};

    use super::*;

    const RULES: GateRules = GateRules {
        rate_per_s: 1.0,
        burst: 3.0,
        warm_rate_per_s: 2.0,
        warm_burst: 2.0,
        cooldown_ms: 60_000,
        remember_ms: 120_000,
    };

    fn command(id: &str, key: &str, at_ms: u64) -> PrewarmCommand {
        PrewarmCommand::new(
            id.to_owned(),
            "acme".parse().unwrap(),
            key.parse().unwrap(),
            0.9,
            at_ms,
            at_ms + 60_000,
            RegionTargets::Only(vec!["eu".parse().unwrap()]),
            Reason {
                model: "m".into(),
                intercept: 0.0,
                features: vec![],
            },
        )
    }

    fn first(key_n: u32, at_ms: u64) -> PrewarmCommand {
        command(
            &format!("pw-{at_ms}-{key_n:016x}"),
            &format!("/k{key_n}"),
            at_ms,
        )
    }

    #[test]
    fn one_bucket_per_tenant_whoever_decided() {
        let mut gate = TenantGate::fresh(&RULES, 1_000);
        let outcomes: Vec<_> = (0..5)
            .map(|i| gate.admit(&RULES, &first(i, 1_000)))
            .collect();
        assert_eq!(
            outcomes,
            [
                Admission::Admitted,
                Admission::Admitted,
                Admission::Admitted,
                Admission::OverBudget,
                Admission::OverBudget
            ]
        );
        // Half a second earns half a token: not yet one.
        assert_eq!(gate.admit(&RULES, &first(5, 1_500)), Admission::OverBudget);
        assert_eq!(gate.admit(&RULES, &first(6, 2_000)), Admission::Admitted);
        // A decision stamped a little earlier (another partition's watermark) earns
        // nothing and takes what there is.
        assert_eq!(gate.admit(&RULES, &first(7, 1_900)), Admission::OverBudget);
    }

    #[test]
    fn a_key_cools_down_but_its_follow_ups_pass() {
        let mut gate = TenantGate::fresh(&RULES, 0);
        assert_eq!(gate.admit(&RULES, &first(1, 0)), Admission::Admitted);
        // The same key decided on another burst start (a replay ticked differently).
        let again = command("pw-40-aaaaaaaaaaaaaaaa", "/k1", 40);
        assert_eq!(gate.admit(&RULES, &again), Admission::Cooldown);
        let follow_up = command("pw-0-bbbbbbbbbbbbbbbb", "/k1", 30_000);
        assert_eq!(gate.admit(&RULES, &follow_up), Admission::Admitted);
        assert_eq!(gate.admit(&RULES, &first(1, 60_000)), Admission::Admitted);
    }

    #[test]
    fn an_id_decided_on_is_refused_again() {
        let mut gate = TenantGate::fresh(&RULES, 0);
        let c = first(1, 0);
        assert_eq!(gate.admit(&RULES, &c), Admission::Admitted);
        assert_eq!(gate.admit(&RULES, &c), Admission::Duplicate);
        let mut later = c.clone();
        later.issued_at_ms = 70_000; // past the cooldown, still remembered
        assert_eq!(gate.admit(&RULES, &later), Admission::Duplicate);
        // Refused over budget, then made again once the bucket has refilled: the same
        // decision, still refused.
        for i in 2..4 {
            gate.admit(&RULES, &first(i, 0));
        }
        let refused = first(9, 0);
        assert_eq!(gate.admit(&RULES, &refused), Admission::OverBudget);
        let mut again = refused.clone();
        again.issued_at_ms = 5_000;
        assert_eq!(gate.admit(&RULES, &again), Admission::Duplicate);
    }

    #[test]
    fn the_state_read_back_refuses_what_it_refused() {
        let mut gate = TenantGate::fresh(&RULES, 0);
        for i in 0..3 {
            assert_eq!(gate.admit(&RULES, &first(i, 0)), Admission::Admitted);
        }
        let mut restored = TenantGate::from_record(&gate.to_record()).unwrap();
        assert_eq!(restored, gate);
        assert_eq!(restored.admit(&RULES, &first(9, 10)), Admission::OverBudget);
        assert_eq!(restored.admit(&RULES, &first(0, 0)), Admission::Duplicate);
        let replayed = command("pw-5-cccccccccccccccc", "/k1", 1_000);
        assert_eq!(restored.admit(&RULES, &replayed), Admission::Cooldown);
        assert_eq!(TenantGate::from_record(b"{\"tokens\":1}"), None);
        assert_eq!(TenantGate::from_record(b"not json"), None);
    }

    #[test]
    fn every_admission_is_a_metric_label() {
        for admission in [
            Admission::Admitted,
            Admission::Cooldown,
            Admission::OverBudget,
            Admission::Duplicate,
        ] {
            assert!(crate::metrics::GATE_OUTCOMES.contains(&admission.as_str()));
        }
    }

    #[test]
    fn each_class_spends_its_own_bucket() {
        let warm = |key_n: u32, at_ms: u64| PrewarmCommand {
            class: CommandClass::Warm,
            ..command(&format!("warm-j1-{key_n}"), &format!("/w{key_n}"), at_ms)
        };
        let mut gate = TenantGate::fresh(&RULES, 0);
        // The warm-up spends its whole bucket...
        assert_eq!(gate.admit(&RULES, &warm(0, 0)), Admission::Admitted);
        assert_eq!(gate.admit(&RULES, &warm(1, 0)), Admission::Admitted);
        assert_eq!(gate.admit(&RULES, &warm(2, 0)), Admission::OverBudget);
        // ...and the predictions still have all of theirs, which they spend...
        for i in 0..3 {
            assert_eq!(gate.admit(&RULES, &first(i, 0)), Admission::Admitted);
        }
        assert_eq!(gate.admit(&RULES, &first(3, 0)), Admission::OverBudget);
        // ...without taking the warm-up's refill: half a second earns it one token.
        assert_eq!(gate.admit(&RULES, &warm(3, 500)), Admission::Admitted);
        assert_eq!(gate.admit(&RULES, &first(4, 500)), Admission::OverBudget);
        // A key warmed one way is cooling down for the other.
        let predicted_warm_key = command("pw-20000-00000000000000ff", "/w0", 20_000);
        assert_eq!(gate.admit(&RULES, &predicted_warm_key), Admission::Cooldown);
        // Both buckets survive the state topic; a record of before classes reads.
        let restored = TenantGate::from_record(&gate.to_record()).unwrap();
        assert_eq!(restored, gate);
        let old = br#"{"tokens":2.5,"updated_ms":7,"cooldowns":{},"seen":{}}"#;
        let old = TenantGate::from_record(old).unwrap();
        assert_eq!((old.prediction.tokens, old.warm), (2.5, None));
    }

    #[test]
    fn old_cooldowns_and_ids_are_forgotten() {
        let mut gate = TenantGate::fresh(&RULES, 0);
        for i in 0..3 {
            gate.admit(&RULES, &first(i, 0));
        }
        gate.admit(&RULES, &first(10, 200_000));
        assert_eq!(gate.cooldowns.len(), 1);
        assert_eq!(gate.seen.len(), 1);
        assert_eq!(burst_of("pw-123-00ff"), Some(123));
        assert_eq!(burst_of("other"), None);
    }
}
