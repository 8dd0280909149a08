//! Job processes never outlive qd, through the real binary:
//! - `kill -9` of qd: the attempt's watchdog stops the job's whole process group;
//! - `kill -9` and an immediate restart, with a job that ignores SIGTERM (so the
//!   watchdog's grace is still running): the start-up sweep kills what is left
//!   before the job runs again, the history shows the interrupted attempt, and each
//!   run saw its own `QD_LEASE_TOKEN`;
//! - qd frozen with SIGSTOP past the stall bound: the watchdog stops the job.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Qd, alive, script, signal, wait_for};

const LONG: Duration = Duration::from_secs(60);

/// A job that counts its runs in `dir/runs`. The first run starts a grandchild and
/// records both pids (`dir/pids-1`) and waits; a later run records which of the
/// first run's processes it still saw alive (`dir/seen-alive`) and succeeds. Each
/// run writes its lease token to `dir/token-N`. With `ignore_term` the first run
/// and its grandchild ignore SIGTERM.
fn job_script(dir: &Path, ignore_term: bool) -> std::path::PathBuf {
    let trap = if ignore_term { "trap '' TERM" } else { "" };
    script(
        dir,
        "job.sh",
        &format!(
            r#"d={d}
cat > /dev/null
n=$(( $(cat $d/runs 2>/dev/null || echo 0) + 1 ))
echo $n > $d/runs
echo "$QD_LEASE_TOKEN" > $d/token-$n
if [ $n -gt 1 ]; then
  : > $d/seen-alive
  for p in $(cat $d/pids-1); do
    s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)
    if [ -n "$s" ] && [ "$s" != Z ]; then echo $p >> $d/seen-alive; fi
  done
  exit 0
fi
{trap}
sleep 300 &
echo "$$ $!" > $d/pids.tmp
mv $d/pids.tmp $d/pids-1
wait
"#,
            d = dir.display()
        ),
    )
}

fn config(prog: &Path) -> String {
    format!(
        "[queues.work]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 1, max = 1 }}\nlease = \"5s\"\nheartbeat = \"1s\"\n\
         kill_grace = \"60s\"\n",
        prog.display()
    )
}

/// The first run's pids, once it recorded them.
fn first_run_pids(dir: &Path) -> Vec<i32> {
    wait_for("the first run to start", LONG, || {
        let text = std::fs::read_to_string(dir.join("pids-1")).ok()?;
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    })
}

#[test]
fn kill9_of_qd_stops_the_jobs_whole_process_group() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = job_script(work.path(), false);
    let mut qd = Qd::start(&config(&prog));
    qd.enqueue("work", "x");
    let pids = first_run_pids(work.path());
    assert!(pids.iter().all(|p| alive(*p)), "the job runs: {pids:?}");
    qd.kill9();
    wait_for("the job's processes to die with qd", LONG, || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });
}

#[test]
fn after_kill9_and_restart_the_left_processes_die_before_the_job_runs_again() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = job_script(work.path(), true);
    let mut qd = Qd::start(&config(&prog));
    let id = qd.enqueue("work", "x");
    let pids = first_run_pids(work.path());
    qd.kill9();
    // SIGTERM is ignored and kill_grace is 60 s: only the sweep can stop them now.
    assert!(pids.iter().all(|p| alive(*p)), "still running: {pids:?}");
    qd.spawn(&[]);
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    let seen = std::fs::read_to_string(work.path().join("seen-alive")).expect("seen-alive");
    assert_eq!(
        seen, "",
        "the second run saw the first run's processes alive"
    );
    assert!(pids.iter().all(|p| !alive(*p)), "{pids:?}");
    let history = job["history"].as_array().expect("history");
    let outcomes: Vec<&str> = history
        .iter()
        .map(|h| h["outcome"].as_str().expect("outcome"))
        .collect();
    assert_eq!(outcomes, ["interrupted", "succeeded"], "{job}");
    let reason = history[0]["error"].as_str().unwrap_or_default();
    assert!(reason.contains("qd stopped during this attempt"), "{job}");
    // The watchdog, the shell and its sleep.
    assert!(reason.contains("killed the 3 process(es)"), "{job}");
    let token = |n: u32| {
        std::fs::read_to_string(work.path().join(format!("token-{n}")))
            .expect("token")
            .trim()
            .parse::<u64>()
            .expect("a numeric QD_LEASE_TOKEN")
    };
    assert!(token(2) > token(1), "fencing tokens grow across runs");
    assert!(
        qd.logs().contains("left this attempt's processes running"),
        "{}",
        qd.logs()
    );
    assert!(
        !qd.dir
            .path()
            .join("data/attempts")
            .read_dir()
            .expect("attempts dir")
            .any(|e| e.is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.'))),
        "no record left once the job finished"
    );
}

#[test]
fn a_frozen_qd_has_its_jobs_stopped_by_their_watchdog() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = job_script(work.path(), false);
    let mut qd = Qd::start(&config(&prog).replace("kill_grace = \"60s\"", "kill_grace = \"1s\""));
    let id = qd.enqueue("work", "x");
    let pids = first_run_pids(work.path());
    signal(qd.pid(), "STOP");
    // The lease is 5 s, so the watchdog takes qd for frozen after 5 s of silence.
    let stopped = std::panic::catch_unwind(|| {
        wait_for("the watchdog to stop the job", LONG, || {
            pids.iter().all(|p| !alive(*p)).then_some(())
        })
    });
    signal(qd.pid(), "CONT");
    assert!(stopped.is_ok(), "the job kept running while qd was frozen");
    // The attempt ended by SIGTERM is retried and the second run succeeds.
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    qd.kill9();
}

#[test]
fn a_second_ctrl_c_during_the_grace_exits_at_once_and_says_so() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = job_script(work.path(), true);
    let mut qd = Qd::start(&config(&prog));
    qd.enqueue("work", "x");
    let pids = first_run_pids(work.path());
    signal(qd.pid(), "INT");
    wait_for("the shutdown to begin", LONG, || {
        qd.logs().contains("Signal received.").then_some(())
    });
    let start = std::time::Instant::now();
    signal(qd.pid(), "INT");
    // The grace is 5 s and the job ignores SIGTERM: only the second signal ends qd
    // this soon.
    let status = qd.wait_exit(Duration::from_secs(4));
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(status.code(), Some(130), "{}", qd.logs());
    assert!(
        qd.logs()
            .contains("Second signal during the shutdown grace"),
        "{}",
        qd.logs()
    );
    // The job ignores SIGTERM; its watchdog SIGKILLs it after kill_grace (60 s), and
    // a restart stops it at once.
    qd.spawn(&[]);
    wait_for("the left job to be stopped", LONG, || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });
}
