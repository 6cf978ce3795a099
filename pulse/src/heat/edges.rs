//! Counters per kind of edge ([`EdgeKind`]: prefetcher, nginx, Varnish, other, and
//! events that do not say): events by outcome, bytes, a recent rate and the nodes seen
//! recently. What the dashboard shows side by side (`GET /api/edges`).
//!
//! # Invariants
//! 1. Every event the heat map applies counts once, in its kind's slot (an event
//!    without `edge` in the `unspecified` one), and in no other.
//! 2. `hits + misses + prefetch_fills == events`; `hit_ratio` is `hits` over demand
//!    (every outcome but `prefetch_fill`), and `None` without demand.
//! 3. `rate_per_s` is the events stamped in the last [`RATE_WINDOW_S`] seconds of event
//!    time (the current second included) over that window: it falls to zero when a
//!    kind goes quiet while the watermark moves on. Events older than the ring still
//!    count in the totals, not in the rate.
//! 4. `nodes` is the number of distinct nodes of the kind with an event in the last
//!    [`NODE_WINDOW_S`] seconds of event time, however their events interleave.
//! 5. Memory is bounded: at most [`MAX_NODES_PER_EDGE`] nodes are remembered per kind;
//!    past it (after forgetting the silent ones) a new node is not counted, and
//!    `nodes_capped` says so for the next [`NODE_WINDOW_S`] seconds.
//!
//! # Cost per event
//! This runs on the sketch path, once per applied event: an index by the kind's
//! discriminant (no lookup by name), one add per counter, a compare and an add on the
//! rate ring, and a byte compare of the node id with the kind's previous node. Only
//! when the node differs from the previous event's (or once per second of event time
//! for a run of one node) is the node's id hashed into the kind's small map.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use models::{AccessEventRef, EdgeKind, MAX_ID_LEN, Outcome};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::sketch::{OUTCOMES, key_hash, outcome_index};
use super::view::OutcomeCounts;

/// The slots: one per [`EdgeKind`], then one for events that name none.
const EDGE_SLOTS: usize = EdgeKind::ALL.len() + 1;
/// The slot of events without `edge`.
const UNSPECIFIED: usize = EdgeKind::ALL.len();
/// Seconds of event time `rate_per_s` averages over.
pub(crate) const RATE_WINDOW_S: u64 = 10;
/// Seconds of event time a node counts in `nodes` after its last event.
pub(crate) const NODE_WINDOW_S: u64 = 60;
/// Nodes remembered per kind at most.
pub(crate) const MAX_NODES_PER_EDGE: usize = 1024;
/// Per-second slots of the rate ring: a power of two above the window.
const RATE_RING: usize = 16;
const _: () = assert!(RATE_RING as u64 > RATE_WINDOW_S);

/// The slot of an event's kind: its discriminant, or the `unspecified` slot.
fn slot_of(edge: Option<EdgeKind>) -> usize {
    edge.map_or(UNSPECIFIED, |kind| kind as usize)
}

/// The name of a slot, as the API shows it.
fn slot_name(slot: usize) -> &'static str {
    EdgeKind::ALL
        .get(slot)
        .map_or("unspecified", |kind| kind.as_str())
}

/// `a == b` for short ids, without the call to `memcmp` that slice equality makes:
/// whole words, the last one overlapping the one before (as `memcmp` does inside).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word =
        |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap_or_default());
    let half =
        |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap_or_default());
    match n {
        8.. => {
            let mut at = 0;
            while at + 8 < n {
                if word(a, at) != word(b, at) {
                    return false;
                }
                at += 8;
            }
            word(a, n - 8) == word(b, n - 8)
        }
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        _ => a.iter().zip(b).all(|(x, y)| x == y),
    }
}

/// Node hashes are already well mixed ([`key_hash`]): the map uses them as they are.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else still hashes, just slowly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Node hash → the newest second of event time it was seen in.
type NodeSeen = HashMap<u64, u64, BuildHasherDefault<PassThrough>>;

/// One kind's counters.
#[derive(Clone)]
struct EdgeSlot {
    outcomes: [u64; OUTCOMES],
    bytes: u64,
    /// The newest event time (0 before the first event).
    last_event_ms: u64,
    /// `(second, events)` per second of event time, at `second % RATE_RING`.
    seconds: [(u64, u64); RATE_RING],
    /// The previous event's node: most events repeat it (a producer's batch is one
    /// node's), and comparing bytes is cheaper than hashing them.
    last_node: [u8; MAX_ID_LEN],
    last_node_len: usize,
    last_node_hash: u64,
    /// The second the previous node's entry in `nodes` was last raised to.
    last_node_second: u64,
    nodes: NodeSeen,
    /// The last second a node was not remembered because `nodes` was full of
    /// recent ones.
    refused_node_second: Option<u64>,
}

impl Default for EdgeSlot {
    fn default() -> Self {
        EdgeSlot {
            outcomes: [0; OUTCOMES],
            bytes: 0,
            last_event_ms: 0,
            seconds: [(0, 0); RATE_RING],
            last_node: [0; MAX_ID_LEN],
            last_node_len: 0,
            last_node_hash: 0,
            last_node_second: 0,
            nodes: NodeSeen::default(),
            refused_node_second: None,
        }
    }
}

impl EdgeSlot {
    #[inline]
    fn count(&mut self, event: &AccessEventRef<'_>) {
        self.outcomes[outcome_index(event.outcome)] += 1;
        self.bytes = self.bytes.saturating_add(event.bytes);
        let ts = event.ts_ms;
        self.last_event_ms = self.last_event_ms.max(ts);
        let second = ts / 1_000;
        let cell = &mut self.seconds[(second % RATE_RING as u64) as usize];
        if cell.0 == second {
            cell.1 += 1;
        } else if cell.0 < second {
            *cell = (second, 1);
        } // else: older than the ring; the totals have it.
        let node = event.node.as_str();
        if same_bytes(node.as_bytes(), &self.last_node[..self.last_node_len]) {
            if second > self.last_node_second {
                self.last_node_second = second;
                self.see_node(self.last_node_hash, second);
            }
        } else {
            self.switch_node(node, second);
        }
    }

    #[cold]
    fn switch_node(&mut self, node: &str, second: u64) {
        // Node ids are at most MAX_ID_LEN bytes (`NodeRef` checks it).
        let len = node.len().min(MAX_ID_LEN);
        self.last_node[..len].copy_from_slice(&node.as_bytes()[..len]);
        self.last_node_len = len;
        self.last_node_hash = key_hash(node);
        self.last_node_second = second;
        self.see_node(self.last_node_hash, second);
    }

    fn see_node(&mut self, hash: u64, second: u64) {
        if let Some(seen) = self.nodes.get_mut(&hash) {
            *seen = (*seen).max(second);
            return;
        }
        if self.nodes.len() >= MAX_NODES_PER_EDGE {
            // Forget the nodes silent for the window (behind this event's time).
            let horizon = second.saturating_sub(NODE_WINDOW_S);
            self.nodes.retain(|_, seen| *seen > horizon);
        }
        if self.nodes.len() < MAX_NODES_PER_EDGE {
            self.nodes.insert(hash, second);
        } else {
            self.refused_node_second = Some(second);
        }
    }

    fn summary(&self, slot: usize, now_ms: u64) -> EdgeSummary {
        let counts = OutcomeCounts::from_array(self.outcomes);
        let events = counts.total();
        let hits = counts.hit + counts.prefetch_useful;
        let misses = Outcome::ALL
            .into_iter()
            .filter(|o| o.is_miss())
            .map(|o| counts.get(o))
            .sum();
        let demand = events - counts.prefetch_fill;
        let now_s = now_ms / 1_000;
        let recent: u64 = self
            .seconds
            .iter()
            .filter(|(second, _)| *second <= now_s && *second + RATE_WINDOW_S > now_s)
            .map(|(_, n)| n)
            .sum();
        let nodes = self
            .nodes
            .values()
            .filter(|seen| **seen <= now_s && **seen + NODE_WINDOW_S > now_s)
            .count() as u64;
        EdgeSummary {
            edge: slot_name(slot).to_owned(),
            events,
            hits,
            misses,
            prefetch_fills: counts.prefetch_fill,
            hit_ratio: (demand > 0).then(|| hits as f64 / demand as f64),
            bytes: self.bytes,
            rate_per_s: recent as f64 / RATE_WINDOW_S as f64,
            nodes,
            nodes_capped: self
                .refused_node_second
                .is_some_and(|refused| refused + NODE_WINDOW_S > now_s),
            last_event_ms: (events > 0).then_some(self.last_event_ms),
            outcomes: counts,
        }
    }

    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.nodes.capacity() * 2 * std::mem::size_of::<u64>()
    }
}

/// The counters of every kind of edge. Not checkpointed: they count since pulse
/// started.
#[derive(Clone, Default)]
pub(super) struct EdgeCounters {
    slots: [EdgeSlot; EDGE_SLOTS],
}

impl EdgeCounters {
    /// Counts one applied event.
    #[inline]
    pub(super) fn count(&mut self, event: &AccessEventRef<'_>) {
        self.slots[slot_of(event.edge)].count(event);
    }

    /// Every slot's summary, kinds in [`EdgeKind::ALL`] order then `unspecified`, with
    /// the rate and the nodes as of `now_ms` (event time).
    pub(super) fn summaries(&self, now_ms: u64) -> Vec<EdgeSummary> {
        self.slots
            .iter()
            .enumerate()
            .map(|(slot, counters)| counters.summary(slot, now_ms))
            .collect()
    }

    /// Approximate bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.slots.iter().map(EdgeSlot::bytes).sum()
    }
}

/// One kind of edge's counters, since pulse started (`GET /api/edges`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EdgeSummary {
    /// `prefetcher`, `nginx`, `varnish`, `other` (a kind this pulse does not know) or
    /// `unspecified` (events without `edge`, from older producers).
    pub edge: String,
    /// Events applied.
    pub events: u64,
    /// Served from the node's cache: `hit` and `prefetch_useful`.
    pub hits: u64,
    /// Found no fresh copy: `miss`, `stale` and `collapsed`.
    pub misses: u64,
    /// Fills made by pre-warm commands (`prefetch_fill`; not demand).
    pub prefetch_fills: u64,
    /// `hits` over demand (every event but `prefetch_fill`); null without demand.
    pub hit_ratio: Option<f64>,
    /// Response body bytes the nodes sent.
    pub bytes: u64,
    /// Events per second over the last 10 s of event time, the current second included.
    pub rate_per_s: f64,
    /// Distinct nodes with an event in the last 60 s of event time.
    pub nodes: u64,
    /// Some node of the last 60 s was not counted in `nodes`: more than 1024 were
    /// active at once.
    pub nodes_capped: bool,
    /// The newest event time, ms since the Unix epoch; null before the first event.
    pub last_event_ms: Option<u64>,
    /// Events per outcome.
    pub outcomes: OutcomeCounts,
}

#[cfg(test)]
mod tests {
    use models::{AccessEvent, CacheKey, NodeId, RegionId, TenantId};

    use super::*;

    const T0: u64 = 1_764_470_000_000;

    fn event(ts_ms: u64, node: &str, edge: Option<EdgeKind>, outcome: Outcome) -> AccessEvent {
        let mut e = AccessEvent::new(
            ts_ms,
            TenantId::new("acme").unwrap(),
            CacheKey::new("/k").unwrap(),
            RegionId::new("eu-west").unwrap(),
            NodeId::new(node).unwrap(),
            outcome,
        );
        e.edge = edge;
        e.bytes = 100;
        e
    }

    fn count(counters: &mut EdgeCounters, e: &AccessEvent) {
        counters.count(&e.borrowed());
    }

    fn by_name(counters: &EdgeCounters, now_ms: u64, name: &str) -> EdgeSummary {
        counters
            .summaries(now_ms)
            .into_iter()
            .find(|s| s.edge == name)
            .unwrap_or_else(|| panic!("no slot {name}"))
    }

    /// Invariant 1: one count per event, in its kind's slot only; no kind is
    /// `unspecified`; the slots are listed in a fixed order.
    #[test]
    fn each_event_counts_once_in_its_kinds_slot() {
        let mut c = EdgeCounters::default();
        let kinds = [
            (Some(EdgeKind::Prefetcher), 1),
            (Some(EdgeKind::Nginx), 2),
            (Some(EdgeKind::Varnish), 3),
            (Some(EdgeKind::Other), 4),
            (None, 5),
        ];
        for (kind, n) in kinds {
            for i in 0..n {
                count(&mut c, &event(T0 + i, "n1", kind, Outcome::Hit));
            }
        }
        let summaries = c.summaries(T0);
        let names: Vec<&str> = summaries.iter().map(|s| s.edge.as_str()).collect();
        assert_eq!(
            names,
            ["prefetcher", "nginx", "varnish", "other", "unspecified"]
        );
        let events: Vec<u64> = summaries.iter().map(|s| s.events).collect();
        assert_eq!(events, [1, 2, 3, 4, 5]);
        assert_eq!(by_name(&c, T0, "varnish").bytes, 300);
    }

    /// Invariant 2: hits, misses and pre-warm fills partition the events; the hit
    /// ratio leaves pre-warm fills out, and is null without demand.
    #[test]
    fn hits_misses_and_fills_partition_the_events() {
        let mut c = EdgeCounters::default();
        let nginx = Some(EdgeKind::Nginx);
        // `prefetch_cached` never reaches the heat map (`HeatMap::apply_ref`).
        let counted = Outcome::ALL
            .into_iter()
            .filter(|o| *o != Outcome::PrefetchCached);
        for (i, outcome) in counted.enumerate() {
            count(&mut c, &event(T0 + i as u64, "n1", nginx, outcome));
        }
        let s = by_name(&c, T0, "nginx");
        assert_eq!(s.events, 6);
        assert_eq!((s.hits, s.misses, s.prefetch_fills), (2, 3, 1));
        assert_eq!(s.hits + s.misses + s.prefetch_fills, s.events);
        assert_eq!(s.hit_ratio, Some(2.0 / 5.0));
        assert_eq!(s.outcomes.total(), s.events);

        let mut only_fills = EdgeCounters::default();
        count(
            &mut only_fills,
            &event(T0, "n1", nginx, Outcome::PrefetchFill),
        );
        assert_eq!(by_name(&only_fills, T0, "nginx").hit_ratio, None);
        assert_eq!(by_name(&only_fills, T0, "varnish").hit_ratio, None);
    }

    /// Invariant 3: the rate is the last 10 s of event time over 10 s; it falls to
    /// zero as the watermark moves on, and an event older than the ring counts in
    /// the totals only.
    #[test]
    fn the_rate_covers_the_last_ten_seconds_of_event_time() {
        let mut c = EdgeCounters::default();
        let v = Some(EdgeKind::Varnish);
        // 5 events per second for 20 seconds.
        for s in 0..20u64 {
            for i in 0..5 {
                count(&mut c, &event(T0 + s * 1_000 + i, "n1", v, Outcome::Hit));
            }
        }
        let now = T0 + 19_000 + 4;
        assert_eq!(by_name(&c, now, "varnish").rate_per_s, 5.0);
        // Half the window later, half the events are in it.
        assert_eq!(by_name(&c, now + 5_000, "varnish").rate_per_s, 2.5);
        assert_eq!(by_name(&c, now + 10_000, "varnish").rate_per_s, 0.0);
        // An event older than the ring: in the totals, not in the rate.
        count(&mut c, &event(T0, "n1", v, Outcome::Hit));
        let s = by_name(&c, now, "varnish");
        assert_eq!((s.events, s.rate_per_s), (101, 5.0));
        assert_eq!(s.last_event_ms, Some(now));
    }

    /// Invariant 4: each node counts once however its events interleave with
    /// others', a node that keeps sending stays counted across seconds, and a node
    /// silent for 60 s drops out.
    #[test]
    fn nodes_are_the_distinct_nodes_of_the_last_minute() {
        let mut c = EdgeCounters::default();
        let p = Some(EdgeKind::Prefetcher);
        // n1 to n3 interleaved in the first second; n1 alone then, in one run.
        for i in 0..30u64 {
            let node = format!("n{}", 1 + i % 3);
            count(&mut c, &event(T0 + i, &node, p, Outcome::Hit));
        }
        assert_eq!(by_name(&c, T0 + 29, "prefetcher").nodes, 3);
        for s in 1..=90u64 {
            count(&mut c, &event(T0 + s * 1_000, "n1", p, Outcome::Hit));
        }
        let now = T0 + 90_000;
        let s = by_name(&c, now, "prefetcher");
        assert_eq!(s.nodes, 1, "n2 and n3 went quiet 90 s ago; n1 ran on");
        assert!(!s.nodes_capped);
        assert_eq!(by_name(&c, now, "nginx").nodes, 0);
    }

    /// The node compare behind invariant 4 tells apart ids that differ in any byte,
    /// in the eight-byte words or in the rest, or in length.
    #[test]
    fn node_ids_compare_by_every_byte() {
        let id = b"edge-node-0042-eu";
        assert!(same_bytes(id, id));
        for i in 0..id.len() {
            let mut other = *id;
            other[i] ^= 1;
            assert!(!same_bytes(id, &other), "byte {i}");
        }
        assert!(!same_bytes(id, &id[..16]));
        assert!(same_bytes(b"", b""));
    }

    /// Invariant 1, in the heat map: an event it refuses (unknown tenant, too old)
    /// is counted nowhere.
    #[test]
    fn only_events_the_heat_map_applies_count() {
        use crate::heat::{HeatConfig, HeatMap};
        let mut heat = HeatMap::new(HeatConfig::default());
        heat.set_allowed_tenants(Some(["acme".to_owned()].into()));
        let nginx = Some(EdgeKind::Nginx);
        heat.apply(&event(T0 + 120_000, "n1", nginx, Outcome::Hit))
            .unwrap();
        let too_old = event(T0, "n1", nginx, Outcome::Hit);
        assert!(heat.apply(&too_old).is_err());
        let mut stranger = event(T0 + 120_000, "n1", nginx, Outcome::Hit);
        stranger.tenant = TenantId::new("evil").unwrap();
        assert!(heat.apply(&stranger).is_err());
        let edges = heat.edges();
        assert_eq!(edges[EdgeKind::Nginx as usize].events, 1);
        assert_eq!(edges.iter().map(|s| s.events).sum::<u64>(), 1);
    }

    /// Invariant 5: at most MAX_NODES_PER_EDGE nodes are held per kind; a new node
    /// past it is not counted and the summary says so, until silent nodes age out.
    #[test]
    fn memory_is_bounded_by_the_node_cap() {
        let mut c = EdgeCounters::default();
        let o = Some(EdgeKind::Other);
        for i in 0..MAX_NODES_PER_EDGE as u64 + 10 {
            count(&mut c, &event(T0 + i, &format!("n{i}"), o, Outcome::Miss));
        }
        let now = T0 + MAX_NODES_PER_EDGE as u64 + 9;
        let s = by_name(&c, now, "other");
        assert_eq!(s.nodes, MAX_NODES_PER_EDGE as u64);
        assert!(s.nodes_capped);
        assert_eq!(s.events, MAX_NODES_PER_EDGE as u64 + 10);
        let held = c.slots[EdgeKind::Other as usize].nodes.len();
        assert_eq!(held, MAX_NODES_PER_EDGE);
        // A minute later the silent ones make room for a new node.
        count(&mut c, &event(now + 61_000, "fresh", o, Outcome::Miss));
        let s = by_name(&c, now + 61_000, "other");
        assert_eq!((s.nodes, s.nodes_capped), (1, false));
        assert!(c.slots[EdgeKind::Other as usize].nodes.len() <= MAX_NODES_PER_EDGE);
    }
}
