//! What the tests of pulse and of the cross-crate scenarios share (feature `testing`):
//! the broker a test talks to, producing events as edges do, reading a group's
//! committed offsets, asking the API in-process, a free port and the wall clock.
//! No module of the service names it.
//!
//! # Layout
//! - `kafka`: [`TestKafka`], the broker a test talks to: the real one named by
//!   `KAFKA_BOOTSTRAP_SERVERS` (checked reachable, else the test fails loudly), or an
//!   embedded mock cluster when that is unset; [`produce`], one message produced and
//!   acknowledged; [`produce_events`] and [`produce_paced`], events keyed as edges key
//!   them; [`committed_offsets`], a group's offsets as the broker has them.
//! - `api`: [`get_json`] and [`send_json`], pulse's API asked in-process.

mod api;
mod kafka;

pub use api::{get_json, send_json};
pub use kafka::{
    BOOTSTRAP_ENV, TestKafka, committed_offsets, produce, produce_events, produce_paced,
    produce_signed, unique_name,
};

/// A local TCP port free a moment ago, for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The wall clock in milliseconds since the Unix epoch, as edges stamp events.
pub fn wall_ms() -> u64 {
    crate::clock::wall_clock_ms()
}
