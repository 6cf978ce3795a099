//! The fleet simulator (`cargo run --release -p tests --bin simulate -- --help`): the
//! prefetcher's production single-flight registry and fill limiter at every edge node
//! and regional shield, pulse's production heat map and predictor, on a virtual clock;
//! prints the reference table of the four set-ups. See docs/simulator.md.

use std::io::Write;

use clap::Parser;
use tests::sim::{
    Setup, SimConfig, SweepParam, read_log, run, sweep, sweep_csv, table, write_sweep,
};

/// Simulates a CDN fleet on a virtual clock and prints the reference table.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Start from the scale (300 PoPs × 8 nodes, 1 M requests/s, 10 min)
    /// instead of the default small fleet; the flags below override it.
    #[arg(long)]
    internet_scale: bool,
    /// Start from seed 002's fleet: edge nodes and shields without fill limits.
    #[arg(long, conflicts_with = "internet_scale")]
    seed_002: bool,
    /// Random seed (the same for every set-up).
    #[arg(long)]
    seed: Option<u64>,
    /// Regions.
    #[arg(long)]
    regions: Option<usize>,
    /// PoPs per region.
    #[arg(long)]
    pops_per_region: Option<usize>,
    /// Edge nodes per PoP.
    #[arg(long)]
    nodes_per_pop: Option<usize>,
    /// Virtual seconds per set-up.
    #[arg(long)]
    duration_s: Option<u64>,
    /// Virtual second at which the viral key appears.
    #[arg(long)]
    viral_at_s: Option<u64>,
    /// Background requests per second over the fleet.
    #[arg(long)]
    background_rps: Option<f64>,
    /// Viral requests per second per region.
    #[arg(long)]
    viral_rps: Option<f64>,
    /// Concurrent fills the origin serves at base latency.
    #[arg(long)]
    origin_capacity: Option<f64>,
    /// Fill slots per edge node (`flight.max_fills`).
    #[arg(long)]
    node_max_fills: Option<usize>,
    /// User fills an edge node queues before answering 503 (`flight.max_queued_fills`).
    #[arg(long)]
    node_max_queued: Option<usize>,
    /// Each node and shield runs up to its fixed `max_fills` of user fills to the
    /// origin, without the adaptive origin limit (`flight.adaptive_origin_limit =
    /// false`): the baseline the adaptive limit is measured against.
    #[arg(long)]
    fixed_origin_limit: bool,
    /// Floor of each node's and shield's adaptive origin limit
    /// (`flight.origin_min_fills`).
    #[arg(long)]
    origin_min_fills: Option<usize>,
    /// Every tier's `prefetch.latency_tolerance` (the adaptive limits' tolerated
    /// latency, as a multiple of the no-load one).
    #[arg(long)]
    latency_tolerance: Option<f64>,
    /// Distinct background keys.
    #[arg(long)]
    keys: Option<usize>,
    /// Background keys simulated exactly per node (the rest are sampled).
    #[arg(long)]
    hot_keys: Option<usize>,
    /// One simulated tail request stands for this many (one fill holding as many
    /// fill slots); 1 simulates every tail request on its own.
    #[arg(long)]
    tail_sample: Option<u32>,
    /// Object TTL in seconds.
    #[arg(long)]
    ttl_s: Option<u64>,
    /// Delay from a pre-warm command to the nodes acting on it, in ms.
    #[arg(long)]
    command_delay_ms: Option<u64>,
    /// Run only these set-ups (`no-collapsing`, `node`, `regional`, `prewarm`;
    /// comma-separated); all four without it.
    #[arg(long, value_delimiter = ',')]
    setup: Vec<String>,
    /// Sweep one parameter instead of printing the table: `pops=10,50,100,300`,
    /// `viral-rps=...` or `origin-capacity=...`; writes sweep-<param>.csv and .svg
    /// into --out.
    #[arg(long)]
    sweep: Option<String>,
    /// Where a sweep writes its CSV and SVG.
    #[arg(long, default_value = ".")]
    out: std::path::PathBuf,
    /// Replay this access log (the edge agent's formats) instead of the synthetic
    /// load; the run lasts the log's span unless --duration-s says otherwise, and is
    /// measured from --viral-at-s (2 s by default).
    #[arg(long)]
    replay_log: Option<std::path::PathBuf>,
    /// The replayed log's format.
    #[arg(long, value_enum, default_value = "nginx_json")]
    log_format: prefetcher::LogFormat,
    /// Each replayed line is a request at this many nodes (scaling the log to the fleet).
    #[arg(long, default_value_t = 1)]
    replay_scale: u32,
    /// Write a per-tick trace of each set-up to PREFIX-<set-up>.csv: the origin's
    /// fills and latency, the edge nodes' origin limits, user fills and queues.
    #[arg(long, value_name = "PREFIX")]
    trace: Option<std::path::PathBuf>,
    /// Print the rows as JSON lines after the table.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cfg = if args.internet_scale {
        SimConfig::internet_scale()
    } else if args.seed_002 {
        SimConfig::seed_002()
    } else {
        SimConfig::default()
    };
    macro_rules! set {
        ($($f:ident),*) => { $(if let Some(v) = args.$f { cfg.$f = v; })* };
    }
    set!(
        seed,
        keys,
        hot_keys,
        tail_sample,
        ttl_s,
        regions,
        pops_per_region,
        nodes_per_pop,
        duration_s,
        viral_at_s,
        background_rps,
        viral_rps,
        command_delay_ms
    );
    if let Some(n) = args.node_max_fills {
        cfg.node_flight.max_fills = n;
        cfg.node_flight.reserved_for_user = cfg.node_flight.reserved_for_user.min(n / 4);
    }
    if let Some(n) = args.node_max_queued {
        cfg.node_flight.max_queued_fills = n;
    }
    if let Some(n) = args.origin_min_fills {
        cfg.node_flight.origin_min_fills = n;
        cfg.shield_flight.origin_min_fills = n;
    }
    cfg.trace = args.trace.clone();
    if let Some(t) = args.latency_tolerance {
        cfg.prefetch.latency_tolerance = t;
    }
    if args.fixed_origin_limit {
        cfg.node_flight.adaptive_origin_limit = false;
        cfg.shield_flight.adaptive_origin_limit = false;
    }
    if let Some(c) = args.origin_capacity {
        cfg.origin.capacity = c;
    }
    if let Some(path) = &args.replay_log {
        let log = read_log(path, args.log_format, args.replay_scale)
            .map_err(|e| anyhow::anyhow!("--replay-log: {}: {e}", path.display()))?;
        eprintln!(
            "replaying {} requests over {} keys ({} lines skipped, {} malformed), each at {} nodes",
            log.requests.len(),
            log.keys.len(),
            log.skipped,
            log.malformed,
            log.scale
        );
        if log.requests.is_empty() {
            anyhow::bail!("--replay-log: {}: no line makes a request", path.display());
        }
        cfg.duration_s = args.duration_s.unwrap_or(log.span_s() + 5);
        cfg.viral_at_s = args.viral_at_s.unwrap_or(2).min(cfg.duration_s - 1);
        cfg.keys = log.keys.len();
        cfg.replay = Some(std::sync::Arc::new(log));
    }
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("bad setting: {e}"))?;
    let duration = cfg.duration_s;
    let setups = if args.setup.is_empty() {
        Setup::ALL.to_vec()
    } else {
        args.setup
            .iter()
            .map(|s| parse_setup(s))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if let Some(spec) = &args.sweep {
        let (name, values) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--sweep: expected PARAM=V1,V2,..."))?;
        let param = SweepParam::parse(name).map_err(|e| anyhow::anyhow!("--sweep: {e}"))?;
        let values = values
            .split(',')
            .map(|v| v.trim().parse::<f64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("--sweep: {e}"))?;
        let rows = sweep(&cfg, param, &values, &setups, &mut |v, setup, s| {
            eprint!(
                "\r{} = {v}: {:<28} {s:>4}/{duration} s   ",
                param.as_str(),
                setup.as_str()
            );
            let _ = std::io::stderr().flush();
        });
        eprintln!();
        write_sweep(&args.out, param, &rows)?;
        print!("{}", sweep_csv(param, &rows));
        return Ok(());
    }
    let mut rows = Vec::new();
    for setup in setups {
        rows.push(run(&cfg, setup, &mut |s, c| {
            eprint!(
                "\r{:<28} {s:>4}/{duration} s  fills {}  joins {}  overloaded {}   ",
                setup.as_str(),
                c.fills_led,
                c.joins,
                c.limiter_overloaded
            );
            let _ = std::io::stderr().flush();
        }));
    }
    eprintln!();
    print!("{}", table(&rows));
    if args.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    }
    Ok(())
}

fn parse_setup(name: &str) -> anyhow::Result<Setup> {
    Ok(match name {
        "no-collapsing" => Setup::NoCollapsing,
        "node" => Setup::NodeCollapsing,
        "regional" => Setup::NodeAndRegional,
        "prewarm" => Setup::Prewarm,
        other => {
            anyhow::bail!("--setup: {other}: expected no-collapsing, node, regional or prewarm")
        }
    })
}
