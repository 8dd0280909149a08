//! Retry delays: capped exponential backoff with full jitter.
//!
//! Source: Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog
//! (2015). For the n-th failed attempt (1-based) the delay is drawn uniformly from
//! `[0, min(max, base * 2^(n-1)))`. Full jitter spreads retries of jobs that failed
//! together, so they do not all hit a recovering downstream at once. A delay the
//! downstream asked for (HTTP `Retry-After`) is a floor; `max` caps everything.
//!
//! Pure: the caller draws the uniform sample, so tests and property tests are exact.

use std::time::Duration;

/// How randomness is applied to the exponential delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// Uniform in `[0, cap)`: the recommended default.
    #[default]
    Full,
    /// No randomness: exactly `cap`. Only for experiments that show why jitter matters.
    None,
}

/// A queue's backoff policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The cap for the first retry (`backoff.base`).
    pub base: Duration,
    /// The largest delay ever used (`backoff.max`).
    pub max: Duration,
    /// Full jitter or none.
    pub jitter: Jitter,
}

impl Backoff {
    /// The delay before retrying after the `attempt`-th failure (1-based; 0 is treated
    /// as 1). `sample` is a uniform draw from `[0, 1)`; `requested` is a minimum asked
    /// for by the downstream. The result never exceeds `max`.
    pub fn delay(&self, attempt: u32, requested: Option<Duration>, sample: f64) -> Duration {
        let exponent = attempt.max(1) - 1;
        let cap = self
            .base
            .checked_mul(2u32.saturating_pow(exponent.min(31)))
            .unwrap_or(self.max)
            .min(self.max);
        let drawn = match self.jitter {
            Jitter::Full => cap.mul_f64(sample.clamp(0.0, 1.0)),
            Jitter::None => cap,
        };
        drawn.max(requested.unwrap_or(Duration::ZERO)).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(jitter: Jitter) -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(600),
            jitter,
        }
    }

    #[test]
    fn without_jitter_the_delay_doubles_until_the_cap() {
        let b = policy(Jitter::None);
        let delays: Vec<u64> = (1..=12).map(|n| b.delay(n, None, 0.5).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
    }

    #[test]
    fn full_jitter_scales_the_cap_by_the_sample() {
        let b = policy(Jitter::Full);
        assert_eq!(b.delay(3, None, 0.0), Duration::ZERO);
        assert_eq!(b.delay(3, None, 0.5), Duration::from_secs(2));
    }

    #[test]
    fn retry_after_is_a_floor_but_max_still_caps() {
        let b = policy(Jitter::Full);
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(30)), 0.1),
            Duration::from_secs(30)
        );
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(3600)), 0.1),
            Duration::from_secs(600)
        );
    }

    proptest! {
        #[test]
        fn delay_stays_within_the_full_jitter_bounds(
            attempt in 0u32..100, sample in 0.0f64..1.0,
            base_ms in 1u64..10_000, max_ms in 1u64..1_000_000,
        ) {
            let b = Backoff {
                base: Duration::from_millis(base_ms),
                max: Duration::from_millis(max_ms),
                jitter: Jitter::Full,
            };
            let d = b.delay(attempt, None, sample);
            let exp = base_ms.saturating_mul(1u64 << attempt.max(1).saturating_sub(1).min(40));
            prop_assert!(d <= Duration::from_millis(exp.min(max_ms)));
            prop_assert!(d <= b.max);
        }
    }
}
