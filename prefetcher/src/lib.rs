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
//! - `config`: [`Config`] (TOML, defaults, `validate()`).
//! - `status`: the `x-cache` vocabulary ([`X_CACHE`], [`CacheStatus`]) and the
//!   pre-warm [`RejectReason`]s, each its own metric label.
//! - `semantics`: HTTP caching rules that need no state (RFC 9111 directives, the
//!   RFC 9213 targeted fields, `Age`, `Vary` and variant keys, hop-by-hop fields,
//!   conditional requests, the `304` merge).
//! - `cache`: [`L1Cache`] (entries and the variants of each URL), freshness,
//!   jitter, stale windows, XFetch.
//! - `flight`: [`FlightRegistry`], [`FillPermit`], [`FlightSubscriber`], [`FillError`].
//! - `origin`: [`OriginClient`] (timeouts, pooled connections, `http://` and
//!   `https://`) and [`Tenant`].
//! - `tls`: rustls configurations: the client listener's (certificate and key files,
//!   ALPN) and the origin client's (system roots or `origin.ca_file`, server names).
//! - `limits`: [`FillLimiter`], the user and prefetch classes of origin fills (the
//!   adaptive prefetch limit, shedding, `Retry-After` under overload).
//! - `admission`: [`ConnectionLimiter`], the client connections the node and one
//!   address may hold, and an address's request rate.
//! - `supervise`: client connections under supervision: header, idle and send
//!   timeouts by one sweeper per listener, the per-request rate and header-count
//!   checks, the drain at shutdown.
//! - `proxy`: [`Node`] and its routers [`app`], [`admin_app`]; by job:
//!   `proxy::head` ([`check_request_head`]: ambiguous and smuggled request heads
//!   refused), `proxy::request` (limits, tenant routing, lookup, lead/join), `proxy::response`
//!   (hit/stale/collapsed responses, `Age`, `x-cache`), `proxy::fill` (origin fetch,
//!   streaming, cache write), `proxy::prewarm` ([`Node::prewarm`]).
//! - `faults` (feature `testing`): the seam where tests make a fill task panic
//!   (`Node::panic_next_fill`); the proxy owns it, `testing` re-exports it.
//! - `events`: the [`EventSink`] hook for access events, stamped at answer time.
//! - `publisher`: [`EventPublisher`], access events to Kafka (bounded, never blocking).
//! - `prewarm`: [`PrewarmConsumer`], pre-warm commands from Kafka, checked and counted.
//! - `run`: [`spawn_node`], a whole node (listeners, publisher, consumer) in-process.
//! - `metrics`: Prometheus [`Metrics`].
//! - `guard`: per-connection guards of the proxy listeners: HTTP/1 heads checked on
//!   the raw bytes, HTTP/2 send stalls, HTTP/2 connection errors by [`H2Abuse`].
//! - `server`: [`serve_node`] (the proxy listener), [`serve_node_tls`] (the same over
//!   TLS) and [`serve`] (a router): HTTP/1.1 + h2c (h2 by ALPN over TLS), graceful
//!   shutdown.
//! - `testing` (feature `testing`): a synthetic origin, test clients, a node runner.
//! - `agent`: the edge agent beside an nginx or Varnish node ([`spawn_agent`]): its
//!   access log to access events, pre-warm commands to requests to the local cache.
//!
//! Modules depend on each other without a cycle, and no production module names
//! `testing` (checked by `tests/tests/module_graph.rs`). `status`, `config`, `events`,
//! `semantics` and `flight` depend on no other module; `tls` on `config`; `limits`,
//! `cache`, `metrics`, `origin` and `faults` on those; `admission` on `config`,
//! `metrics`, `status`; `supervise` on `admission` and below; `publisher` on `config`,
//! `events`, `metrics`; `proxy` on everything so far
//! but `publisher` and `supervise`; `guard` on `proxy`; `server` on `guard`, `proxy` and `supervise`; `prewarm` on `proxy`, `publisher` and below;
//! `run` on all but `testing`, which is on top; `agent` on `publisher`, `prewarm`,
//! `limits`, `proxy` (key normalisation) and below, and nothing on it.

mod agent;
mod cache;
mod cache_key;
mod config;
mod events;
#[cfg(feature = "testing")]
mod faults;
mod flight;
mod limits;
mod listener;
mod metrics;
mod origin;
mod prewarm;
mod proxy;
mod publisher;
mod request_head;
mod run;
mod semantics;
mod status;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

pub use agent::{
    AgentConfig, AgentError, AgentHandle, AgentMetrics, AgentTenant, FollowStats, Line, LineMapper,
    LogFollower, LogFormat, MalformedLine, Position, SkipReason, WarmConfig, spawn_agent,
};
pub use cache::{Entry, Freshness, L1Cache, Lookup, Storability, classify, origin_age, xfetch_due};
pub use cache_key::normalise_key;
pub use config::{
    CacheConfig, Config, ConfigError, ConnectionLimits, FlightConfig, Http2Config, KafkaConfig,
    OffsetReset, OriginConfig, PrefetchConfig, RequestLimits, TenantConfig, TlsListenConfig,
    WaitTimeoutPolicy,
};
pub use events::{ChannelSink, Dropped, EventSink, NoopSink, OutcomeRecord, OutcomeRef};
pub use flight::{
    Acquire, FillError, FillPermit, FlightKey, FlightRegistry, FlightSubscriber, Head, HeadOutcome,
    VaryMatch,
};
pub use limits::{FillClass, FillLimiter, FillSlot, retry_after_secs};
pub use listener::{ConnectionLimiter, ServeOptions, serve, shutdown_signal};
pub use metrics::Metrics;
pub use models::Priority;
pub use origin::{
    ClientAddr, OriginClient, Tenant, fill_headers, forwarded_headers, prewarm_headers,
};
pub use prewarm::{PrewarmConsumer, check_prewarm, handle_prewarm};
pub use proxy::{Node, PrewarmError, PrewarmOutcome, admin_app, app, serve_node, serve_node_tls};
pub use publisher::EventPublisher;
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
