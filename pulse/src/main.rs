//! The `pulse` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use pulse::{
    AppState, BatchObserver, DecisionPolicy, EVENTS_TOPIC, EmbeddedBroker, HeatConfig, HeatMap,
    Ingest, IngestConfig, Metrics, PREWARM_TOPIC, Predictor, PredictorConfig, PrewarmLoop,
    PrewarmPublisher, Retrainer,
};

/// Pulse watches edge access events and pre-warms hot keys across regions.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded Kafka broker (librdkafka's mock cluster) on loopback with the
    /// `edge-events` and `prewarm` topics, print its address, and wait for Ctrl-C.
    Broker {
        /// Partitions per topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
    /// Consume access events into the heat map and serve the dashboard API.
    Serve(Box<ServeArgs>),
    /// Generate a synthetic trace: a Zipf background, viral events that spread across
    /// regions, cron-like bursts, and noise bursts that must not trigger.
    Trace(TraceArgs),
    /// Fit the scoring model to a recorded or generated event file and save it.
    Train(TrainArgs),
    /// Replay an event file through the predictor at several thresholds and print
    /// precision, recall, median lead time and wasted pre-warms.
    Backtest(BacktestArgs),
    /// The reference scenario on one machine (the README's main command): an origin,
    /// edge nodes and regional shields, a Zipf background and a viral key that spreads
    /// across regions, run against four set-ups on an embedded broker; prints a table.
    Demo(DemoArgs),
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Seconds each set-up runs.
    #[arg(long, default_value_t = 35)]
    duration_secs: u64,
    /// Second at which the viral key appears in its first region.
    #[arg(long, default_value_t = 15)]
    viral_at_secs: u64,
    /// Seconds between the viral key reaching one region and the next.
    #[arg(long, default_value_t = 4)]
    spread_secs: u64,
    /// Background requests per second over the fleet.
    #[arg(long, default_value_t = pulse::scenario::ScenarioConfig::default().background_rps)]
    background_rps: f64,
    /// Viral requests per second per region once it has arrived.
    #[arg(long, default_value_t = pulse::scenario::ScenarioConfig::default().viral_rps)]
    viral_rps: f64,
    /// Regions.
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Edge nodes per region.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Distinct background keys.
    #[arg(long, default_value_t = pulse::scenario::ScenarioConfig::default().keys)]
    keys: usize,
    /// Origin fill latency when idle, in milliseconds (it grows with concurrent fills).
    #[arg(long, default_value_t = 150)]
    origin_ms: u64,
    /// Random seed of the load (the same for every set-up).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Kafka bootstrap servers; an embedded broker without it.
    #[arg(long, env = "PULSE_BROKERS")]
    brokers: Option<String>,
    /// Where the dashboard listens while the pre-warm set-up runs (and after, with
    /// --hold).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Keep serving the dashboard after the run until Ctrl-C.
    #[arg(long)]
    hold: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// Where to write the events (JSON lines, the Kafka message format).
    #[arg(long)]
    out: PathBuf,
    /// Where to write the truth about the injected bursts (JSON), for `backtest --truth`.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// A JSON file of generator settings (see `TraceSpec`); flags below override it.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Random seed: the same seed gives the same trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Time of the first event, ms since the Unix epoch (time-of-day features depend
    /// on it: train on traces spread over the week).
    #[arg(long)]
    start_ms: Option<u64>,
    /// Length of the trace in minutes.
    #[arg(long)]
    minutes: Option<u64>,
    /// Viral events to inject.
    #[arg(long)]
    virals: Option<usize>,
    /// Background requests per second over the fleet.
    #[arg(long)]
    background_rps: Option<f64>,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// The events to learn from: a JSON-lines file, or a topic read from its beginning
    /// to its end as `kafka://HOST:PORT/TOPIC`; repeat the flag for several.
    #[arg(long, required = true)]
    events: Vec<EventSource>,
    /// Events from another period (file or topic), only to measure the model on.
    #[arg(long)]
    held_out: Option<EventSource>,
    /// Where to write the model (JSON).
    #[arg(long)]
    out: PathBuf,
    /// The model's name, recorded in every decision it makes.
    #[arg(long, default_value = "model")]
    name: String,
    /// Ridge penalty on the standardised coefficients (larger: simpler model).
    #[arg(long, default_value_t = models::TrainOptions::default().ridge)]
    ridge: f64,
}

#[derive(Args, Debug)]
struct BacktestArgs {
    /// The events to replay: a JSON-lines file, or `kafka://HOST:PORT/TOPIC` (read from
    /// its beginning to its end).
    #[arg(long)]
    events: EventSource,
    /// The truth file written by `pulse trace --truth`; without it, precision is the
    /// share of useful commands and recall is not known.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// The model file; the built-in default model without it.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Confidence thresholds to try.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.5,0.6,0.7,0.8,0.85,0.9,0.95"
    )]
    thresholds: Vec<f64>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Kafka bootstrap servers (HOST:PORT,...). Without it, pulse starts an embedded
    /// broker and prints its address.
    #[arg(long, env = "PULSE_BROKERS")]
    brokers: Option<String>,
    /// The events topic.
    #[arg(long, env = "PULSE_TOPIC", default_value = EVENTS_TOPIC)]
    topic: String,
    /// The consumer group.
    #[arg(long, env = "PULSE_GROUP", default_value = "pulse")]
    group: String,
    /// Where the dashboard API listens.
    #[arg(long, env = "PULSE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Checkpoint file: restored at start, written periodically and at shutdown;
    /// offsets are committed after each checkpoint.
    #[arg(long, env = "PULSE_CHECKPOINT")]
    checkpoint: Option<PathBuf>,
    /// Seconds between checkpoints.
    #[arg(long, env = "PULSE_CHECKPOINT_INTERVAL_SECS", default_value_t = 10)]
    checkpoint_interval_secs: u64,
    /// Seconds between offset commits when there is no checkpoint file.
    #[arg(long, env = "PULSE_COMMIT_INTERVAL_SECS", default_value_t = 2)]
    commit_interval_secs: u64,
    /// Forward rejected messages to this topic (with a `pulse-reject-reason` header).
    #[arg(long, env = "PULSE_DEAD_LETTER_TOPIC")]
    dead_letter_topic: Option<String>,
    /// Sketch error ε: additive error as a fraction of a window's events.
    #[arg(long, env = "PULSE_SKETCH_ERROR", default_value_t = HeatConfig::default().error)]
    sketch_error: f64,
    /// Sketch confidence 1 − δ.
    #[arg(long, env = "PULSE_SKETCH_CONFIDENCE", default_value_t = HeatConfig::default().confidence)]
    sketch_confidence: f64,
    /// Keys tracked per tenant per second (heat-map candidates).
    #[arg(long, env = "PULSE_TOP_K", default_value_t = HeatConfig::default().top_k)]
    top_k: usize,
    /// Keys tracked per region per second.
    #[arg(long, env = "PULSE_REGION_TOP_K", default_value_t = HeatConfig::default().region_top_k)]
    region_top_k: usize,
    /// Tenants tracked; events of further tenants are rejected.
    #[arg(long, env = "PULSE_MAX_TENANTS", default_value_t = HeatConfig::default().max_tenants)]
    max_tenants: usize,
    /// Do not predict or send pre-warm commands: heat map and API only.
    #[arg(long, env = "PULSE_NO_PREWARM")]
    no_prewarm: bool,
    /// The topic pre-warm commands go to.
    #[arg(long, env = "PULSE_PREWARM_TOPIC", default_value = PREWARM_TOPIC)]
    prewarm_topic: String,
    /// The scoring model file (JSON, from `pulse train`); the built-in model without it.
    #[arg(long, env = "PULSE_MODEL")]
    model: Option<PathBuf>,
    /// Minimum confidence for a pre-warm command, in [0, 1].
    #[arg(long, env = "PULSE_THRESHOLD", default_value_t = DecisionPolicy::default().threshold)]
    threshold: f64,
    /// Seconds a key waits after a command before it can get another (one per wave).
    #[arg(long, env = "PULSE_COOLDOWN_SECS", default_value_t = DecisionPolicy::default().cooldown_ms / 1000)]
    cooldown_secs: u64,
    /// Seconds a command stays valid at the edges.
    #[arg(long, env = "PULSE_COMMAND_TTL_SECS", default_value_t = DecisionPolicy::default().command_ttl_ms / 1000)]
    command_ttl_secs: u64,
    /// Each tenant's committed rate of commands per second.
    #[arg(long, env = "PULSE_TENANT_RATE", default_value_t = DecisionPolicy::default().tenant_rate_per_s)]
    tenant_rate: f64,
    /// Each tenant's burst allowance, in commands.
    #[arg(long, env = "PULSE_TENANT_BURST", default_value_t = DecisionPolicy::default().tenant_burst)]
    tenant_burst: f64,
    /// Seconds between background retrains on pulse's own labelled decisions (0: never).
    #[arg(long, env = "PULSE_RETRAIN_INTERVAL_SECS", default_value_t = 300)]
    retrain_interval_secs: u64,
    /// Require `Authorization: Bearer <token>` on every /api/* route (401 otherwise);
    /// /healthz and /metrics stay open. Prefer the variable: flags show in `ps`.
    #[arg(long, env = "PULSE_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
}

impl ServeArgs {
    /// Checks every field; the message names the flag and its variable.
    fn validate(&self) -> anyhow::Result<HeatConfig> {
        if let Some(b) = &self.brokers {
            if b.trim().is_empty() || b.split(',').any(|s| !s.contains(':')) {
                bail!("--brokers (PULSE_BROKERS): expected HOST:PORT[,HOST:PORT...], got {b:?}");
            }
        }
        if self.topic.trim().is_empty() {
            bail!("--topic (PULSE_TOPIC): must not be empty");
        }
        if self.group.trim().is_empty() {
            bail!("--group (PULSE_GROUP): must not be empty");
        }
        if self.dead_letter_topic.as_deref() == Some(self.topic.as_str()) {
            bail!("--dead-letter-topic (PULSE_DEAD_LETTER_TOPIC): must differ from --topic");
        }
        if self.checkpoint_interval_secs == 0 {
            bail!(
                "--checkpoint-interval-secs (PULSE_CHECKPOINT_INTERVAL_SECS): must be at least 1"
            );
        }
        if self.commit_interval_secs == 0 {
            bail!("--commit-interval-secs (PULSE_COMMIT_INTERVAL_SECS): must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            bail!(
                "--threshold (PULSE_THRESHOLD): {} is outside [0, 1]",
                self.threshold
            );
        }
        if self.command_ttl_secs == 0 {
            bail!("--command-ttl-secs (PULSE_COMMAND_TTL_SECS): must be at least 1");
        }
        if !(self.tenant_rate > 0.0 && self.tenant_rate.is_finite()) {
            bail!("--tenant-rate (PULSE_TENANT_RATE): must be positive");
        }
        if !(self.tenant_burst >= 1.0 && self.tenant_burst.is_finite()) {
            bail!("--tenant-burst (PULSE_TENANT_BURST): must be at least 1");
        }
        if self.prewarm_topic.trim().is_empty() || self.prewarm_topic == self.topic {
            bail!(
                "--prewarm-topic (PULSE_PREWARM_TOPIC): must be non-empty and differ from --topic"
            );
        }
        let config = HeatConfig {
            error: self.sketch_error,
            confidence: self.sketch_confidence,
            top_k: self.top_k,
            region_top_k: self.region_top_k,
            max_tenants: self.max_tenants,
        };
        config.validate().map_err(|e| {
            let flag = match e.field {
                "error" => "--sketch-error (PULSE_SKETCH_ERROR)",
                "confidence" => "--sketch-confidence (PULSE_SKETCH_CONFIDENCE)",
                "top_k" => "--top-k (PULSE_TOP_K)",
                "region_top_k" => "--region-top-k (PULSE_REGION_TOP_K)",
                _ => "--max-tenants (PULSE_MAX_TENANTS)",
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        })?;
        Ok(config)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The demo's fifteen nodes per set-up would drown its progress lines in logs:
    // there, only warnings unless RUST_LOG says otherwise.
    let default_filter = match cli.command {
        Command::Demo(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .init();
    match cli.command {
        Command::Broker { partitions } => {
            let broker = EmbeddedBroker::start(1).context("starting the embedded broker")?;
            for topic in [EVENTS_TOPIC, PREWARM_TOPIC] {
                broker.create_topic(topic, partitions)?;
            }
            println!("{}", broker.bootstrap_servers());
            tracing::info!(
                bootstrap = broker.bootstrap_servers(),
                "embedded broker up; Ctrl-C stops it"
            );
            tokio::signal::ctrl_c().await?;
            tracing::info!("stopping");
        }
        Command::Serve(args) => serve(*args).await?,
        Command::Trace(args) => trace(args)?,
        Command::Train(args) => train(args)?,
        Command::Backtest(args) => backtest(args)?,
        Command::Demo(args) => demo(args).await?,
    }
    Ok(())
}

fn trace(args: TraceArgs) -> anyhow::Result<()> {
    let mut spec: pulse::TraceSpec = match &args.spec {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--spec: {}", path.display()))?,
        None => pulse::TraceSpec::default(),
    };
    if let Some(seed) = args.seed {
        spec.seed = seed;
    }
    if let Some(start) = args.start_ms {
        spec.start_ms = start;
    }
    if let Some(minutes) = args.minutes {
        spec.duration_ms = minutes * 60_000;
    }
    if let Some(virals) = args.virals {
        spec.virals = virals;
    }
    if let Some(rps) = args.background_rps {
        spec.background_rps = rps;
    }
    spec.validate()
        .map_err(|e| anyhow::anyhow!("trace settings: {e}"))?;
    let trace = pulse::generate_trace(&spec);
    pulse::write_events(&args.out, &trace.events)
        .with_context(|| format!("--out: writing {}", args.out.display()))?;
    if let Some(path) = &args.truth {
        std::fs::write(path, serde_json::to_string_pretty(&trace.bursts)?)
            .with_context(|| format!("--truth: writing {}", path.display()))?;
    }
    println!(
        "{} events, {} bursts -> {}",
        trace.events.len(),
        trace.bursts.len(),
        args.out.display()
    );
    Ok(())
}

/// Where `train` and `backtest` read events: a JSON-lines file, or a Kafka topic read
/// from its beginning to its end (`kafka://HOST:PORT[,HOST:PORT…]/TOPIC`).
#[derive(Debug, Clone)]
enum EventSource {
    File(PathBuf),
    Topic { brokers: String, topic: String },
}

impl std::str::FromStr for EventSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some(rest) = s.strip_prefix("kafka://") else {
            return Ok(EventSource::File(PathBuf::from(s)));
        };
        match rest.split_once('/') {
            Some((brokers, topic)) if !brokers.is_empty() && !topic.is_empty() => {
                Ok(EventSource::Topic {
                    brokers: brokers.to_owned(),
                    topic: topic.to_owned(),
                })
            }
            _ => Err(format!("{s}: expected kafka://HOST:PORT/TOPIC")),
        }
    }
}

impl std::fmt::Display for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventSource::File(path) => write!(f, "{}", path.display()),
            EventSource::Topic { brokers, topic } => write!(f, "kafka://{brokers}/{topic}"),
        }
    }
}

fn read_events(source: &EventSource, flag: &str) -> anyhow::Result<Vec<models::AccessEvent>> {
    let read = match source {
        EventSource::File(path) => pulse::read_events(path).map_err(anyhow::Error::from),
        EventSource::Topic { brokers, topic } => {
            pulse::read_topic(brokers, topic, Duration::from_secs(10)).map_err(anyhow::Error::from)
        }
    };
    let read = read.with_context(|| format!("{flag}: {source}"))?;
    if !read.rejected.is_empty() {
        tracing::warn!(%source, rejected = ?read.rejected, "skipped messages that do not decode");
    }
    if read.events.is_empty() {
        bail!("{flag}: {source} holds no events");
    }
    Ok(read.events)
}

fn train(args: TrainArgs) -> anyhow::Result<()> {
    let options = pulse::ReplayOptions::default();
    let samples =
        |source: &EventSource, flag: &str| -> anyhow::Result<Vec<(models::Features, bool)>> {
            let events = read_events(source, flag)?;
            let run = pulse::replay(&events, None, &options);
            tracing::info!(
                events = events.len(),
                samples = run.samples.len(),
                "replayed {flag}"
            );
            Ok(run.samples.iter().map(|s| (s.features, s.viral)).collect())
        };
    let mut train = Vec::new();
    for source in &args.events {
        train.extend(samples(source, "--events")?);
    }
    let held_out = match &args.held_out {
        Some(source) => samples(source, "--held-out")?,
        None => Vec::new(),
    };
    let model = models::ScoringModel::train(
        &train,
        &held_out,
        &models::TrainOptions {
            name: args.name,
            trained_at_ms: now_ms(),
            ridge: args.ridge,
            ..models::TrainOptions::default()
        },
    )?;
    std::fs::write(&args.out, model.to_json())
        .with_context(|| format!("--out: writing {}", args.out.display()))?;
    let m = &model.metrics;
    println!(
        "{}: {} samples ({} viral), R² {:.3}; at {:.2}: train precision {:.3} recall {:.3}",
        model.name,
        m.samples,
        m.positives,
        m.r2,
        m.train.threshold,
        m.train.precision(),
        m.train.recall()
    );
    if let Some(h) = &m.held_out {
        println!(
            "held out: precision {:.3} recall {:.3}",
            h.precision(),
            h.recall()
        );
    }
    println!("model -> {}", args.out.display());
    Ok(())
}

fn backtest(args: BacktestArgs) -> anyhow::Result<()> {
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--thresholds: {t} is outside [0, 1]");
    }
    let events = read_events(&args.events, "--events")?;
    let truth: Option<Vec<pulse::Burst>> = match &args.truth {
        Some(path) => Some(
            serde_json::from_str(&std::fs::read_to_string(path)?)
                .with_context(|| format!("--truth: {}", path.display()))?,
        ),
        None => None,
    };
    let model = match &args.model {
        Some(path) => models::ScoringModel::from_json(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--model: {}", path.display()))?,
        None => pulse::default_model(),
    };
    println!("model {}, {} events", model.name, events.len());
    println!(
        "| threshold | commands | precision | recall | median lead | useful | wasted | decision p99 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let model = Arc::new(model);
    for threshold in &args.thresholds {
        let row = &pulse::backtest(
            &events,
            truth.as_deref(),
            model.clone(),
            &[*threshold],
            &pulse::ReplayOptions::default(),
        )[0];
        println!(
            "| {:.2} | {} | {:.3} | {} | {} | {} | {} | {} |",
            row.threshold,
            row.commands,
            row.precision,
            row.recall.map_or("n/a".into(), |r| format!("{r:.3}")),
            row.median_lead_ms
                .map_or("n/a".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
            row.useful,
            row.wasted,
            row.decision_p99.map_or("n/a".into(), |d| format!(
                "{:.2} ms",
                d.as_secs_f64() * 1000.0
            ))
        );
    }
    Ok(())
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    use pulse::scenario::{ScenarioConfig, ScenarioKafka, Setup, run_setup, table};
    use std::io::{IsTerminal, Write};

    let config = ScenarioConfig {
        seed: args.seed,
        regions: args.regions,
        nodes_per_region: args.nodes,
        duration: Duration::from_secs(args.duration_secs),
        viral_at: Duration::from_secs(args.viral_at_secs),
        spread_every: Duration::from_secs(args.spread_secs),
        background_rps: args.background_rps,
        viral_rps: args.viral_rps,
        keys: args.keys,
        origin: pulse::scenario::OriginProfile {
            base_latency: Duration::from_millis(args.origin_ms),
            ..ScenarioConfig::default().origin
        },
        ..ScenarioConfig::default()
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("demo settings: {e}"))?;

    let mut embedded = None;
    let brokers = match &args.brokers {
        Some(b) => b.clone(),
        None => {
            let broker = EmbeddedBroker::start(1).context("starting the embedded broker")?;
            let address = broker.bootstrap_servers().to_owned();
            embedded = Some(broker);
            address
        }
    };
    let run = now_ms();
    let kafka = ScenarioKafka {
        brokers: brokers.clone(),
        events_topic: format!("demo-{run}-edge-events"),
        prewarm_topic: format!("demo-{run}-prewarm"),
    };
    match &embedded {
        Some(broker) => {
            broker.create_topic(&kafka.events_topic, 2)?;
            broker.create_topic(&kafka.prewarm_topic, 1)?;
        }
        None => {
            create_topics(
                &brokers,
                &[(&kafka.events_topic, 2), (&kafka.prewarm_topic, 1)],
            )
            .await?
        }
    }
    println!(
        "kafka: {brokers} ({})",
        if embedded.is_some() {
            "embedded"
        } else {
            "external"
        }
    );

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen: binding {}", args.listen))?;
    println!(
        "dashboard: http://{}/ (live while the pre-warm set-up runs)",
        listener.local_addr()?
    );
    let listener = Arc::new(std::sync::Mutex::new(Some(listener)));
    let hook: pulse::scenario::DashboardHook = Arc::new(move |state| {
        if let Some(listener) = listener.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(async move {
                let _ = axum::serve(listener, pulse::app(state)).await;
            });
        }
    });

    let interactive = std::io::stderr().is_terminal();
    let total = args.duration_secs;
    let mut reports = Vec::new();
    // The pre-warm set-up runs first so the dashboard has something to show early;
    // the table lists them from no protection to all of it.
    for setup in [
        Setup::Prewarm,
        Setup::NoCollapsing,
        Setup::NodeCollapsing,
        Setup::NodeAndRegional,
    ] {
        let started = std::time::Instant::now();
        let report = run_setup(
            setup,
            &config,
            Some(&kafka),
            Some(hook.clone()),
            move |s, t| {
                let line = format!("{:<28} {:>3}/{total} s", s.as_str(), t.as_secs());
                if interactive {
                    eprint!("\r{line}");
                    let _ = std::io::stderr().flush();
                } else if t.as_secs() % 10 == 0 {
                    eprintln!("{line}");
                }
            },
        )
        .await
        .with_context(|| format!("set-up {}", setup.as_str()))?;
        if interactive {
            eprintln!();
        }
        eprintln!(
            "{}: done in {:.0} s, origin peak {:.1}× baseline, viral hit ratio {:.2} %",
            setup.as_str(),
            started.elapsed().as_secs_f64(),
            report.peak_over_baseline(),
            report.viral_hit_ratio * 100.0
        );
        reports.push(report);
    }
    reports.sort_by_key(|r| Setup::ALL.iter().position(|s| *s == r.setup));
    println!();
    println!("{}", table(&reports));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("--json: writing {}", path.display()))?;
    }
    if args.hold {
        println!("serving the dashboard until Ctrl-C");
        prefetcher::shutdown_signal().await;
    }
    drop(embedded);
    Ok(())
}

/// Creates topics on an external broker (the embedded one has its own call).
async fn create_topics(brokers: &str, topics: &[(&str, i32)]) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    for result in admin.create_topics(&new, &AdminOptions::new()).await? {
        result.map_err(|(topic, e)| anyhow::anyhow!("creating {topic}: {e}"))?;
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let heat_config = args.validate()?;
    // The embedded broker lives until serve returns, after ingest has stopped.
    let mut embedded = None;
    let brokers = match &args.brokers {
        Some(b) => b.clone(),
        None => {
            let broker = EmbeddedBroker::start(1).context("starting the embedded broker")?;
            broker.create_topic(&args.topic, 4)?;
            broker.create_topic(PREWARM_TOPIC, 4)?;
            if let Some(dlq) = &args.dead_letter_topic {
                broker.create_topic(dlq, 1)?;
            }
            let address = broker.bootstrap_servers().to_owned();
            println!("embedded broker: {address}");
            tracing::info!(bootstrap = %address, "no --brokers: started an embedded broker");
            embedded = Some(broker);
            address
        }
    };

    let heat = match &args.checkpoint {
        Some(path) => match pulse::load_checkpoint(path)? {
            Some(heat) if *heat.config() == heat_config => {
                tracing::info!(path = %path.display(), tenants = heat.tenants_len(), "restored checkpoint");
                heat
            }
            Some(_) => {
                tracing::warn!(path = %path.display(), "checkpoint has other sketch settings; starting empty");
                HeatMap::new(heat_config)
            }
            None => HeatMap::new(heat_config),
        },
        None => HeatMap::new(heat_config),
    };
    let heat = Arc::new(RwLock::new(heat));
    let metrics = Arc::new(Metrics::new());
    // Prediction runs on the ingest thread after each batch; the retrainer beside it.
    let mut observer: Option<Box<dyn BatchObserver>> = None;
    let mut predictor = None;
    let mut retrainer = None;
    if !args.no_prewarm {
        let model = match &args.model {
            Some(path) => models::ScoringModel::from_json(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("--model (PULSE_MODEL): {}", path.display()))?,
            )
            .with_context(|| format!("--model (PULSE_MODEL): {}", path.display()))?,
            None => pulse::default_model(),
        };
        tracing::info!(model = %model.name, threshold = args.threshold, "prediction on");
        let shared = Arc::new(std::sync::Mutex::new(Predictor::new(
            Some(Arc::new(model)),
            PredictorConfig {
                policy: DecisionPolicy {
                    threshold: args.threshold,
                    cooldown_ms: args.cooldown_secs * 1000,
                    command_ttl_ms: args.command_ttl_secs * 1000,
                    tenant_rate_per_s: args.tenant_rate,
                    tenant_burst: args.tenant_burst,
                    ..DecisionPolicy::default()
                },
                ..PredictorConfig::default()
            },
        )));
        let publisher = PrewarmPublisher::new(&brokers, &args.prewarm_topic)?;
        observer = Some(Box::new(PrewarmLoop::new(
            shared.clone(),
            publisher,
            metrics.clone(),
        )));
        if args.retrain_interval_secs > 0 {
            retrainer = Some(Retrainer::start(
                shared.clone(),
                Duration::from_secs(args.retrain_interval_secs),
                args.threshold,
                metrics.clone(),
            ));
        }
        predictor = Some(shared);
    }
    let ingest = Ingest::start_with(
        IngestConfig {
            brokers,
            topic: args.topic.clone(),
            group_id: args.group.clone(),
            dead_letter_topic: args.dead_letter_topic.clone(),
            checkpoint: args.checkpoint.clone(),
            checkpoint_interval: Duration::from_secs(args.checkpoint_interval_secs),
            commit_interval: Duration::from_secs(args.commit_interval_secs),
        },
        heat.clone(),
        metrics.clone(),
        observer,
    )?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen (PULSE_LISTEN): binding {}", args.listen))?;
    let address = listener.local_addr()?;
    println!("dashboard: http://{address}/api/tenants");
    tracing::info!(%address, "dashboard API listening");
    axum::serve(
        listener,
        pulse::require_api_token(
            pulse::app(AppState {
                heat,
                metrics,
                predictor,
            }),
            args.api_token.as_deref(),
        ),
    )
    .with_graceful_shutdown(prefetcher::shutdown_signal())
    .await?;

    // Final checkpoint and commit, off the async threads.
    tokio::task::spawn_blocking(move || {
        if let Some(retrainer) = retrainer {
            retrainer.stop();
        }
        ingest.stop();
    })
    .await?;
    drop(embedded);
    Ok(())
}
