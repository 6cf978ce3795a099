//! Peak RSS with 10 M distinct keys in one window, and the top keys' error.
//!
//! `cargo run --profile bench -p pulse --example rss [-- KEYS]`. Prints one line of
//! `key=value` pairs for scripts/bench/pulse.

#[path = "support/vm_hwm.rs"]
mod vm_hwm;

use std::collections::HashMap;

use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
use pulse::{HeatConfig, HeatMap, Window};

fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let config = HeatConfig::default();
    let mut heat = HeatMap::new(config.clone());
    let tenant = TenantId::new("acme").unwrap();
    let regions: Vec<RegionId> = ["eu-west", "us-east", "ap-south"]
        .iter()
        .map(|r| RegionId::new(*r).unwrap())
        .collect();
    let node = NodeId::new("edge-1").unwrap();
    let t0 = 1_764_470_000_000u64;
    // 10 hot keys with known counts, interleaved with `keys` distinct cold keys, all
    // inside 9 s of event time (one 10 s window).
    let hot: Vec<(String, u64)> = (0..10)
        .map(|i| (format!("/hot/{i}"), 20_000 - i * 1_000))
        .collect();
    let hot_total: u64 = hot.iter().map(|(_, c)| c).sum();
    let total = keys + hot_total;
    let mut exact: HashMap<&str, u64> = HashMap::new();
    let mut hot_left: Vec<u64> = hot.iter().map(|(_, c)| *c).collect();
    let every = total / hot_total;
    let mut cold = 0u64;
    for i in 0..total {
        let ts = t0 + i * 9_000 / total;
        let key = if i % every == 0 && hot_left.iter().any(|c| *c > 0) {
            let j = (i / every) as usize % hot.len();
            let j = (j..j + hot.len())
                .map(|x| x % hot.len())
                .find(|x| hot_left[*x] > 0)
                .unwrap();
            hot_left[j] -= 1;
            *exact.entry(hot[j].0.as_str()).or_default() += 1;
            hot[j].0.clone()
        } else {
            cold += 1;
            format!("/cold/{cold}")
        };
        let e = AccessEvent::new(
            ts,
            tenant.clone(),
            CacheKey::new(key).unwrap(),
            regions[i as usize % 3].clone(),
            node.clone(),
            Outcome::Miss,
        );
        heat.apply(&e).unwrap();
    }
    let now = heat.now_ms();
    let bound = (config.error_bound() * total as f64).ceil() as u64;
    let top = heat.hot_keys(&tenant, None, Window::S10, 10, now).unwrap();
    let mut worst = 0u64;
    let mut all_hot = true;
    for row in &top {
        match exact.get(row.key.as_str()) {
            Some(truth) => worst = worst.max(row.count.saturating_sub(*truth)),
            None => all_hot = false,
        }
    }
    println!(
        "events={total} distinct_keys={} vm_hwm_mib={:.1} sketch_bytes_mib={:.1} top10_are_hot={all_hot} worst_top_overcount={worst} error_bound={bound}",
        cold + hot.len() as u64,
        vm_hwm::vm_hwm_kib() as f64 / 1024.0,
        heat.memory_bytes() as f64 / (1024.0 * 1024.0),
    );
}
