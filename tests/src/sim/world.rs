//! The engine: the fleet's tiers (edge nodes, then one shield per region), each with
//! the production [`FlightRegistry`] and [`FillLimiter`], the fills in flight, the
//! origin model, the clients' timeouts and retries, and the pre-warm commands.
//!
//! Invariants:
//! - A tier's `open` map names a fill only while the registry holds its flight (both
//!   are updated together when the fill ends); a collapsing tier routes a joiner to it.
//! - Every fill ends exactly once ([`World::finish`]): its permit completes or fails,
//!   its slot is released after reporting its latency, its clients and downstream
//!   fills get the result.
//! - Only the seeded generators decide anything: no wall clock, no map iteration.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use models::{CacheKey, NodeId, Outcome, Priority, RegionId, TenantId};
use prefetcher::{Acquire, FillError, FillLimiter, FlightConfig, FlightKey, FlightRegistry};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::config::{HOT_RANKS, SimConfig};
use super::fill::{Client, Fill, Requester, Slot};
use super::load::{Zipf, stochastic_round};
use super::pulse_side::{PulseSide, Sampler};
use super::report::{Counters, Recorder, SimReport};
use super::trace::Trace;
use crate::scenario::Setup;

/// A client retry: (due ms, sequence, node, key, requests, attempt, first attempt ms),
/// earliest first.
type Retry = Reverse<(u64, u64, u32, u32, u64, u8, u64)>;

/// A cached object at one tier.
#[derive(Debug, Clone, Copy)]
struct Entry {
    expires_ms: u64,
    stored_ms: u64,
    prefetched: bool,
    used: bool,
}

/// An edge node or a regional shield.
struct Tier {
    region: usize,
    registry: FlightRegistry,
    limiter: FillLimiter,
    cache: HashMap<u32, Entry>,
    open: HashMap<u32, usize>,
}

/// The whole simulated fleet for one set-up.
pub(super) struct World<'a> {
    cfg: &'a SimConfig,
    setup: Setup,
    load_rng: StdRng,
    ttl_rng: StdRng,
    sample_rng: StdRng,
    zipf: Zipf,
    keys: Vec<FlightKey>,
    key_index: HashMap<String, u32>,
    viral: u32,
    /// Lines of the replayed log sent so far.
    replayed: usize,
    /// Requests per second per node for each simulated hot background key.
    hot_rate: Vec<f64>,
    regions: Vec<RegionId>,
    node_ids: Vec<NodeId>,
    nodes: usize,
    tiers: Vec<Tier>,
    fills: Vec<Option<Fill>>,
    free: Vec<usize>,
    waiting_slot: Vec<usize>,
    /// Requests the origin is serving now (sampled tail fills weigh several).
    origin_active: f64,
    seq: u64,
    completions: BinaryHeap<Reverse<(u64, u64, usize)>>,
    expiries: BinaryHeap<Reverse<(u64, u32, u32)>>,
    retries: BinaryHeap<Retry>,
    missing: BTreeSet<(u32, u32)>,
    pulse: Option<PulseSide>,
    viral_samplers: Vec<Sampler>,
    background_sampler: Sampler,
    rec: Recorder,
}

impl<'a> World<'a> {
    pub(super) fn new(cfg: &'a SimConfig, setup: Setup) -> World<'a> {
        let tenant = TenantId::new("sim").expect("valid tenant");
        let mut keys: Vec<FlightKey> = match &cfg.replay {
            Some(log) => log.keys.iter().map(|k| key(&tenant, k)).collect(),
            None => (0..cfg.keys)
                .map(|i| key(&tenant, &cfg.key_path(i)))
                .collect(),
        };
        let key_count = keys.len();
        keys.push(key(&tenant, "/viral/story.json"));
        let key_index = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.key().as_str().to_owned(), i as u32))
            .collect();
        let zipf = Zipf::new(key_count.max(1), cfg.zipf_exponent);
        let nodes = cfg.nodes();
        // A replayed log's keys are all drawn from the log, one request at a time.
        let hot_rate = if cfg.replay.is_some() {
            Vec::new()
        } else {
            (0..cfg.hot_keys.min(cfg.keys))
                .map(|k| cfg.background_rps * zipf.p(k) / nodes as f64)
                .collect()
        };
        let regions: Vec<RegionId> = (0..cfg.regions)
            .map(|r| RegionId::new(format!("region-{r}")).expect("valid region"))
            .collect();
        let node_ids = (0..nodes)
            .map(|n| {
                NodeId::new(format!(
                    "pop-{}-node-{}",
                    n / cfg.nodes_per_pop,
                    n % cfg.nodes_per_pop
                ))
                .expect("valid node")
            })
            .collect();
        let tier = |region: usize, flight: &FlightConfig| Tier {
            region,
            registry: FlightRegistry::new(flight.max_flights),
            limiter: FillLimiter::new(flight, &cfg.prefetch),
            cache: HashMap::new(),
            open: HashMap::new(),
        };
        let mut tiers: Vec<Tier> = (0..nodes)
            .map(|n| tier(cfg.region_of(n), &cfg.node_flight))
            .collect();
        if has_shields(setup) {
            tiers.extend((0..cfg.regions).map(|r| tier(r, &cfg.shield_flight)));
        }
        let pulse =
            (setup == Setup::Prewarm).then(|| PulseSide::new(tenant.clone(), cfg.command_delay_ms));
        World {
            cfg,
            setup,
            load_rng: StdRng::seed_from_u64(cfg.seed),
            ttl_rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed_0001),
            sample_rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed_0002),
            zipf,
            viral: key_count as u32,
            replayed: 0,
            keys,
            key_index,
            hot_rate,
            regions,
            node_ids,
            nodes,
            tiers,
            fills: Vec::new(),
            free: Vec::new(),
            waiting_slot: Vec::new(),
            origin_active: 0.0,
            seq: 0,
            completions: BinaryHeap::new(),
            expiries: BinaryHeap::new(),
            retries: BinaryHeap::new(),
            missing: BTreeSet::new(),
            pulse,
            viral_samplers: vec![Sampler::default(); cfg.regions],
            background_sampler: Sampler::default(),
            rec: Recorder::new(cfg),
        }
    }

    /// Runs the set-up to its end on tokio's paused clock.
    pub(super) async fn run(mut self, progress: &mut dyn FnMut(u64, &Counters)) -> SimReport {
        self.warm_start();
        let dt = self.cfg.tick_ms;
        let end = self.cfg.duration_s * 1000;
        let mut trace = self.cfg.trace.as_ref().map(|prefix| {
            Trace::create(prefix, self.setup).expect("the trace file can be created")
        });
        let mut now = 0;
        while now < end {
            now += dt;
            tokio::time::advance(Duration::from_millis(dt)).await;
            self.tick(now, dt);
            if self.origin_active > self.cfg.origin.capacity {
                self.rec.counters.origin_over_capacity_ms += dt;
            }
            if let Some(trace) = &mut trace {
                let latency = self.cfg.origin.latency_ms(self.origin_active);
                let nodes = self.tiers[..self.nodes].iter().map(|t| &t.limiter);
                let tenant = self.keys[self.viral as usize].tenant();
                trace.row(now, self.origin_active, latency, tenant, nodes);
            }
            if now % 1000 == 0 {
                let in_flight = self.tiers.iter().map(|t| t.registry.len() as u64).sum();
                self.rec.counters.registry_peak_in_flight =
                    self.rec.counters.registry_peak_in_flight.max(in_flight);
            }
            if now % 10_000 == 0 {
                progress(now / 1000, &self.rec.counters);
            }
        }
        let counts = self.pulse.as_ref().map(|p| p.counts());
        if let Some(p) = &self.pulse {
            self.rec.counters.pulse_events = p.applied;
            self.rec.counters.pulse_refused = p.refused;
        }
        self.rec.report(self.setup, counts)
    }

    /// Every node and shield starts with the hot background keys cached, each entry at
    /// a random point of its TTL: the steady state, not a cold start.
    fn warm_start(&mut self) {
        let hot = self.hot_rate.len() as u32;
        for t in 0..self.tiers.len() {
            for k in 0..hot {
                let expires_ms =
                    (self.ttl_rng.random::<f64>() * self.cfg.ttl_ms() as f64) as u64 + 1;
                self.store(t, k, 0, expires_ms, false);
            }
        }
    }

    fn tick(&mut self, now: u64, dt: u64) {
        while let Some(Reverse((at, _, id))) = self.completions.peek().copied() {
            if at > now {
                break;
            }
            self.completions.pop();
            self.origin_active -= self.fills[id].as_ref().map_or(0.0, |f| f.weight);
            self.finish(id, at, Ok(()));
        }
        while let Some(Reverse((at, node, key))) = self.expiries.peek().copied() {
            if at > now {
                break;
            }
            self.expiries.pop();
            let tier = &mut self.tiers[node as usize];
            if tier.cache.get(&key).is_some_and(|e| e.expires_ms == at) {
                let entry = tier.cache.remove(&key).expect("checked");
                if entry.prefetched && !entry.used {
                    self.rec.prewarm_wasted += 1;
                }
                self.missing.insert((node, key));
            }
        }
        while let Some(Reverse((at, _, node, key, count, attempt, first))) =
            self.retries.peek().copied()
        {
            if at > now {
                break;
            }
            self.retries.pop();
            let client = Client {
                count: count as f64,
                first_ms: first,
                attempt,
                target: None,
            };
            self.rec.counters.retries += count;
            self.user_request(now, node as usize, key, client);
        }
        if self.cfg.replay.is_some() {
            self.replay_arrivals(now);
        } else {
            self.background_arrivals(now, dt);
            self.viral_arrivals(now, dt);
        }
        self.poll_slots(now);
        self.time_out_clients(now);
        self.run_pulse(now, dt);
    }

    fn background_arrivals(&mut self, now: u64, dt: u64) {
        let secs = dt as f64 / 1000.0;
        let missing: Vec<(u32, u32)> = self.missing.iter().copied().collect();
        for (node, key) in missing {
            let n = stochastic_round(self.hot_rate[key as usize] * secs, &mut self.load_rng);
            if n > 0 {
                self.user_request(now, node as usize, key, Client::new(n as f64, now));
            }
        }
        let hot = self.hot_rate.len();
        let tail_rps = self.cfg.background_rps * self.zipf.tail_share(hot);
        let sample = self.cfg.tail_sample.max(1) as f64;
        if hot < self.cfg.keys {
            let m = stochastic_round(tail_rps * secs / sample, &mut self.load_rng);
            for _ in 0..m {
                let node = self.load_rng.random_range(0..self.nodes);
                let key = self.zipf.sample_from(hot, &mut self.load_rng) as u32;
                self.user_request(now, node, key, Client::new(sample, now));
            }
        }
    }

    /// The log's lines up to `now`, each at `scale` nodes drawn at random.
    fn replay_arrivals(&mut self, now: u64) {
        let log = std::sync::Arc::clone(self.cfg.replay.as_ref().expect("replaying"));
        while let Some(&(at, key)) = log.requests.get(self.replayed) {
            if at >= now {
                break;
            }
            self.replayed += 1;
            for i in 0..log.scale {
                let node = self.load_rng.random_range(0..self.nodes);
                let outcome = self.user_request(now, node, key, Client::new(1.0, now));
                if i == 0 {
                    self.emit(now, node, key, outcome, 1);
                }
            }
        }
    }

    fn viral_arrivals(&mut self, now: u64, dt: u64) {
        let per_region = self.cfg.nodes_per_region();
        let per_node = self.cfg.viral_rps * dt as f64 / 1000.0 / per_region as f64;
        for r in 0..self.cfg.regions {
            if now < self.cfg.viral_start_ms(r) {
                continue;
            }
            for i in 0..per_region {
                let node = r * per_region + i;
                let n = stochastic_round(per_node, &mut self.load_rng);
                if n == 0 {
                    continue;
                }
                let outcome = self.user_request(now, node, self.viral, Client::new(n as f64, now));
                let events = self.viral_samplers[r].take(n as f64, self.cfg.event_scale);
                self.emit(now, node, self.viral, outcome, events);
            }
        }
    }

    fn emit(&mut self, now: u64, node: usize, key: u32, outcome: Outcome, events: u32) {
        if let Some(pulse) = &mut self.pulse {
            let region = &self.regions[self.tiers[node].region];
            for _ in 0..events {
                pulse.event(
                    now,
                    self.keys[key as usize].key(),
                    region,
                    &self.node_ids[node],
                    outcome,
                    key == self.viral,
                );
            }
        }
    }

    fn run_pulse(&mut self, now: u64, dt: u64) {
        if self.pulse.is_none() {
            return;
        }
        let background = if self.cfg.replay.is_some() {
            0.0
        } else {
            self.cfg.background_rps
        };
        let events = self
            .background_sampler
            .take(background * dt as f64 / 1000.0, self.cfg.event_scale);
        for _ in 0..events {
            let key = self.zipf.sample_from(0, &mut self.sample_rng) as u32;
            let node = self.sample_rng.random_range(0..self.nodes);
            let outcome = if self.fresh(node, key, now) {
                Outcome::Hit
            } else {
                Outcome::Miss
            };
            self.emit(now, node, key, outcome, 1);
        }
        let pulse = self.pulse.as_mut().expect("checked");
        pulse.tick(now);
        for command in pulse.delivered(now) {
            self.rec.counters.commands_delivered += 1;
            let Some(&key) = self.key_index.get(command.key.as_str()) else {
                continue;
            };
            for node in 0..self.nodes {
                if command
                    .regions
                    .includes(&self.regions[self.tiers[node].region])
                {
                    self.prefetch(now, node, key);
                }
            }
        }
    }

    fn fresh(&self, tier: usize, key: u32, now: u64) -> bool {
        self.tiers[tier]
            .cache
            .get(&key)
            .is_some_and(|e| e.expires_ms > now)
    }

    fn is_hot(&self, key: u32) -> bool {
        key == self.viral || (key as usize) < HOT_RANKS
    }

    /// A client request at an edge node; returns how the node answered it.
    fn user_request(&mut self, now: u64, node: usize, key: u32, client: Client) -> Outcome {
        let client = Client {
            target: Some((node as u32, key)),
            ..client
        };
        let hot = self.is_hot(key);
        self.rec.request(now, client.count, hot);
        if self.fresh(node, key, now) {
            let entry = self.tiers[node].cache.get_mut(&key).expect("fresh");
            let mut outcome = Outcome::Hit;
            if entry.prefetched && !entry.used {
                entry.used = true;
                self.rec.prewarm_used(now - entry.stored_ms);
                outcome = Outcome::PrefetchUseful;
            }
            self.rec.hit(now, &client, hot);
            return outcome;
        }
        self.route_miss(now, node, key, Requester::Client(client), false)
    }

    /// A pre-warm command at one node: a background fill unless the key is cached or
    /// already in flight there.
    fn prefetch(&mut self, now: u64, node: usize, key: u32) {
        if self.fresh(node, key, now) || self.tiers[node].open.contains_key(&key) {
            return;
        }
        let Some(permit) = self.tiers[node]
            .registry
            .try_lead(&self.keys[key as usize], Priority::Background)
        else {
            return;
        };
        self.rec.counters.prefetch_fills += 1;
        let id = self.new_fill(now, node, key, permit, true, true, self.weight(key));
        self.start_slot(now, id);
    }

    fn weight(&self, key: u32) -> f64 {
        if self.cfg.replay.is_some() || (key as usize) < self.hot_rate.len() || key == self.viral {
            1.0
        } else {
            self.cfg.tail_sample.max(1) as f64
        }
    }

    fn collapses(&self, tier: usize) -> bool {
        tier >= self.nodes || self.setup != Setup::NoCollapsing
    }

    /// A miss at `tier`: lead a fill, join the one in flight, or be turned away.
    fn route_miss(
        &mut self,
        now: u64,
        tier: usize,
        key: u32,
        who: Requester,
        prefetch_cause: bool,
    ) -> Outcome {
        let flight_key = &self.keys[key as usize];
        let weight = match &who {
            Requester::Client(c) if (key as usize) >= self.hot_rate.len() && key != self.viral => {
                c.count
            }
            _ => 1.0,
        };
        if !self.collapses(tier) {
            // Without collapsing every request of the group is a fill of its own (a
            // sampled tail request stands for requests for other keys: one weighted fill).
            let alone: Vec<Requester> = match who {
                Requester::Client(c) if weight == 1.0 && c.count > 1.0 => (0..c.count.ceil()
                    as u32)
                    .map(|i| {
                        Requester::Client(Client {
                            count: (c.count - i as f64).min(1.0),
                            ..c
                        })
                    })
                    .collect(),
                who => vec![who],
            };
            for who in alone {
                let permit = self.tiers[tier]
                    .registry
                    .lead_alone(&self.keys[key as usize], Priority::User);
                self.rec.counters.fills_led += 1;
                let id = self.new_fill(now, tier, key, permit, false, prefetch_cause, weight);
                self.fills[id].as_mut().expect("new").add(who);
                self.start_slot(now, id);
            }
            return Outcome::Miss;
        }
        match self.tiers[tier]
            .registry
            .acquire(flight_key, Priority::User)
        {
            Acquire::Lead(permit) => {
                self.rec.counters.fills_led += 1;
                let id = self.new_fill(now, tier, key, permit, false, prefetch_cause, weight);
                self.fills[id].as_mut().expect("new").add(who);
                self.start_slot(now, id);
                Outcome::Miss
            }
            Acquire::Join(subscriber) => {
                drop(subscriber);
                self.rec.counters.joins += 1;
                let id = self.tiers[tier].open[&key];
                self.fills[id].as_mut().expect("open fill").add(who);
                Outcome::Collapsed
            }
            Acquire::Full => {
                self.reject(now, who, FillError::Overloaded { retry_after_s: 1 });
                Outcome::Miss
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn new_fill(
        &mut self,
        now: u64,
        tier: usize,
        key: u32,
        permit: prefetcher::FillPermit,
        prefetch: bool,
        prefetch_cause: bool,
        weight: f64,
    ) -> usize {
        let _ = now;
        let fill = Fill::new(tier, key, permit, prefetch, prefetch_cause, weight);
        let id = match self.free.pop() {
            Some(id) => {
                self.fills[id] = Some(fill);
                id
            }
            None => {
                self.fills.push(Some(fill));
                self.fills.len() - 1
            }
        };
        if self.collapses(tier) || prefetch {
            self.tiers[tier].open.insert(key, id);
        }
        id
    }

    fn start_slot(&mut self, now: u64, id: usize) {
        let fill = self.fills[id].as_mut().expect("live fill");
        let limiter = self.tiers[fill.tier].limiter.clone();
        let tenant = self.keys[fill.key as usize].tenant().clone();
        fill.slot = Slot::waiting(limiter, fill.prefetch, tenant);
        if !self.poll_slot(now, id) {
            self.waiting_slot.push(id);
        }
    }

    /// Polls one fill's slot request; `true` once it no longer waits.
    fn poll_slot(&mut self, now: u64, id: usize) -> bool {
        let fill = self.fills[id].as_mut().expect("live fill");
        let Slot::Waiting(future) = &mut fill.slot else {
            return true;
        };
        let mut cx = Context::from_waker(Waker::noop());
        let polled = future.as_mut().poll(&mut cx);
        match polled {
            Poll::Pending => false,
            Poll::Ready(Ok(slot)) => {
                fill.slot = Slot::Held(slot, now);
                self.send_upstream(now, id);
                true
            }
            Poll::Ready(Err(e)) => {
                fill.slot = Slot::Free;
                match e {
                    FillError::NoCapacity => self.rec.counters.prefetch_shed += 1,
                    _ => self.rec.counters.limiter_overloaded += 1,
                }
                self.finish(id, now, Err(e));
                true
            }
        }
    }

    fn poll_slots(&mut self, now: u64) {
        for id in std::mem::take(&mut self.waiting_slot) {
            if self.fills[id].is_some() && !self.poll_slot(now, id) {
                self.waiting_slot.push(id);
            }
        }
    }

    fn send_upstream(&mut self, now: u64, id: usize) {
        let (tier, key, cause, weight) = {
            let f = self.fills[id].as_ref().expect("live fill");
            (f.tier, f.key, f.prefetch_cause, f.weight)
        };
        if tier < self.nodes && has_shields(self.setup) {
            let shield = self.nodes + self.tiers[tier].region;
            if self.fresh(shield, key, now) {
                self.finish(id, now, Ok(()));
            } else {
                self.route_miss(now, shield, key, Requester::Fill(id), cause);
            }
            return;
        }
        self.origin_active += weight;
        let peak = &mut self.rec.counters.origin_peak_active;
        *peak = peak.max(self.origin_active);
        let latency = self.cfg.origin.latency_ms(self.origin_active);
        self.seq += 1;
        self.completions
            .push(Reverse((now + latency, self.seq, id)));
        self.rec.origin_fill(now, weight, cause);
    }

    fn reject(&mut self, now: u64, who: Requester, error: FillError) {
        match who {
            Requester::Client(client) => self.retry_or_fail(now, client),
            Requester::Fill(id) => self.finish(id, now, Err(error)),
        }
    }

    fn retry_or_fail(&mut self, now: u64, client: Client) {
        if client.attempt < self.cfg.max_retries {
            let backoff = self.cfg.retry_backoff_ms as f64 * (1.0 + self.load_rng.random::<f64>());
            self.seq += 1;
            let (node, key) = client_target(&client);
            self.retries.push(Reverse((
                now + backoff as u64,
                self.seq,
                node,
                key,
                client.count as u64,
                client.attempt + 1,
                client.first_ms,
            )));
        } else {
            self.rec.failed(now, &client);
        }
    }

    fn time_out_clients(&mut self, now: u64) {
        let timeout = self.cfg.client_timeout_ms;
        let mut gave_up = Vec::new();
        for fill in self.fills.iter_mut().flatten() {
            if fill.clients.iter().any(|c| now - c.first_ms >= timeout) {
                let (late, waiting): (Vec<Client>, Vec<Client>) = fill
                    .clients
                    .drain(..)
                    .partition(|c| now - c.first_ms >= timeout);
                fill.clients = waiting;
                gave_up.extend(late);
            }
        }
        for client in gave_up {
            self.rec.counters.timeouts += client.count as u64;
            self.retry_or_fail(now, client);
        }
    }

    fn store(&mut self, tier: usize, key: u32, now: u64, expires_ms: u64, prefetched: bool) {
        let entry = Entry {
            expires_ms,
            stored_ms: now,
            prefetched,
            used: false,
        };
        let old = self.tiers[tier].cache.insert(key, entry);
        if old.is_some_and(|e| e.prefetched && !e.used) {
            self.rec.prewarm_wasted += 1;
        }
        if tier < self.nodes && (key as usize) < self.hot_rate.len() {
            self.missing.remove(&(tier as u32, key));
            self.expiries.push(Reverse((expires_ms, tier as u32, key)));
            let rate = self.hot_rate[key as usize];
            self.rec.bulk_hits(now, expires_ms, rate, self.is_hot(key));
            if prefetched && rate > 0.0 {
                let e = self.tiers[tier].cache.get_mut(&key).expect("stored");
                e.used = true;
                self.rec.prewarm_used((1000.0 / rate) as u64);
            }
        }
    }

    /// Ends fill `id` at `now`: see the module's invariants.
    fn finish(&mut self, id: usize, now: u64, result: Result<(), FillError>) {
        let mut fill = self.fills[id].take().expect("a fill ends once");
        self.free.push(id);
        let tier = fill.tier;
        if self.tiers[tier].open.get(&fill.key) == Some(&id) {
            self.tiers[tier].open.remove(&fill.key);
        }
        if let Slot::Held(slot, started) = std::mem::replace(&mut fill.slot, Slot::Free) {
            let latency = result
                .as_ref()
                .ok()
                .map(|()| Duration::from_millis(now - started));
            slot.record(latency);
        }
        let permit = fill
            .permit
            .take()
            .expect("unfinished fill holds its permit");
        match result {
            Ok(()) => {
                let jitter = self.cfg.ttl_jitter * (2.0 * self.ttl_rng.random::<f64>() - 1.0);
                let ttl = (self.cfg.ttl_ms() as f64 * (1.0 + jitter)).max(1.0) as u64;
                let mut stored = false;
                permit.complete(|| stored = true);
                if stored {
                    self.store(tier, fill.key, now, now + ttl, fill.prefetch);
                }
                for client in fill.clients {
                    self.rec.served(now, &client, self.is_hot(fill.key));
                }
                for down in fill.downstream {
                    self.finish(down, now, Ok(()));
                }
            }
            Err(error) => {
                permit.fail(error.clone());
                for client in fill.clients {
                    self.retry_or_fail(now, client);
                }
                for down in fill.downstream {
                    self.finish(down, now, Err(error.clone()));
                }
            }
        }
    }
}

fn key(tenant: &TenantId, path: &str) -> FlightKey {
    FlightKey::new(tenant.clone(), CacheKey::new(path).expect("valid key"))
}

fn has_shields(setup: Setup) -> bool {
    matches!(setup, Setup::NodeAndRegional | Setup::Prewarm)
}

fn client_target(client: &Client) -> (u32, u32) {
    client
        .target
        .expect("a retried client knows its node and key")
}
