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
//! - `origin`: [`OriginClient`] (timeouts, pooled connections) and [`Tenant`].
//! - `limits`: [`FillLimiter`], the user and prefetch classes of origin fills (the
//!   adaptive prefetch limit, shedding, `Retry-After` under overload).
//! - `proxy`: [`Node`] and its routers [`app`], [`admin_app`]; by job:
//!   `proxy::request` (limits, tenant routing, lookup, lead/join), `proxy::response`
//!   (hit/stale/collapsed responses, `Age`, `x-cache`), `proxy::fill` (origin fetch,
//!   streaming, cache write), `proxy::prewarm` ([`Node::prewarm`]).
//! - `faults` (feature `testing`): the seam where tests make a fill task panic
//!   (`Node::panic_next_fill`); the proxy owns it, `testing` re-exports it.
//! - `events`: the [`EventSink`] hook for access events, stamped at answer time.
//! - `publisher`: [`EventPublisher`], access events to Kafka (bounded, never blocking).
//! - `prewarm`: [`PrewarmConsumer`], pre-warm commands from Kafka, checked and counted.
//! - `run`: [`spawn_node`], a whole node (listeners, publisher, consumer) in-process.
//! - `metrics`: Prometheus [`Metrics`].
//! - `server`: [`serve_node`] (the proxy listener) and [`serve`] (a router): HTTP/1.1
//!   + h2c, graceful shutdown.
//! - `testing` (feature `testing`): a synthetic origin, test clients, a node runner.
//!
//! Modules depend on each other without a cycle, and no production module names
//! `testing` (checked by a unit test below). `status`, `config`, `events`,
//! `semantics` and `flight` depend on no other module; `limits`, `cache`, `metrics`, `origin` and `faults` on
//! those; `publisher` on `config`, `events`, `metrics`; `proxy` on everything so far
//! but `publisher`; `server` on `proxy`; `prewarm` on `proxy`, `publisher` and below;
//! `run` on all but `testing`, which is on top.

mod cache;
mod config;
mod events;
#[cfg(feature = "testing")]
mod faults;
mod flight;
mod limits;
mod metrics;
mod origin;
mod prewarm;
mod proxy;
mod publisher;
mod run;
mod semantics;
mod server;
mod status;
#[cfg(feature = "testing")]
pub mod testing;

pub use cache::{Entry, Freshness, L1Cache, Lookup, Storability, classify, origin_age, xfetch_due};
pub use config::{
    CacheConfig, Config, ConfigError, FlightConfig, KafkaConfig, OffsetReset, OriginConfig,
    PrefetchConfig, RequestLimits, TenantConfig, WaitTimeoutPolicy,
};
pub use events::{ChannelSink, Dropped, EventSink, NoopSink, OutcomeRecord};
pub use flight::{
    Acquire, FillError, FillPermit, FlightKey, FlightRegistry, FlightSubscriber, Head, HeadOutcome,
    VaryMatch,
};
pub use limits::{FillClass, FillLimiter, FillSlot, retry_after_secs};
pub use metrics::Metrics;
pub use models::Priority;
pub use origin::{
    ClientAddr, OriginClient, Tenant, fill_headers, forwarded_headers, prewarm_headers,
};
pub use prewarm::{PrewarmConsumer, handle_prewarm};
pub use proxy::{Node, PrewarmError, PrewarmOutcome, admin_app, app, normalise_key};
pub use publisher::EventPublisher;
pub use run::{NodeHandle, NodeOptions, StartError, spawn_node, spawn_node_with};
pub use semantics::{
    CDN_CACHE_CONTROL, EDGE_PULSE_CACHE_CONTROL, MAX_AGE_SECS, RequestDirectives,
    ResponseDirectives, UNKEYED_REWRITES, Vary, add_via, age_of, is_conditional,
    merge_not_modified, normalise_accept_encoding, not_modified, not_modified_headers,
    strip_hop_by_hop, variant_of,
};
pub use server::{ServeOptions, serve, serve_node, shutdown_signal};
pub use status::{CacheStatus, RejectReason, X_CACHE};

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Each module (a `src/x.rs` file, or a `src/x/` folder taken as one) and the
    /// modules its code names by `crate::name`, test code included; comments are
    /// skipped. The crate root only re-exports, so it is left out.
    fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                for inner in std::fs::read_dir(&path).unwrap() {
                    files.push((path.clone(), inner.unwrap().path()));
                }
            } else {
                files.push((path.clone(), path));
            }
        }
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module_path, file) in files {
            let module = module_path
                .file_stem()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let uses = graph.entry(module.clone()).or_default();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + "crate::".len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name != module {
                        uses.insert(name);
                    }
                }
            }
        }
        graph
    }

    /// A cycle in `graph` as the path of modules around it, if there is one.
    fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| p == node) {
                let mut cycle = path[at..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            if done.contains(node) {
                return None;
            }
            path.push(node.to_string());
            for next in graph.get(node).into_iter().flatten() {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(node.to_string());
            None
        }
        let mut done = BTreeSet::new();
        graph
            .keys()
            .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
    }

    #[test]
    fn modules_form_no_cycle_and_production_code_never_names_the_test_harness() {
        let graph = module_graph();
        assert!(graph.contains_key("proxy") && graph.contains_key("testing"));
        for (module, uses) in &graph {
            for name in uses {
                // A path through a root re-export (`crate::Node`) would hide an edge.
                assert!(
                    graph.contains_key(name),
                    "{module} names crate::{name}, which is no module"
                );
            }
            assert!(
                module == "testing" || !uses.contains("testing"),
                "{module} depends on the test harness"
            );
        }
        assert_eq!(find_cycle(&graph), None, "module graph: {graph:#?}");
    }

    #[test]
    fn the_cycle_check_finds_a_cycle() {
        let graph: BTreeMap<String, BTreeSet<String>> = [
            ("a", vec!["b"]),
            ("b", vec!["c"]),
            ("c", vec!["a"]),
            ("d", vec![]),
        ]
        .into_iter()
        .map(|(m, uses)| (m.into(), uses.into_iter().map(String::from).collect()))
        .collect();
        assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    }
}
