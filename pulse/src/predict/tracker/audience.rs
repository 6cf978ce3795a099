//! Audiences: which of a tenant's regions share a taste, so that a command names the
//! regions of the audiences a key has reached and not the others.

use super::super::pipeline::policy::{MIN_AUDIENCE_REQUESTS, SAME_AUDIENCE_SHARE};
use super::{TenantTracker, TrackedKey};

impl TenantTracker {
    /// Which of `unseen` share an audience with some region of `reached` (together,
    /// the tenant's regions). Taste is a region's steady demand, key by key: the
    /// log-damped request counts of the tenant's tracked keys that never burst (one
    /// crowd would outweigh a region's whole taste, and so would a few shared keys
    /// were counts not damped). A region shares an audience with a reached one when
    /// their tastes' cosine is at least [`SAME_AUDIENCE_SHARE`] of the best any
    /// region reaches with the reached ones: how alike two regions look depends on
    /// how many keys were seen, what sets an audience apart is that others look
    /// less alike. A region with too few requests to tell is kept.
    pub(crate) fn same_audience(&self, reached: &[usize], unseen: &[usize]) -> Vec<bool> {
        let regions: Vec<usize> = reached.iter().chain(unseen).copied().collect();
        let taste = |k: &TrackedKey, r: usize| f64::from(k.region_count(r)).ln_1p();
        // Per region: Σ taste², requests; per (reached, region): Σ of the products.
        let mut norms = vec![(0.0, 0.0); regions.len()];
        let mut dots = vec![vec![0.0; regions.len()]; reached.len()];
        let mut row = vec![0.0; regions.len()];
        for k in self.keys.values().filter(|k| k.bursts.is_empty()) {
            for (x, (r, n)) in row.iter_mut().zip(regions.iter().zip(&mut norms)) {
                *x = taste(k, *r);
                n.0 += *x * *x;
                n.1 += f64::from(k.region_count(*r));
            }
            for (i, dot) in dots.iter_mut().enumerate() {
                if row[i] > 0.0 {
                    for (d, x) in dot.iter_mut().zip(&row) {
                        *d += row[i] * x;
                    }
                }
            }
        }
        let known = |j: usize| norms[j].1 >= MIN_AUDIENCE_REQUESTS;
        // Cosine between reached region i and region j (an index into `regions`).
        let cosine = |i: usize, j: usize| dots[i][j] / (norms[i].0 * norms[j].0).sqrt();
        let mut best = 0.0_f64;
        for i in (0..reached.len()).filter(|i| known(*i)) {
            for j in (0..regions.len()).filter(|j| *j != i && known(*j)) {
                best = best.max(cosine(i, j));
            }
        }
        (reached.len()..regions.len())
            .map(|j| {
                !known(j)
                    || (0..reached.len())
                        .any(|i| !known(i) || cosine(i, j) >= SAME_AUDIENCE_SHARE * best)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use models::{CacheKey, TenantId};

    use super::super::Tracker;
    use super::super::tests::event;

    /// Regions share an audience when their steady demand is alike key by key; a
    /// burst does not make regions alike, and a region too quiet to tell is kept.
    #[test]
    fn regions_of_one_taste_share_an_audience() {
        let mut tracker = Tracker::new(100);
        let tenant: TenantId = "acme".parse().unwrap();
        let keys: Vec<CacheKey> = (0..20).map(|i| format!("/k{i}").parse().unwrap()).collect();
        tracker.track(&tenant, &keys, 0);
        // us and ca like the even keys, eu and de the odd ones; ap asked little.
        for (i, key) in keys.iter().enumerate() {
            let liked_by = if i % 2 == 0 {
                ["us", "ca"]
            } else {
                ["eu", "de"]
            };
            for region in liked_by {
                for n in 0..30 {
                    tracker.observe(&event(n, key.as_str(), region, None).borrowed());
                }
            }
            tracker.observe(&event(40, key.as_str(), "ap", None).borrowed());
        }
        // A key that burst everywhere at once (a cron) says nothing of taste.
        let cron: CacheKey = "/cron".parse().unwrap();
        tracker.track(&tenant, std::slice::from_ref(&cron), 0);
        for region in ["us", "ca", "eu", "de"] {
            for n in 0..2_000 {
                tracker.observe(&event(n, "/cron", region, None).borrowed());
            }
        }
        tracker.note_burst(&tenant, &cron, true, 100);
        let id = |name: &str| {
            tracker
                .regions
                .iter()
                .position(|r| r.as_str() == name)
                .unwrap()
        };
        let [us, ca, eu, de, ap] = ["us", "ca", "eu", "de", "ap"].map(id);
        let t = &tracker.tenants[&tenant];
        assert_eq!(
            t.same_audience(&[us], &[ca, eu, de, ap]),
            [true, false, false, true]
        );
        assert_eq!(t.same_audience(&[us, de], &[ca, eu]), [true, true]);
    }
}
