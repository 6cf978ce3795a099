//! Outcome memory: a key whose last command was wasted (no region it named asked before
//! it expired) is not commanded again at its first region; it waits for a second one
//! (see `Predictor`'s tick). A useful command clears the memory. Entries older than
//! [`MEMORY_MS`] are forgotten.
//!
//! Every verdict also teaches the trust of the step its command was sent at
//! ([`Trust`]): the useful share of the fleet's, and the tenant's, commands at a first
//! region, a second, later, or as follow-ups, against the confidence they were sent at.
//!
//! A verdict comes only when a command expires, a TTL after it was sent, but a viral's
//! command is answered much sooner: where the fleet's virals answer within seconds, a
//! first-region command still unanswered at twice the longest of their answers is most
//! likely a crowd's ([`Answers`]). Until its verdict is in, its tenant's first regions
//! are no evidence either: a crowd of a kind the model scores among virals comes again,
//! from the same tenant, before the first one's verdict could teach the calibration.

use std::collections::{HashMap, VecDeque};

use models::{CacheKey, PrewarmCommand, TenantId};

use super::super::pipeline::policy::{ANSWERS_LEN, ANSWERS_NEEDED, MEMORY_MS, QUIET_FACTOR};
use super::super::trust::{Step, Trust};
use super::{Decider, Decision, Verdict};

/// What the decider remembers of its commands' verdicts.
#[derive(Debug, Default)]
pub(super) struct Memory {
    wasted: Wasted,
    quiet: Quiet,
    answers: Answers,
    /// What each step's commands' verdicts say of their confidence.
    pub(super) trust: Trust,
}

impl Memory {
    /// Notes a decision's verdict, for its key, and for the trust of its step.
    pub(super) fn note(&mut self, decision: &Decision, verdict: Verdict, now_ms: u64) {
        self.wasted.note(&decision.command, verdict, now_ms);
        if verdict != Verdict::Pending {
            self.trust.note(
                &decision.command.tenant,
                Step::at(decision.sent_at_regions),
                decision.calibrated,
                verdict == Verdict::Useful,
                now_ms,
            );
        }
        if verdict == Verdict::Useful {
            self.quiet.answered(&decision.command);
            if decision.sent_at_regions >= 1 {
                self.answers
                    .note(now_ms.saturating_sub(decision.command.issued_at_ms));
            }
        }
    }

    /// Notes a pending first-region command unanswered well past the fleet's answers
    /// (once: its deadline is then spent).
    pub(super) fn note_silence(&mut self, decision: &mut Decision, now_ms: u64) {
        if decision.verdict == Verdict::Pending
            && decision.quiet_by_ms.is_some_and(|by| by <= now_ms)
        {
            decision.quiet_by_ms = None;
            self.quiet.note(&decision.command, now_ms);
        }
    }

    /// By when a command sent at `sent_at_regions` regions would most likely have been
    /// answered were it a viral's ([`Answers`]); `None` for a command not sent at a first
    /// region, before enough answers, or past its expiry.
    pub(super) fn quiet_by(&self, command: &PrewarmCommand, sent_at_regions: usize) -> Option<u64> {
        let by = command.issued_at_ms + self.answers.patience_ms()?;
        (sent_at_regions == 1 && by < command.expires_at_ms).then_some(by)
    }
}

/// How long the fleet's viral commands took to be answered: of the newest
/// [`ANSWERS_LEN`] commands sent at a first or second region that a named region then
/// asked for, the delay from the command to that first request. A command sent at a
/// first region and still unanswered [`QUIET_FACTOR`] times the longest of them later is
/// most likely no viral's: the fleet's virals answer sooner.
#[derive(Debug, Default)]
struct Answers {
    delays_ms: VecDeque<u64>,
}

impl Answers {
    fn note(&mut self, delay_ms: u64) {
        if self.delays_ms.len() == ANSWERS_LEN {
            self.delays_ms.pop_front();
        }
        self.delays_ms.push_back(delay_ms);
    }

    /// How long a command may go unanswered before it is most likely no viral's.
    fn patience_ms(&self) -> Option<u64> {
        (self.delays_ms.len() >= ANSWERS_NEEDED)
            .then(|| QUIET_FACTOR * self.delays_ms.iter().max().copied().unwrap_or(0))
    }
}

/// Tenants with a first-region command unanswered well past the fleet's answers, until
/// it expires or is answered: until its verdict reaches the calibration, the tenant's
/// first regions are no evidence (a crowd of a kind the model scores among virals
/// comes again before the first one's verdict is in).
#[derive(Debug, Default)]
struct Quiet {
    tenants: HashMap<TenantId, (u64, String)>,
}

impl Quiet {
    fn note(&mut self, command: &PrewarmCommand, now_ms: u64) {
        if self.tenants.len() > 100_000 {
            self.tenants.retain(|_, (until, _)| *until > now_ms);
        }
        self.tenants.insert(
            command.tenant.clone(),
            (command.expires_at_ms, command.id.clone()),
        );
    }

    fn answered(&mut self, command: &PrewarmCommand) {
        if self
            .tenants
            .get(&command.tenant)
            .is_some_and(|(_, id)| *id == command.id)
        {
            self.tenants.remove(&command.tenant);
        }
    }

    fn holds(&self, tenant: &TenantId, now_ms: u64) -> bool {
        self.tenants
            .get(tenant)
            .is_some_and(|(until, _)| *until > now_ms)
    }
}

/// When each key's last command was found wasted, by tenant then key.
#[derive(Debug, Default)]
struct Wasted {
    keys: HashMap<TenantId, HashMap<CacheKey, u64>>,
    len: usize,
}

impl Wasted {
    /// Notes a command's verdict: wasted is remembered (as of `now_ms`), useful clears.
    fn note(&mut self, command: &PrewarmCommand, verdict: Verdict, now_ms: u64) {
        match verdict {
            Verdict::Pending => {}
            Verdict::Useful => {
                if let Some(keys) = self.keys.get_mut(&command.tenant)
                    && keys.remove(&command.key).is_some()
                {
                    self.len -= 1;
                }
            }
            Verdict::Wasted => {
                if self.len > 100_000 {
                    for keys in self.keys.values_mut() {
                        keys.retain(|_, at| *at + MEMORY_MS > now_ms);
                    }
                    self.keys.retain(|_, keys| !keys.is_empty());
                    self.len = self.keys.values().map(HashMap::len).sum();
                }
                let previous = self
                    .keys
                    .entry(command.tenant.clone())
                    .or_default()
                    .insert(command.key.clone(), now_ms);
                self.len += usize::from(previous.is_none());
            }
        }
    }
}

impl Decider {
    /// Whether one of the tenant's first-region commands went unanswered well past the
    /// fleet's answers and has no verdict yet ([`Answers`]).
    pub(crate) fn tenant_quiet(&self, tenant: &TenantId, now_ms: u64) -> bool {
        self.memory.quiet.holds(tenant, now_ms)
    }

    /// What the trust learnt, for the checkpoint.
    pub(crate) fn trust_learnt(&self) -> &Trust {
        &self.memory.trust
    }

    /// Puts back what a checkpoint kept of the trust.
    pub(crate) fn restore_trust(&mut self, trust: Trust) {
        self.memory.trust = trust;
    }

    /// Whether the key's last command, within [`MEMORY_MS`], was wasted.
    pub(crate) fn last_command_wasted(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> bool {
        self.memory
            .wasted
            .keys
            .get(tenant)
            .and_then(|keys| keys.get(key))
            .is_some_and(|at| *at + MEMORY_MS > now_ms)
    }
}

#[cfg(test)]
mod tests {
    use models::{CacheKey, Outcome, RegionId, TenantId};

    use super::super::super::pipeline::policy::{
        ANSWERS_NEEDED, DecisionPolicy, MEMORY_MS, QUIET_FACTOR,
    };
    use super::super::super::trust::Step;
    use super::super::Decider;
    use super::super::tests::{Candidate, cand, score};

    /// A wasted command is remembered for its key (not for others); a useful one
    /// clears the memory; the memory fades after [`MEMORY_MS`].
    #[test]
    fn a_wasted_command_is_remembered_until_a_useful_one() {
        let mut d = Decider::new(DecisionPolicy::default());
        let (t, k): (TenantId, CacheKey) = ("acme".parse().unwrap(), "/a".parse().unwrap());
        let other: CacheKey = "/b".parse().unwrap();
        let eu: RegionId = "eu".parse().unwrap();
        let score = score(0.9);
        let consider = |d: &mut Decider, now_ms: u64| {
            let candidate = Candidate {
                burst_start_ms: now_ms,
                ..cand(&t, &k, &score, vec![eu.clone()], 1.0)
            };
            d.consider(now_ms, candidate).unwrap();
        };
        let ttl = DecisionPolicy::default().command_ttl_ms;
        consider(&mut d, 0);
        d.expire(ttl);
        assert!(d.last_command_wasted(&t, &k, ttl));
        assert!(!d.last_command_wasted(&t, &other, ttl));
        assert!(!d.last_command_wasted(&t, &k, ttl + MEMORY_MS));
        consider(&mut d, 2 * ttl);
        d.observe(2 * ttl + 500, "acme", "/a", &eu.borrowed(), Outcome::Miss);
        assert!(!d.last_command_wasted(&t, &k, 2 * ttl + 500));
    }

    /// The trust learns from the verdicts of the commands sent, each at its step:
    /// three wasted at a second region lower the trust in second regions and leave the
    /// trust in first regions as it was, and three wasted at a first region the other
    /// way round; commands at three regions touch neither.
    #[test]
    fn the_trust_learns_from_the_verdicts_of_commands_sent_at_each_step() {
        let (t, eu): (TenantId, RegionId) = ("acme".parse().unwrap(), "eu".parse().unwrap());
        let score = score(0.9);
        let ttl = DecisionPolicy::default().command_ttl_ms;
        let wasted_three = |reached: Vec<usize>| {
            let mut d = Decider::new(DecisionPolicy::default());
            for i in 0..3 {
                let key: CacheKey = format!("/k{i}").parse().unwrap();
                let candidate = Candidate {
                    reached: reached.clone(),
                    ..cand(&t, &key, &score, vec![eu.clone()], 1.0)
                };
                d.consider(0, candidate).unwrap();
            }
            d.expire(ttl);
            let trusted = |step| d.trust(&t, step, ttl) == 1.0;
            (trusted(Step::First), trusted(Step::Second))
        };
        assert_eq!(wasted_three(vec![0]), (false, true));
        assert_eq!(wasted_three(vec![0, 1]), (true, false));
        assert_eq!(wasted_three(vec![0, 1, 2]), (true, true));
    }

    /// A command sent at a first region that no named region answered within twice the
    /// longest answer of the fleet's viral commands makes its tenant's first regions
    /// wait (not another tenant's), until it is answered or expires; before enough
    /// answers, and for a command sent at a second region, nothing does.
    #[test]
    fn a_first_region_command_unanswered_long_after_the_fleets_make_its_tenant_wait() {
        let (t, other, eu): (TenantId, TenantId, RegionId) = (
            "acme".parse().unwrap(),
            "initech".parse().unwrap(),
            "eu".parse().unwrap(),
        );
        let score = score(0.9);
        let ttl = DecisionPolicy::default().command_ttl_ms;
        let send = |d: &mut Decider, key: &str, at: u64, reached: Vec<usize>| {
            let key: CacheKey = key.parse().unwrap();
            let candidate = Candidate {
                reached,
                burst_start_ms: at,
                ..cand(&t, &key, &score, vec![eu.clone()], 1.0)
            };
            d.consider(at, candidate).unwrap();
        };
        let ask = |d: &mut Decider, key: &str, at: u64| {
            d.observe(at, "acme", key, &eu.borrowed(), Outcome::Miss);
        };
        // Quiet from exactly `patience` after `at` on, not a millisecond before.
        let quiet_from = |d: &mut Decider, at: u64, patience: u64| {
            d.expire(at + patience - 1);
            assert!(!d.tenant_quiet(&t, at + patience - 1));
            d.expire(at + patience);
            assert!(d.tenant_quiet(&t, at + patience));
        };
        let mut d = Decider::new(DecisionPolicy::default());
        // The fleet's virals: answered 1 to 2 s after their commands.
        for i in 0..ANSWERS_NEEDED as u64 {
            let at = i * 10_000;
            let key = format!("/viral{i}");
            send(&mut d, &key, at, vec![0]);
            ask(&mut d, &key, at + 1_000 + i * 250);
        }
        let patience = QUIET_FACTOR * 2_000;
        let at = 100_000;
        send(&mut d, "/crowd", at, vec![0]);
        quiet_from(&mut d, at, patience);
        assert!(!d.tenant_quiet(&other, at + patience));
        ask(&mut d, "/crowd", at + patience + 500);
        assert!(!d.tenant_quiet(&t, at + patience + 500), "answered late");

        // That answer was a viral's too: the patience grows to twice it.
        let patience = QUIET_FACTOR * (patience + 500);
        let at = 200_000;
        send(&mut d, "/crowd2", at, vec![0]);
        quiet_from(&mut d, at, patience);
        assert!(!d.tenant_quiet(&t, at + ttl), "expired: its verdict is in");

        send(&mut d, "/second", 300_000, vec![0, 1]);
        d.expire(300_000 + patience);
        assert!(!d.tenant_quiet(&t, 300_000 + patience));

        let mut fresh = Decider::new(DecisionPolicy::default());
        send(&mut fresh, "/crowd", 0, vec![0]);
        fresh.expire(ttl - 1);
        assert!(
            !fresh.tenant_quiet(&t, ttl - 1),
            "no answers to judge by yet"
        );
    }
}
