//! Tenants by the thousand: 10 000 tenants with Zipf-sized traffic (exponent 1.0) and
//! 1 M events in one 60 s window, applied to one heat map in one of two layouts:
//! `shared` (small tenants share one sketch, the default) or `own` (every tenant its
//! own sketches, `shared_sketch_below = 0`: the layout before the shared sketch). Both
//! run under the same memory budget (1 GiB by default).
//!
//! `cargo run --profile bench -p pulse --example tenants -- LAYOUT [TENANTS] [EVENTS]`.
//! Prints one line of `key=value` pairs for scripts/bench/pulse: the peak RSS of this
//! process, the apply rate (wall clock, and per CPU second of the applying thread), the tenants served and the events refused, and
//! whether the hottest keys of the 20 largest tenants match an exact count (within the
//! error bound each tenant states). Run each layout in its own process: the peak RSS
//! is the process's.

#[path = "support/vm_hwm.rs"]
mod vm_hwm;

use std::collections::HashMap;
use std::time::Instant;

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
use pulse::{HeatConfig, HeatMap, Window};
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

/// Distinct keys per tenant (Zipf 1.0 over them too).
const KEYS: usize = 1_000;
/// Rows compared per large tenant.
const TOP: usize = 5;

fn main() {
    let mut args = std::env::args().skip(1);
    let layout = args.next().unwrap_or_else(|| "shared".into());
    let tenants: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let events: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let config = match layout.as_str() {
        "shared" => HeatConfig::default(),
        "own" => HeatConfig {
            shared_sketch_below: 0,
            ..HeatConfig::default()
        },
        other => panic!("layout {other:?}: expected shared or own"),
    };
    let mut heat = HeatMap::new(config);

    // The stream, drawn first as (tenant, key) ranks: 6 bytes per event, so the peak
    // RSS is the heat map's.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let tenant_zipf = Zipf::new(tenants as f64, 1.0).unwrap();
    let key_zipf = Zipf::new(KEYS as f64, 1.0).unwrap();
    let stream: Vec<(u32, u16)> = (0..events)
        .map(|_| {
            (
                tenant_zipf.sample(&mut rng) as u32 - 1,
                key_zipf.sample(&mut rng) as u16 - 1,
            )
        })
        .collect();
    let names: Vec<TenantId> = (0..tenants)
        .map(|t| TenantId::new(format!("tenant-{t}")).unwrap())
        .collect();
    let keys: Vec<CacheKey> = (0..KEYS)
        .map(|k| CacheKey::new(format!("/assets/{k}.js")).unwrap())
        .collect();
    let regions: Vec<RegionId> = ["eu-west", "us-east", "ap-south"]
        .iter()
        .map(|r| RegionId::new(*r).unwrap())
        .collect();
    let template = AccessEvent::new(
        0,
        names[0].clone(),
        keys[0].clone(),
        regions[0].clone(),
        NodeId::new("edge-1").unwrap(),
        Outcome::Hit,
    );

    // 1 M events over 50 s of event time: one 60 s window holds them all.
    let t0 = 1_764_470_000_000u64;
    let mut refused: HashMap<&'static str, u64> = HashMap::new();
    let started = Instant::now();
    let cpu_started = thread_cpu_ns();
    for (i, (t, k)) in stream.iter().enumerate() {
        let mut e = template.borrowed();
        e.ts_ms = t0 + (i as u64 * 50_000) / events as u64;
        e.tenant = names[*t as usize].borrowed();
        e.key = keys[*k as usize].borrowed();
        e.region = regions[i % 3].borrowed();
        e.outcome = if i % 4 == 0 {
            Outcome::Miss
        } else {
            Outcome::Hit
        };
        if let Err(reason) = heat.apply_ref(&e) {
            *refused.entry(reason.as_str()).or_default() += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (thread_cpu_ns() - cpu_started) as f64 / 1e9;

    // The exact counts of the 20 largest tenants, from the same stream.
    let mut per_tenant = vec![0u64; tenants];
    for (t, _) in &stream {
        per_tenant[*t as usize] += 1;
    }
    let mut largest: Vec<usize> = (0..tenants).collect();
    largest.sort_by_key(|t| std::cmp::Reverse(per_tenant[*t]));
    largest.truncate(20);
    let mut exact: HashMap<(u32, u16), u64> = HashMap::new();
    for (t, k) in &stream {
        if largest.contains(&(*t as usize)) {
            *exact.entry((*t, *k)).or_default() += 1;
        }
    }
    let now = heat.now_ms();
    let (mut all_match, mut served, mut worst, mut worst_bound) = (true, 0, 0u64, 0u64);
    let mut own = 0;
    for t in &largest {
        let tenant = &names[*t];
        let Ok(top) = heat.hot_keys(tenant, None, Window::S60, TOP, now) else {
            all_match = false; // refused by the budget: not served at all
            continue;
        };
        served += 1;
        if heat.tenant(tenant).is_some_and(|h| h.has_own_sketch()) {
            own += 1;
        }
        let bound = heat.error_bound_events(tenant, Window::S60, now).unwrap();
        let mut truth: Vec<u64> = (0..KEYS as u16)
            .map(|k| exact.get(&(*t as u32, k)).copied().unwrap_or(0))
            .collect();
        truth.sort_unstable_by(|a, b| b.cmp(a));
        for (rank, row) in top.iter().enumerate() {
            let k: u16 = row.key.as_str()["/assets/".len()..]
                .trim_end_matches(".js")
                .parse()
                .unwrap();
            let true_count = exact.get(&(*t as u32, k)).copied().unwrap_or(0);
            let over = row.count.saturating_sub(true_count);
            worst = worst.max(over);
            worst_bound = worst_bound.max(bound);
            // The row's key is a true top key: its exact count is the rank's exact
            // count (ties in either order), and its estimate within the bound.
            if true_count != truth[rank] || row.count < true_count || over > bound {
                all_match = false;
            }
        }
        if top.len() < TOP {
            all_match = false;
        }
    }
    let refused_total: u64 = refused.values().sum();
    let mut reasons: Vec<String> = refused.iter().map(|(r, n)| format!("{r}:{n}")).collect();
    reasons.sort();
    println!(
        "layout={layout} tenants={tenants} events={events} tenants_served={} tenants_own={} \
         events_refused={refused_total} refused_reasons={} vm_hwm_mib={:.1} heat_mib={:.1} \
         apply_rate={:.0} apply_rate_cpu={:.0} top20_served={served} top20_own={own} top20_match={all_match} \
         worst_overcount={worst} worst_bound={worst_bound}",
        heat.tenants_len(),
        heat.tenants()
            .iter()
            .filter(|t| t.sketch == pulse::SketchKind::Own)
            .count(),
        if reasons.is_empty() {
            "-".to_owned()
        } else {
            reasons.join(",")
        },
        vm_hwm::vm_hwm_kib() as f64 / 1024.0,
        heat.memory_bytes() as f64 / (1024.0 * 1024.0),
        events as f64 / elapsed,
        events as f64 / cpu,
    );
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`): the
/// per-core rate on a shared machine, where wall time includes waiting for a core.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
