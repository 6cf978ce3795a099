//! The one assembly of pulse: a [`PulseConfig`] goes in, [`start`] wires the parts
//! together, and a [`PulseHandle`] comes out. `pulse serve`, every test, the ingest
//! benchmark and the reference scenario run pulse through here, so they all run the
//! service that ships.
//!
//! What `start` does, in order:
//! 1. validates the config (the error names the field);
//! 2. without `brokers`, starts an [`EmbeddedBroker`] and creates the topics on it;
//! 3. reads the checkpoint file, if there is one of this topic: each partition's
//!    snapshot waits for its partition to be assigned (an unreadable or older one: a
//!    warning, and partitions start empty);
//! 4. with `prewarm` on, loads the model (every partition's predictor uses it) and
//!    the pre-warm publisher (run on the ingest thread after each batch) and, with a
//!    retrain interval, the retrainer;
//! 5. starts ingest, whose rebalances create and drop the partitions' states, then
//!    binds the API listener and serves the dashboard API (behind the bearer token,
//!    when one is set).
//!
//! [`PulseHandle::shutdown`] undoes it in reverse: the API stops, the retrainer stops,
//! ingest writes its final checkpoint and commits, and the embedded broker goes last.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pulse::StartError> {
//! let config = pulse::PulseConfig {
//!     brokers: Some("127.0.0.1:9092".into()),
//!     listen: "127.0.0.1:0".parse().unwrap(),
//!     ..pulse::PulseConfig::default()
//! };
//! let pulse = pulse::start(config).await?;
//! println!("dashboard at {}", pulse.api_url());
//! pulse.shutdown().await;
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use models::TenantId;
use rdkafka::error::KafkaError;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AppState, app, require_api_token};
use crate::broker::{BrokerError, EmbeddedBroker};
use crate::checkpoint::{self, CheckpointError};
use crate::fleet::{
    DEFAULT_PEER_TIMEOUT, ModelPublisher, ModelTopic, ModelWatcher, Peers, PeersConfig, PeersError,
};
use crate::heat::{HeatConfig, Window};
use crate::ingest::{BatchObserver, Ingest, IngestConfig, IngestError, WallClock};
use crate::metrics::Metrics;
use crate::partition::{PartitionTemplate, Partitions, SharedPartitions, Snapshot};
use crate::predict::{DecisionPolicy, ModelError, PredictorConfig, ScoringModel, default_model};
use crate::prewarm::{PrewarmLoop, PrewarmPublisher, Retrainer};
use crate::{EVENTS_TOPIC, PREWARM_TOPIC};

/// Everything `pulse serve` can be told. Every field has a default (the flags'
/// defaults); unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PulseConfig {
    /// Kafka bootstrap servers (`HOST:PORT,...`); `None` starts an embedded broker.
    pub brokers: Option<String>,
    /// The events topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Where the dashboard API listens (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Checkpoint file: every owned partition's heat map and offset, written
    /// periodically and at shutdown (offsets are committed after each checkpoint); a
    /// partition assigned later starts from its snapshot.
    pub checkpoint: Option<PathBuf>,
    /// Seconds between checkpoints.
    pub checkpoint_interval_secs: u64,
    /// Seconds between offset commits when there is no checkpoint file.
    pub commit_interval_secs: u64,
    /// Where rejected messages go (with a `pulse-reject-reason` header), if anywhere.
    pub dead_letter_topic: Option<String>,
    /// Sketch sizes and limits.
    pub heat: HeatConfig,
    /// Tenants allowed (with those of `tenants_file`); both empty: every tenant.
    /// Events of others are rejected (`unknown_tenant`).
    pub tenants: Vec<String>,
    /// A file of allowed tenants, one per line; blank lines and `#` comments skipped.
    pub tenants_file: Option<PathBuf>,
    /// Predict and send pre-warm commands; off: heat map and API only.
    pub prewarm: bool,
    /// The topic pre-warm commands go to.
    pub prewarm_topic: String,
    /// The scoring model file (JSON, from `pulse train`); the shipped model without it.
    pub model: Option<PathBuf>,
    /// Minimum confidence for a pre-warm command, in [0, 1].
    pub threshold: f64,
    /// How long a key waits after a command before it can get another.
    pub cooldown_ms: u64,
    /// How long a command stays valid at the edges.
    pub command_ttl_ms: u64,
    /// Each tenant's committed rate of commands per second, for the whole topic:
    /// each partition gets an even share.
    pub tenant_rate_per_s: f64,
    /// Each tenant's burst allowance, in commands, split like the rate (at least one
    /// per partition).
    pub tenant_burst: f64,
    /// What a wasted pre-warm fill costs, in client misses (the cost rule).
    pub wasted_fill_cost: f64,
    /// Per-tenant overrides of `wasted_fill_cost`.
    pub tenant_fill_costs: std::collections::HashMap<TenantId, f64>,
    /// Seconds between background retrains on pulse's own labelled decisions (0: never).
    pub retrain_interval_secs: u64,
    /// Require `Authorization: Bearer <token>` on every `/api/*` route.
    pub api_token: Option<String>,
    /// Partitions of the topics created on the embedded broker.
    pub embedded_partitions: i32,
    /// The other instances of this group (`http://host:port` of their APIs): fleet
    /// answers gather their `scope=local` parts. Empty: this instance answers alone.
    pub peers: Vec<String>,
    /// How long a peer may take to answer, in milliseconds.
    pub peer_timeout_ms: u64,
    /// One model for the fleet: published on a compacted topic by the instance that
    /// owns partition 0 and read by every instance. Off: each instance keeps and
    /// retrains its own model.
    pub fleet_model: bool,
    /// The fleet model's topic; `None`: `{topic}.{group}.model` (one per fleet).
    pub model_topic: Option<String>,
}

impl Default for PulseConfig {
    fn default() -> Self {
        let policy = DecisionPolicy::default();
        PulseConfig {
            brokers: None,
            topic: EVENTS_TOPIC.to_owned(),
            group: "pulse".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            checkpoint: None,
            checkpoint_interval_secs: 10,
            commit_interval_secs: 2,
            dead_letter_topic: None,
            heat: HeatConfig::default(),
            tenants: Vec::new(),
            tenants_file: None,
            prewarm: true,
            prewarm_topic: PREWARM_TOPIC.to_owned(),
            model: None,
            threshold: policy.threshold,
            cooldown_ms: policy.cooldown_ms,
            command_ttl_ms: policy.command_ttl_ms,
            tenant_rate_per_s: policy.tenant_rate_per_s,
            tenant_burst: policy.tenant_burst,
            wasted_fill_cost: policy.wasted_fill_cost,
            tenant_fill_costs: policy.tenant_fill_costs,
            retrain_interval_secs: 300,
            api_token: None,
            embedded_partitions: 4,
            peers: Vec::new(),
            peer_timeout_ms: DEFAULT_PEER_TIMEOUT.as_millis() as u64,
            fleet_model: true,
            model_topic: None,
        }
    }
}

/// A [`PulseConfig`] field that is refused, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PulseConfigError {
    /// The field, as named in [`PulseConfig`] (`heat.top_k` for the sketch settings).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> Result<(), PulseConfigError> {
    Err(PulseConfigError {
        field,
        reason: reason.into(),
    })
}

impl PulseConfig {
    /// Checks every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), PulseConfigError> {
        if let Some(b) = &self.brokers {
            if b.trim().is_empty() || b.split(',').any(|s| !s.contains(':')) {
                return refuse(
                    "brokers",
                    format!("expected HOST:PORT[,HOST:PORT...], got {b:?}"),
                );
            }
        }
        if self.topic.trim().is_empty() {
            return refuse("topic", "must not be empty");
        }
        if self.group.trim().is_empty() {
            return refuse("group", "must not be empty");
        }
        if let Some(dlq) = &self.dead_letter_topic {
            if dlq.trim().is_empty() || *dlq == self.topic {
                return refuse(
                    "dead_letter_topic",
                    "must be non-empty and differ from topic",
                );
            }
        }
        if self.checkpoint_interval_secs == 0 {
            return refuse("checkpoint_interval_secs", "must be at least 1");
        }
        if self.commit_interval_secs == 0 {
            return refuse("commit_interval_secs", "must be at least 1");
        }
        if let Err(e) = self.heat.validate() {
            let field = match e.field {
                "error" => "heat.error",
                "confidence" => "heat.confidence",
                "top_k" => "heat.top_k",
                "region_top_k" => "heat.region_top_k",
                "shared_sketch_below" => "heat.shared_sketch_below",
                "shared_error" => "heat.shared_error",
                "max_clock_skew_ms" => "heat.max_clock_skew_ms",
                _ => "heat.memory_budget_bytes",
            };
            return refuse(field, e.reason);
        }
        if let Some(bad) = self
            .tenants
            .iter()
            .find(|t| TenantId::new(t.as_str()).is_err())
        {
            return refuse("tenants", format!("{bad:?} is not a valid tenant id"));
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return refuse("threshold", format!("{} is outside [0, 1]", self.threshold));
        }
        if self.command_ttl_ms < 1_000 {
            return refuse("command_ttl_ms", "must be at least 1 s");
        }
        if !(self.tenant_rate_per_s > 0.0 && self.tenant_rate_per_s.is_finite()) {
            return refuse("tenant_rate_per_s", "must be positive");
        }
        if !(self.tenant_burst >= 1.0 && self.tenant_burst.is_finite()) {
            return refuse("tenant_burst", "must be at least 1");
        }
        let costs = std::iter::once(&self.wasted_fill_cost).chain(self.tenant_fill_costs.values());
        if costs.into_iter().any(|c| !(*c >= 0.0 && c.is_finite())) {
            return refuse("wasted_fill_cost", "must be 0 or more");
        }
        if self.prewarm_topic.trim().is_empty() || self.prewarm_topic == self.topic {
            return refuse("prewarm_topic", "must be non-empty and differ from topic");
        }
        if !(1..=1_000).contains(&self.embedded_partitions) {
            return refuse("embedded_partitions", "1 to 1000");
        }
        if self.peer_timeout_ms == 0 {
            return refuse("peer_timeout_ms", "must be at least 1");
        }
        if let Err(e) = self.peers() {
            return refuse("peers", e.to_string());
        }
        let model_topic = self.model_topic();
        if !models::is_topic_name(&model_topic)
            || [&self.topic, &self.prewarm_topic].contains(&&model_topic)
        {
            return refuse(
                "model_topic",
                format!(
                    "{model_topic:?}: a topic name (letters, digits, '.', '_', '-'; at most \
                     249) that differs from topic and prewarm_topic"
                ),
            );
        }
        Ok(())
    }

    /// The fleet model's topic: `model_topic`, or one named after the events topic and
    /// the group, so each fleet has its own.
    pub fn model_topic(&self) -> String {
        self.model_topic
            .clone()
            .unwrap_or_else(|| format!("{}.{}.model", self.topic, self.group))
    }

    /// The peers these settings name, `None` without any.
    pub fn peers(&self) -> Result<Option<Peers>, PeersError> {
        if self.peers.is_empty() {
            return Ok(None);
        }
        let config = PeersConfig {
            timeout: Duration::from_millis(self.peer_timeout_ms),
            api_token: self.api_token.clone(),
            ..PeersConfig::default()
        };
        Peers::new(&self.peers, config).map(Some)
    }

    /// The decision rules these settings give.
    pub fn policy(&self) -> DecisionPolicy {
        DecisionPolicy {
            threshold: self.threshold,
            cooldown_ms: self.cooldown_ms,
            command_ttl_ms: self.command_ttl_ms,
            tenant_rate_per_s: self.tenant_rate_per_s,
            tenant_burst: self.tenant_burst,
            wasted_fill_cost: self.wasted_fill_cost,
            tenant_fill_costs: self.tenant_fill_costs.clone(),
            ..DecisionPolicy::default()
        }
    }
}

/// Why pulse could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid pulse config: {0}")]
    Config(#[from] PulseConfigError),
    /// The embedded broker could not start or create a topic.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The checkpoint file exists but the file system refuses to read it.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The tenants file cannot be read or names an invalid tenant.
    #[error("tenants_file: {path}: {reason}")]
    TenantsFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The model file cannot be read.
    #[error("model: {path}: {source}")]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The model file is not a valid model.
    #[error("model: {path}: {source}")]
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: ModelError,
    },
    /// The pre-warm producer could not be created.
    #[error("pre-warm publisher: {0}")]
    Publisher(KafkaError),
    /// Ingest could not start.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The API listener could not bind.
    #[error("listen: binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A running pulse. [`PulseHandle::shutdown`] stops it in order (final checkpoint and
/// commit included); dropping it stops the API and, as their own drops do, the
/// retrainer and ingest.
pub struct PulseHandle {
    api_addr: SocketAddr,
    brokers: String,
    state: AppState,
    router: Router,
    shutdown_tx: watch::Sender<bool>,
    api: Option<JoinHandle<()>>,
    retrainer: Option<Retrainer>,
    model_watcher: Option<ModelWatcher>,
    ingest: Option<Ingest>,
    // Declared last: dropped after ingest has stopped.
    embedded: Option<EmbeddedBroker>,
}

/// Starts pulse as `config` says. See the module documentation for the order.
pub async fn start(config: PulseConfig) -> Result<PulseHandle, StartError> {
    config.validate()?;
    let mut embedded = None;
    let brokers = match &config.brokers {
        Some(b) => b.clone(),
        None => {
            let broker = EmbeddedBroker::start(1)?;
            broker.create_topic(&config.topic, config.embedded_partitions)?;
            broker.create_topic(&config.prewarm_topic, config.embedded_partitions)?;
            if let Some(dlq) = &config.dead_letter_topic {
                broker.create_topic(dlq, 1)?;
            }
            let address = broker.bootstrap_servers().to_owned();
            tracing::info!(bootstrap = %address, "no brokers configured: started an embedded broker");
            embedded = Some(broker);
            address
        }
    };

    let allowed = allowed_tenants(&config)?;
    if let Some(allowed) = &allowed {
        tracing::info!(tenants = allowed.len(), "tenant allow-list on");
    }
    let metrics = Arc::new(Metrics::new());
    let model = if config.prewarm {
        let model = load_model(&config)?;
        tracing::info!(model = %model.name, threshold = config.threshold, "prediction on");
        Some(Arc::new(model))
    } else {
        None
    };
    let mut partitions = Partitions::new(
        PartitionTemplate {
            heat: config.heat.clone(),
            allowed_tenants: allowed,
            predictor: config.prewarm.then(|| PredictorConfig {
                policy: config.policy(),
                ..PredictorConfig::default()
            }),
        },
        model,
    );
    if let Some((count, snapshots)) = restore(&config)? {
        partitions.set_snapshots(count, snapshots);
    }
    let partitions = partitions.shared();
    // One model for the fleet: whatever is newest on the model topic is put in use on
    // every partition, here and on every other instance.
    let fleet_model = if config.prewarm && config.fleet_model {
        let topic = config.model_topic();
        follow_model_topic(&brokers, &topic, embedded.as_ref(), &partitions, &metrics).await
    } else {
        None
    };
    let (model_publisher, model_watcher) = fleet_model.unzip();
    // Prediction runs on the ingest thread after each batch; the retrainer beside it.
    let mut observer: Option<Box<dyn BatchObserver>> = None;
    let mut retrainer = None;
    if config.prewarm {
        let publisher = PrewarmPublisher::new(&brokers, &config.prewarm_topic)
            .map_err(StartError::Publisher)?;
        observer = Some(Box::new(PrewarmLoop::new(publisher, metrics.clone())));
        if config.retrain_interval_secs > 0 {
            retrainer = Some(Retrainer::start(
                partitions.clone(),
                Duration::from_secs(config.retrain_interval_secs),
                config.threshold,
                metrics.clone(),
                model_publisher,
            ));
        }
    }
    let ingest = Ingest::start_with(
        IngestConfig {
            brokers: brokers.clone(),
            topic: config.topic.clone(),
            group_id: config.group.clone(),
            dead_letter_topic: config.dead_letter_topic.clone(),
            checkpoint: config.checkpoint.clone(),
            checkpoint_interval: Duration::from_secs(config.checkpoint_interval_secs),
            commit_interval: Duration::from_secs(config.commit_interval_secs),
            clock: Arc::new(WallClock),
            replay: Duration::from_millis(Window::S60.millis() + config.heat.max_clock_skew_ms),
        },
        partitions.clone(),
        metrics.clone(),
        observer,
    )?;

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    let api_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listen,
        source,
    })?;
    let peers = config.peers().map_err(|e| PulseConfigError {
        field: "peers",
        reason: e.to_string(),
    })?;
    if let Some(peers) = &peers {
        tracing::info!(peers = peers.len(), "fleet answers gather the peers' parts");
    }
    let state = AppState {
        partitions,
        metrics,
        peers,
    };
    let router = require_api_token(app(state.clone()), config.api_token.as_deref());
    let (shutdown_tx, mut shutdown_rx) = watch::channel(false);
    let served = router.clone();
    let api = tokio::spawn(async move {
        let stopped = async move {
            let _ = shutdown_rx.wait_for(|stop| *stop).await;
        };
        if let Err(e) = axum::serve(listener, served)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "dashboard API stopped");
        }
    });
    tracing::info!(address = %api_addr, "dashboard API listening");
    Ok(PulseHandle {
        api_addr,
        brokers,
        state,
        router,
        shutdown_tx,
        api: Some(api),
        retrainer,
        model_watcher,
        ingest: Some(ingest),
        embedded,
    })
}

/// Creates the model topic if needed and follows it: the newest model on it is put in
/// use on every partition. `None`, with a warning, when the topic cannot be had: each
/// instance then keeps its own model.
async fn follow_model_topic(
    brokers: &str,
    topic: &str,
    embedded: Option<&EmbeddedBroker>,
    partitions: &SharedPartitions,
    metrics: &Metrics,
) -> Option<(ModelPublisher, ModelWatcher)> {
    let ready = match embedded {
        // librdkafka's mock cluster has no topic configs: a plain topic does.
        Some(broker) => broker.create_topic(topic, 1).map_err(|e| e.to_string()),
        None => ModelTopic::ensure(brokers, topic)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    };
    let started = ready.and_then(|()| {
        let publisher = ModelPublisher::new(brokers, topic).map_err(|e| e.to_string())?;
        let partitions = partitions.clone();
        let watcher = ModelWatcher::start_counted(
            brokers,
            topic,
            metrics.model_watch.clone(),
            move |model| {
                tracing::info!(model = %model.name, "fleet model in use");
                partitions
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_model(model);
            },
        )
        .map_err(|e| e.to_string())?;
        Ok((publisher, watcher))
    });
    match started {
        Ok(fleet) => Some(fleet),
        Err(e) => {
            tracing::warn!(topic, error = %e, "no fleet model topic: this instance keeps and retrains its own model");
            None
        }
    }
}

/// A checkpoint's snapshots by partition, with the partition count they were taken with.
type Snapshots = (i32, HashMap<i32, Snapshot>);

/// The partitions' snapshots from the checkpoint, when it is of this topic and has the
/// configured sketch settings (the configured limits apply when a partition is
/// assigned); none, with a warning, when the checkpoint is of another topic, has other
/// settings or a format this build does not read (an older version). Only a file the
/// file system refuses to read stops the start.
fn restore(config: &PulseConfig) -> Result<Option<Snapshots>, StartError> {
    let Some(path) = &config.checkpoint else {
        return Ok(None);
    };
    let loaded = match checkpoint::load(path) {
        Ok(Some(loaded)) => loaded,
        Ok(None) => return Ok(None),
        Err(e @ CheckpointError::Format { .. }) => {
            tracing::warn!(error = %e, "checkpoint not restored; starting empty (it is replaced at the next checkpoint)");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    if loaded.topic != config.topic {
        tracing::warn!(path = %path.display(), topic = %loaded.topic, "checkpoint of another topic; starting empty");
        return Ok(None);
    }
    let mut snapshots = HashMap::new();
    let split = crate::partition::split_heat(&config.heat, loaded.partition_count);
    for p in loaded.partitions {
        if !p.heat.config().same_sketches(&split) {
            tracing::warn!(path = %path.display(), partition = p.partition, "checkpoint has other sketch settings; starting empty");
            return Ok(None);
        }
        snapshots.insert(
            p.partition,
            Snapshot {
                next_offset: p.next_offset,
                heat: p.heat,
            },
        );
    }
    tracing::info!(path = %path.display(), partitions = snapshots.len(), "checkpoint read; partitions restore on assign");
    Ok(Some((loaded.partition_count, snapshots)))
}

/// The allow-list: `tenants` and the lines of `tenants_file`; `None` when both are
/// empty (every tenant allowed).
fn allowed_tenants(config: &PulseConfig) -> Result<Option<HashSet<String>>, StartError> {
    let mut allowed: HashSet<String> = config.tenants.iter().cloned().collect();
    if let Some(path) = &config.tenants_file {
        let bad = |reason: String| StartError::TenantsFile {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            TenantId::new(line).map_err(|e| bad(format!("line {}: {line:?}: {e}", n + 1)))?;
            allowed.insert(line.to_owned());
        }
        if allowed.is_empty() {
            return Err(bad("names no tenant".to_owned()));
        }
    }
    Ok((!allowed.is_empty()).then_some(allowed))
}

fn load_model(config: &PulseConfig) -> Result<ScoringModel, StartError> {
    let Some(path) = &config.model else {
        return Ok(default_model());
    };
    let text = std::fs::read_to_string(path).map_err(|source| StartError::ModelFile {
        path: path.clone(),
        source,
    })?;
    ScoringModel::from_json(&text).map_err(|source| StartError::Model {
        path: path.clone(),
        source,
    })
}

impl PulseHandle {
    /// Where the dashboard API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// `http://` + the API's address.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api_addr)
    }

    /// The `bootstrap.servers` pulse uses: the configured ones, or the embedded
    /// broker's.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Whether pulse runs its own embedded broker.
    pub fn embedded_broker(&self) -> bool {
        self.embedded.is_some()
    }

    /// The metrics `/metrics` serves.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.metrics
    }

    /// The owned partitions' states, which the ingest thread writes.
    pub fn partitions(&self) -> &SharedPartitions {
        &self.state.partitions
    }

    /// What the API handlers share (for a dashboard served elsewhere).
    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// The router the API listener serves, token check included (for `oneshot`).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Stops the API, then the retrainer, then ingest (final checkpoint and commit,
    /// off the async threads), then the embedded broker.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        if let Some(api) = self.api.take() {
            let _ = api.await;
        }
        let retrainer = self.retrainer.take();
        let model_watcher = self.model_watcher.take();
        let ingest = self.ingest.take();
        let embedded = self.embedded.take();
        let stopped = tokio::task::spawn_blocking(move || {
            if let Some(retrainer) = retrainer {
                retrainer.stop();
            }
            if let Some(watcher) = model_watcher {
                watcher.stop();
            }
            if let Some(ingest) = ingest {
                ingest.stop();
            }
            drop(embedded);
        })
        .await;
        if let Err(e) = stopped {
            tracing::error!(error = %e, "pulse shutdown panicked");
        }
        tracing::info!("pulse stopped");
    }
}

impl Drop for PulseHandle {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

/// Resolves on SIGINT or SIGTERM: the signal `pulse serve` stops on.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_checkpoint(path: &std::path::Path) -> PulseConfig {
        PulseConfig {
            checkpoint: Some(path.to_owned()),
            ..PulseConfig::default()
        }
    }

    /// A checkpoint of an older format (version 3, before the shared sketch; version
    /// 4, one heat map per process) or of garbage: pulse starts with empty partitions
    /// (and a warning), never fails.
    #[test]
    fn an_old_or_unreadable_checkpoint_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.ckpt");
        for text in [
            r#"{"version":3,"heat":{"config":{"max_tenants":64},"watermark_ms":5,"tenants":{}}}"#,
            r#"{"version":4,"heat":{"config":{},"watermark_ms":5,"tenants":{}}}"#,
            "{ not json",
        ] {
            std::fs::write(&path, text).unwrap();
            assert!(
                restore(&with_checkpoint(&path))
                    .expect("no error")
                    .is_none()
            );
        }
    }

    /// The allow-list joins `tenants` and the file's lines (comments and blanks
    /// skipped); an invalid name in the file is refused naming its line.
    #[test]
    fn the_allow_list_joins_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.txt");
        std::fs::write(&path, "# customers\nacme\n\nglobex  # since May\n").unwrap();
        let config = PulseConfig {
            tenants: vec!["initech".into()],
            tenants_file: Some(path.clone()),
            ..PulseConfig::default()
        };
        let allowed = allowed_tenants(&config).unwrap().unwrap();
        let mut names: Vec<&str> = allowed.iter().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["acme", "globex", "initech"]);
        assert!(allowed_tenants(&PulseConfig::default()).unwrap().is_none());

        std::fs::write(&path, "acme\nnot a tenant!\n").unwrap();
        let error = allowed_tenants(&config).unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        let bad = PulseConfig {
            tenants: vec!["no spaces allowed".into()],
            ..PulseConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "tenants");
    }
}
