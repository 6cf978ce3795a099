//! Shared pieces of the cross-crate scenarios.
//!
//! # Layout
//! - `api`: [`api::get_json`], pulse's API asked in-process.
//! - `kafka`: [`TestKafka`], the broker a test talks to: the real one named by
//!   `KAFKA_BOOTSTRAP_SERVERS`, or an embedded mock cluster when that is unset; and
//!   [`produce`], one message produced and acknowledged.
//! - `scenario`: the reference scenario behind the `demo` binary.

pub mod api;
mod kafka;
pub mod scenario;

pub use kafka::{BOOTSTRAP_ENV, TestKafka, produce, produce_events};
