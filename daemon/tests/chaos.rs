//! Chaos: the delivery contract under real kills. 2,000 jobs run through a command
//! executor whose side effect is idempotent by `QD_IDEMPOTENCY_KEY`, while a chaos
//! loop SIGKILLs random running job processes and SIGKILLs the `qd` daemon itself
//! (three times: once while producers are still enqueueing) and restarts it.
//!
//! The effect store is a directory: the job creates `effects/<key>` with `mkdir`,
//! which is atomic and fails if the entry exists (the "processed-keys check in the
//! same step as the effect"), and appends the key to `applied.log` only when it
//! created the entry. A `mkdir` that failed for any other reason than an existing
//! entry (e.g. the chaos loop's SIGKILL landing on it through a reused pid) is a
//! transient failure (exit 75), never a success without its effect. Every attempt appends its key to `exec.log` first, so duplicate
//! executions are counted. Producers retry each enqueue with the same idempotency
//! key until qd answers 202 (accepted) or 200 (duplicate of an accepted job), as a
//! real producer facing a crashing broker would.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Qd, script, wait_for};
use serde_json::{Value, json};

const JOBS: usize = 2_000;
const PRODUCERS: usize = 4;
const DAEMON_KILLS: usize = 3;
/// The whole run must finish well inside this.
const BUDGET: Duration = Duration::from_secs(240);

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// POSTs `body`; `None` when qd is unreachable (killed, restarting).
fn try_post(agent: &ureq::Agent, url: &str, body: &Value) -> Option<(u16, Value)> {
    let mut resp = agent.post(url).send_json(body).ok()?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn try_get(agent: &ureq::Agent, url: &str) -> Option<(u16, Value)> {
    let mut resp = agent.get(url).call().ok()?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// Enqueues key `k-<i>` for every `i` with `i % PRODUCERS == lane`, retrying through
/// daemon crashes; returns (key, id) for each accepted job.
fn produce(api: String, lane: usize) -> Vec<(String, String)> {
    let agent = agent();
    let url = format!("{api}/v1/queues/chaos/jobs");
    let mut accepted = Vec::new();
    for i in (lane..JOBS).step_by(PRODUCERS) {
        let key = format!("k-{i}");
        let body = json!({ "payload": format!("job {i}"), "idempotency_key": key });
        let start = Instant::now();
        loop {
            match try_post(&agent, &url, &body) {
                Some((200 | 202, resp)) => {
                    let id = resp["id"].as_str().expect("id in answer").to_string();
                    accepted.push((key, id));
                    break;
                }
                Some((status, resp)) if status < 500 => panic!("enqueue {key}: {status} {resp}"),
                _ => {
                    assert!(start.elapsed() < BUDGET, "enqueue {key} never accepted");
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    accepted
}

/// Pids of running job scripts (`/bin/sh <script>`), from `pgrep -f`.
fn job_pids(script: &Path) -> Vec<i32> {
    let out = Command::new("pgrep")
        .arg("-f")
        .arg(script)
        .output()
        .expect("run pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILLs one random running job process every ~150 ms until `stop`.
fn job_killer(script: PathBuf, stop: Arc<AtomicBool>, killed: Arc<AtomicUsize>) {
    while !stop.load(Ordering::Relaxed) {
        let pids = job_pids(&script);
        if !pids.is_empty() {
            let pid = pids[rand::random_range(0..pids.len())];
            let ok = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                killed.fetch_add(1, Ordering::Relaxed);
            }
        }
        thread::sleep(Duration::from_millis(rand::random_range(100..200)));
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Polls every job until it is in a final state; returns id -> state.
fn final_states(api: &str, ids: &[String]) -> HashMap<String, String> {
    let agent = agent();
    let mut pending: Vec<&String> = ids.iter().collect();
    let mut done = HashMap::new();
    let start = Instant::now();
    while !pending.is_empty() {
        pending.retain(|id| {
            let Some((200, job)) = try_get(&agent, &format!("{api}/v1/jobs/{id}")) else {
                return true;
            };
            match job["state"].as_str() {
                Some(s @ ("succeeded" | "dead" | "cancelled")) => {
                    done.insert((*id).clone(), s.to_string());
                    false
                }
                _ => true,
            }
        });
        assert!(
            start.elapsed() < BUDGET,
            "{} jobs never finished, e.g. {:?}",
            pending.len(),
            pending.first()
        );
        thread::sleep(Duration::from_millis(200));
    }
    done
}

#[test]
fn random_sigkills_of_jobs_and_of_qd_lose_no_job_and_duplicate_no_effect() {
    let started = Instant::now();
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    std::fs::create_dir(w.join("effects")).expect("effects dir");
    let body = format!(
        "W={w}\ncat >/dev/null\necho \"$QD_IDEMPOTENCY_KEY\" >> $W/exec.log\nsleep 0.05\n\
         if mkdir \"$W/effects/$QD_IDEMPOTENCY_KEY\" 2>/dev/null; then echo \"$QD_IDEMPOTENCY_KEY\" >> $W/applied.log; \
         elif [ ! -d \"$W/effects/$QD_IDEMPOTENCY_KEY\" ]; then exit 75; fi\n\
         sleep 0.05\n",
        w = w.display()
    );
    let job = script(w, "chaos-job.sh", &body);
    let mut qd = Qd::start(&format!(
        "[queues.chaos]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 6, max = 6 }}\nmax_attempts = 50\nlease = \"5s\"\nheartbeat = \"1s\"\n\
         backoff = {{ base = \"50ms\", max = \"500ms\" }}\n",
        job.display()
    ));

    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (job, stop, killed) = (job.clone(), stop.clone(), killed.clone());
        thread::spawn(move || job_killer(job, stop, killed))
    };
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|lane| {
            let api = qd.api.clone();
            thread::spawn(move || produce(api, lane))
        })
        .collect();

    // Daemon kills: the first while producers are still enqueueing, the others once
    // some more jobs have run.
    let exec_log = w.join("exec.log");
    let mut daemon_kills = 0;
    for n in 0..DAEMON_KILLS {
        let target = 100 + n * 500;
        wait_for("jobs to run before a daemon kill", BUDGET, || {
            (lines(&exec_log).len() >= target).then_some(())
        });
        qd.kill9();
        daemon_kills += 1;
        thread::sleep(Duration::from_millis(300));
        qd.spawn(&[]);
    }
    let accepted: Vec<(String, String)> = producers
        .into_iter()
        .flat_map(|p| p.join().expect("producer"))
        .collect();
    let ids: Vec<String> = accepted.iter().map(|(_, id)| id.clone()).collect();
    let states = final_states(&qd.api, &ids);
    stop.store(true, Ordering::Relaxed);
    killer.join().expect("killer");
    // Orphans of a killed daemon may still be finishing their (deduplicated) effect.
    wait_for("orphaned job processes to end", BUDGET, || {
        job_pids(&job).is_empty().then_some(())
    });

    let executions = lines(&exec_log);
    let applied = lines(&w.join("applied.log"));
    let effects: HashSet<String> = std::fs::read_dir(w.join("effects"))
        .expect("effects")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let executed: HashSet<&String> = executions.iter().collect();
    let succeeded = states.values().filter(|s| *s == "succeeded").count();
    let dead = states.values().filter(|s| *s == "dead").count();
    println!(
        "chaos: jobs {} accepted, {succeeded} succeeded, {dead} dead; executions {}, \
         duplicate executions {}; effects {}, duplicate effects {}; killed job processes {}; \
         daemon kills {daemon_kills}; {:.1} s",
        accepted.len(),
        executions.len(),
        executions.len() - executed.len(),
        effects.len(),
        applied.len() - applied.iter().collect::<HashSet<_>>().len(),
        killed.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );

    // No accepted job is missing: one job per key, each known to qd and final.
    let distinct_ids: HashSet<&String> = ids.iter().collect();
    assert_eq!(accepted.len(), JOBS);
    assert_eq!(distinct_ids.len(), JOBS, "two keys share a job id");
    assert_eq!(states.len(), JOBS);
    assert_eq!(succeeded + dead, JOBS, "a job ended cancelled: {states:?}");
    // Each succeeded job's effect is recorded exactly once.
    for (key, id) in &accepted {
        if states[id] == "succeeded" {
            assert!(effects.contains(key), "succeeded job {key} has no effect");
        }
    }
    let mut seen = HashSet::new();
    for key in &applied {
        assert!(seen.insert(key), "effect {key} applied twice");
    }
    let keys: HashSet<&String> = accepted.iter().map(|(k, _)| k).collect();
    assert!(effects.iter().all(|k| keys.contains(k)), "unknown effect");
    assert_eq!(daemon_kills, DAEMON_KILLS);
    assert!(
        killed.load(Ordering::Relaxed) > 0,
        "the chaos loop killed no job"
    );
}
