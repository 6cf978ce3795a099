//! The edge agent: runs beside an nginx or Varnish node so that node feeds pulse and
//! takes pre-warms, through the same topics and schemas as a prefetcher node.
//!
//! - **Events.** A thread follows the node's access log ([`LogFollower`]: rename
//!   and copy-truncate rotation), parses each line ([`formats`](self::formats)), maps
//!   its cache status to an [`Outcome`](models::Outcome) by the one table of
//!   statuses, takes the tenant from the configured host map (never from the `Host`
//!   alone) and hands an [`OutcomeRecord`] to the prefetcher's [`EventPublisher`]:
//!   bounded, batched, a full producer queue or an undelivered event dropped and
//!   counted. The node itself is never touched: it writes its log, whatever the agent
//!   or Kafka does.
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

mod config;
mod follow;
mod formats;
mod metrics;
mod warm;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::{HeaderValue, Uri, header};
use models::{Domain, Outcome, TenantId};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use self::config::{AgentConfig, AgentTenant, WarmConfig};
pub use self::follow::{FollowStats, LogFollower, Position};
pub use self::formats::{LogFormat, MalformedLine, SkipReason};
use self::formats::{outcome, parse_line};
pub use self::metrics::AgentMetrics;
use self::warm::{WarmConsumer, Warmer};
use crate::config::ConfigError;
use crate::events::OutcomeRecord;
use crate::metrics::Metrics;
use crate::proxy::normalise_key;
use crate::publisher::EventPublisher;
use crate::server::{ServeOptions, serve};

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

/// Host → tenant, as the prefetcher maps them: exact host names (lower case, port
/// stripped), then the `"*"` fallback.
#[derive(Debug, Clone)]
struct TenantMap {
    by_host: HashMap<String, TenantId>,
    fallback: Option<TenantId>,
}

impl TenantMap {
    fn new(config: &AgentConfig) -> TenantMap {
        let mut by_host = HashMap::new();
        let mut fallback = None;
        for t in &config.tenants {
            for host in &t.hosts {
                if host == "*" {
                    fallback = Some(t.id.clone());
                } else {
                    by_host.insert(host.to_ascii_lowercase(), t.id.clone());
                }
            }
        }
        TenantMap { by_host, fallback }
    }

    fn tenant(&self, host: &str) -> Option<&TenantId> {
        let host = host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let host = host.to_ascii_lowercase();
        self.by_host.get(&host).or(self.fallback.as_ref())
    }
}

/// Turns log lines into access events.
#[derive(Debug, Clone)]
pub struct LineMapper {
    format: LogFormat,
    tenants: TenantMap,
}

/// What one line became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// An event to publish.
    Event(OutcomeRecord),
    /// A well-formed line that makes no event.
    Skip(SkipReason),
    /// Not a line of the format.
    Malformed(MalformedLine),
}

impl LineMapper {
    /// A mapper for a validated config.
    pub fn new(config: &AgentConfig) -> LineMapper {
        LineMapper {
            format: config.log_format,
            tenants: TenantMap::new(config),
        }
    }

    /// Maps one line (without its newline).
    pub fn map(&self, text: &[u8]) -> Line {
        let parsed = match parse_line(text) {
            Ok(parsed) => parsed,
            Err(error) => return Line::Malformed(error),
        };
        let outcome = match outcome(self.format, &parsed.line) {
            Ok(outcome) => outcome,
            Err(reason) => return Line::Skip(reason),
        };
        let Some(tenant) = self.tenants.tenant(&parsed.line.host) else {
            return Line::Skip(SkipReason::UnknownHost);
        };
        let Some(key) = parsed
            .line
            .uri
            .parse::<Uri>()
            .ok()
            .filter(|uri| uri.scheme().is_none())
            .and_then(|uri| normalise_key(&uri).ok())
        else {
            return Line::Skip(SkipReason::InvalidKey);
        };
        let referrer = parsed
            .line
            .referer
            .parse::<Uri>()
            .ok()
            .and_then(|uri| Domain::new(uri.host()?.to_ascii_lowercase()).ok());
        // Only a request that went to the origin has a fill time.
        let fill_ms = match outcome {
            Outcome::Miss | Outcome::PrefetchFill => parsed.upstream_ms,
            _ => None,
        };
        Line::Event(OutcomeRecord {
            ts_ms: parsed.ts_ms,
            tenant: tenant.clone(),
            key,
            outcome,
            bytes: parsed.bytes,
            fill_ms,
            referrer,
        })
    }
}

/// The follower thread's work: lines to events, into the publisher's channel.
struct FollowLoop {
    follower: LogFollower,
    mapper: LineMapper,
    events_tx: mpsc::Sender<OutcomeRecord>,
    metrics: Arc<AgentMetrics>,
    stop: Arc<AtomicBool>,
    poll: Duration,
    checkpoint: Duration,
    settle: Duration,
    state_path: std::path::PathBuf,
}

impl FollowLoop {
    /// Follows until `stop`, then returns the final position (every line before it
    /// handed to the publisher).
    fn run(mut self) -> Position {
        let mut seen = FollowStats::default();
        // Positions by when they were reached; one is saved once it has settled.
        let mut pending: std::collections::VecDeque<(Instant, Position)> = Default::default();
        let mut last_mark = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let (mapper, events_tx, metrics) = (&self.mapper, &self.events_tx, &self.metrics);
            let mut closed = false;
            let polled = self.follower.poll(|text| {
                metrics.lines_read.inc();
                match mapper.map(text) {
                    Line::Event(record) => {
                        // Waits while the publisher is behind: the log is the buffer,
                        // and the publisher itself never waits on Kafka.
                        if events_tx.blocking_send(record).is_err() {
                            closed = true;
                        } else {
                            metrics.events_queued.inc();
                        }
                    }
                    Line::Skip(reason) => metrics.skipped(reason),
                    Line::Malformed(error) => {
                        metrics.lines_malformed.inc();
                        tracing::debug!(%error, "malformed log line skipped");
                    }
                }
            });
            let lines = match polled {
                Ok(lines) => lines,
                Err(error) => {
                    tracing::warn!(%error, "reading the access log failed");
                    0
                }
            };
            let stats = self.follower.stats();
            metrics_delta(&self.metrics, &mut seen, stats);
            let position = self.follower.position();
            self.metrics.read_offset.set(position.offset as i64);
            if closed {
                break;
            }
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
    agent_metrics: Arc<AgentMetrics>,
    metrics: Arc<Metrics>,
    warmer: Warmer,
    stop: Arc<AtomicBool>,
    shutdown_tx: watch::Sender<bool>,
    follow: Option<std::thread::JoinHandle<Position>>,
    publisher: Option<JoinHandle<()>>,
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
    let consumer = WarmConsumer::new(&config, warmer.clone(), Arc::clone(&metrics))?;

    let (events_tx, events_rx) = mpsc::channel(config.line_buffer);
    let stop = Arc::new(AtomicBool::new(false));
    let resume = Position::load(&config.state_path);
    let follow = FollowLoop {
        follower: LogFollower::new(
            config.log_path.clone(),
            resume,
            config.max_line_bytes,
            Duration::from_millis(config.rotate_grace_ms),
        ),
        mapper: LineMapper::new(&config),
        events_tx,
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
    // The publisher stops when the follower drops its sender (after the final line),
    // not on the shutdown signal: every line read is handed over before the flush.
    let (_never_tx, never_rx) = watch::channel(false);
    let grace = Duration::from_millis(config.kafka.message_timeout_ms.min(10_000));
    let publisher = tokio::spawn(async move {
        let _keep = _never_tx;
        publisher.run(events_rx, never_rx, grace).await;
    });
    let mut tasks = vec![tokio::spawn(consumer.run(shutdown_rx.clone()))];
    if let Some(listener) = admin_listener {
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(serve(
            listener,
            admin_app(Arc::clone(&metrics), Arc::clone(&agent_metrics)),
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            },
            ServeOptions::default(),
        )));
    }
    tracing::info!(log = %config.log_path.display(), format = ?config.log_format, ?admin_addr, "edge agent started");
    Ok(AgentHandle {
        admin_addr,
        agent_metrics,
        metrics,
        warmer,
        stop,
        shutdown_tx,
        follow: Some(follow),
        publisher: Some(publisher),
        tasks,
        state_path: config.state_path,
    })
}

/// The admin router: `/metrics` and `/healthz`.
pub(crate) fn admin_app(metrics: Arc<Metrics>, agent: Arc<AgentMetrics>) -> Router {
    Router::new()
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
        if let Some(publisher) = self.publisher.take() {
            let _ = publisher.await;
        }
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
    use super::*;

    fn mapper(format: LogFormat) -> LineMapper {
        let mut config: AgentConfig = toml::from_str(
            r#"
            [[tenants]]
            id = "acme"
            hosts = ["acme.example"]
            "#,
        )
        .unwrap();
        config.log_format = format;
        LineMapper::new(&config)
    }

    fn line(host: &str, uri: &str, cache: &str) -> String {
        format!(
            r#"{{"ts":"1700000000.5","host":"{host}","uri":"{uri}","method":"GET","status":"200","cache":"{cache}","referer":"https://News.Example/a","bytes":"10","upstream_time":"0.020","prewarm":""}}"#
        )
    }

    #[test]
    fn a_line_becomes_an_event_of_the_mapped_tenant_with_a_normalised_key() {
        let text = line("ACME.example:8080", "/p?z=1&a=2", "MISS");
        let Line::Event(record) = mapper(LogFormat::NginxJson).map(text.as_bytes()) else {
            panic!("expected an event");
        };
        assert_eq!(record.tenant.as_str(), "acme");
        assert_eq!(record.key.as_str(), "/p?a=2&z=1");
        assert_eq!(record.outcome, Outcome::Miss);
        assert_eq!(record.ts_ms, 1_700_000_000_500);
        assert_eq!(record.bytes, 10);
        assert_eq!(record.fill_ms, Some(20));
        assert_eq!(record.referrer.unwrap().as_str(), "news.example");
    }

    #[test]
    fn a_hit_has_no_fill_time() {
        let text = line("acme.example", "/p", "HIT");
        let Line::Event(record) = mapper(LogFormat::NginxJson).map(text.as_bytes()) else {
            panic!("expected an event");
        };
        assert_eq!(record.fill_ms, None);
    }

    #[test]
    fn an_unmapped_host_is_no_tenant() {
        let text = line("evil.example", "/p", "HIT");
        assert_eq!(
            mapper(LogFormat::NginxJson).map(text.as_bytes()),
            Line::Skip(SkipReason::UnknownHost)
        );
    }

    #[test]
    fn an_absolute_or_escaping_target_is_no_key() {
        for uri in ["http://other.example/p", "/../etc/passwd"] {
            let text = line("acme.example", uri, "HIT");
            assert_eq!(
                mapper(LogFormat::NginxJson).map(text.as_bytes()),
                Line::Skip(SkipReason::InvalidKey),
                "{uri}"
            );
        }
    }
}
