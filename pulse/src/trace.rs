//! A synthetic access trace: a Zipf background over many keys, viral events that
//! start in one region and spread to the others, cron-like bursts that hit every
//! region at once on the minute, and noise bursts (one region, short, no spread) that
//! must not trigger a pre-warm. The truth about every injected burst comes with it,
//! so `pulse backtest` can score decisions without a hand-labelled data set.

use std::collections::HashMap;

use models::{AccessEvent, CacheKey, Domain, NodeId, Outcome, RegionId, TenantId};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};
use serde::{Deserialize, Serialize};

/// What to generate. Every field has a default that makes a ten-minute trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceSpec {
    /// Seed of the random stream: the same spec and seed give the same trace.
    pub seed: u64,
    /// First event time, ms since the epoch.
    pub start_ms: u64,
    /// Length of the trace.
    pub duration_ms: u64,
    /// Number of tenants.
    pub tenants: usize,
    /// Distinct background keys per tenant.
    pub keys_per_tenant: usize,
    /// Number of regions.
    pub regions: usize,
    /// Edge nodes per region.
    pub nodes_per_region: usize,
    /// Background requests per second over the whole fleet.
    pub background_rps: f64,
    /// Zipf exponent of key popularity.
    pub zipf_exponent: f64,
    /// Viral events to inject.
    pub virals: usize,
    /// Cron-like bursts to inject.
    pub crons: usize,
    /// Noise bursts to inject.
    pub noise: usize,
    /// Seconds of origin fill at a node (misses within it collapse).
    pub fill_ms: u64,
    /// How long a node keeps a filled key.
    pub node_ttl_ms: u64,
}

impl Default for TraceSpec {
    fn default() -> Self {
        TraceSpec {
            seed: 7,
            start_ms: 1_764_460_740_000, // 2025-11-30 00:59:00 UTC: a top of the hour inside.
            duration_ms: 600_000,
            tenants: 3,
            keys_per_tenant: 5_000,
            regions: 6,
            nodes_per_region: 4,
            background_rps: 300.0,
            zipf_exponent: 1.1,
            virals: 12,
            crons: 6,
            noise: 36,
            fill_ms: 50,
            node_ttl_ms: 60_000,
        }
    }
}

impl TraceSpec {
    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("duration_ms", self.duration_ms as f64),
            ("tenants", self.tenants as f64),
            ("keys_per_tenant", self.keys_per_tenant as f64),
            ("regions", self.regions as f64),
            ("nodes_per_region", self.nodes_per_region as f64),
            ("background_rps", self.background_rps),
            ("zipf_exponent", self.zipf_exponent),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| !(*v > 0.0 && v.is_finite())) {
            return Err(format!("{field}: must be positive"));
        }
        if self.regions > 64 {
            return Err("regions: at most 64".into());
        }
        if self.duration_ms < 60_000 {
            return Err("duration_ms: at least 60000 (bursts need room)".into());
        }
        Ok(())
    }
}

/// The kind of an injected burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BurstKind {
    /// Starts in one region and spreads to the others: pre-warm the rest.
    Viral,
    /// Hits every region at once on the minute: nothing left to warm.
    Cron,
    /// A short spike in one region that goes nowhere: must not trigger.
    Noise,
}

/// One injected burst and where and when it reached each region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    /// What kind.
    pub kind: BurstKind,
    /// Whose key.
    pub tenant: TenantId,
    /// Which key.
    pub key: CacheKey,
    /// When it started in its first region.
    pub start_ms: u64,
    /// When it ended everywhere.
    pub end_ms: u64,
    /// Each region it reached, with the time it started there.
    pub regions: Vec<(RegionId, u64)>,
}

/// A generated trace: the events in time order and the truth about the bursts.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Events, sorted by time.
    pub events: Vec<AccessEvent>,
    /// The injected bursts.
    pub bursts: Vec<Burst>,
    /// All regions of the fleet.
    pub regions: Vec<RegionId>,
}

const SOCIAL: [&str; 4] = [
    "t.co",
    "www.reddit.com",
    "news.ycombinator.com",
    "www.facebook.com",
];
const ORDINARY: [&str; 4] = [
    "www.google.com",
    "www.bing.com",
    "duckduckgo.com",
    "intranet.example",
];

/// One stream of requests before outcomes are assigned.
struct Request {
    ts_ms: u64,
    tenant: usize,
    key: CacheKey,
    region: usize,
    node: usize,
    referrer: Option<&'static str>,
}

fn id<T: std::str::FromStr>(s: String) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("generated ids are valid")
}

/// Generates the trace described by `spec`.
pub fn generate(spec: &TraceSpec) -> Trace {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let tenants: Vec<TenantId> = (0..spec.tenants)
        .map(|t| id(format!("tenant-{t}")))
        .collect();
    let regions: Vec<RegionId> = (0..spec.regions)
        .map(|r| id(format!("region-{r}")))
        .collect();
    let end_ms = spec.start_ms + spec.duration_ms;
    let mut requests = Vec::new();

    // Background: a Poisson stream, Zipf over keys, uniform over tenants and nodes.
    let gap = Exp::new(spec.background_rps / 1000.0).expect("positive rate");
    let zipf = Zipf::new(spec.keys_per_tenant as f64, spec.zipf_exponent).expect("valid zipf");
    let mut t = spec.start_ms as f64;
    loop {
        t += gap.sample(&mut rng);
        if t >= end_ms as f64 {
            break;
        }
        let rank = zipf.sample(&mut rng) as usize;
        requests.push(Request {
            ts_ms: t as u64,
            tenant: rng.random_range(0..spec.tenants),
            key: id(format!("/assets/{rank}.js")),
            region: rng.random_range(0..spec.regions),
            node: rng.random_range(0..spec.nodes_per_region),
            referrer: rng
                .random_bool(0.3)
                .then(|| ORDINARY[rng.random_range(0..ORDINARY.len())]),
        });
    }

    let mut bursts = Vec::new();
    // Burst starts are spread over the middle of the trace, apart from each other.
    let kinds = std::iter::repeat_n(BurstKind::Viral, spec.virals)
        .chain(std::iter::repeat_n(BurstKind::Noise, spec.noise));
    let mut slots: Vec<usize> = (0..spec.virals + spec.noise).collect();
    slots.shuffle(&mut rng);
    let usable = spec.duration_ms.saturating_sub(60_000).max(1);
    let slot_ms = usable / (slots.len().max(1) as u64);
    for (n, (kind, slot)) in kinds.zip(slots).enumerate() {
        let start = spec.start_ms
            + 20_000
            + slot as u64 * slot_ms
            + rng.random_range(0..slot_ms.max(2) / 2);
        let tenant = rng.random_range(0..spec.tenants);
        let key: CacheKey = match kind {
            BurstKind::Viral => id(format!("/live/story-{n}.json")),
            _ => id(format!("/promo/spike-{n}.png")),
        };
        let mut order: Vec<usize> = (0..spec.regions).collect();
        order.shuffle(&mut rng);
        let (reached, burst_end) = match kind {
            BurstKind::Viral => {
                // Spreads region by region, 2-4 s apart, each ramping up over 1 s.
                let social = rng
                    .random_bool(0.75)
                    .then(|| SOCIAL[rng.random_range(0..SOCIAL.len())]);
                let peak_rps = rng.random_range(60.0..200.0);
                let mut region_start = start;
                let mut reached = Vec::new();
                for &region in &order {
                    viral_requests(
                        &mut rng,
                        &mut requests,
                        spec,
                        tenant,
                        &key,
                        region,
                        region_start,
                        peak_rps,
                        social,
                    );
                    reached.push((regions[region].clone(), region_start));
                    region_start += rng.random_range(2_000..4_000);
                }
                (reached, region_start + 20_000)
            }
            _ => {
                // One region, one node's clients, a sharp spike for 1-2 s.
                let region = order[0];
                let length = rng.random_range(1_000..2_000);
                let rate = rng.random_range(40.0..120.0) / 1000.0;
                let spike_gap = Exp::new(rate).expect("positive rate");
                let node = rng.random_range(0..spec.nodes_per_region);
                let mut t = start as f64;
                while t < (start + length) as f64 {
                    requests.push(Request {
                        ts_ms: t as u64,
                        tenant,
                        key: key.clone(),
                        region,
                        node,
                        referrer: rng
                            .random_bool(0.2)
                            .then(|| ORDINARY[rng.random_range(0..ORDINARY.len())]),
                    });
                    t += spike_gap.sample(&mut rng);
                }
                (vec![(regions[region].clone(), start)], start + length)
            }
        };
        bursts.push(Burst {
            kind,
            tenant: tenants[tenant].clone(),
            key,
            start_ms: start,
            end_ms: burst_end.min(end_ms),
            regions: reached,
        });
    }

    // Cron bursts: every region at once, at second :00 of a minute, several times.
    for c in 0..spec.crons {
        let tenant = rng.random_range(0..spec.tenants);
        let key: CacheKey = id(format!("/reports/daily-{c}.csv"));
        let first_minute = spec.start_ms.div_ceil(60_000) * 60_000;
        let mut minute = first_minute + 60_000 * rng.random_range(0..2);
        while minute + 5_000 < end_ms {
            let mut reached = Vec::new();
            for (region, name) in regions.iter().enumerate() {
                let first = minute + rng.random_range(0..300);
                reached.push((name.clone(), first));
                let mut t = first as f64;
                while t < (minute + 3_000) as f64 {
                    requests.push(Request {
                        ts_ms: t as u64,
                        tenant,
                        key: key.clone(),
                        region,
                        node: rng.random_range(0..spec.nodes_per_region),
                        referrer: None,
                    });
                    t += rng.random_range(5.0..40.0);
                }
            }
            bursts.push(Burst {
                kind: BurstKind::Cron,
                tenant: tenants[tenant].clone(),
                key: key.clone(),
                start_ms: minute,
                end_ms: minute + 3_000,
                regions: reached,
            });
            minute += 60_000 * rng.random_range(2..4);
        }
    }

    requests.retain(|r| r.ts_ms < end_ms);
    requests.sort_by_key(|r| r.ts_ms);
    let events = assign_outcomes(spec, &tenants, &regions, requests);
    bursts.sort_by_key(|b| b.start_ms);
    Trace {
        events,
        bursts,
        regions,
    }
}

#[allow(clippy::too_many_arguments)]
fn viral_requests(
    rng: &mut StdRng,
    requests: &mut Vec<Request>,
    spec: &TraceSpec,
    tenant: usize,
    key: &CacheKey,
    region: usize,
    region_start: u64,
    peak_rps: f64,
    social: Option<&'static str>,
) {
    let ramp_ms = 1_000.0;
    let last = region_start as f64 + 20_000.0;
    let mut t = region_start as f64;
    while t < last {
        let rps = peak_rps * ((t - region_start as f64 + 50.0) / ramp_ms).min(1.0);
        let referrer = match social {
            Some(domain) if rng.random_bool(0.6) => Some(domain),
            _ => rng
                .random_bool(0.3)
                .then(|| ORDINARY[rng.random_range(0..ORDINARY.len())]),
        };
        requests.push(Request {
            ts_ms: t as u64,
            tenant,
            key: key.clone(),
            region,
            node: rng.random_range(0..spec.nodes_per_region),
            referrer,
        });
        t += Exp::new(rps / 1000.0).expect("positive rate").sample(rng);
    }
}

/// Plays each node's cache: a first request misses and fills, requests during the
/// fill collapse, later ones hit until the entry's TTL runs out.
fn assign_outcomes(
    spec: &TraceSpec,
    tenants: &[TenantId],
    regions: &[RegionId],
    requests: Vec<Request>,
) -> Vec<AccessEvent> {
    let nodes: Vec<Vec<NodeId>> = (0..spec.regions)
        .map(|r| {
            (0..spec.nodes_per_region)
                .map(|n| id(format!("edge-{r}-{n}")))
                .collect()
        })
        .collect();
    // (tenant, node, key) -> when the node's fill completes.
    let mut filled: HashMap<(usize, usize, usize, CacheKey), u64> = HashMap::new();
    requests
        .into_iter()
        .map(|r| {
            let slot = filled
                .entry((r.tenant, r.region, r.node, r.key.clone()))
                .or_insert(0);
            let (outcome, fill_ms) = if *slot == 0 || r.ts_ms >= *slot + spec.node_ttl_ms {
                *slot = r.ts_ms + spec.fill_ms;
                (Outcome::Miss, Some(spec.fill_ms as u32))
            } else if r.ts_ms < *slot {
                (Outcome::Collapsed, Some((*slot - r.ts_ms) as u32))
            } else {
                (Outcome::Hit, None)
            };
            let mut event = AccessEvent::new(
                r.ts_ms,
                tenants[r.tenant].clone(),
                r.key,
                regions[r.region].clone(),
                nodes[r.region][r.node].clone(),
                outcome,
            );
            event.referrer = r
                .referrer
                .map(|d| Domain::new(d).expect("static domains are valid"));
            event.fill_ms = fill_ms;
            event.bytes = 4_096;
            event
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> TraceSpec {
        TraceSpec {
            duration_ms: 180_000,
            background_rps: 100.0,
            virals: 3,
            crons: 1,
            noise: 3,
            ..TraceSpec::default()
        }
    }

    #[test]
    fn same_seed_same_trace() {
        let (a, b) = (generate(&small()), generate(&small()));
        assert_eq!(a.events, b.events);
        assert_eq!(a.bursts, b.bursts);
        let other = generate(&TraceSpec { seed: 8, ..small() });
        assert_ne!(a.events, other.events);
    }

    #[test]
    fn events_are_ordered_and_inside_the_trace() {
        let spec = small();
        let trace = generate(&spec);
        assert!(trace.events.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
        assert!(
            trace
                .events
                .iter()
                .all(|e| (spec.start_ms..spec.start_ms + spec.duration_ms).contains(&e.ts_ms))
        );
    }

    #[test]
    fn virals_spread_and_noise_stays_in_one_region() {
        let trace = generate(&small());
        let count = |kind| trace.bursts.iter().filter(|b| b.kind == kind).count();
        assert_eq!((count(BurstKind::Viral), count(BurstKind::Noise)), (3, 3));
        assert!(count(BurstKind::Cron) >= 1);
        for burst in &trace.bursts {
            let regions_seen: std::collections::HashSet<_> = trace
                .events
                .iter()
                .filter(|e| e.key == burst.key && (burst.start_ms..burst.end_ms).contains(&e.ts_ms))
                .map(|e| e.region.clone())
                .collect();
            match burst.kind {
                BurstKind::Viral | BurstKind::Cron => {
                    assert_eq!(regions_seen.len(), 6, "{burst:?}")
                }
                BurstKind::Noise => assert_eq!(regions_seen.len(), 1, "{burst:?}"),
            }
        }
    }

    #[test]
    fn node_caches_collapse_and_hit() {
        let trace = generate(&small());
        let count = |o| trace.events.iter().filter(|e| e.outcome == o).count();
        assert!(count(Outcome::Miss) > 0 && count(Outcome::Hit) > count(Outcome::Miss));
        assert!(count(Outcome::Collapsed) > 0);
    }
}
