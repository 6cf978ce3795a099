//! Pulse as a fleet of `pulse serve` processes on the real broker, started, killed and
//! stopped by a test, and the checks the fleet test makes of their answers
//! (`tests/tests/pulse_fleet.rs` says what the scenario is and what it checks).
//!
//! # Layout
//! - `process`: [`PulseProcess`], one `pulse serve` process on a fixed port (started,
//!   SIGKILLed, restarted, stopped with SIGTERM, its log's tail in every failure);
//!   [`ProcessEnv`], where the processes log and the variables they get; [`pulse_bin`],
//!   the binary, built once per test run.
//! - `answers`: reading the answers: [`OwnedPartition`] and [`parse_health`]
//!   (`/healthz`), [`Coverage`] and [`parse_coverage`] (every `/api/*` answer),
//!   [`tenant_counts`]; comparing two answers: [`strip`], [`differences`], [`short`].
//! - `probe`: [`FleetProbe`], the client that asks the processes: [`FleetProbe::get`],
//!   [`FleetProbe::settle`] (until the live instances have settled),
//!   [`FleetProbe::compare`] (every instance against the reference).
//! - `topics`: [`high_watermarks`] of a topic, [`read_commands`] from the prewarm topic
//!   ([`read_commands_of`] from a topic of several partitions),
//!   [`produce_counted`] and [`produce_paced_counted`] (events, counted per partition).

mod answers;
mod probe;
mod process;
mod topics;

pub use answers::{
    Coverage, IGNORED_FIELDS, OwnedPartition, differences, parse_coverage, parse_health, short,
    strip, tenant_counts,
};
pub use probe::{FleetProbe, SETTLE_BOUND};
pub use process::{PROCESS_BOUND, ProcessEnv, PulseProcess, pulse_bin};
pub use topics::{
    grow_topic, high_watermarks, produce_counted, produce_paced_counted, read_commands,
    read_commands_of,
};
