//! What an edge node tells pulse about each request it answered.

use serde::{Deserialize, Serialize};

use crate::SCHEMA_VERSION;
use crate::ids::{
    CacheKey, CacheKeyRef, Domain, DomainRef, NodeId, NodeRef, RegionId, RegionRef, TenantId,
    TenantRef,
};

/// How an edge node answered one request for a cacheable key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Served from the node's cache.
    Hit,
    /// Not cached: this request led an origin fill.
    Miss,
    /// Served an expired entry while one refresh ran in the background.
    Stale,
    /// Not cached, but joined a fill already in flight.
    Collapsed,
    /// A pre-warm command made the node fill the key before anyone asked.
    PrefetchFill,
    /// The first user request to hit an entry that a pre-warm filled.
    PrefetchUseful,
    /// A pre-warm command found the key already cached (fresh): nothing was fetched.
    /// An acknowledgement, neither a request nor a fill: pulse credits it to the
    /// warm-up that asked and counts it nowhere else.
    PrefetchCached,
}

impl Outcome {
    /// Every outcome, in declaration order (for metrics that list all of them).
    pub const ALL: [Outcome; 7] = [
        Outcome::Hit,
        Outcome::Miss,
        Outcome::Stale,
        Outcome::Collapsed,
        Outcome::PrefetchFill,
        Outcome::PrefetchUseful,
        Outcome::PrefetchCached,
    ];

    /// The wire name, also used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Stale => "stale",
            Outcome::Collapsed => "collapsed",
            Outcome::PrefetchFill => "prefetch_fill",
            Outcome::PrefetchUseful => "prefetch_useful",
            Outcome::PrefetchCached => "prefetch_cached",
        }
    }

    /// Whether the request found no fresh copy at the node (the misses pulse watches;
    /// every miss is [demand](Outcome::is_demand)).
    pub fn is_miss(self) -> bool {
        matches!(self, Outcome::Miss | Outcome::Collapsed | Outcome::Stale)
    }

    /// Whether a client asked for the key: every outcome but a pre-warm's fill or
    /// acknowledgement, which are the node obeying pulse, not a request. Demand is what pulse's velocities, hot
    /// keys, rates and the verdicts on its commands count.
    pub fn is_demand(self) -> bool {
        match self {
            Outcome::Hit
            | Outcome::Miss
            | Outcome::Stale
            | Outcome::Collapsed
            | Outcome::PrefetchUseful => true,
            Outcome::PrefetchFill | Outcome::PrefetchCached => false,
        }
    }
}

/// Which kind of edge node sent an event: pulse counts its events per kind.
///
/// On the wire it is the optional `edge` field, a string. The codec's rule is that a
/// newer producer stays readable: a name this build does not know (a new kind of
/// edge) is read as [`EdgeKind::Other`], not refused, so the event still counts in
/// the heat map; anything but a string (or `null`, which is "not said") is an
/// invalid field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// This project's prefetcher (`prefetcher serve`).
    Prefetcher,
    /// nginx, through the edge agent (`log_format = "nginx_json"`).
    Nginx,
    /// Varnish, through the edge agent (`log_format = "varnishncsa_json"`).
    Varnish,
    /// A kind this build does not know: the name is not kept.
    Other,
}

impl EdgeKind {
    /// Every kind, in declaration order; `kind as usize` is its index here.
    pub const ALL: [EdgeKind; 4] = [
        EdgeKind::Prefetcher,
        EdgeKind::Nginx,
        EdgeKind::Varnish,
        EdgeKind::Other,
    ];

    /// The wire name, also used as a label.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::Prefetcher => "prefetcher",
            EdgeKind::Nginx => "nginx",
            EdgeKind::Varnish => "varnish",
            EdgeKind::Other => "other",
        }
    }

    /// The kind a wire name stands for: any name but the known ones is
    /// [`EdgeKind::Other`].
    pub fn from_name(name: &str) -> EdgeKind {
        match name {
            "prefetcher" => EdgeKind::Prefetcher,
            "nginx" => EdgeKind::Nginx,
            "varnish" => EdgeKind::Varnish,
            _ => EdgeKind::Other,
        }
    }
}

impl Serialize for EdgeKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EdgeKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = EdgeKind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an edge kind name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<EdgeKind, E> {
                Ok(EdgeKind::from_name(name))
            }
        }
        deserializer.deserialize_str(Name)
    }
}

/// One request outcome at one edge node: the message on the `edge-events` topic,
/// keyed by `tenant/key` so one key's events stay in order on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessEvent {
    /// Schema version; this build writes and accepts [`SCHEMA_VERSION`].
    pub v: u16,
    /// When the request was answered, in milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The tenant, from the node's trusted configuration.
    pub tenant: TenantId,
    /// The normalised cache key.
    pub key: CacheKey,
    /// The region of the node.
    pub region: RegionId,
    /// The node that answered.
    pub node: NodeId,
    /// How it was answered.
    pub outcome: Outcome,
    /// The referrer's host, when the request named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referrer: Option<Domain>,
    /// Response body bytes sent to the client.
    #[serde(default)]
    pub bytes: u64,
    /// Origin fill latency in milliseconds, for outcomes that waited on a fill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_ms: Option<u32>,
    /// What kind of edge the node is; absent from older producers and hand-written
    /// events (pulse counts those as `unspecified`). Written last, so a reader of the
    /// compact shape pays nothing for it when it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<EdgeKind>,
}

impl AccessEvent {
    /// An event with the current schema version, no edge kind, no referrer, no bytes
    /// and no fill.
    pub fn new(
        ts_ms: u64,
        tenant: TenantId,
        key: CacheKey,
        region: RegionId,
        node: NodeId,
        outcome: Outcome,
    ) -> Self {
        AccessEvent {
            v: SCHEMA_VERSION,
            ts_ms,
            tenant,
            key,
            region,
            node,
            outcome,
            referrer: None,
            bytes: 0,
            fill_ms: None,
            edge: None,
        }
    }

    /// The event borrowed, as the zero-copy decoder gives it (nothing is checked
    /// again or copied).
    pub fn borrowed(&self) -> AccessEventRef<'_> {
        AccessEventRef {
            v: self.v,
            ts_ms: self.ts_ms,
            tenant: self.tenant.borrowed(),
            key: self.key.borrowed(),
            region: self.region.borrowed(),
            node: self.node.borrowed(),
            outcome: self.outcome,
            referrer: self.referrer.as_ref().map(Domain::borrowed),
            bytes: self.bytes,
            fill_ms: self.fill_ms,
            edge: self.edge,
        }
    }

    /// The Kafka message key: `tenant/key`, so one key's events share a partition.
    pub fn partition_key(&self) -> String {
        crate::topic::message_key(self.tenant.as_str(), self.key.as_str())
    }
}

/// An [`AccessEvent`] whose strings borrow from the message bytes: what
/// [`decode_event_ref`](crate::decode_event_ref) returns, so the per-message path
/// allocates nothing. It is validated by the same rules as [`AccessEvent`]; call
/// [`AccessEventRef::to_owned_event`] to keep it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
// Errors name the struct ("expected struct AccessEvent"): the same words as the owned one.
#[serde(rename = "AccessEvent", expecting = "struct AccessEvent")]
pub struct AccessEventRef<'a> {
    /// Schema version; [`decode_event_ref`](crate::decode_event_ref) accepts only
    /// [`SCHEMA_VERSION`].
    pub v: u16,
    /// When the request was answered, in milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The tenant.
    #[serde(borrow)]
    pub tenant: TenantRef<'a>,
    /// The normalised cache key.
    #[serde(borrow)]
    pub key: CacheKeyRef<'a>,
    /// The region of the node.
    #[serde(borrow)]
    pub region: RegionRef<'a>,
    /// The node that answered.
    #[serde(borrow)]
    pub node: NodeRef<'a>,
    /// How it was answered.
    pub outcome: Outcome,
    /// The referrer's host, when the request named one.
    #[serde(default, borrow)]
    pub referrer: Option<DomainRef<'a>>,
    /// Response body bytes sent to the client.
    #[serde(default)]
    pub bytes: u64,
    /// Origin fill latency in milliseconds, for outcomes that waited on a fill.
    #[serde(default)]
    pub fill_ms: Option<u32>,
    /// What kind of edge the node is, when it says.
    #[serde(default)]
    pub edge: Option<EdgeKind>,
}

impl AccessEventRef<'_> {
    /// The owned event (its strings copied, not checked again).
    pub fn to_owned_event(&self) -> AccessEvent {
        AccessEvent {
            v: self.v,
            ts_ms: self.ts_ms,
            tenant: self.tenant.to_owned_id(),
            key: self.key.to_owned_id(),
            region: self.region.to_owned_id(),
            node: self.node.to_owned_id(),
            outcome: self.outcome,
            referrer: self.referrer.as_ref().map(DomainRef::to_owned_id),
            bytes: self.bytes,
            fill_ms: self.fill_ms,
            edge: self.edge,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Demand is every client request (hits and misses alike) and never a pre-warm.
    #[test]
    fn demand_is_every_client_request_and_no_pre_warm() {
        let demand: Vec<Outcome> = Outcome::ALL.into_iter().filter(|o| o.is_demand()).collect();
        assert_eq!(
            demand,
            [
                Outcome::Hit,
                Outcome::Miss,
                Outcome::Stale,
                Outcome::Collapsed,
                Outcome::PrefetchUseful
            ]
        );
        assert!(!Outcome::PrefetchFill.is_demand());
        assert!(!Outcome::PrefetchCached.is_demand() && !Outcome::PrefetchCached.is_miss());
        assert!(
            Outcome::ALL
                .iter()
                .filter(|o| o.is_miss())
                .all(|o| o.is_demand())
        );
    }
}
