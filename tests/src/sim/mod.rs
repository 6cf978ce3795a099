//! The fleet simulator: the prefetcher's production single-flight registry
//! ([`prefetcher::FlightRegistry`]), fill limiter ([`prefetcher::FillLimiter`]) and
//! priority classes for every edge node and regional shield, and pulse's production
//! heat map and predictor (with its decider and tenant budget), on a virtual clock:
//! no sockets, no wall clock, deterministic for a seed.
//!
//! It advances in ticks of virtual time. Per tick, only the (node, key) pairs without
//! a fresh entry get their requests drawn one tick at a time; a node with a fresh
//! entry serves its requests as hits in bulk (counted when the entry expires). Misses
//! go through the registry (one leader per flight key, the others join), the limiter
//! (a slot, a queue, or `Overloaded`), the regional shield and the origin model. The
//! limiter runs on tokio's paused clock, which the simulator advances tick by tick.
//!
//! # Layout
//! - `load`: Zipf popularity and unbiased per-tick counts.
//! - `config`: [`SimConfig`] and the origin model.
//! - `world`: the fleet's tiers, the clients and the origin (the engine); `fill`:
//!   one fill in flight.
//! - `pulse_side`: sampled access events into the heat map and predictor, and the
//!   commands they send, delivered after a delay.
//! - `stats`: latency histogram and per-second origin counts.
//! - `output`: sweeps as CSV and SVG charts.
//! - `replay`: load from an access log in the edge agent's formats ([`read_log`]).
//! - `report`: what a run measured ([`SimReport`], [`Counters`]) and the table.
//! - `trace`: the per-tick trace of the origin and the nodes' limits (`--trace`).

mod config;
mod fill;
mod load;
mod output;
mod pulse_side;
mod replay;
mod report;
mod stats;
mod trace;
mod world;

pub use crate::scenario::Setup;
pub use config::{HOT_RANKS, OriginModel, SimConfig};
pub use load::{Zipf, stochastic_round};
pub use output::{SweepParam, read_svg_points, sweep_csv, sweep_svg, write_sweep};
pub use replay::{LogLoad, read_log};
pub use report::{Counters, SimReport, table};
pub use stats::{Histogram, PerSecond};

use world::World;

/// Runs one set-up; `progress` hears every 10 virtual seconds.
pub fn run(
    config: &SimConfig,
    setup: Setup,
    progress: &mut dyn FnMut(u64, &Counters),
) -> SimReport {
    // A current-thread runtime with a paused clock: the limiter's `Instant::now` and
    // its queue timeouts read virtual time, which only the simulator advances.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(World::new(config, setup).run(progress))
}

/// Runs the four set-ups on the same seed.
pub fn run_all(
    config: &SimConfig,
    progress: &mut dyn FnMut(Setup, u64, &Counters),
) -> Vec<SimReport> {
    Setup::ALL
        .iter()
        .map(|setup| run(config, *setup, &mut |s, c| progress(*setup, s, c)))
        .collect()
}

/// Runs the set-ups at each value of `param`; `progress` hears the value, the set-up
/// and the virtual seconds.
pub fn sweep(
    base: &SimConfig,
    param: SweepParam,
    values: &[f64],
    setups: &[Setup],
    progress: &mut dyn FnMut(f64, Setup, u64),
) -> Vec<(f64, SimReport)> {
    let mut rows = Vec::new();
    for value in values {
        let cfg = param.apply(base, *value);
        for setup in setups {
            rows.push((
                *value,
                run(&cfg, *setup, &mut |s, _| progress(*value, *setup, s)),
            ));
        }
    }
    rows
}
