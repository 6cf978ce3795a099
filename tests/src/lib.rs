//! Shared pieces of the cross-crate scenarios.
//!
//! # Layout
//! - `kafka`: [`TestKafka`], the broker a test talks to: the real one named by
//!   `KAFKA_BOOTSTRAP_SERVERS`, or an embedded mock cluster when that is unset; and
//!   [`produce`], one message produced and acknowledged.

mod kafka;
pub mod scenario;

pub use kafka::{BOOTSTRAP_ENV, TestKafka, produce};
