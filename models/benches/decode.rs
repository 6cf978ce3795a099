//! Decode throughput of the event codec: the first step of pulse's per-message path.
//!
//! `cargo bench -p models --bench decode`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId, decode, encode};

fn decode_events(c: &mut Criterion) {
    let mut event = AccessEvent::new(
        1_764_470_000_000,
        TenantId::new("acme").unwrap(),
        CacheKey::new("/assets/app.3f2a9c.js?v=12").unwrap(),
        RegionId::new("eu-west").unwrap(),
        NodeId::new("edge-eu-west-3").unwrap(),
        Outcome::Miss,
    );
    event.bytes = 48_213;
    event.fill_ms = Some(37);
    let bytes = encode(&event);

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode_access_event", |b| {
        b.iter(|| decode::<AccessEvent>(std::hint::black_box(&bytes)).unwrap())
    });
    group.bench_function("reject_malformed", |b| {
        b.iter(|| {
            decode::<AccessEvent>(std::hint::black_box(&bytes[..bytes.len() - 1])).unwrap_err()
        })
    });
    group.finish();
}

criterion_group!(benches, decode_events);
criterion_main!(benches);
