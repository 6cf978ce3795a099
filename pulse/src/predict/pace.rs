//! Which of the unreached regions a spreading key will reach while a command is valid.
//!
//! A viral reaches its regions one after another. When it is slow (tens of seconds
//! between regions), a command that names every unreached region names some that ask
//! only after it expired: wasted fills, however sure the spread itself is. Once the
//! key has spread at least once its pace is known: the regions it reached after its
//! first, over the time since its burst began (when its demand began, for a new key
//! whose ramp was noticed late), times the command's TTL, is how many more it will
//! likely reach in time. Which ones: a region where more of the tenant's
//! audience lives (more of its recent requests) is reached sooner, as more of its
//! people pass the link on. Measured on a trace written elsewhere (b-slow-spread), the
//! next region was the tenant's busiest unreached one in 0.397 of the steps with a
//! choice, against 0.321 by chance (`scripts/join-commands`): a weak signal.
//!
//! At the first region no spread is seen yet; the pace then is the one the tenant's
//! earlier spreads showed (the fleet's, for a tenant none of whose keys spread yet):
//! [`Paces`]. Before any spread at all every region is named.
//!
//! A region's chance is its inclusion probability when that many regions are drawn
//! without replacement, each in proportion to its requests (the conditional-Poisson
//! approximation: `1 − exp(−λ·share)`, with λ such that the chances add up to the
//! expected count). Before any spread the pace is unknown and every chance is 1: the
//! confidence alone says whether the key spreads, and [`super::Decider`] weighs each
//! named region's chance against what its fill may waste.
//!
//! A spread also stops, and nothing in the events says when: only its silence does. A
//! key that reached a region every 3 s and none for the last 10 s has most likely
//! reached all it will (our scattered-spread family: three commands sent 10 s after
//! their virals' last region, each wasted). Silent for more than [`STALL_GRACE_GAPS`]
//! of its gaps (its own, or its tenant's typical one if that is longer: one quick step
//! says little), each further gap of silence divides its chances by e, as if the wait
//! for its next region were exponential beyond that grace.

use std::collections::HashMap;

use models::TenantId;
use serde::{Deserialize, Serialize};

use super::pipeline::policy::{PACE_ALPHA, STALL_GRACE_GAPS};

/// How far and how fast a key spread in its current burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pace {
    /// Regions it reached after its first one.
    pub(crate) spread: usize,
    /// Time since its burst began, ms.
    pub(crate) elapsed_ms: u64,
    /// Time since it last reached a region (since its burst began, before any), ms.
    pub(crate) silent_ms: u64,
}

/// What a key's pace says about its next regions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outlook {
    /// Time per region it reaches, ms: the TTL over this is how many it reaches in time.
    pub(crate) gap_ms: f64,
    /// How likely it is still spreading, after its silence (1 within the grace).
    pub(crate) spreading: f64,
}

/// How likely a spread whose regions come every `gap_ms` is still spreading after
/// `silent_ms` without a new one.
fn still_spreading(silent_ms: u64, gap_ms: f64) -> f64 {
    let gap = gap_ms.max(1.0);
    let beyond = (silent_ms as f64 - STALL_GRACE_GAPS * gap).max(0.0);
    (-beyond / gap).exp()
}

/// The typical time between two regions of a spread, per tenant and for the fleet:
/// an EWMA of the paces measured when keys that had spread were decided on.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Paces {
    tenants: HashMap<TenantId, f64>,
    fleet: Option<f64>,
}

/// Tenants whose paces a checkpoint may bring back, at most.
const MAX_SAVED_TENANTS: usize = 100_000;

impl Paces {
    /// Paces a checkpoint kept, if they are paces: each a finite positive gap, for at
    /// most [`MAX_SAVED_TENANTS`] tenants.
    pub(crate) fn restore(saved: Paces) -> Option<Paces> {
        let gap = |g: &f64| g.is_finite() && *g > 0.0;
        (saved.tenants.len() <= MAX_SAVED_TENANTS
            && saved.tenants.values().all(gap)
            && saved.fleet.as_ref().is_none_or(gap))
        .then_some(saved)
    }

    /// The outlook to judge a key by: from `measured` (its own pace, once it spread),
    /// which is also remembered, or else from its tenant's typical pace, or the
    /// fleet's; its silence (in `measured`) weighed against the longer of its own gap
    /// and its tenant's. `None` before any spread was measured.
    pub(crate) fn judge(&mut self, tenant: &TenantId, measured: Option<Pace>) -> Option<Outlook> {
        let typical = self.tenants.get(tenant).copied().or(self.fleet);
        let silent_ms = measured.map_or(0, |p| p.silent_ms);
        match measured.filter(|p| p.spread > 0) {
            Some(pace) => {
                let gap = pace.elapsed_ms as f64 / pace.spread as f64;
                // Its gap while it was reaching regions, before the silence: what its
                // tenant's typical pace learns, so a stopped spread judged again and
                // again does not stretch it.
                let active = pace.elapsed_ms.saturating_sub(silent_ms) as f64 / pace.spread as f64;
                let ewma = |old: Option<f64>| old.map_or(active, |o| o + PACE_ALPHA * (active - o));
                self.fleet = Some(ewma(self.fleet));
                let tenant_gap = ewma(self.tenants.get(tenant).copied());
                self.tenants.insert(tenant.clone(), tenant_gap);
                let stall_gap = typical.map_or(active, |t| active.max(t));
                Some(Outlook {
                    gap_ms: gap,
                    spreading: still_spreading(silent_ms, stall_gap),
                })
            }
            None => typical.map(|gap| Outlook {
                gap_ms: gap,
                spreading: still_spreading(silent_ms, gap),
            }),
        }
    }
}

/// Each unreached region's chance of asking within `ttl_ms`, from `weights` (the
/// tenant's recent requests from each), times how likely the key is still spreading.
/// Every chance is 1 while the pace is unknown (`None`), and as likely as the spread
/// goes on when the pace reaches every region in time or no region has any weight.
pub(crate) fn chances(outlook: Option<Outlook>, ttl_ms: u64, weights: &[f64]) -> Vec<f64> {
    let Some(outlook) = outlook else {
        return vec![1.0; weights.len()];
    };
    let all = vec![outlook.spreading; weights.len()];
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let expected = ttl_ms as f64 / outlook.gap_ms.max(1.0);
    if total <= 0.0 || expected >= weights.len() as f64 {
        return all;
    }
    let shares: Vec<f64> = weights.iter().map(|w| w.max(0.0) / total).collect();
    let drawn = |lambda: f64| -> f64 { shares.iter().map(|s| 1.0 - (-lambda * s).exp()).sum() };
    // λ grows until the chances add up to the expected count, then is bisected.
    let (mut low, mut high) = (0.0, 1.0);
    while drawn(high) < expected && high < 1e6 {
        (low, high) = (high, high * 2.0);
    }
    for _ in 0..50 {
        let mid = 0.5 * (low + high);
        if drawn(mid) < expected {
            low = mid;
        } else {
            high = mid;
        }
    }
    let lambda = 0.5 * (low + high);
    shares
        .iter()
        .map(|s| outlook.spreading * (1.0 - (-lambda * s).exp()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 60_000;

    fn pace(spread: usize, elapsed_ms: u64, silent_ms: u64) -> Option<Pace> {
        Some(Pace {
            spread,
            elapsed_ms,
            silent_ms,
        })
    }

    /// A spread of a region every `gap_ms`, surely still going.
    fn outlook(gap_ms: f64) -> Option<Outlook> {
        Some(Outlook {
            gap_ms,
            spreading: 1.0,
        })
    }

    /// Before any spread, the pace says nothing: every region keeps chance 1.
    #[test]
    fn without_a_spread_every_region_is_named() {
        assert_eq!(chances(None, TTL, &[5.0, 1.0]), vec![1.0, 1.0]);
        assert_eq!(
            Paces::default().judge(&"t".parse().unwrap(), pace(0, 20_000, 20_000)),
            None
        );
    }

    /// A fast spread reaches every region in time: each keeps chance 1.
    #[test]
    fn a_fast_spread_reaches_every_region_in_time() {
        // One region in 3 s: 20 more within the TTL, of 5 left.
        assert_eq!(
            chances(outlook(3_000.0), TTL, &[9.0, 1.0, 1.0, 1.0, 0.1]),
            vec![1.0; 5]
        );
    }

    /// A slow spread reaches only some regions in time; the chances add up to how many,
    /// and a region of more of the tenant's requests has the higher chance.
    #[test]
    fn a_slow_spread_reaches_the_busier_regions_first() {
        // One region in 20 s: 3 more within the TTL, of 5 left.
        let weights = [40.0, 25.0, 15.0, 10.0, 10.0];
        let p = chances(outlook(20_000.0), TTL, &weights);
        let sum: f64 = p.iter().sum();
        assert!((sum - 3.0).abs() < 1e-6, "{p:?}");
        assert!(p.windows(2).all(|w| w[0] >= w[1]), "{p:?}");
        assert!(p[0] > 0.8 && p[4] < 0.5, "{p:?}");
        // Regions alike share the count evenly.
        let even = chances(outlook(20_000.0), TTL, &[1.0; 5]);
        assert!(even.iter().all(|c| (c - 0.6).abs() < 1e-6), "{even:?}");
    }

    /// A key that has not spread yet is judged by the pace its tenant's earlier spreads
    /// showed, or the fleet's for a tenant without any; before any spread, by none.
    #[test]
    fn a_first_region_is_judged_by_the_tenants_earlier_spreads() {
        let (slow, other): (TenantId, TenantId) = ("slow".parse().unwrap(), "new".parse().unwrap());
        let mut paces = Paces::default();
        assert_eq!(paces.judge(&slow, None), None);
        // Measured paces pass through, and are remembered: 2 regions in 40 s.
        assert_eq!(paces.judge(&slow, pace(2, 40_000, 0)), outlook(20_000.0));
        assert_eq!(paces.judge(&slow, pace(0, 1_000, 1_000)), outlook(20_000.0));
        assert_eq!(paces.judge(&other, None), outlook(20_000.0), "the fleet's");
        // A faster spread moves the tenant's pace by a fifth of the difference.
        paces.judge(&slow, pace(1, 10_000, 0));
        assert_eq!(paces.judge(&slow, None), outlook(18_000.0));
    }

    /// A spread silent for more than its grace of gaps has likely stopped: each further
    /// gap of silence divides every chance by e, fast spreads' included.
    #[test]
    fn a_spread_that_went_silent_fades() {
        let tenant: TenantId = "scattered".parse().unwrap();
        // Its tenant's spreads: a region every 3 s.
        let judged = |now: Option<Pace>| {
            let mut paces = Paces::default();
            paces.judge(&tenant, pace(3, 9_000, 0));
            paces.judge(&tenant, now)
        };
        // Silent for 2 of its 3 s gaps: still spreading.
        assert_eq!(judged(pace(1, 9_000, 6_000)).unwrap().spreading, 1.0);
        // One region at 3 s, then silent 11 s: 5 s beyond the grace, e^(-5/3).
        let silent = judged(pace(1, 14_000, 11_000));
        let fading = silent.unwrap().spreading;
        assert!((fading - (-5.0_f64 / 3.0).exp()).abs() < 1e-9, "{fading}");
        let p = chances(silent, TTL, &[1.0; 4]);
        assert!(p.iter().all(|c| (c - fading).abs() < 1e-9), "{p:?}");
        // At the first region, the tenant's gap against its silence.
        let alone = judged(pace(0, 30_000, 30_000)).unwrap();
        assert!(alone.spreading < 0.01, "{alone:?}");
    }

    /// One quick step of a tenant whose spreads are slow is no evidence of a fast
    /// spread: its silence is weighed against the tenant's longer gap.
    #[test]
    fn a_quick_step_of_a_slow_tenant_does_not_stall_it() {
        let tenant: TenantId = "slow".parse().unwrap();
        let mut paces = Paces::default();
        paces.judge(&tenant, pace(2, 40_000, 0)); // 20 s a region
        // A region at 10 s, then 25 s of silence: 2.5 of its own gaps, 1.25 of the tenant's.
        let judged = paces.judge(&tenant, pace(1, 35_000, 25_000)).unwrap();
        assert_eq!(judged.spreading, 1.0);
    }
}
