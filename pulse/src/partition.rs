//! Pulse's state per owned partition of the events topic: a partition is a small
//! pulse.
//!
//! Producers key events by `tenant/key` (librdkafka's default partitioner), so every
//! key lives in exactly one partition and per-key state (heat-map rows, tracker,
//! cooldown, command ids) never needs another partition. Each owned partition has its
//! own [`HeatMap`], sized as its share of the configured budget, and its own
//! [`Predictor`] (sharing one model). A partition's predictor proposes; the per-tenant
//! command budget is the fleet gate's (`crate::gate`), one for the fleet whoever owns
//! what, so a partition's decider has none of its own.
//!
//! Invariants:
//! - a partition's state holds the events of offsets below `next_offset` from where
//!   it started (`replay_from`; with a snapshot, the snapshot's events, then from the
//!   snapshot's offset, or from the replay window when the snapshot is older): ingest
//!   applies a message only at or past `next_offset`, so nothing is applied twice;
//! - below `live_from` (the group's committed offset when the partition was assigned)
//!   events are *replayed*: they rebuild the windows and the tracker and are never
//!   scored or sent, because the previous owner already acted on them;
//! - a state is created on assign and dropped on revoke (parked as a snapshot when
//!   the assignment was lost): an instance answers only for the partitions it owns,
//!   and [`Partitions::owned`] says which.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::fleet::Ownership;
use crate::heat::{HeatConfig, HeatMap};
use crate::predict::{
    DecisionPolicy, Predictor, PredictorConfig, SavedCalibration, SavedTraffic, ScoringModel,
};

/// The owned partitions, shared by the ingest thread (the only writer of the heat
/// maps), the API and the retrainer. A `std` lock: critical sections are short and
/// never span an `.await`.
pub(crate) type SharedPartitions = Arc<RwLock<Partitions>>;

/// One owned partition's state.
pub struct PartitionState {
    /// The partition of the events topic.
    pub partition: i32,
    /// Its heat map.
    pub heat: HeatMap,
    /// Its predictor, when prediction is on. Behind its own lock so the predictor
    /// ticks under the partitions' read lock, API readers alongside.
    pub predictor: Option<Mutex<Predictor>>,
    /// The next offset to apply: every message below it has been applied.
    pub next_offset: i64,
    /// The committed offset when the partition was assigned: below it, events are
    /// replayed (applied, never scored or sent).
    pub live_from: i64,
    /// Where replay started (the first offset this state read).
    pub replay_from: i64,
    /// Events applied live.
    pub applied: u64,
    /// Events applied while replaying.
    pub replayed: u64,
    /// The partition's end on the broker (next offset to be written), from the
    /// consumer's statistics once a second; -1 until known.
    pub high_watermark: i64,
}

impl PartitionState {
    /// The predictor's online calibration, for the checkpoint.
    pub(crate) fn saved_calibration(&self) -> Option<SavedCalibration> {
        let predictor = self.predictor.as_ref()?;
        predictor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .saved_calibration()
    }

    /// What the predictor learnt of its traffic whatever the model, for the checkpoint.
    pub(crate) fn saved_traffic(&self) -> Option<SavedTraffic> {
        let predictor = self.predictor.as_ref()?;
        Some(
            predictor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .saved_traffic(),
        )
    }

    /// Puts back what a snapshot kept of the traffic (`Predictor::restore_traffic`).
    pub(crate) fn restore_traffic(&self, saved: SavedTraffic) -> bool {
        self.predictor.as_ref().is_some_and(|p| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .restore_traffic(saved)
        })
    }

    /// Puts back a snapshot's online calibration, if it was counted for the model in
    /// use (`Predictor::restore_calibration`).
    pub(crate) fn restore_calibration(&self, saved: SavedCalibration) -> bool {
        self.predictor.as_ref().is_some_and(|p| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .restore_calibration(saved)
        })
    }

    /// Whether the partition is still rebuilding its windows.
    pub fn replaying(&self) -> bool {
        self.next_offset < self.live_from
    }

    /// How far behind its watermark the partition's predictor also measures a key's last
    /// second (`None` without prediction).
    pub fn lateness_grace_ms(&self) -> Option<u64> {
        self.predictor.as_ref().map(|p| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .lateness_grace_ms()
        })
    }

    /// Whether an event at `offset` is replayed rather than live.
    pub fn is_replay(&self, offset: i64) -> bool {
        offset < self.live_from
    }
}

/// What a new partition state is made from.
#[derive(Clone)]
pub struct PartitionTemplate {
    /// The configured sketch settings and the instance-wide memory budget.
    pub heat: HeatConfig,
    /// The tenant allow-list.
    pub allowed_tenants: Option<HashSet<String>>,
    /// The predictor's settings with the fleet-wide decision rules; `None`: prediction
    /// off.
    pub predictor: Option<PredictorConfig>,
}

/// A partition's snapshot from the checkpoint, waiting for the partition to be
/// assigned.
pub struct Snapshot {
    /// The offset the snapshot holds every event below.
    pub next_offset: i64,
    /// The heat map.
    pub heat: HeatMap,
    /// The predictor's online calibration, for the model it was counted for.
    pub(crate) calibration: Option<SavedCalibration>,
    /// What the predictor learnt of its traffic whatever the model.
    pub(crate) traffic: Option<SavedTraffic>,
}

/// The partitions this instance owns.
pub struct Partitions {
    template: PartitionTemplate,
    model: Option<Arc<ScoringModel>>,
    partition_count: i32,
    states: BTreeMap<i32, PartitionState>,
    snapshots: HashMap<i32, Snapshot>,
    /// The partition count the snapshots were taken with: with another, keys map to
    /// other partitions and the snapshots are worthless.
    snapshots_of: i32,
    /// Which partitioner the producers use, learnt from the messages consumed.
    ownership: Ownership,
}

/// One partition's line in `/healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PartitionHealth {
    /// The partition.
    pub partition: i32,
    /// Next offset to apply.
    pub next_offset: i64,
    /// The committed offset at assign; below it, events are replayed.
    pub live_from: i64,
    /// Still rebuilding its windows (`next_offset < live_from`).
    pub replaying: bool,
    /// Messages on the broker not applied yet (`None` until the partition's end is
    /// known, once a second).
    pub lag: Option<i64>,
    /// How far behind its watermark the partition also measures a key's last second,
    /// from how late its events arrive (0 in time order; `None` without prediction).
    pub lateness_grace_ms: Option<u64>,
}

impl Partitions {
    /// No partition owned yet; `model` is the one every predictor starts with.
    pub fn new(template: PartitionTemplate, model: Option<Arc<ScoringModel>>) -> Self {
        Partitions {
            template,
            model,
            partition_count: 0,
            states: BTreeMap::new(),
            snapshots: HashMap::new(),
            snapshots_of: 0,
            ownership: Ownership::default(),
        }
    }

    /// Shared, for ingest, the API and the retrainer.
    pub fn shared(self) -> SharedPartitions {
        Arc::new(RwLock::new(self))
    }

    /// The topic's partition count (0 until known).
    pub fn partition_count(&self) -> i32 {
        self.partition_count
    }

    /// Sets the topic's partition count: new states are sized by it, and keys are
    /// looked up under it as well as under the counts the topic had before.
    pub fn set_partition_count(&mut self, count: i32) {
        self.partition_count = count;
        self.ownership.set_partition_count(count);
    }

    /// Takes a larger partition count of the topic, seen at `now_ms` (wall clock):
    /// keys are looked up under the earlier count too until it is forgotten
    /// ([`Partitions::forget_partition_counts`]). Whether the count grew.
    pub fn grow(&mut self, count: i32, now_ms: u64) -> bool {
        if count <= self.partition_count {
            return false;
        }
        self.partition_count = count;
        self.ownership.grow(count, now_ms);
        true
    }

    /// The partition counts a commit of the group carries (`Ownership::history`):
    /// those this instance did not see are learnt; one below the current count that
    /// the commit gives no end (it was committed before the growth) ends at `now_ms`.
    pub fn learn_partition_counts(&mut self, history: &str, now_ms: u64) {
        for (count, ended_ms) in Ownership::parse_history(history) {
            self.ownership.learn(count, ended_ms);
        }
        self.ownership.grow(self.partition_count, now_ms);
    }

    /// Forgets the earlier partition counts that ended before `ms`.
    pub fn forget_partition_counts(&mut self, ms: u64) {
        self.ownership.forget_ended_before(ms);
    }

    /// What the messages consumed say about the producers' partitioner.
    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    /// One consumed message's key and partition.
    pub fn observe_key(&mut self, key: &[u8], partition: i32) {
        self.ownership.observe(key, partition);
    }

    /// The owned partitions' states, by partition.
    pub fn states(&self) -> &BTreeMap<i32, PartitionState> {
        &self.states
    }

    /// The owned partitions' states, for ingest.
    pub fn states_mut(&mut self) -> &mut BTreeMap<i32, PartitionState> {
        &mut self.states
    }

    /// One owned partition.
    pub fn get(&self, partition: i32) -> Option<&PartitionState> {
        self.states.get(&partition)
    }

    /// The owned partitions, ascending.
    pub fn owned(&self) -> Vec<i32> {
        self.states.keys().copied().collect()
    }

    /// Whether this instance owns every partition of the topic.
    pub fn complete(&self) -> bool {
        self.partition_count > 0 && self.states.len() == self.partition_count as usize
    }

    /// Whether prediction is on.
    pub fn prediction_on(&self) -> bool {
        self.template.predictor.is_some()
    }

    /// The fleet-wide decision rules (what the model card shows), if prediction is on.
    pub fn policy(&self) -> Option<&DecisionPolicy> {
        self.template.predictor.as_ref().map(|p| &p.policy)
    }

    /// The model every partition's predictor uses.
    pub fn model(&self) -> Option<&Arc<ScoringModel>> {
        self.model.as_ref()
    }

    /// Replaces the model in every partition's predictor (and for those assigned
    /// later).
    pub fn set_model(&mut self, model: Arc<ScoringModel>) {
        for state in self.states.values() {
            if let Some(p) = &state.predictor {
                p.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_model(model.clone());
            }
        }
        self.model = Some(model);
    }

    /// The heat-map settings of one partition (`split_heat`): its share of the
    /// memory budget and of the shared sketch, and the threshold to own sketches split
    /// too, since a partition sees its share of each tenant's events.
    pub fn partition_heat_config(&self) -> HeatConfig {
        split_heat(&self.template.heat, self.partition_count)
    }

    /// Keeps checkpoint snapshots, taken on a topic of `partition_count`
    /// partitions, until their partitions are assigned.
    pub fn set_snapshots(&mut self, partition_count: i32, snapshots: HashMap<i32, Snapshot>) {
        self.snapshots = snapshots;
        self.snapshots_of = partition_count;
    }

    /// The offset of `partition`'s snapshot, if the checkpoint had one.
    pub fn snapshot_offset(&self, partition: i32) -> Option<i64> {
        self.snapshots.get(&partition).map(|s| s.next_offset)
    }

    /// Takes the snapshot of `partition`, if the checkpoint had one taken with the
    /// topic's current partition count.
    pub fn take_snapshot(&mut self, partition: i32) -> Option<Snapshot> {
        let snapshot = self.snapshots.remove(&partition)?;
        if self.snapshots_of != self.partition_count {
            tracing::warn!(
                partition,
                was = self.snapshots_of,
                now = self.partition_count,
                "snapshot of another partition count: not restored"
            );
            return None;
        }
        Some(snapshot)
    }

    /// Creates the state of a newly assigned partition: from `heat` (a snapshot) or
    /// empty, replaying from `replay_from` up to `live_from`. Replaces any state the
    /// partition had.
    pub fn assign(
        &mut self,
        partition: i32,
        heat: Option<HeatMap>,
        replay_from: i64,
        live_from: i64,
    ) -> &PartitionState {
        let config = self.partition_heat_config();
        let share = self.template.heat.memory_budget_bytes / self.partition_count.max(1) as u64;
        if config.memory_budget_bytes > share {
            tracing::warn!(
                partition,
                budget = self.template.heat.memory_budget_bytes,
                partitions = self.partition_count,
                floor = config.memory_budget_bytes,
                "memory budget below one shared sketch and one tenant per partition; the partition gets that floor"
            );
        }
        let mut heat = match heat {
            Some(mut h) => {
                if h.adopt_limits(&config) {
                    h
                } else {
                    HeatMap::new(config)
                }
            }
            None => HeatMap::new(config),
        };
        heat.set_allowed_tenants(self.template.allowed_tenants.clone());
        let predictor = self.template.predictor.as_ref().map(|config| {
            Mutex::new(Predictor::new(
                self.model.clone(),
                PredictorConfig {
                    policy: gated_policy(&config.policy),
                    ..config.clone()
                },
            ))
        });
        let state = PartitionState {
            partition,
            heat,
            predictor,
            next_offset: replay_from,
            live_from,
            replay_from,
            applied: 0,
            replayed: 0,
            high_watermark: -1,
        };
        self.states.insert(partition, state);
        &self.states[&partition]
    }

    /// A topic of `partition_count` partitions, none owned yet, with default sketches
    /// and no prediction (tests).
    #[cfg(test)]
    pub(crate) fn heat_only(partition_count: i32) -> Self {
        let mut partitions = Partitions::new(
            PartitionTemplate {
                heat: HeatConfig::default(),
                allowed_tenants: None,
                predictor: None,
            },
            None,
        );
        partitions.set_partition_count(partition_count);
        partitions
    }

    /// A topic of one partition whose state is `heat` and `predictor` (API tests).
    #[cfg(test)]
    pub(crate) fn single(heat: HeatMap, predictor: Option<Predictor>) -> SharedPartitions {
        let policy = predictor.as_ref().map(|p| p.policy().clone());
        let mut partitions = Partitions::new(
            PartitionTemplate {
                heat: heat.config().clone(),
                allowed_tenants: None,
                predictor: policy.map(|policy| PredictorConfig {
                    policy,
                    ..PredictorConfig::default()
                }),
            },
            predictor.as_ref().and_then(|p| p.model().cloned()),
        );
        partitions.set_partition_count(1);
        partitions.states.insert(
            0,
            PartitionState {
                partition: 0,
                heat,
                predictor: predictor.map(Mutex::new),
                next_offset: 0,
                live_from: 0,
                replay_from: 0,
                applied: 0,
                replayed: 0,
                high_watermark: -1,
            },
        );
        partitions.shared()
    }

    /// Parks a partition whose assignment was lost (the group could not be reached:
    /// another member may own it by now): it is no longer served, but its heat map
    /// and offset wait as a snapshot, written by the next checkpoint, so if the
    /// partition comes back here it resumes from them (replaying up to the committed
    /// offset, or going on live when it is ahead of it).
    pub fn park(&mut self, partition: i32) -> Option<i64> {
        let state = self.states.remove(&partition)?;
        if !self.snapshots.is_empty() && self.snapshots_of != self.partition_count {
            self.snapshots.clear();
        }
        self.snapshots_of = self.partition_count;
        let (calibration, traffic) = (state.saved_calibration(), state.saved_traffic());
        self.snapshots.insert(
            partition,
            Snapshot {
                next_offset: state.next_offset,
                heat: state.heat,
                calibration,
                traffic,
            },
        );
        Some(state.next_offset)
    }

    /// Snapshots waiting for their partition (from the checkpoint, or parked), with
    /// the partition count they were taken with.
    pub fn parked(&self) -> impl Iterator<Item = (i32, &Snapshot)> {
        self.snapshots
            .iter()
            .filter(|_| self.snapshots_of == self.partition_count)
            .map(|(&p, s)| (p, s))
    }

    /// Drops a revoked partition's state.
    pub fn revoke(&mut self, partition: i32) -> Option<PartitionState> {
        self.states.remove(&partition)
    }

    /// Each owned partition's line in `/healthz`.
    pub fn health(&self) -> Vec<PartitionHealth> {
        self.states
            .values()
            .map(|s| PartitionHealth {
                partition: s.partition,
                next_offset: s.next_offset,
                live_from: s.live_from,
                replaying: s.replaying(),
                lag: (s.high_watermark >= 0).then(|| (s.high_watermark - s.next_offset).max(0)),
                lateness_grace_ms: s.lateness_grace_ms(),
            })
            .collect()
    }

    /// The longest grace of the owned partitions (`pulse_event_lateness_grace_ms`).
    pub fn longest_lateness_grace_ms(&self) -> u64 {
        self.states
            .values()
            .filter_map(PartitionState::lateness_grace_ms)
            .max()
            .unwrap_or(0)
    }

    /// Records where an owned partition ends on the broker (statistics).
    pub fn set_high_watermark(&mut self, partition: i32, high: i64) {
        if let Some(state) = self.states.get_mut(&partition) {
            state.high_watermark = high;
        }
    }

    /// The newest watermark of the owned partitions: where merged answers end by
    /// default.
    pub fn now_ms(&self) -> u64 {
        self.states
            .values()
            .map(|s| s.heat.now_ms())
            .max()
            .unwrap_or(0)
    }

    /// Approximate bytes held by all owned heat maps.
    pub fn memory_bytes(&self) -> usize {
        self.states.values().map(|s| s.heat.memory_bytes()).sum()
    }
}

/// `heat` for one of `partitions` partitions: the memory budget and the threshold
/// to own sketches split evenly, and the shared sketch's error multiplied (never
/// coarser than an own sketch's), so the shared sketches of all partitions together
/// take the memory one took, and a key's estimate has the absolute bound it had: its
/// partition's shared stream is about 1/P of the whole. A tenant's own sketches keep
/// their width (a tenant big enough for them is big in every partition).
pub(crate) fn split_heat(heat: &HeatConfig, partitions: i32) -> HeatConfig {
    let p = partitions.max(1) as u64;
    let mut split = HeatConfig {
        shared_sketch_below: if heat.shared_sketch_below == 0 {
            0
        } else {
            (heat.shared_sketch_below / p).max(1)
        },
        shared_error: (heat.shared_error * p as f64).min(heat.error.max(heat.shared_error)),
        top_k: split_top(heat.top_k, p),
        region_top_k: split_top(heat.region_top_k, p),
        ..heat.clone()
    };
    let floor = (split.shared_bytes() + split.own_tenant_bytes()) as u64;
    split.memory_budget_bytes = (heat.memory_budget_bytes / p).max(floor);
    split
}

/// A partition's share of a top-K size: twice its even share (keys are spread unevenly
/// over partitions), never more than `k`. The top-K lists are the candidates the
/// predictor tracks and scores: a full-size list in every partition would track and
/// score `partitions` times the keys one heat map does, for the same events.
fn split_top(k: usize, partitions: u64) -> usize {
    (k.div_ceil(partitions as usize) * 2).clamp(1, k.max(1))
}

/// `policy` for a partition's decider: no budget of its own (the fleet's gate holds
/// each tenant's one budget; a split per partition wasted most of it where a tenant's
/// keys crowd a few partitions, and refilled on every move).
pub(crate) fn gated_policy(policy: &DecisionPolicy) -> DecisionPolicy {
    DecisionPolicy {
        // Finite, so a bucket's arithmetic stays finite: never reached.
        tenant_rate_per_s: f64::MAX,
        tenant_burst: f64::MAX,
        ..policy.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(prewarm: bool) -> PartitionTemplate {
        PartitionTemplate {
            heat: HeatConfig::default(),
            allowed_tenants: None,
            predictor: prewarm.then(PredictorConfig::default),
        }
    }

    /// A partition's decider has no budget of its own: the gate's is the fleet's.
    #[test]
    fn a_partitions_decider_leaves_the_budget_to_the_gate() {
        let policy = DecisionPolicy {
            tenant_rate_per_s: 8.0,
            tenant_burst: 4.0,
            ..DecisionPolicy::default()
        };
        let local = gated_policy(&policy);
        assert_eq!(
            (local.tenant_rate_per_s, local.tenant_burst),
            (f64::MAX, f64::MAX)
        );
        assert_eq!(local.cooldown_ms, policy.cooldown_ms);
    }

    /// A partition's heat map gets its share of the memory budget, never less than
    /// one tenant needs.
    #[test]
    fn the_memory_budget_is_split_over_the_partitions() {
        let heat = HeatConfig::default();
        let split = split_heat(&heat, 8);
        assert_eq!(split.memory_budget_bytes, heat.memory_budget_bytes / 8);
        assert_eq!(split.shared_sketch_below, heat.shared_sketch_below / 8);
        // Eight shared sketches take the memory of one, each 1/8 as wide.
        assert_eq!(8 * split.shared_bytes(), heat.shared_bytes());
        assert_eq!(split.width(), heat.width());
        // Top-K lists: twice the even share, so all partitions together track about
        // twice the keys one heat map does, not eight times.
        assert_eq!((split.top_k, split.region_top_k), (16, 4));
        assert!(split.validate().is_ok());
        assert_eq!(split_heat(&heat, 1), heat);
        assert_eq!(split_heat(&heat, 1000).top_k, 2);
        let tiny = HeatConfig {
            memory_budget_bytes: (heat.shared_bytes() + heat.own_tenant_bytes()) as u64,
            ..HeatConfig::default()
        };
        assert!(split_heat(&tiny, 1000).validate().is_ok());
    }

    /// `/healthz` gives each partition's grace, how late its own events arrived, and
    /// the metric the longest.
    #[test]
    fn each_partitions_health_tells_how_late_its_events_arrive() {
        let mut partitions = Partitions::new(template(true), None);
        partitions.set_partition_count(2);
        partitions.assign(0, None, 0, 0);
        partitions.assign(1, None, 0, 0);
        let late = &partitions.states()[&1];
        let mut predictor = late.predictor.as_ref().unwrap().lock().unwrap();
        for i in 0..1_000u64 {
            // Every other event 600 ms behind the newest.
            let ts_ms = 1_764_460_740_000 + i * 10 - (i % 2) * 600;
            let event = models::AccessEvent::new(
                ts_ms,
                "acme".parse().unwrap(),
                "/a".parse().unwrap(),
                "eu".parse().unwrap(),
                "n1".parse().unwrap(),
                models::Outcome::Hit,
            );
            predictor.observe(&event.borrowed());
        }
        drop(predictor);
        let grace: Vec<_> = partitions
            .health()
            .iter()
            .map(|h| (h.partition, h.lateness_grace_ms))
            .collect();
        assert!(grace.contains(&(0, Some(0))), "{grace:?}");
        assert!(grace.contains(&(1, Some(550))), "{grace:?}");
        assert_eq!(partitions.longest_lateness_grace_ms(), 550);
        let mut without_prediction = Partitions::new(template(false), None);
        without_prediction.set_partition_count(1);
        without_prediction.assign(0, None, 0, 0);
        assert_eq!(without_prediction.health()[0].lateness_grace_ms, None);
    }

    /// Assign creates a fresh state replaying up to the committed offset; revoke
    /// drops it; the model reaches every predictor.
    #[test]
    fn assign_and_revoke_create_and_drop_states() {
        let mut partitions = Partitions::new(template(true), None);
        partitions.set_partition_count(2);
        let state = partitions.assign(1, None, 10, 15);
        assert!(state.replaying() && state.is_replay(14) && !state.is_replay(15));
        partitions.assign(0, None, 0, 0);
        assert_eq!(partitions.owned(), [0, 1]);
        assert!(partitions.complete());
        partitions.set_model(Arc::new(crate::predict::default_model()));
        for state in partitions.states().values() {
            let p = state.predictor.as_ref().unwrap().lock().unwrap();
            assert!(p.model().is_some());
        }
        assert!(partitions.revoke(1).is_some());
        assert!(!partitions.complete());
        assert!(
            partitions.take_snapshot(1).is_none(),
            "a revoked state is dropped"
        );

        // A lost partition waits as a snapshot and comes back from it.
        partitions.assign(1, None, 0, 0);
        partitions.states_mut().get_mut(&1).unwrap().next_offset = 42;
        assert_eq!(partitions.park(1), Some(42));
        assert_eq!(partitions.owned(), [0]);
        assert_eq!(
            partitions
                .parked()
                .map(|(p, s)| (p, s.next_offset))
                .collect::<Vec<_>>(),
            [(1, 42)]
        );
        assert_eq!(partitions.take_snapshot(1).map(|s| s.next_offset), Some(42));
        assert!(partitions.revoke(1).is_none());
        assert_eq!(
            partitions.health(),
            [PartitionHealth {
                partition: 0,
                next_offset: 0,
                live_from: 0,
                replaying: false,
                lag: None,
                lateness_grace_ms: Some(0),
            }]
        );
        // The lag is the partition's end on the broker less what was applied; a
        // partition not owned (here the parked one) is not recorded.
        partitions.set_high_watermark(0, 7);
        partitions.set_high_watermark(1, 99);
        assert_eq!(partitions.health()[0].lag, Some(7));
        assert_eq!(partitions.health().len(), 1);
    }
}
