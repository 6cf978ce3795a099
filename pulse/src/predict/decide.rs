//! The decision state: the score stage's streaks, the cost rule of the regions
//! stage, the gate's per-tenant token buckets, and the record of the commands sent:
//! cooldowns, follow-ups, verdicts (a command is useful once a region it warmed asks,
//! else wasted), and each listed key's last decision. The stages themselves are
//! called in order from `predict::pipeline`.

use std::collections::{HashMap, VecDeque};

use models::{CacheKey, Outcome, PrewarmCommand, RegionId, RegionRef, RegionTargets, TenantId};
use serde::Serialize;

use super::model::Score;
use super::pipeline::policy::{DecisionPolicy, STREAK_GAP_MS};
use super::pipeline::{LastDecision, Skip, Stage};
use super::trust::Step;

mod follow;
mod memory;

/// What became of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Not yet expired, not yet requested in a warmed region.
    Pending,
    /// Requested in at least one warmed region before it expired.
    Useful,
    /// Expired with no request in any warmed region.
    Wasted,
}

/// One decision as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// The command sent.
    pub command: PrewarmCommand,
    /// What became of it.
    pub verdict: Verdict,
    /// For each warmed region that then asked for the key: the lead time, ms from the
    /// command to that region's first request.
    pub lead_times_ms: Vec<(RegionId, u64)>,
    /// How many regions had asked for the key when it was sent (0 for a follow-up):
    /// the fleet's record of commands at a first, and at a second, region counts it.
    #[serde(skip)]
    sent_at_regions: usize,
    /// Its calibrated confidence before the trust ([`trust`](super::trust)): what
    /// its verdict teaches the trust of its step.
    #[serde(skip)]
    calibrated: f64,
    /// For a command sent at a first region: by when one of its named regions would
    /// most likely have asked, were it a viral's ([`memory::Answers`]).
    #[serde(skip)]
    quiet_by_ms: Option<u64>,
}

/// A key the regions stage found worth a command, for the gate.
#[derive(Debug)]
pub(crate) struct Proposal {
    /// Whose key.
    pub tenant: TenantId,
    /// The key.
    pub key: CacheKey,
    /// The model's score (its confidence the calibrated one times the trust).
    pub score: Score,
    /// The calibrated confidence, before the trust.
    pub calibrated: f64,
    /// The regions worth a fill.
    pub named: Vec<RegionId>,
    /// Client misses warming one of them would save if it then asks.
    pub saved_misses: f64,
    /// When the key's current burst began (event time, ms): with the tenant, key and
    /// model it names the decision.
    pub burst_start_ms: u64,
    /// The tenant's regions (tracker ids) that asked for it lately: a follow-up needs
    /// a region beyond these.
    pub reached: Vec<usize>,
}

/// A command's id: the same (tenant, key, burst, model) always gives the same id, so a
/// decision made again (a replay, another instance after a rebalance) carries the id
/// of the first, and an edge can drop the repeat.
pub(crate) fn command_id(
    tenant: &TenantId,
    key: &CacheKey,
    burst_start_ms: u64,
    model: &str,
) -> String {
    let burst = burst_start_ms.to_string();
    // FNV-1a over the fields, each ended by a 0 byte (none of them can hold one).
    let hash = [tenant.as_str(), key.as_str(), burst.as_str(), model]
        .iter()
        .flat_map(|field| field.bytes().chain([0]))
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    format!("pw-{burst_start_ms}-{hash:016x}")
}

/// Whether a fill that is used with probability `chance` saves at least what it may
/// waste: `chance × saved misses ≥ (1 − chance) × cost`.
fn worth_a_fill(chance: f64, saved_misses: f64, cost: f64) -> bool {
    chance * saved_misses >= (1.0 - chance) * cost
}

/// The regions worth naming: those whose fill pays for itself, each asking with
/// probability `confidence` × its own chance of asking in time (1 where none is given).
fn worth_naming(
    regions: Vec<RegionId>,
    chances: &[f64],
    confidence: f64,
    saved_misses: f64,
    cost: f64,
) -> Vec<RegionId> {
    regions
        .into_iter()
        .enumerate()
        .filter(|(i, _)| {
            let chance = chances.get(*i).copied().unwrap_or(1.0);
            worth_a_fill(confidence * chance, saved_misses, cost)
        })
        .map(|(_, region)| region)
        .collect()
}

/// A token bucket: `rate` tokens a second up to `burst`.
#[derive(Debug, Clone)]
struct TokenBucket {
    tokens: f64,
    updated_ms: u64,
}

impl TokenBucket {
    fn take(&mut self, now_ms: u64, rate_per_s: f64, burst: f64) -> bool {
        let elapsed_s = now_ms.saturating_sub(self.updated_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed_s * rate_per_s).min(burst);
        self.updated_ms = self.updated_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Totals for `/metrics` and the backtest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DecisionCounts {
    /// Commands sent.
    pub sent: u64,
    /// Commands that proved useful.
    pub useful: u64,
    /// Commands that expired unused.
    pub wasted: u64,
    /// Scored keys skipped, by reason: `skipped[skip as usize]`, in [`Skip::ALL`]'s order.
    pub skipped: [u64; Skip::ALL.len()],
}

impl DecisionCounts {
    /// Scored keys skipped for each reason, in [`Skip::ALL`]'s order.
    pub fn skips(&self) -> [(Skip, u64); Skip::ALL.len()] {
        Skip::ALL.map(|skip| (skip, self.skipped[skip as usize]))
    }
}

/// The decision state: cooldowns, budgets, and outstanding commands.
pub(crate) struct Decider {
    policy: DecisionPolicy,
    last_command_ms: HashMap<(TenantId, CacheKey), u64>,
    /// Per key: consecutive scorings at or above the threshold, and the last one's time.
    streaks: HashMap<(TenantId, CacheKey), (u32, u64)>,
    budgets: HashMap<TenantId, TokenBucket>,
    following: follow::Following,
    memory: memory::Memory,
    // Newest last; bounded by `policy.history`.
    decisions: VecDeque<Decision>,
    /// The last decision of each key with a command in `decisions` (so bounded by it).
    last: HashMap<TenantId, HashMap<CacheKey, LastDecision>>,
    counts: DecisionCounts,
}

impl Decider {
    /// A decider with no history.
    pub(crate) fn new(policy: DecisionPolicy) -> Self {
        Decider {
            policy,
            last_command_ms: HashMap::new(),
            streaks: HashMap::new(),
            budgets: HashMap::new(),
            following: follow::Following::default(),
            memory: memory::Memory::default(),
            decisions: VecDeque::new(),
            last: HashMap::new(),
            counts: DecisionCounts::default(),
        }
    }

    /// The rules in force.
    pub(crate) fn policy(&self) -> &DecisionPolicy {
        &self.policy
    }

    /// What a calibrated confidence is worth for `tenant`'s commands at `step`, from
    /// the verdicts of those sent ([`Trust::factor`](super::trust::Trust::factor)).
    pub(crate) fn trust(&self, tenant: &TenantId, step: Step, now_ms: u64) -> f64 {
        self.memory.trust.factor(tenant, step, now_ms)
    }

    /// Whether the (tenant, key) had a command within the cooldown: it gets no other.
    pub(crate) fn cooling_down(&self, flight: &(TenantId, CacheKey), now_ms: u64) -> bool {
        self.last_command_ms
            .get(flight)
            .is_some_and(|last| now_ms < last + self.policy.cooldown_ms)
    }

    /// Counts a refused key under its reason, and notes it as the key's last decision
    /// if the key is listed (has a command in the history).
    pub(crate) fn refuse(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        stage: Stage,
        why: Skip,
    ) {
        self.counts.skipped[why as usize] += 1;
        self.note_last(now_ms, tenant, key, stage, Some(why));
    }

    fn note_last(
        &mut self,
        at_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        stage: Stage,
        skip: Option<Skip>,
    ) {
        if let Some(last) = self.last.get_mut(tenant).and_then(|keys| keys.get_mut(key)) {
            *last = LastDecision { at_ms, stage, skip };
        }
    }

    /// The last decision of a key with a command in the history.
    pub(crate) fn last_decision(&self, tenant: &TenantId, key: &CacheKey) -> Option<LastDecision> {
        self.last.get(tenant)?.get(key).copied()
    }

    /// What a wasted fill costs the tenant, in client misses.
    fn fill_cost(&self, tenant: &TenantId) -> f64 {
        self.policy
            .tenant_fill_costs
            .get(tenant)
            .copied()
            .unwrap_or(self.policy.wasted_fill_cost)
    }

    /// The score stage's rule: `confidence` at the threshold for
    /// [`DecisionPolicy::confirmations`] consecutive scorings of the key.
    pub(crate) fn confirm(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        confidence: f64,
    ) -> Result<(), Skip> {
        let flight = (tenant.clone(), key.clone());
        if confidence < self.policy.threshold {
            self.streaks.remove(&flight);
            return Err(Skip::BelowThreshold);
        }
        // Consecutive: the previous scoring of the key was at most a second ago.
        let streak = self.streaks.entry(flight).or_insert((0, now_ms));
        if now_ms > streak.1 + STREAK_GAP_MS {
            streak.0 = 0;
        }
        *streak = (streak.0 + 1, now_ms);
        if streak.0 < self.policy.confirmations {
            if self.streaks.len() > 4 * self.policy.history {
                self.streaks
                    .retain(|_, (_, last)| *last + STREAK_GAP_MS >= now_ms);
            }
            return Err(Skip::Unconfirmed);
        }
        Ok(())
    }

    /// The regions stage's cost rule, per region: with probability `confidence` × the
    /// region's chance of asking in time the region asks and the pre-warm saves
    /// `saved_misses`; otherwise its fill is wasted, at the tenant's wasted-fill cost.
    /// A command goes out only when that pays at `confidence` alone, and names only the
    /// regions for which it pays with their chance.
    pub(crate) fn name_regions(
        &self,
        tenant: &TenantId,
        confidence: f64,
        saved_misses: f64,
        unseen: Vec<RegionId>,
        chances: &[f64],
    ) -> Result<Vec<RegionId>, Skip> {
        let cost = self.fill_cost(tenant);
        let confidence = confidence.clamp(0.0, 1.0);
        if !worth_a_fill(confidence, saved_misses, cost) {
            return Err(Skip::NotWorthIt);
        }
        if unseen.is_empty() {
            return Err(Skip::NothingToWarm);
        }
        let named = worth_naming(unseen, chances, confidence, saved_misses, cost);
        if named.is_empty() {
            return Err(Skip::NotWorthIt);
        }
        Ok(named)
    }

    /// The gate stage: a token from the tenant's budget, then the command, recorded as
    /// sent (its cooldown, its history entry, its key followed).
    pub(crate) fn gate(&mut self, now_ms: u64, p: Proposal) -> Result<PrewarmCommand, Skip> {
        if !self.take_token(&p.tenant, now_ms) {
            return Err(Skip::OverBudget);
        }
        let confidence = p.score.confidence.clamp(0.0, 1.0);
        let command = PrewarmCommand::new(
            command_id(&p.tenant, &p.key, p.burst_start_ms, &p.score.reason.model),
            p.tenant,
            p.key,
            confidence,
            now_ms,
            now_ms + self.policy.command_ttl_ms,
            RegionTargets::Only(p.named),
            p.score.reason,
        );
        self.issue(now_ms, &command, p.reached.len(), p.calibrated);
        self.follow(
            &command,
            p.burst_start_ms,
            p.reached,
            p.saved_misses,
            p.calibrated,
        );
        Ok(command)
    }

    /// Takes a token from the tenant's budget, if it has one.
    fn take_token(&mut self, tenant: &TenantId, now_ms: u64) -> bool {
        let bucket = self.budgets.entry(tenant.clone()).or_insert(TokenBucket {
            tokens: self.policy.tenant_burst,
            updated_ms: now_ms,
        });
        bucket.take(
            now_ms,
            self.policy.tenant_rate_per_s,
            self.policy.tenant_burst,
        )
    }

    /// Records a command as sent: its key's cooldown, the totals, the history.
    fn issue(
        &mut self,
        now_ms: u64,
        command: &PrewarmCommand,
        sent_at_regions: usize,
        calibrated: f64,
    ) {
        self.last_command_ms
            .insert((command.tenant.clone(), command.key.clone()), now_ms);
        // Cooldowns older than the window can go; keeps the map bounded by the rate.
        if self.last_command_ms.len() > 4 * self.policy.history {
            let cooldown = self.policy.cooldown_ms;
            self.last_command_ms
                .retain(|_, last| now_ms < *last + cooldown);
        }
        self.counts.sent += 1;
        self.decisions.push_back(Decision {
            command: command.clone(),
            verdict: Verdict::Pending,
            lead_times_ms: Vec::new(),
            sent_at_regions,
            calibrated,
            quiet_by_ms: self.memory.quiet_by(command, sent_at_regions),
        });
        self.last.entry(command.tenant.clone()).or_default().insert(
            command.key.clone(),
            LastDecision {
                at_ms: now_ms,
                stage: Stage::Gate,
                skip: None,
            },
        );
        while self.decisions.len() > self.policy.history {
            if let Some(old) = self.decisions.pop_front() {
                self.settle(&old, now_ms);
                self.unlist(&old.command);
            }
        }
    }

    /// Forgets the last decision of a command's key once none of its commands is left
    /// in the history.
    fn unlist(&mut self, command: &PrewarmCommand) {
        let listed = self
            .decisions
            .iter()
            .any(|d| d.command.tenant == command.tenant && d.command.key == command.key);
        if listed {
            return;
        }
        if let Some(keys) = self.last.get_mut(&command.tenant) {
            keys.remove(&command.key);
            if keys.is_empty() {
                self.last.remove(&command.tenant);
            }
        }
    }

    /// Feeds one access event: a request in a warmed region makes its command useful.
    pub(crate) fn observe(
        &mut self,
        ts_ms: u64,
        tenant: &str,
        key: &str,
        region: &RegionRef<'_>,
        outcome: Outcome,
    ) {
        if !outcome.is_demand() {
            return; // the pre-warm itself
        }
        for decision in self.decisions.iter_mut().rev() {
            let c = &decision.command;
            let live = (c.issued_at_ms..c.expires_at_ms).contains(&ts_ms);
            if c.tenant.as_str() != tenant || c.key.as_str() != key || !live {
                continue;
            }
            if c.regions.includes(region)
                && !decision.lead_times_ms.iter().any(|(r, _)| region == r)
            {
                decision
                    .lead_times_ms
                    .push((region.to_owned_id(), ts_ms - c.issued_at_ms));
                if decision.verdict == Verdict::Pending {
                    decision.verdict = Verdict::Useful;
                    self.counts.useful += 1;
                    self.memory.note(decision, Verdict::Useful, ts_ms);
                }
            }
            break; // only the newest command for the key counts
        }
    }

    /// Marks commands past their expiry with no demand as wasted, and notes the
    /// first-region commands still unanswered well past the fleet's answers.
    pub(crate) fn expire(&mut self, now_ms: u64) {
        for decision in self.decisions.iter_mut() {
            self.memory.note_silence(decision, now_ms);
            if decision.verdict == Verdict::Pending && decision.command.is_expired(now_ms) {
                decision.verdict = Verdict::Wasted;
                self.counts.wasted += 1;
                if !self.following.superseded(&decision.command) {
                    self.memory.note(decision, Verdict::Wasted, now_ms);
                }
            }
        }
    }

    /// A decision leaving the history still gets its verdict counted.
    fn settle(&mut self, old: &Decision, now_ms: u64) {
        if old.verdict == Verdict::Pending && old.command.is_expired(now_ms) {
            self.counts.wasted += 1;
            if !self.following.superseded(&old.command) {
                self.memory.note(old, Verdict::Wasted, now_ms);
            }
        }
    }

    /// Recent decisions, newest first.
    pub(crate) fn recent(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter().rev()
    }

    /// The totals.
    pub(crate) fn counts(&self) -> DecisionCounts {
        self.counts
    }
}

#[cfg(test)]
pub(super) mod tests;
