//! The one assembly of pulse: a [`PulseConfig`] goes in, [`start`] wires the parts
//! together, and a [`PulseHandle`] comes out. `pulse serve`, every test, the ingest
//! benchmark and the reference scenario run pulse through here, so they all run the
//! service that ships.
//!
//! What `start` does, in order:
//! 1. validates the config (the error names the field) and, with
//!    `prewarm_signing_keys`, reads the key file and takes the signing key from it;
//! 2. without `brokers`, starts an [`EmbeddedBroker`] and creates the topics on it;
//!    with them, creates the topics the broker lacks (`topic_partitions`,
//!    `topic_retention_ms`; where it may not, it says once that it waits for them);
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

mod check;
mod config;

pub use check::check_config;
pub use config::{PulseConfig, PulseConfigError};

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use models::{Signer, SigningKeys, TenantId};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AppState, app, require_api_token};
use crate::broker::{BrokerError, EmbeddedBroker};
use crate::checkpoint::{self, CheckpointError};
use crate::fleet::{ModelPublisher, ModelTopic, ModelWatcher};
use crate::gate::{Gate, GateRules, GateTopics};
use crate::heat::Window;
use crate::ingest::{BatchObserver, Ingest, IngestConfig, IngestError, WallClock};
use crate::kafka::KafkaClients;
use crate::metrics::Metrics;
use crate::partition::{PartitionTemplate, Partitions, SharedPartitions, Snapshot};
use crate::predict::{ModelError, PredictorConfig, ScoringModel, default_model};
use crate::prewarm::{PrewarmLoop, PrewarmPublisher, Retrainer};
use crate::warm::{Credit, WarmDesk, WarmRules};

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
    /// The signing key file cannot be read, has a bad line, or does not hold
    /// `prewarm_signing_key_id`.
    #[error("prewarm_signing_keys: {path}: {reason}")]
    SigningKeys {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never the secret).
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
    /// The fleet's command gate (its consumer or producers) could not be created.
    #[error("pre-warm gate: {0}")]
    Gate(KafkaError),
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
    // Dropped after ingest: it decides on ingest's last proposals.
    gate: Option<Gate>,
    // Declared last: dropped after ingest has stopped.
    embedded: Option<EmbeddedBroker>,
}

/// Starts pulse as `config` says. See the module documentation for the order.
pub async fn start(config: PulseConfig) -> Result<PulseHandle, StartError> {
    config.validate()?;
    let signer = prewarm_signer(&config)?;
    let mut embedded = None;
    let brokers = match &config.brokers {
        Some(b) => b.clone(),
        None => {
            let broker = EmbeddedBroker::start(1)?;
            broker.create_topic(&config.topic, config.embedded_partitions)?;
            broker.create_topic(&config.prewarm_topic, config.embedded_partitions)?;
            broker.create_topic(&config.decisions_topic(), config.embedded_partitions)?;
            broker.create_topic(&config.gate_state_topic(), config.embedded_partitions)?;
            if let Some(dlq) = &config.dead_letter_topic {
                broker.create_topic(dlq, 1)?;
            }
            let address = broker.bootstrap_servers().to_owned();
            tracing::info!(bootstrap = %address, "no brokers configured: started an embedded broker");
            embedded = Some(broker);
            address
        }
    };

    // Every Kafka client below is built from these (the properties were checked).
    let kafka = KafkaClients::new(brokers.clone())
        .with_properties(config.kafka_properties.clone())
        .map_err(|e| PulseConfigError {
            field: "kafka_properties",
            reason: e.to_string(),
        })?;
    // `--advertise-url`: the consumer's client id carries it to the group's description.
    let advertised = match &config.advertise_url {
        Some(url) => Some(
            crate::fleet::PeerUrl::parse(url).map_err(|e| PulseConfigError {
                field: "advertise_url",
                reason: e.to_string(),
            })?,
        ),
        None => None,
    };
    let kafka = match &advertised {
        Some(url) => kafka
            .clone()
            .with_client_id(&crate::fleet::client_id(url))
            .unwrap_or_else(|| {
                tracing::warn!("client.id is set in the Kafka properties: the others cannot find this instance by --advertise-url");
                kafka
            }),
        None => kafka,
    };
    if config.brokers.is_some() {
        ensure_topics(&kafka, &config).await;
    }
    let allowed = allowed_tenants(&config)?;
    if let Some(allowed) = &allowed {
        tracing::info!(tenants = allowed.len(), "tenant allow-list on");
    }
    let metrics = Arc::new(Metrics::new());
    let model = if config.prewarm {
        let model = load_model(&config)?;
        tracing::info!(model = %model.name, threshold = config.threshold, "prediction on");
        metrics.model_put_in_use();
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
                calibrate_online: config.calibrate_online,
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
        follow_model_topic(&kafka, &topic, embedded.as_ref(), &partitions, &metrics).await
    } else {
        None
    };
    let (model_publisher, model_watcher) = fleet_model.unzip();
    // Prediction runs on the ingest thread after each batch; the retrainer beside it.
    let mut observer: Option<Box<dyn BatchObserver>> = None;
    let mut retrainer = None;
    let mut gate = None;
    let mut warm = None;
    let (shutdown_tx, mut shutdown_rx) = watch::channel(false);
    if config.prewarm {
        let mut publisher =
            PrewarmPublisher::new(&kafka, &config.prewarm_topic).map_err(StartError::Publisher)?;
        let mut purges =
            PrewarmPublisher::new(&kafka, &config.prewarm_topic).map_err(StartError::Publisher)?;
        match signer {
            Some(signer) => {
                tracing::info!(key_id = signer.key_id(), "pre-warm commands are signed");
                purges = purges.with_signer(signer.clone());
                publisher = publisher.with_signer(signer);
            }
            None => tracing::info!("pre-warm commands are not signed (no prewarm_signing_keys)"),
        }
        // The partitions propose; the gate holds each tenant's one budget for the fleet.
        let topics = GateTopics {
            decisions: config.decisions_topic(),
            state: config.gate_state_topic(),
            group: config.gate_group(),
        };
        let rules = GateRules {
            rate_per_s: config.tenant_rate_per_s,
            burst: config.tenant_burst,
            warm_rate_per_s: config.warm_rate_per_s,
            warm_burst: config.warm_burst,
            cooldown_ms: config.cooldown_ms,
            remember_ms: config.cooldown_ms + config.command_ttl_ms,
        };
        gate = Some(
            Gate::start(&kafka, topics, rules, publisher, metrics.clone())
                .map_err(StartError::Gate)?,
        );
        let proposals = PrewarmPublisher::to_gate(&kafka, &config.decisions_topic())
            .map_err(StartError::Publisher)?;
        // Operators' warm-ups propose to the same gate, on the tenant's warm budget;
        // ingest credits the edges' reports on their keys to them.
        let desk = Arc::new(
            WarmDesk::new(
                PrewarmPublisher::to_gate(&kafka, &config.decisions_topic())
                    .map_err(StartError::Publisher)?,
                WarmRules {
                    rate_per_s: config.warm_rate_per_s,
                    command_ttl_ms: config.command_ttl_ms,
                },
                metrics.clone(),
                shutdown_tx.subscribe(),
            )
            .with_purges(purges),
        );
        observer = Some(Box::new(Credit {
            desk: desk.clone(),
            inner: Box::new(PrewarmLoop::new(proposals, metrics.clone())),
        }));
        warm = Some(desk);
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
            kafka: kafka.clone(),
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
        warm,
    };
    let router = require_api_token(app(state.clone()), config.api_token.as_deref());
    // No `--peers`: the peers are the group's other members that advertise a URL.
    if let (Some(me), Some(peers), true) = (&advertised, &state.peers, config.peers.is_empty()) {
        let found = crate::fleet::discover(
            kafka.config(&[]),
            config.group.clone(),
            config.topic.clone(),
            me.clone(),
            peers.clone(),
            shutdown_tx.subscribe(),
        );
        if let Err(e) = found {
            tracing::error!(error = %e, "peer discovery not started");
        } else {
            tracing::info!(advertise = %me.as_str(), "peers are found in the consumer group");
        }
    }
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
        gate,
        embedded,
    })
}

/// Creates the topics pulse needs that the broker lacks ([`crate::topics`]). A broker
/// that cannot be asked is no reason not to start: ingest waits for it as it waits
/// through an outage.
async fn ensure_topics(kafka: &KafkaClients, config: &PulseConfig) {
    let spec = |name: &str, partitions| crate::topics::TopicSpec {
        name: name.to_owned(),
        partitions,
        retention_ms: config.topic_retention_ms,
        compacted: false,
    };
    let mut topics = vec![spec(&config.topic, config.topic_partitions)];
    if config.prewarm {
        topics.push(spec(&config.prewarm_topic, config.topic_partitions));
        topics.push(spec(&config.decisions_topic(), config.topic_partitions));
        // Partition p holds the state of decisions partition p: the same count.
        topics.push(crate::topics::TopicSpec {
            compacted: true,
            ..spec(&config.gate_state_topic(), config.topic_partitions)
        });
    }
    if let Some(dlq) = &config.dead_letter_topic {
        topics.push(spec(dlq, 1));
    }
    if let Err(e) = crate::topics::ensure_topics(kafka, &topics).await {
        tracing::warn!(error = %e, "topics not checked: the broker did not answer; ingest waits for it");
    }
}

/// Creates the model topic if needed and follows it: the newest model on it is put in
/// use on every partition. `None`, with a warning, when the topic cannot be had: each
/// instance then keeps its own model.
async fn follow_model_topic(
    kafka: &KafkaClients,
    topic: &str,
    embedded: Option<&EmbeddedBroker>,
    partitions: &SharedPartitions,
    metrics: &Metrics,
) -> Option<(ModelPublisher, ModelWatcher)> {
    // librdkafka's mock cluster has no topic configs nor admin API: a plain topic
    // does, made through the embedded broker (this one's, or one of this process that
    // `brokers` names, as the demo's).
    let on_embedded = match embedded {
        Some(broker) => Some(broker.create_topic(topic, 1)),
        None => EmbeddedBroker::create_topic_at(kafka.brokers(), topic, 1),
    };
    let ready = match on_embedded {
        Some(created) => created.map_err(|e| e.to_string()),
        None => ModelTopic::ensure(kafka, topic)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    };
    let started = ready.and_then(|()| {
        let publisher = ModelPublisher::new(kafka, topic).map_err(|e| e.to_string())?;
        let partitions = partitions.clone();
        let in_use_since = metrics.model_in_use_since.clone();
        let watcher =
            ModelWatcher::start_counted(kafka, topic, metrics.model_watch.clone(), move |model| {
                tracing::info!(model = %model.name, "fleet model in use");
                in_use_since.set((crate::clock::wall_clock_ms() / 1_000) as i64);
                partitions
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_model(model);
            })
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
                calibration: p.calibration,
                traffic: p.traffic,
            },
        );
    }
    tracing::info!(path = %path.display(), partitions = snapshots.len(), "checkpoint read; partitions restore on assign");
    Ok(Some((loaded.partition_count, snapshots)))
}

/// The signer of pre-warm commands: the key `prewarm_signing_key_id` of the
/// `prewarm_signing_keys` file (both or neither, as validated); `None` without them.
fn prewarm_signer(config: &PulseConfig) -> Result<Option<Signer>, StartError> {
    let (Some(path), Some(key_id)) = (&config.prewarm_signing_keys, &config.prewarm_signing_key_id)
    else {
        return Ok(None);
    };
    let bad = |reason: String| StartError::SigningKeys {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let keys = SigningKeys::parse(&text).map_err(|e| bad(e.to_string()))?;
    keys.signer(key_id)
        .map(Some)
        .map_err(|e| bad(format!("{e} (prewarm_signing_key_id)")))
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
        let gate = self.gate.take();
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
            if let Some(gate) = gate {
                gate.stop();
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

    /// The signer is the named key of the file; a file without it, a bad line, or a
    /// missing file fails the start, naming the setting and never the secret.
    #[test]
    fn the_signer_is_the_named_key_of_the_key_file() {
        let secret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            format!("old {secret}\nnew {}\n", secret.replace('0', "7")),
        )
        .unwrap();
        let config = |id: &str| PulseConfig {
            prewarm_signing_keys: Some(path.clone()),
            prewarm_signing_key_id: Some(id.into()),
            ..PulseConfig::default()
        };
        assert!(prewarm_signer(&PulseConfig::default()).unwrap().is_none());
        let signer = prewarm_signer(&config("new")).unwrap().unwrap();
        assert_eq!(signer.key_id(), "new");
        let error = prewarm_signer(&config("newer")).unwrap_err().to_string();
        assert!(
            error.starts_with("prewarm_signing_keys:") && error.contains("\"newer\""),
            "{error}"
        );
        std::fs::write(&path, format!("old {}\n", &secret[..20])).unwrap();
        let error = prewarm_signer(&config("old")).unwrap_err().to_string();
        assert!(
            error.contains("line 1") && !error.contains(&secret[..20]),
            "{error}"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(prewarm_signer(&config("old")).is_err());
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
