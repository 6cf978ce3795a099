//! One tracked key: when each region asked for it and how often, its referrer domains
//! second by second, its nodes and its past bursts.

use std::collections::{HashMap, VecDeque};

use super::MAX_NODES_PER_KEY;

/// One second of a key's requests, by referrer domain.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReferrerSecond {
    pub(crate) second: u64,
    pub(crate) total: u32,
    pub(crate) domains: Vec<(u32, u32)>, // (domain id, count)
}

/// One region's requests for a tracked key.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RegionSeen {
    /// Client requests ([`Outcome::is_demand`](models::Outcome::is_demand)).
    pub(crate) count: u32,
    /// A pre-warm filled the key here: the region holds it, though nobody asked.
    pub(crate) warmed: bool,
    pub(crate) first_ms: u64,
    pub(crate) last_ms: u64,
}

/// One tracked key.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrackedKey {
    /// Per region id: requests seen since tracking began, first and last request time.
    pub(crate) regions: Vec<RegionSeen>,
    pub(crate) referrers: VecDeque<ReferrerSecond>,
    /// Burst start times, newest last.
    pub(crate) bursts: VecDeque<u64>,
    pub(crate) in_burst: bool,
    /// When tracking began.
    pub(crate) tracked_since_ms: u64,
    /// Last time the key was a heat-map candidate.
    pub(crate) last_candidate_ms: u64,
    /// Whether an event arrived since the last tick.
    pub(crate) touched: bool,
    /// Client requests per node since tracking began (at most [`MAX_NODES_PER_KEY`]
    /// nodes), and all of them.
    pub(crate) nodes: Vec<(String, u32)>,
    pub(crate) node_total: u32,
}

impl TrackedKey {
    /// Requests from `region` since tracking began (0 for a region never seen).
    pub(crate) fn region_count(&self, region: usize) -> u32 {
        self.regions.get(region).map_or(0, |r| r.count)
    }

    /// Whether `region` asked for the key at or after `since_ms`.
    pub(crate) fn region_seen_since(&self, region: usize, since_ms: u64) -> bool {
        self.regions
            .get(region)
            .is_some_and(|r| (r.count > 0 || r.warmed) && r.last_ms >= since_ms)
    }

    /// Regions first seen at or after `since_ms`, at least `settle_ms` after tracking
    /// began (before that, every region is "new" to the tracker), that have made at
    /// least `min_requests` requests since: regions the key is spreading to.
    pub(crate) fn regions_new_since(
        &self,
        since_ms: u64,
        settle_ms: u64,
        min_requests: u32,
    ) -> usize {
        self.new_regions(since_ms, settle_ms, min_requests).count()
    }

    /// When the newest of those regions ([`TrackedKey::regions_new_since`]) first asked.
    pub(crate) fn newest_region_since(
        &self,
        since_ms: u64,
        settle_ms: u64,
        min_requests: u32,
    ) -> Option<u64> {
        self.new_regions(since_ms, settle_ms, min_requests)
            .map(|r| r.first_ms)
            .max()
    }

    fn new_regions(
        &self,
        since_ms: u64,
        settle_ms: u64,
        min_requests: u32,
    ) -> impl Iterator<Item = &RegionSeen> {
        let after = since_ms.max(self.tracked_since_ms + settle_ms);
        self.regions
            .iter()
            .filter(move |r| r.count >= min_requests && r.first_ms >= after)
    }

    /// When the key's current run of busy seconds began: the first of the consecutive
    /// seconds up to its newest, each before the newest (which may have only begun) with
    /// at least `min_per_s` requests. Bounded by the [`HISTORY_S`](super::HISTORY_S) seconds kept.
    pub(crate) fn busy_since_ms(&self, min_per_s: u32) -> Option<u64> {
        let mut began = None;
        let mut next_second = None;
        for s in self.referrers.iter().rev() {
            let busy = match next_second {
                None => true,
                Some(next) => s.second + 1 == next && s.total >= min_per_s,
            };
            if !busy {
                break;
            }
            began = Some(s.second * 1_000);
            next_second = Some(s.second);
        }
        began
    }

    /// Share of the key's requests since tracking began from its busiest node (0 with
    /// none).
    pub(crate) fn top_node_share(&self) -> f64 {
        let top = self.nodes.iter().map(|(_, c)| *c).max().unwrap_or(0);
        if self.node_total == 0 {
            0.0
        } else {
            f64::from(top) / f64::from(self.node_total)
        }
    }

    pub(super) fn note_node(&mut self, node: &str) {
        self.node_total = self.node_total.saturating_add(1);
        if let Some((_, c)) = self.nodes.iter_mut().find(|(n, _)| n == node) {
            *c = c.saturating_add(1);
        } else if self.nodes.len() < MAX_NODES_PER_KEY {
            self.nodes.push((node.to_owned(), 1));
        }
    }

    /// Requests and per-domain counts over the seconds in `[from_s, to_s]`.
    pub(crate) fn referrer_counts(&self, from_s: u64, to_s: u64) -> (u32, HashMap<u32, u32>) {
        let mut total = 0;
        let mut by_domain = HashMap::new();
        for s in self
            .referrers
            .iter()
            .filter(|s| (from_s..=to_s).contains(&s.second))
        {
            total += s.total;
            for (d, c) in &s.domains {
                *by_domain.entry(*d).or_insert(0) += c;
            }
        }
        (total, by_domain)
    }
}

/// Notes a request (`demand`) or a pre-warm fill of the key in `region`.
pub(super) fn note_region(key: &mut TrackedKey, region: usize, ts_ms: u64, demand: bool) {
    if key.regions.len() <= region {
        key.regions.resize(region + 1, RegionSeen::default());
    }
    let slot = &mut key.regions[region];
    if slot.count == 0 && !slot.warmed {
        slot.first_ms = ts_ms;
    }
    // A pre-warm still marks the region as seen (it holds the key now), but it is
    // no request: the count, which labels whether demand came, stays.
    if demand {
        slot.count = slot.count.saturating_add(1);
    } else {
        slot.warmed = true;
    }
    slot.last_ms = slot.last_ms.max(ts_ms);
}
