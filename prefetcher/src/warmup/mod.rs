//! Warm-up at start, the node's and the edge agent's alike: before a cache that starts
//! empty takes traffic, it fills its region's hot keyset, asked of pulse.
//!
//! The contract:
//! - **What**: pulse's `/api/warmset` for the node's region and tenants (the heat map's
//!   Top-K of the region over 60 s, hottest first, `pulse`), cut to `warmup.max_keys`
//!   and to each tenant's part of it (its `weight` over the sum, as the fill slots
//!   are shared); a tenant whose warmed bytes reach its part of `warmup.max_bytes`
//!   starts no further key.
//! - **How**: by `fill`, the same path a pre-warm command takes (the node's
//!   `Node::warm`, a background-priority fill within the prefetch limit's spare
//!   capacity; the agent's background `GET` to its cache); at most `concurrency()`
//!   at once (the adaptive prefetch limit), so none is shed for want of a place.
//!   Only this node fetches: with `warmup.peers`, the region's other nodes are asked
//!   for their cached copy first (`only-if-cached`: they never fetch for it).
//! - **Readiness** ([`Readiness`], `/readyz`): `warming` with `done`/`of` from the
//!   start until every key is in, skipped or failed, or until `warmup.deadline_ms`
//!   after the start: then ready anyway, counted in
//!   `prefetcher_warmup_deadline_hit_total` and logged. Without `[warmup]`, or when
//!   pulse does not answer, ready at once, said once at INFO. `/healthz` stays "alive".
//! - **Metrics** ([`WarmupMetrics`]): keys by result, bytes, deadlines hit, and a
//!   gauge that is 1 while warming.

mod pulse;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use models::{CacheKey, RegionId, TenantId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::WarmupConfig;
pub(crate) use pulse::fetch_warmset;

/// What one warm-up fill came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmFill {
    /// Fetched and stored (`bytes` of body, 0 when the filler cannot tell).
    Filled {
        /// The stored body's size.
        bytes: u64,
    },
    /// Already fresh in the cache.
    Cached,
    /// Refused, failed, or not stored.
    Failed,
}

/// Whether the node takes traffic yet, as `/readyz` says it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

#[derive(Debug)]
struct ReadinessInner {
    warming: AtomicBool,
    done: AtomicU64,
    of: AtomicU64,
    /// Why the node is ready: `warmed`, `deadline`, `no_warmup`, `pulse_unreachable`.
    reason: Mutex<&'static str>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new(false, "no_warmup")
    }
}

impl Readiness {
    fn new(warming: bool, reason: &'static str) -> Readiness {
        Readiness {
            inner: Arc::new(ReadinessInner {
                warming: AtomicBool::new(warming),
                done: AtomicU64::new(0),
                of: AtomicU64::new(0),
                reason: Mutex::new(reason),
            }),
        }
    }

    /// Says `warming` until [`Readiness::ready`].
    pub fn start_warming(&self) {
        self.inner.warming.store(true, Ordering::Release);
    }

    /// Ready from now on, for `reason`.
    pub fn ready(&self, reason: &'static str) {
        *self.inner.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
        self.inner.warming.store(false, Ordering::Release);
    }

    /// Whether the node takes traffic.
    pub fn is_ready(&self) -> bool {
        !self.inner.warming.load(Ordering::Acquire)
    }

    /// Keys in (or given up), and keys to warm.
    pub fn progress(&self) -> (u64, u64) {
        (
            self.inner.done.load(Ordering::Relaxed),
            self.inner.of.load(Ordering::Relaxed),
        )
    }

    /// `/readyz`: 503 `{"state":"warming","done":N,"of":M}` while warming, then 200
    /// `{"state":"ready","done":N,"of":M,"reason":...}`.
    pub fn response(&self) -> Response {
        let (done, of) = self.progress();
        if self.is_ready() {
            let reason = *self.inner.reason.lock().unwrap_or_else(|e| e.into_inner());
            let body =
                serde_json::json!({"state": "ready", "done": done, "of": of, "reason": reason});
            (StatusCode::OK, Json(body)).into_response()
        } else {
            let body = serde_json::json!({"state": "warming", "done": done, "of": of});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The warm-up's Prometheus metrics (registered in the node's and the agent's
/// registry, prefix `prefetcher_`).
#[derive(Debug, Clone, Default)]
pub struct WarmupMetrics {
    keys: Family<ResultLabels, Counter>,
    /// Bytes of the keys warmed.
    pub bytes: Counter,
    /// Warm-ups that reported ready at `warmup.deadline_ms`, keys still missing.
    pub deadline_hit: Counter,
    /// 1 while warming, else 0.
    pub warming: Gauge,
    /// Warm fills asked of a peer's cache (`warmup.peers`), by `hit` (the peer's
    /// copy stored) or `miss` (not cached there, or unreachable).
    peer_asks: Family<ResultLabels, Counter>,
}

impl WarmupMetrics {
    /// Registers every metric in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "warmup_keys",
            "Keys of the warm set at start, by result (filled, cached, failed, skipped)",
            self.keys.clone(),
        );
        registry.register(
            "warmup_bytes",
            "Bytes filled by the warm-up at start",
            self.bytes.clone(),
        );
        registry.register(
            "warmup_deadline_hit",
            "Warm-ups that reported ready at warmup.deadline_ms with keys still missing",
            self.deadline_hit.clone(),
        );
        registry.register(
            "warmup_warming",
            "1 while the warm-up at start runs (/readyz answers 503)",
            self.warming.clone(),
        );
        registry.register(
            "warmup_peer_asks",
            "Warm-up fills asked of a peer's cache (warmup.peers), by result (hit, miss)",
            self.peer_asks.clone(),
        );
    }

    /// Asks of a peer's cache counted with `result` (`hit` or `miss`).
    pub fn peer_asks(&self, result: &'static str) -> u64 {
        self.peer_asks.get_or_create(&ResultLabels { result }).get()
    }

    /// Counts one ask of a peer's cache: `hit` or `miss`.
    pub(crate) fn peer_ask(&self, result: &'static str) {
        self.peer_asks.get_or_create(&ResultLabels { result }).inc();
    }

    /// Keys counted with `result`.
    pub fn keys(&self, result: &'static str) -> u64 {
        self.keys.get_or_create(&ResultLabels { result }).get()
    }

    fn count(&self, result: &'static str) {
        self.keys.get_or_create(&ResultLabels { result }).inc();
    }
}

/// What a warm-up works with.
pub(crate) struct Warmup<'a> {
    pub config: &'a WarmupConfig,
    pub token: Option<String>,
    pub region: &'a RegionId,
    /// The configured tenants and their weights.
    pub tenants: Vec<(TenantId, f64)>,
    pub readiness: &'a Readiness,
    pub metrics: &'a WarmupMetrics,
}

impl Warmup<'_> {
    /// Asks pulse for the warm set, fills it by `fill`, at most `concurrency()` at
    /// once, and reports ready when done or at the deadline (from the call).
    pub(crate) async fn run<F, Fut>(self, concurrency: impl Fn() -> usize, fill: F)
    where
        F: Fn(TenantId, CacheKey) -> Fut,
        Fut: Future<Output = WarmFill> + Send + 'static,
    {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(self.config.deadline_ms);
        self.readiness.start_warming();
        self.metrics.warming.set(1);
        let outcome = tokio::time::timeout_at(deadline, self.warm(concurrency, fill)).await;
        let (done, of) = self.readiness.progress();
        let reason = match outcome {
            Ok(Ok(())) => {
                tracing::info!(
                    done,
                    of,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    filled = self.metrics.keys("filled"),
                    cached = self.metrics.keys("cached"),
                    failed = self.metrics.keys("failed"),
                    skipped = self.metrics.keys("skipped"),
                    "warm-up done: ready"
                );
                "warmed"
            }
            Ok(Err(why)) => {
                tracing::info!(pulse = %self.config.pulse, %why, "warm-up: no warm set from pulse: ready without warming");
                "pulse_unreachable"
            }
            Err(_) => {
                self.metrics.deadline_hit.inc();
                tracing::warn!(
                    done,
                    of,
                    deadline_ms = self.config.deadline_ms,
                    "warm-up: deadline passed with keys missing: ready anyway"
                );
                "deadline"
            }
        };
        self.readiness.ready(reason);
        self.metrics.warming.set(0);
    }

    async fn warm<F, Fut>(&self, concurrency: impl Fn() -> usize, fill: F) -> Result<(), String>
    where
        F: Fn(TenantId, CacheKey) -> Fut,
        Fut: Future<Output = WarmFill> + Send + 'static,
    {
        let ids: Vec<TenantId> = self.tenants.iter().map(|(t, _)| t.clone()).collect();
        let rows = fetch_warmset(
            self.config,
            self.token.as_deref(),
            self.region,
            &ids,
            self.config.max_keys,
        )
        .await?;
        let plan = Plan::new(self.config, &self.tenants, rows);
        self.readiness
            .inner
            .of
            .store(plan.keys.len() as u64, Ordering::Relaxed);
        let mut bytes: HashMap<TenantId, u64> = HashMap::new();
        let mut running = JoinSet::new();
        let finish = |tenant: TenantId, result: WarmFill, bytes: &mut HashMap<TenantId, u64>| {
            match result {
                WarmFill::Filled { bytes: n } => {
                    *bytes.entry(tenant).or_default() += n;
                    self.metrics.bytes.inc_by(n);
                    self.metrics.count("filled");
                }
                WarmFill::Cached => self.metrics.count("cached"),
                WarmFill::Failed => self.metrics.count("failed"),
            }
            self.readiness.inner.done.fetch_add(1, Ordering::Relaxed);
        };
        for (tenant, key) in plan.keys {
            while running.len() >= concurrency().max(1) {
                if let Some(Ok((t, result))) = running.join_next().await {
                    finish(t, result, &mut bytes);
                }
            }
            if bytes.get(&tenant).copied().unwrap_or(0) >= plan.byte_share[&tenant] {
                self.metrics.count("skipped");
                self.readiness.inner.done.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let fill = fill(tenant.clone(), key);
            running.spawn(async move { (tenant, fill.await) });
        }
        while let Some(joined) = running.join_next().await {
            if let Ok((t, result)) = joined {
                finish(t, result, &mut bytes);
            }
        }
        Ok(())
    }
}

/// The keys to warm, in pulse's order, and each tenant's part of the bytes.
struct Plan {
    keys: Vec<(TenantId, CacheKey)>,
    byte_share: HashMap<TenantId, u64>,
}

impl Plan {
    fn new(
        config: &WarmupConfig,
        tenants: &[(TenantId, f64)],
        rows: Vec<(TenantId, CacheKey)>,
    ) -> Plan {
        let total: f64 = tenants.iter().map(|(_, w)| w.max(0.0)).sum();
        let share = |w: f64| {
            if total > 0.0 {
                w.max(0.0) / total
            } else {
                1.0 / tenants.len().max(1) as f64
            }
        };
        let key_share: HashMap<&TenantId, usize> = tenants
            .iter()
            .map(|(t, w)| (t, (config.max_keys as f64 * share(*w)).ceil() as usize))
            .collect();
        let byte_share = tenants
            .iter()
            .map(|(t, w)| (t.clone(), (config.max_bytes as f64 * share(*w)) as u64))
            .collect();
        let mut taken: HashMap<TenantId, usize> = HashMap::new();
        let mut keys = Vec::new();
        for (tenant, key) in rows {
            let Some(&cap) = key_share.get(&tenant) else {
                continue;
            };
            let n = taken.entry(tenant.clone()).or_default();
            if *n >= cap || keys.len() >= config.max_keys {
                continue;
            }
            *n += 1;
            keys.push((tenant, key));
        }
        Plan { keys, byte_share }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    fn k(s: &str) -> CacheKey {
        CacheKey::new(s).unwrap()
    }

    /// Each tenant gets its weight's part of `max_keys`; tenants not configured get
    /// nothing, whatever pulse answers.
    #[test]
    fn the_plan_keeps_each_tenants_share_of_the_keys() {
        let config = WarmupConfig {
            max_keys: 4,
            max_bytes: 1_000,
            ..WarmupConfig::default()
        };
        let tenants = [(t("a"), 3.0), (t("b"), 1.0)];
        let rows = vec![
            (t("b"), k("/b1")),
            (t("b"), k("/b2")),
            (t("x"), k("/x1")),
            (t("a"), k("/a1")),
            (t("a"), k("/a2")),
            (t("a"), k("/a3")),
            (t("a"), k("/a4")),
        ];
        let plan = Plan::new(&config, &tenants, rows);
        let keys: Vec<&str> = plan.keys.iter().map(|(_, k)| k.as_str()).collect();
        assert_eq!(keys, ["/b1", "/a1", "/a2", "/a3"]);
        assert_eq!(plan.byte_share[&t("a")], 750);
        assert_eq!(plan.byte_share[&t("b")], 250);
    }

    #[test]
    fn readyz_says_warming_then_ready() {
        let r = Readiness::default();
        assert!(r.is_ready());
        r.start_warming();
        assert_eq!(r.response().status(), StatusCode::SERVICE_UNAVAILABLE);
        r.ready("warmed");
        assert_eq!(r.response().status(), StatusCode::OK);
    }
}
