//! Outcome memory: a key whose last command was wasted (no region it named asked before
//! it expired) is not commanded again at its first region; it waits for a second one
//! (see `Predictor`'s tick). A useful command clears the memory. Entries older than
//! [`MEMORY_MS`] are forgotten.

use std::collections::HashMap;

use models::{CacheKey, PrewarmCommand, TenantId};

use super::{Decider, Verdict};

/// How long a wasted command is remembered.
pub(crate) const MEMORY_MS: u64 = 3_600_000;

/// When each key's last command was found wasted, by tenant then key.
#[derive(Debug, Default)]
pub(super) struct Wasted {
    keys: HashMap<TenantId, HashMap<CacheKey, u64>>,
    len: usize,
}

impl Wasted {
    /// Notes a command's verdict: wasted is remembered (as of `now_ms`), useful clears.
    pub(super) fn note(&mut self, command: &PrewarmCommand, verdict: Verdict, now_ms: u64) {
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
    /// Whether the key's last command, within [`MEMORY_MS`], was wasted.
    pub(crate) fn last_command_wasted(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
    ) -> bool {
        self.wasted
            .keys
            .get(tenant)
            .and_then(|keys| keys.get(key))
            .is_some_and(|at| *at + MEMORY_MS > now_ms)
    }
}

#[cfg(test)]
mod tests {
    use models::{CacheKey, Outcome, Reason, RegionId, TenantId};

    use super::super::{Candidate, Decider, DecisionPolicy};
    use super::MEMORY_MS;
    use crate::predict::Score;

    /// A wasted command is remembered for its key (not for others); a useful one
    /// clears the memory; the memory fades after [`MEMORY_MS`].
    #[test]
    fn a_wasted_command_is_remembered_until_a_useful_one() {
        let mut d = Decider::new(DecisionPolicy::default());
        let (t, k): (TenantId, CacheKey) = ("acme".parse().unwrap(), "/a".parse().unwrap());
        let other: CacheKey = "/b".parse().unwrap();
        let eu: RegionId = "eu".parse().unwrap();
        let score = Score {
            confidence: 0.9,
            raw: 0.9,
            reason: Reason {
                model: "m".into(),
                intercept: 0.0,
                features: vec![],
            },
        };
        let consider = |d: &mut Decider, now_ms: u64| {
            let candidate = Candidate {
                tenant: &t,
                key: &k,
                score: &score,
                unseen: vec![eu.clone()],
                chances: vec![1.0],
                saved_misses: 1.0,
                burst_start_ms: now_ms,
                reached: vec![],
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
}
