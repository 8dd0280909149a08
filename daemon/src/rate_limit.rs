//! Shared rate limiters for downstreams (`[rate_limiters.NAME]`).
//!
//! One token bucket per name (the GCRA of the `governor` crate), shared by every
//! queue that names it, so the limit holds across all of qd's workers rather than
//! per worker. A Scheduler takes one token before it hands out a job. A
//! "throttled" result (HTTP 429, or 503 with Retry-After, or a throttled exit code)
//! pauses the limiter: nobody gets a token until the pause ends.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use tokio::time::Instant;

use crate::config::RateLimiterConfig;

/// One named, shared token bucket with a pause switch.
pub struct RateLimiter {
    name: String,
    bucket: DefaultDirectRateLimiter,
    clock: DefaultClock,
    paused_until: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// A limiter allowing `per_second` jobs a second on average, `burst` at once.
    pub fn new(name: &str, cfg: &RateLimiterConfig) -> Self {
        let per_second = NonZeroU32::new(cfg.per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(cfg.burst).unwrap_or(per_second);
        RateLimiter {
            name: name.to_string(),
            bucket: DefaultDirectRateLimiter::direct(
                Quota::per_second(per_second).allow_burst(burst),
            ),
            clock: DefaultClock::default(),
            paused_until: Mutex::new(None),
        }
    }

    /// The limiter's configured name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes one token, or returns the instant at which to try again.
    pub fn try_acquire(&self, now: Instant) -> Result<(), Instant> {
        let paused = *self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = paused
            && until > now
        {
            return Err(until);
        }
        self.bucket
            .check()
            .map_err(|not_until| now + not_until.wait_time_from(self.clock.now()))
    }

    /// Hands out no token for `for_at_least` (a downstream said "throttled").
    /// Overlapping pauses keep the later end.
    pub fn pause(&self, for_at_least: Duration) {
        let until = Instant::now() + for_at_least;
        let mut paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if paused.is_none_or(|p| p < until) {
            *paused = Some(until);
        }
        crate::metrics::limiter_throttled(&self.name);
    }
}

/// Every configured limiter by name.
pub fn build(configs: &BTreeMap<String, RateLimiterConfig>) -> BTreeMap<String, Arc<RateLimiter>> {
    configs
        .iter()
        .map(|(name, cfg)| (name.clone(), Arc::new(RateLimiter::new(name, cfg))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: u32, burst: u32) -> RateLimiter {
        RateLimiter::new("smtp", &RateLimiterConfig { per_second, burst })
    }

    #[tokio::test]
    async fn a_burst_is_allowed_then_the_caller_is_told_when_to_retry() {
        let l = limiter(10, 3);
        let now = Instant::now();
        for _ in 0..3 {
            assert!(l.try_acquire(now).is_ok());
        }
        let retry = l.try_acquire(now).expect_err("bucket empty");
        let wait = retry - now;
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(150),
            "{wait:?}"
        );
    }

    #[tokio::test]
    async fn a_pause_refuses_tokens_until_it_ends() {
        let l = limiter(1000, 1000);
        l.pause(Duration::from_secs(5));
        let now = Instant::now();
        let until = l.try_acquire(now).expect_err("paused");
        assert!(until >= now + Duration::from_secs(4));
        assert!(l.try_acquire(now + Duration::from_secs(6)).is_ok());
    }
}
