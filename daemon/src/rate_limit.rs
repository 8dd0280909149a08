//! Shared rate limiters for downstreams (`[rate_limiters.NAME]`).
//!
//! One token bucket per name (the GCRA of the `governor` crate), shared by every
//! queue that names it, so the limit holds across all of qd's workers rather than
//! per worker. A queue's dispatch takes one token before it hands out a job. A
//! "throttled" result (HTTP 429, or 503 with Retry-After, a throttled exit code, or
//! an external worker's `throttled` nack) pauses the limiter: nobody gets a token
//! until the pause ends. The rate and burst can be changed at runtime
//! (`qctl limits set-limiter`): governor's quota is fixed per bucket, so the bucket
//! is replaced, behind a lock, by a new full one.
//!
//! On a store shared by several nodes ([`Limiters::build`] given one) the bucket is
//! the database's ([`crate::store::SharedStore::take_tokens`]: one row per limiter,
//! refilled by the database's clock), so the limit holds across every node: a node
//! takes tokens from it in small chunks ([`chunk`]) into a local pool, spends them
//! one per job, and asks for more, behind the scenes, when the pool is empty.
//! Tokens taken are never given back, so the cluster never admits more than `rate`
//! × seconds + `burst`; a node may hold up to one chunk it does not use.
//!
//! There a pause is the cluster's too: the node that saw the throttled result
//! pauses at once and stores the pause's end in the limiter's row
//! ([`crate::store::SharedStore::pause_limiter`], the database's clock), which
//! announces it. Every other node pauses for what is left of it when the
//! announcement arrives ([`Limiters::hold_paused`], from `cluster.rs`), at its
//! next heartbeat, or at its next refill, which the paused bucket refuses, so no
//! node spends more than the tokens it already held (at most one chunk) before it
//! knows.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use tokio::time::Instant;

use crate::config::RateLimiterConfig;
use crate::limits::Limits;
use crate::store::{Store, StoreError, Tokens};

/// How long a queue's dispatch waits before it tries again when a shared limiter's pool is
/// empty and its refill is under way.
const REFILL_RETRY: Duration = Duration::from_millis(10);

/// How much later than the last pause it stored a throttled result's pause must
/// end for a node to store it again (see `SharedBucket::stored_pause`).
const STORE_PAUSE_STEP: Duration = Duration::from_millis(100);

/// Tokens a node takes from a shared bucket at once: a quarter of a second's
/// worth, at least 1, at most the burst. A node asks for the next chunk when it
/// spends the last token of one, so a round trip to the database rarely stalls it.
pub fn chunk(settings: &RateLimiterConfig) -> u32 {
    let burst = if settings.burst == 0 {
        settings.per_second
    } else {
        settings.burst
    };
    (settings.per_second / 4).clamp(1, burst.max(1))
}

/// This node's side of a bucket kept in a shared store.
struct SharedBucket {
    store: Store,
    /// Tokens taken from the store and not yet spent.
    pool: Arc<AtomicU32>,
    /// The end of the last pause this node asked the store to keep: a throttled
    /// result that would not move it by more than [`STORE_PAUSE_STEP`] is not
    /// stored again, so a burst of throttled results costs one write.
    stored_pause: Arc<Mutex<Option<Instant>>>,
    /// A refill is under way.
    refilling: Arc<AtomicBool>,
    /// After a refill that got nothing: no new one before this (the time one token
    /// takes at the limiter's rate), so an empty bucket is not asked every retry.
    not_before: Arc<Mutex<Option<Instant>>>,
}

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
    /// Shared with a shared bucket's refills, which learn of pauses stored by
    /// other nodes.
    paused_until: Arc<Mutex<Option<Instant>>>,
    /// On a shared store, the tokens come from its bucket instead of `bucket`'s.
    shared: Option<SharedBucket>,
}

impl RateLimiter {
    /// A limiter allowing `per_second` jobs a second on average, `burst` at once.
    pub fn new(name: &str, cfg: &RateLimiterConfig) -> Self {
        crate::metrics::register_limiter(name);
        RateLimiter {
            name: name.to_string(),
            bucket: RwLock::new(Bucket::new(cfg)),
            clock: DefaultClock::default(),
            paused_until: Arc::default(),
            shared: None,
        }
    }

    /// A limiter whose bucket is `store`'s, shared by every node of the cluster.
    pub fn shared(name: &str, cfg: &RateLimiterConfig, store: Store) -> Self {
        RateLimiter {
            shared: Some(SharedBucket {
                store,
                pool: Arc::default(),
                stored_pause: Arc::default(),
                refilling: Arc::default(),
                not_before: Arc::default(),
            }),
            ..RateLimiter::new(name, cfg)
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

    /// When a pause in force at `now` ends (see [`Self::pause`]), or `None`.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        let paused = *self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        paused.filter(|until| *until > now)
    }

    /// Takes one token, or returns the instant at which to try again.
    pub fn try_acquire(&self, now: Instant) -> Result<(), Instant> {
        if let Some(until) = self.paused_until(now) {
            return Err(until);
        }
        if let Some(shared) = &self.shared {
            return self.take_shared(shared, now);
        }
        let bucket = self.bucket.read().unwrap_or_else(|e| e.into_inner());
        bucket
            .gcra
            .check()
            .map_err(|not_until| now + not_until.wait_time_from(self.clock.now()))
    }

    /// Spends a token of the local pool, or starts a refill from the shared bucket
    /// and says when to try again.
    fn take_shared(&self, shared: &SharedBucket, now: Instant) -> Result<(), Instant> {
        let spent = shared
            .pool
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if spent.is_ok_and(|before| before > 1) {
            return Ok(());
        }
        // The pool is empty (or just emptied): refill it behind the scenes, unless
        // the bucket was found empty a moment ago.
        let wait = *shared.not_before.lock().unwrap_or_else(|e| e.into_inner());
        let due = wait.is_none_or(|at| at <= now);
        if due && !shared.refilling.swap(true, Ordering::AcqRel) {
            self.refill(shared);
        }
        match spent {
            Ok(_) => Ok(()),
            Err(_) => Err(wait.filter(|_| !due).unwrap_or(now + REFILL_RETRY)),
        }
    }

    /// Asks the shared bucket for a chunk of tokens; they join the pool when the
    /// store answers.
    fn refill(&self, shared: &SharedBucket) {
        let settings = self.settings();
        let want = chunk(&settings);
        let name = self.name.clone();
        let (pool, refilling) = (shared.pool.clone(), shared.refilling.clone());
        let not_before = shared.not_before.clone();
        let paused_until = self.paused_until.clone();
        let one_token = Duration::from_secs(1) / settings.per_second.max(1);
        shared.store.submit(
            move |b| {
                b.shared()
                    .ok_or_else(|| StoreError::Other("the store is not shared".into()))?
                    .take_tokens(&name, want, &settings)
            },
            move |result| {
                match result {
                    Ok(Tokens::Taken(granted)) => {
                        pool.fetch_add(granted, Ordering::AcqRel);
                        let empty = (granted == 0).then(|| Instant::now() + one_token);
                        *not_before.lock().unwrap_or_else(|e| e.into_inner()) = empty;
                    }
                    Ok(Tokens::Paused(left)) => {
                        extend_pause(&paused_until, Instant::now() + left);
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "Taking rate-limiter tokens failed.");
                    }
                }
                refilling.store(false, Ordering::Release);
            },
        );
    }

    /// Hands out no token for `for_at_least` (a downstream said "throttled").
    /// Overlapping pauses keep the later end. With a shared bucket, every node
    /// pauses too: the pause is stored with the bucket (behind the scenes; until
    /// it is, other nodes may still spend tokens).
    pub fn pause(&self, for_at_least: Duration) {
        let until = Instant::now() + for_at_least;
        extend_pause(&self.paused_until, until);
        crate::metrics::limiter_throttled(&self.name);
        if let Some(shared) = &self.shared {
            {
                let mut stored = shared
                    .stored_pause
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if stored.is_some_and(|s| s + STORE_PAUSE_STEP >= until) {
                    return;
                }
                *stored = Some(until);
            }
            let (name, settings) = (self.name.clone(), self.settings());
            let stored = shared.stored_pause.clone();
            shared.store.submit(
                move |b| {
                    b.shared()
                        .ok_or_else(|| StoreError::Other("the store is not shared".into()))?
                        .pause_limiter(&name, for_at_least, &settings)
                },
                move |result| {
                    if let Err(err) = result {
                        // The next throttled result tries again.
                        *stored.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        static LOG: crate::log_every::Every =
                            crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
                        if let Some(left_out) = LOG.due() {
                            tracing::warn!(error = %err, earlier_not_logged = left_out, "Storing a rate limiter's pause failed; it holds on this node only (logged at most every 10 s).");
                        }
                    }
                },
            );
        }
    }

    /// Hands out no token for `left` because another node stored a pause of this
    /// limiter (what is left of it by the database's clock): [`Self::pause`]
    /// without storing or counting it again.
    pub fn hold_paused(&self, left: Duration) {
        extend_pause(&self.paused_until, Instant::now() + left);
    }
}

/// Moves a pause's end to `until` unless it already ends later.
fn extend_pause(paused_until: &Mutex<Option<Instant>>, until: Instant) {
    let mut paused = paused_until.lock().unwrap_or_else(|e| e.into_inner());
    if paused.is_none_or(|p| p < until) {
        *paused = Some(until);
    }
}

/// Every configured limiter by name, shared by the queues' dispatches (which take tokens)
/// and the admin handler (which reconfigures them). A reload adds, reconfigures and
/// drops limiters here ([`Limiters::sync`]); a queue's dispatch looks its limiter
/// up by name when it starts.
#[derive(Default)]
pub struct Limiters {
    by_name: RwLock<HashMap<String, Arc<RateLimiter>>>,
    /// A store shared by several nodes: the limiters' buckets are its.
    shared: Option<Store>,
}

impl Limiters {
    /// Every configured limiter, with the settings in force (config overlaid with
    /// stored `qctl limits set-limiter` overrides); their buckets are `shared`'s when
    /// given (a store shared by several nodes), else this process's.
    pub fn build(limits: &Limits, shared: Option<Store>) -> Self {
        let registry = Limiters {
            by_name: RwLock::default(),
            shared,
        };
        registry.sync(limits);
        registry
    }

    /// The limiter called `name`, if configured.
    pub fn get(&self, name: &str) -> Option<Arc<RateLimiter>> {
        let map = self.by_name.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned()
    }

    /// Pauses limiter `name` on this node for `left`, a pause another node stored
    /// ([`RateLimiter::hold_paused`]); an unknown name is ignored (a limiter this
    /// node's config does not have).
    pub fn hold_paused(&self, name: &str, left: Duration) {
        if let Some(limiter) = self.get(name) {
            limiter.hold_paused(left);
        }
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
                    let limiter = match &self.shared {
                        Some(store) => RateLimiter::shared(&name, &settings, store.clone()),
                        None => RateLimiter::new(&name, &settings),
                    };
                    map.insert(name.clone(), Arc::new(limiter));
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
