//! Pulse's side of the simulation: the production [`HeatMap`] and [`Predictor`]
//! (scoring, decider, tenant budget) fed sampled access events on event time, and
//! their commands held back for the delivery delay before the nodes see them.
//!
//! Events are sampled: one event stands for `event_scale` requests (the heat map takes
//! single events), with an unbiased running remainder per stream so the sampling does
//! not depend on the order of the nodes.

use std::collections::VecDeque;
use std::sync::Arc;

use models::{AccessEvent, CacheKey, Domain, NodeId, Outcome, PrewarmCommand, RegionId, TenantId};
use pulse::{DecisionCounts, HeatConfig, HeatMap, Predictor, PredictorConfig, default_model};

/// Event time of virtual time 0 (pulse reads event time, and some features the hour).
pub(super) const EPOCH_MS: u64 = 1_800_000_000_000;

/// The heat map, the predictor and the commands in transit.
pub(super) struct PulseSide {
    heat: HeatMap,
    predictor: Predictor,
    tenant: TenantId,
    viral_referrer: Domain,
    background_referrer: Domain,
    in_transit: VecDeque<(u64, PrewarmCommand)>,
    delay_ms: u64,
    /// Events the heat map applied.
    pub(super) applied: u64,
    /// Events it refused.
    pub(super) refused: u64,
}

impl PulseSide {
    /// A pulse with the shipped model, past its warm-up: with the model's own
    /// confidence (`--no-calibrate-online`), as a fresh pulse waits for a key's second
    /// region until first-region outcomes are judged, and a run of seconds holds none.
    /// Commands reach the nodes `delay_ms` after they are sent.
    pub(super) fn new(tenant: TenantId, delay_ms: u64) -> PulseSide {
        let config = PredictorConfig {
            calibrate_online: false,
            ..PredictorConfig::default()
        };
        PulseSide {
            heat: HeatMap::new(HeatConfig::default()),
            predictor: Predictor::new(Some(Arc::new(default_model())), config),
            tenant,
            viral_referrer: Domain::new("t.co").expect("valid domain"),
            background_referrer: Domain::new("www.google.com").expect("valid domain"),
            in_transit: VecDeque::new(),
            delay_ms,
            applied: 0,
            refused: 0,
        }
    }

    /// One sampled access event at virtual `now_ms`.
    pub(super) fn event(
        &mut self,
        now_ms: u64,
        key: &CacheKey,
        region: &RegionId,
        node: &NodeId,
        outcome: Outcome,
        viral: bool,
    ) {
        let mut event = AccessEvent::new(
            EPOCH_MS + now_ms,
            self.tenant.clone(),
            key.clone(),
            region.clone(),
            node.clone(),
            outcome,
        );
        event.referrer = Some(if viral {
            self.viral_referrer.clone()
        } else {
            self.background_referrer.clone()
        });
        let event = event.borrowed();
        match self.heat.apply_ref(&event) {
            Ok(()) => {
                self.applied += 1;
                self.predictor.observe(&event);
            }
            Err(_) => self.refused += 1,
        }
    }

    /// Scores and decides at virtual `now_ms`; commands sent go in transit.
    pub(super) fn tick(&mut self, now_ms: u64) {
        for command in self.predictor.tick(&self.heat, EPOCH_MS + now_ms) {
            self.in_transit.push_back((now_ms + self.delay_ms, command));
        }
    }

    /// Commands whose delivery time has come.
    pub(super) fn delivered(&mut self, now_ms: u64) -> Vec<PrewarmCommand> {
        let mut out = Vec::new();
        while self.in_transit.front().is_some_and(|(at, _)| *at <= now_ms) {
            out.push(self.in_transit.pop_front().expect("checked").1);
        }
        out
    }

    /// The decider's totals.
    pub(super) fn counts(&self) -> DecisionCounts {
        self.predictor.counts()
    }
}

/// Turns counts of requests into a whole number of events: one per `scale` requests,
/// the remainder carried to the next call.
#[derive(Debug, Clone, Default)]
pub(super) struct Sampler {
    carry: f64,
}

impl Sampler {
    /// How many events `requests` requests make at one event per `scale`.
    pub(super) fn take(&mut self, requests: f64, scale: f64) -> u32 {
        self.carry += requests / scale.max(1.0);
        let n = self.carry.floor();
        self.carry -= n;
        n as u32
    }
}
