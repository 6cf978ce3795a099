//! Pulse: the central service that watches every edge node's access events, keeps a
//! heat map of what is hot where, and tells edge nodes to pre-warm keys before their
//! first request.
//!
//! [`start`] runs the whole service from a [`PulseConfig`] and returns a
//! [`PulseHandle`]; `pulse serve`, the tests, the benchmarks and the reference
//! scenario all run it that way.
//!
//! # Layout
//! The online service, one module per part; the offline lab beside it in `lab/`, which
//! uses the online modules. No online module imports `lab`.
//! - `service`: the assembly: [`PulseConfig`], [`start`], [`PulseHandle`], [`shutdown_signal`],
//!   [`check_config`] (what `start` checks, starting nothing).
//! - `logging`: [`init_logging`], the binary's log lines as text or JSON ([`LogFormat`]).
//! - `partition`: [`Partitions`], the state per owned partition of the events topic
//!   ([`PartitionState`]: heat map, predictor, applied offset, replay bound).
//! - `ingest`: [`Ingest`], the consumer-group member (cooperative rebalances, commit on
//!   revoke, replay on assign) that feeds the partitions and commits; the [`Clock`] it
//!   reads.
//! - `fleet`: the API's answers and the [`Coverage`] each carries, their merges over
//!   partitions and instances, [`partition_for_key`] (the producers' partitioner),
//!   [`Peers`] (the fan-out of a `scope=local` question to the other instances) and the
//!   model topic ([`ModelPublisher`], [`ModelWatcher`]: one model for the fleet).
//! - `heat`: [`HeatMap`] (`mod.rs`: applying events under the clock-skew bound and the
//!   memory budget), its [`HeatConfig`] (`config`), errors (`error`), idle tenants
//!   evicted (`evict`), the queries (`query`, answers in `view`); Count-Min sketches
//!   (`sketch`, own or shared), Top-K (`top`) and the time-bucketed rings (`rings`) per
//!   tenant (`tenant`), on event time; counters per kind of edge ([`EdgeSummary`],
//!   `edges`).
//! - `reject`: [`RejectReason`], why ingest refuses a message (metric and dead-letter label).
//! - `checkpoint`: `save` / [`load_checkpoint`], each owned partition's heat map and
//!   offset on disk ([`Checkpoint`]).
//! - `predict`: [`Predictor`], [`Features`], the [`ScoringModel`], decisions, the label
//!   rule, online retraining.
//! - `prewarm`: [`PrewarmLoop`], [`PrewarmPublisher`] and the [`Retrainer`] thread.
//! - `gate`: the fleet's command gate: per tenant one budget, cooldown and dedupe for
//!   every instance, behind a decisions topic keyed by tenant, its state in a
//!   compacted topic (`state`).
//! - `api`: [`app`] and its [`AppState`] (`mod.rs`: the router and the OpenAPI document),
//!   `ApiError` and the parameter checks (`error`), the handlers by resource (`heat`,
//!   `predictions`, `rates`, `edges`, `health`), the fleet fan-out (`fleet`), the
//!   bearer-token check (`auth`) and the dashboard page (`dashboard`).
//! - `warm`: operators' warm-ups (`POST /api/warm`): the checked request, the desk
//!   that holds the jobs, their paced proposals to the gate (the warm budget class),
//!   their progress credited from ingest, and `pulse warm` ([`warm_command`]).
//! - `metrics`: [`Metrics`], the Prometheus registry behind `/metrics`.
//! - `broker`: [`EmbeddedBroker`], librdkafka's mock cluster when no broker is given.
//! - `stoppable`: the stoppable background thread behind ingest and the retrainer.
//! - `ticks`: when each partition's predictor ticks (every 10 ms of event time, as the
//!   backtest does, however its events were batched).
//! - `lab`: the offline lab. `lab/trace/`: [`generate_trace`], synthetic traces with
//!   known bursts ([`TraceSpec`] in `spec`, the [`FAMILIES`] table in `family`, the
//!   generator in `generate`); `lab/backtest`: [`replay`] on event time, the backtest
//!   rows, [`read_topic`] and the event files; `lab/honest`: the honest scorer;
//!   `lab/commands`: `pulse train`/`backtest`/`trace` as calls ([`train_model`],
//!   [`backtest_table`], [`write_trace`]).
//! - `kafka`: [`KafkaClients`], the one factory of every Kafka client pulse makes
//!   (bootstrap servers plus the operator's librdkafka properties, [`RESERVED_PROPERTIES`]
//!   refused); the properties file reader.
//! - `clock`: [`wall_clock_ms`], the one reading of the system time.
//! - `testing` (feature `testing`): what the tests of pulse and of the cross-crate
//!   scenarios share: the broker under test ([`testing::TestKafka`]), producing events
//!   as edges do, a group's committed offsets, the API asked in-process. No service
//!   module names it (checked by `tests/tests/module_graph/`).
//!
//! # Public surface
//! What this file re-exports is what other crates and targets use (the `pulse`
//! binary, its examples, benches and tests, the `tests` crate, `fuzz/`) and the types
//! their signatures name (`unnameable_types` warns on one left out); everything else
//! is `pub(crate)`.

#![warn(unnameable_types)]

mod api;
mod broker;
mod checkpoint;
mod clock;
mod fleet;
mod gate;
mod heat;
mod ingest;
mod kafka;
mod lab;
mod logging;
mod metrics;
mod partition;
mod predict;
mod prewarm;
mod reject;
mod service;
mod stoppable;
#[cfg(feature = "testing")]
pub mod testing;
mod ticks;
mod topics;
mod warm;

pub use api::{AppState, app};
pub use broker::{BrokerError, EmbeddedBroker};
pub use checkpoint::{Checkpoint, CheckpointError, PartitionSnapshot, load as load_checkpoint};
pub use fleet::{
    Coverage, DEFAULT_PEER_TIMEOUT, ErrorBody, MAX_MODEL_BYTES, MIN_PAIRS, MODEL_KEY,
    MODEL_REJECT_REASONS, ModelPublisher, ModelTopic, ModelTopicError, ModelWatcher, Ownership,
    Partitioner, PeerAnswer, PeerFailure, PeerUrl, Peers, PeersConfig, PeersError, TopicState,
    partition_for_key,
};
pub use heat::{
    ApplyError, ConfigError, EdgeSummary, EvictedTenant, HeatConfig, HeatMap, HotKey, KeyStats,
    OutcomeCounts, QueryError, RegionCount, SketchKind, TenantHeat, TenantSummary, Trend,
    Velocities, Window, WindowStats,
};
pub use ingest::{BatchObserver, Clock, Ingest, IngestConfig, IngestError};
pub use lab::{
    BacktestRow, Burst, BurstKind, EventFile, EventOrder, EventSource, FAMILIES, Family, FamilyRow,
    OfflineError, Replay, ReplayOptions, Trace, TraceSpec, TrainingSet, ViralReferrers,
    backtest_commands, backtest_table, family_rows, family_table, generate_trace, load_events,
    percentile, read_topic, replay, train_model, train_on, train_on_families, train_summary,
    write_commands, write_trace,
};
pub use logging::{LOG_FORMAT_ENV, LogFormat, init_logging};
pub use metrics::{
    Metrics, ModelWatcherCounts, OutcomeLabel, PartitionerLabel, PeerLabel, ReasonLabel, RouteLabel,
};
pub use partition::{PartitionHealth, PartitionState, PartitionTemplate, Partitions, Snapshot};
pub use predict::{
    Calibration, Decision, DecisionCounts, DecisionPolicy, Evaluation, FEATURE_COUNT, Features,
    LastDecision, ModelError, Predictor, PredictorConfig, RETRAIN_INTERVAL_SECS, ReliabilityBin,
    Sample, Score, ScoringModel, Skip, Stage, TrainOptions, TrainingMetrics, Transform, Verdict,
    default_model,
};
pub use prewarm::PrewarmPublisher;
pub use reject::RejectReason;
pub use service::{
    PulseConfig, PulseConfigError, PulseHandle, StartError, check_config, shutdown_signal, start,
};
pub use warm::{WarmArgs, warm_command};

pub use clock::wall_clock_ms;
pub use kafka::{
    KafkaClients, KafkaPropertyError, check_properties, parse_property, read_properties_file,
};
/// The default topics, from the wire contract.
pub use models::{EVENTS_TOPIC, PREWARM_TOPIC};
