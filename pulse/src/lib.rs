//! Pulse: the central service that watches every edge node's access events, keeps a
//! heat map of what is hot where, and tells edge nodes to pre-warm keys before their
//! first request.
//!
//! [`start`] runs the whole service from a [`PulseConfig`] and returns a
//! [`PulseHandle`]; `pulse serve`, the tests, the benchmarks and the reference
//! scenario all run it that way.
//!
//! # Layout
//! - `service`: the assembly: [`PulseConfig`], [`start`], [`PulseHandle`], [`shutdown_signal`].
//! - `partition`: [`Partitions`], the state per owned partition of the events topic
//!   ([`PartitionState`]: heat map, predictor, applied offset, replay bound).
//! - `ingest`: [`Ingest`], the consumer-group member (cooperative rebalances, commit on
//!   revoke, replay on assign) that feeds the partitions and commits; the [`Clock`] it
//!   reads.
//! - `fleet`: the API's answers ([`TenantsResponse`], …) and the [`Coverage`] each
//!   carries, their merges over partitions and instances, [`partition_for_key`] (the
//!   producers' partitioner), [`Peers`] (the fan-out of a `scope=local` question to the
//!   other instances) and the model topic ([`ModelPublisher`], [`ModelWatcher`]: one
//!   model for the fleet).
//! - `heat`: [`HeatMap`], Count-Min sketches (own or shared) and Top-K per tenant on event
//!   time, idle tenants evicted, the clock-skew bound; counters per kind of edge
//!   ([`EdgeSummary`]).
//! - `reject`: [`RejectReason`], why ingest refuses a message (metric and dead-letter label).
//! - `checkpoint`: [`save_checkpoint`] / [`load_checkpoint`], each owned partition's heat
//!   map and offset on disk.
//! - `predict`: [`Predictor`], [`Features`], the [`ScoringModel`], decisions, retraining.
//! - `prewarm`: [`PrewarmLoop`], [`PrewarmPublisher`] and the [`Retrainer`] thread.
//! - `api`: [`app`], the dashboard API and page, [`ApiError`], the bearer-token check.
//! - `metrics`: [`Metrics`], the Prometheus registry behind `/metrics`.
//! - `broker`: [`EmbeddedBroker`], librdkafka's mock cluster when no broker is given.
//! - `trace`: [`generate_trace`], synthetic traces with known bursts ([`TraceSpec`]).
//! - `backtest`: [`replay`] and [`backtest`] on event time; [`read_events`], [`read_topic`].
//! - `offline`: `pulse train`/`backtest`/`trace` as calls ([`train_model`], [`backtest_table`]).
//! - `stoppable`: the stoppable background thread behind ingest and the retrainer.
//! - `ticks`: when each partition's predictor ticks (every 10 ms of event time, as the
//!   backtest does, however its events were batched).
//! - `kafka`: [`KafkaClients`], the one factory of every Kafka client pulse makes
//!   (bootstrap servers plus the operator's librdkafka properties, [`RESERVED_PROPERTIES`]
//!   refused); the properties file reader.
//! - `clock`: [`wall_clock_ms`], the one reading of the system time.
//! - `testing` (feature `testing`): what the tests of pulse and of the cross-crate
//!   scenarios share: the broker under test ([`testing::TestKafka`]), producing events
//!   as edges do, a group's committed offsets, the API asked in-process. No service
//!   module names it (checked by `tests/tests/module_graph/`).

mod api;
mod broker;
mod checkpoint;
mod fleet;
mod heat;
mod ingest;
mod lab;
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

pub use api::{
    ApiError, AppState, ContributionView, DecisionTotals, DecisionView, EdgesResponse, ErrorBody,
    EvaluationView, Health, HeatmapQuery, HeatmapResponse, KeyQuery, KeyResponse, LeadTime,
    MAX_HEATMAP_ROWS, MAX_PREDICTIONS, ModelFeature, ModelResponse, PredictionsQuery,
    PredictionsResponse, RatePoint, RatesResponse, ReliabilityView, TenantsResponse, app, openapi,
    require_api_token,
};
pub use broker::{BrokerError, EmbeddedBroker};
pub use checkpoint::{
    CHECKPOINT_VERSION, Checkpoint, CheckpointError, PartitionSnapshot, load as load_checkpoint,
    save as save_checkpoint,
};
pub use fleet::{
    Coverage, DEFAULT_MAX_PEER_BODY, DEFAULT_PEER_TIMEOUT, MAX_MODEL_BYTES, MODEL_KEY,
    MODEL_REJECT_REASONS, ModelPublisher, ModelTopic, ModelTopicError, ModelWatcher, PeerAnswer,
    PeerFailure, PeerUrl, Peers, PeersConfig, PeersError, Scope, ScopeQuery, TopicState, crc32,
    partition_for_key,
};
pub use heat::{
    ApplyError, COARSE_BUCKETS, COARSE_MS, ConfigError, EdgeSummary, EvictedTenant, FINE_BUCKETS,
    FINE_MS, HeatConfig, HeatMap, HotKey, IDLE_EVICT_MS, KeyStats, MAX_EVICTED_SUMMARIES,
    MAX_NODES_PER_EDGE, MAX_REGIONS, NODE_WINDOW_S, OutcomeCounts, QueryError, RATE_WINDOW_S,
    RegionCount, SketchKind, TenantHeat, TenantSummary, Trend, Velocities, Window, WindowStats,
};
pub use ingest::{BatchObserver, Clock, Ingest, IngestConfig, IngestError, WallClock};
pub use lab::{
    BacktestRow, Burst, BurstKind, CommandScore, EventFile, EventSource, FAMILIES, Family,
    FamilyRow, HonestOptions, HonestScore, OfflineError, Replay, ReplayOptions, Replayer, Trace,
    TraceSpec, ViralReferrers, backtest, backtest_commands, backtest_table, family_rows,
    family_table, generate_trace, load_events, percentile, read_events, read_topic, replay,
    score_commands, score_replay, train_model, train_on_families, train_summary, training_samples,
    write_commands, write_events, write_trace,
};
pub use metrics::{Metrics, ModelWatcherCounts, PeerLabel, ReasonLabel, RouteLabel};
pub use partition::{
    PartitionHealth, PartitionState, PartitionTemplate, Partitions, SharedPartitions, Snapshot,
};
pub use predict::{
    Calibration, Candidate, Decider, Decision, DecisionCounts, DecisionPolicy, Evaluation,
    FEATURE_COUNT, FEATURE_NAMES, Features, MAX_Z, MIN_REGION_DEMAND, MODEL_FORMAT, ModelError,
    Predictor, PredictorConfig, ReliabilityBin, RetrainOutcome, Sample, Score, ScoringModel, Skip,
    TrainOptions, TrainingMetrics, Transform, Verdict, command_id, default_model, reliability,
    retrain,
};
pub use prewarm::{
    FLEET_TRAINER_PARTITION, PrewarmLoop, PrewarmPublisher, Retrainer, retrain_once,
};
pub use reject::RejectReason;
pub use service::{PulseConfig, PulseConfigError, PulseHandle, StartError, shutdown_signal, start};

/// The default topics, from the wire contract.
pub use models::{EVENTS_TOPIC, PREWARM_TOPIC};

// The Kafka client factory and the wall clock: their modules and public names.
mod clock;
mod kafka;
pub use clock::wall_clock_ms;
pub use kafka::{
    KafkaClients, KafkaPropertyError, RESERVED_PROPERTIES, check_properties, parse_property,
    read_properties_file,
};
