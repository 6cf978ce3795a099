//! Shared pieces of the cross-crate scenarios.
//!
//! # Layout
//! - `api`: [`api::get_json`], pulse's API asked in-process.
//! - `kafka`: [`TestKafka`], the broker a test talks to: the real one named by
//!   `KAFKA_BOOTSTRAP_SERVERS`, or an embedded mock cluster when that is unset; and
//!   [`produce`], one message produced and acknowledged; [`committed_offsets`], a
//!   group's offsets as the broker has them.
//! - [`free_port`]: a local port nobody listens on.
//! - `scenario`: the reference scenario behind the `demo` binary.

pub mod api;
mod kafka;
pub mod scenario;

pub use kafka::{
    BOOTSTRAP_ENV, TestKafka, committed_offsets, produce, produce_events, produce_paced,
};

/// A local TCP port free a moment ago, for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
