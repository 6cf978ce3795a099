//! Follow-up commands: a viral that spreads slowly reaches its later regions after its
//! first command expired. While a commanded key keeps spreading (a region it had not
//! reached when its last command went out has since asked), once that command is half
//! its TTL old (`FOLLOW_UP_WAIT_DIVISOR`), the key gets another, with a fresh TTL, for the regions still unreached.
//! At most [`DecisionPolicy::follow_ups`](super::DecisionPolicy::follow_ups) per burst;
//! each takes a token from the tenant's budget like any command.

use std::collections::HashMap;

use models::{CacheKey, PrewarmCommand, RegionId, RegionTargets, TenantId};

use super::super::pipeline::policy::FOLLOW_UP_WAIT_DIVISOR;
use super::super::pipeline::{Skip, Stage};
use super::super::trust::Step;
use super::{Decider, command_id, worth_naming};

/// A commanded key being followed.
#[derive(Debug, Clone)]
pub(super) struct Followed {
    /// The last command sent for the key (the first, or a follow-up).
    last: PrewarmCommand,
    /// When the burst it was decided on began.
    burst_start_ms: u64,
    /// The tenant's regions (tracker ids) that had asked for the key when it was sent.
    reached: Vec<usize>,
    /// Follow-ups sent so far.
    follow_ups: u32,
    /// Client misses a warmed region that asks is spared (as at the first command).
    saved_misses: f64,
    /// The first command's calibrated confidence, before the trust: a follow-up's is
    /// this times the trust of follow-ups.
    calibrated: f64,
    /// The last refusal counted since the last command: a due follow-up is looked at
    /// every tick, and is counted once per reason.
    refused: Option<Skip>,
}

/// The keys being followed, by tenant then key (looked up by reference, per tick).
#[derive(Debug, Default)]
pub(super) struct Following {
    keys: HashMap<TenantId, HashMap<CacheKey, Followed>>,
    len: usize,
}

impl Following {
    /// Whether a later command (a follow-up) was sent for the command's key: its
    /// verdict is then not the key's last.
    pub(super) fn superseded(&self, command: &PrewarmCommand) -> bool {
        self.keys
            .get(&command.tenant)
            .and_then(|keys| keys.get(&command.key))
            .is_some_and(|f| f.last.id != command.id)
    }
}

impl Decider {
    /// Starts following a key that just got its first command for a burst.
    pub(super) fn follow(
        &mut self,
        command: &PrewarmCommand,
        burst_start_ms: u64,
        reached: Vec<usize>,
        saved_misses: f64,
        calibrated: f64,
    ) {
        if self.policy.follow_ups == 0 {
            return;
        }
        let following = &mut self.following;
        // Bounded by the command rate: entries whose last command expired can go.
        if following.len > 4 * self.policy.history.max(1_000) {
            let now_ms = command.issued_at_ms;
            for keys in following.keys.values_mut() {
                keys.retain(|_, f| !f.last.is_expired(now_ms));
            }
            following.keys.retain(|_, keys| !keys.is_empty());
            following.len = following.keys.values().map(HashMap::len).sum();
        }
        let previous = following
            .keys
            .entry(command.tenant.clone())
            .or_default()
            .insert(
                command.key.clone(),
                Followed {
                    last: command.clone(),
                    burst_start_ms,
                    reached,
                    follow_ups: 0,
                    saved_misses,
                    calibrated,
                    refused: None,
                },
            );
        following.len += usize::from(previous.is_none());
    }

    /// The regions (tracker ids) the key had reached at its last command, and when its
    /// burst began, when a follow-up may be due: the key is followed, its last command
    /// is at least half its TTL old and not expired, and the cap is not reached.
    pub(crate) fn follow_up_due(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> Option<(&[usize], u64)> {
        let f = self.following.keys.get(tenant)?.get(key)?;
        let wait_ms = self.policy.command_ttl_ms / FOLLOW_UP_WAIT_DIVISOR;
        (f.follow_ups < self.policy.follow_ups
            && now_ms >= f.last.issued_at_ms + wait_ms
            && !f.last.is_expired(now_ms))
        .then_some((f.reached.as_slice(), f.burst_start_ms))
    }

    /// Counts a refused follow-up of a followed key, once per reason per command, and
    /// notes it as the key's last decision.
    pub(crate) fn refuse_follow_up(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        stage: Stage,
        why: Skip,
    ) {
        let Some(f) = self
            .following
            .keys
            .get_mut(tenant)
            .and_then(|keys| keys.get_mut(key))
        else {
            return;
        };
        if f.refused.replace(why) != Some(why) {
            self.refuse(now_ms, tenant, key, stage, why);
        }
    }

    /// A follow-up for a followed key that has spread since its last command: the
    /// regions stage for those of `unseen` (the regions it has still not reached) whose
    /// `chances` of asking in time pay for their fills, at the last command's
    /// confidence; then the gate, the tenant's budget. The command carries the last
    /// command's confidence and reasons, a fresh TTL, an id of its own. `None` when no
    /// follow-up is due.
    pub(crate) fn follow_up(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        reached: Vec<usize>,
        unseen: Vec<RegionId>,
        chances: &[f64],
    ) -> Option<Result<PrewarmCommand, (Stage, Skip)>> {
        self.follow_up_due(tenant, key, now_ms)?;
        if unseen.is_empty() {
            return Some(Err((Stage::Regions, Skip::NothingToWarm)));
        }
        let f = self.following.keys.get(tenant)?.get(key)?;
        let (calibrated, saved_misses) = (f.calibrated, f.saved_misses);
        let confidence = (calibrated * self.trust(tenant, Step::FollowUp, now_ms)).clamp(0.0, 1.0);
        if confidence < self.policy.threshold {
            return Some(Err((Stage::Score, Skip::BelowThreshold)));
        }
        let cost = self.fill_cost(tenant);
        let unseen = worth_naming(unseen, chances, confidence, saved_misses, cost);
        if unseen.is_empty() {
            return Some(Err((Stage::Regions, Skip::NotWorthIt)));
        }
        if !self.take_token(tenant, now_ms) {
            return Some(Err((Stage::Gate, Skip::OverBudget)));
        }
        let f = self.following.keys.get_mut(tenant)?.get_mut(key)?;
        f.follow_ups += 1;
        let reason = f.last.reason.clone();
        let command = PrewarmCommand::new(
            command_id(
                tenant,
                key,
                f.burst_start_ms,
                &format!("{}+{}", reason.model, f.follow_ups),
            ),
            tenant.clone(),
            key.clone(),
            confidence,
            now_ms,
            now_ms + self.policy.command_ttl_ms,
            RegionTargets::Only(unseen),
            reason,
        );
        f.last = command.clone();
        f.reached = reached;
        f.refused = None;
        self.issue(now_ms, &command, 0, calibrated);
        Some(Ok(command))
    }
}
