//! Pulse as one member of a fleet: which partitions an answer covers, how answers
//! from several partitions (and, later, several instances) merge into one, and which
//! partition owns a key.
//!
//! # Layout
//! - `answers`: the API's answers ([`TenantsResponse`], [`HeatmapResponse`], …), each
//!   with how one partition gives it; below both the handlers and the merges.
//! - `merge`: one exact merge per API response (tenants, heat map, rates, edges,
//!   predictions, model); keys are partition-local, so the union of per-partition
//!   top-K lists is the top-K of the union, and counts add.
//! - `partitioner`: the producers' partitioners ([`partition_for_key`] is librdkafka's
//!   default) and [`Ownership`], which of them placed the messages consumed.
//! - `peers`: [`Peers`], a `scope=local` question asked of every other instance.
//! - `model_topic`: one model for the fleet through a compacted topic.

mod answers;
pub(crate) mod merge;
mod model_topic;
mod partitioner;
mod peers;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

pub use answers::ErrorBody;
pub(crate) use answers::{
    ContributionView, DecisionTotals, DecisionView, EdgesResponse, EvaluationView, HeatmapResponse,
    KeyOwnership, KeyResponse, LeadTime, ModelFeature, ModelResponse, PredictionsResponse,
    RatePoint, RatesResponse, ReliabilityView, TenantsResponse,
};
pub use model_topic::{
    MAX_MODEL_BYTES, MODEL_KEY, MODEL_REJECT_REASONS, ModelPublisher, ModelTopic, ModelTopicError,
    ModelWatcher, TopicState,
};
pub use partitioner::{MIN_PAIRS, Ownership, Partitioner, partition_for_key};
pub use peers::{
    DEFAULT_PEER_TIMEOUT, PeerAnswer, PeerFailure, PeerUrl, Peers, PeersConfig, PeersError,
};
pub(crate) use peers::{SILENCE_BEFORE_WARNING, client_id, discover};

/// Which partitions an answer covers, and whether that is all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Coverage {
    /// The partitions whose state the answer merges, ascending.
    pub partitions: Vec<i32>,
    /// The topic's partition count.
    pub partition_count: i32,
    /// Every partition of the topic is covered, exactly once, and none is replaying.
    pub complete: bool,
    /// Covered partitions still rebuilding their windows from the topic (a new
    /// owner's replay): their counts are partial until they catch up.
    #[serde(default)]
    pub replaying: Vec<i32>,
    /// Peers that were asked and did not answer (named even when the others cover
    /// their partitions).
    pub missing_peers: Vec<String>,
}

impl Coverage {
    /// Covering `partitions` of `partition_count`.
    pub fn of(mut partitions: Vec<i32>, partition_count: i32) -> Self {
        partitions.sort_unstable();
        partitions.dedup();
        let complete = partition_count > 0
            && (0..partition_count).all(|p| partitions.binary_search(&p).is_ok());
        Coverage {
            partitions,
            partition_count,
            complete,
            replaying: Vec::new(),
            missing_peers: Vec::new(),
        }
    }

    /// The same coverage, with `replaying` of its partitions still replaying: not
    /// complete while any is.
    pub fn replaying(mut self, mut replaying: Vec<i32>) -> Self {
        replaying.retain(|p| self.partitions.contains(p));
        replaying.sort_unstable();
        replaying.dedup();
        self.complete &= replaying.is_empty();
        self.replaying = replaying;
        self
    }

    /// The coverage of answers merged together: the union of their partitions, and
    /// every missing peer named. Complete when every partition is covered exactly
    /// once: a missing peer whose partitions have moved to the others (Kafka gives each
    /// partition to one member) takes nothing away, while a partition seen twice (parts
    /// gathered on either side of a rebalance) would be counted twice, so that answer is
    /// not complete.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Coverage>) -> Self {
        let mut partitions = Vec::new();
        let mut count = 0;
        let mut missing = Vec::new();
        let mut replaying = Vec::new();
        for c in parts {
            partitions.extend_from_slice(&c.partitions);
            count = count.max(c.partition_count);
            missing.extend(c.missing_peers.iter().cloned());
            replaying.extend_from_slice(&c.replaying);
        }
        let seen = partitions.len();
        let mut merged = Coverage::of(partitions, count).replaying(replaying);
        missing.sort();
        missing.dedup();
        merged.complete &= merged.partitions.len() == seen;
        merged.missing_peers = missing;
        merged
    }
}

/// Where an answer comes from: this instance's partitions only, or the whole fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Scope {
    /// This instance's partitions only (what peers ask each other).
    Local,
    /// Every instance's partitions, merged (the default).
    #[default]
    Fleet,
}

/// The `scope` query parameter every `/api/*` route accepts.
#[derive(Debug, Clone, Copy, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ScopeQuery {
    /// `local` (this instance's partitions) or `fleet` (default: every instance's,
    /// merged).
    pub scope: Option<Scope>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_is_complete_only_with_every_partition_and_every_peer() {
        let a = Coverage::of(vec![2, 0], 4);
        let b = Coverage::of(vec![1, 3], 4);
        assert!(!a.complete);
        let merged = Coverage::merge([&a, &b]);
        assert_eq!(merged.partitions, [0, 1, 2, 3]);
        assert!(merged.complete);
        let lost = Coverage {
            missing_peers: vec!["http://10.0.0.2:8080".into()],
            ..Coverage::of(vec![], 4)
        };
        // A peer that did not answer is named; its partitions are covered by the
        // others, so the answer is complete all the same.
        let merged = Coverage::merge([&a, &b, &lost]);
        assert!(merged.complete);
        assert_eq!(merged.missing_peers, ["http://10.0.0.2:8080"]);
        // Without the others, it is not.
        assert!(!Coverage::merge([&a, &lost]).complete);
        // A partition in two parts (a rebalance between the two answers) is counted
        // twice: not complete.
        let twice = Coverage::merge([&a, &b, &Coverage::of(vec![1], 4)]);
        assert_eq!(twice.partitions, [0, 1, 2, 3]);
        assert!(!twice.complete);
        assert!(!Coverage::of(vec![], 0).complete);
    }

    /// A partition still replaying is covered but partial: the answer is not
    /// complete until it has caught up, whichever instance it is on.
    #[test]
    fn a_replaying_partition_keeps_the_answer_incomplete() {
        let a = Coverage::of(vec![0, 1], 4);
        let b = Coverage::of(vec![2, 3], 4).replaying(vec![3]);
        let merged = Coverage::merge([&a, &b]);
        assert_eq!(merged.partitions, [0, 1, 2, 3]);
        assert_eq!(merged.replaying, [3]);
        assert!(!merged.complete);
        let caught_up = Coverage::of(vec![2, 3], 4).replaying(vec![]);
        assert!(Coverage::merge([&a, &caught_up]).complete);
        // Only covered partitions can be replaying.
        assert!(
            Coverage::of(vec![0, 1, 2, 3], 4)
                .replaying(vec![7])
                .complete
        );
    }
}
