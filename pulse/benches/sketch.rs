//! The sketch path per core: decode an event, update the windows and Top-Ks, as the
//! ingest thread does it (zero-copy decode, `HeatMap::apply_ref`). `decode_owned`
//! measures `decode::<AccessEvent>` for comparison.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use models::{
    AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, decode, decode_event_ref, encode,
};
use pulse::{HeatConfig, HeatMap, Window};
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

const N: usize = 100_000;

fn events() -> Vec<AccessEvent> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let zipf = Zipf::new(1_000_000.0, 1.05).unwrap();
    (0..N)
        .map(|i| {
            AccessEvent::new(
                1_764_470_000_000 + (i as u64) / 50, // 50 events per ms: 2 s of traffic
                TenantId::new("acme").unwrap(),
                CacheKey::new(format!("/assets/{}.js", zipf.sample(&mut rng) as u64)).unwrap(),
                RegionId::new(["eu-west", "us-east", "ap-south"][i % 3]).unwrap(),
                NodeId::new(format!("edge-{}", i % 8)).unwrap(),
                Outcome::ALL[i % 4],
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let events = events();
    let encoded: Vec<Vec<u8>> = events.iter().map(encode).collect();
    let mut group = c.benchmark_group("sketch_path");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(10);

    group.bench_function("decode", |b| {
        b.iter(|| {
            for bytes in &encoded {
                black_box(decode_event_ref(bytes).unwrap());
            }
        })
    });
    group.bench_function("decode_owned", |b| {
        b.iter(|| {
            for bytes in &encoded {
                black_box(decode::<AccessEvent>(bytes).unwrap());
            }
        })
    });
    group.bench_function("apply", |b| {
        let mut heat = HeatMap::new(HeatConfig::default());
        b.iter(|| {
            for e in &events {
                let _ = black_box(heat.apply(e));
            }
        })
    });
    group.bench_function("decode_and_apply", |b| {
        let mut heat = HeatMap::new(HeatConfig::default());
        b.iter(|| {
            for bytes in &encoded {
                let e = decode_event_ref(bytes).unwrap();
                let _ = black_box(heat.apply_ref(&e));
            }
        })
    });
    group.finish();

    let mut heat = HeatMap::new(HeatConfig::default());
    for e in &events {
        heat.apply(e).unwrap();
    }
    let tenant = TenantId::new("acme").unwrap();
    c.bench_function("hot_keys_top20_10s", |b| {
        b.iter(|| black_box(heat.hot_keys(&tenant, None, Window::S10, 20, heat.now_ms())))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
