//! [`Shares`]: every tenant's share of the node's fill slots, the fair order of
//! their queued fills (deficit round robin), and each origin's adaptive limit.
//!
//! The rule a fill passes to take a slot ([`Shares::has_room`]), in order:
//! 1. a slot is free, and the tenant's origin runs fewer fills than its adaptive
//!    limit, and the tenant holds fewer than its `peak_fills`;
//! 2. the tenant holds fewer slots than its committed share: it may take one; or
//! 3. it borrows: the free slots left after this one still cover the unused
//!    committed shares of every other tenant that is not idle. A `background` fill
//!    never borrows.
//!
//! So a flooding tenant holds its own share plus what idle tenants lend it, and a
//! tenant that wakes up finds its share free, or gets the next released slot.
//!
//! A pre-warm fill passes the same rule as the `background` class (it never
//! borrows) and counts in its tenant's fills and its origin's: one tenant's
//! pre-warms never take another's share, and an origin at its limit gets none.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use models::TenantId;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::adaptive::AdaptiveLimit;
use super::retry_after_secs;
use crate::config::{FlightConfig, PrefetchConfig, RouteConfig, TenantConfig, TrafficClass};

/// Rejections "remembered" for the Retry-After computation decay with this half-life.
const OVERLOAD_HALF_LIFE_S: f64 = 2.0;

/// What a queued fill is told: a slot is its (`Ok`, with the fills its origin runs
/// with it), or it was pushed out of a full queue by a fill of a higher class (`Err`
/// with the `Retry-After` seconds).
pub(super) type Grant = oneshot::Sender<Result<usize, u32>>;

/// A user fill waiting for a slot.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) class: TrafficClass,
    pub(super) grant: Grant,
}

/// One tenant's share and queue.
struct Share {
    id: TenantId,
    /// In the configuration in force (a tenant a reload removed stays until idle).
    configured: bool,
    weight: f64,
    peak: Option<usize>,
    routes: Vec<RouteConfig>,
    committed: usize,
    queue_bound: usize,
    /// Fills it runs, pre-warm fills included.
    active: usize,
    /// The pre-warm fills among them (no sign of user demand).
    prefetching: usize,
    /// Highest class first, first come first served within a class.
    queue: VecDeque<Waiter>,
    deficit: f64,
    last_demand: Option<Instant>,
    origin: usize,
    /// Exponentially decaying count of refusals, and when it was updated.
    overload: f64,
    overload_at: Option<Instant>,
}

/// One origin: its adaptive limit and the user fills it runs.
struct Origin {
    key: String,
    limit: AdaptiveLimit,
    active: usize,
}

/// What the metrics show of one configured tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantFills {
    /// The tenant.
    pub tenant: TenantId,
    /// Its committed share of the fill slots.
    pub committed: usize,
    /// User fills it runs.
    pub active: usize,
    /// User fills it has waiting for a slot.
    pub queued: usize,
    /// Its origin's adaptive limit.
    pub origin_limit: usize,
}

/// Every tenant's share; the fill limiter holds it under its lock.
pub(super) struct Shares {
    shares: Vec<Share>,
    index: HashMap<TenantId, usize>,
    origins: Vec<Origin>,
    /// Deficit round robin: the tenant whose turn it is, and whether its quantum for
    /// this turn is still to be added.
    cursor: usize,
    fresh: bool,
    max_fills: usize,
    max_queued: usize,
    idle: Duration,
    adaptive: bool,
    origin_min: usize,
    tolerance: f64,
    target_ms: Option<u64>,
}

impl Shares {
    pub(super) fn new(flight: &FlightConfig, prefetch: &PrefetchConfig) -> Shares {
        Shares {
            shares: Vec::new(),
            index: HashMap::new(),
            origins: Vec::new(),
            cursor: 0,
            fresh: true,
            max_fills: flight.max_fills,
            max_queued: flight.max_queued_fills,
            idle: Duration::from_millis(flight.share_idle_ms),
            adaptive: flight.adaptive_origin_limit,
            origin_min: flight.origin_min_fills,
            tolerance: prefetch.latency_tolerance,
            target_ms: prefetch.latency_target_ms,
        }
    }

    fn new_origin(&self, key: String) -> Origin {
        let limit = if self.adaptive {
            AdaptiveLimit::slow_start(
                self.origin_min,
                self.max_fills,
                self.tolerance,
                self.target_ms,
            )
        } else {
            AdaptiveLimit::fixed(self.max_fills)
        };
        Origin {
            key,
            limit,
            active: 0,
        }
    }

    fn origin_index(&mut self, key: String) -> usize {
        match self.origins.iter().position(|o| o.key == key) {
            Some(i) => i,
            None => {
                self.origins.push(self.new_origin(key));
                self.origins.len() - 1
            }
        }
    }

    fn blank(id: TenantId, origin: usize) -> Share {
        Share {
            id,
            configured: false,
            weight: 1.0,
            peak: None,
            routes: Vec::new(),
            committed: 1,
            queue_bound: 1,
            active: 0,
            prefetching: 0,
            queue: VecDeque::new(),
            deficit: 0.0,
            last_demand: None,
            origin,
            overload: 0.0,
            overload_at: None,
        }
    }

    /// Puts `tenants`' weights, peaks, routes and origins in force, keeping the
    /// fills, queues and origin limits of the tenants and origins that stay.
    pub(super) fn set_tenants(&mut self, tenants: &[TenantConfig]) {
        let mut old: HashMap<TenantId, (Share, String)> = HashMap::new();
        for s in std::mem::take(&mut self.shares) {
            let key = self.origins[s.origin].key.clone();
            old.insert(s.id.clone(), (s, key));
        }
        let mut old_origins: HashMap<String, Origin> = std::mem::take(&mut self.origins)
            .into_iter()
            .map(|o| (o.key.clone(), o))
            .collect();
        let mut origins: Vec<Origin> = Vec::new();
        let mut place = |key: String, fills: usize| {
            let i = match origins.iter().position(|o| o.key == key) {
                Some(i) => i,
                None => {
                    let origin = match old_origins.remove(&key) {
                        Some(mut o) => {
                            // Counted again below, from the tenants that keep it.
                            o.active = 0;
                            o
                        }
                        None => self.new_origin(key),
                    };
                    origins.push(origin);
                    origins.len() - 1
                }
            };
            origins[i].active += fills;
            i
        };
        let mut shares = Vec::new();
        for t in tenants {
            let mut share = match old.remove(&t.id) {
                Some((s, _)) => s,
                None => Self::blank(t.id.clone(), 0),
            };
            // A tenant whose origin changed takes its running fills along: they end
            // on the new one's count.
            share.origin = place(origin_key(&t.origin), share.active);
            share.configured = true;
            share.weight = t.weight;
            share.peak = t.peak_fills;
            share.routes = t.routes.clone();
            shares.push(share);
        }
        // Removed tenants with fills running or queued stay until they drain.
        for (_, (mut s, key)) in old.drain() {
            if s.active > 0 || !s.queue.is_empty() {
                s.configured = false;
                s.origin = place(key, s.active);
                shares.push(s);
            }
        }
        self.origins = origins;
        self.install(shares);
    }

    /// Takes `shares` as the tenants, with their committed shares and queue bounds.
    fn install(&mut self, shares: Vec<Share>) {
        self.shares = shares;
        let total: f64 = self.shares.iter().map(|s| s.weight).sum();
        for s in &mut self.shares {
            let part = s.weight / total;
            s.committed = ((self.max_fills as f64 * part).floor() as usize).max(1);
            // At least one place each, unless the node queues no fill at all.
            s.queue_bound =
                ((self.max_queued as f64 * part).floor() as usize).max(self.max_queued.min(1));
        }
        self.index = self
            .shares
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i))
            .collect();
        self.cursor = 0;
        self.fresh = true;
    }

    /// The index of `tenant`'s share; one with weight 1 and its own origin for a
    /// tenant the configuration does not name (not reachable from a request).
    pub(super) fn index_of(&mut self, tenant: &TenantId) -> usize {
        if let Some(&i) = self.index.get(tenant) {
            return i;
        }
        let origin = self.origin_index(format!("unconfigured/{tenant}"));
        let mut shares = std::mem::take(&mut self.shares);
        shares.push(Self::blank(tenant.clone(), origin));
        self.install(shares);
        self.shares.len() - 1
    }

    /// Drops the shares of tenants no longer configured once they are idle.
    pub(super) fn prune(&mut self, t: usize) {
        let s = &self.shares[t];
        if !s.configured && s.active == 0 && s.queue.is_empty() {
            let mut shares = std::mem::take(&mut self.shares);
            shares.remove(t);
            self.install(shares);
        }
    }

    /// The class of `tenant`'s request for `method` and `path`.
    pub(super) fn class_of(&self, tenant: &TenantId, method: &str, path: &str) -> TrafficClass {
        self.index.get(tenant).map_or(TrafficClass::Static, |&i| {
            crate::config::class_of(&self.shares[i].routes, method, path)
        })
    }

    /// Notes that tenant `t` wants a fill now (it is not idle).
    pub(super) fn touch(&mut self, t: usize, now: Instant) {
        self.shares[t].last_demand = Some(now);
    }

    fn recently_active(&self, s: &Share, now: Instant) -> bool {
        s.active > s.prefetching
            || !s.queue.is_empty()
            || s.last_demand
                .is_some_and(|at| now.saturating_duration_since(at) < self.idle)
    }

    /// Whether tenant `t` may take one of `free` slots for a fill of `class` (the
    /// rule in the module docs).
    pub(super) fn has_room(
        &self,
        t: usize,
        class: TrafficClass,
        free: usize,
        now: Instant,
    ) -> bool {
        let s = &self.shares[t];
        let origin = &self.origins[s.origin];
        if free == 0 || origin.active >= origin.limit.get() || s.peak.is_some_and(|p| s.active >= p)
        {
            return false;
        }
        if s.active < s.committed {
            return true;
        }
        if class == TrafficClass::Background {
            return false;
        }
        let owed: usize = self
            .shares
            .iter()
            .enumerate()
            .filter(|&(i, o)| i != t && self.recently_active(o, now))
            .map(|(_, o)| o.committed.saturating_sub(o.active))
            .sum();
        free > owed
    }

    /// Whether tenant `t` has a fill of `class` or higher waiting (a new one waits
    /// behind it).
    pub(super) fn queued_at_or_above(&self, t: usize, class: TrafficClass) -> bool {
        self.shares[t].queue.iter().any(|w| w.class >= class)
    }

    /// Queues `waiter` for tenant `t`, in class order. A full queue pushes out its
    /// newest fill of the lowest class below `waiter`'s (returned, to be told), or
    /// refuses `waiter` (returned as the error).
    pub(super) fn enqueue(&mut self, t: usize, waiter: Waiter) -> Result<Option<Waiter>, Waiter> {
        let s = &mut self.shares[t];
        let mut evicted = None;
        if s.queue.len() >= s.queue_bound {
            let lowest = s.queue.back().map(|w| w.class);
            match lowest {
                Some(c) if c < waiter.class => evicted = s.queue.pop_back(),
                _ => return Err(waiter),
            }
        }
        let at = s.queue.partition_point(|w| w.class >= waiter.class);
        s.queue.insert(at, waiter);
        Ok(evicted)
    }

    /// Takes waiter `id` out of tenant `t`'s queue; whether it was there.
    pub(super) fn remove_waiter(&mut self, t: usize, id: u64) -> bool {
        let queue = &mut self.shares[t].queue;
        match queue.iter().position(|w| w.id == id) {
            Some(at) => {
                queue.remove(at);
                true
            }
            None => false,
        }
    }

    /// The tenant whose queued fill takes the next of `free` slots: deficit round
    /// robin over the tenants whose head fill has room, each served `weight` (over
    /// the smallest weight) fills per turn.
    pub(super) fn next_fair(&mut self, free: usize, now: Instant) -> Option<usize> {
        let n = self.shares.len();
        let smallest = self
            .shares
            .iter()
            .map(|s| s.weight)
            .fold(f64::INFINITY, f64::min);
        for _ in 0..=n {
            let t = self.cursor % n.max(1);
            if n == 0 {
                return None;
            }
            let ready = self.shares[t]
                .queue
                .front()
                .is_some_and(|w| self.has_room(t, w.class, free, now));
            let s = &mut self.shares[t];
            if ready {
                if self.fresh {
                    s.deficit += s.weight / smallest;
                    self.fresh = false;
                }
                if s.deficit >= 1.0 {
                    s.deficit -= 1.0;
                    return Some(t);
                }
            } else if s.queue.is_empty() {
                s.deficit = 0.0;
            }
            self.cursor = (t + 1) % n;
            self.fresh = true;
        }
        None
    }

    /// The next waiter of tenant `t` (after [`Shares::next_fair`] chose it).
    pub(super) fn pop(&mut self, t: usize) -> Option<Waiter> {
        self.shares[t].queue.pop_front()
    }

    /// Tenant `t` starts a user fill.
    /// Tenant `t` starts a user fill; returns the fills its origin runs with it.
    pub(super) fn start(&mut self, t: usize) -> usize {
        let s = &mut self.shares[t];
        s.active += 1;
        let origin = &mut self.origins[s.origin];
        origin.active += 1;
        origin.active
    }

    /// Tenant `t` ends a user fill.
    pub(super) fn finish(&mut self, t: usize) {
        let s = &mut self.shares[t];
        s.active -= 1;
        let origin = &mut self.origins[s.origin];
        origin.active = origin.active.saturating_sub(1);
    }

    /// Tenant `t` starts a pre-warm fill (after `has_room` for `background`); returns
    /// the fills its origin runs with it.
    pub(super) fn start_prefetch(&mut self, t: usize) -> usize {
        self.shares[t].prefetching += 1;
        self.start(t)
    }

    /// Tenant `t` ends a pre-warm fill.
    pub(super) fn finish_prefetch(&mut self, t: usize) {
        self.shares[t].prefetching -= 1;
        self.finish(t);
    }

    /// Feeds a fill's latency to tenant `t`'s origin limit, with the fills the
    /// origin ran when it was sent; whether the limit grew.
    pub(super) fn record(
        &mut self,
        t: usize,
        latency: Option<Duration>,
        now: Instant,
        sent_with: usize,
    ) -> bool {
        let origin = &mut self.origins[self.shares[t].origin];
        origin.limit.record(latency, now, sent_with, origin.active)
    }

    /// Records one refusal of tenant `t` and returns the `Retry-After` seconds for
    /// it: the origin's usual fill time, grown with the tenant's recent refusals per
    /// committed slot and with its origin limit's error, jittered by `u` in [0, 1).
    pub(super) fn refuse(&mut self, t: usize, now: Instant, u: f64, max_s: u32) -> u32 {
        let s = &mut self.shares[t];
        let decayed = match s.overload_at {
            Some(at) => {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                s.overload * 0.5f64.powf(dt / OVERLOAD_HALF_LIFE_S)
            }
            None => 0.0,
        };
        s.overload = decayed + 1.0;
        s.overload_at = Some(now);
        let limit = &self.origins[s.origin].limit;
        let base_s = limit.usual_ms().map_or(1.0, |ms| ms / 1000.0);
        let error = s.overload / s.committed as f64 + limit.error();
        retry_after_secs(base_s, error, u, max_s)
    }

    /// Tenant `t`'s id and whether the configuration names it (a metric label).
    pub(super) fn label(&self, t: usize) -> Option<&TenantId> {
        let s = &self.shares[t];
        s.configured.then_some(&s.id)
    }

    /// What the metrics show, for the configured tenants.
    pub(super) fn snapshot(&self) -> Vec<TenantFills> {
        self.shares
            .iter()
            .filter(|s| s.configured)
            .map(|s| self.fills(s))
            .collect()
    }

    /// What one tenant's share shows, configured or not (while it has fills).
    pub(super) fn fills_of(&self, tenant: &TenantId) -> Option<TenantFills> {
        self.index.get(tenant).map(|&t| self.fills(&self.shares[t]))
    }

    fn fills(&self, s: &Share) -> TenantFills {
        TenantFills {
            tenant: s.id.clone(),
            committed: s.committed,
            active: s.active,
            queued: s.queue.len(),
            origin_limit: self.origins[s.origin].limit.get(),
        }
    }
}

/// The origin a tenant's fills go to: its URL's scheme and authority (tenants on
/// one origin server share its limit).
fn origin_key(origin: &str) -> String {
    crate::config::parse_origin(origin).map_or_else(|_| origin.to_string(), |(base, _)| base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: &str, weight: f64) -> TenantConfig {
        TenantConfig {
            id: TenantId::new(id).unwrap(),
            hosts: Vec::new(),
            origin: format!("http://{id}.example"),
            host_header: None,
            weight,
            peak_fills: None,
            routes: Vec::new(),
            origin_hints: None,
        }
    }

    fn waiter(id: u64, class: TrafficClass) -> Waiter {
        Waiter {
            id,
            class,
            grant: oneshot::channel().0,
        }
    }

    fn shares(max_fills: usize, tenants: &[TenantConfig]) -> Shares {
        let flight = FlightConfig {
            max_fills,
            max_queued_fills: 100,
            ..FlightConfig::default()
        };
        let mut s = Shares::new(&flight, &PrefetchConfig::default());
        s.set_tenants(tenants);
        s
    }

    /// Deficit round robin: with weights 1 and 2, queued fills are served one of
    /// `a`'s for two of `b`'s, whatever order they were queued in.
    #[test]
    fn queued_fills_are_served_in_weighted_fair_order() {
        let mut s = shares(30, &[tenant("a", 1.0), tenant("b", 2.0)]);
        for id in 0..6 {
            s.enqueue(0, waiter(id, TrafficClass::Static)).unwrap();
        }
        for id in 6..12 {
            s.enqueue(1, waiter(id, TrafficClass::Static)).unwrap();
        }
        let now = Instant::now();
        let order: String = (0..9)
            .map(|_| {
                let t = s.next_fair(30, now).unwrap();
                s.pop(t);
                if t == 0 { 'a' } else { 'b' }
            })
            .collect();
        assert_eq!(order, "abbabbabb");
    }

    /// A full queue refuses a fill of its lowest class and pushes the newest of a
    /// lower class out for a higher one; higher classes are served first.
    #[test]
    fn a_full_queue_refuses_the_lowest_class_first() {
        let flight = FlightConfig {
            max_fills: 2,
            max_queued_fills: 3,
            ..FlightConfig::default()
        };
        let mut s = Shares::new(&flight, &PrefetchConfig::default());
        s.set_tenants(&[tenant("a", 1.0)]);
        s.enqueue(0, waiter(1, TrafficClass::Background)).unwrap();
        s.enqueue(0, waiter(2, TrafficClass::Static)).unwrap();
        s.enqueue(0, waiter(3, TrafficClass::Static)).unwrap();
        let out = s
            .enqueue(0, waiter(4, TrafficClass::Static))
            .unwrap()
            .unwrap();
        assert_eq!(out.id, 1, "the background fill goes first");
        assert!(s.enqueue(0, waiter(5, TrafficClass::Static)).is_err());
        let out = s.enqueue(0, waiter(6, TrafficClass::Api)).unwrap().unwrap();
        assert_eq!(out.id, 4, "then the newest static one");
        let out = s
            .enqueue(0, waiter(7, TrafficClass::Critical))
            .unwrap()
            .unwrap();
        assert_eq!(out.id, 3);
        let order: Vec<u64> = std::iter::from_fn(|| s.pop(0).map(|w| w.id)).collect();
        assert_eq!(order, [7, 6, 2]);
    }

    /// Committed shares follow the weights; a reload keeps what runs and drops a
    /// removed tenant once it is idle.
    #[test]
    fn committed_shares_follow_weights_and_survive_a_reload() {
        let mut s = shares(100, &[tenant("a", 1.0), tenant("b", 3.0)]);
        assert_eq!(s.snapshot()[0].committed, 25);
        assert_eq!(s.snapshot()[1].committed, 75);
        s.start(0);
        s.set_tenants(&[tenant("b", 1.0), tenant("c", 1.0)]);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 2, "a is not configured any more");
        assert_eq!(snap[0].committed, 33, "a still counts while it drains");
        let a = s.index_of(&TenantId::new("a").unwrap());
        assert_eq!(s.label(a), None, "no metric label for a removed tenant");
        s.finish(a);
        s.prune(a);
        assert_eq!(s.snapshot()[0].committed, 50);
    }
}
