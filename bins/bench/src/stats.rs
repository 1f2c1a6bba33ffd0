//! Latency samples and their percentiles.

use std::time::Duration;

/// Latency samples in microseconds.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: Vec<f64>,
}

impl Latencies {
    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.samples.push(d.as_secs_f64() * 1e6);
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: &Self) {
        self.samples.extend_from_slice(&other.samples);
    }

    /// How many samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// No samples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q` quantile (nearest rank; 0 without samples), in microseconds.
    #[must_use]
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        // Nearest rank: the smallest sample with at least q·n samples at or below it.
        let rank = (q * n as f64).ceil().clamp(1.0, n as f64);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "rank is clamped to 1..=n, a small positive whole number"
        )]
        let index = rank as usize - 1;
        sorted[index]
    }

    /// The median, in microseconds.
    #[must_use]
    pub fn p50_us(&self) -> f64 {
        self.quantile_us(0.50)
    }

    /// The 99th percentile, in microseconds.
    #[must_use]
    pub fn p99_us(&self) -> f64 {
        self.quantile_us(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut l = Latencies::default();
        assert!(l.p50_us().abs() < f64::EPSILON, "empty is 0");
        for ms in (1..=100).rev() {
            l.push(Duration::from_millis(ms));
        }
        assert!((l.p50_us() - 50_000.0).abs() < 1e-6);
        assert!((l.p99_us() - 99_000.0).abs() < 1e-6);
        assert!((l.quantile_us(1.0) - 100_000.0).abs() < 1e-6);
        assert!((l.quantile_us(0.0) - 1_000.0).abs() < 1e-6);
    }
}
