//! The synthetic load: Zipf key popularity over the background keys, and the arrival
//! counts of one tick. Counts are drawn with the simulation's seeded generator only.

use rand::Rng;
use rand::rngs::StdRng;

/// Zipf popularity over `n` keys: key `i` (0 the most popular) has weight `1 / (i+1)^s`.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n` keys with exponent `s`.
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for i in 0..n {
            total += 1.0 / ((i + 1) as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// Share of the requests for key `i`.
    pub fn p(&self, i: usize) -> f64 {
        let below = if i == 0 { 0.0 } else { self.cdf[i - 1] };
        self.cdf[i] - below
    }

    /// Share of the requests for keys `from..` (the tail).
    pub fn tail_share(&self, from: usize) -> f64 {
        if from == 0 {
            1.0
        } else {
            1.0 - self.cdf[from.min(self.cdf.len()) - 1]
        }
    }

    /// A key drawn among `from..` by popularity.
    pub fn sample_from(&self, from: usize, rng: &mut StdRng) -> usize {
        let below = if from == 0 { 0.0 } else { self.cdf[from - 1] };
        let u = below + rng.random::<f64>() * (1.0 - below);
        self.cdf.partition_point(|c| *c < u).min(self.cdf.len() - 1)
    }
}

/// `x` rounded up with probability its fraction: the count of a tick whose expected
/// count is `x`, without bias.
pub fn stochastic_round(x: f64, rng: &mut StdRng) -> u32 {
    let floor = x.floor();
    floor as u32 + u32::from(rng.random::<f64>() < x - floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn zipf_shares_sum_to_one_and_fall_with_rank() {
        let z = Zipf::new(1_000, 1.1);
        let total: f64 = (0..1_000).map(|i| z.p(i)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(z.p(0) > z.p(1) && z.p(1) > z.p(999));
        assert!((z.tail_share(10) - (1.0 - (0..10).map(|i| z.p(i)).sum::<f64>())).abs() < 1e-9);
        let mut rng = StdRng::seed_from_u64(1);
        assert!((0..1_000).all(|_| z.sample_from(10, &mut rng) >= 10));
    }

    #[test]
    fn stochastic_rounding_keeps_the_mean() {
        let mut rng = StdRng::seed_from_u64(7);
        let sum: u32 = (0..10_000).map(|_| stochastic_round(0.25, &mut rng)).sum();
        assert!((2_300..2_700).contains(&sum), "{sum}");
    }
}
