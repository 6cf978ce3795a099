//! Pulse: the central service that watches every edge node's access events, keeps a
//! heat map of what is hot where, and tells edge nodes to pre-warm keys before their
//! first request.
//!
//! # Layout
//! - `api`: [`app`], the axum router of the dashboard API (`/api/tenants`,
//!   `/api/heatmap`, `/api/keys/{tenant}/{key}`, `/api/openapi.json`, `/healthz`,
//!   `/metrics`) and its [`ApiError`].
//! - `broker`: [`EmbeddedBroker`], librdkafka's in-process mock cluster, used when no
//!   broker is configured so one machine runs everything through the same Kafka code.
//! - `heat`: [`HeatMap`], per tenant a sliding window of time-bucketed Count-Min
//!   sketches and Top-K trackers on event time; [`KeyStats`] and [`HotKey`] are what
//!   queries return.
//! - `checkpoint`: [`save_checkpoint`] / [`load_checkpoint`], the heat map on disk,
//!   written atomically.
//! - `ingest`: [`Ingest`], the consumer-group member that feeds the heat map and
//!   commits offsets after the events are applied (and checkpointed).
//! - `metrics`: [`Metrics`], the Prometheus registry behind `/metrics`.

mod api;
mod backtest;
mod broker;
mod checkpoint;
mod heat;
mod ingest;
mod metrics;
mod predict;
mod prewarm;
pub mod scenario;
mod stoppable;
mod trace;

pub use api::require_api_token;
pub use api::{
    ApiError, AppState, ContributionView, DecisionTotals, DecisionView, ErrorBody, EvaluationView,
    Health, HeatmapQuery, HeatmapResponse, LeadTime, MAX_HEATMAP_ROWS, MAX_PREDICTIONS,
    ModelFeature, ModelResponse, PredictionsQuery, PredictionsResponse, TenantsResponse, app,
    openapi,
};
pub use backtest::{
    BacktestRow, EventFile, Replay, ReplayOptions, Replayer, backtest, percentile, read_events,
    read_topic, replay, score as score_replay, write_events,
};
pub use broker::{BrokerError, EmbeddedBroker};
pub use checkpoint::{
    CHECKPOINT_VERSION, CheckpointError, load as load_checkpoint, save as save_checkpoint,
};
pub use heat::{
    ApplyError, COARSE_BUCKETS, COARSE_MS, ConfigError, FINE_BUCKETS, FINE_MS, HeatConfig, HeatMap,
    HotKey, KeyStats, MAX_REGIONS, OutcomeCounts, QueryError, RegionCount, TenantHeat,
    TenantSummary, Trend, Velocities, Window, WindowStats,
};
pub use ingest::{BatchObserver, Ingest, IngestConfig, IngestError, RejectReason, SharedHeatMap};
pub use metrics::{Metrics, ReasonLabel, RouteLabel};
pub use predict::{
    Decider, Decision, DecisionCounts, DecisionPolicy, MIN_REGION_DEMAND, Predictor,
    PredictorConfig, RetrainOutcome, Sample, Skip, Verdict, retrain,
};
pub use prewarm::{PrewarmLoop, PrewarmPublisher, Retrainer, SharedPredictor, retrain_once};
pub use trace::{Burst, BurstKind, Trace, TraceSpec, generate as generate_trace};

/// The model pulse scores with unless told otherwise: trained by
/// `scripts/train-default-model` on a generated trace and shipped in the binary.
pub fn default_model() -> models::ScoringModel {
    models::ScoringModel::from_json(include_str!("../model/default.json"))
        .expect("the shipped model file is valid")
}

/// Topic that edge nodes publish [`models::AccessEvent`]s to.
pub const EVENTS_TOPIC: &str = "edge-events";
/// Topic that pulse publishes [`models::PrewarmCommand`]s to.
pub const PREWARM_TOPIC: &str = "prewarm";
