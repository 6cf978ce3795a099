//! The generator: a Zipf background with the bursts of a [`TraceSpec`] injected, and
//! node caches that collapse and hit as the prefetcher's would.

use std::collections::HashMap;

use super::{Burst, BurstKind, Trace, TraceSpec, ViralReferrers};
use models::{AccessEvent, CacheKey, Domain, NodeId, Outcome, RegionId, TenantId};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};

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

/// A newsletter's link domain: not social, one domain for the whole wave.
const NEWSLETTER: &str = "newsletter.example";

/// A region's local news site: its readers live in that region.
fn local_news(region: &RegionId) -> String {
    format!("news.{region}.example")
}

/// The referrer of a background request in a region whose local news site is
/// `local`: 30 % have one, mostly search engines, also social networks, the
/// newsletter and the local news site, as any site's logs show all day long.
fn background_referrer<'a>(rng: &mut StdRng, local: &'a str) -> Option<&'a str> {
    if !rng.random_bool(0.3) {
        return None;
    }
    Some(match rng.random_range(0..20) {
        0..12 => ORDINARY[rng.random_range(0..ORDINARY.len())],
        12..17 => SOCIAL[rng.random_range(0..SOCIAL.len())],
        17 => NEWSLETTER,
        _ => local,
    })
}

/// The referrers of a burst's requests.
#[derive(Debug, Clone, Copy)]
enum Referrers<'a> {
    /// This domain for 60 % of them (if any), ordinary search referrers for 30 % of
    /// the rest.
    Ordinary(Option<&'a str>),
    /// None at all.
    Nothing,
}

/// One stream of requests before outcomes are assigned.
struct Request<'a> {
    ts_ms: u64,
    tenant: usize,
    key: CacheKey,
    region: usize,
    node: usize,
    referrer: Option<&'a str>,
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
    let news: Vec<String> = regions.iter().map(local_news).collect();
    let end_ms = spec.start_ms + spec.duration_ms;
    let mut requests = Vec::new();

    // Background: a Poisson stream (thinned to a load cycle when `diurnal` > 0), Zipf
    // over keys, tenants by size, uniform over nodes.
    let peak_rps = spec.background_rps * (1.0 + spec.diurnal);
    let gap = Exp::new(peak_rps / 1000.0).expect("positive rate");
    let zipf = Zipf::new(spec.keys_per_tenant as f64, spec.zipf_exponent).expect("valid zipf");
    let tenant_weights: Vec<f64> = (0..spec.tenants)
        .map(|i| 1.0 / ((i + 1) as f64).powf(spec.tenant_skew))
        .collect();
    let weight_total: f64 = tenant_weights.iter().sum();
    let audience_of = |region: usize| region * spec.audiences / spec.regions;
    // Each audience's popularity ranking of the keys: the first as drawn, the others
    // shuffled (a stream of their own, so one audience leaves the trace as it was).
    let mut taste_rng = StdRng::seed_from_u64(spec.seed ^ 0x7a57e);
    let tastes: Vec<Vec<usize>> = (0..spec.audiences)
        .map(|a| {
            let mut ranking: Vec<usize> = (0..=spec.keys_per_tenant).collect();
            if a > 0 {
                ranking.shuffle(&mut taste_rng);
            }
            ranking
        })
        .collect();
    let mut t = spec.start_ms as f64;
    loop {
        t += gap.sample(&mut rng);
        if t >= end_ms as f64 {
            break;
        }
        if spec.diurnal > 0.0 {
            let phase =
                (t - spec.start_ms as f64) / spec.duration_ms as f64 * std::f64::consts::TAU;
            let keep = (1.0 + spec.diurnal * phase.sin()) / (1.0 + spec.diurnal);
            if !rng.random_bool(keep.clamp(0.0, 1.0)) {
                continue;
            }
        }
        let rank = zipf.sample(&mut rng) as usize;
        // The region is drawn after the tenant (as it always was); the key's rank is
        // read in its audience's taste.
        let tenant = if spec.tenant_skew == 0.0 {
            rng.random_range(0..spec.tenants)
        } else {
            let mut pick = rng.random::<f64>() * weight_total;
            tenant_weights
                .iter()
                .position(|w| {
                    pick -= w;
                    pick < 0.0
                })
                .unwrap_or(spec.tenants - 1)
        };
        let region = rng.random_range(0..spec.regions);
        let rank = tastes[audience_of(region)][rank.min(spec.keys_per_tenant)];
        requests.push(Request {
            ts_ms: t as u64,
            tenant,
            key: id(format!("/assets/{rank}.js")),
            region,
            node: rng.random_range(0..spec.nodes_per_region),
            referrer: background_referrer(&mut rng, &news[region]),
        });
    }

    let mut bursts = Vec::new();
    // Burst starts are spread over the middle of the trace, apart from each other.
    let kinds = std::iter::repeat_n(BurstKind::Viral, spec.virals)
        .chain(std::iter::repeat_n(BurstKind::Noise, spec.noise))
        .chain(std::iter::repeat_n(BurstKind::Flash, spec.flash_crowds))
        .chain(std::iter::repeat_n(BurstKind::Hammer, spec.hammers));
    let mut slots: Vec<usize> =
        (0..spec.virals + spec.noise + spec.flash_crowds + spec.hammers).collect();
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
            BurstKind::Flash => id(format!("/local/news-{n}.html")),
            BurstKind::Hammer => id(format!("/api/poll-{n}.json")),
            _ => id(format!("/promo/spike-{n}.png")),
        };
        let mut order: Vec<usize> = (0..spec.regions).collect();
        order.shuffle(&mut rng);
        let (reached, burst_end) = match kind {
            BurstKind::Viral => {
                // Spreads region by region, `spread_ms` apart, each ramping up over
                // `ramp_ms`, to `spread_share` of the fleet.
                let referrer = match spec.viral_referrers {
                    ViralReferrers::Social => Referrers::Ordinary(
                        rng.random_bool(0.75)
                            .then(|| SOCIAL[rng.random_range(0..SOCIAL.len())]),
                    ),
                    ViralReferrers::Newsletter => Referrers::Ordinary(Some(NEWSLETTER)),
                    ViralReferrers::None => Referrers::Nothing,
                };
                let peak_rps = rng.random_range(60.0..200.0);
                let most = ((spec.regions as f64 * spec.spread_share).round() as usize)
                    .clamp(2, spec.regions);
                let reach = if spec.audiences > 1 {
                    // Its own audience: the first region's, every region of it.
                    let audience = audience_of(order[0]);
                    order.sort_by_key(|r| audience_of(*r) != audience);
                    (0..spec.regions)
                        .filter(|r| audience_of(*r) == audience)
                        .count()
                } else if most == spec.regions {
                    most
                } else {
                    rng.random_range(2..=most)
                };
                let mut region_start = start;
                let mut reached = Vec::new();
                for &region in order.iter().take(reach) {
                    viral_requests(
                        &mut rng,
                        &mut requests,
                        spec,
                        tenant,
                        &key,
                        (region, None),
                        region_start,
                        peak_rps,
                        referrer,
                    );
                    reached.push((regions[region].clone(), region_start));
                    region_start += rng.random_range(spec.spread_ms.0..spec.spread_ms.1);
                }
                (reached, region_start + 20_000)
            }
            BurstKind::Flash => {
                // One region's crowd, on every node, sent by its local news site
                // (a story about the region), 20 s.
                let region = order[0];
                let peak_rps = rng.random_range(60.0..200.0);
                let referrer = Referrers::Ordinary(Some(news[region].as_str()));
                viral_requests(
                    &mut rng,
                    &mut requests,
                    spec,
                    tenant,
                    &key,
                    (region, None),
                    start,
                    peak_rps,
                    referrer,
                );
                (vec![(regions[region].clone(), start)], start + 20_000)
            }
            BurstKind::Hammer => {
                // One node, one key, a steady fast loop for 10-30 s, no referrer.
                let region = order[0];
                let node = rng.random_range(0..spec.nodes_per_region);
                let length = rng.random_range(10_000..30_000);
                let every = 1000.0 / rng.random_range(30.0..150.0);
                let mut t = start as f64;
                while t < (start + length) as f64 {
                    requests.push(Request {
                        ts_ms: t as u64,
                        tenant,
                        key: key.clone(),
                        region,
                        node,
                        referrer: None,
                    });
                    t += every * rng.random_range(0.8..1.2);
                }
                (vec![(regions[region].clone(), start)], start + length)
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

    // Cron bursts: every region at once, at second :00 (or `cron_second`) of a
    // minute, several times.
    for c in 0..spec.crons {
        let tenant = rng.random_range(0..spec.tenants);
        let key: CacheKey = id(format!("/reports/daily-{c}.csv"));
        let second_ms = spec.cron_second.unwrap_or(0) * 1_000;
        let first_minute = spec.start_ms.div_ceil(60_000) * 60_000 + second_ms;
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

    // Crawlers: one node walks keys once each, 20-50 a second, for a minute.
    for c in 0..spec.crawlers {
        let tenant = rng.random_range(0..spec.tenants);
        let region = rng.random_range(0..spec.regions);
        let node = rng.random_range(0..spec.nodes_per_region);
        let begin =
            spec.start_ms + rng.random_range(0..spec.duration_ms.saturating_sub(60_000).max(1));
        let every = 1000.0 / rng.random_range(20.0..50.0);
        let mut t = begin as f64;
        let mut page = 0;
        while t < (begin + 60_000) as f64 {
            requests.push(Request {
                ts_ms: t as u64,
                tenant,
                key: id(format!("/catalog/item-{c}-{page}.html")),
                region,
                node,
                referrer: None,
            });
            page += 1;
            t += every;
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
fn viral_requests<'a>(
    rng: &mut StdRng,
    requests: &mut Vec<Request<'a>>,
    spec: &TraceSpec,
    tenant: usize,
    key: &CacheKey,
    (region, node): (usize, Option<usize>),
    region_start: u64,
    peak_rps: f64,
    referrer: Referrers<'a>,
) {
    let ramp_ms = spec.ramp_ms as f64;
    let last = region_start as f64 + 20_000.0;
    let mut t = region_start as f64;
    while t < last {
        let rps = peak_rps * ((t - region_start as f64 + 50.0) / ramp_ms).min(1.0);
        let referrer = match referrer {
            Referrers::Ordinary(Some(domain)) if rng.random_bool(0.6) => Some(domain),
            Referrers::Ordinary(_) => rng
                .random_bool(0.3)
                .then(|| ORDINARY[rng.random_range(0..ORDINARY.len())]),
            Referrers::Nothing => None,
        };
        requests.push(Request {
            ts_ms: t as u64,
            tenant,
            key: key.clone(),
            region,
            node: node.unwrap_or_else(|| rng.random_range(0..spec.nodes_per_region)),
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
    requests: Vec<Request<'_>>,
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
                .map(|d| Domain::new(d).expect("generated domains are valid"));
            event.fill_ms = fill_ms;
            event.bytes = 4_096;
            event
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::trace::Family;

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
                _ => assert_eq!(regions_seen.len(), 1, "{burst:?}"),
            }
        }
    }

    #[test]
    fn families_make_what_they_say() {
        let short = |name: &str| {
            let mut spec = Family::named(name).unwrap().spec(3);
            spec.duration_ms = 120_000;
            spec.background_rps = 50.0;
            generate(&spec)
        };
        let kinds = |t: &Trace, kind| t.bursts.iter().filter(|b| b.kind == kind).count();
        let hammers = short("hammers");
        assert_eq!(kinds(&hammers, BurstKind::Hammer), 12);
        for b in hammers
            .bursts
            .iter()
            .filter(|b| b.kind == BurstKind::Hammer)
        {
            let nodes: std::collections::HashSet<_> = hammers
                .events
                .iter()
                .filter(|e| e.key == b.key)
                .map(|e| e.node.clone())
                .collect();
            assert_eq!(nodes.len(), 1, "{b:?}");
        }
        let scattered = short("scattered-spread");
        for b in scattered
            .bursts
            .iter()
            .filter(|b| b.kind == BurstKind::Viral)
        {
            assert!((2..=4).contains(&b.regions.len()), "{b:?}");
        }
        // Two audiences of 4 regions (0-3, 4-7): a viral reaches all of its own.
        let partial = short("partial-spread");
        let audience = |r: &RegionId| partial.regions.iter().position(|x| x == r).unwrap() / 4;
        for b in partial.bursts.iter().filter(|b| b.kind == BurstKind::Viral) {
            assert_eq!(b.regions.len(), 4, "{b:?}");
            assert!(
                b.regions
                    .iter()
                    .all(|(r, _)| audience(r) == audience(&b.regions[0].0))
            );
        }
        // ...and each audience has its own favourite background key.
        let favourite = |a: usize| {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for e in partial.events.iter().filter(|e| audience(&e.region) == a) {
                if e.key.as_str().starts_with("/assets/") {
                    *counts.entry(e.key.as_str()).or_default() += 1;
                }
            }
            counts.into_iter().max_by_key(|(_, c)| *c).unwrap().0
        };
        assert_ne!(favourite(0), favourite(1));
        // A crowd's referred visitors come from its own region's local news site,
        // which refers visitors in no other region.
        let crowds = short("flash-crowds");
        let crowd = crowds
            .bursts
            .iter()
            .find(|b| b.kind == BurstKind::Flash)
            .unwrap();
        let local = local_news(&crowd.regions[0].0);
        let referred: Vec<_> = crowds
            .events
            .iter()
            .filter(|e| e.key == crowd.key)
            .filter_map(|e| e.referrer.as_ref())
            .collect();
        let from_local = referred.iter().filter(|d| d.as_str() == local).count();
        assert!(
            from_local * 2 > referred.len(),
            "{from_local} of {}",
            referred.len()
        );
        assert!(
            crowds
                .events
                .iter()
                .filter(|e| e.referrer.as_ref().is_some_and(|d| d.as_str() == local))
                .all(|e| e.region == crowd.regions[0].0)
        );
        let fleet = short("fleet-12");
        assert_eq!(fleet.regions.len(), 12);
        let plain = short("referrerless");
        let viral = plain
            .bursts
            .iter()
            .find(|b| b.kind == BurstKind::Viral)
            .unwrap();
        assert!(
            plain
                .events
                .iter()
                .filter(|e| e.key == viral.key)
                .all(|e| e.referrer.is_none())
        );
    }

    #[test]
    fn node_caches_collapse_and_hit() {
        let trace = generate(&small());
        let count = |o| trace.events.iter().filter(|e| e.outcome == o).count();
        assert!(count(Outcome::Miss) > 0 && count(Outcome::Hit) > count(Outcome::Miss));
        assert!(count(Outcome::Collapsed) > 0);
    }
}
