//! Idle tenants evicted: a tenant silent for the longest window gives its memory
//! back and leaves a small summary ([`EvictedTenant`]).

use models::TenantId;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{COARSE_BUCKETS, COARSE_MS, HeatMap};

/// Seconds of event time between full recounts of the memory estimate (each new
/// tenant and each promotion raise it at once; trackers grow in between).
const RECOUNT_EVERY_S: u64 = 10;

/// Most summaries of evicted tenants kept (the oldest go first).
pub(crate) const MAX_EVICTED_SUMMARIES: usize = 10_000;

/// How long a tenant may be silent before it is evicted: the longest window, after
/// which it has nothing left to answer.
pub(crate) const IDLE_EVICT_MS: u64 = COARSE_MS * COARSE_BUCKETS as u64;

/// What is kept of an evicted tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvictedTenant {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant: TenantId,
    /// Events applied before it went quiet.
    pub events: u64,
    /// Its newest event time, ms since the Unix epoch.
    pub last_event_ms: u64,
}

impl HeatMap {
    /// Evicts every tenant silent for [`IDLE_EVICT_MS`] behind `now_ms`, keeps their
    /// summaries (at most [`MAX_EVICTED_SUMMARIES`]), and refreshes the memory estimate.
    pub(super) fn evict_idle(&mut self, now_ms: u64) {
        self.maintained_s = now_ms / COARSE_MS;
        let idle: Vec<String> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.last_event_ms.saturating_add(IDLE_EVICT_MS) <= now_ms)
            .map(|(name, _)| name.clone())
            .collect();
        let evicted_any = !idle.is_empty();
        self.evictions += idle.len() as u64;
        for name in idle {
            let Some(tenant) = self.tenants.remove(&name) else {
                continue;
            };
            if let Ok(id) = TenantId::new(name.as_str()) {
                self.evicted.insert(
                    name,
                    EvictedTenant {
                        tenant: id,
                        events: tenant.events,
                        last_event_ms: tenant.last_event_ms,
                    },
                );
            }
        }
        if evicted_any || self.maintained_s % RECOUNT_EVERY_S == 0 {
            self.bytes = self.reserved_bytes();
        }
        if self.evicted.len() > MAX_EVICTED_SUMMARIES {
            let mut oldest: Vec<(u64, String)> = self
                .evicted
                .iter()
                .map(|(n, e)| (e.last_event_ms, n.clone()))
                .collect();
            oldest.sort_unstable();
            let excess = self.evicted.len() - MAX_EVICTED_SUMMARIES * 3 / 4;
            for (_, name) in oldest.into_iter().take(excess) {
                self.evicted.remove(&name);
            }
        }
    }

    /// Summaries of evicted tenants, newest first.
    pub fn evicted(&self) -> Vec<EvictedTenant> {
        let mut out: Vec<EvictedTenant> = self.evicted.values().cloned().collect();
        out.sort_by(|a, b| {
            b.last_event_ms
                .cmp(&a.last_event_ms)
                .then(a.tenant.cmp(&b.tenant))
        });
        out
    }

    /// Tenants evicted since this heat map was made or restored.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heat::tests::{T0, ev_of, tenant};
    use crate::heat::*;

    /// Hostile input: a tenant flood. The limit is the memory budget, not a count of
    /// tenants ever seen: tenants silent for a window are evicted (a small summary
    /// kept), so once the flood goes quiet a new tenant is served within one window.
    #[test]
    fn a_tenant_flood_that_went_quiet_leaves_room_within_one_window() {
        let config = HeatConfig::default();
        let one = TenantHeat::new(&config, "t", false).bytes();
        let budget = (HeatMap::new(config.clone()).memory_bytes() + 60 * one) as u64;
        let mut heat = HeatMap::new(HeatConfig {
            memory_budget_bytes: budget
                .max((config.shared_bytes() + config.own_tenant_bytes()) as u64),
            ..config
        });
        let mut refused = 0;
        for i in 0..100_000 {
            match heat.apply(&ev_of(&format!("flood-{i}"), T0, "/a", "eu")) {
                Ok(()) => {}
                Err(ApplyError::MemoryBudget) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(refused > 0, "the budget was never reached");
        let held = heat.tenants_len();
        assert!(heat.memory_bytes() as u64 <= heat.config().memory_budget_bytes);
        assert_eq!(
            heat.apply(&ev_of("newcomer", T0 + 1_000, "/a", "eu")),
            Err(ApplyError::MemoryBudget)
        );
        // One window later (event time), the newcomer is served and the flood is gone.
        heat.apply(&ev_of("newcomer", T0 + IDLE_EVICT_MS, "/a", "eu"))
            .unwrap();
        assert_eq!(heat.tenants_len(), 1);
        assert_eq!(heat.evicted().len(), held);
        assert!(heat.evicted().iter().all(|e| e.events == 1));
        assert!(heat.tenant(&tenant("newcomer")).is_some());
        assert!(
            heat.hot_keys(&tenant("flood-0"), None, Window::S60, 5, heat.now_ms())
                .is_err()
        );
    }

    /// An evicted tenant is not in the next checkpoint, and a tenant that comes back
    /// continues its event count from its summary.
    #[test]
    fn evicted_tenants_stay_evicted_through_a_checkpoint() {
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.apply(&ev_of("gone", T0, "/a", "eu")).unwrap();
        heat.apply(&ev_of("gone", T0, "/b", "eu")).unwrap();
        heat.apply(&ev_of("stays", T0 + IDLE_EVICT_MS, "/a", "eu"))
            .unwrap();
        let back: HeatMap = serde_json::from_slice(&serde_json::to_vec(&heat).unwrap()).unwrap();
        assert!(back.tenant(&tenant("gone")).is_none());
        assert_eq!(back.evicted()[0].tenant.as_str(), "gone");
        let mut back = back;
        back.apply(&ev_of("gone", T0 + IDLE_EVICT_MS + 1, "/a", "eu"))
            .unwrap();
        assert_eq!(back.tenant(&tenant("gone")).unwrap().events(), 3);
        assert!(back.evicted().is_empty());
    }
}
