//! Throughput and memory of the weighted fair queue at scale: 10k tenants with random
//! weights (1..=10) and 1M ready jobs.
//!
//! Run: `cargo bench -p qd --bench scheduler`. Prints push rate, resident memory per
//! queued job (growth of RSS from `/proc/self/statm` while filling), and dispatch
//! decisions per second (pop + finish) in both fairness modes, at a steady 1M backlog
//! (each finished job is replaced) and while draining.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qd::job::JobId;
use qd::scheduler::fair::{FairQueue, Fairness, TenantLimits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TENANTS: usize = 10_000;
const JOBS: usize = 1_000_000;
/// Jobs kept running at once (finished oldest first), like a 1,000-worker fleet.
const WORKERS: usize = 1_000;

fn main() {
    for fairness in [Fairness::Jobs, Fairness::Runtime] {
        run(fairness);
    }
}

fn run(fairness: Fairness) {
    let mut rng = StdRng::seed_from_u64(7);
    let tenants: Vec<Arc<str>> = (0..TENANTS).map(|t| format!("tenant-{t}").into()).collect();
    let mut queue = FairQueue::new(fairness);
    for tenant in &tenants {
        let limits = TenantLimits {
            weight: rng.random_range(1..=10),
            max_concurrency: None,
        };
        queue.set_limits(tenant, limits);
    }
    let jobs: Vec<(usize, JobId)> = (0..JOBS)
        .map(|_| (rng.random_range(0..TENANTS), JobId::new()))
        .collect();

    let rss_before = rss_bytes();
    let start = Instant::now();
    for (n, &(t, id)) in jobs.iter().enumerate() {
        queue.push(tenants[t].clone(), id, n as i64);
    }
    let fill = start.elapsed();
    let rss_after = rss_bytes();
    drop(jobs);
    let per_job = rss_after.saturating_sub(rss_before) as f64 / JOBS as f64;
    println!("{fairness:?}: {TENANTS} tenants, {JOBS} ready jobs");
    println!("  push:   {:>10.0} jobs/s", rate(JOBS, fill));
    println!("  memory: {per_job:>10.1} bytes per queued job (RSS growth while filling)");

    let mut running: VecDeque<Arc<str>> = VecDeque::with_capacity(WORKERS + 1);
    let start = Instant::now();
    for ready_at in JOBS as i64..2 * JOBS as i64 {
        let (tenant, _) = queue.pop().expect("backlogged and uncapped");
        running.push_back(tenant.clone());
        if running.len() > WORKERS {
            finish_oldest(&mut queue, &mut running, &mut rng);
        }
        queue.push(tenant, JobId::new(), ready_at);
    }
    let steady = start.elapsed();
    println!(
        "  steady: {:>10.0} decisions/s (pop + finish + replacement push, 1M backlog)",
        rate(JOBS, steady)
    );

    let start = Instant::now();
    let mut decisions = 0;
    while let Some((tenant, id)) = queue.pop() {
        black_box(id);
        running.push_back(tenant);
        if running.len() > WORKERS {
            finish_oldest(&mut queue, &mut running, &mut rng);
        }
        decisions += 1;
    }
    let drain = start.elapsed();
    println!(
        "  drain:  {:>10.0} decisions/s (pop + finish)",
        rate(decisions, drain)
    );
    println!(
        "  oldest after drain: {:?}, len {}",
        queue.oldest_ready_at(),
        queue.len()
    );
}

fn finish_oldest(queue: &mut FairQueue, running: &mut VecDeque<Arc<str>>, rng: &mut StdRng) {
    if let Some(tenant) = running.pop_front() {
        queue.finish(&tenant, Duration::from_millis(rng.random_range(1..1_000)));
    }
}

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

/// Resident set size: `/proc/self/statm` field 2 (pages) times the page size.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * page_size()
}

/// The kernel page size from `getconf PAGESIZE` (4096 if that fails).
fn page_size() -> u64 {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}
