//! The edge caching proxy: an L1 cache in front of an origin, with single-flight
//! request collapsing at every node and, in shield mode, again at a regional tier
//! (a node whose origin is another node).
//!
//! A request's tenant comes only from the configured host mapping. `GET`/`HEAD`
//! without credentials are looked up in the [`L1Cache`]; a miss atomically leads or
//! joins the fill for its [`FlightKey`] in the [`FlightRegistry`]. The fill runs in its
//! own task and streams the response to every subscriber; errors are never cached.
//! Every response says how it was answered in `x-cache` ([`CacheStatus`]).
//!
//! # Layout
//! - `config/`: [`Config`] (TOML, defaults, `validate()`, deprecated fields carried
//!   over), one file per part of the node: `client` (`[tls]`, `[limits]`, `[server]`,
//!   `[http2]`), `caching` (`[cache]`, `[flight]`, `[prefetch]`), `kafka`, `origin`.
//! - `status`: the `x-cache` vocabulary ([`X_CACHE`], [`CacheStatus`]), the
//!   pre-warm [`RejectReason`]s, [`H2Abuse`] and [`ClientLimit`], each its own metric
//!   label.
//! - `request_head`: [`check_request_head`] and the rules it shares with parsed
//!   requests: ambiguous and smuggled request heads refused ([`RefusalReason`]).
//! - `cache_key`: [`normalise_key`], a request target's cache key (the proxy's and
//!   the edge agent's), and [`check_target`], the one check of every forwarded target.
//! - `semantics`: HTTP caching rules that need no state (RFC 9111 directives, the
//!   RFC 9213 targeted fields, `Age`, `Vary` and variant keys, hop-by-hop fields,
//!   conditional requests, the `304` merge).
//! - `cache/`: [`L1Cache`] (`mod`: the store and the variants of each URL), `entry`
//!   ([`Entry`], [`Freshness`]), `freshness` ([`classify`], jitter, stale windows,
//!   [`xfetch_due`]).
//! - `flight/`: [`FlightRegistry`], [`FillPermit`], [`FlightSubscriber`],
//!   [`FillError`]; its invariants' tests in `flight/tests.rs`.
//! - `forward`: what an origin is told: [`ForwardFields`] (the allowlist of a fill,
//!   what pass-through drops, the variant of what a fill sends), [`TrustedProxies`]
//!   and [`Peer`] (client hops, the request's [`Scheme`]).
//! - `origin`: [`OriginClient`] (timeouts, pooled connections, `http://` and
//!   `https://`) and [`Tenant`].
//! - `tls`: rustls configurations: the client listener's (certificate and key files,
//!   ALPN) and the origin client's (system roots or `origin.ca_file`, server names).
//! - `limits/`: [`FillLimiter`], origin fill slots: `shares` (per-tenant committed
//!   shares, borrowing, deficit round robin, priority classes, `Retry-After`),
//!   `adaptive` (the latency-following limit of each origin and of pre-warm fills).
//!   About origin fills, not client connections: outside `listener/`.
//! - `listener/`: the client listeners, accepting, admitting, guarding and
//!   supervising connections: `mod` ([`serve`], [`ServeOptions`], the accept loop,
//!   graceful shutdown, [`shutdown_signal`]), `activity` (what a connection did),
//!   `admission` ([`ConnectionLimiter`]: connections per node and per address, an
//!   address's request rate), `supervise` (one sweeper per listener: the header,
//!   idle and send timeouts, the one stall detector of HTTP/1 and HTTP/2, the drain),
//!   `gate` (per-request rate and header-count checks, the one response-body
//!   wrapper), `guard` (HTTP/1 heads checked on the raw bytes), `h2_abuse` (HTTP/2
//!   connection errors by [`H2Abuse`]), `fills` (the origin fills a connection and
//!   an address lead, and a connection that keeps cancelling its own), `io` (counted
//!   sockets, the first head read apart).
//! - `proxy/`: [`Node`] and its routers [`app`], [`admin_app`]; by job:
//!   `proxy::request` (limits, tenant routing, lookup, lead/join), `proxy::response`
//!   (hit/stale/collapsed responses, `Age`, `x-cache`), `proxy::fill` (origin fetch,
//!   streaming, cache write), `proxy::pass_through` (to the origin, unsafe-method
//!   invalidation), `proxy::prewarm` ([`Node::prewarm`]), `proxy::serve`
//!   ([`serve_node`], [`serve_node_tls`]: the node behind its listeners).
//! - `faults` (feature `testing`): the seam where tests make a fill task panic
//!   (`Node::panic_next_fill`); the proxy owns it, `testing` re-exports it.
//! - `events`: the [`EventSink`] hook for access events, stamped at answer time.
//! - `publisher`: [`EventPublisher`], access events to Kafka (bounded, never blocking).
//! - `prewarm`: [`PrewarmConsumer`], pre-warm commands from Kafka, checked (signature
//!   first, [`check_signature`], when keys are configured) and counted.
//! - `purge`: the purge model ([`PurgeRequest`], [`rewarm_plan`], [`PurgeMetrics`]):
//!   a tenant's prefix invalidated, hard or soft, and re-warmed over a window with
//!   jitter; done by `Node::purge` (`proxy`), asked by `POST /purge` or a signed
//!   command (`prewarm`).
//! - `run`: [`spawn_node`], a whole node (listeners, publisher, consumer, warm-up)
//!   in-process.
//! - `warmup`: the warm-up at start, the node's and the edge agent's: the region's hot
//!   keyset asked of pulse, filled before `/readyz` says ready ([`Readiness`]).
//! - `reload`: [`check_config`] (everything a start checks, binding and connecting
//!   nothing) and [`NodeHandle::reload`]: a new configuration for new requests, in
//!   flight ones finishing on the old.
//! - `changes`: what a reload changed ([`Reloaded`]: applied, or needing a restart),
//!   logged and counted alike for the node and the edge agent.
//! - `logging`: [`init_logging`], the binaries' log lines as text or JSON
//!   ([`LogEncoding`]).
//! - `metrics`: Prometheus [`Metrics`].
//! - `testing` (feature `testing`): a synthetic origin, test clients, a node runner.
//! - `agent/`: the edge agent beside an nginx or Varnish node ([`spawn_agent`]): its
//!   access log to access events (`agent::lines`), pre-warm commands to requests to
//!   the local cache.
//!
//! Modules depend on each other without a cycle, and no production module names
//! `testing` (checked by `tests/tests/module_graph/`). `status`, `config`, `events`,
//! `semantics`, `flight`, `request_head` and `cache_key` depend on no other module;
//! `purge` on `status`;
//! `tls` on `config`; `forward` on `config`, `flight`, `semantics`; `limits`,
//! `cache`, `metrics`, `origin` and `faults` on those;
//! `listener` on `config`, `metrics`, `origin`, `request_head`, `status` (and on no
//! `proxy`); `publisher` on `config`, `events`, `metrics`; `proxy` on everything so
//! far but `publisher` (it plugs the node into `listener`); `prewarm` on `proxy`,
//! `publisher` and below; `logging` on nothing, `changes` on `config` and `metrics`;
//! `reload` on `proxy`, `publisher`, `changes` and below; `run` on all but `testing`, which is on top; `agent` on
//! `listener`, `publisher`, `prewarm`, `limits`, `cache_key`, `changes` and below
//! (nothing of `proxy`), and nothing on it.

mod agent;
mod cache;
mod cache_key;
mod changes;
mod config;
mod events;
#[cfg(feature = "testing")]
mod faults;
mod flight;
mod forward;
mod limits;
mod listener;
mod logging;
mod metrics;
mod origin;
mod prewarm;
mod proxy;
mod publisher;
mod purge;
mod reload;
mod request_head;
mod run;
mod semantics;
mod status;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;
mod warmup;

pub use agent::{
    AgentConfig, AgentError, AgentHandle, AgentMetrics, AgentTenant, FollowStats, Line, LineMapper,
    LogFollower, LogFormat, MalformedLine, Position, SkipReason, WarmConfig, check_agent_config,
    spawn_agent,
};
pub use cache::{Entry, Freshness, L1Cache, Lookup, Storability, classify, origin_age, xfetch_due};
pub use cache_key::{TargetError, check_target, normalise_key};
pub use changes::Reloaded;
pub use config::FillFields;
pub use config::{
    CacheConfig, Config, ConfigError, ConnectionLimits, FlightConfig, Http2Config, KafkaConfig,
    OffsetReset, OriginConfig, OriginHintsConfig, PrefetchConfig, PurgeConfig, RequestLimits,
    RouteConfig, TenantConfig, TlsListenConfig, TrafficClass, WaitTimeoutPolicy, WarmupConfig,
    class_of,
};
pub use events::{ChannelSink, Dropped, EventSink, NoopSink, OutcomeRecord, OutcomeRef};
pub use flight::{
    Acquire, FillError, FillPermit, FlightKey, FlightRegistry, FlightSubscriber, Head, HeadOutcome,
    Scheme, VaryMatch,
};
pub use forward::{
    CLIENT_HOPS, ClientAddr, FILL_FIELDS, ForwardFields, NOT_ON_FILLS, Peer, TrustedProxies,
    prewarm_headers,
};
pub use limits::{
    FillClass, FillLimiter, FillSlot, TenantFills, TenantReasonLabels, retry_after_secs,
};
pub use listener::{ConnectionLimiter, ServeOptions, serve, shutdown_signal};
pub use logging::{LOG_FORMAT_ENV, LogEncoding, init_logging};
pub use metrics::Metrics;
pub use models::Priority;
pub use origin::{OriginClient, Tenant};
pub use prewarm::{PrewarmConsumer, check_prewarm, check_signature, handle_prewarm, handle_purge};
pub use proxy::{Node, PrewarmError, PrewarmOutcome, admin_app, app, serve_node, serve_node_tls};
pub use publisher::EventPublisher;
pub use purge::{PurgeError, PurgeMetrics, PurgeReport, PurgeRequest, rewarm_plan};
pub use reload::{check_config, report_check, until_shutdown};
pub use request_head::{
    CheckedHead, Framing, HeadCheck, MAX_HEAD_FIELDS, RefusalReason, check_request_head,
};
pub use run::{NodeHandle, NodeOptions, StartError, spawn_node, spawn_node_with};
pub use semantics::{
    CDN_CACHE_CONTROL, EDGE_PULSE_CACHE_CONTROL, MAX_AGE_SECS, RequestDirectives,
    ResponseDirectives, UNKEYED_REWRITES, Vary, add_via, age_of, is_conditional,
    merge_not_modified, normalise_accept_encoding, not_modified, not_modified_headers,
    strip_hop_by_hop, variant_of,
};
pub use status::{CacheStatus, ClientLimit, H2Abuse, RejectReason, X_CACHE};
pub use warmup::{Readiness, WarmFill, WarmupMetrics};
