//! One merge per API response: answers from several partitions (and, through the
//! peers, from several instances) become the answer one instance owning them all
//! gives. Every answer, even a single partition's, goes through its merge, so the
//! answer never depends on how partitions are spread over instances.
//!
//! Why the merges are exact: producers key events by `tenant/key`, so a key's counts
//! live in one partition; a key's row from its partition is its row in the union, and
//! the top `n` of the union is the top `n` of the per-partition top `n` lists. Counts
//! of a tenant (events, rates, outcomes, totals) add over partitions; an error bound
//! is the largest partition's, since each estimate comes from one partition.
//!
//! Two fields are not additive and are documented as such in the API: an edge kind's
//! `nodes` (a node sends to many partitions: the merge keeps the largest count, a
//! lower bound of the distinct nodes) and a tenant's `regions` (the union, by name).
//!
//! Each merge takes the parts in any order and returns `None` when there is none.

use std::collections::BTreeMap;

use super::Coverage;
use super::answers::{
    DecisionTotals, EdgesResponse, HeatmapResponse, KeyResponse, ModelResponse,
    PredictionsResponse, RatePoint, RatesResponse, TenantsResponse,
};
use models::RegionId;

use crate::heat::{
    COARSE_BUCKETS, EdgeSummary, EvictedTenant, HotKey, MAX_EVICTED_SUMMARIES, RegionCount,
    SketchKind, TenantSummary, Trend,
};

pub(crate) fn coverage<'a>(parts: impl IntoIterator<Item = &'a Coverage>) -> Coverage {
    Coverage::merge(parts)
}

/// `GET /api/tenants`: tenants by name, their counts added; memory and budget added;
/// evicted summaries joined (newest first, at most [`MAX_EVICTED_SUMMARIES`]).
pub(crate) fn tenants(parts: Vec<TenantsResponse>) -> Option<TenantsResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    out.coverage = coverage;
    let mut by_name: BTreeMap<String, TenantSummary> = std::mem::take(&mut out.tenants)
        .into_iter()
        .map(|t| (t.tenant.to_string(), t))
        .collect();
    let mut evicted: BTreeMap<String, EvictedTenant> = std::mem::take(&mut out.evicted)
        .into_iter()
        .map(|t| (t.tenant.to_string(), t))
        .collect();
    for part in parts {
        out.now_ms = out.now_ms.max(part.now_ms);
        out.memory_bytes += part.memory_bytes;
        out.memory_budget_bytes += part.memory_budget_bytes;
        out.error_bound = out.error_bound.max(part.error_bound);
        out.shared_error_bound = out.shared_error_bound.max(part.shared_error_bound);
        out.failure_probability = out.failure_probability.max(part.failure_probability);
        for t in part.tenants {
            match by_name.get_mut(t.tenant.as_str()) {
                Some(into) => add_tenant(into, t),
                None => {
                    by_name.insert(t.tenant.to_string(), t);
                }
            }
        }
        for e in part.evicted {
            match evicted.get_mut(e.tenant.as_str()) {
                Some(into) => {
                    into.events += e.events;
                    into.last_event_ms = into.last_event_ms.max(e.last_event_ms);
                }
                None => {
                    evicted.insert(e.tenant.to_string(), e);
                }
            }
        }
    }
    out.tenants = by_name
        .into_values()
        .map(|mut t| {
            t.regions.sort();
            t
        })
        .collect();
    let mut evicted: Vec<EvictedTenant> = evicted.into_values().collect();
    evicted.sort_by(|a, b| {
        b.last_event_ms
            .cmp(&a.last_event_ms)
            .then(a.tenant.cmp(&b.tenant))
    });
    evicted.truncate(MAX_EVICTED_SUMMARIES);
    out.evicted = evicted;
    Some(out)
}

fn add_tenant(into: &mut TenantSummary, t: TenantSummary) {
    into.events += t.events;
    into.last_event_ms = into.last_event_ms.max(t.last_event_ms);
    for r in t.regions {
        if !into.regions.contains(&r) {
            into.regions.push(r);
        }
    }
    // A tenant has its own sketches where it is big enough; a key's estimate comes
    // from its one partition, so the bound of any estimate is the largest
    // partition's bound.
    if t.sketch == SketchKind::Own {
        into.sketch = SketchKind::Own;
    }
    into.error_bound = into.error_bound.max(t.error_bound);
    into.events_60s += t.events_60s;
    into.error_bound_events_60s = into.error_bound_events_60s.max(t.error_bound_events_60s);
}

/// `GET /api/heatmap`: the `n` hottest keys of the union (count, then key), one row
/// per key: a key counted in several partitions (producers that do not keep a key on
/// one partition) is one row with the parts added, and counted in `split_keys`. The
/// error bound in events is the largest partition's (a key on one partition has its
/// partition's estimate); a split row's is the sum, `split_error_bound_events`.
pub(crate) fn heatmap(parts: Vec<HeatmapResponse>, n: usize) -> Option<HeatmapResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    out.coverage = coverage;
    let mut rows: BTreeMap<String, HotKey> = BTreeMap::new();
    let mut add_rows = |keys: Vec<HotKey>, split: &mut u64| {
        for k in keys {
            match rows.get_mut(k.key.as_str()) {
                Some(into) => {
                    *split += 1;
                    add_hot_key(into, k);
                }
                None => {
                    rows.insert(k.key.to_string(), k);
                }
            }
        }
    };
    let mut split = out.split_keys;
    add_rows(std::mem::take(&mut out.keys), &mut split);
    for part in parts {
        out.now_ms = out.now_ms.max(part.now_ms);
        if part.sketch == SketchKind::Own {
            out.sketch = SketchKind::Own;
        }
        out.error_bound_events = out.error_bound_events.max(part.error_bound_events);
        out.split_error_bound_events += part.split_error_bound_events;
        split += part.split_keys;
        add_rows(part.keys, &mut split);
    }
    out.split_keys = split;
    out.keys = rows.into_values().collect();
    out.keys
        .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    out.keys.truncate(n);
    Some(out)
}

/// One key's heat-map rows from two partitions: counts and velocities added, regions
/// joined.
fn add_hot_key(into: &mut HotKey, k: HotKey) {
    into.count += k.count;
    into.misses += k.misses;
    let (v, w) = (&mut into.velocities, &k.velocities);
    v.ms200 += w.ms200;
    v.s1 += w.s1;
    v.s10 += w.s10;
    v.s60 += w.s60;
    into.acceleration += k.acceleration;
    join_regions(&mut into.miss_regions, k.miss_regions);
    add_region_counts(&mut into.regions, k.regions);
}

fn join_regions(into: &mut Vec<RegionId>, more: Vec<RegionId>) {
    into.extend(more);
    into.sort();
    into.dedup();
}

/// Per-region counts added by region, largest first (then by name).
fn add_region_counts(into: &mut Vec<RegionCount>, more: Vec<RegionCount>) {
    for r in more {
        match into.iter_mut().find(|x| x.region == r.region) {
            Some(x) => x.count += r.count,
            None => into.push(r),
        }
    }
    into.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.region.cmp(&b.region)));
}

/// `GET /api/keys/...`: the estimates of the partitions that may hold the key, added
/// (the key's owner alone when the producers' partitioner is known); each partition's
/// estimate is at most its bound above its share, so the bound is the sum.
pub(crate) fn key(parts: Vec<KeyResponse>) -> Option<KeyResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    for part in parts {
        let (s, t) = (&mut out.stats, part.stats);
        s.now_ms = s.now_ms.max(t.now_ms);
        for (w, x) in s.windows.iter_mut().zip(t.windows) {
            let (c, d) = (&mut w.counts, x.counts);
            c.hit += d.hit;
            c.miss += d.miss;
            c.stale += d.stale;
            c.collapsed += d.collapsed;
            c.prefetch_fill += d.prefetch_fill;
            c.prefetch_useful += d.prefetch_useful;
            w.total += x.total;
            w.demand += x.demand;
            w.misses += x.misses;
            w.velocity += x.velocity;
            w.miss_velocity += x.miss_velocity;
            join_regions(&mut w.miss_regions, x.miss_regions);
            join_regions(&mut w.regions, x.regions);
        }
        s.acceleration_200ms += t.acceleration_200ms;
        s.acceleration_1s += t.acceleration_1s;
        add_region_counts(&mut s.regions, t.regions);
        let o = &mut out.ownership;
        o.partitions.extend(part.ownership.partitions);
        o.error_bound_events_60s += part.ownership.error_bound_events_60s;
    }
    // Sorted, not deduplicated: a partition answering twice (parts gathered on
    // either side of a rebalance) shows.
    out.ownership.partitions.sort_unstable();
    // The trend of the sum, by the rule one partition uses.
    let now_1s = out.stats.windows.get(1).map_or(0.0, |w| w.demand as f64);
    let a = out.stats.acceleration_1s;
    out.stats.trend = if a.abs() <= (0.1 * now_1s).max(1.0) {
        Trend::Steady
    } else if a > 0.0 {
        Trend::Rising
    } else {
        Trend::Falling
    };
    out.coverage = coverage;
    Some(out)
}

/// Whether a key's answer, gathered from the owners of its `route` only, is whole:
/// each partition of the route is covered by an answer (counted, or known to hold
/// nothing of the key's tenant), none is counted twice or replaying, nothing off the
/// route is counted, and every owner asked answered. `counted` is the merged
/// [`KeyOwnership::partitions`](super::KeyOwnership): sorted, duplicates kept.
pub(crate) fn key_complete(route: &[i32], counted: &[i32], coverage: &Coverage) -> bool {
    counted.windows(2).all(|w| w[0] != w[1])
        && counted.iter().all(|p| route.contains(p))
        && route
            .iter()
            .all(|p| coverage.partitions.contains(p) && !coverage.replaying.contains(p))
        && coverage.missing_peers.is_empty()
}

/// `GET /api/rates`: each second's events and misses added (seconds matched by their
/// start), the keys counted added.
pub(crate) fn rates(parts: Vec<RatesResponse>) -> Option<RatesResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    out.coverage = coverage;
    let mut seconds: BTreeMap<u64, RatePoint> = std::mem::take(&mut out.seconds)
        .into_iter()
        .map(|p| (p.start_ms, p))
        .collect();
    for part in parts {
        out.now_ms = out.now_ms.max(part.now_ms);
        out.keys += part.keys;
        for p in part.seconds {
            let into = seconds.entry(p.start_ms).or_insert(RatePoint {
                start_ms: p.start_ms,
                events: 0,
                misses: 0,
            });
            into.events += p.events;
            into.misses += p.misses;
        }
    }
    let mut seconds: Vec<RatePoint> = seconds.into_values().collect();
    let extra = seconds.len().saturating_sub(COARSE_BUCKETS);
    seconds.drain(..extra);
    out.seconds = seconds;
    Some(out)
}

/// `GET /api/edges`: each kind's counters added, its hit ratio recomputed; `nodes`
/// is the largest of the parts' (a node sends to many partitions).
pub(crate) fn edges(parts: Vec<EdgesResponse>) -> Option<EdgesResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    out.coverage = coverage;
    for part in parts {
        out.now_ms = out.now_ms.max(part.now_ms);
        for e in part.edges {
            match out.edges.iter_mut().find(|x| x.edge == e.edge) {
                Some(into) => add_edge(into, &e),
                None => out.edges.push(e),
            }
        }
    }
    Some(out)
}

fn add_edge(into: &mut EdgeSummary, e: &EdgeSummary) {
    into.events += e.events;
    into.hits += e.hits;
    into.misses += e.misses;
    into.prefetch_fills += e.prefetch_fills;
    into.bytes += e.bytes;
    into.rate_per_s += e.rate_per_s;
    into.nodes = into.nodes.max(e.nodes);
    into.nodes_capped |= e.nodes_capped;
    into.last_event_ms = into.last_event_ms.max(e.last_event_ms);
    let o = &mut into.outcomes;
    o.hit += e.outcomes.hit;
    o.miss += e.outcomes.miss;
    o.stale += e.outcomes.stale;
    o.collapsed += e.outcomes.collapsed;
    o.prefetch_fill += e.outcomes.prefetch_fill;
    o.prefetch_useful += e.outcomes.prefetch_useful;
    let demand = into.events - into.prefetch_fills;
    into.hit_ratio = (demand > 0).then(|| into.hits as f64 / demand as f64);
}

/// `GET /api/predictions`: totals added, the newest `limit` decisions of the union
/// (issue time, then id).
pub(crate) fn predictions(
    parts: Vec<PredictionsResponse>,
    limit: usize,
) -> Option<PredictionsResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    out.coverage = coverage;
    for part in parts {
        add_totals(&mut out.totals, part.totals);
        out.decisions.extend(part.decisions);
    }
    out.decisions.sort_by(|a, b| {
        b.issued_at_ms
            .cmp(&a.issued_at_ms)
            .then_with(|| a.id.cmp(&b.id))
    });
    out.decisions.truncate(limit);
    Some(out)
}

fn add_totals(into: &mut DecisionTotals, t: DecisionTotals) {
    into.sent += t.sent;
    into.useful += t.useful;
    into.wasted += t.wasted;
    into.scored += t.scored;
    for (reason, n) in t.skipped {
        *into.skipped.entry(reason).or_default() += n;
    }
}

/// `GET /api/model`: every partition runs the same model; while a new one spreads,
/// the newest (training time, then name) is the answer.
pub(crate) fn model(parts: Vec<ModelResponse>) -> Option<ModelResponse> {
    let coverage = coverage(parts.iter().map(|p| &p.coverage));
    let mut out = parts.into_iter().max_by(|a, b| {
        a.trained_at_ms
            .cmp(&b.trained_at_ms)
            .then_with(|| a.name.cmp(&b.name))
    })?;
    out.coverage = coverage;
    Some(out)
}

#[cfg(test)]
mod tests {
    use models::{AccessEvent, CacheKey, EdgeKind, NodeId, Outcome, RegionId, TenantId};

    use super::*;
    use crate::fleet::answers::{DecisionView, PredictionsResponse};
    use crate::fleet::partition_for_key;
    use crate::heat::{HeatConfig, HeatMap, Window};

    const T0: u64 = 1_764_470_000_000;

    /// An event set over two tenants, 24 keys, three regions and two nodes, and the
    /// same events split over two partitions as producers split them.
    fn split() -> (HeatMap, [HeatMap; 2]) {
        let mut all = HeatMap::new(HeatConfig::default());
        let mut parts = [
            HeatMap::new(HeatConfig::default()),
            HeatMap::new(HeatConfig::default()),
        ];
        for i in 0..3_000u64 {
            let tenant = ["acme", "globex"][(i % 7 % 2) as usize];
            // Key popularity falls with its number: distinct counts, a clear top.
            let k = (i * i) % 24 % (1 + i % 24);
            let mut e = AccessEvent::new(
                T0 + i * 20,
                TenantId::new(tenant).unwrap(),
                CacheKey::new(format!("/k/{k}")).unwrap(),
                RegionId::new(["eu-west", "us-east", "ap-south"][(i % 3) as usize]).unwrap(),
                NodeId::new(format!("edge-{}", i % 2)).unwrap(),
                Outcome::ALL[(i % 5) as usize],
            );
            e.edge = Some([EdgeKind::Nginx, EdgeKind::Varnish][(i % 4 / 3) as usize]);
            e.bytes = i % 100;
            let p = partition_for_key(e.partition_key().as_bytes(), 2);
            all.apply(&e).unwrap();
            parts[p as usize].apply(&e).unwrap();
        }
        assert!(
            parts.iter().all(|h| h.tenants_len() == 2),
            "both halves hold both tenants"
        );
        (all, parts)
    }

    fn cov(p: i32) -> Coverage {
        Coverage::of(vec![p], 2)
    }

    #[test]
    fn tenants_merge_to_the_tenants_of_all_events() {
        let (all, [a, b]) = split();
        let merged = tenants(vec![
            TenantsResponse::of(&b, cov(1)),
            TenantsResponse::of(&a, cov(0)),
        ])
        .unwrap();
        let whole = tenants(vec![TenantsResponse::of(&all, Coverage::of(vec![0, 1], 2))]).unwrap();
        assert!(merged.coverage.complete);
        assert_eq!(merged.now_ms, whole.now_ms);
        assert_eq!(merged.tenants.len(), whole.tenants.len());
        for (m, w) in merged.tenants.iter().zip(&whole.tenants) {
            assert_eq!(
                (
                    &m.tenant,
                    m.events,
                    m.last_event_ms,
                    &m.regions,
                    m.events_60s
                ),
                (
                    &w.tenant,
                    w.events,
                    w.last_event_ms,
                    &w.regions,
                    w.events_60s
                )
            );
        }
        assert_eq!(
            merged.memory_budget_bytes,
            2 * HeatConfig::default().memory_budget_bytes
        );
    }

    #[test]
    fn heatmaps_merge_to_the_heatmap_of_all_events() {
        let (all, [a, b]) = split();
        let now = all.now_ms();
        for tenant in ["acme", "globex"] {
            let tenant = TenantId::new(tenant).unwrap();
            for (region, window, n) in [
                (None, Window::S60, 10),
                (None, Window::S10, 3),
                (Some(RegionId::new("us-east").unwrap()), Window::S60, 5),
            ] {
                let of = |heat: &HeatMap, c| {
                    HeatmapResponse::of(heat, &tenant, region.as_ref(), window, n, now, c).unwrap()
                };
                let merged = heatmap(vec![of(&a, cov(0)), of(&b, cov(1))], n).unwrap();
                let whole = heatmap(vec![of(&all, Coverage::of(vec![0, 1], 2))], n).unwrap();
                assert!(!merged.keys.is_empty() && merged.keys.len() <= n);
                assert_eq!(merged.keys, whole.keys, "{tenant} {region:?} {window:?}");
                assert_eq!(merged.now_ms, now);
            }
        }
    }

    #[test]
    fn rates_merge_to_the_rates_of_all_events() {
        let (all, [a, b]) = split();
        let now = all.now_ms();
        let tenant = TenantId::new("acme").unwrap();
        // Every key of the tenant is counted on both sides, so the sums are the same.
        let of = |heat: &HeatMap, c| RatesResponse::of(heat, &tenant, 100, now, c).unwrap();
        let merged = rates(vec![of(&a, cov(0)), of(&b, cov(1))]).unwrap();
        let whole = rates(vec![of(&all, Coverage::of(vec![0, 1], 2))]).unwrap();
        assert_eq!(merged.keys, whole.keys);
        assert_eq!(merged.seconds, whole.seconds);
        assert!(merged.seconds.iter().any(|s| s.events > 0));
    }

    #[test]
    fn edges_merge_to_the_edges_of_all_events() {
        let (all, [a, b]) = split();
        let merged = edges(vec![
            EdgesResponse::of(&a, cov(0)),
            EdgesResponse::of(&b, cov(1)),
        ])
        .unwrap();
        let whole = edges(vec![EdgesResponse::of(&all, Coverage::of(vec![0, 1], 2))]).unwrap();
        assert_eq!(merged.edges.len(), whole.edges.len());
        for (m, w) in merged.edges.iter().zip(&whole.edges) {
            assert!((m.rate_per_s - w.rate_per_s).abs() < 1e-9, "{m:?} {w:?}");
            // Both nodes send to both partitions: the largest count is the distinct one.
            let m = EdgeSummary {
                rate_per_s: w.rate_per_s,
                ..m.clone()
            };
            assert_eq!(&m, w);
        }
    }

    fn decision(id: &str, issued_at_ms: u64) -> DecisionView {
        DecisionView {
            id: id.into(),
            tenant: "acme".into(),
            key: format!("/{id}"),
            confidence: 0.9,
            issued_at_ms,
            expires_at_ms: issued_at_ms + 30_000,
            regions: vec!["all".into()],
            verdict: "pending".into(),
            lead_times: Vec::new(),
            model: "m".into(),
            intercept: 0.0,
            features: Vec::new(),
            last_stage: "gate".into(),
            last_skip: None,
            last_decided_at_ms: issued_at_ms,
        }
    }

    fn totals(sent: u64, skipped: u64) -> DecisionTotals {
        DecisionTotals {
            sent,
            useful: sent / 2,
            wasted: 1,
            skipped: [("cooldown".to_owned(), skipped)].into(),
            scored: sent + skipped,
        }
    }

    #[test]
    fn predictions_add_totals_and_keep_the_newest_decisions() {
        let a = PredictionsResponse {
            totals: totals(4, 3),
            decisions: vec![decision("a2", 30), decision("a1", 10)],
            coverage: cov(0),
        };
        let b = PredictionsResponse {
            totals: totals(2, 5),
            decisions: vec![decision("b2", 40), decision("b1", 20)],
            coverage: cov(1),
        };
        let merged = predictions(vec![a, b], 3).unwrap();
        let ids: Vec<&str> = merged.decisions.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["b2", "a2", "b1"]);
        assert_eq!((merged.totals.sent, merged.totals.useful), (6, 3));
        assert_eq!(merged.totals.skipped["cooldown"], 8);
        assert_eq!(merged.totals.scored, 14);
        assert!(merged.coverage.complete);
        assert!(predictions(Vec::new(), 3).is_none());
    }

    #[test]
    fn the_model_is_the_newest_and_keys_come_from_their_owner() {
        let policy = crate::predict::DecisionPolicy::default();
        let mut old = crate::predict::default_model();
        old.trained_at_ms = 1;
        let mut new = old.clone();
        new.trained_at_ms = 2;
        new.name = "new".into();
        let merged = model(vec![
            ModelResponse::new(&new, &policy, cov(1)),
            ModelResponse::new(&old, &policy, cov(0)),
        ])
        .unwrap();
        assert_eq!(merged.name, "new");
        assert!(merged.coverage.complete);

        let (_, [a, b]) = split();
        let tenant = TenantId::new("acme").unwrap();
        let key = CacheKey::new("/k/1").unwrap();
        let owner = partition_for_key(
            models::message_key(tenant.as_str(), key.as_str()).as_bytes(),
            2,
        );
        let [owned, other] = if owner == 0 { [&a, &b] } else { [&b, &a] };
        let now = a.now_ms().max(b.now_ms());
        let part = |heat: &crate::heat::HeatMap, p: i32| {
            KeyResponse::of(heat, &tenant, &key, now, cov(p)).unwrap()
        };
        let (mine, theirs) = (part(owned, owner), part(other, 1 - owner));
        let total = |k: &KeyResponse| k.stats.windows[3].total;
        let (mine_total, theirs_total) = (total(&mine), total(&theirs));
        let bound = mine.ownership.error_bound_events_60s + theirs.ownership.error_bound_events_60s;
        // Every partition that may hold the key adds its estimate; the bound adds too.
        let merged = key_part(vec![theirs, mine]);
        assert_eq!(total(&merged), mine_total + theirs_total);
        assert_eq!(merged.ownership.error_bound_events_60s, bound);
        assert_eq!(merged.ownership.partitions, [0, 1]);
        assert!(merged.coverage.complete);
    }

    fn key_part(parts: Vec<KeyResponse>) -> KeyResponse {
        key(parts).unwrap()
    }

    /// A key that moved when the topic grew (route `[0, 1]`), each partition on
    /// another instance: each part names only the partition it counted, the merge
    /// sees each once, and the answer is whole. A partition counted twice, one not
    /// covered, one replaying or an owner missing is not.
    #[test]
    fn a_key_on_two_instances_is_whole_when_each_partition_counts_once() {
        let (_, [a, b]) = split();
        let tenant = TenantId::new("acme").unwrap();
        let key_name = CacheKey::new("/k/1").unwrap();
        let now = a.now_ms().max(b.now_ms());
        let part = |heat: &HeatMap, c: Coverage| {
            KeyResponse::of(heat, &tenant, &key_name, now, c).unwrap()
        };
        let route = [0, 1];
        let merged = key(vec![part(&b, cov(1)), part(&a, cov(0))]).unwrap();
        assert_eq!(merged.ownership.partitions, route);
        assert!(key_complete(
            &route,
            &merged.ownership.partitions,
            &merged.coverage
        ));
        // A partition answered by two instances (either side of a rebalance).
        let twice = key(vec![part(&a, cov(0)), part(&b, cov(1)), part(&b, cov(1))]).unwrap();
        assert_eq!(twice.ownership.partitions, [0, 1, 1]);
        assert!(!key_complete(
            &route,
            &twice.ownership.partitions,
            &twice.coverage
        ));
        // The route's second partition covered by nobody.
        let half = key(vec![part(&a, cov(0))]).unwrap();
        assert!(!key_complete(
            &route,
            &half.ownership.partitions,
            &half.coverage
        ));
        // Covered, but holding nothing of the tenant: whole with one part counted.
        let mut nothing_there = key(vec![part(&a, cov(0))]).unwrap();
        nothing_there.coverage = Coverage::merge([&cov(0), &cov(1)]);
        assert!(key_complete(
            &route,
            &nothing_there.ownership.partitions,
            &nothing_there.coverage
        ));
        // Replaying, or an owner that did not answer.
        let replaying = key(vec![part(&a, cov(0)), part(&b, cov(1).replaying(vec![1]))]).unwrap();
        assert!(!key_complete(
            &route,
            &replaying.ownership.partitions,
            &replaying.coverage
        ));
        let mut missing = key(vec![part(&b, cov(1)), part(&a, cov(0))]).unwrap();
        missing.coverage.missing_peers = vec!["http://10.0.0.2:8080".into()];
        assert!(!key_complete(
            &route,
            &missing.ownership.partitions,
            &missing.coverage
        ));
        // Counted off the route.
        assert!(!key_complete(
            &[0],
            &merged.ownership.partitions,
            &merged.coverage
        ));
    }
}
