//! Shared rate limiters for downstreams (`[rate_limiters.NAME]`).
//!
//! One token bucket per name (the GCRA of the `governor` crate), shared by every
//! queue that names it, so the limit holds across all of qd's workers rather than
//! per worker. A Scheduler takes one token before it hands out a job. A
//! "throttled" result (HTTP 429, or 503 with Retry-After, a throttled exit code, or
//! an external worker's `throttled` nack) pauses the limiter: nobody gets a token
//! until the pause ends. The rate and burst can be changed at runtime
//! (`qctl limits set-limiter`): governor's quota is fixed per bucket, so the bucket
//! is replaced, behind a lock, by a new full one.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use tokio::time::Instant;

use crate::config::RateLimiterConfig;
use crate::limits::Limits;

/// The bucket and the settings it was built from.
struct Bucket {
    settings: RateLimiterConfig,
    gcra: DefaultDirectRateLimiter,
}

impl Bucket {
    /// A full bucket allowing `per_second` on average, `burst` at once (a 0 is read
    /// as 1 for the rate, and as the rate for the burst).
    fn new(settings: &RateLimiterConfig) -> Self {
        let per_second = NonZeroU32::new(settings.per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.burst).unwrap_or(per_second);
        Bucket {
            settings: *settings,
            gcra: DefaultDirectRateLimiter::direct(
                Quota::per_second(per_second).allow_burst(burst),
            ),
        }
    }
}

/// One named, shared token bucket with a pause switch.
pub struct RateLimiter {
    name: String,
    bucket: RwLock<Bucket>,
    clock: DefaultClock,
    paused_until: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// A limiter allowing `per_second` jobs a second on average, `burst` at once.
    pub fn new(name: &str, cfg: &RateLimiterConfig) -> Self {
        RateLimiter {
            name: name.to_string(),
            bucket: RwLock::new(Bucket::new(cfg)),
            clock: DefaultClock::default(),
            paused_until: Mutex::new(None),
        }
    }

    /// The limiter's configured name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rate and burst in force.
    pub fn settings(&self) -> RateLimiterConfig {
        let bucket = self.bucket.read().unwrap_or_else(|e| e.into_inner());
        bucket.settings
    }

    /// Applies new settings; returns whether they differed. A change replaces the
    /// bucket with a full one (up to `burst` tokens at once right after); a pause in
    /// force stays.
    pub fn reconfigure(&self, settings: &RateLimiterConfig) -> bool {
        let mut bucket = self.bucket.write().unwrap_or_else(|e| e.into_inner());
        if bucket.settings == *settings {
            return false;
        }
        *bucket = Bucket::new(settings);
        true
    }

    /// Takes one token, or returns the instant at which to try again.
    pub fn try_acquire(&self, now: Instant) -> Result<(), Instant> {
        let paused = *self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = paused
            && until > now
        {
            return Err(until);
        }
        let bucket = self.bucket.read().unwrap_or_else(|e| e.into_inner());
        bucket
            .gcra
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

/// Every configured limiter by name, shared by the Schedulers (which take tokens)
/// and the admin handler (which reconfigures them). A reload adds, reconfigures and
/// drops limiters here ([`Limiters::sync`]); a queue's Scheduler looks its limiter
/// up by name when it starts.
#[derive(Default)]
pub struct Limiters {
    by_name: RwLock<HashMap<String, Arc<RateLimiter>>>,
}

impl Limiters {
    /// Every configured limiter, with the settings in force (config overlaid with
    /// stored `qctl limits set-limiter` overrides).
    pub fn build(limits: &Limits) -> Self {
        let registry = Limiters::default();
        registry.sync(limits);
        registry
    }

    /// The limiter called `name`, if configured.
    pub fn get(&self, name: &str) -> Option<Arc<RateLimiter>> {
        let map = self.by_name.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned()
    }

    /// Every limiter, sorted by name.
    pub fn all(&self) -> Vec<Arc<RateLimiter>> {
        let map = self.by_name.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// Brings the registry in line with `limits` (after a reload): new names get a
    /// limiter, changed settings replace the bucket (a pause stays), names no longer
    /// configured are dropped. Returns the names added, changed or dropped.
    pub fn sync(&self, limits: &Limits) -> Vec<String> {
        let mut map = self.by_name.write().unwrap_or_else(|e| e.into_inner());
        let names = limits.limiter_names();
        let mut touched = Vec::new();
        map.retain(|name, _| {
            let keep = names.contains(name);
            if !keep {
                touched.push(name.clone());
            }
            keep
        });
        for name in names {
            let Some(settings) = limits.limiter(&name) else {
                continue;
            };
            match map.get(&name) {
                Some(existing) => {
                    if existing.reconfigure(&settings) {
                        touched.push(name);
                    }
                }
                None => {
                    map.insert(name.clone(), Arc::new(RateLimiter::new(&name, &settings)));
                    touched.push(name);
                }
            }
        }
        touched
    }
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

    #[tokio::test]
    async fn new_settings_replace_the_bucket_and_keep_a_pause() {
        let l = limiter(1, 1);
        let now = Instant::now();
        assert!(l.try_acquire(now).is_ok());
        assert!(l.try_acquire(now).is_err(), "1/s, burst 1: empty");
        let faster = RateLimiterConfig {
            per_second: 100,
            burst: 10,
        };
        assert!(l.reconfigure(&faster));
        assert!(!l.reconfigure(&faster), "same settings: no change");
        assert_eq!(l.settings(), faster);
        let granted = (0..20).filter(|_| l.try_acquire(now).is_ok()).count();
        assert_eq!(granted, 10, "a full bucket of the new burst");
        l.pause(Duration::from_secs(5));
        l.reconfigure(&RateLimiterConfig {
            per_second: 1000,
            burst: 1000,
        });
        assert!(l.try_acquire(Instant::now()).is_err(), "still paused");
    }
}
