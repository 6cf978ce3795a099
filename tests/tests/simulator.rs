//! The fleet simulator (`tests::sim`): deterministic for a seed, driving the production
//! registry, limiter and predictor, and the seed-002 stampede it is built to show.
//! Small fleets and short virtual runs: each test takes seconds.

use tests::sim::{Setup, SimConfig, run, run_all, table};

/// A fleet small enough for the test command: 2 regions × 3 PoPs × 2 nodes.
fn small() -> SimConfig {
    SimConfig {
        regions: 2,
        pops_per_region: 3,
        nodes_per_pop: 2,
        duration_s: 30,
        viral_at_s: 15,
        background_rps: 5_000.0,
        viral_rps: 2_000.0,
        keys: 2_000,
        hot_keys: 50,
        tail_sample: 5,
        event_scale: 5.0,
        ..SimConfig::default()
    }
}

fn quiet(_: Setup, _: u64, _: &tests::sim::Counters) {}

#[test]
fn the_same_seed_gives_the_same_table_and_another_seed_another() {
    let cfg = small();
    let first = table(&run_all(&cfg, &mut quiet));
    let again = table(&run_all(&cfg, &mut quiet));
    assert_eq!(first, again);
    let other = table(&run_all(&SimConfig { seed: 7, ..cfg }, &mut quiet));
    assert_ne!(first, other, "the seed drives the load");
}

#[test]
fn the_simulator_drives_the_production_registry_and_limiter() {
    let cfg = small();
    let collapsing = run(&cfg, Setup::NodeCollapsing, &mut |_, _| {});
    assert!(
        collapsing.counters.joins > 0,
        "misses joined fills through the registry"
    );
    let alone = run(&cfg, Setup::NoCollapsing, &mut |_, _| {});
    assert_eq!(alone.counters.joins, 0, "lead_alone never lets a miss join");
    assert!(alone.counters.fills_led > collapsing.counters.fills_led);
    // One fill slot and no queue per node: only the production limiter refuses fills.
    let mut tight = cfg.clone();
    tight.node_flight.max_fills = 1;
    tight.node_flight.reserved_for_user = 0;
    tight.node_flight.max_queued_fills = 0;
    let refused = run(&tight, Setup::NodeCollapsing, &mut |_, _| {});
    assert!(refused.counters.limiter_overloaded > 0);
    assert_eq!(collapsing.counters.limiter_overloaded, 0);
}

#[test]
fn pulse_predicts_the_viral_key_and_the_nodes_prewarm_it() {
    let report = run(&small(), Setup::Prewarm, &mut |_, _| {});
    assert!(report.counters.pulse_events > 0);
    assert!(
        report.commands_sent > 0,
        "the production decider sent commands"
    );
    assert!(report.counters.prefetch_fills > 0);
    assert!(report.prewarm_useful > 0);
    assert!(report.prewarm_origin_bytes > 0.0);
}

/// Seed 002's stampede at a size the test command affords: 48 edge nodes without fill
/// limits, an origin that serves 200 fills at once before slowing down with the square
/// of its overload, clients that give up after 2 s and retry. Without collapsing each
/// viral miss is an origin fill, the origin slows, waiting clients retry, and the
/// retries are fills too: the peak is far above the baseline. Every defence keeps one
/// fill per key per node (and per region), so the viral key costs a few fills.
#[test]
fn seed_002_without_collapsing_spirals_and_every_defence_holds_it_under_3x() {
    let mut cfg = SimConfig::seed_002();
    cfg.pops_per_region = 4;
    cfg.nodes_per_pop = 4;
    cfg.duration_s = 30;
    cfg.viral_at_s = 15;
    cfg.background_rps = 20_000.0;
    cfg.viral_rps = 10_000.0;
    cfg.origin.capacity = 200.0;
    let rows = run_all(&cfg, &mut quiet);
    let text = table(&rows);
    let none = &rows[0];
    assert_eq!(none.setup, Setup::NoCollapsing);
    assert!(none.peak_over_baseline >= 50.0, "{text}");
    assert!(none.counters.retries > 0, "the herd retried:\n{text}");
    for defended in &rows[1..] {
        assert!(defended.peak_over_baseline <= 3.0, "{text}");
        assert!(defended.hot_hit_ratio > none.hot_hit_ratio, "{text}");
    }
}

/// The death spiral with per-node limits (docs/simulator.md): without collapsing,
/// the fixed limit lets the herd pile onto a slowing origin, far past its capacity
/// for the whole herd; the adaptive one holds it near its capacity (past it by at
/// most a quarter, for at most a second) and answers the hot keys.
#[test]
fn with_per_node_limits_the_fixed_origin_limit_spirals_and_the_adaptive_one_does_not() {
    // Every tail request on its own: a sampled fill would hold one slot for 5. The
    // background keeps the origin at about a fifth of its capacity before the herd.
    let mut adaptive_cfg = SimConfig {
        duration_s: 20,
        viral_at_s: 10,
        tail_sample: 1,
        background_rps: 2_500.0,
        viral_rps: 8_000.0,
        ..small()
    };
    adaptive_cfg.origin.capacity = 100.0;
    let capacity = adaptive_cfg.origin.capacity;
    let mut fixed_cfg = adaptive_cfg.clone();
    fixed_cfg.node_flight.adaptive_origin_limit = false;
    let adaptive = run(&adaptive_cfg, Setup::NoCollapsing, &mut |_, _| {});
    let fixed = run(&fixed_cfg, Setup::NoCollapsing, &mut |_, _| {});
    let text = table(&[adaptive.clone(), fixed.clone()]);
    assert!(
        fixed.counters.origin_peak_active >= 20.0 * capacity,
        "the fixed limit spirals:\n{text}"
    );
    assert!(
        fixed.counters.origin_over_capacity_ms >= 5_000,
        "for the whole herd:\n{text}"
    );
    assert!(
        adaptive.counters.origin_peak_active <= 1.25 * capacity
            && adaptive.counters.origin_over_capacity_ms <= 1_000,
        "the adaptive limit holds the origin near its capacity:\n{text}"
    );
    assert!(adaptive.hot_hit_ratio > 2.0 * fixed.hot_hit_ratio, "{text}");
}

#[test]
fn a_sweep_writes_its_csv_and_chart_and_the_chart_holds_the_csv_values() {
    use tests::sim::{SweepParam, read_svg_points, sweep, write_sweep};
    let cfg = SimConfig {
        duration_s: 20,
        viral_at_s: 12,
        ..small()
    };
    let rows = sweep(
        &cfg,
        SweepParam::Pops,
        &[2.0, 6.0],
        &[Setup::NoCollapsing, Setup::Prewarm],
        &mut |_, _, _| {},
    );
    let dir = tempfile::tempdir().unwrap();
    write_sweep(dir.path(), SweepParam::Pops, &rows).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("sweep-pops.csv")).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("sweep-pops.svg")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let points = read_svg_points(&svg);
    assert_eq!(points.len(), 4, "{svg}");
    // The chart's point for 6 PoPs with pre-warm is the CSV's peak over baseline.
    let line = csv
        .lines()
        .find(|l| l.starts_with("6,Prewarm,"))
        .expect(&csv);
    let from_csv: f64 = line.split(',').nth(4).unwrap().parse().unwrap();
    let (_, _, from_svg) = points
        .iter()
        .find(|(s, x, _)| s == "Prewarm" && *x == 6.0)
        .expect(&svg);
    assert!(
        (from_csv - from_svg).abs() < 1e-3,
        "{from_csv} vs {from_svg}"
    );
}

/// A small nginx log in the shipped `log_format` (`deploy/nginx/edge.conf`): 2 000
/// requests over 20 s for 50 keys, one key bursting from 10 s, and one broken line.
fn nginx_log() -> String {
    let mut log = String::new();
    for i in 0..2_000u64 {
        let ts = 1_796_000_000.0 + i as f64 * 0.01;
        let key = if i >= 1_000 && i % 2 == 0 {
            999
        } else {
            (i * 7919) % 50
        };
        log.push_str(&format!(
            "{{\"ts\":\"{ts:.3}\",\"host\":\"acme.example\",\"uri\":\"/assets/{key}.js\",\"method\":\"GET\",\"status\":\"200\",\"cache\":\"MISS\",\"referer\":\"https://t.co/x\",\"bytes\":\"1000\",\"upstream_time\":\"0.010\",\"prewarm\":\"\"}}\n"
        ));
    }
    log.push_str("not json\n");
    log
}

#[test]
fn a_small_nginx_log_replays_end_to_end_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.json");
    std::fs::write(&path, nginx_log()).unwrap();
    let load = tests::sim::read_log(&path, prefetcher::LogFormat::NginxJson, 3).unwrap();
    assert_eq!((load.requests.len(), load.malformed), (2_000, 1));
    assert_eq!(load.keys[0], "/assets/999.js", "keys by popularity");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_simulate"))
        .args([
            "--replay-log",
            path.to_str().unwrap(),
            "--replay-scale",
            "3",
        ])
        .args([
            "--regions",
            "2",
            "--pops-per-region",
            "2",
            "--nodes-per-pop",
            "2",
            "--json",
        ])
        .args(["--setup", "no-collapsing,node"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for row in &rows {
        assert_eq!(
            row["requests"].as_f64(),
            Some(6_000.0),
            "every line at 3 nodes: {stdout}"
        );
    }
    let fills = |r: &serde_json::Value| r["counters"]["fills_led"].as_u64().unwrap();
    assert!(
        fills(&rows[1]) < fills(&rows[0]),
        "collapsing leads fewer fills: {stdout}"
    );
}
