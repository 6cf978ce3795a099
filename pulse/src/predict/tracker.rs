//! What the sketches do not hold but the features need, kept exactly for a bounded
//! set of *tracked* keys (the heat map's candidates of the last minute): when each
//! region last asked for the key and how often, the key's referrer domains second by
//! second, and the key's past bursts. Per tenant it also keeps the referrer mix and an
//! hour-of-week burstiness baseline.
//!
//! Memory: at most `max_keys` tracked keys per tenant, each with at most
//! [`MAX_DOMAINS_PER_SECOND`] domains per second over [`HISTORY_S`] seconds.

use std::collections::HashMap;

use models::{AccessEventRef, CacheKey, Outcome, RegionId, RegionRef, TenantId};

mod audience;
mod key;

use super::pipeline::policy::{DEFAULT_FILL_MS, FILL_ALPHA};
use key::note_region;
pub(crate) use key::{ReferrerSecond, TrackedKey};

/// Seconds of per-key referrer history.
pub(crate) const HISTORY_S: u64 = 60;
/// Distinct referrer domains counted per key per second; the rest count as "other".
pub(crate) const MAX_DOMAINS_PER_SECOND: usize = 8;
/// Distinct nodes counted per key; the rest count as "other".
pub(crate) const MAX_NODES_PER_KEY: usize = 64;
/// A region serves a tenant while it asked for any of its keys this recently, at most.
pub(crate) const TENANT_REGION_MS: u64 = 600_000;
/// A region whose requests for a tenant stopped serves it no more (drained, failed, or
/// the tenant's traffic steered elsewhere): silent for this long at least, and for as
/// long as [`QUIET_REQUESTS`] of its requests took before.
pub(crate) const QUIET_MIN_MS: u64 = 30_000;
/// Requests a region's silence must have missed, at its rate before, to count as
/// stopped: a live region that quiet by chance is a Poisson event of `e^-30`.
pub(crate) const QUIET_REQUESTS: f64 = 30.0;
/// Bursts remembered per key.
const BURSTS_KEPT: usize = 8;
/// Distinct referrer domains a tenant's baseline counts; the rest are "other".
const MAX_TENANT_DOMAINS: usize = 256;
/// Weight of the newest hour in the hour-of-week EWMA.
const EWMA_ALPHA: f64 = 0.3;

/// One tenant's tracked keys and baselines.
#[derive(Debug, Default)]
pub(crate) struct TenantTracker {
    pub(crate) keys: HashMap<CacheKey, TrackedKey>,
    /// Interned referrer domains; id = index.
    pub(crate) domains: Vec<String>,
    domain_ids: HashMap<String, u32>,
    /// Requests per domain id over the tenant's recent past (decayed each minute).
    pub(crate) domain_counts: HashMap<u32, f64>,
    pub(crate) domain_total: f64,
    domain_minute: u64,
    /// Burst EWMA per hour of the week, and the current hour's running count.
    hour_ewma: Vec<f64>,
    hour_slot: Option<u64>,
    hour_bursts: f64,
    /// Per tracker region id: the tenant's last client request there (0: never).
    region_last_ms: Vec<u64>,
    /// Per tracker region id: the tenant's recent client requests there (halved each
    /// minute, with the referrer counts): how much of its audience lives there.
    region_requests: Vec<f64>,
    /// Per tracker region id: `region_requests` as of its last request, before any
    /// halving since: its rate while it still asked.
    region_requests_at_last: Vec<f64>,
    /// EWMA of the tenant's origin fill times, ms, from the misses that report one.
    fill_ms_ewma: Option<f64>,
    /// Per tracker region id: whether the tenant's clients there reach it through
    /// several nodes (and the first node seen, until a second one is).
    region_nodes: Vec<RegionNodes>,
    /// When the tenant's first event came: its keys' minutes hold only what came since.
    first_ms: Option<u64>,
}

/// Whether a region serves a tenant through one node or several.
#[derive(Debug, Clone, Default)]
struct RegionNodes {
    first: Option<String>,
    several: bool,
}

impl RegionNodes {
    fn note(&mut self, node: &str) {
        match &self.first {
            _ if self.several => {}
            None => self.first = Some(node.to_owned()),
            Some(first) => self.several = first != node,
        }
    }
}

/// The "other" domain id for domains past the cap.
const OTHER_DOMAIN: u32 = u32::MAX;

impl TenantTracker {
    /// The tenant's typical origin fill time, seconds.
    pub(crate) fn fill_seconds(&self) -> f64 {
        self.fill_ms_ewma.unwrap_or(DEFAULT_FILL_MS) / 1000.0
    }

    fn domain_id(&mut self, domain: &str) -> u32 {
        if let Some(id) = self.domain_ids.get(domain) {
            return *id;
        }
        if self.domains.len() >= MAX_TENANT_DOMAINS {
            return OTHER_DOMAIN;
        }
        let id = self.domains.len() as u32;
        self.domains.push(domain.to_owned());
        self.domain_ids.insert(domain.to_owned(), id);
        id
    }

    /// The domain's name, if it is a real (not "other") id.
    pub(crate) fn domain_name(&self, id: u32) -> Option<&str> {
        self.domains.get(id as usize).map(String::as_str)
    }

    /// The tenant-wide share of requests from `domain`.
    pub(crate) fn domain_share(&self, domain: u32) -> f64 {
        if self.domain_total <= 0.0 {
            0.0
        } else {
            self.domain_counts.get(&domain).copied().unwrap_or(0.0) / self.domain_total
        }
    }

    /// The tenant's recent client requests from `region` (a tracker id).
    pub(crate) fn region_requests(&self, region: usize) -> f64 {
        self.region_requests.get(region).copied().unwrap_or(0.0)
    }

    /// Regions (tracker ids) that serve the tenant: the tenant's fleet, which may be
    /// smaller than pulse's. A region serves it from its first request for any of the
    /// tenant's keys until it went quiet: [`TENANT_REGION_MS`] without a request, or
    /// sooner when that silence is too long for its rate ([`QUIET_MIN_MS`],
    /// [`QUIET_REQUESTS`]). A pre-warm there would fill a cache nobody reads.
    pub(crate) fn regions(&self, now_ms: u64) -> impl Iterator<Item = usize> + '_ {
        self.region_last_ms
            .iter()
            .enumerate()
            .filter(move |(i, last)| {
                // Requests halve each minute: between one and two minutes' worth.
                let before = self.region_requests_at_last.get(*i).copied().unwrap_or(0.0);
                let quiet_ms = if before > 0.0 {
                    (QUIET_REQUESTS * 120_000.0 / before) as u64
                } else {
                    TENANT_REGION_MS
                };
                let serves_for = quiet_ms.clamp(QUIET_MIN_MS, TENANT_REGION_MS);
                **last > 0 && now_ms.saturating_sub(**last) <= serves_for
            })
            .map(|(i, _)| i)
    }

    /// The tenant's burstiness at the hour of the week of `now_ms`.
    pub(crate) fn burstiness(&self, now_ms: u64) -> f64 {
        let slot = hour_of_week(now_ms);
        let ewma = self.hour_ewma.get(slot as usize).copied().unwrap_or(0.0);
        let running = if self.hour_slot == Some(slot) {
            self.hour_bursts
        } else {
            0.0
        };
        (1.0 - EWMA_ALPHA) * ewma + EWMA_ALPHA * running
    }

    fn record_burst(&mut self, now_ms: u64) {
        let slot = hour_of_week(now_ms);
        if self.hour_ewma.is_empty() {
            self.hour_ewma = vec![0.0; 168];
        }
        if let Some(old) = self.hour_slot.filter(|s| *s != slot) {
            let e = &mut self.hour_ewma[old as usize];
            *e = (1.0 - EWMA_ALPHA) * *e + EWMA_ALPHA * self.hour_bursts;
            self.hour_bursts = 0.0;
        }
        self.hour_slot = Some(slot);
        self.hour_bursts += 1.0;
    }
}

fn hour_of_week(now_ms: u64) -> u64 {
    // The Unix epoch was a Thursday; shift so that slot 0 is Monday 00:00 UTC.
    (now_ms / 3_600_000 + 3 * 24) % 168
}

/// How long one period of [`DomainReach`] lasts: a domain's regions are those of the
/// current period and the one before, 5 to 10 minutes.
const REACH_PERIOD_MS: u64 = 300_000;
/// Referrer domains whose regions are kept; later ones are not known.
const MAX_REACH_DOMAINS: usize = 4_096;

/// Where each referrer domain sends visitors from: the regions it referred requests
/// in lately, for every tenant's keys. A local news site's readers live in one
/// region, a social network's everywhere, whoever's content they link to.
#[derive(Debug, Default)]
pub(crate) struct DomainReach {
    period: u64,
    /// Per domain: region bitmasks (tracker region ids) of this period and the last.
    domains: HashMap<String, (u64, u64)>,
}

impl DomainReach {
    fn note(&mut self, domain: &str, region: usize, ts_ms: u64) {
        let period = ts_ms / REACH_PERIOD_MS;
        if period > self.period {
            let next = period == self.period + 1;
            for (current, last) in self.domains.values_mut() {
                *last = if next { *current } else { 0 };
                *current = 0;
            }
            self.domains.retain(|_, (_, last)| *last != 0);
            self.period = period;
        }
        let bit = 1u64 << region;
        let full = self.domains.len() >= MAX_REACH_DOMAINS;
        match self.domains.get_mut(domain) {
            Some((current, _)) => *current |= bit,
            None if !full => {
                self.domains.insert(domain.to_owned(), (bit, 0));
            }
            None => {}
        }
    }

    /// The regions (a bitmask of tracker region ids) `domain` referred requests in
    /// over the last 5 to 10 minutes; `None` for a domain not kept.
    pub(crate) fn regions(&self, domain: &str) -> Option<u64> {
        self.domains
            .get(domain)
            .map(|(current, last)| current | last)
    }
}

/// All tenants' tracked keys, the fleet's regions, and where referrers send
/// visitors from.
#[derive(Debug)]
pub(crate) struct Tracker {
    pub(crate) tenants: HashMap<TenantId, TenantTracker>,
    pub(crate) regions: Vec<RegionId>,
    pub(crate) reach: DomainReach,
    max_keys: usize,
}

/// Most regions the tracker names (like the heat map's bitsets).
const MAX_REGIONS: usize = 64;

impl Tracker {
    /// `tenant`'s typical origin fill time, seconds (a default before any miss said).
    pub(crate) fn fill_seconds(&self, tenant: &TenantId) -> f64 {
        self.tenants
            .get(tenant)
            .map_or(DEFAULT_FILL_MS / 1000.0, TenantTracker::fill_seconds)
    }

    pub(crate) fn new(max_keys: usize) -> Self {
        Tracker {
            tenants: HashMap::new(),
            regions: Vec::new(),
            reach: DomainReach::default(),
            max_keys,
        }
    }

    fn region_id(&mut self, region: &RegionRef<'_>) -> Option<usize> {
        if let Some(i) = self.regions.iter().position(|r| region == r) {
            return Some(i);
        }
        if self.regions.len() >= MAX_REGIONS {
            return None;
        }
        self.regions.push(region.to_owned_id());
        Some(self.regions.len() - 1)
    }

    /// Counts one event: the fleet's regions, the tenant's referrer mix, and, when the
    /// key is tracked, its per-region and per-referrer history. Returns whether the
    /// key is tracked.
    pub(crate) fn observe(&mut self, event: &AccessEventRef<'_>) -> bool {
        let region = self.region_id(&event.region);
        let tenant = match self.tenants.get_mut(event.tenant.as_str()) {
            Some(t) => t,
            None => self.tenants.entry(event.tenant.to_owned_id()).or_default(),
        };
        tenant.first_ms = Some(tenant.first_ms.map_or(event.ts_ms, |f| f.min(event.ts_ms)));
        if !event.outcome.is_demand() {
            // A pre-warm, not demand: it warms the region but says nothing of referrers.
            if let (Some(key), Some(r)) = (tenant.keys.get_mut(event.key.as_str()), region) {
                note_region(key, r, event.ts_ms, false);
            }
            return false;
        }
        if let (Some(domain), Some(r)) = (&event.referrer, region) {
            self.reach.note(domain.as_str(), r, event.ts_ms);
        }
        let domain = event
            .referrer
            .as_ref()
            .map(|d| tenant.domain_id(d.as_str()));
        let minute = event.ts_ms / 60_000;
        if minute != tenant.domain_minute {
            // Halve the tenant's referrer counts each minute: a slow-moving baseline.
            for c in tenant.domain_counts.values_mut() {
                *c *= 0.5;
            }
            tenant.domain_counts.retain(|_, c| *c >= 0.5);
            tenant.domain_total *= 0.5;
            for r in &mut tenant.region_requests {
                *r *= 0.5;
            }
            tenant.domain_minute = minute;
        }
        tenant.domain_total += 1.0;
        if let (Outcome::Miss, Some(fill_ms)) = (event.outcome, event.fill_ms) {
            let fill_ms = f64::from(fill_ms);
            tenant.fill_ms_ewma = Some(match tenant.fill_ms_ewma {
                Some(avg) => avg + FILL_ALPHA * (fill_ms - avg),
                None => fill_ms,
            });
        }
        if let Some(d) = domain {
            *tenant.domain_counts.entry(d).or_insert(0.0) += 1.0;
        }
        if let Some(r) = region {
            if tenant.region_last_ms.len() <= r {
                tenant.region_last_ms.resize(r + 1, 0);
            }
            let last = &mut tenant.region_last_ms[r];
            *last = (*last).max(event.ts_ms);
            if tenant.region_requests.len() <= r {
                tenant.region_requests.resize(r + 1, 0.0);
            }
            tenant.region_requests[r] += 1.0;
            if tenant.region_requests_at_last.len() <= r {
                tenant.region_requests_at_last.resize(r + 1, 0.0);
            }
            tenant.region_requests_at_last[r] = tenant.region_requests[r];
            if tenant.region_nodes.len() <= r {
                tenant.region_nodes.resize(r + 1, RegionNodes::default());
            }
            tenant.region_nodes[r].note(event.node.as_str());
        }
        let Some(key) = tenant.keys.get_mut(event.key.as_str()) else {
            return false;
        };
        key.touched = true;
        key.note_node(event.node.as_str());
        if let Some(r) = region {
            note_region(key, r, event.ts_ms, true);
        }
        let second = event.ts_ms / 1_000;
        if key.referrers.back().is_none_or(|s| s.second < second) {
            key.referrers.push_back(ReferrerSecond {
                second,
                ..ReferrerSecond::default()
            });
            while key
                .referrers
                .front()
                .is_some_and(|s| s.second + HISTORY_S < second)
            {
                key.referrers.pop_front();
            }
        }
        // Late events (older than the newest second) count in the newest second.
        let slot = key.referrers.back_mut().expect("pushed above");
        slot.total += 1;
        if let Some(d) = domain {
            if let Some((_, c)) = slot.domains.iter_mut().find(|(id, _)| *id == d) {
                *c += 1;
            } else if slot.domains.len() < MAX_DOMAINS_PER_SECOND {
                slot.domains.push((d, 1));
            }
        }
        true
    }

    /// Starts tracking the tenant's current candidates; forgets keys that have not
    /// been candidates for a minute, and the stalest ones past `max_keys`.
    pub(crate) fn track(&mut self, tenant: &TenantId, candidates: &[CacheKey], now_ms: u64) {
        let max_keys = self.max_keys;
        let t = self.tenants.entry(tenant.clone()).or_default();
        for key in candidates {
            match t.keys.get_mut(key) {
                Some(k) => k.last_candidate_ms = now_ms,
                None => {
                    t.keys.insert(
                        key.clone(),
                        TrackedKey {
                            tracked_since_ms: now_ms,
                            last_candidate_ms: now_ms,
                            ..TrackedKey::default()
                        },
                    );
                }
            }
        }
        if t.keys.len() > max_keys {
            let forget_before = now_ms.saturating_sub(60_000);
            t.keys.retain(|_, k| k.last_candidate_ms >= forget_before);
            if t.keys.len() > max_keys {
                let mut ages: Vec<u64> = t.keys.values().map(|k| k.last_candidate_ms).collect();
                ages.sort_unstable();
                let cutoff = ages[ages.len() - max_keys];
                t.keys.retain(|_, k| k.last_candidate_ms >= cutoff);
            }
        }
    }

    /// Whether a region first asked (a second or more after the key's last burst began,
    /// within a minute of it) in the last `within_ms`, and asked
    /// [`MIN_REGION_DEMAND`](super::MIN_REGION_DEMAND) times since: the burst spreads.
    pub(crate) fn spread_lately(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        now_ms: u64,
        within_ms: u64,
    ) -> bool {
        let Some(k) = self.tenants.get(tenant).and_then(|t| t.keys.get(key)) else {
            return false;
        };
        let Some(&burst) = k.bursts.back() else {
            return false;
        };
        now_ms < burst + 60_000
            && k.regions_new_since(
                now_ms.saturating_sub(within_ms).max(burst + 1_000),
                1_000,
                super::MIN_REGION_DEMAND,
            ) > 0
    }

    /// Whether a tracked key was asked for through one node only, where its tenant's
    /// clients use several: one client's burst (a bot, a retry loop), not a crowd's. On
    /// a fleet of one node a region, no key is.
    pub(crate) fn one_node_of_several(&self, tenant: &TenantId, key: &CacheKey) -> bool {
        let Some(t) = self.tenants.get(tenant) else {
            return false;
        };
        t.keys.get(key).is_some_and(|k| {
            k.nodes.len() == 1
                && k.regions.iter().enumerate().any(|(r, seen)| {
                    seen.count > 0 && t.region_nodes.get(r).is_some_and(|n| n.several)
                })
        })
    }

    /// When `tenant`'s first event came, if it had one.
    pub(crate) fn first_seen(&self, tenant: &TenantId) -> Option<u64> {
        self.tenants.get(tenant)?.first_ms
    }

    /// When the key's last burst began, if it is tracked and burst while tracked.
    pub(crate) fn last_burst(&self, tenant: &TenantId, key: &CacheKey) -> Option<u64> {
        let k = self.tenants.get(tenant)?.keys.get(key)?;
        k.bursts.back().copied()
    }

    /// When the current burst of a tracked key started, if it is `bursting` at
    /// `now_ms` (now, for a new one); asked before [`Tracker::note_burst`] changes the
    /// key's burst history, which the key's features read.
    pub(crate) fn burst_start(
        &self,
        tenant: &TenantId,
        key: &CacheKey,
        bursting: bool,
        now_ms: u64,
    ) -> Option<u64> {
        let k = self.tenants.get(tenant)?.keys.get(key)?;
        match (bursting, k.in_burst) {
            (false, _) => None,
            (true, false) => Some(now_ms),
            (true, true) => k.bursts.back().copied(),
        }
    }

    /// Records that a tracked key is (or is not) bursting; a new burst is remembered
    /// for the key's phase history and the tenant's hour-of-week baseline (when it
    /// started: [`Tracker::burst_start`], asked before).
    pub(crate) fn note_burst(
        &mut self,
        tenant: &TenantId,
        key: &CacheKey,
        bursting: bool,
        now_ms: u64,
    ) {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return;
        };
        let Some(k) = t.keys.get_mut(key) else {
            return;
        };
        let new_burst = bursting && !k.in_burst;
        if new_burst {
            k.bursts.push_back(now_ms);
            if k.bursts.len() > BURSTS_KEPT {
                k.bursts.pop_front();
            }
        }
        k.in_burst = bursting;
        if new_burst {
            t.record_burst(now_ms);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use models::{AccessEvent, Domain, NodeId, Outcome};

    use super::*;

    /// A miss for tenant `acme` on node `n1`.
    pub(crate) fn event(ts: u64, key: &str, region: &str, referrer: Option<&str>) -> AccessEvent {
        let mut e = AccessEvent::new(
            ts,
            "acme".parse().unwrap(),
            key.parse().unwrap(),
            region.parse().unwrap(),
            "n1".parse::<NodeId>().unwrap(),
            Outcome::Miss,
        );
        e.referrer = referrer.map(|d| Domain::new(d).unwrap());
        e
    }

    /// A key's busy run is the unbroken seconds of at least the floor that lead up to
    /// its newest second, whose count does not matter (it may have only begun): a
    /// second below the floor, or a second without a request, ends it.
    #[test]
    fn a_busy_run_ends_at_a_quiet_second() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/a".parse().unwrap();
        tracker.track(&tenant, std::slice::from_ref(&key), 0);
        // Second 1: 2 requests; 2: none; 3–5: 5 each; 6: 1 so far.
        let per_second = [(1, 2), (3, 5), (4, 5), (5, 5), (6, 1)];
        for (second, count) in per_second {
            for i in 0..count {
                tracker.observe(&event(second * 1_000 + i * 10, "/a", "eu", None).borrowed());
            }
        }
        let busy = |t: &Tracker, floor| t.tenants[&tenant].keys[&key].busy_since_ms(floor);
        assert_eq!(busy(&tracker, 5), Some(3_000));
        assert_eq!(busy(&tracker, 6), Some(6_000), "only the newest second");
        assert_eq!(busy(&tracker, 1), Some(3_000), "second 2 had no request");
    }

    /// A pre-warm fill marks its region as holding the key, and is no request: it
    /// touches no referrer history and does not make the key due for scoring.
    #[test]
    fn a_pre_warm_fill_is_not_demand() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/a".parse().unwrap();
        tracker.track(&tenant, std::slice::from_ref(&key), 0);
        let mut fill = event(1_000, "/a", "ap", Some("t.co"));
        fill.outcome = Outcome::PrefetchFill;
        assert!(!tracker.observe(&fill.borrowed()));
        let t = &tracker.tenants[&tenant];
        let k = &t.keys[&key];
        assert!(!k.touched);
        assert!(k.referrers.is_empty());
        assert_eq!(t.domain_total, 0.0);
        let ap = tracker
            .regions
            .iter()
            .position(|r| r.as_str() == "ap")
            .unwrap();
        assert!(k.region_seen_since(ap, 1_000));
        assert_eq!(k.region_count(ap), 0);

        assert!(tracker.observe(&event(1_100, "/a", "ap", Some("t.co")).borrowed()));
        assert_eq!(tracker.tenants[&tenant].keys[&key].region_count(ap), 1);
    }

    #[test]
    fn only_tracked_keys_keep_history() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/a".parse().unwrap();
        assert!(!tracker.observe(&event(1_000, "/a", "eu", Some("t.co")).borrowed()));
        tracker.track(&tenant, std::slice::from_ref(&key), 1_000);
        assert!(tracker.observe(&event(1_100, "/a", "eu", Some("t.co")).borrowed()));
        assert!(tracker.observe(&event(1_200, "/a", "us", None).borrowed()));
        let k = &tracker.tenants[&tenant].keys[&key];
        let (total, by_domain) = k.referrer_counts(0, 10);
        assert_eq!(total, 2);
        assert_eq!(by_domain.values().sum::<u32>(), 1);
        assert!(k.region_seen_since(0, 1_100) && k.region_seen_since(1, 1_200));
        assert!(!k.region_seen_since(1, 1_201));
        // The tenant baseline saw all three requests.
        assert_eq!(tracker.tenants[&tenant].domain_total, 3.0);
    }

    #[test]
    fn referrer_history_is_bounded_to_a_minute() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/a".parse().unwrap();
        tracker.track(&tenant, std::slice::from_ref(&key), 0);
        for s in 0..200 {
            tracker.observe(&event(s * 1_000, "/a", "eu", Some("t.co")).borrowed());
        }
        assert!(tracker.tenants[&tenant].keys[&key].referrers.len() as u64 <= HISTORY_S + 1);
    }

    #[test]
    fn node_concentration_and_the_tenants_regions() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/a".parse().unwrap();
        tracker.observe(&event(1_000, "/b", "eu", None).borrowed()); // untracked key
        tracker.track(&tenant, std::slice::from_ref(&key), 1_000);
        for i in 0..4 {
            let mut e = event(1_100 + i, "/a", "us", None);
            e.node = if i == 0 { "n2" } else { "n1" }.parse().unwrap();
            tracker.observe(&e.borrowed());
        }
        let t = &tracker.tenants[&tenant];
        assert_eq!(t.keys[&key].top_node_share(), 0.75);
        assert_eq!(t.regions(1_200).count(), 2, "eu (via /b) and us");
        assert_eq!(t.regions(1_000 + TENANT_REGION_MS + 200).count(), 0);
    }

    /// A region whose steady requests for the tenant stopped (drained, failed, steered
    /// away) leaves its fleet once it missed [`QUIET_REQUESTS`] of them, and after
    /// [`QUIET_MIN_MS`] at the soonest; a region that asks seldom stays for its silences;
    /// a request brings a region back.
    #[test]
    fn a_region_whose_requests_stopped_serves_the_tenant_no_more() {
        let mut tracker = Tracker::new(10);
        let tenant: TenantId = "acme".parse().unwrap();
        // 10 requests/s from "busy" for 30 s; one every 20 s from "sparse".
        for ms in (0..30_000).step_by(100) {
            tracker.observe(&event(ms, "/b", "busy", None).borrowed());
        }
        for ms in (0..30_000).step_by(20_000) {
            tracker.observe(&event(ms, "/b", "sparse", None).borrowed());
        }
        let serving = |t: &Tracker, now_ms| {
            let names: Vec<String> = t.tenants[&tenant]
                .regions(now_ms)
                .map(|i| t.regions[i].to_string())
                .collect();
            names
        };
        assert_eq!(serving(&tracker, 30_000), ["busy", "sparse"]);
        // "busy" silent 20 s: 200 requests missed, but under the floor.
        assert_eq!(serving(&tracker, 50_000), ["busy", "sparse"]);
        // Past the floor: "busy" stopped; "sparse" missed about one request.
        assert_eq!(serving(&tracker, 60_000), ["sparse"]);
        tracker.observe(&event(61_000, "/b", "busy", None).borrowed());
        assert_eq!(serving(&tracker, 61_000), ["busy", "sparse"]);
        // "sparse" leaves only after missing its 30 requests, here the 10 minutes' cap.
        assert_eq!(serving(&tracker, 20_000 + TENANT_REGION_MS - 1), ["sparse"]);
    }

    /// A domain's reach is every region it referred any tenant's request in, this
    /// period or the last; older ones fall out; later domains past the cap are unknown.
    #[test]
    fn a_domains_reach_is_its_recent_regions_for_every_tenant() {
        let mut tracker = Tracker::new(10);
        let local = "news.eu.example";
        tracker.observe(&event(1_000, "/a", "eu", Some(local)).borrowed());
        let mut other_tenant = event(2_000, "/b", "us", Some("t.co"));
        other_tenant.tenant = "other".parse().unwrap();
        tracker.observe(&other_tenant.borrowed());
        tracker.observe(&event(3_000, "/c", "ap", Some("t.co")).borrowed());
        tracker.observe(&event(3_000, "/c", "ap", None).borrowed());
        let reach = |t: &Tracker, d| t.reach.regions(d);
        assert_eq!(reach(&tracker, local), Some(0b001), "eu only");
        assert_eq!(
            reach(&tracker, "t.co"),
            Some(0b110),
            "us and ap, both tenants"
        );
        // The next period still remembers them; the one after forgets.
        tracker.observe(&event(REACH_PERIOD_MS + 1, "/a", "us", Some("t.co")).borrowed());
        assert_eq!(reach(&tracker, local), Some(0b001));
        tracker.observe(&event(2 * REACH_PERIOD_MS + 1, "/a", "us", Some("t.co")).borrowed());
        assert_eq!(reach(&tracker, local), None);
        assert_eq!(reach(&tracker, "t.co"), Some(0b010));
        for i in 0..MAX_REACH_DOMAINS + 10 {
            let domain = format!("d{i}.example");
            tracker.observe(&event(2 * REACH_PERIOD_MS + 2, "/a", "eu", Some(&domain)).borrowed());
        }
        assert_eq!(tracker.reach.domains.len(), MAX_REACH_DOMAINS);
        assert_eq!(
            reach(&tracker, &format!("d{MAX_REACH_DOMAINS}.example")),
            None
        );
    }

    #[test]
    fn tracked_keys_are_capped() {
        let mut tracker = Tracker::new(5);
        let tenant: TenantId = "acme".parse().unwrap();
        for i in 0..50u64 {
            let key: CacheKey = format!("/k{i}").parse().unwrap();
            tracker.track(&tenant, &[key], i);
        }
        let keys = &tracker.tenants[&tenant].keys;
        assert_eq!(keys.len(), 5);
        assert!(keys.contains_key(&"/k49".parse::<CacheKey>().unwrap()));
    }

    #[test]
    fn bursts_feed_phase_history_and_tenant_burstiness() {
        let mut tracker = Tracker::new(5);
        let tenant: TenantId = "acme".parse().unwrap();
        let key: CacheKey = "/cron".parse().unwrap();
        tracker.track(&tenant, std::slice::from_ref(&key), 0);
        for minute in 0..3u64 {
            tracker.note_burst(&tenant, &key, true, minute * 60_000);
            tracker.note_burst(&tenant, &key, true, minute * 60_000 + 500); // same burst
            tracker.note_burst(&tenant, &key, false, minute * 60_000 + 5_000);
        }
        assert_eq!(tracker.tenants[&tenant].keys[&key].bursts.len(), 3);
        assert!(tracker.tenants[&tenant].burstiness(0) > 0.0);
    }
}
