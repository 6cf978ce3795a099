//! The purge case of `scripts/bench/warm` (`--case purge`): the region's 4 edges fill
//! from a regional shield (another prefetcher) in front of the one origin; after the
//! load has warmed them, the prefix of every key (`/assets/`) is purged three times,
//! by a signed purge command on the command topic as pulse sends them: hard without
//! a re-warm, hard with one, soft with one. For each, over the `--measure` seconds
//! after the purge: the origin's peak concurrent fills, its fills per key (the most
//! for one key, and how many keys were filled twice or more), the users' hit ratio
//! and p99.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use models::{CacheKey, PurgeCommand, PurgeMode, RegionTargets, SigningKeys};
use prefetcher::testing::SyntheticOrigin;
use prefetcher::{NodeHandle, spawn_node};
use pulse::percentile;
use tests::{TestKafka, produce_signed, wall_ms};

use super::{Answer, Args, Load, NODES, Pool, node_config, origin, ratio};

const SECRET: &str = "6b1d6a0f0e8c2f4e9a7b3c5d1e2f30415263748596a7b8c9dae0f1021324354f";

struct Row {
    setup: &'static str,
    peak: usize,
    fills: usize,
    most_per_key: usize,
    twice: usize,
    hits: (usize, f64),
    p99_ms: f64,
}

/// Samples the origin's fills in flight every millisecond, keeping the highest.
fn watch_peak(origin: &Arc<SyntheticOrigin>, stop: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let peak = Arc::new(AtomicUsize::new(0));
    let (o, p) = (Arc::clone(origin), peak.clone());
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            p.fetch_max(o.in_flight(), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    peak
}

fn paths(args: &Args) -> Vec<String> {
    (1..=args.keys).map(|r| format!("/assets/{r}.js")).collect()
}

#[allow(clippy::too_many_arguments)]
async fn phase(
    setup: &'static str,
    mode: PurgeMode,
    window_ms: Option<u64>,
    args: &Args,
    origin: &Arc<SyntheticOrigin>,
    answers: &Arc<Mutex<Vec<Answer>>>,
    kafka: &TestKafka,
    topic: &str,
) -> Row {
    let before: HashMap<String, usize> = paths(args)
        .into_iter()
        .map(|p| (p.clone(), origin.fills_for(&p)))
        .collect();
    let fills_before = origin.fills();
    let mut command = PurgeCommand::new(
        format!("purge-{setup}-{}", wall_ms()),
        "acme".parse().unwrap(),
        CacheKey::new("/assets/").unwrap(),
        wall_ms(),
        60_000,
        RegionTargets::All,
    );
    command.mode = mode;
    command.rewarm_window_ms = window_ms;
    let payload = models::encode(&command);
    let signer = SigningKeys::parse(&format!("k1 {SECRET}"))
        .unwrap()
        .signer("k1")
        .unwrap();
    let signature = signer.sign(&payload);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = watch_peak(origin, stop.clone());
    let started = Instant::now();
    produce_signed(
        &kafka.producer(),
        topic,
        "acme/assets/",
        &payload,
        Some(&signature),
    )
    .await;
    let end = started + Duration::from_secs(args.measure);
    tokio::time::sleep_until(end.into()).await;
    stop.store(true, Ordering::Relaxed);
    let per_key: Vec<usize> = before
        .iter()
        .map(|(p, n)| origin.fills_for(p) - n)
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = answers.lock().unwrap();
    let mine: Vec<&Answer> = all
        .iter()
        .filter(|a| a.sent >= started && a.sent < end)
        .collect();
    let mut latencies: Vec<Duration> = mine.iter().map(|a| a.latency).collect();
    latencies.sort_unstable();
    Row {
        setup,
        peak: peak.load(Ordering::Relaxed),
        fills: origin.fills() - fills_before,
        most_per_key: per_key.iter().copied().max().unwrap_or(0),
        twice: per_key.iter().filter(|n| **n > 1).count(),
        hits: ratio(&mine, |_| true),
        p99_ms: percentile(&latencies, 0.99).map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    }
}

/// Runs the purge case and prints its table.
pub(crate) async fn run(
    args: Args,
    kafka: TestKafka,
    topics: (String, String),
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let keys = dir.path().join("command.keys");
    std::fs::write(&keys, format!("k1 {SECRET}\n"))?;
    let shared = Arc::new(origin(args.origin_latency_ms).await);
    let mut config = node_config("shield", &shared.url(), &kafka, &topics, None);
    config.kafka.prewarm_keys_file = Some(keys.clone());
    let shield = spawn_node(config).await?;
    let mut nodes: Vec<NodeHandle> = Vec::new();
    for i in 0..NODES {
        let mut config = node_config(&format!("edge-{i}"), &shield.url(), &kafka, &topics, None);
        config.kafka.prewarm_keys_file = Some(keys.clone());
        config.purge.behind_shield = true;
        nodes.push(spawn_node(config).await?);
    }
    let pool: Pool = Arc::new(RwLock::new(nodes.iter().map(|n| Some(n.url())).collect()));
    let args = Arc::new(args);
    let load = Load::start(&args, &pool);
    eprintln!(
        "purge bench: {} s of load before the first purge",
        args.before
    );
    tokio::time::sleep(Duration::from_secs(args.before)).await;
    let window = args.rewarm_window_ms;
    let cases = [
        ("hard, no re-warm", PurgeMode::Hard, None),
        ("hard + re-warm", PurgeMode::Hard, Some(window)),
        ("soft + re-warm", PurgeMode::Soft, Some(window)),
    ];
    let mut rows = Vec::new();
    for (setup, mode, window_ms) in cases {
        eprintln!("purge bench: {setup}");
        let row = phase(
            setup,
            mode,
            window_ms,
            &args,
            &shared,
            &load.answers,
            &kafka,
            &topics.1,
        )
        .await;
        rows.push(row);
        // Whatever the purge left missing is asked for again before the next one.
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
    }
    load.end().await;

    println!(
        "load: {} keys, Zipf {}, {} requests/s over {NODES} edges behind one shield, origin {} ms; purge of /assets/ (every key), re-warm window {} ms (edges: the window after the shield's)\n",
        args.keys, args.zipf, args.rps, args.origin_latency_ms, window
    );
    println!(
        "| purge | origin peak concurrent fills | origin fills, {} s | most fills of one key | keys filled twice | user hits | p99 ms | requests |",
        args.measure
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.1} % | {:.1} | {} |",
            r.setup,
            r.peak,
            r.fills,
            r.most_per_key,
            r.twice,
            r.hits.1 * 100.0,
            r.p99_ms,
            r.hits.0
        );
    }
    let base = rows[0].peak.max(1) as f64;
    println!(
        "\npeak concurrent origin fills / hard without re-warm: hard + re-warm {:.2}, soft + re-warm {:.2}",
        rows[1].peak as f64 / base,
        rows[2].peak as f64 / base
    );
    for node in nodes {
        node.shutdown().await;
    }
    shield.shutdown().await;
    Ok(())
}
