//! The agent's own metrics (`edge_agent_` prefix). The event and pre-warm counters
//! it shares with the prefetcher (`prefetcher_events_published_total`,
//! `prefetcher_events_dropped_total`, `prefetcher_prefetches_*`) stay in the
//! prefetcher's [`Metrics`](crate::Metrics), so dashboards read both kinds of edge
//! the same way; `/metrics` serves the two registries one after the other.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::formats::SkipReason;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SkipLabels {
    reason: &'static str,
}

/// Counters of the log follower and the pre-warm requests.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// Complete lines read from the log.
    pub lines_read: Counter,
    /// Lines that are not a log line of the format (or overlong), skipped.
    pub lines_malformed: Counter,
    skipped: Family<SkipLabels, Counter>,
    /// Events handed to the publisher.
    pub events_queued: Counter,
    /// Rename rotations followed.
    pub rotations: Counter,
    /// Truncations (copy-truncate) followed.
    pub truncations: Counter,
    /// Bytes of the log consumed (the read position in the current file).
    pub read_offset: Gauge,
    /// Bytes of the current log file not read yet: how far the agent is behind.
    pub lag_bytes: Gauge,
    /// Pre-warm requests the node answered without a server error.
    pub warms_ok: Counter,
    /// Pre-warm requests that failed (5xx, timeout, connection).
    pub warms_failed: Counter,
    /// Seconds a pre-warm request took, slot wait excluded.
    pub warm_seconds: Histogram,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics::new()
    }
}

impl AgentMetrics {
    /// Registers every metric under the `edge_agent_` prefix.
    pub fn new() -> AgentMetrics {
        let mut registry = Registry::with_prefix("edge_agent");
        let m = AgentMetrics {
            registry: Registry::default(),
            lines_read: Counter::default(),
            lines_malformed: Counter::default(),
            skipped: Family::default(),
            events_queued: Counter::default(),
            rotations: Counter::default(),
            truncations: Counter::default(),
            read_offset: Gauge::default(),
            lag_bytes: Gauge::default(),
            warms_ok: Counter::default(),
            warms_failed: Counter::default(),
            warm_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        };
        for reason in SkipReason::ALL {
            let _ = m.skipped.get_or_create(&SkipLabels {
                reason: reason.as_str(),
            });
        }
        for (name, help, counter) in [
            (
                "lines_read",
                "Complete lines read from the access log",
                &m.lines_read,
            ),
            (
                "lines_malformed",
                "Lines skipped as not of the log format (or overlong)",
                &m.lines_malformed,
            ),
            (
                "events_queued",
                "Access events handed to the publisher",
                &m.events_queued,
            ),
            (
                "rotations",
                "Rename rotations of the log followed",
                &m.rotations,
            ),
            (
                "truncations",
                "Truncations of the log followed",
                &m.truncations,
            ),
            (
                "warms_ok",
                "Pre-warm requests the node answered",
                &m.warms_ok,
            ),
            (
                "warms_failed",
                "Pre-warm requests that failed (5xx, timeout, connection)",
                &m.warms_failed,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "lines_skipped",
            "Well-formed lines that make no event, by reason",
            m.skipped.clone(),
        );
        registry.register(
            "read_offset_bytes",
            "Read position in the current log file",
            m.read_offset.clone(),
        );
        registry.register(
            "log_lag_bytes",
            "Bytes of the current log file not read yet",
            m.lag_bytes.clone(),
        );
        registry.register(
            "warm_seconds",
            "Pre-warm request time, slot wait excluded",
            m.warm_seconds.clone(),
        );
        AgentMetrics { registry, ..m }
    }

    /// Counts one line that makes no event.
    pub fn skipped(&self, reason: SkipReason) {
        self.skipped
            .get_or_create(&SkipLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Lines skipped for `reason` so far.
    pub fn skips(&self, reason: SkipReason) -> u64 {
        self.skipped
            .get_or_create(&SkipLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// The Prometheus text exposition (with its `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
