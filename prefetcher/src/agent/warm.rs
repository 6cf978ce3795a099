//! Pre-warms for a node the agent runs beside: commands from `prewarm`, checked as
//! the prefetcher checks them, become background `GET`s of the key to the local
//! cache.
//!
//! Each message goes through [`check_signature`] (with `kafka.prewarm_keys_file`:
//! `unsigned`, `unknown_key`, `bad_signature`, before the payload is parsed), then
//! [`check_prewarm`](crate::prewarm::check_prewarm) (codec, `expired`,
//! `other_region`), then the agent's own tenant map (`unknown_tenant`) and the ids it
//! acted on ([`RecentCommands`]: `duplicate`);
//! refusals are counted in `prefetcher_prefetches_rejected_total{reason}` as the
//! prefetcher counts them. The key is normalised as a request's
//! ([`normalise_key`](crate::normalise_key)) and requested with the tenant's first
//! host as `Host` and the pre-warm header, so the node's shipped config caches the
//! response and logs the request as a pre-warm. The request names only the local
//! cache: a command cannot make the agent talk to any other host.
//!
//! Concurrency is the prefetcher's adaptive prefetch limit ([`FillLimiter`]): each
//! pre-warm reports its time to the response head, or an error (a 5xx, a timeout, a
//! refused connection), and the limit shrinks when the node or its origin slows or
//! fails and grows back by about one per limit's worth of healthy pre-warms. Past the
//! limit commands wait in a bounded queue; when it is full they are shed (counted).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use models::{CacheKey, PrewarmCommand, RegionId, SigningKeys, TenantId};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::config::AgentConfig;
use super::metrics::AgentMetrics;
use crate::cache_key::normalise_key;
use crate::events::unix_now_ms;
use crate::limits::FillLimiter;
use crate::metrics::Metrics;
use crate::prewarm::{
    LoggingContext, RecentCommands, check_prewarm, check_signature, is_waiting_for_topic,
    log_authentication, subscribe_prewarm,
};
use crate::status::RejectReason;

/// One checked pre-warm: the request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmRequest {
    /// The `Host` to send (the tenant's first host).
    pub host: String,
    /// The normalised key: path and sorted query.
    pub key: CacheKey,
    /// The command's id, to drop a repeat of it.
    pub id: String,
    /// When the command expires.
    pub expires_at_ms: u64,
}

/// The tenant map the agent checks commands against: tenant → the `Host` it sends.
#[derive(Debug, Clone)]
pub(crate) struct WarmTargets {
    region: RegionId,
    hosts: HashMap<TenantId, String>,
}

impl WarmTargets {
    /// The targets of a validated config.
    pub(crate) fn new(config: &AgentConfig) -> WarmTargets {
        let region = config.region.clone().expect("validated: region is set");
        let hosts = config
            .tenants
            .iter()
            .map(|t| {
                let host = t
                    .hosts
                    .iter()
                    .find(|h| *h != "*")
                    .cloned()
                    .unwrap_or_else(|| t.id.to_string());
                (t.id.clone(), host)
            })
            .collect();
        WarmTargets { region, hosts }
    }

    /// The `Host` warm requests of `tenant` carry; `None` for a tenant not configured.
    pub(crate) fn host(&self, tenant: &TenantId) -> Option<&str> {
        self.hosts.get(tenant).map(String::as_str)
    }

    /// Checks one message payload: the prefetcher's checks, then the tenant.
    pub(crate) fn check(
        &self,
        payload: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<WarmRequest, RejectReason> {
        let command: PrewarmCommand = check_prewarm(&self.region, payload, now_ms)?;
        let Some(host) = self.hosts.get(&command.tenant) else {
            return Err(RejectReason::UnknownTenant);
        };
        let key = command
            .key
            .as_str()
            .parse::<Uri>()
            .ok()
            .and_then(|uri| normalise_key(&uri).ok())
            .ok_or(RejectReason::InvalidField)?;
        Ok(WarmRequest {
            host: host.clone(),
            key,
            id: command.id,
            expires_at_ms: command.expires_at_ms,
        })
    }
}

/// Sends pre-warm requests to the local cache within the adaptive limit.
#[derive(Clone)]
pub(crate) struct Warmer {
    client: Client<HttpConnector, Empty<Bytes>>,
    cache_url: String,
    header: HeaderName,
    timeout: Duration,
    limiter: FillLimiter,
    agent: Arc<AgentMetrics>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Warmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmer")
            .field("cache_url", &self.cache_url)
            .finish_non_exhaustive()
    }
}

impl Warmer {
    /// A warmer for a validated config.
    pub(crate) fn new(
        config: &AgentConfig,
        agent: Arc<AgentMetrics>,
        metrics: Arc<Metrics>,
    ) -> Warmer {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(config.warm.limit.max_fills)
            .build(connector);
        let limiter = FillLimiter::new(&config.warm_flight(), &config.warm.limit);
        metrics.prefetch_limit.set(limiter.prefetch_limit() as i64);
        Warmer {
            client,
            cache_url: config.cache_url.trim_end_matches('/').to_owned(),
            header: HeaderName::from_bytes(config.warm.header.as_bytes())
                .expect("validated: a header name"),
            timeout: Duration::from_millis(config.warm.timeout_ms),
            limiter,
            agent,
            metrics,
        }
    }

    /// The adaptive limit now.
    pub(crate) fn limit(&self) -> usize {
        self.limiter.prefetch_limit()
    }

    /// Waits for a slot (or is shed), then sends `request` and reports its latency to
    /// the limit. Returns the body's size when the node answered with a success.
    pub(crate) async fn warm(&self, request: WarmRequest) -> Option<u64> {
        self.metrics
            .prefetch_queued
            .set(self.limiter.prefetch_queued() as i64 + 1);
        let slot = self.limiter.acquire_prefetch(None).await;
        self.metrics
            .prefetch_queued
            .set(self.limiter.prefetch_queued() as i64);
        let Ok(slot) = slot else {
            self.metrics.prefetches_shed.inc();
            return None;
        };
        self.metrics.prefetches_started.inc();
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(self.timeout, self.send(&request)).await;
        let ok = match result {
            Ok(Ok((head_latency, bytes))) => {
                slot.record(Some(head_latency));
                Some(bytes)
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, key = %request.key, "pre-warm request failed");
                slot.record(None);
                None
            }
            Err(_) => {
                tracing::debug!(key = %request.key, "pre-warm request timed out");
                slot.record(None);
                None
            }
        };
        drop(slot);
        self.metrics
            .prefetch_limit
            .set(self.limiter.prefetch_limit() as i64);
        self.agent
            .warm_seconds
            .observe(started.elapsed().as_secs_f64());
        if ok.is_some() {
            self.agent.warms_ok.inc();
        } else {
            self.agent.warms_failed.inc();
        }
        ok
    }

    /// Sends one request and reads the body to its end (so the cache stores it);
    /// the time to the response head and the body's size on success.
    async fn send(&self, request: &WarmRequest) -> Result<(Duration, u64), String> {
        let uri = format!("{}{}", self.cache_url, request.key);
        let http_request = Request::get(&uri)
            .header(header::HOST, &request.host)
            .header(self.header.clone(), HeaderValue::from_static("1"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let started = tokio::time::Instant::now();
        let response = self
            .client
            .request(http_request)
            .await
            .map_err(|e| e.to_string())?;
        let head = started.elapsed();
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status.is_server_error() {
            return Err(format!("status {status}"));
        }
        Ok((head, body.len() as u64))
    }
}

/// The agent's pre-warm consumer: reads `kafka.prewarm_topic`, checks each command
/// and hands it to the [`Warmer`] in a task of its own.
pub(crate) struct WarmConsumer {
    consumer: StreamConsumer<LoggingContext>,
    keys: Option<SigningKeys>,
    /// Replaced whole by a reload (`agent::reload`).
    targets: Arc<ArcSwap<WarmTargets>>,
    warmer: Warmer,
    metrics: Arc<Metrics>,
    max_in_flight: usize,
}

impl std::fmt::Debug for WarmConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmConsumer").finish_non_exhaustive()
    }
}

impl WarmConsumer {
    /// A consumer for a validated config, subscribed to `kafka.prewarm_topic`; with
    /// `keys` it acts only on commands signed by one of them.
    pub(crate) fn new(
        config: &AgentConfig,
        keys: Option<SigningKeys>,
        warmer: Warmer,
        metrics: Arc<Metrics>,
    ) -> Result<WarmConsumer, KafkaError> {
        let kafka = &config.kafka;
        // As the prefetcher's consumer: store after handling, commit in background.
        let consumer = subscribe_prewarm(kafka, &config.prewarm_group())?;
        let limit = &config.warm.limit;
        Ok(WarmConsumer {
            consumer,
            keys,
            targets: Arc::new(ArcSwap::from_pointee(WarmTargets::new(config))),
            warmer,
            metrics,
            // Slots plus the limiter's queue: past it the limiter sheds anyway, so
            // bounding the tasks here only bounds memory.
            max_in_flight: limit.max_fills + limit.max_queued,
        })
    }

    /// The targets commands are checked against, for a reload to replace.
    pub(crate) fn targets(&self) -> Arc<ArcSwap<WarmTargets>> {
        Arc::clone(&self.targets)
    }

    /// Reads and handles commands until `shutdown` turns true, then waits for the
    /// pre-warms in flight (they are bounded by `warm.timeout_ms`) and commits.
    pub(crate) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!("edge agent: pre-warm consumer started");
        log_authentication("edge agent", self.keys.as_ref());
        let mut tasks = JoinSet::new();
        let mut recent = RecentCommands::new(RecentCommands::DEFAULT_CAPACITY);
        let mut waiting = false;
        loop {
            while tasks.try_join_next().is_some() {}
            let message = tokio::select! {
                message = self.consumer.recv() => message,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let message = match message {
                Ok(message) => {
                    waiting = false;
                    message
                }
                Err(error) if is_waiting_for_topic(&error) => {
                    if !waiting {
                        tracing::info!("edge agent: waiting for the pre-warm topic to be created");
                        waiting = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "edge agent: pre-warm receive failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            self.metrics.prefetches_received.inc();
            let now_ms = unix_now_ms();
            let checked = check_signature(self.keys.as_ref(), &message)
                .and_then(|()| self.targets.load().check(message.payload(), now_ms));
            match checked {
                Ok(request) if recent.is_repeat(&request.id, now_ms) => {
                    self.metrics.prewarm_rejected(RejectReason::Duplicate);
                }
                Ok(request) if tasks.len() < self.max_in_flight => {
                    recent.record(request.id.clone(), request.expires_at_ms, now_ms);
                    let warmer = self.warmer.clone();
                    tasks.spawn(async move {
                        warmer.warm(request).await;
                    });
                }
                Ok(_) => {
                    self.metrics.prefetches_shed.inc();
                }
                Err(reason) => {
                    self.metrics.prewarm_rejected(reason);
                    tracing::debug!(%reason, "edge agent: pre-warm command refused");
                }
            }
            if let Err(error) = self.consumer.store_offset_from_message(&message) {
                tracing::warn!(%error, "edge agent: storing the offset failed");
            }
        }
        while tasks.join_next().await.is_some() {}
        let consumer = self.consumer;
        let _ = tokio::task::spawn_blocking(move || {
            consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        })
        .await;
        tracing::info!("edge agent: pre-warm consumer stopped");
    }
}

#[cfg(test)]
mod tests {
    use models::{Reason, RegionTargets, encode};

    use super::*;

    use crate::agent::config::tests::valid as config;

    fn command(tenant: &str, key: &str, region: &str, expires_at_ms: u64) -> Vec<u8> {
        let command = PrewarmCommand::new(
            "c-1".into(),
            TenantId::new(tenant).unwrap(),
            CacheKey::new(key).unwrap(),
            0.9,
            expires_at_ms - 100,
            expires_at_ms,
            RegionTargets::Only(vec![RegionId::new(region).unwrap()]),
            Reason {
                model: "test".into(),
                intercept: 0.0,
                features: Vec::new(),
            },
        );
        encode(&command)
    }

    /// A local cache that records what it was asked and answers `status`.
    async fn cache_answering(
        status: u16,
    ) -> (String, Arc<std::sync::Mutex<Vec<(String, String, String)>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let record = Arc::clone(&record);
            async move {
                let header = |name: &str| {
                    request
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                record.lock().unwrap().push((
                    request.uri().to_string(),
                    header("host"),
                    header("x-edge-pulse-prewarm"),
                ));
                http::StatusCode::from_u16(status).unwrap()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, seen)
    }

    fn warmer(cache_url: String) -> (Warmer, Arc<AgentMetrics>) {
        let mut config = config();
        config.cache_url = cache_url;
        let agent = Arc::new(AgentMetrics::new());
        let warmer = Warmer::new(&config, Arc::clone(&agent), Arc::new(Metrics::new()));
        (warmer, agent)
    }

    #[tokio::test]
    async fn a_pre_warm_asks_the_local_cache_with_the_tenants_host_and_the_marker() {
        let (url, seen) = cache_answering(200).await;
        let (warmer, agent) = warmer(url);
        let request = WarmRequest {
            host: "acme.example".into(),
            key: CacheKey::new("/a?b=1").unwrap(),
            id: "c-1".into(),
            expires_at_ms: u64::MAX,
        };
        assert!(warmer.warm(request).await.is_some());
        assert_eq!(
            *seen.lock().unwrap(),
            [(
                "/a?b=1".to_owned(),
                "acme.example".to_owned(),
                "1".to_owned()
            )]
        );
        assert_eq!(agent.warms_ok.get(), 1);
        assert_eq!(warmer.limit(), 8, "a healthy node keeps the limit");
    }

    #[tokio::test]
    async fn a_failing_node_shrinks_the_limit_of_concurrent_pre_warms() {
        let (url, _) = cache_answering(503).await;
        let (warmer, agent) = warmer(url);
        let before = warmer.limit();
        for _ in 0..3 {
            let request = WarmRequest {
                host: "acme.example".into(),
                key: CacheKey::new("/a").unwrap(),
                id: "c-1".into(),
                expires_at_ms: u64::MAX,
            };
            assert!(warmer.warm(request).await.is_none());
        }
        assert_eq!(agent.warms_failed.get(), 3);
        assert!(warmer.limit() < before, "{} < {before}", warmer.limit());
    }

    #[test]
    fn a_good_command_becomes_a_request_with_the_tenants_host_and_a_sorted_key() {
        let targets = WarmTargets::new(&config());
        let payload = command("acme", "/a?z=1&b=2", "eu-west", 2_000);
        assert_eq!(
            targets.check(Some(&payload), 1_000),
            Ok(WarmRequest {
                host: "acme.example".into(),
                key: CacheKey::new("/a?b=2&z=1").unwrap(),
                id: "c-1".into(),
                expires_at_ms: 2_000,
            })
        );
    }

    #[test]
    fn forged_expired_foreign_and_unknown_commands_are_refused_with_the_prefetchers_reasons() {
        let targets = WarmTargets::new(&config());
        let cases = [
            (b"garbage".to_vec(), RejectReason::Malformed),
            (
                b"{\"not\":\"a command\"}".to_vec(),
                RejectReason::InvalidField,
            ),
            (command("acme", "/a", "eu-west", 500), RejectReason::Expired),
            (
                command("acme", "/a", "us-east", 2_000),
                RejectReason::OtherRegion,
            ),
            (
                command("evil", "/a", "eu-west", 2_000),
                RejectReason::UnknownTenant,
            ),
        ];
        for (payload, want) in cases {
            assert_eq!(targets.check(Some(&payload), 1_000), Err(want));
        }
        assert_eq!(targets.check(None, 1_000), Err(RejectReason::Malformed));
    }
}
