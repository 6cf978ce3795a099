//! The naive baseline every figure of the predictor is set beside, scored by the same
//! honest scorer: a key first seen in the last minute that draws
//! [`BURST_REQUESTS`] requests within [`BURST_WINDOW_MS`] at one region, while it has
//! reached fewer than [`MAX_REACHED`] regions, gets one command naming every region of
//! the fleet it has not reached, for [`TTL_MS`]. A learned pipeline that does not beat
//! this four-line rule on a world (more recall at no more wasted fills, or fewer
//! wasted fills at no less recall) has not earned its complexity.
//!
//! Its constants are the rule's own definition, not tuned: they are set beside the
//! predictor, never used by it.

use std::collections::{HashMap, HashSet, VecDeque};

use models::{AccessEvent, CacheKey, PrewarmCommand, Reason, RegionId, RegionTargets, TenantId};

/// How recently the key must have been seen first.
pub(crate) const NEW_KEY_MS: u64 = 60_000;
/// Requests at one region that make a burst.
pub(crate) const BURST_REQUESTS: usize = 15;
/// Within this long.
pub(crate) const BURST_WINDOW_MS: u64 = 5_000;
/// A key that reached this many regions already is not commanded.
pub(crate) const MAX_REACHED: usize = 3;
/// How long the command lasts.
pub(crate) const TTL_MS: u64 = 60_000;

#[derive(Default)]
struct KeyState {
    first_ms: u64,
    reached: Vec<RegionId>,
    recent: HashMap<RegionId, VecDeque<u64>>,
    commanded: bool,
}

/// The baseline's commands for `events`, as a live rule would send them: each from
/// what the events before it in time showed.
pub(crate) fn naive_commands(events: &[AccessEvent]) -> Vec<PrewarmCommand> {
    let mut fleet: Vec<RegionId> = Vec::new();
    let mut seen_regions: HashSet<RegionId> = HashSet::new();
    let mut keys: HashMap<(TenantId, CacheKey), KeyState> = HashMap::new();
    let mut commands = Vec::new();
    let mut demand: Vec<&AccessEvent> = events.iter().filter(|e| e.outcome.is_demand()).collect();
    demand.sort_by_key(|e| e.ts_ms);
    for e in demand {
        if seen_regions.insert(e.region.clone()) {
            fleet.push(e.region.clone());
        }
        let state = keys
            .entry((e.tenant.clone(), e.key.clone()))
            .or_insert_with(|| KeyState {
                first_ms: e.ts_ms,
                ..KeyState::default()
            });
        if state.commanded || e.ts_ms.saturating_sub(state.first_ms) > NEW_KEY_MS {
            // Done with, or too old to be new: its window is no longer needed.
            state.recent.clear();
            continue;
        }
        if !state.reached.contains(&e.region) {
            state.reached.push(e.region.clone());
        }
        let window = state.recent.entry(e.region.clone()).or_default();
        window.push_back(e.ts_ms);
        while window
            .front()
            .is_some_and(|t| e.ts_ms.saturating_sub(*t) >= BURST_WINDOW_MS)
        {
            window.pop_front();
        }
        if window.len() < BURST_REQUESTS || state.reached.len() >= MAX_REACHED {
            continue;
        }
        state.commanded = true;
        state.recent.clear();
        let unseen: Vec<RegionId> = fleet
            .iter()
            .filter(|r| !state.reached.contains(r))
            .cloned()
            .collect();
        if unseen.is_empty() {
            continue;
        }
        commands.push(PrewarmCommand::new(
            format!("baseline-{}", commands.len()),
            e.tenant.clone(),
            e.key.clone(),
            1.0,
            e.ts_ms,
            e.ts_ms + TTL_MS,
            RegionTargets::Only(unseen),
            Reason {
                model: "naive-baseline".into(),
                intercept: 0.0,
                features: vec![],
            },
        ));
    }
    commands
}

#[cfg(test)]
mod tests {
    use models::Outcome;

    use super::*;

    fn ask(ts_ms: u64, key: &str, region: &str) -> AccessEvent {
        AccessEvent::new(
            ts_ms,
            "acme".parse().unwrap(),
            format!("/{key}").parse().unwrap(),
            region.parse().unwrap(),
            "n1".parse().unwrap(),
            Outcome::Miss,
        )
    }

    fn burst(start_ms: u64, key: &str, region: &str, n: u64, every_ms: u64) -> Vec<AccessEvent> {
        (0..n)
            .map(|i| ask(start_ms + i * every_ms, key, region))
            .collect()
    }

    fn sorted(mut events: Vec<AccessEvent>) -> Vec<AccessEvent> {
        events.sort_by_key(|e| e.ts_ms);
        events
    }

    #[test]
    fn a_new_key_bursting_at_one_region_names_every_unseen_region_once() {
        let mut events = vec![ask(0, "other", "eu"), ask(1, "other", "us")];
        events.extend(burst(1_000, "k", "ap", 30, 100));
        let commands = naive_commands(&sorted(events));
        assert_eq!(commands.len(), 1, "one command per key");
        let c = &commands[0];
        assert_eq!(
            c.issued_at_ms,
            1_000 + 14 * 100,
            "at the 15th request in 5 s"
        );
        assert_eq!(c.expires_at_ms - c.issued_at_ms, TTL_MS);
        assert_eq!(
            c.regions,
            RegionTargets::Only(vec!["eu".parse().unwrap(), "us".parse().unwrap()])
        );
    }

    #[test]
    fn slow_old_or_widespread_keys_get_nothing() {
        let mut events = vec![ask(0, "other", "eu")];
        // 15 requests over more than 5 s.
        events.extend(burst(0, "slow", "ap", 15, 400));
        // Seen first more than a minute before its burst.
        events.push(ask(0, "old", "ap"));
        events.extend(burst(70_000, "old", "ap", 20, 10));
        // Already in three regions when it bursts.
        events.extend([ask(0, "wide", "eu"), ask(1, "wide", "us")]);
        events.extend(burst(2_000, "wide", "ap", 20, 10));
        assert!(naive_commands(&sorted(events)).is_empty());
    }
}
