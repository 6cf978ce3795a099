//! Labels for the model: did demand come? A key scored at `t` is *viral* when, within
//! the horizon after `t` (the command TTL: as long as a command sent at `t` would be
//! valid, what the honest scorer counts), at least one region that had not asked for it
//! in the minute before `t` asks for it at least [`MIN_REGION_DEMAND`] times: exactly
//! the case where a pre-warm at `t` pays off. Pulse labels its own scoring moments this way, online
//! and in replays alike, so training needs no hand-made labels.

use std::collections::{HashMap, VecDeque};

use models::{CacheKey, TenantId};
use serde::Serialize;

use super::features::Features;
use super::tracker::Tracker;

pub(crate) use super::pipeline::policy::MIN_REGION_DEMAND;

/// One scoring moment with its label.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// When the key was scored.
    pub ts_ms: u64,
    /// The tenant.
    pub tenant: TenantId,
    /// The key.
    pub key: CacheKey,
    /// Its features then.
    pub features: Features,
    /// Whether demand came.
    pub viral: bool,
}

struct Pending {
    due_ms: u64,
    tenant: TenantId,
    key: CacheKey,
    features: Features,
    unseen_counts: Vec<(usize, u32)>,
    ts_ms: u64,
}

/// Scoring moments waiting for their horizon to pass, and the labelled ones.
pub(crate) struct Labeler {
    horizon_ms: u64,
    sample_every_ms: u64,
    capacity: usize,
    pending: VecDeque<Pending>,
    labelled: VecDeque<Sample>,
    last_sample_ms: HashMap<(TenantId, CacheKey), u64>,
}

impl Labeler {
    pub(crate) fn new(horizon_ms: u64, sample_every_ms: u64, capacity: usize) -> Self {
        Labeler {
            horizon_ms,
            sample_every_ms,
            capacity,
            pending: VecDeque::new(),
            labelled: VecDeque::new(),
            last_sample_ms: HashMap::new(),
        }
    }

    /// Offers a scoring moment; at most one per key per `sample_every_ms` is kept.
    /// `named` gives the regions a command then would name, with their request counts
    /// so far (called only for a moment that is kept): the label asks whether one of
    /// them asks in time, and a moment that would name none is no moment to learn from.
    pub(crate) fn offer(
        &mut self,
        now_ms: u64,
        tenant: &TenantId,
        key: &CacheKey,
        features: &Features,
        named: impl FnOnce() -> Vec<(usize, u32)>,
    ) {
        let last = self
            .last_sample_ms
            .entry((tenant.clone(), key.clone()))
            .or_insert(0);
        if *last != 0 && now_ms < *last + self.sample_every_ms {
            return;
        }
        *last = now_ms;
        let unseen_counts = named();
        if unseen_counts.is_empty() {
            return;
        }
        if self.pending.len() >= self.capacity {
            self.pending.pop_front();
        }
        self.pending.push_back(Pending {
            due_ms: now_ms + self.horizon_ms,
            tenant: tenant.clone(),
            key: key.clone(),
            features: *features,
            unseen_counts,
            ts_ms: now_ms,
        });
    }

    /// Labels every moment whose horizon has passed at `now_ms`; returns how many (the
    /// newest of [`Labeler::labelled`]).
    pub(crate) fn settle(&mut self, now_ms: u64, tracker: &Tracker) -> usize {
        let mut settled = 0;
        while self.pending.front().is_some_and(|p| p.due_ms <= now_ms) {
            let p = self.pending.pop_front().expect("checked above");
            let key = tracker
                .tenants
                .get(&p.tenant)
                .and_then(|t| t.keys.get(&p.key));
            let viral = key.is_some_and(|k| {
                p.unseen_counts.iter().any(|(region, before)| {
                    k.region_count(*region).saturating_sub(*before) >= MIN_REGION_DEMAND
                })
            });
            if self.labelled.len() >= self.capacity {
                self.labelled.pop_front();
            }
            self.labelled.push_back(Sample {
                ts_ms: p.ts_ms,
                tenant: p.tenant,
                key: p.key,
                features: p.features,
                viral,
            });
            settled += 1;
        }
        if self.last_sample_ms.len() > self.capacity {
            let every = self.sample_every_ms;
            self.last_sample_ms.retain(|_, t| *t + every > now_ms);
        }
        settled.min(self.labelled.len())
    }

    /// The labelled samples, oldest first.
    pub(crate) fn labelled(&self) -> impl ExactSizeIterator<Item = &Sample> {
        self.labelled.iter()
    }

    /// Takes the labelled samples out.
    pub(crate) fn take(&mut self) -> Vec<Sample> {
        self.labelled.drain(..).collect()
    }
}
