//! Pulse: the central service that watches every edge node's access events, keeps a
//! heat map of what is hot where, and tells edge nodes to pre-warm keys before their
//! first request.
//!
//! # Layout
//! - `broker`: [`EmbeddedBroker`], librdkafka's in-process mock cluster, used when no
//!   broker is configured so one machine runs everything through the same Kafka code.

mod broker;
mod decide;
mod trace;

pub use broker::{BrokerError, EmbeddedBroker};
pub use decide::{Decider, Decision, DecisionCounts, DecisionPolicy, Skip, Verdict};
pub use trace::{Burst, BurstKind, Trace, TraceSpec, generate as generate_trace};

/// Topic that edge nodes publish [`models::AccessEvent`]s to.
pub const EVENTS_TOPIC: &str = "edge-events";
/// Topic that pulse publishes [`models::PrewarmCommand`]s to.
pub const PREWARM_TOPIC: &str = "prewarm";
