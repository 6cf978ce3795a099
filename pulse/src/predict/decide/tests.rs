use models::Reason;

use super::*;

pub(crate) fn score(confidence: f64) -> Score {
    Score {
        confidence,
        raw: confidence,
        reason: Reason {
            model: "m".into(),
            intercept: 0.0,
            features: vec![],
        },
    }
}

/// One scored key, as a test weighs it.
#[derive(Debug)]
pub(crate) struct Candidate<'a> {
    pub tenant: &'a TenantId,
    pub key: &'a CacheKey,
    pub score: &'a Score,
    pub unseen: Vec<RegionId>,
    pub chances: Vec<f64>,
    pub saved_misses: f64,
    pub burst_start_ms: u64,
    pub reached: Vec<usize>,
}

impl Decider {
    /// The decider's part of the pipeline, in its order (`predict::pipeline`):
    /// the score stage's confirmation, the regions stage's cooldown and cost rule,
    /// the gate; a refusal counted.
    pub(crate) fn consider(
        &mut self,
        now_ms: u64,
        c: Candidate<'_>,
    ) -> Result<PrewarmCommand, Skip> {
        let (tenant, key) = (c.tenant, c.key);
        let decided = (|| {
            self.confirm(now_ms, tenant, key, c.score.confidence)
                .map_err(|s| (Stage::Score, s))?;
            if self.cooling_down(&(tenant.clone(), key.clone()), now_ms) {
                return Err((Stage::Regions, Skip::Cooldown));
            }
            let named = self
                .name_regions(
                    tenant,
                    c.score.confidence,
                    c.saved_misses,
                    c.unseen,
                    &c.chances,
                )
                .map_err(|s| (Stage::Regions, s))?;
            let proposal = Proposal {
                tenant: tenant.clone(),
                key: key.clone(),
                score: c.score.clone(),
                calibrated: c.score.confidence,
                named,
                saved_misses: c.saved_misses,
                burst_start_ms: c.burst_start_ms,
                reached: c.reached,
            };
            self.gate(now_ms, proposal).map_err(|s| (Stage::Gate, s))
        })();
        decided.map_err(|(stage, skip)| {
            self.refuse(now_ms, tenant, key, stage, skip);
            skip
        })
    }
}

pub(crate) fn cand<'a>(
    tenant: &'a TenantId,
    key: &'a CacheKey,
    score: &'a Score,
    unseen: Vec<RegionId>,
    saved_misses: f64,
) -> Candidate<'a> {
    Candidate {
        tenant,
        key,
        score,
        chances: vec![1.0; unseen.len()],
        unseen,
        saved_misses,
        burst_start_ms: 0,
        reached: vec![],
    }
}

fn ids(tenant: &str, key: &str) -> (TenantId, CacheKey) {
    (tenant.parse().unwrap(), key.parse().unwrap())
}

fn regions(names: &[&str]) -> Vec<RegionId> {
    names.iter().map(|r| r.parse().unwrap()).collect()
}

fn unconfirmed() -> DecisionPolicy {
    DecisionPolicy {
        confirmations: 1,
        ..DecisionPolicy::default()
    }
}

/// The cost rule: a command goes out only when confidence × saved misses is at
/// least (1 − confidence) × the tenant's wasted-fill cost.
#[test]
fn a_command_must_save_more_than_it_may_waste() {
    let (t, k) = ids("acme", "/a");
    let (cheap, _) = ids("cheap", "/a");
    let mut d = Decider::new(DecisionPolicy {
        wasted_fill_cost: 20.0,
        tenant_fill_costs: HashMap::from([(cheap.clone(), 1.0)]),
        ..DecisionPolicy::default()
    });
    let eu = || regions(&["eu"]);
    // 0.9 × 2 = 1.8 < 0.1 × 20 = 2: not worth a possibly wasted fill.
    assert_eq!(
        d.consider(0, cand(&t, &k, &score(0.9), eu(), 2.0)),
        Err(Skip::NotWorthIt)
    );
    assert_eq!(d.counts().skipped[Skip::NotWorthIt as usize], 1);
    // 0.9 × 3 = 2.7 ≥ 2: worth it.
    assert!(d.consider(10, cand(&t, &k, &score(0.9), eu(), 3.0)).is_ok());
    // The same key of a tenant whose fills cost little.
    assert!(
        d.consider(0, cand(&cheap, &k, &score(0.9), eu(), 1.0))
            .is_ok()
    );
}

/// Each region is weighed on its own: one whose chance of asking in time, times
/// the confidence, does not pay for its fill is not named; with none left, no
/// command.
#[test]
fn a_region_unlikely_to_ask_in_time_is_not_named() {
    let (t, k) = ids("acme", "/a");
    let mut d = Decider::new(DecisionPolicy::default());
    let s = score(0.9);
    let mut c = cand(&t, &k, &s, regions(&["eu", "us", "ap"]), 1.0);
    // 0.9 × 0.6 = 0.54 saves 0.54 ≥ 0.46 wasted; 0.9 × 0.5 = 0.45 does not.
    c.chances = vec![0.6, 0.5, 1.0];
    let command = d.consider(0, c).unwrap();
    assert_eq!(command.regions, RegionTargets::Only(regions(&["eu", "ap"])));
    let (_, other) = ids("acme", "/b");
    let mut c = cand(&t, &other, &s, regions(&["eu"]), 1.0);
    c.chances = vec![0.2];
    assert_eq!(d.consider(0, c), Err(Skip::NotWorthIt));
}

/// The same tenant, key, burst and model give the same id, whenever and by
/// whichever decider the decision is made; any other field gives another.
#[test]
fn a_decision_made_again_carries_the_same_id() {
    let (t, k) = ids("acme", "/a");
    let s = score(0.9);
    let decide = |now_ms: u64, burst_start_ms: u64| {
        let mut fresh = Decider::new(DecisionPolicy::default());
        let mut c = cand(&t, &k, &s, regions(&["eu"]), 1.0);
        c.burst_start_ms = burst_start_ms;
        fresh.consider(now_ms, c).unwrap().id
    };
    assert_eq!(decide(1_000, 500), decide(1_400, 500), "replayed later");
    assert_ne!(decide(1_000, 500), decide(1_000, 900), "another burst");
    let id = command_id(&t, &k, 500, "m");
    assert_eq!(id, decide(1_000, 500));
    let (other_tenant, other_key) = ids("beta", "/b");
    assert_ne!(id, command_id(&other_tenant, &k, 500, "m"));
    assert_ne!(id, command_id(&t, &other_key, 500, "m"));
    assert_ne!(id, command_id(&t, &k, 500, "m2"));
    // Field boundaries count: ("acme", "/ab") is not ("acme/", "b").
    assert!(id.starts_with("pw-500-") && id.len() == "pw-500-".len() + 16);
}

#[test]
fn one_crossing_is_not_enough() {
    let mut d = Decider::new(DecisionPolicy {
        confirmations: 2,
        ..DecisionPolicy::default()
    });
    let (t, k) = ids("acme", "/a");
    let eu = || regions(&["eu"]);
    assert_eq!(
        d.consider(0, cand(&t, &k, &score(0.9), eu(), 1.0)),
        Err(Skip::Unconfirmed)
    );
    assert_eq!(
        d.consider(50, cand(&t, &k, &score(0.5), eu(), 1.0)),
        Err(Skip::BelowThreshold)
    );
    assert_eq!(
        d.consider(100, cand(&t, &k, &score(0.9), eu(), 1.0)),
        Err(Skip::Unconfirmed)
    );
    // Too long after the previous scoring: not consecutive.
    assert_eq!(
        d.consider(5_000, cand(&t, &k, &score(0.9), eu(), 1.0)),
        Err(Skip::Unconfirmed)
    );
    assert!(
        d.consider(5_050, cand(&t, &k, &score(0.9), eu(), 1.0))
            .is_ok()
    );
}

#[test]
fn threshold_and_nothing_to_warm() {
    let mut d = Decider::new(unconfirmed());
    let (t, k) = ids("acme", "/a");
    assert_eq!(
        d.consider(0, cand(&t, &k, &score(0.84), regions(&["eu"]), 1.0)),
        Err(Skip::BelowThreshold)
    );
    assert_eq!(
        d.consider(0, cand(&t, &k, &score(0.95), vec![], 1.0)),
        Err(Skip::NothingToWarm)
    );
    let c = d
        .consider(0, cand(&t, &k, &score(0.85), regions(&["eu"]), 1.0))
        .unwrap();
    assert_eq!(c.regions, RegionTargets::Only(regions(&["eu"])));
    assert_eq!(c.expires_at_ms, DecisionPolicy::default().command_ttl_ms);
    d.refuse(0, &t, &k, Stage::Candidate, Skip::AwaitingRegions);
    assert_eq!(
        d.counts().skips(),
        [
            (Skip::BelowThreshold, 1),
            (Skip::Unconfirmed, 0),
            (Skip::NotWorthIt, 0),
            (Skip::NothingToWarm, 1),
            (Skip::Cooldown, 0),
            (Skip::OverBudget, 0),
            (Skip::AwaitingRegions, 1)
        ]
    );
}

#[test]
fn one_command_per_wave() {
    let policy = unconfirmed();
    let mut d = Decider::new(policy.clone());
    let (t, k) = ids("acme", "/a");
    assert!(
        d.consider(1_000, cand(&t, &k, &score(0.9), regions(&["eu"]), 1.0))
            .is_ok()
    );
    assert_eq!(
        d.consider(2_000, cand(&t, &k, &score(0.99), regions(&["eu"]), 1.0)),
        Err(Skip::Cooldown)
    );
    assert!(
        d.consider(
            1_000 + policy.cooldown_ms,
            cand(&t, &k, &score(0.9), regions(&["eu"]), 1.0)
        )
        .is_ok()
    );
}

#[test]
fn a_tenant_budget_caps_its_commands_but_not_others() {
    let policy = DecisionPolicy {
        tenant_burst: 3.0,
        tenant_rate_per_s: 1.0,
        ..unconfirmed()
    };
    let mut d = Decider::new(policy);
    let loud: TenantId = "loud".parse().unwrap();
    let sent = (0..10)
        .filter(|i| {
            let key: CacheKey = format!("/k{i}").parse().unwrap();
            d.consider(0, cand(&loud, &key, &score(0.9), regions(&["eu"]), 1.0))
                .is_ok()
        })
        .count();
    assert_eq!(sent, 3);
    let (quiet, key) = ids("quiet", "/k0");
    assert!(
        d.consider(0, cand(&quiet, &key, &score(0.9), regions(&["eu"]), 1.0))
            .is_ok()
    );
    // One second later the loud tenant has earned one more.
    let key: CacheKey = "/k-late".parse().unwrap();
    assert!(
        d.consider(1_000, cand(&loud, &key, &score(0.9), regions(&["eu"]), 1.0))
            .is_ok()
    );
    let key: CacheKey = "/k-later".parse().unwrap();
    assert_eq!(
        d.consider(1_000, cand(&loud, &key, &score(0.9), regions(&["eu"]), 1.0)),
        Err(Skip::OverBudget)
    );
}

#[test]
fn useful_when_a_warmed_region_asks_and_wasted_when_none_does() {
    let mut d = Decider::new(unconfirmed());
    let (t, k) = ids("acme", "/a");
    let (_, other) = ids("acme", "/b");
    d.consider(
        1_000,
        cand(&t, &k, &score(0.9), regions(&["eu", "ap"]), 1.0),
    )
    .unwrap();
    d.consider(1_000, cand(&t, &other, &score(0.9), regions(&["eu"]), 1.0))
        .unwrap();
    let eu: RegionId = "eu".parse().unwrap();
    let us: RegionId = "us".parse().unwrap();
    let (t_, k_) = (t.as_str(), k.as_str());
    d.observe(2_500, t_, k_, &us.borrowed(), Outcome::Miss); // not a warmed region
    d.observe(2_600, t_, k_, &eu.borrowed(), Outcome::PrefetchFill); // the warm-up itself
    d.observe(3_000, t_, k_, &eu.borrowed(), Outcome::PrefetchUseful);
    d.expire(1_000 + DecisionPolicy::default().command_ttl_ms);
    let verdicts: Vec<_> = d
        .recent()
        .map(|x| {
            (
                x.command.key.to_string(),
                x.verdict,
                x.lead_times_ms.clone(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![
            ("/b".to_string(), Verdict::Wasted, vec![]),
            ("/a".to_string(), Verdict::Useful, vec![(eu, 2_000)]),
        ]
    );
    assert_eq!((d.counts().useful, d.counts().wasted), (1, 1));
}

#[test]
fn history_is_bounded() {
    let policy = DecisionPolicy {
        history: 5,
        tenant_burst: 100.0,
        ..unconfirmed()
    };
    let mut d = Decider::new(policy);
    let t: TenantId = "acme".parse().unwrap();
    for i in 0..20 {
        let key: CacheKey = format!("/k{i}").parse().unwrap();
        d.consider(i, cand(&t, &key, &score(0.9), regions(&["eu"]), 1.0))
            .unwrap();
    }
    assert_eq!(d.recent().count(), 5);
    assert_eq!(d.counts().sent, 20);
}

/// A due follow-up refused is counted once per reason until the next command (it is
/// looked at every tick); one that passes the regions and the gate is sent.
#[test]
fn a_refused_follow_up_is_counted_once_per_reason() {
    let (t, k) = ids("acme", "/a");
    let mut d = Decider::new(DecisionPolicy {
        tenant_burst: 1.0,
        tenant_rate_per_s: 0.001,
        ..unconfirmed()
    });
    d.consider(0, cand(&t, &k, &score(0.9), regions(&["eu"]), 1.0))
        .unwrap();
    let due = DecisionPolicy::default().command_ttl_ms / 2;
    assert!(d.follow_up(due - 1, &t, &k, vec![0], vec![], &[]).is_none());
    for at in [due, due + 10] {
        let refused = d.follow_up(at, &t, &k, vec![0], vec![], &[]).unwrap();
        assert_eq!(refused, Err((Stage::Regions, Skip::NothingToWarm)));
        d.refuse_follow_up(at, &t, &k, Stage::Regions, Skip::NothingToWarm);
    }
    let (stage, skip) = d
        .follow_up(due + 20, &t, &k, vec![0], regions(&["us"]), &[1.0])
        .unwrap()
        .unwrap_err();
    assert_eq!((stage, skip), (Stage::Gate, Skip::OverBudget));
    d.refuse_follow_up(due + 20, &t, &k, stage, skip);
    let counts = d.counts();
    assert_eq!(counts.skipped[Skip::NothingToWarm as usize], 1);
    assert_eq!(counts.skipped[Skip::OverBudget as usize], 1);
    assert_eq!(
        d.last_decision(&t, &k).map(|l| (l.stage, l.skip)),
        Some((Stage::Gate, Some(Skip::OverBudget)))
    );
}
