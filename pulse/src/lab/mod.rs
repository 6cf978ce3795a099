//! The offline lab: synthetic traces with known bursts, the replay of a trace through
//! the service's own heat map and predictor on event time, the honest scorer, and the
//! `pulse trace` / `train` / `backtest` commands as calls.
//!
//! The lab uses the online modules (`heat`, `predict`, `ticks`); no online module
//! uses the lab.
//!
//! - `trace`: [`generate_trace`], synthetic traces ([`TraceSpec`]) and their truth
//!   ([`Burst`]), the traffic families ([`FAMILIES`]).
//! - `backtest`: [`replay`] and [`backtest`] on event time; [`read_events`],
//!   [`read_topic`], [`write_commands`].
//! - `honest`: [`score_commands`], commands judged against what the regions then did.
//! - `commands`: `pulse train`/`backtest`/`trace` as calls ([`backtest_table`],
//!   [`write_trace`]).
//! - `baseline`: the naive rule every figure is set beside, scored the same way.
//! - `training`: [`train_on`], a model fitted and calibrated on families and files.

mod backtest;
mod baseline;
mod commands;
#[cfg(test)]
mod decision_tests;
mod honest;
#[cfg(test)]
mod replayed_api;
mod trace;
mod training;

pub use backtest::{
    BacktestRow, EventFile, Replay, ReplayOptions, percentile, read_topic, replay, write_commands,
};
pub use commands::{
    EventOrder, EventSource, FamilyRow, OfflineError, backtest_commands, backtest_table,
    family_rows, family_table, load_events, train_summary, write_trace,
};
pub use trace::{
    Burst, BurstKind, FAMILIES, Family, Trace, TraceSpec, ViralReferrers,
    generate as generate_trace,
};
pub use training::{TrainingSet, train_model, train_on, train_on_families};
