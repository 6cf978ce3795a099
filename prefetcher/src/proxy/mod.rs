//! The node: one edge (or shield) node's state and its public surface ([`Node`],
//! [`app`], [`admin_app`]). The jobs are split by module:
//!
//! - `request`: a client request's path: the head checks of `crate::request_head`
//!   (ambiguous or smuggled heads refused before anything else), limits, tenant
//!   routing, the cache key (`crate::cache_key`), cache lookup, and leading, joining
//!   or bypassing a fill.
//! - `response`: building responses: hit/stale/collapsed bodies, `Age`, `x-cache`,
//!   errors.
//! - `fill`: the fill task: origin fetch, streaming to subscribers, cache write.
//! - `range`: `Range` requests (RFC 9110 §14): 206 and `multipart/byteranges` cut
//!   from the cache or a fill's streamed body, 416, `If-Range`.
//! - `pass_through`: a request passed to the origin (body forwarded, unsafe methods
//!   invalidating what they change).
//! - `upload`: a forwarded request body under the body timeout and deadline, and
//!   the upload slots.
//! - `serve`: the node behind its client listeners ([`serve_node`],
//!   [`serve_node_tls`]): the node's hyper service, plugged into `crate::listener`.
//! - `prewarm`: the pre-warm entry into the same single-flight path (the Kafka
//!   consumer that calls it is `crate::prewarm`).
//! - `purge`: [`Node::purge`], its re-warm and `POST /purge` (the model is
//!   `crate::purge`'s).
//! - `hints`: origin hints, the successors a response names, pre-warmed through
//!   `prewarm` for the tenants that opt in.

mod fill;
mod fill_body;
mod hints;
mod pass_through;
mod prewarm;
mod purge;
mod range;
mod recent;
mod request;
mod response;
mod serve;
mod upload;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use http::{HeaderValue, header};
use models::TenantId;

use crate::cache::L1Cache;
use crate::config::{Config, ConfigError};
use crate::events::{EventSink, NoopSink, OutcomeRecord};
use crate::flight::FlightRegistry;
use crate::listener::ConnectionLimiter;
use crate::metrics::Metrics;
use crate::origin::{OriginClient, Tenant};

pub use prewarm::{PrewarmError, PrewarmOutcome};
pub use serve::{serve_node, serve_node_tls};

/// One edge (or shield) node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    /// The configuration the node started with. Its settings that need a restart are
    /// the ones in force; those a reload changes (tenants, `[limits]`, the listener's
    /// certificate files) are read from `live`.
    config: Config,
    /// What a reload replaces: read once per request (one atomic load, no lock).
    live: ArcSwap<Live>,
    cache: L1Cache,
    registry: FlightRegistry,
    origin: OriginClient,
    metrics: Metrics,
    /// Admission of client connections, shared by the node's proxy listeners.
    connections: ConnectionLimiter,
    sink: Arc<dyn EventSink>,
    /// Keys too large to fill for a range request (`range`).
    too_large: recent::RecentKeys,
    /// Keys whose last response was per-user: each request fetches on its own.
    unshared: recent::RecentKeys,
    /// `server.trusted_proxies`: whose forwarding fields are believed.
    trusted: crate::forward::TrustedProxies,
    /// Slots of pass-through uploads (`upload`).
    uploads: upload::UploadLimiter,
    /// Whether the node takes traffic yet (`/readyz`): warming at start, or ready.
    readiness: crate::warmup::Readiness,
    /// The bearer token `POST /purge` needs (`purge.token_file`); none: it is off.
    purge_token: Option<String>,
    /// Re-warm fills a purge may have in flight (`purge.rewarm_concurrency`).
    rewarm_slots: Arc<tokio::sync::Semaphore>,
    /// Panics injected into fill tasks by tests (feature `testing` only).
    #[cfg(feature = "testing")]
    faults: crate::faults::FillFaults,
}

/// The part of a node's configuration a reload replaces: the whole configuration in
/// force and the tenant routing built from it. A request reads it once, and it and
/// the fills it starts keep the one they read (a fill holds its [`Tenant`]), so a
/// reload applies to new requests while those in flight finish on the old one.
pub(crate) struct Live {
    /// The configuration in force.
    pub(crate) config: Arc<Config>,
    by_host: HashMap<String, Arc<Tenant>>,
    fallback: Option<Arc<Tenant>>,
    by_id: HashMap<TenantId, Arc<Tenant>>,
    /// The origin-hint budgets of the tenants that opt in.
    hints: HashMap<TenantId, Arc<hints::HintBudget>>,
}

impl Live {
    /// The routing of a validated `config`'s tenants; a tenant whose origin cannot be
    /// used is an error naming it.
    pub(crate) fn new(config: Config) -> Result<Live, ConfigError> {
        let mut by_host = HashMap::new();
        let mut by_id = HashMap::new();
        let mut fallback = None;
        let mut hint_budgets = HashMap::new();
        for (i, t) in config.tenants.iter().enumerate() {
            if let Some(h) = &t.origin_hints {
                hint_budgets.insert(t.id.clone(), Arc::new(hints::HintBudget::new(h)));
            }
            let tenant =
                Arc::new(
                    Tenant::from_config(t).map_err(|reason| ConfigError::Invalid {
                        field: format!("tenants[{i}].origin"),
                        reason,
                    })?,
                );
            for host in &t.hosts {
                if host == "*" {
                    fallback = Some(Arc::clone(&tenant));
                } else {
                    by_host.insert(host.to_ascii_lowercase(), Arc::clone(&tenant));
                }
            }
            by_id.insert(t.id.clone(), tenant);
        }
        Ok(Live {
            config: Arc::new(config),
            by_host,
            fallback,
            by_id,
            hints: hint_budgets,
        })
    }
}

/// The proxy router: every path goes to the proxy (metrics live on the admin router).
pub fn app(node: Node) -> Router {
    Router::new().fallback(handle).with_state(node)
}

/// The admin router: `/metrics` (Prometheus text), `/healthz` (alive), `/readyz`
/// (503 while warming at start, then 200: `crate::warmup`) and `POST /purge`
/// (`crate::purge`).
pub fn admin_app(node: Node) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(node): State<Node>| async move { node.readiness().response() }),
        )
        .route("/purge", axum::routing::post(purge::purge_endpoint))
        .with_state(node)
}

async fn handle(State(node): State<Node>, request: Request) -> Response {
    node.handle(request).await
}

async fn metrics(State(node): State<Node>) -> Response {
    let limiter = node.inner.origin.limiter();
    let m = &node.inner.metrics;
    m.prefetch_limit.set(limiter.prefetch_limit() as i64);
    m.prefetch_queued.set(limiter.prefetch_queued() as i64);
    m.fill_limit.set(limiter.max_fills() as i64);
    m.fills_active
        .set(limiter.max_fills().saturating_sub(limiter.free_slots()) as i64);
    m.set_tenant_fills(&limiter.tenants());
    let mut response = Response::new(Body::from(node.inner.metrics.encode()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn millis(d: std::time::Duration) -> u32 {
    d.as_millis().min(u128::from(u32::MAX)) as u32
}

impl Node {
    /// A node with no event sink.
    pub fn new(config: Config) -> Result<Node, ConfigError> {
        Node::with_sink(config, Arc::new(NoopSink))
    }

    /// A node reporting request outcomes to `sink`.
    pub fn with_sink(config: Config, sink: Arc<dyn EventSink>) -> Result<Node, ConfigError> {
        config.validate()?;
        let live = ArcSwap::from_pointee(Live::new(config.clone())?);
        let metrics = Metrics::new();
        let origin = OriginClient::from_config(&config)?
            .count_tls_failures_in(metrics.origin_tls_failures.clone());
        origin
            .limiter()
            .count_refusals_in(metrics.tenant_fills_refused.clone());
        for result in hints::HintResult::ALL {
            metrics.origin_hint(result.as_str(), 0);
        }
        let connections = ConnectionLimiter::new(&config.server, metrics.client_counters());
        let purge_token = config.purge.token()?;
        let rewarm_slots = Arc::new(tokio::sync::Semaphore::new(config.purge.rewarm_concurrency));
        Ok(Node {
            inner: Arc::new(NodeInner {
                connections,
                cache: L1Cache::with_waste_counter(
                    &config.cache,
                    metrics.prefetches_wasted.clone(),
                ),
                registry: FlightRegistry::new(config.flight.max_flights),
                origin,
                metrics,
                sink,
                too_large: recent::RecentKeys::new(std::time::Duration::from_secs(600)),
                // As long as Varnish remembers a hit-for-miss object by default.
                unshared: recent::RecentKeys::new(std::time::Duration::from_secs(120)),
                live,
                trusted: crate::forward::TrustedProxies::new(&config.server.trusted_proxies),
                uploads: upload::UploadLimiter::new(&config.server),
                config,
                readiness: crate::warmup::Readiness::default(),
                purge_token,
                rewarm_slots,
                #[cfg(feature = "testing")]
                faults: crate::faults::FillFaults::default(),
            }),
        })
    }

    /// Testing only: the next fill of `key` panics at `at`, as a bug in the fill
    /// task would, so tests can check that its waiters are never stranded.
    #[cfg(feature = "testing")]
    pub fn panic_next_fill(&self, key: crate::flight::FlightKey, at: crate::faults::PanicPoint) {
        self.inner.faults.arm(key, at);
    }

    /// The configuration in force (the one the node started with, or the last one a
    /// reload put in force).
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.inner.live.load().config)
    }

    /// The part of the configuration a reload replaces, as it is now.
    pub(crate) fn live(&self) -> arc_swap::Guard<Arc<Live>> {
        self.inner.live.load()
    }

    /// Puts `live` in force for the requests that start from now on.
    pub(crate) fn replace_live(&self, live: Live) {
        self.inner.live.store(Arc::new(live));
    }

    /// The bearer token `POST /purge` needs, if the endpoint is on.
    pub(crate) fn purge_token(&self) -> Option<&str> {
        self.inner.purge_token.as_deref()
    }

    /// Whether the node takes traffic yet (`/readyz`).
    pub fn readiness(&self) -> &crate::warmup::Readiness {
        &self.inner.readiness
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Admission of the client connections of the node's proxy listeners (plain and
    /// TLS together).
    pub fn connections(&self) -> &ConnectionLimiter {
        &self.inner.connections
    }

    /// The single-flight registry (for diagnostics and tests).
    pub fn registry(&self) -> &FlightRegistry {
        &self.inner.registry
    }

    /// The L1 cache.
    pub fn cache(&self) -> &L1Cache {
        &self.inner.cache
    }

    /// The origin client and its fill limits.
    pub fn origin(&self) -> &OriginClient {
        &self.inner.origin
    }

    /// The scheme a pre-warm fills for: `https` when the node has a TLS listener
    /// (its clients are mostly there), else `http`.
    fn prewarm_scheme(&self) -> crate::flight::Scheme {
        match self.inner.config.tls {
            Some(_) => crate::flight::Scheme::Https,
            None => crate::flight::Scheme::Http,
        }
    }

    fn emit(&self, record: OutcomeRecord) {
        if self.inner.sink.record(record).is_err() {
            self.inner.metrics.events_dropped.inc();
        }
    }
}
