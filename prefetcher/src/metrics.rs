//! Prometheus metrics. Labels are bounded enums (cache status, failure kind) and
//! tenant ids from the configuration: never a raw key, nor a tenant read from a
//! request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::flight::FillError;
use crate::limits::{TenantFills, TenantReasonLabels};
use crate::request_head::RefusalReason;
use crate::status::{CacheStatus, ClientLimit, H2Abuse, RejectReason};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: CacheStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// A configured tenant (never one read from a request).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectLabels {
    reason: RejectReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClientLimitLabels {
    reason: ClientLimit,
}

/// The client-limit counters and the connection gauges, shared with the listeners:
/// one counter per [`ClientLimit`], created up front so counting never locks; and
/// what the guards of the proxy listeners find (HTTP/2 connections ended for abuse,
/// request heads refused before the node answered them), the same counters as the
/// node's [`Metrics::h2_connection_errors`] and [`Metrics::refusals`].
#[derive(Clone)]
pub(crate) struct ClientCounters {
    limits: Vec<Counter>,
    /// One per [`H2Abuse`], in its `ALL` order.
    h2_abuse: Vec<Counter>,
    /// One per [`RefusalReason`], in its `ALL` order.
    refused: Vec<Counter>,
    /// Open client connections (every proxy listener).
    pub(crate) open: Gauge,
    /// Client addresses tracked for the per-address limits.
    pub(crate) addresses: Gauge,
    /// TLS handshakes with clients that failed (no shared version or cipher, a
    /// client that gave up, not TLS at all).
    pub(crate) tls_handshake_failures: Counter,
}

impl Default for ClientCounters {
    /// Counters that no registry exports (listeners outside a node).
    fn default() -> Self {
        ClientCounters {
            limits: ClientLimit::ALL
                .iter()
                .map(|_| Counter::default())
                .collect(),
            h2_abuse: H2Abuse::ALL.iter().map(|_| Counter::default()).collect(),
            refused: RefusalReason::ALL
                .iter()
                .map(|_| Counter::default())
                .collect(),
            open: Gauge::default(),
            addresses: Gauge::default(),
            tls_handshake_failures: Counter::default(),
        }
    }
}

impl ClientCounters {
    /// Counts one limit that acted.
    pub(crate) fn count(&self, limit: ClientLimit) {
        self.limits[limit.index()].inc();
    }

    /// Times `limit` acted so far.
    pub(crate) fn get(&self, limit: ClientLimit) -> u64 {
        self.limits[limit.index()].get()
    }

    /// Counts one HTTP/2 connection ended for `abuse`.
    pub(crate) fn h2_connection_error(&self, abuse: H2Abuse) {
        self.h2_abuse[abuse.index()].inc();
    }

    /// HTTP/2 connections ended for `abuse` so far.
    #[cfg(test)]
    pub(crate) fn h2_connection_errors(&self, abuse: H2Abuse) -> u64 {
        self.h2_abuse[abuse.index()].get()
    }

    /// Counts one request head refused as ambiguous or smuggled.
    pub(crate) fn refused(&self, reason: RefusalReason) {
        self.refused[reason.index()].inc();
    }
}

/// Every reason a fill fails with ([`FillError::label`](crate::FillError)), each exported
/// from the start at 0 so a rate over them is a series before the first failure.
const FILL_FAILURE_REASONS: [&str; 10] = [
    "upstream_5xx",
    "connect",
    "tls",
    "timeout",
    "body",
    "truncated",
    "too_large",
    "aborted",
    "no_capacity",
    "overloaded",
];

/// The node's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    /// One counter per [`RefusalReason`], in its `ALL` order.
    requests_refused: Vec<Counter>,
    /// One counter per [`H2Abuse`], in its `ALL` order.
    h2_connection_errors: Vec<Counter>,
    /// One counter per cache status, created up front so the hot path never locks.
    requests: Vec<Counter>,
    fill_failures: Family<ReasonLabels, Counter>,
    /// Origin fills started (leaders and background refreshes, not hedges).
    pub fills_started: Counter,
    /// Fills dropped because every client that wanted them was gone and they were not
    /// worth finishing (no response yet, or one that is not stored).
    pub fills_abandoned: Counter,
    /// Requests that joined a fill in flight.
    pub waiters_joined: Counter,
    /// Waiters that hit the wait bound.
    pub wait_timeouts: Counter,
    /// Waiters that then fetched on their own.
    pub hedges: Counter,
    /// Seconds a waiter waited for the response head.
    pub wait_seconds: Histogram,
    /// Seconds from fill start to the complete body.
    pub fill_seconds: Histogram,
    /// Fills in flight.
    pub flights: Gauge,
    /// Body bytes fills in flight hold: kept for the store, and being coalesced.
    pub fill_bytes_held: Gauge,
    /// Access events dropped: the buffer was full, or Kafka did not take them in time.
    pub events_dropped: Counter,
    /// Access events Kafka acknowledged.
    pub events_published: Counter,
    prefetches_rejected: Family<RejectLabels, Counter>,
    /// Origin hints, by what became of them (`proxy::hints`).
    origin_hints: Family<ResultLabels, Counter>,
    /// Pre-warm commands read from Kafka (before any check).
    pub prefetches_received: Counter,
    /// Pre-warms that started a new (background) fill.
    pub prefetches_started: Counter,
    /// Pre-warms that joined a fill already in flight.
    pub prefetches_joined: Counter,
    /// Pre-warms for a key already fresh in the cache (nothing to do).
    pub prefetches_cached: Counter,
    /// Queued pre-warm fills promoted to user priority because a user request joined.
    pub prefetches_promoted: Counter,
    /// First user hits on pre-warmed entries.
    pub prefetches_useful: Counter,
    /// Pre-warmed entries that expired or were evicted before any user hit.
    pub prefetches_wasted: Counter,
    /// Pre-warm fills shed for lack of spare origin capacity.
    pub prefetches_shed: Counter,
    /// The adaptive prefetch fill limit.
    pub prefetch_limit: Gauge,
    /// Most concurrent origin fills (`flight.max_fills`), set at each scrape.
    pub fill_limit: Gauge,
    /// Fill slots taken (either class), set at each scrape.
    pub fills_active: Gauge,
    /// Pre-warm fills waiting for a prefetch slot.
    pub prefetch_queued: Gauge,
    /// Origin requests (fills, hedges, pass-through) whose TLS failed: an untrusted
    /// or misnamed certificate, a failed handshake.
    pub origin_tls_failures: Counter,
    /// User fills refused by configured tenant and reason (`queue_full`,
    /// `pushed_out`, `deadline`); counted by the fill limiter.
    pub tenant_fills_refused: Family<TenantReasonLabels, Counter>,
    /// Per configured tenant, set at each scrape: user fills running, waiting, its
    /// committed share of the slots, and its origin's adaptive limit.
    tenant_fills_active: Family<TenantLabels, Gauge>,
    tenant_fills_queued: Family<TenantLabels, Gauge>,
    tenant_fill_share: Family<TenantLabels, Gauge>,
    tenant_origin_fill_limit: Family<TenantLabels, Gauge>,
    /// Configuration reloads (SIGHUP) put in force.
    pub config_reloads_ok: Counter,
    /// Configuration reloads refused (the new config failed its check; the running
    /// one stays).
    pub config_reloads_refused: Counter,
    clients: ClientCounters,
    /// The warm-up at start (`crate::warmup`).
    pub warmup: crate::warmup::WarmupMetrics,
    /// Purges and their re-warms (`crate::purge`).
    pub purge: crate::purge::PurgeMetrics,
}

impl Metrics {
    /// Sets the per-tenant fill gauges to `tenants` (the configured ones only: a
    /// tenant a reload removed leaves the metrics).
    pub fn set_tenant_fills(&self, tenants: &[TenantFills]) {
        let families = [
            &self.tenant_fills_active,
            &self.tenant_fills_queued,
            &self.tenant_fill_share,
            &self.tenant_origin_fill_limit,
        ];
        for family in families {
            family.clear();
        }
        for t in tenants {
            let labels = TenantLabels {
                tenant: t.tenant.to_string(),
            };
            for (family, value) in
                families
                    .iter()
                    .zip([t.active, t.queued, t.committed, t.origin_limit])
            {
                family.get_or_create(&labels).set(value as i64);
            }
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric under the `prefetcher_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("prefetcher");
        let requests_family = Family::<StatusLabels, Counter>::default();
        let requests = CacheStatus::ALL
            .iter()
            .map(|s| {
                requests_family
                    .get_or_create(&StatusLabels { status: *s })
                    .clone()
            })
            .collect();
        registry.register(
            "requests",
            "Requests answered, by x-cache status",
            requests_family,
        );
        let refused_family = Family::<ReasonLabels, Counter>::default();
        let requests_refused: Vec<Counter> = RefusalReason::ALL
            .iter()
            .map(|r| {
                refused_family
                    .get_or_create(&ReasonLabels { reason: r.as_str() })
                    .clone()
            })
            .collect();
        registry.register(
            "requests_refused",
            "Client requests refused with 400 as ambiguous or smuggled, by reason",
            refused_family,
        );
        let h2_family = Family::<ReasonLabels, Counter>::default();
        let h2_connection_errors: Vec<Counter> = H2Abuse::ALL
            .iter()
            .map(|a| {
                h2_family
                    .get_or_create(&ReasonLabels { reason: a.as_str() })
                    .clone()
            })
            .collect();
        registry.register(
            "h2_connection_errors",
            "HTTP/2 client connections ended for misbehaving, by reason",
            h2_family,
        );
        let fill_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "fill_failures",
            "Origin fills that failed, by reason (never cached)",
            fill_failures.clone(),
        );
        let client_limits_family = Family::<ClientLimitLabels, Counter>::default();
        let clients = ClientCounters {
            limits: ClientLimit::ALL
                .iter()
                .map(|reason| {
                    client_limits_family
                        .get_or_create(&ClientLimitLabels { reason: *reason })
                        .clone()
                })
                .collect(),
            h2_abuse: h2_connection_errors.clone(),
            refused: requests_refused.clone(),
            open: Gauge::default(),
            addresses: Gauge::default(),
            tls_handshake_failures: Counter::default(),
        };
        registry.register(
            "client_tls_handshake_failures",
            "TLS handshakes with clients on the TLS listener that failed",
            clients.tls_handshake_failures.clone(),
        );
        registry.register(
            "client_limits",
            "Client connections closed or refused and requests refused by a [server] limit, by reason",
            client_limits_family,
        );
        registry.register(
            "client_connections",
            "Open client connections on the proxy listeners",
            clients.open.clone(),
        );
        registry.register(
            "client_addresses",
            "Client addresses tracked for the per-address limits",
            clients.addresses.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP), by result: ok (in force) or refused (the running \
             one kept)",
            reloads.clone(),
        );
        let m = Metrics {
            warmup: crate::warmup::WarmupMetrics::default(),
            purge: crate::purge::PurgeMetrics::default(),
            clients,
            requests,
            requests_refused,
            h2_connection_errors,
            fill_failures,
            fills_started: Counter::default(),
            fills_abandoned: Counter::default(),
            waiters_joined: Counter::default(),
            wait_timeouts: Counter::default(),
            hedges: Counter::default(),
            wait_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            fill_seconds: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            flights: Gauge::default(),
            fill_bytes_held: Gauge::default(),
            events_dropped: Counter::default(),
            events_published: Counter::default(),
            prefetches_rejected: Family::default(),
            origin_hints: Family::default(),
            prefetches_received: Counter::default(),
            prefetches_started: Counter::default(),
            prefetches_joined: Counter::default(),
            prefetches_cached: Counter::default(),
            prefetches_promoted: Counter::default(),
            prefetches_useful: Counter::default(),
            prefetches_wasted: Counter::default(),
            prefetches_shed: Counter::default(),
            prefetch_limit: Gauge::default(),
            prefetch_queued: Gauge::default(),
            fill_limit: Gauge::default(),
            fills_active: Gauge::default(),
            origin_tls_failures: Counter::default(),
            tenant_fills_refused: Family::default(),
            tenant_fills_active: Family::default(),
            tenant_fills_queued: Family::default(),
            tenant_fill_share: Family::default(),
            tenant_origin_fill_limit: Family::default(),
            config_reloads_ok: reloads.get_or_create_owned(&ResultLabels { result: "ok" }),
            config_reloads_refused: reloads
                .get_or_create_owned(&ResultLabels { result: "refused" }),
            registry: Registry::default(),
        };
        for reason in RejectReason::ALL {
            let _ = m
                .prefetches_rejected
                .get_or_create(&RejectLabels { reason });
        }
        for reason in FILL_FAILURE_REASONS {
            let _ = m.fill_failures.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "fills_started",
            "Origin fills started",
            m.fills_started.clone(),
        );
        registry.register(
            "fills_abandoned",
            "Fills dropped once no client wanted them and they were not worth finishing",
            m.fills_abandoned.clone(),
        );
        registry.register(
            "waiters_joined",
            "Requests that joined a fill in flight",
            m.waiters_joined.clone(),
        );
        registry.register(
            "wait_timeouts",
            "Waiters released by the wait bound",
            m.wait_timeouts.clone(),
        );
        registry.register(
            "hedges",
            "Waiters that fetched on their own after the wait bound",
            m.hedges.clone(),
        );
        registry.register(
            "wait_seconds",
            "Time a waiter waited for the shared response head",
            m.wait_seconds.clone(),
        );
        registry.register(
            "fill_seconds",
            "Origin fill time, start to complete body",
            m.fill_seconds.clone(),
        );
        registry.register("flights", "Fills in flight", m.flights.clone());
        registry.register(
            "fill_bytes_held",
            "Body bytes fills in flight hold (kept for the store, and being coalesced)",
            m.fill_bytes_held.clone(),
        );
        registry.register(
            "events_dropped",
            "Access events dropped: buffer full, or not delivered to Kafka in time",
            m.events_dropped.clone(),
        );
        registry.register(
            "events_published",
            "Access events acknowledged by Kafka",
            m.events_published.clone(),
        );
        registry.register(
            "prefetches_received",
            "Pre-warm commands read from Kafka",
            m.prefetches_received.clone(),
        );
        registry.register(
            "prefetches_rejected",
            "Pre-warm commands refused, by reason",
            m.prefetches_rejected.clone(),
        );
        registry.register(
            "origin_hints",
            "Successors named by origin responses (Link rel=prefetch/next), by result",
            m.origin_hints.clone(),
        );
        for (name, help, counter) in [
            (
                "prefetches_started",
                "Pre-warms that started a background fill",
                &m.prefetches_started,
            ),
            (
                "prefetches_joined",
                "Pre-warms that joined a fill in flight",
                &m.prefetches_joined,
            ),
            (
                "prefetches_cached",
                "Pre-warms for a key already fresh in the cache",
                &m.prefetches_cached,
            ),
            (
                "prefetches_promoted",
                "Queued pre-warm fills raised to user priority by a joining user request",
                &m.prefetches_promoted,
            ),
            (
                "prefetches_useful",
                "First user hits on pre-warmed entries",
                &m.prefetches_useful,
            ),
            (
                "prefetches_wasted",
                "Pre-warmed entries expired or evicted before any user hit",
                &m.prefetches_wasted,
            ),
            (
                "prefetches_shed",
                "Pre-warm fills shed for lack of spare origin capacity",
                &m.prefetches_shed,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "prefetch_limit",
            "Adaptive limit of concurrent pre-warm fills",
            m.prefetch_limit.clone(),
        );
        registry.register(
            "prefetch_queued",
            "Pre-warm fills waiting for a prefetch slot",
            m.prefetch_queued.clone(),
        );
        registry.register(
            "fill_limit",
            "Most concurrent origin fills (flight.max_fills)",
            m.fill_limit.clone(),
        );
        registry.register(
            "fills_active",
            "Origin fill slots taken, user and prefetch",
            m.fills_active.clone(),
        );
        registry.register(
            "tenant_fills_refused",
            "User fills refused by tenant and reason (queue_full, pushed_out, deadline)",
            m.tenant_fills_refused.clone(),
        );
        for (name, help, family) in [
            (
                "tenant_fills_active",
                "User fills running, by tenant",
                &m.tenant_fills_active,
            ),
            (
                "tenant_fills_queued",
                "User fills waiting for a slot, by tenant",
                &m.tenant_fills_queued,
            ),
            (
                "tenant_fill_share",
                "A tenant's committed share of the fill slots",
                &m.tenant_fill_share,
            ),
            (
                "tenant_origin_fill_limit",
                "Adaptive limit of concurrent user fills to a tenant's origin",
                &m.tenant_origin_fill_limit,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "origin_tls_failures",
            "Origin requests whose TLS failed (untrusted or misnamed certificate, handshake)",
            m.origin_tls_failures.clone(),
        );
        m.warmup.register(&mut registry);
        m.purge.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Counts one answered request.
    pub fn request(&self, status: CacheStatus) {
        self.requests[status.index()].inc();
    }

    /// Requests answered with `status` so far.
    pub fn requests(&self, status: CacheStatus) -> u64 {
        self.requests[status.index()].get()
    }

    /// Counts one request refused as ambiguous or smuggled.
    pub fn refused(&self, reason: RefusalReason) {
        self.requests_refused[reason.index()].inc();
    }

    /// Requests refused for `reason` so far.
    pub fn refusals(&self, reason: RefusalReason) -> u64 {
        self.requests_refused[reason.index()].get()
    }

    /// Counts one HTTP/2 connection ended for `abuse`.
    pub fn h2_connection_error(&self, abuse: H2Abuse) {
        self.h2_connection_errors[abuse.index()].inc();
    }

    /// HTTP/2 connections ended for `abuse` so far.
    pub fn h2_connection_errors(&self, abuse: H2Abuse) -> u64 {
        self.h2_connection_errors[abuse.index()].get()
    }

    /// Counts one client limit that acted.
    pub fn client_limit(&self, limit: ClientLimit) {
        self.clients.count(limit);
    }

    /// Times the client limit `limit` acted so far.
    pub fn client_limits(&self, limit: ClientLimit) -> u64 {
        self.clients.get(limit)
    }

    /// Open client connections on the proxy listeners.
    pub fn client_connections(&self) -> i64 {
        self.clients.open.get()
    }

    pub(crate) fn client_counters(&self) -> ClientCounters {
        self.clients.clone()
    }

    /// Counts one failed fill.
    pub fn fill_failed(&self, error: &FillError) {
        self.fill_failures
            .get_or_create(&ReasonLabels {
                reason: error.label(),
            })
            .inc();
    }

    /// Counts `n` origin hints with `result` (a bounded label of `proxy::hints`).
    pub(crate) fn origin_hint(&self, result: &'static str, n: u64) {
        self.origin_hints
            .get_or_create(&ResultLabels { result })
            .inc_by(n);
    }

    /// Origin hints counted with `result` so far.
    pub fn origin_hints(&self, result: &'static str) -> u64 {
        self.origin_hints
            .get_or_create(&ResultLabels { result })
            .get()
    }

    /// Counts one refused pre-warm command.
    pub fn prewarm_rejected(&self, reason: RejectReason) {
        self.prefetches_rejected
            .get_or_create(&RejectLabels { reason })
            .inc();
    }

    /// Pre-warm commands refused so far for the reason labelled `label` (as
    /// `/metrics` shows it); 0 for a label that names no [`RejectReason`].
    pub fn prewarm_rejections(&self, label: &str) -> u64 {
        RejectReason::parse(label).map_or(0, |reason| {
            self.prefetches_rejected
                .get_or_create(&RejectLabels { reason })
                .get()
        })
    }

    /// Failed fills so far, all reasons.
    pub fn fill_failures(&self) -> u64 {
        FILL_FAILURE_REASONS
            .into_iter()
            .map(|reason| {
                self.fill_failures
                    .get_or_create(&ReasonLabels { reason })
                    .get()
            })
            .sum()
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_bounded_labels_only() {
        let m = Metrics::new();
        m.request(CacheStatus::Collapsed);
        m.fill_failed(&FillError::Upstream(503));
        m.wait_seconds.observe(0.2);
        let text = m.encode();
        assert!(
            text.contains(r#"prefetcher_requests_total{status="COLLAPSED"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"prefetcher_fill_failures_total{reason="upstream_5xx"} 1"#));
        assert!(text.contains("prefetcher_wait_seconds_bucket"));
        assert_eq!(m.fill_failures(), 1);
        assert_eq!(m.requests(CacheStatus::Collapsed), 1);
        m.refused(RefusalReason::LengthAndChunked);
        m.h2_connection_error(H2Abuse::RapidReset);
        let text = m.encode();
        assert!(
            text.contains(r#"prefetcher_requests_refused_total{reason="length_and_chunked"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"prefetcher_requests_refused_total{reason="bare_lf"} 0"#));
        assert!(text.contains(r#"prefetcher_h2_connection_errors_total{reason="rapid_reset"} 1"#));
        assert_eq!(m.refusals(RefusalReason::LengthAndChunked), 1);
        assert_eq!(m.h2_connection_errors(H2Abuse::RapidReset), 1);
    }

    #[test]
    fn tenant_gauges_show_the_configured_tenants_of_the_last_scrape() {
        let m = Metrics::new();
        let fills = |name: &str, active| crate::limits::TenantFills {
            tenant: models::TenantId::new(name).unwrap(),
            committed: 8,
            active,
            queued: 2,
            origin_limit: 5,
        };
        m.set_tenant_fills(&[fills("a", 3), fills("b", 1)]);
        let text = m.encode();
        assert!(
            text.contains(r#"prefetcher_tenant_fills_active{tenant="a"} 3"#),
            "{text}"
        );
        assert!(text.contains(r#"prefetcher_tenant_origin_fill_limit{tenant="b"} 5"#));
        m.set_tenant_fills(&[fills("b", 0)]);
        let text = m.encode();
        assert!(
            !text.contains(r#"tenant="a""#),
            "a left the configuration: {text}"
        );
        assert!(text.contains(r#"prefetcher_tenant_fills_active{tenant="b"} 0"#));
    }
}
