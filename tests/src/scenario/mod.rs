//! The reference scenario (see the design): three regions of edge nodes, a regional
//! shield per region, an origin that slows down under concurrent fills, a Zipf
//! background load, and a viral key that starts in one region and spreads. The same
//! load (same seed) runs against four set-ups, and each gets the same figures: origin
//! requests per second (peak over baseline), hit ratio of the hot keys, client latency,
//! and for the pre-warm set-up the lead time and the useful and wasted commands.
//!
//! The `demo` binary (`scripts/demo`) runs it on an embedded broker; the `scenario`
//! test runs it against the broker under test with bounds that hold on a noisy
//! machine. Pulse runs as it ships ([`pulse::start`] with a [`PulseConfig`]), past
//! its warm-up: see [`pulse_config`].
//!
//! # Layout
//! - `origin`: [`LoadedOrigin`], the backend.
//! - `load`: the open-loop clients and their [`Answer`]s.

mod load;
mod origin;

use std::sync::Arc;
use std::time::{Duration, Instant};

use models::{NodeId, RegionId, TenantId};
use prefetcher::{Config, NodeHandle, spawn_node};
use pulse::{AppState, PulseConfig, PulseHandle, Verdict, percentile};
use serde::Serialize;

pub use load::{Answer, LoadPlan};
pub use origin::{LoadedOrigin, OriginProfile};

/// Background keys ranked this high or higher count as hot, with the viral key.
pub const HOT_RANKS: usize = 5;

/// The four set-ups, from no protection to all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setup {
    /// Edge nodes with a cache but no request collapsing, straight to the origin.
    NoCollapsing,
    /// Edge nodes that collapse concurrent misses, straight to the origin.
    NodeCollapsing,
    /// Collapsing edge nodes behind a collapsing regional shield per region.
    NodeAndRegional,
    /// All of that, plus pulse predicting and the nodes pre-warming.
    Prewarm,
}

impl Setup {
    /// All four, in the order of the report.
    pub const ALL: [Setup; 4] = [
        Setup::NoCollapsing,
        Setup::NodeCollapsing,
        Setup::NodeAndRegional,
        Setup::Prewarm,
    ];

    /// The name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Setup::NoCollapsing => "no collapsing",
            Setup::NodeCollapsing => "node collapsing",
            Setup::NodeAndRegional => "node + regional",
            Setup::Prewarm => "node + regional + pre-warm",
        }
    }
}

/// The scenario's shape.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// Random seed of the load.
    pub seed: u64,
    /// Regions.
    pub regions: usize,
    /// Edge nodes per region.
    pub nodes_per_region: usize,
    /// How long each set-up runs.
    pub duration: Duration,
    /// When the viral key appears in its first region.
    pub viral_at: Duration,
    /// Delay between regions as it spreads.
    pub spread_every: Duration,
    /// Background requests per second over the fleet.
    pub background_rps: f64,
    /// Viral requests per second per region once it has arrived.
    pub viral_rps: f64,
    /// Distinct background keys.
    pub keys: usize,
    /// Zipf exponent of background key popularity.
    pub zipf_exponent: f64,
    /// The origin.
    pub origin: OriginProfile,
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        ScenarioConfig {
            seed: 42,
            regions: 3,
            nodes_per_region: 4,
            duration: Duration::from_secs(35),
            viral_at: Duration::from_secs(15),
            spread_every: Duration::from_secs(4),
            background_rps: 150.0,
            viral_rps: 300.0,
            keys: 200,
            zipf_exponent: 1.1,
            origin: OriginProfile {
                base_latency: Duration::from_millis(150),
                latency_per_fill: Duration::from_millis(10),
                max_latency: Duration::from_secs(3),
                object_bytes: 4_096,
                max_age: Duration::from_secs(300),
            },
        }
    }
}

impl ScenarioConfig {
    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=16).contains(&self.regions) {
            return Err("regions: 1 to 16".into());
        }
        if !(1..=16).contains(&self.nodes_per_region) {
            return Err("nodes_per_region: 1 to 16".into());
        }
        if self.viral_at < Duration::from_secs(3) || self.viral_at >= self.duration {
            return Err("viral_at: at least 3 s, and before the end of the run".into());
        }
        for (field, rate) in [
            ("background_rps", self.background_rps),
            ("viral_rps", self.viral_rps),
        ] {
            if !(rate > 0.0 && rate <= 5_000.0) {
                return Err(format!("{field}: must be in (0, 5000]"));
            }
        }
        if self.keys == 0 {
            return Err("keys: must be positive".into());
        }
        Ok(())
    }
}

/// Kafka for the pre-warm set-up: a broker and two topics nobody else uses.
#[derive(Debug, Clone)]
pub struct ScenarioKafka {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Where the nodes publish access events.
    pub events_topic: String,
    /// Where pulse publishes pre-warm commands.
    pub prewarm_topic: String,
}

/// The figures of one set-up.
#[derive(Debug, Clone, Serialize)]
pub struct SetupReport {
    /// Which set-up.
    pub setup: Setup,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed or timed out.
    pub errors: usize,
    /// Origin requests per second before the viral key (mean of the 5 s before it).
    pub origin_baseline_rps: f64,
    /// Most origin requests in one second from the viral key on.
    pub origin_peak_rps: f64,
    /// Share of hot-key requests (the viral key and the [`HOT_RANKS`] most popular
    /// background keys, from the viral key's arrival on) answered from cache: hit,
    /// stale or pre-warmed.
    pub hot_hit_ratio: f64,
    /// The same, for the viral key alone.
    pub viral_hit_ratio: f64,
    /// Median client latency from the viral key's arrival on.
    pub p50_ms: f64,
    /// 99th percentile client latency from the viral key's arrival on.
    pub p99_ms: f64,
    /// Median time from a pre-warm command to the first request in a warmed region.
    pub prewarm_lead_ms: Option<f64>,
    /// Commands requested in a warmed region before expiry.
    pub prewarm_useful: Option<u64>,
    /// Commands that expired unused.
    pub prewarm_wasted: Option<u64>,
}

impl SetupReport {
    /// Origin peak over baseline (baseline floored at 1 request per second).
    pub fn peak_over_baseline(&self) -> f64 {
        self.origin_peak_rps / self.origin_baseline_rps.max(1.0)
    }
}

/// A live view of the pre-warm set-up's pulse, for a dashboard.
pub type DashboardHook = Arc<dyn Fn(AppState) + Send + Sync>;

/// Runs one set-up from a cold start and measures it. `progress` hears the seconds.
pub async fn run_setup(
    setup: Setup,
    config: &ScenarioConfig,
    kafka: Option<&ScenarioKafka>,
    dashboard: Option<DashboardHook>,
    progress: impl Fn(Setup, Duration) + Send + Sync + 'static,
) -> anyhow::Result<SetupReport> {
    config.validate().map_err(anyhow::Error::msg)?;
    let origin = LoadedOrigin::start(config.origin.clone()).await?;
    let tenant: TenantId = "demo".parse()?;
    let prewarm = setup == Setup::Prewarm;
    let kafka = match (prewarm, kafka) {
        (true, Some(k)) => Some(k),
        (true, None) => anyhow::bail!("the pre-warm set-up needs Kafka"),
        (false, _) => None,
    };

    // Pulse first, so it is reading before the first event.
    let pulse = match kafka {
        Some(k) => Some(pulse::start(pulse_config(k)).await?),
        None => None,
    };
    if let (Some(pulse), Some(hook)) = (&pulse, &dashboard) {
        hook(pulse.state());
    }

    let mut handles: Vec<NodeHandle> = Vec::new();
    let mut nodes = Vec::new();
    for r in 0..config.regions {
        let region: RegionId = format!("region-{r}").parse()?;
        let upstream = if matches!(setup, Setup::NodeAndRegional | Setup::Prewarm) {
            let mut shield =
                Config::single_origin("127.0.0.1:0".parse()?, tenant.clone(), origin.url());
            shield.region = Some(region.clone());
            let shield = spawn_node(shield).await?;
            let url = shield.url();
            handles.push(shield);
            url
        } else {
            origin.url()
        };
        let mut urls = Vec::new();
        for n in 0..config.nodes_per_region {
            let mut node =
                Config::single_origin("127.0.0.1:0".parse()?, tenant.clone(), upstream.clone());
            node.flight.collapse = setup != Setup::NoCollapsing;
            node.region = Some(region.clone());
            if let Some(k) = kafka {
                node.node = Some(format!("edge-{r}-{n}").parse::<NodeId>()?);
                node.kafka.brokers = Some(k.brokers.clone());
                node.kafka.events_topic = k.events_topic.clone();
                node.kafka.prewarm_topic = k.prewarm_topic.clone();
            }
            let handle = spawn_node(node).await?;
            urls.push(handle.url());
            handles.push(handle);
        }
        nodes.push(urls);
    }

    let plan = LoadPlan {
        seed: config.seed,
        duration: config.duration,
        background_rps: config.background_rps,
        keys: config.keys,
        zipf_exponent: config.zipf_exponent,
        hot_ranks: HOT_RANKS,
        viral_key: "/live/breaking-story.json".into(),
        viral_at: config.viral_at,
        spread_every: config.spread_every,
        viral_rps: config.viral_rps,
        nodes,
        timeout: Duration::from_secs(10),
    };
    let load_started = Instant::now();
    let answers = load::run(plan, move |t| progress(setup, t)).await;
    let offset = load_started.duration_since(origin.started()).as_secs() as usize;

    let mut report = measure(setup, config, &answers, &origin.per_second(), offset);
    if let Some(pulse) = pulse {
        finish(pulse, &mut report).await;
    }
    for handle in handles {
        handle.shutdown().await;
    }
    Ok(report)
}

fn measure(
    setup: Setup,
    config: &ScenarioConfig,
    answers: &[Answer],
    origin_per_second: &[u64],
    offset: usize,
) -> SetupReport {
    let from_cache =
        |a: &&Answer| a.ok && matches!(a.x_cache.as_deref(), Some("HIT" | "STALE" | "PREFETCHED"));
    let ratio = |pick: &dyn Fn(&Answer) -> bool| {
        let all: Vec<&Answer> = answers.iter().filter(|a| pick(a)).collect();
        if all.is_empty() {
            return 1.0;
        }
        all.iter().filter(|a| from_cache(a)).count() as f64 / all.len() as f64
    };
    // Hot keys count from the viral key's arrival: before it, every set-up is the same.
    let viral_at = config.viral_at;
    let hot_hit_ratio = ratio(&|a| a.hot && a.sent >= viral_at);
    let viral_hit_ratio = ratio(&|a| a.viral);
    // Latency under contention: the requests sent from the viral key's arrival on.
    let mut latencies: Vec<Duration> = answers
        .iter()
        .filter(|a| a.sent >= viral_at)
        .map(|a| a.latency)
        .collect();
    latencies.sort_unstable();
    let ms = |q: f64| percentile(&latencies, q).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let second = |s: usize| origin_per_second.get(s + offset).copied().unwrap_or(0) as f64;
    let at = viral_at.as_secs() as usize;
    let baseline = (at.saturating_sub(5)..at).map(second).sum::<f64>() / 5.0;
    let peak = (at..config.duration.as_secs() as usize)
        .map(second)
        .fold(0.0, f64::max);
    SetupReport {
        setup,
        requests: answers.len(),
        errors: answers.iter().filter(|a| !a.ok).count(),
        origin_baseline_rps: baseline,
        origin_peak_rps: peak,
        hot_hit_ratio,
        viral_hit_ratio,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        prewarm_lead_ms: None,
        prewarm_useful: None,
        prewarm_wasted: None,
    }
}

/// Pulse as it ships, on the scenario's topics, with its own consumer group and its
/// API on a free port, but with the model's own confidence (`--no-calibrate-online`):
/// a fresh pulse waits for a key's second region until a TTL's worth of first-region
/// outcomes are judged, and a run of seconds holds none. The scenario measures the
/// stampede defence of a pulse past that warm-up, whose confidence is the model's
/// while its outcomes agree with it.
fn pulse_config(kafka: &ScenarioKafka) -> PulseConfig {
    PulseConfig {
        brokers: Some(kafka.brokers.clone()),
        topic: kafka.events_topic.clone(),
        group: format!("{}-pulse", kafka.events_topic),
        prewarm_topic: kafka.prewarm_topic.clone(),
        listen: "127.0.0.1:0".parse().expect("a socket address"),
        calibrate_online: false,
        ..PulseConfig::default()
    }
}

/// Stops pulse (ingest first, so no decision changes meanwhile) and adds the pre-warm
/// figures to the report.
async fn finish(pulse: PulseHandle, report: &mut SetupReport) {
    let partitions = pulse.partitions().clone();
    pulse.shutdown().await;
    let partitions = partitions.read().unwrap_or_else(|e| e.into_inner());
    if !partitions.prediction_on() {
        return;
    }
    // Every partition's decisions (the states stay readable after shutdown).
    let mut decisions = Vec::new();
    for state in partitions.states().values() {
        if let Some(p) = &state.predictor {
            let p = p.lock().unwrap_or_else(|e| e.into_inner());
            decisions.extend(p.decisions().cloned());
        }
    }
    let mut leads: Vec<Duration> = decisions
        .iter()
        .flat_map(|d| {
            d.lead_times_ms
                .iter()
                .map(|(_, ms)| Duration::from_millis(*ms))
        })
        .collect();
    leads.sort_unstable();
    report.prewarm_lead_ms = percentile(&leads, 0.5).map(|d| d.as_secs_f64() * 1000.0);
    report.prewarm_useful = Some(
        decisions
            .iter()
            .filter(|d| d.verdict == Verdict::Useful)
            .count() as u64,
    );
    report.prewarm_wasted = Some(
        decisions
            .iter()
            .filter(|d| d.verdict == Verdict::Wasted)
            .count() as u64,
    );
}

/// The report as a Markdown table, one row per set-up.
pub fn table(reports: &[SetupReport]) -> String {
    let mut out = String::from(
        "| set-up | origin peak / baseline (req/s) | hot-key hit ratio | viral-key hit ratio | p50 | p99 | pre-warm lead | useful / wasted pre-warms | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {:.1}× ({:.0} / {:.1}) | {:.2} % | {:.2} % | {:.1} ms | {:.0} ms | {} | {} | {} / {} |\n",
            r.setup.as_str(),
            r.peak_over_baseline(),
            r.origin_peak_rps,
            r.origin_baseline_rps,
            r.hot_hit_ratio * 100.0,
            r.viral_hit_ratio * 100.0,
            r.p50_ms,
            r.p99_ms,
            r.prewarm_lead_ms.map_or("–".into(), |ms| format!("{:.1} s", ms / 1000.0)),
            match (r.prewarm_useful, r.prewarm_wasted) {
                (Some(u), Some(w)) => format!("{u} / {w}"),
                _ => "–".into(),
            },
            r.errors,
            r.requests,
        ));
    }
    out
}
