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
//! - `config`: [`SimConfig`], the origin model, [`run`] and [`run_all`].
//! - `world`: the fleet's tiers, the clients and the origin (the engine); `fill`:
//!   one fill in flight.
//! - `pulse_side`: sampled access events into the heat map and predictor, and the
//!   commands they send, delivered after a delay.
//! - `stats`: latency histogram and per-second origin counts.
//! - `report`: what a run measured ([`SimReport`], [`Counters`]) and the table.

mod config;
mod fill;
mod load;
mod pulse_side;
mod report;
mod stats;
mod world;

pub use crate::scenario::Setup;
pub use config::{HOT_RANKS, OriginModel, SimConfig, run, run_all};
pub use load::{Zipf, stochastic_round};
pub use report::{Counters, SimReport, table};
pub use stats::{Histogram, PerSecond};
