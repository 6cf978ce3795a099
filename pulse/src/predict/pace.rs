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
//! next region was the tenant's busiest unreached one in 52 % of the steps, against
//! 22 % by chance.
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

use std::collections::HashMap;

use models::TenantId;

/// How far and how fast a key spread in its current burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pace {
    /// Regions it reached after its first one.
    pub(crate) spread: usize,
    /// Time since its burst began, ms.
    pub(crate) elapsed_ms: u64,
}

/// Weight of each newly measured pace in a tenant's (and the fleet's) typical one.
const PACE_ALPHA: f64 = 0.2;

/// The typical time between two regions of a spread, per tenant and for the fleet:
/// an EWMA of the paces measured when keys that had spread were decided on.
#[derive(Debug, Default)]
pub(crate) struct Paces {
    tenants: HashMap<TenantId, f64>,
    fleet: Option<f64>,
}

impl Paces {
    /// The pace to judge a key by: `measured` (its own, once it spread), which is also
    /// remembered, or else the tenant's typical one, or the fleet's.
    pub(crate) fn judge(&mut self, tenant: &TenantId, measured: Option<Pace>) -> Option<Pace> {
        match measured.filter(|p| p.spread > 0) {
            Some(pace) => {
                let gap = pace.elapsed_ms as f64 / pace.spread as f64;
                let ewma = |old: Option<f64>| old.map_or(gap, |o| o + PACE_ALPHA * (gap - o));
                self.fleet = Some(ewma(self.fleet));
                let typical = ewma(self.tenants.get(tenant).copied());
                self.tenants.insert(tenant.clone(), typical);
                Some(pace)
            }
            None => {
                let gap = self.tenants.get(tenant).copied().or(self.fleet)?;
                Some(Pace {
                    spread: 1,
                    elapsed_ms: gap.round() as u64,
                })
            }
        }
    }
}

/// Each unreached region's chance of asking within `ttl_ms`, from `weights` (the
/// tenant's recent requests from each). Every chance is 1 while the pace is unknown
/// (`None`, or no spread yet), when the pace reaches them all in time, or when no
/// region has any weight.
pub(crate) fn chances(pace: Option<Pace>, ttl_ms: u64, weights: &[f64]) -> Vec<f64> {
    let all = vec![1.0; weights.len()];
    let Some(pace) = pace.filter(|p| p.spread > 0) else {
        return all;
    };
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let expected = pace.spread as f64 * ttl_ms as f64 / pace.elapsed_ms.max(1) as f64;
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
    shares.iter().map(|s| 1.0 - (-lambda * s).exp()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 60_000;

    fn pace(spread: usize, elapsed_ms: u64) -> Option<Pace> {
        Some(Pace { spread, elapsed_ms })
    }

    /// Before any spread, the pace says nothing: every region keeps chance 1.
    #[test]
    fn without_a_spread_every_region_is_named() {
        assert_eq!(chances(None, TTL, &[5.0, 1.0]), vec![1.0, 1.0]);
        assert_eq!(chances(pace(0, 20_000), TTL, &[5.0, 1.0]), vec![1.0, 1.0]);
    }

    /// A fast spread reaches every region in time: each keeps chance 1.
    #[test]
    fn a_fast_spread_reaches_every_region_in_time() {
        // One region in 3 s: 20 more within the TTL, of 5 left.
        assert_eq!(
            chances(pace(1, 3_000), TTL, &[9.0, 1.0, 1.0, 1.0, 0.1]),
            vec![1.0; 5]
        );
    }

    /// A slow spread reaches only some regions in time; the chances add up to how many,
    /// and a region of more of the tenant's requests has the higher chance.
    #[test]
    fn a_slow_spread_reaches_the_busier_regions_first() {
        // One region in 20 s: 3 more within the TTL, of 5 left.
        let weights = [40.0, 25.0, 15.0, 10.0, 10.0];
        let p = chances(pace(1, 20_000), TTL, &weights);
        let sum: f64 = p.iter().sum();
        assert!((sum - 3.0).abs() < 1e-6, "{p:?}");
        assert!(p.windows(2).all(|w| w[0] >= w[1]), "{p:?}");
        assert!(p[0] > 0.8 && p[4] < 0.5, "{p:?}");
        // Regions alike share the count evenly.
        let even = chances(pace(1, 20_000), TTL, &[1.0; 5]);
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
        assert_eq!(paces.judge(&slow, pace(2, 40_000)), pace(2, 40_000));
        assert_eq!(paces.judge(&slow, pace(0, 1_000)), pace(1, 20_000));
        assert_eq!(paces.judge(&other, None), pace(1, 20_000), "the fleet's");
        // A faster spread moves the tenant's pace by a fifth of the difference.
        paces.judge(&slow, pace(1, 10_000));
        assert_eq!(paces.judge(&slow, None), pace(1, 18_000));
    }
}
