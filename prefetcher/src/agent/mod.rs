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
use models::{CacheKeyRef, DomainRef, Outcome, TenantId};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use self::config::{AgentConfig, AgentTenant, WarmConfig};
pub use self::follow::{FollowStats, LogFollower, Position};
pub use self::formats::{LogFormat, MalformedLine, SkipReason};
use self::formats::{outcome, parse_line};
pub use self::metrics::AgentMetrics;
use self::warm::{WarmConsumer, Warmer};
use crate::cache_key::normalise_key;
use crate::config::ConfigError;
use crate::events::{OutcomeRecord, OutcomeRef};
use crate::listener::{ServeOptions, serve};
use crate::metrics::Metrics;
use crate::publisher::{EventPublisher, NotSent};

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

    /// The tenant of `host`; `lower` is room for its lower-case copy, made only when
    /// it has an upper-case letter.
    fn tenant(&self, host: &str, lower: &mut String) -> Option<&TenantId> {
        let host = host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lower.clear();
            lower.push_str(host);
            lower.make_ascii_lowercase();
            lower.as_str()
        } else {
            host
        };
        self.by_host.get(host).or(self.fallback.as_ref())
    }
}

/// Bytes a request target or a referrer may hold for the fast paths below: the URI
/// characters (RFC 3986 unreserved, sub-delims, `:`, `@`, `/`, `?`, `%`) that
/// `http::Uri` reads as they are. Anything else (`#`, a space, a quote, non-ASCII)
/// takes `http::Uri`'s own parse.
const URI_SAFE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=:@/?%";
    let mut i = 0;
    while i < extra.len() {
        table[extra[i] as usize] = true;
        i += 1;
    }
    table
};

fn uri_safe(text: &str) -> bool {
    text.bytes().all(|b| URI_SAFE[usize::from(b)])
}

/// The cache key of a logged request target, normalised as the prefetcher's
/// [`normalise_key`] does (path plus sorted, non-empty query parameters); `None` for
/// an absolute or invalid target. It borrows the line when the target is already
/// normal, else writes into `scratch`.
fn request_key<'a>(uri: &'a str, scratch: &'a mut String) -> Option<CacheKeyRef<'a>> {
    if !(uri.starts_with('/') && uri_safe(uri)) {
        // A target `http::Uri` must read (a fragment, an odd character): its own way.
        let key = uri
            .parse::<Uri>()
            .ok()
            .filter(|uri| uri.scheme().is_none())
            .and_then(|uri| normalise_key(&uri).ok())?;
        *scratch = String::from(key);
        return CacheKeyRef::new(scratch).ok();
    }
    let Some((path, query)) = uri.split_once('?') else {
        return CacheKeyRef::new(uri).ok();
    };
    let mut params = query.split('&').filter(|p| !p.is_empty());
    let mut sorted = true;
    let mut count = 0;
    let mut previous = "";
    for param in params.by_ref() {
        sorted &= count == 0 || previous <= param;
        previous = param;
        count += 1;
    }
    if count == 0 {
        return CacheKeyRef::new(path).ok();
    }
    // Already normal: sorted, and no empty parameter to drop.
    if sorted && !query.starts_with('&') && !query.ends_with('&') && !query.contains("&&") {
        return CacheKeyRef::new(uri).ok();
    }
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    params.sort_unstable();
    scratch.clear();
    scratch.push_str(path);
    scratch.push('?');
    for (i, param) in params.iter().enumerate() {
        if i > 0 {
            scratch.push('&');
        }
        scratch.push_str(param);
    }
    CacheKeyRef::new(scratch).ok()
}

/// The host of a logged `Referer`, lower case, as the prefetcher takes it (through
/// `http::Uri`); `None` when there is none or it is no valid domain. The plain
/// `http(s)://host/...` form is read here, borrowing the line (or `scratch`, for an
/// upper-case host); any other form is `http::Uri`'s to read.
fn referrer_host<'a>(referer: &'a str, scratch: &'a mut String) -> Option<DomainRef<'a>> {
    let rest = referer
        .strip_prefix("https://")
        .or_else(|| referer.strip_prefix("http://"));
    let fast = rest.filter(|_| uri_safe(referer)).and_then(|rest| {
        let host = rest.split(['/', '?']).next().unwrap_or(rest);
        // A port, user info or an IP literal: `http::Uri`'s to read.
        (!host.contains([':', '@', '['])).then_some(host)
    });
    let host = match fast {
        Some(host) if !host.bytes().any(|b| b.is_ascii_uppercase()) => host,
        Some(host) => {
            scratch.clear();
            scratch.push_str(host);
            scratch.make_ascii_lowercase();
            scratch.as_str()
        }
        None if referer.is_empty() || referer == "-" => return None,
        None => {
            let uri: Uri = referer.parse().ok()?;
            scratch.clear();
            scratch.push_str(uri.host()?);
            scratch.make_ascii_lowercase();
            scratch.as_str()
        }
    };
    DomainRef::new(host).ok()
}

/// Room for what one line's event cannot borrow from the line: a lower-case host,
/// a normalised key, a lower-case referrer host. Reused from line to line.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    host: String,
    key: String,
    referrer: String,
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

/// Why a line makes no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoEvent {
    /// Well formed, but no event ([`Line::Skip`]).
    Skip(SkipReason),
    /// Not a line of the format ([`Line::Malformed`]).
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
        match self.map_with(text, &mut Scratch::default(), |r| r.to_owned_record()) {
            Ok(record) => Line::Event(record),
            Err(NoEvent::Skip(reason)) => Line::Skip(reason),
            Err(NoEvent::Malformed(error)) => Line::Malformed(error),
        }
    }

    /// Maps one line and hands its event, borrowed from the line (and `scratch`), to
    /// `publish`: the follower's path, which copies no string that it need not.
    pub(crate) fn map_with<R>(
        &self,
        text: &[u8],
        scratch: &mut Scratch,
        publish: impl FnOnce(&OutcomeRef<'_>) -> R,
    ) -> Result<R, NoEvent> {
        let parsed = parse_line(text).map_err(NoEvent::Malformed)?;
        let outcome = outcome(self.format, &parsed.line).map_err(NoEvent::Skip)?;
        let Some(tenant) = self.tenants.tenant(&parsed.line.host, &mut scratch.host) else {
            return Err(NoEvent::Skip(SkipReason::UnknownHost));
        };
        let Some(key) = request_key(&parsed.line.uri, &mut scratch.key) else {
            return Err(NoEvent::Skip(SkipReason::InvalidKey));
        };
        let referrer = referrer_host(&parsed.line.referer, &mut scratch.referrer);
        // Only a request that went to the origin has a fill time.
        let fill_ms = match outcome {
            Outcome::Miss | Outcome::PrefetchFill => parsed.upstream_ms,
            _ => None,
        };
        Ok(publish(&OutcomeRef {
            ts_ms: parsed.ts_ms,
            tenant: tenant.borrowed(),
            key,
            outcome,
            bytes: parsed.bytes,
            fill_ms,
            referrer,
        }))
    }
}

/// The follower thread's work: lines to events, straight to the producer.
struct FollowLoop {
    follower: LogFollower,
    mapper: LineMapper,
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
            let (mapper, handoff, metrics) = (&self.mapper, &mut self.handoff, &self.metrics);
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
    use models::Domain;

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

    /// The prefetcher's way to a key: `http::Uri`, then `normalise_key`.
    fn slow_key(uri: &str) -> Option<String> {
        let uri = uri.parse::<Uri>().ok().filter(|u| u.scheme().is_none())?;
        normalise_key(&uri).ok().map(String::from)
    }

    /// The prefetcher's way to a referrer: `http::Uri`'s host, lower case; but a log's
    /// `-` (varnishncsa's "no header") is no referrer, where `http::Uri` would read a
    /// host named `-`.
    fn slow_referrer(referer: &str) -> Option<String> {
        if referer == "-" {
            return None;
        }
        let uri: Uri = referer.parse().ok()?;
        Domain::new(uri.host()?.to_ascii_lowercase())
            .ok()
            .map(String::from)
    }

    #[test]
    fn keys_and_referrers_are_read_as_the_prefetcher_reads_them() {
        let mut scratch = String::new();
        for uri in [
            "/a",
            "/a?",
            "/a?b=1",
            "/a?b=1&a=2",
            "/a?&b=1",
            "/a?b=1&",
            "/a?b&&a",
            "/a#f",
            "/a?b=1#f",
            "/a b",
            "//evil/x",
            "http://h/x",
            "*",
            "/../x",
            "/%2e%2e/x",
            "",
            "/caf\u{e9}",
            "/a?z=\"q\"",
        ] {
            let fast = request_key(uri, &mut scratch).map(|k| k.as_str().to_owned());
            assert_eq!(fast, slow_key(uri), "{uri:?}");
        }
        for referer in [
            "https://news.example/a",
            "http://News.Example",
            "https://a.example?x",
            "https://a.example:8443/x",
            "https://user@a.example/",
            "https://[::1]/",
            "android-app://com.example/x",
            "https://a b/",
            "https://a.example/#f",
            "",
            "-",
            "news.example",
            "https:///x",
            "https://bad_host/x",
        ] {
            let fast = referrer_host(referer, &mut scratch).map(|d| d.as_str().to_owned());
            assert_eq!(fast, slow_referrer(referer), "{referer:?}");
        }
        assert_eq!(referrer_host("-", &mut scratch), None);
        assert!("-".parse::<Uri>().is_ok_and(|u| u.host() == Some("-")));
    }

    proptest::proptest! {
        /// Targets and referrers made of URI characters and some that are not: the
        /// fast paths give what `http::Uri` and `normalise_key` give.
        #[test]
        fn the_fast_key_and_referrer_agree_with_the_uri_parser(
            uri in "(/|//|http://h/|\\*)?[a-zA-Z0-9/?&=.%#~ _\"<>@:!$',;*+()\\[\\]-]{0,24}",
            referer in "(https?://|ftp://|//)?[a-zA-Z0-9/?&=.%#~ _\"@:\\[\\]-]{0,24}",
        ) {
            let mut scratch = String::new();
            let fast = request_key(&uri, &mut scratch).map(|k| k.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_key(&uri), "{:?}", uri);
            let fast = referrer_host(&referer, &mut scratch).map(|d| d.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_referrer(&referer), "{:?}", referer);
        }

        /// The same on inputs that mostly take the fast paths.
        #[test]
        fn the_fast_paths_agree_on_plain_targets_and_referrers(
            uri in "/[a-z0-9/.%~_@:!$',;*+()-]{0,12}(\\?[a-z0-9&=.%@:/?-]{0,16})?",
            referer in "https?://[a-zA-Z0-9._-]{0,12}([/?][a-z0-9/?&=.:@-]{0,12})?",
        ) {
            let mut scratch = String::new();
            let fast = request_key(&uri, &mut scratch).map(|k| k.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_key(&uri), "{:?}", uri);
            let fast = referrer_host(&referer, &mut scratch).map(|d| d.as_str().to_owned());
            proptest::prop_assert_eq!(fast, slow_referrer(&referer), "{:?}", referer);
        }
    }

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
