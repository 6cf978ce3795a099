//! A warm-up's progress, as `GET /api/warm/{id}` shows it.

use std::collections::BTreeMap;

use models::Outcome;
use serde::Serialize;
use utoipa::ToSchema;

/// Where a warm-up is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Before `not_before`.
    Waiting,
    /// Proposing its commands at its pace.
    Sending,
    /// Every command proposed; the edges may still be filling.
    Sent,
    /// Pulse stopped before every command was proposed.
    Stopped,
}

/// What the edges of one region said of the warm-up's keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct RegionProgress {
    /// Keys a node filled from the origin for the warm-up (`prefetch_fill`).
    pub filled: u64,
    /// Keys a node found already cached (`prefetch_cached`).
    pub cached: u64,
}

/// A warm-up's progress.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(crate) struct Progress {
    pub phase: Phase,
    /// Keys in the warm-up.
    pub keys: u64,
    /// Commands proposed to the fleet's gate (one per key, for all its regions).
    pub sent: u64,
    /// Commands that could not be proposed (the producer refused them).
    pub failed: u64,
    /// Per region: what its edges reported for the warm-up's keys since it began.
    pub regions: BTreeMap<String, RegionProgress>,
    /// When the last command was proposed (ms since the Unix epoch).
    pub last_sent_ms: Option<u64>,
}

impl Progress {
    pub(super) fn new(keys: usize) -> Self {
        Progress {
            phase: Phase::Waiting,
            keys: keys as u64,
            sent: 0,
            failed: 0,
            regions: BTreeMap::new(),
            last_sent_ms: None,
        }
    }

    pub(super) fn sent(&mut self, at_ms: u64) {
        self.phase = Phase::Sending;
        self.sent += 1;
        self.last_sent_ms = Some(at_ms);
    }

    pub(super) fn failed(&mut self, at_ms: u64) {
        self.phase = Phase::Sending;
        self.failed += 1;
        self.last_sent_ms = Some(at_ms);
    }

    /// Counts an edge's report for a (key, region) not credited before; false if it
    /// is not a report, or the region is one too many to keep.
    pub(super) fn credit(&mut self, region: &str, outcome: Outcome) -> bool {
        if !self.regions.contains_key(region) && self.regions.len() >= super::MAX_REGIONS {
            return false;
        }
        let counts = self.regions.entry(region.to_owned()).or_default();
        match outcome {
            Outcome::PrefetchFill => counts.filled += 1,
            Outcome::PrefetchCached => counts.cached += 1,
            _ => return false,
        }
        true
    }

    pub(super) fn sending_done(&mut self, _at_ms: u64) {
        self.phase = Phase::Sent;
    }

    pub(super) fn stop(&mut self, _at_ms: u64) {
        self.phase = Phase::Stopped;
    }

    /// Whether nothing more will be proposed.
    pub(super) fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Sent | Phase::Stopped)
    }
}
