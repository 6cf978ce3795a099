//! Weighted latency histogram (log buckets, 2 % wide) and per-second counts.

/// Latencies in milliseconds with weights (a bulk of hits is one weighted sample).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    buckets: Vec<f64>,
    total: f64,
}

const GROWTH: f64 = 1.02;

impl Histogram {
    fn bucket(ms: f64) -> usize {
        if ms <= 1.0 {
            0
        } else {
            (ms.ln() / GROWTH.ln()).ceil() as usize
        }
    }

    /// Adds `weight` samples of `ms`.
    pub fn add(&mut self, ms: f64, weight: f64) {
        if weight <= 0.0 {
            return;
        }
        let b = Self::bucket(ms);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0.0);
        }
        self.buckets[b] += weight;
        self.total += weight;
    }

    /// Total weight.
    pub fn total(&self) -> f64 {
        self.total
    }

    /// The `q` quantile (the upper bound of its bucket), 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let want = self.total * q;
        let mut seen = 0.0;
        for (b, w) in self.buckets.iter().enumerate() {
            seen += w;
            if seen >= want && *w > 0.0 {
                return GROWTH.powi(b as i32).max(1.0);
            }
        }
        0.0
    }
}

/// A count per whole second of virtual time.
#[derive(Debug, Clone, Default)]
pub struct PerSecond {
    counts: Vec<f64>,
}

impl PerSecond {
    /// Adds `n` at `ms`.
    pub fn add(&mut self, ms: u64, n: f64) {
        let s = (ms / 1000) as usize;
        if self.counts.len() <= s {
            self.counts.resize(s + 1, 0.0);
        }
        self.counts[s] += n;
    }

    /// Mean count per second over `[from_s, to_s)`.
    pub fn mean(&self, from_s: usize, to_s: usize) -> f64 {
        let n = to_s.saturating_sub(from_s).max(1);
        (from_s..to_s)
            .map(|s| self.counts.get(s).copied().unwrap_or(0.0))
            .sum::<f64>()
            / n as f64
    }

    /// Largest count in one second from `from_s` on.
    pub fn peak(&self, from_s: usize) -> f64 {
        self.counts.iter().skip(from_s).copied().fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_the_weights_within_a_bucket() {
        let mut h = Histogram::default();
        h.add(1.0, 98.0);
        h.add(500.0, 2.0);
        assert_eq!(h.quantile(0.5), 1.0);
        let p99 = h.quantile(0.99);
        assert!((500.0..=510.0).contains(&p99), "{p99}");
    }

    #[test]
    fn per_second_mean_and_peak() {
        let mut c = PerSecond::default();
        c.add(100, 2.0);
        c.add(1_900, 4.0);
        c.add(2_000, 10.0);
        assert_eq!(c.mean(0, 2), 3.0);
        assert_eq!(c.peak(1), 10.0);
    }
}
