//! The bench of `scripts/bench/warm`: a region of 4 edge nodes under an open-loop Zipf
//! load on a real broker, pulse reading their events; one node is restarted with an
//! empty cache three times, first without warming (it takes traffic at once), then with
//! `[warmup]` (it takes traffic once its `/readyz` says 200, as a load balancer
//! would), then with `[warmup]` and the region's other nodes as `warmup.peers`.
//! Prints one row per restart for that node's first `--measure` seconds.
//!
//! With `--case purge` (`warm/purge.rs`), the same load on 4 edges behind a shield,
//! and a prefix purged hard, hard with a re-warm, soft with a re-warm.
//!
//! ```sh
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 \
//!     cargo run --release -p tests --example warm -- --keys 10000 --zipf 1.0
//! ```

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prefetcher::testing::SyntheticOrigin;
use prefetcher::{Config, NodeHandle, WarmupConfig, spawn_node};
use pulse::{PulseConfig, percentile};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp, Zipf};
use tests::TestKafka;
use tests::scenario::{HOT_RANKS, ScenarioConfig};

#[path = "warm/purge.rs"]
mod purge;

/// Restart one node of a loaded region cold, without and with warming. The load's
/// defaults are the reference scenario's background (`tests::scenario`): its keys,
/// Zipf exponent, rate, hot ranks and origin latency.
#[derive(Parser)]
struct Args {
    /// Requests per second over the region.
    #[arg(long, default_value_t = ScenarioConfig::default().background_rps)]
    rps: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = ScenarioConfig::default().keys)]
    keys: usize,
    /// Zipf exponent of key popularity.
    #[arg(long, default_value_t = ScenarioConfig::default().zipf_exponent)]
    zipf: f64,
    /// Keys ranked this high or higher are the hot keys.
    #[arg(long, default_value_t = HOT_RANKS)]
    hot_ranks: usize,
    /// Seconds of load before the first restart (pulse learns the region).
    #[arg(long, default_value_t = 40)]
    before: u64,
    /// Seconds of the restarted node measured, from its start.
    #[arg(long, default_value_t = 30)]
    measure: u64,
    /// `warmup.max_keys`.
    #[arg(long, default_value_t = 500)]
    max_keys: usize,
    /// pulse's `--region-top-k`: keys kept per tenant, region and second.
    #[arg(long, default_value_t = 256)]
    region_top_k: usize,
    /// The origin's time to answer, ms.
    #[arg(long, default_value_t = ScenarioConfig::default().origin.base_latency.as_millis() as u64)]
    origin_latency_ms: u64,
    /// Random seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// `restart` (a node restarted cold, without and with warming) or `purge` (a
    /// prefix purged without and with a re-warm).
    #[arg(long, default_value = "restart")]
    case: String,
    /// The purge case's re-warm window, ms (the shield's; the edges re-warm in the
    /// window after it).
    #[arg(long, default_value_t = 12_000)]
    rewarm_window_ms: u64,
    /// The purge case's seconds between the end of one measure and the next purge.
    #[arg(long, default_value_t = 10)]
    settle: u64,
}

/// One answer: who served it, for which key, how.
struct Answer {
    sent: Instant,
    slot: usize,
    hot: bool,
    latency: Duration,
    hit: bool,
}

/// The load balancer's view: each slot's URL while it takes traffic.
type Pool = Arc<RwLock<Vec<Option<String>>>>;

const REGION: &str = "eu-west";
const NODES: usize = 4;
const RESTARTED: usize = NODES - 1;

fn node_config(
    name: &str,
    origin: &str,
    kafka: &TestKafka,
    topics: &(String, String),
    warmup: Option<WarmupConfig>,
) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        "acme".parse().unwrap(),
        origin,
    );
    c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    c.region = Some(REGION.parse().unwrap());
    c.node = Some(name.parse().unwrap());
    c.kafka.brokers = Some(kafka.bootstrap_servers().to_owned());
    c.kafka.events_topic = topics.0.clone();
    c.kafka.prewarm_topic = topics.1.clone();
    c.warmup = warmup;
    c
}

async fn origin(latency_ms: u64) -> SyntheticOrigin {
    let o = SyntheticOrigin::start("origin").await;
    o.set_latency(Duration::from_millis(latency_ms));
    o.set_body_size(8 * 1024);
    o.set_cache_control(Some("public, max-age=3600"));
    o
}

/// The open-loop load: requests leave on a Poisson schedule, each to the next slot
/// taking traffic (round robin), whether or not earlier ones have returned.
async fn load(
    args: &Args,
    pool: Pool,
    answers: Arc<Mutex<Vec<Answer>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build_http();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let zipf = Zipf::new(args.keys as f64, args.zipf).unwrap();
    let gap = Exp::new(args.rps).unwrap();
    let mut next = Instant::now();
    let mut turn = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        next += Duration::from_secs_f64(gap.sample(&mut rng));
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
        let rank = zipf.sample(&mut rng) as usize;
        let (slot, url) = {
            let pool = pool.read().unwrap();
            let live: Vec<(usize, &String)> = pool
                .iter()
                .enumerate()
                .filter_map(|(i, u)| u.as_ref().map(|u| (i, u)))
                .collect();
            turn += 1;
            let (slot, base) = live[turn % live.len()];
            (slot, format!("{base}/assets/{rank}.js"))
        };
        let client = client.clone();
        let answers = answers.clone();
        let hot = rank <= args.hot_ranks;
        tokio::spawn(async move {
            let sent = Instant::now();
            let request = hyper::Request::get(&url)
                .header("host", "acme.example")
                .body(Empty::new())
                .unwrap();
            let hit = tokio::time::timeout(Duration::from_secs(10), async {
                let response = client.request(request).await.ok()?;
                let x_cache = response
                    .headers()
                    .get("x-cache")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                response.into_body().collect().await.ok()?;
                Some(matches!(
                    x_cache.as_deref(),
                    Some("HIT" | "STALE" | "PREFETCHED")
                ))
            })
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
            answers.lock().unwrap().push(Answer {
                sent,
                slot,
                hot,
                latency: sent.elapsed(),
                hit,
            });
        });
    }
}

/// [`load`] while it runs: its answers so far, and the switch that ends it.
struct Load {
    answers: Arc<Mutex<Vec<Answer>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Starts the open-loop load on `pool`.
    fn start(args: &Arc<Args>, pool: &Pool) -> Load {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (args, pool, answers, stop) =
                (args.clone(), pool.clone(), answers.clone(), stop.clone());
            tokio::spawn(async move { load(&args, pool, answers, stop).await })
        };
        Load {
            answers,
            stop,
            task,
        }
    }

    /// Ends the load once its last request has left.
    async fn end(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
    }
}

async fn ready(node: &NodeHandle) -> bool {
    let url = format!("http://{}/readyz", node.admin_addr().unwrap());
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    match client
        .request(hyper::Request::get(url).body(Empty::new()).unwrap())
        .await
    {
        Ok(r) => r.status() == 200,
        Err(_) => false,
    }
}

struct Row {
    setup: &'static str,
    fills: usize,
    user_fills: u64,
    warming: Duration,
    first_second: (usize, f64),
    hot: (usize, f64),
    all: (usize, f64),
    p99_ms: f64,
}

fn ratio(answers: &[&Answer], pick: impl Fn(&Answer) -> bool) -> (usize, f64) {
    let chosen: Vec<&&Answer> = answers.iter().filter(|a| pick(a)).collect();
    let hits = chosen.iter().filter(|a| a.hit).count();
    (chosen.len(), hits as f64 / chosen.len().max(1) as f64)
}

#[allow(clippy::too_many_arguments)]
async fn restart(
    setup: &'static str,
    args: &Args,
    pool: &Pool,
    answers: &Arc<Mutex<Vec<Answer>>>,
    nodes: &mut [Option<NodeHandle>],
    kafka: &TestKafka,
    topics: &(String, String),
    warmup: Option<WarmupConfig>,
) -> (Row, SyntheticOrigin) {
    // Out of the pool, then stopped: its cache is gone.
    pool.write().unwrap()[RESTARTED] = None;
    if let Some(old) = nodes[RESTARTED].take() {
        old.shutdown().await;
    }
    let o = origin(args.origin_latency_ms).await;
    let warming = warmup.is_some();
    let started = Instant::now();
    let node = spawn_node(node_config(
        &format!("edge-{RESTARTED}-{}", setup.replace(' ', "-")),
        &o.url(),
        kafka,
        topics,
        warmup,
    ))
    .await
    .unwrap();
    while !ready(&node).await {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_after = started.elapsed();
    let ready_at = Instant::now();
    pool.write().unwrap()[RESTARTED] = Some(node.url());
    let end = started + Duration::from_secs(args.measure);
    tokio::time::sleep_until(end.into()).await;
    let fills = o.fills();
    let warmup = &node.node().metrics().warmup;
    // The warm-up's fills that reached the origin: those no peer answered.
    let warm_fills = warmup
        .keys("filled")
        .saturating_sub(warmup.peer_asks("hit"));
    // Answers of requests sent in the window have all returned 10 s later at most.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = answers.lock().unwrap();
    let mine: Vec<&Answer> = all
        .iter()
        .filter(|a| a.slot == RESTARTED && a.sent >= started && a.sent < end)
        .collect();
    let mut latencies: Vec<Duration> = mine.iter().map(|a| a.latency).collect();
    latencies.sort_unstable();
    let first = ready_at + Duration::from_secs(1);
    let row = Row {
        setup,
        fills,
        user_fills: (fills as u64).saturating_sub(warm_fills),
        warming: if warming { ready_after } else { Duration::ZERO },
        first_second: ratio(&mine, |a| a.hot && a.sent < first),
        hot: ratio(&mine, |a| a.hot),
        all: ratio(&mine, |_| true),
        p99_ms: percentile(&latencies, 0.99).map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    };
    drop(all);
    nodes[RESTARTED] = Some(node);
    (row, o)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kafka = TestKafka::real();
    let topics = (
        kafka.unique_topic("bench-warm-events"),
        kafka.unique_topic("bench-warm-prewarm"),
    );
    kafka.create_topic(&topics.0, 4).await;
    kafka.create_topic(&topics.1, 1).await;
    let heat = pulse::HeatConfig {
        region_top_k: args.region_top_k,
        ..pulse::HeatConfig::default()
    };
    let pulse = pulse::start(PulseConfig {
        brokers: Some(kafka.bootstrap_servers().to_owned()),
        topic: topics.0.clone(),
        group: format!("{}-pulse", topics.0),
        prewarm_topic: topics.1.clone(),
        prewarm: false,
        listen: "127.0.0.1:0".parse()?,
        heat,
        ..PulseConfig::default()
    })
    .await?;
    let pulse_url = format!("http://{}", pulse.api_addr());
    if args.case == "purge" {
        purge::run(args, kafka, topics).await?;
        pulse.shutdown().await;
        return Ok(());
    }

    let shared = origin(args.origin_latency_ms).await;
    let mut nodes: Vec<Option<NodeHandle>> = Vec::new();
    for i in 0..NODES {
        let node = spawn_node(node_config(
            &format!("edge-{i}"),
            &shared.url(),
            &kafka,
            &topics,
            None,
        ))
        .await?;
        nodes.push(Some(node));
    }
    let pool: Pool = Arc::new(RwLock::new(
        nodes
            .iter()
            .map(|n| n.as_ref().map(NodeHandle::url))
            .collect(),
    ));
    let args = Arc::new(args);
    let load = Load::start(&args, &pool);
    eprintln!(
        "warm bench: {} s of load before the first restart",
        args.before
    );
    tokio::time::sleep(Duration::from_secs(args.before)).await;

    let warmup = WarmupConfig {
        pulse: pulse_url,
        max_keys: args.max_keys,
        deadline_ms: args.measure * 1000,
        ..WarmupConfig::default()
    };
    let peers = nodes[..RESTARTED]
        .iter()
        .flatten()
        .map(NodeHandle::url)
        .collect();
    let setups = [
        ("cold", "no warming", None),
        ("warmed", "with [warmup]", Some(warmup.clone())),
        (
            "warmed from peers",
            "with [warmup] and the region's nodes as peers",
            Some(WarmupConfig { peers, ..warmup }),
        ),
    ];
    let mut rows = Vec::new();
    // Each restarted node's origin lives to the end, as the node does.
    let mut origins = Vec::new();
    for (setup, how, warmup) in setups {
        eprintln!("warm bench: restart cold, {how}");
        let (row, origin) = restart(
            setup,
            &args,
            &pool,
            &load.answers,
            &mut nodes,
            &kafka,
            &topics,
            warmup,
        )
        .await;
        rows.push(row);
        origins.push(origin);
    }
    load.end().await;

    println!(
        "load: {} keys, Zipf {}, {} requests/s over {NODES} nodes, hot = ranks <= {}, origin {} ms, warmup.max_keys {}\n",
        args.keys, args.zipf, args.rps, args.hot_ranks, args.origin_latency_ms, args.max_keys
    );
    println!(
        "| restart | origin fills, first {} s | of them clients waited on | /readyz warming | hot-key hits, first s of traffic | hot-key hits, {} s | all hits, {} s | p99 ms | requests |",
        args.measure, args.measure, args.measure
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} s | {:.1} % ({}) | {:.1} % ({}) | {:.1} % | {:.1} | {} |",
            r.setup,
            r.fills,
            r.user_fills,
            r.warming.as_secs_f64(),
            r.first_second.1 * 100.0,
            r.first_second.0,
            r.hot.1 * 100.0,
            r.hot.0,
            r.all.1 * 100.0,
            r.p99_ms,
            r.all.0
        );
    }
    let cold = &rows[0];
    println!();
    for warm in &rows[1..] {
        println!(
            "{} / cold: origin fills {:.2}, fills clients waited on {:.2}, p99 {:.2}",
            warm.setup,
            warm.fills as f64 / cold.fills.max(1) as f64,
            warm.user_fills as f64 / cold.user_fills.max(1) as f64,
            warm.p99_ms / cold.p99_ms.max(f64::MIN_POSITIVE)
        );
    }
    for node in nodes.into_iter().flatten() {
        node.shutdown().await;
    }
    pulse.shutdown().await;
    Ok(())
}
