//! The pool-size decision, pure: scale on the age of the oldest ready job, not depth.
//!
//! Up: while the oldest ready job has waited longer than `target_age`, add workers
//! (half again the current size, at least one) up to `max`. Down: once a worker has
//! been idle for `idle_cooldown` and nothing is waiting, remove one, down to `min`.
//! Hysteresis: no scale-down within `idle_cooldown` of a scale-up, and the dead band
//! between "some jobs waiting but younger than target" and "idle for the cooldown"
//! holds the size still, so a steady load does not make the pool flap.

use std::time::Duration;

/// What the pool observed this tick.
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    /// Workers alive now.
    pub current: u32,
    /// Ready jobs waiting.
    pub ready: u64,
    /// Age of the oldest ready job.
    pub oldest_ready_age: Option<Duration>,
    /// How long the longest-idle worker has been idle (zero if none is idle).
    pub longest_idle: Duration,
    /// Time since the last scale-up.
    pub since_scale_up: Duration,
}

/// Bounds and targets (from config or a runtime override).
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Fewest workers.
    pub min: u32,
    /// Most workers.
    pub max: u32,
    /// Scale up while the oldest ready job is older than this.
    pub target_age: Duration,
    /// Scale down after a worker has idled this long.
    pub idle_cooldown: Duration,
}

/// The desired size and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Workers wanted.
    pub desired: u32,
    /// A short reason for the log ("oldest ready job 7s > target 5s").
    pub reason: String,
}

/// Decides the pool's desired size.
pub fn decide(obs: Observation, policy: Policy) -> Decision {
    let (min, max) = (policy.min, policy.max.max(policy.min));
    let age = obs.oldest_ready_age.unwrap_or_default();
    if obs.current < min {
        return Decision {
            desired: min,
            reason: format!("below min {min}"),
        };
    }
    if obs.current > max {
        return Decision {
            desired: max,
            reason: format!("above max {max}"),
        };
    }
    if obs.ready > 0 && age > policy.target_age && obs.current < max {
        let step = (obs.current / 2).max(1);
        return Decision {
            desired: (obs.current + step).min(max),
            reason: format!(
                "oldest ready job {} > target {}",
                humantime::format_duration(round(age)),
                humantime::format_duration(policy.target_age)
            ),
        };
    }
    let calm = obs.since_scale_up >= policy.idle_cooldown;
    if obs.ready == 0 && obs.longest_idle >= policy.idle_cooldown && calm && obs.current > min {
        return Decision {
            desired: obs.current - 1,
            reason: format!(
                "a worker idle for {}",
                humantime::format_duration(round(obs.longest_idle))
            ),
        };
    }
    Decision {
        desired: obs.current,
        reason: "steady".into(),
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        min: 1,
        max: 8,
        target_age: Duration::from_secs(5),
        idle_cooldown: Duration::from_secs(30),
    };

    fn obs(current: u32, ready: u64, age: u64, idle: u64) -> Observation {
        Observation {
            current,
            ready,
            oldest_ready_age: Some(Duration::from_secs(age)),
            longest_idle: Duration::from_secs(idle),
            since_scale_up: Duration::from_secs(3600),
        }
    }

    #[test]
    fn an_old_backlog_grows_the_pool_to_max() {
        let mut n = 1;
        for _ in 0..10 {
            n = decide(obs(n, 100, 10, 0), POLICY).desired;
        }
        assert_eq!(n, 8);
    }

    #[test]
    fn a_young_backlog_holds_the_size() {
        assert_eq!(decide(obs(3, 100, 2, 0), POLICY).desired, 3);
    }

    #[test]
    fn idle_workers_shrink_the_pool_one_at_a_time_to_min() {
        let mut n = 8;
        for _ in 0..20 {
            n = decide(obs(n, 0, 0, 60), POLICY).desired;
        }
        assert_eq!(n, 1);
    }

    #[test]
    fn no_scale_down_right_after_a_scale_up() {
        let mut o = obs(4, 0, 0, 60);
        o.since_scale_up = Duration::from_secs(5);
        assert_eq!(decide(o, POLICY).desired, 4);
    }

    #[test]
    fn a_steady_load_does_not_oscillate() {
        // Jobs wait a little (under target) and workers are never idle for long.
        let mut n = 4;
        let mut sizes = Vec::new();
        for tick in 0..100u64 {
            n = decide(obs(n, tick % 3, 1, 2), POLICY).desired;
            sizes.push(n);
        }
        assert!(sizes.iter().all(|&s| s == 4), "{sizes:?}");
    }

    #[test]
    fn bounds_changed_at_runtime_are_enforced_at_once() {
        let p = Policy {
            min: 2,
            max: 3,
            ..POLICY
        };
        assert_eq!(decide(obs(1, 0, 0, 0), p).desired, 2);
        assert_eq!(decide(obs(6, 0, 0, 0), p).desired, 3);
    }
}
