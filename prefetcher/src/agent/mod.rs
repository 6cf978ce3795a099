//! The edge agent: runs beside an nginx or Varnish node so that node feeds pulse and
//! takes pre-warms, through the same topics and schemas as a prefetcher node.
//!
//! - **Events.** A thread follows the node's access log ([`LogFollower`]: rename
//!   and copy-truncate rotation), parses each line ([`formats`](self::formats)), maps
//!   its cache status to an [`Outcome`](models::Outcome) by the one table of
//!   statuses, takes the tenant from the configured host map (never from the `Host`
//!   alone) and hands the event, borrowed from the line ([`OutcomeRef`]), to the
//!   prefetcher's [`EventPublisher`] on the same thread: encoded into a reused buffer,
//!   produced (bounded, batched). A full producer queue is waited out (the log is the
//!   buffer); an undelivered event is dropped and counted. The node itself is never
//!   touched: it writes its log, whatever the agent or Kafka does.
//! - **Read position.** Saved to `state_path` every `checkpoint_ms`, but only a
//!   position whose lines were handed to the producer at least
//!   `kafka.message_timeout_ms` ago (by then each of their events was delivered or
//!   counted as dropped); at a graceful shutdown, after the producer's flush, the
//!   final one. After a crash the lines since the saved position are read again:
//!   **at-least-once**, duplicates possible, none silently lost.
//! - **Pre-warms.** [`WarmConsumer`] checks each command as the prefetcher does and
//!   sends a `GET` of the key to the local cache with the pre-warm header, within the
//!   prefetcher's adaptive prefetch limit ([`Warmer`]).
//! - **Admin.** `/metrics` (the prefetcher's registry, then `edge_agent_*`) and
//!   `/healthz`.
//! - **Check and reload.** [`check_agent_config`] checks a configuration as a start
//!   would; [`AgentHandle::reload`] puts new tenants in force (`reload`).

mod config;
mod follow;
mod formats;
mod lines;
mod metrics;
mod reload;
mod warm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::{HeaderValue, header};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use self::config::{AgentConfig, AgentTenant, WarmConfig};
pub use self::follow::{FollowStats, LogFollower, Position};
pub use self::formats::{LogFormat, MalformedLine, SkipReason};
pub use self::lines::{Line, LineMapper};
use self::lines::{NoEvent, Scratch};
pub use self::metrics::AgentMetrics;
use self::reload::AgentReload;
pub use self::reload::check_agent_config;
use self::warm::{WarmConsumer, Warmer};
use crate::config::ConfigError;
use crate::events::OutcomeRef;
use crate::listener::{ServeOptions, serve};
use crate::metrics::Metrics;
use crate::publisher::{EventPublisher, NotSent};
use crate::warmup::{Readiness, WarmFill, Warmup};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The admin listener could not bind.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Kafka client could not be created.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The follower thread could not start.
    #[error("starting the log follower: {0}")]
    Thread(std::io::Error),
}

/// The follower thread's work: lines to events, straight to the producer.
struct FollowLoop {
    follower: LogFollower,
    /// Read once per poll; a reload replaces it.
    mapper: Arc<ArcSwap<LineMapper>>,
    handoff: Handoff,
    metrics: Arc<AgentMetrics>,
    stop: Arc<AtomicBool>,
    poll: Duration,
    checkpoint: Duration,
    settle: Duration,
    state_path: std::path::PathBuf,
}

/// How long the follower waits before offering an event to a full producer queue
/// again.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(1);

/// The follower's side of the producer: events handed over one by one, a full queue
/// waited out (the log is the buffer: the follower reads more slowly). Once the agent
/// is stopping, a full queue is waited out for `grace` at most, then events are
/// dropped and counted, so a dead broker cannot hold the shutdown.
struct Handoff {
    publisher: EventPublisher,
    stop: Arc<AtomicBool>,
    grace: Duration,
    /// When waiting ends, from the first full queue after the stop.
    give_up_at: Option<Instant>,
}

impl Handoff {
    /// Hands one event over; whether the producer took it.
    fn publish(&mut self, record: &OutcomeRef<'_>) -> bool {
        loop {
            match self.publisher.send(record) {
                Ok(()) => return true,
                Err(NotSent::Refused) => return false,
                Err(NotSent::QueueFull) => {
                    if self.stop.load(Ordering::Relaxed) {
                        let grace = self.grace;
                        let give_up_at = *self
                            .give_up_at
                            .get_or_insert_with(|| Instant::now() + grace);
                        if Instant::now() >= give_up_at {
                            self.publisher.count_dropped();
                            return false;
                        }
                    }
                    std::thread::sleep(QUEUE_FULL_BACKOFF);
                }
            }
        }
    }

    /// Waits up to `grace` for what was handed over to be delivered or counted.
    fn flush(&self) {
        match self.publisher.flush(self.grace) {
            Ok(()) => tracing::info!("access events flushed"),
            Err(error) => tracing::warn!(%error, "access events left unflushed at shutdown"),
        }
    }
}

impl FollowLoop {
    /// Follows until `stop`, flushes the producer, then returns the final position
    /// (every line before it handed to the producer).
    fn run(mut self) -> Position {
        let mut seen = FollowStats::default();
        // Positions by when they were reached; one is saved once it has settled.
        let mut pending: std::collections::VecDeque<(Instant, Position)> = Default::default();
        let mut last_mark = Instant::now();
        let mut scratch = Scratch::default();
        while !self.stop.load(Ordering::Relaxed) {
            let mapper = self.mapper.load();
            let (handoff, metrics) = (&mut self.handoff, &self.metrics);
            let mut queued = 0;
            let polled = self.follower.poll(|text| {
                match mapper.map_with(text, &mut scratch, |record| handoff.publish(record)) {
                    Ok(true) => queued += 1,
                    Ok(false) => {}
                    Err(NoEvent::Skip(reason)) => metrics.skipped(reason),
                    Err(NoEvent::Malformed(error)) => {
                        metrics.lines_malformed.inc();
                        tracing::debug!(%error, "malformed log line skipped");
                    }
                }
            });
            // Counted once per poll, not per line: an atomic add per line is
            // measurable at a million lines a second.
            self.metrics.events_queued.inc_by(queued);
            let lines = match polled {
                Ok(lines) => lines,
                Err(error) => {
                    tracing::warn!(%error, "reading the access log failed");
                    0
                }
            };
            self.metrics.lines_read.inc_by(lines as u64);
            let stats = self.follower.stats();
            metrics_delta(&self.metrics, &mut seen, stats);
            let position = self.follower.position();
            self.metrics.read_offset.set(position.offset as i64);
            // One fstat per poll, not per line.
            self.metrics
                .lag_bytes
                .set(self.follower.unread_bytes() as i64);
            let now = Instant::now();
            if now.duration_since(last_mark) >= self.checkpoint {
                last_mark = now;
                pending.push_back((now, position));
                let mut settled = None;
                while let Some((at, p)) = pending.front().copied() {
                    if now.duration_since(at) < self.settle {
                        break;
                    }
                    settled = Some(p);
                    pending.pop_front();
                }
                if let Some(p) = settled
                    && let Err(error) = p.save(&self.state_path)
                {
                    tracing::warn!(%error, "saving the read position failed");
                }
            }
            if lines == 0 {
                std::thread::sleep(self.poll);
            }
        }
        self.handoff.flush();
        self.follower.position()
    }
}

fn metrics_delta(metrics: &AgentMetrics, seen: &mut FollowStats, now: FollowStats) {
    metrics.rotations.inc_by(now.rotations - seen.rotations);
    metrics
        .truncations
        .inc_by(now.truncations - seen.truncations);
    metrics.lines_malformed.inc_by(now.overlong - seen.overlong);
    *seen = now;
}

/// A running agent. Dropping it starts the shutdown; [`AgentHandle::shutdown`] also
/// flushes events and saves the read position.
pub struct AgentHandle {
    admin_addr: Option<SocketAddr>,
    reload: AgentReload,
    agent_metrics: Arc<AgentMetrics>,
    metrics: Arc<Metrics>,
    warmer: Warmer,
    stop: Arc<AtomicBool>,
    shutdown_tx: watch::Sender<bool>,
    follow: Option<std::thread::JoinHandle<Position>>,
    tasks: Vec<JoinHandle<()>>,
    state_path: std::path::PathBuf,
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("admin_addr", &self.admin_addr)
            .field("state_path", &self.state_path)
            .finish_non_exhaustive()
    }
}

/// Validates `config` and starts the agent: the log follower, the event publisher,
/// the pre-warm consumer and (with `admin_listen`) the admin listener. Resumes from
/// the position in `state_path` if it names the current log file.
pub async fn spawn_agent(config: AgentConfig) -> Result<AgentHandle, AgentError> {
    config.validate()?;
    let prewarm_keys = config.kafka.prewarm_keys()?;
    let region = config.region.clone().expect("validated");
    let node = config.node.clone().expect("validated");
    let metrics = Arc::new(Metrics::new());
    let agent_metrics = Arc::new(AgentMetrics::new());
    let admin_listener = match config.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::Bind { addr, source })?,
        ),
        None => None,
    };
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    // Kafka clients first, so a bad property fails the start with nothing running.
    let publisher = EventPublisher::with_ids(
        &config.kafka,
        region,
        node,
        config.log_format.edge_kind(),
        &metrics,
    )?;
    let warmer = Warmer::new(&config, Arc::clone(&agent_metrics), Arc::clone(&metrics));
    let readiness = Readiness::default();
    let consumer = WarmConsumer::new(&config, prewarm_keys, warmer.clone(), Arc::clone(&metrics))?;
    let mapper = Arc::new(ArcSwap::from_pointee(LineMapper::new(&config)));
    let reload = AgentReload {
        running: std::sync::Mutex::new(config.clone()),
        mapper: Arc::clone(&mapper),
        targets: consumer.targets(),
        metrics: Arc::clone(&metrics),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let resume = Position::load(&config.state_path);
    let follow = FollowLoop {
        follower: LogFollower::new(
            config.log_path.clone(),
            resume,
            config.max_line_bytes,
            Duration::from_millis(config.rotate_grace_ms),
        ),
        mapper,
        handoff: Handoff {
            publisher,
            stop: Arc::clone(&stop),
            grace: Duration::from_millis(config.kafka.message_timeout_ms.min(10_000)),
            give_up_at: None,
        },
        metrics: Arc::clone(&agent_metrics),
        stop: Arc::clone(&stop),
        poll: Duration::from_millis(config.poll_ms),
        checkpoint: Duration::from_millis(config.checkpoint_ms),
        settle: Duration::from_millis(config.kafka.message_timeout_ms),
        state_path: config.state_path.clone(),
    };
    let follow = std::thread::Builder::new()
        .name("edge-agent-follow".into())
        .spawn(move || follow.run())
        .map_err(AgentError::Thread)?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = vec![tokio::spawn(consumer.run(shutdown_rx.clone()))];
    if let Some(listener) = admin_listener {
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(serve(
            listener,
            admin_app(
                Arc::clone(&metrics),
                Arc::clone(&agent_metrics),
                readiness.clone(),
            ),
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            },
            ServeOptions::default(),
        )));
    }
    match &config.warmup {
        Some(warmup) => {
            let run = warm_up(&config, warmup.clone(), &warmer, &readiness, &metrics);
            let mut rx = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    () = run => {}
                    _ = rx.wait_for(|stop| *stop) => {}
                }
            }));
        }
        None => tracing::info!("no [warmup]: ready at once"),
    }
    tracing::info!(log = %config.log_path.display(), format = ?config.log_format, ?admin_addr, "edge agent started");
    Ok(AgentHandle {
        admin_addr,
        reload,
        agent_metrics,
        metrics,
        warmer,
        stop,
        shutdown_tx,
        follow: Some(follow),
        tasks,
        state_path: config.state_path,
    })
}

/// The warm-up at start (`crate::warmup`): the region's warm set requested of the
/// local cache through the [`Warmer`], as pre-warm commands are, before `/readyz`
/// says ready. Returns the future that runs it.
fn warm_up(
    config: &AgentConfig,
    warmup: crate::config::WarmupConfig,
    warmer: &Warmer,
    readiness: &Readiness,
    metrics: &Arc<Metrics>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    readiness.start_warming();
    let targets = Arc::new(warm::WarmTargets::new(config));
    let region = config.region.clone().expect("validated");
    let tenants = config.tenants.iter().map(|t| (t.id.clone(), 1.0)).collect();
    let token = warmup.token().ok().flatten();
    let (warmer, readiness, metrics) = (warmer.clone(), readiness.clone(), Arc::clone(metrics));
    async move {
        Warmup {
            config: &warmup,
            token,
            region: &region,
            tenants,
            readiness: &readiness,
            metrics: &metrics.warmup,
        }
        .run(
            || warmer.limit(),
            |tenant, key| {
                let (warmer, targets) = (warmer.clone(), Arc::clone(&targets));
                async move {
                    // The key as a command's is checked: normalised like a request's.
                    let key = key
                        .as_str()
                        .parse::<http::Uri>()
                        .ok()
                        .and_then(|uri| crate::cache_key::normalise_key(&uri).ok());
                    let (Some(host), Some(key)) = (targets.host(&tenant), key) else {
                        return WarmFill::Failed;
                    };
                    let request = warm::WarmRequest {
                        host: host.to_owned(),
                        key,
                        id: "warmup".to_owned(),
                        expires_at_ms: u64::MAX,
                    };
                    match warmer.warm(request).await {
                        Some(bytes) => WarmFill::Filled { bytes },
                        None => WarmFill::Failed,
                    }
                }
            },
        )
        .await
    }
}

/// The admin router: `/metrics`, `/healthz` (alive) and `/readyz` (503 while the
/// warm-up at start runs, then 200).
pub(crate) fn admin_app(
    metrics: Arc<Metrics>,
    agent: Arc<AgentMetrics>,
    readiness: Readiness,
) -> Router {
    let readyz = get(move || async move { readiness.response() });
    Router::new()
        .route("/readyz", readyz)
        .route(
            "/metrics",
            get(
                |State((metrics, agent)): State<(Arc<Metrics>, Arc<AgentMetrics>)>| async move {
                    // Two registries, one exposition: only the last `# EOF` stays.
                    let mut text = metrics.encode();
                    if let Some(stripped) = text.strip_suffix("# EOF\n") {
                        text.truncate(stripped.len());
                    }
                    text.push_str(&agent.encode());
                    (
                        [(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        )],
                        text,
                    )
                },
            ),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state((metrics, agent))
}

impl AgentHandle {
    /// The admin listener's address, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The agent's own metrics.
    pub fn agent_metrics(&self) -> &AgentMetrics {
        &self.agent_metrics
    }

    /// The metrics it shares with the prefetcher (events, pre-warm commands).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Puts `config`'s tenants in force for the log lines and pre-warm commands
    /// handled from now on; other settings that differ are reported as needing a
    /// restart and kept. A config that fails [`check_agent_config`] is refused and the
    /// running one stays. Counted in `prefetcher_config_reloads_total{result}`.
    pub fn reload(&self, config: AgentConfig) -> Result<crate::changes::Reloaded, ConfigError> {
        self.reload.reload(config)
    }

    /// Counts and logs a reload refused before it could start (the config file could
    /// not be read or parsed). Returns `error`.
    pub fn refuse_reload(&self, error: ConfigError) -> ConfigError {
        self.reload.refuse(error)
    }

    /// The adaptive pre-warm limit now.
    pub fn warm_limit(&self) -> usize {
        self.warmer.limit()
    }

    /// Stops following (every line read so far is handed over), flushes the events,
    /// saves the read position, stops the consumer and the admin listener. Returns
    /// the saved position.
    pub async fn shutdown(mut self) -> Position {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.shutdown_tx.send(true);
        let follow = self.follow.take().expect("joined once");
        let position = tokio::task::spawn_blocking(move || follow.join())
            .await
            .ok()
            .and_then(Result::ok);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        let position = position.unwrap_or_else(|| {
            tracing::warn!("the log follower panicked; the last saved position stands");
            Position::load(&self.state_path).unwrap_or(Position {
                inode: 0,
                offset: 0,
            })
        });
        if position.inode != 0
            && let Err(error) = position.save(&self.state_path)
        {
            tracing::warn!(%error, "saving the read position at shutdown failed");
        }
        tracing::info!(?position, "edge agent stopped");
        position
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.shutdown_tx.send(true);
    }
}

#[cfg(test)]
mod tests {
    use models::{Outcome, TenantId};

    use crate::events::OutcomeRecord;

    use super::*;

    /// A handoff to a producer whose queue holds one event and whose broker never
    /// answers, so the second event finds the queue full.
    fn full_handoff(stop: &Arc<AtomicBool>, metrics: &Metrics) -> (Handoff, OutcomeRecord) {
        let kafka = crate::config::KafkaConfig {
            brokers: Some("127.0.0.1:9".into()),
            queue_max_messages: 1,
            ..Default::default()
        };
        let publisher = EventPublisher::with_ids(
            &kafka,
            "eu".parse().unwrap(),
            "n1".parse().unwrap(),
            models::EdgeKind::Nginx,
            metrics,
        )
        .unwrap();
        let record = OutcomeRecord {
            ts_ms: 1,
            tenant: TenantId::new("acme").unwrap(),
            key: "/k".parse().unwrap(),
            outcome: Outcome::Hit,
            bytes: 0,
            fill_ms: None,
            referrer: None,
        };
        let mut handoff = Handoff {
            publisher,
            stop: Arc::clone(stop),
            grace: Duration::ZERO,
            give_up_at: None,
        };
        assert!(handoff.publish(&record.borrowed()), "room for the first");
        (handoff, record)
    }

    /// A full queue is waited out while the agent runs: the event is not dropped
    /// before the stop.
    #[test]
    fn a_full_queue_is_waited_out_until_the_stop() {
        let stop = Arc::new(AtomicBool::new(false));
        let metrics = Metrics::new();
        let (mut handoff, record) = full_handoff(&stop, &metrics);
        let stopper = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                stop.store(true, Ordering::Relaxed);
            })
        };
        assert!(!handoff.publish(&record.borrowed()));
        assert!(stop.load(Ordering::Relaxed), "gave up before the stop");
        assert_eq!(metrics.events_dropped.get(), 1);
        stopper.join().unwrap();
    }

    /// Once stopping (past the grace), a full queue drops the event and counts it.
    #[test]
    fn a_full_queue_at_the_stop_drops_and_counts() {
        let stop = Arc::new(AtomicBool::new(true));
        let metrics = Metrics::new();
        let (mut handoff, record) = full_handoff(&stop, &metrics);
        assert!(!handoff.publish(&record.borrowed()));
        assert!(!handoff.publish(&record.borrowed()));
        assert_eq!(metrics.events_dropped.get(), 2);
    }
}
