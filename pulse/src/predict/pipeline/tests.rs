use std::sync::Arc;

use models::{CacheKey, RegionId, RegionTargets, TenantId};

use super::super::decide::tests::score as scored;
use super::super::decide::{Decider, Proposal};
use super::super::features::Extracted;
use super::super::trust::{Step, Trust};
use super::super::{Features, Predictor, PredictorConfig, default_model};
use super::policy::DecisionPolicy;
use super::{LastDecision, Skip, Stage, Waits, candidate};

fn ids() -> (TenantId, CacheKey) {
    ("acme".parse().unwrap(), "/a".parse().unwrap())
}

fn regions(names: &[&str]) -> Vec<RegionId> {
    names.iter().map(|r| r.parse().unwrap()).collect()
}

/// A key at `reached` regions with `unseen` left to warm.
fn extracted(reached: usize, unseen: usize) -> Extracted {
    Extracted {
        features: Features::default(),
        unseen: (0..unseen)
            .map(|i| format!("r{i}").parse().unwrap())
            .collect(),
        unseen_counts: (0..unseen).map(|i| (reached + i, 0)).collect(),
        reached: (0..reached).collect(),
    }
}

fn proposal(tenant: &TenantId, key: &CacheKey) -> Proposal {
    Proposal {
        tenant: tenant.clone(),
        key: key.clone(),
        score: scored(0.9),
        calibrated: 0.9,
        named: regions(&["eu"]),
        saved_misses: 1.0,
        burst_start_ms: 0,
        reached: vec![0],
    }
}

/// Stage 1: a key with no region left is not decided on; any wait makes a first region
/// no evidence (a second one is), and failing second-region commands make a second
/// region passes; without a wait the first region passes.
#[test]
fn the_candidate_stage_waits_for_the_regions_its_waits_ask() {
    let none = Waits::default();
    assert_eq!(
        candidate(&extracted(1, 0), 1, &none),
        Err(Skip::NothingToWarm)
    );
    assert_eq!(candidate(&extracted(1, 3), 1, &none), Ok(()));
    assert_eq!(
        candidate(&extracted(1, 3), 2, &none),
        Err(Skip::AwaitingRegions),
        "min_regions_reached"
    );
    let each: [fn(&mut Waits); 5] = [
        |w| w.cold = true,
        |w| w.one_node = true,
        |w| w.scheduled = true,
        |w| w.last_wasted = true,
        |w| w.tenant_quiet = true,
    ];
    for set in each {
        let mut waits = Waits::default();
        set(&mut waits);
        assert_eq!(
            candidate(&extracted(1, 3), 1, &waits),
            Err(Skip::AwaitingRegions),
            "{waits:?}"
        );
        assert_eq!(candidate(&extracted(2, 3), 1, &waits), Ok(()), "{waits:?}");
    }
}

/// Stage 2 weighs the calibrated confidence by the trust its step's commands earned: a
/// fresh pulse trusts its calibration; where the tenant's first-region commands were
/// wasted, a key at its first region scores lower, one at its second region does not.
#[test]
fn the_score_stage_weighs_the_confidence_by_the_trust_of_its_step() {
    let model = default_model();
    let (t, k): (TenantId, CacheKey) = ("acme".parse().unwrap(), "/a".parse().unwrap());
    let mut p = Predictor::new(
        Some(Arc::new(model.clone())),
        PredictorConfig {
            policy: DecisionPolicy {
                threshold: 0.0,
                ..DecisionPolicy::default()
            },
            ..PredictorConfig::default()
        },
    );
    let x = Features::default();
    let (fresh, calibrated) = p.score(0, &t, &k, &x, Step::First, &model).unwrap();
    assert!(calibrated > 0.0);
    assert_eq!(fresh.confidence, calibrated);
    let mut trust = Trust::default();
    for at in 0..20 {
        trust.note(&t, Step::First, 1.0, false, at);
    }
    p.decider.restore_trust(trust);
    let (first, before_trust) = p.score(20, &t, &k, &x, Step::First, &model).unwrap();
    assert_eq!(before_trust, calibrated);
    assert!(first.confidence < 0.6 * calibrated, "{}", first.confidence);
    let (second, _) = p.score(20, &t, &k, &x, Step::Second, &model).unwrap();
    assert_eq!(second.confidence, calibrated);
}

/// Stage 2: the model's confidence below the threshold is refused; at it, a key
/// passes once it was there for `confirmations` scorings in a row. Every scoring counts
/// as a key scored.
#[test]
fn the_score_stage_passes_a_confident_key_once_confirmed() {
    let (t, k) = ids();
    let model = default_model();
    let predictor = |threshold: f64, confirmations: u32| {
        Predictor::new(
            Some(Arc::new(model.clone())),
            PredictorConfig {
                policy: DecisionPolicy {
                    threshold,
                    confirmations,
                    ..DecisionPolicy::default()
                },
                ..PredictorConfig::default()
            },
        )
    };
    let x = Features::default();
    let confidence = predictor(0.0, 1)
        .score(0, &t, &k, &x, Step::First, &model)
        .unwrap()
        .0
        .confidence;
    let mut above = predictor(confidence + 1e-9, 1);
    assert_eq!(
        above.score(0, &t, &k, &x, Step::First, &model).map(|_| ()),
        Err(Skip::BelowThreshold)
    );
    let mut twice = predictor(confidence, 2);
    assert_eq!(
        twice.score(0, &t, &k, &x, Step::First, &model).map(|_| ()),
        Err(Skip::Unconfirmed)
    );
    let passed = twice.score(10, &t, &k, &x, Step::First, &model).unwrap();
    assert_eq!(passed.0.confidence, confidence);
    assert_eq!(twice.scored(), 2);
}

/// Stage 3's rules: a region is named when confidence × its chance pays for its fill;
/// with none left it is `nothing_to_warm`, with none paying `not_worth_it`, and so is
/// a key whose confidence alone does not pay; a key in its cooldown has none.
#[test]
fn the_regions_stage_names_the_regions_worth_a_fill() {
    let (t, k) = ids();
    let mut d = Decider::new(DecisionPolicy::default());
    let three = || regions(&["eu", "us", "ap"]);
    // 0.9 × 0.6 = 0.54 saves 0.54 ≥ 0.46 wasted; 0.9 × 0.5 = 0.45 does not.
    assert_eq!(
        d.name_regions(&t, 0.9, 1.0, three(), &[0.6, 0.5, 1.0]),
        Ok(regions(&["eu", "ap"]))
    );
    assert_eq!(
        d.name_regions(&t, 0.9, 1.0, vec![], &[]),
        Err(Skip::NothingToWarm)
    );
    assert_eq!(
        d.name_regions(&t, 0.9, 1.0, three(), &[0.2, 0.2, 0.2]),
        Err(Skip::NotWorthIt)
    );
    assert_eq!(
        d.name_regions(&t, 0.3, 1.0, vec![], &[]),
        Err(Skip::NotWorthIt),
        "the cost rule at the confidence alone comes first"
    );
    assert!(!d.cooling_down(&(t.clone(), k.clone()), 0));
    d.gate(0, proposal(&t, &k)).unwrap();
    assert!(d.cooling_down(&(t.clone(), k.clone()), 1_000));
    let cooldown = DecisionPolicy::default().cooldown_ms;
    assert!(!d.cooling_down(&(t, k), cooldown));
}

/// Stage 4: a proposal passes while its tenant has tokens, and is then sent and listed
/// with its key's last decision; over the budget it is refused, and that refusal is the
/// key's last decision; a key leaving the history is no longer listed.
#[test]
fn the_gate_stage_sends_within_the_tenants_budget() {
    let (t, k) = ids();
    let mut d = Decider::new(DecisionPolicy {
        tenant_burst: 1.0,
        tenant_rate_per_s: 1.0,
        history: 1,
        ..DecisionPolicy::default()
    });
    let command = d.gate(0, proposal(&t, &k)).unwrap();
    assert_eq!(command.regions, RegionTargets::Only(regions(&["eu"])));
    let sent = LastDecision {
        at_ms: 0,
        stage: Stage::Gate,
        skip: None,
    };
    assert_eq!(d.last_decision(&t, &k), Some(sent));
    assert_eq!(d.gate(10, proposal(&t, &k)), Err(Skip::OverBudget));
    d.refuse(10, &t, &k, Stage::Gate, Skip::OverBudget);
    let refused = LastDecision {
        at_ms: 10,
        stage: Stage::Gate,
        skip: Some(Skip::OverBudget),
    };
    assert_eq!(d.last_decision(&t, &k), Some(refused));
    assert_eq!(d.counts().skipped[Skip::OverBudget as usize], 1);
    // A key without a listed command keeps no last decision (memory bounded by the
    // history); the first key's leaves with its command.
    let other: CacheKey = "/b".parse().unwrap();
    d.refuse(20, &t, &other, Stage::Score, Skip::BelowThreshold);
    assert_eq!(d.last_decision(&t, &other), None);
    d.gate(1_000, proposal(&t, &other)).unwrap();
    assert_eq!(d.last_decision(&t, &k), None);
    assert!(d.last_decision(&t, &other).is_some());
}
