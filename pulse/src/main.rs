//! The `pulse` command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use pulse::{
    DecisionPolicy, EVENTS_TOPIC, EmbeddedBroker, EventSource, HeatConfig, PREWARM_TOPIC,
    PulseConfig, ScoringModel, TraceSpec, TrainOptions,
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
    #[arg(long, default_value_t = TrainOptions::default().ridge)]
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
    /// The service config these flags give, checked; errors name the flag and its
    /// variable.
    fn into_config(self) -> anyhow::Result<PulseConfig> {
        let config = PulseConfig {
            brokers: self.brokers,
            topic: self.topic,
            group: self.group,
            listen: self.listen,
            checkpoint: self.checkpoint,
            checkpoint_interval_secs: self.checkpoint_interval_secs,
            commit_interval_secs: self.commit_interval_secs,
            dead_letter_topic: self.dead_letter_topic,
            heat: HeatConfig {
                error: self.sketch_error,
                confidence: self.sketch_confidence,
                top_k: self.top_k,
                region_top_k: self.region_top_k,
                max_tenants: self.max_tenants,
            },
            prewarm: !self.no_prewarm,
            prewarm_topic: self.prewarm_topic,
            model: self.model,
            threshold: self.threshold,
            cooldown_ms: self.cooldown_secs.saturating_mul(1000),
            command_ttl_ms: self.command_ttl_secs.saturating_mul(1000),
            tenant_rate_per_s: self.tenant_rate,
            tenant_burst: self.tenant_burst,
            retrain_interval_secs: self.retrain_interval_secs,
            api_token: self.api_token,
            ..PulseConfig::default()
        };
        config.validate().map_err(|e| {
            let flag = match e.field {
                "brokers" => "--brokers (PULSE_BROKERS)",
                "topic" => "--topic (PULSE_TOPIC)",
                "group" => "--group (PULSE_GROUP)",
                "dead_letter_topic" => "--dead-letter-topic (PULSE_DEAD_LETTER_TOPIC)",
                "checkpoint_interval_secs" => {
                    "--checkpoint-interval-secs (PULSE_CHECKPOINT_INTERVAL_SECS)"
                }
                "commit_interval_secs" => "--commit-interval-secs (PULSE_COMMIT_INTERVAL_SECS)",
                "heat.error" => "--sketch-error (PULSE_SKETCH_ERROR)",
                "heat.confidence" => "--sketch-confidence (PULSE_SKETCH_CONFIDENCE)",
                "heat.top_k" => "--top-k (PULSE_TOP_K)",
                "heat.region_top_k" => "--region-top-k (PULSE_REGION_TOP_K)",
                "heat.max_tenants" => "--max-tenants (PULSE_MAX_TENANTS)",
                "threshold" => "--threshold (PULSE_THRESHOLD)",
                "command_ttl_ms" => "--command-ttl-secs (PULSE_COMMAND_TTL_SECS)",
                "tenant_rate_per_s" => "--tenant-rate (PULSE_TENANT_RATE)",
                "tenant_burst" => "--tenant-burst (PULSE_TENANT_BURST)",
                "prewarm_topic" => "--prewarm-topic (PULSE_PREWARM_TOPIC)",
                other => other,
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        })?;
        Ok(config)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
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
            pulse::shutdown_signal().await;
            tracing::info!("stopping");
        }
        Command::Serve(args) => serve(*args).await?,
        Command::Trace(args) => trace(args)?,
        Command::Train(args) => train(args)?,
        Command::Backtest(args) => backtest(args)?,
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let pulse = pulse::start(args.into_config()?).await?;
    if pulse.embedded_broker() {
        println!("embedded broker: {}", pulse.brokers());
    }
    println!("dashboard: {}/api/tenants", pulse.api_url());
    pulse::shutdown_signal().await;
    // Final checkpoint and commit happen here.
    pulse.shutdown().await;
    Ok(())
}

fn trace(args: TraceArgs) -> anyhow::Result<()> {
    let mut spec: TraceSpec = match &args.spec {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--spec: {}", path.display()))?,
        None => TraceSpec::default(),
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
    pulse::write_trace(&trace, &args.out, args.truth.as_deref())
        .with_context(|| format!("--out/--truth: writing {}", args.out.display()))?;
    println!(
        "{} events, {} bursts -> {}",
        trace.events.len(),
        trace.bursts.len(),
        args.out.display()
    );
    Ok(())
}

fn train(args: TrainArgs) -> anyhow::Result<()> {
    let model = pulse::train_model(
        &args.events,
        args.held_out.as_ref(),
        &TrainOptions {
            name: args.name,
            trained_at_ms: now_ms(),
            ridge: args.ridge,
            ..TrainOptions::default()
        },
    )?;
    std::fs::write(&args.out, model.to_json())
        .with_context(|| format!("--out: writing {}", args.out.display()))?;
    println!("{}", pulse::train_summary(&model));
    println!("model -> {}", args.out.display());
    Ok(())
}

fn backtest(args: BacktestArgs) -> anyhow::Result<()> {
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!("--thresholds: {t} is outside [0, 1]");
    }
    let events = pulse::load_events(&args.events, "--events")?;
    let truth: Option<Vec<pulse::Burst>> = match &args.truth {
        Some(path) => Some(
            serde_json::from_str(&std::fs::read_to_string(path)?)
                .with_context(|| format!("--truth: {}", path.display()))?,
        ),
        None => None,
    };
    let model = match &args.model {
        Some(path) => ScoringModel::from_json(&std::fs::read_to_string(path)?)
            .with_context(|| format!("--model: {}", path.display()))?,
        None => pulse::default_model(),
    };
    print!(
        "{}",
        pulse::backtest_table(&events, truth.as_deref(), model, &args.thresholds)?
    );
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
