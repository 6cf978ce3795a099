//! Shared pieces of the cross-crate scenarios.
//!
//! # Layout
//! - The broker under test and the pieces pulse's own tests share, from
//!   `pulse::testing`: [`TestKafka`] (the real broker named by `KAFKA_BOOTSTRAP_SERVERS`,
//!   or an embedded mock cluster when that is unset), [`produce`], [`produce_signed`], [`produce_events`],
//!   [`produce_paced`], [`committed_offsets`], [`free_port`] and [`wall_ms`], the one
//!   wall clock the tests read.
//! - `fleet`: pulse as a fleet of `pulse serve` processes, and the checks of their
//!   answers against one reference process ([`fleet::PulseProcess`],
//!   [`fleet::FleetProbe`]).
//! - `scenario`: the reference scenario behind the `demo` binary.
//! - `sim`: the fleet simulator behind the `simulate` binary (docs/simulator.md).

pub mod fleet;
pub mod scenario;
pub mod sim;

pub use pulse::testing::{
    BOOTSTRAP_ENV, TestKafka, committed_offsets, free_port, produce, produce_events, produce_paced,
    produce_signed, wall_ms,
};
