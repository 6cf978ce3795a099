//! The reference scenario on one machine, the project's main command
//! (`scripts/demo` builds and runs it): four set-ups of edge nodes, regional shields
//! and a slow origin under a Zipf load with a viral key, on an embedded Kafka broker
//! unless `--brokers` names one; prints the table. The dashboard is served while the
//! pre-warm set-up runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use pulse::EmbeddedBroker;

/// The reference scenario on one machine (the README's main command): an origin,
/// edge nodes and regional shields, a Zipf background and a viral key that spreads
/// across regions, run against four set-ups on an embedded broker; prints a table.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
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
    #[arg(long, default_value_t = tests::scenario::ScenarioConfig::default().background_rps)]
    background_rps: f64,
    /// Viral requests per second per region once it has arrived.
    #[arg(long, default_value_t = tests::scenario::ScenarioConfig::default().viral_rps)]
    viral_rps: f64,
    /// Regions.
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Edge nodes per region.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Distinct background keys.
    #[arg(long, default_value_t = tests::scenario::ScenarioConfig::default().keys)]
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
    /// How log lines are written to stderr: `text` (coloured on a terminal only) or
    /// `json` (one object per line), as every binary of the project.
    #[arg(long, env = pulse::LOG_FORMAT_ENV, value_enum, default_value_t)]
    log_format: pulse::LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = DemoArgs::parse();
    // Fifteen nodes per set-up would drown the progress lines in logs: only warnings
    // unless RUST_LOG says otherwise.
    pulse::init_logging(args.log_format, "warn");
    demo(args).await
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    use tests::scenario::{ScenarioConfig, ScenarioKafka, Setup, run_setup, table};

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
        origin: tests::scenario::OriginProfile {
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
    let run = tests::wall_ms();
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
    let hook: tests::scenario::DashboardHook = Arc::new(move |state| {
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
        pulse::shutdown_signal().await;
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
