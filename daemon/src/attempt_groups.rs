//! Records of the process groups of running command attempts, kept in
//! `data_dir/attempts/`, and the start-up sweep that stops whatever an earlier run of
//! qd left behind.
//!
//! Each command attempt writes one small file, named for its process group id, when
//! its group starts and removes it once the group is gone. A file still there at
//! start-up means qd ended without stopping that group (`kill -9`, OOM kill, power
//! cut). The attempt watchdog normally stops such a group itself when qd dies
//! ([`crate::executor::command`]); the sweep covers the case where the watchdog
//! died too or is still inside its kill grace. It runs after the data directory's
//! lock is taken (so it never touches a live qd's groups) and before the Broker
//! dispatches anything.
//!
//! A group id can be reused by an unrelated process after its group ended, so a
//! group is killed only if it is from this boot and one of its members still carries
//! the attempt's `QD_JOB_ID` and `QD_LEASE_TOKEN` in its environment.
//!
//! Record format (one line of JSON, versioned by its `v` field):
//! `{"v":1,"job":"<uuid>","queue":"q","attempt":2,"token":17,"boot":"<boot_id>"}`.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::job::{JobId, Token};

/// The folder of the records inside `data_dir`.
pub const DIR: &str = "attempts";

/// How long the sweep waits for a killed group's processes to disappear.
const GONE_WAIT: Duration = Duration::from_secs(10);

/// One attempt whose process group was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Format version (1).
    pub v: u32,
    /// The job.
    pub job: JobId,
    /// Its queue.
    pub queue: String,
    /// The attempt number it ran as.
    pub attempt: u32,
    /// The lease token (fencing value) of that attempt.
    pub token: Token,
    /// `/proc/sys/kernel/random/boot_id` when it started.
    pub boot: String,
}

/// An attempt an earlier run of qd left running, as found by [`sweep`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftBehind {
    /// The attempt.
    pub record: Record,
    /// Its process group id.
    pub pgid: i32,
    /// Processes of the group that were still running and were killed.
    pub killed: usize,
}

impl LeftBehind {
    /// The reason written into the job's history for the interrupted attempt.
    pub fn reason(&self) -> String {
        let what = if self.killed == 0 {
            "its process group was already gone".to_owned()
        } else {
            format!(
                "qd killed the {} process(es) it left in group {} at start-up",
                self.killed, self.pgid
            )
        };
        format!("qd stopped during this attempt (crash or kill -9); {what}")
    }
}

/// Where the records of `data_dir` live.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// The machine's boot id; empty where there is none (then every record counts as
/// from this boot, and the environment check alone guards against a reused id).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Writes the record of group `pgid` (atomically: a crash leaves the old file or
/// the new one, never half of it).
///
/// Errors: the file cannot be written (the caller logs it; the attempt still runs).
pub fn write(dir: &Path, pgid: i32, record: &Record) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{pgid}.tmp"));
    let line = serde_json::to_string(record).map_err(io::Error::other)?;
    std::fs::write(&tmp, line + "\n")?;
    std::fs::rename(&tmp, dir.join(pgid.to_string()))
}

/// Removes the record of group `pgid` once the group is gone.
pub fn remove(dir: &Path, pgid: i32) {
    match std::fs::remove_file(dir.join(pgid.to_string())) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(pgid, error = %e, "Cannot remove the record of a finished attempt's process group.")
        }
    }
}

/// Stops every process group recorded in `dir` that is still running, waits until
/// its processes are gone, removes the records and answers the attempts found.
/// Records that cannot be read are logged and removed.
pub fn sweep(dir: &Path) -> Vec<LeftBehind> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "Cannot read the attempt records; processes an earlier run left are not stopped.");
            return Vec::new();
        }
    };
    let boot = boot_id();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(pgid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|p| *p > 1)
        else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let record = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str::<Record>(&text).map_err(|e| e.to_string()));
        let _ = std::fs::remove_file(&path);
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                warn!(file = %path.display(), error = %e, "Unreadable attempt record; ignored.");
                continue;
            }
        };
        let killed = if record.boot == boot {
            stop_group(pgid, &record)
        } else {
            0
        };
        if killed > 0 {
            warn!(job = %record.job, queue = %record.queue, attempt = record.attempt, pgid, killed,
                "An earlier run of qd left this attempt's processes running; killed them before dispatching.");
        } else {
            info!(job = %record.job, queue = %record.queue, attempt = record.attempt,
                "An earlier run of qd stopped during this attempt; its processes are gone.");
        }
        found.push(LeftBehind {
            record,
            pgid,
            killed,
        });
    }
    found
}

/// SIGKILLs group `pgid` if one of its live members belongs to `record`'s attempt,
/// and waits (up to [`GONE_WAIT`]) for the group to empty; answers how many
/// processes were killed.
fn stop_group(pgid: i32, record: &Record) -> usize {
    let members = live_members(pgid);
    if !members.iter().any(|pid| runs_attempt(*pid, record)) {
        return 0;
    }
    match killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => warn!(pgid, error = %e, "Cannot kill a process group an earlier run left."),
    }
    let until = Instant::now() + GONE_WAIT;
    while !live_members(pgid).is_empty() {
        if Instant::now() > until {
            warn!(
                pgid,
                "Processes of an earlier run's attempt are still there after SIGKILL."
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    members.len()
}

/// The pids of the processes of group `pgid` that are not zombies.
pub fn live_members(pgid: i32) -> HashSet<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            stat_of(*pid)
                .is_some_and(|(state, group)| group == pgid && state != 'Z' && state != 'X')
        })
        .collect()
}

/// State letter and process group of `pid`, from `/proc/<pid>/stat` (the command
/// name may hold spaces and parentheses, so fields are counted after the last `)`).
fn stat_of(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let _ppid = rest.next()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether `pid`'s environment names `record`'s job and lease token.
fn runs_attempt(pid: i32, record: &Record) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let job = format!("QD_JOB_ID={}", record.job);
    let token = format!("QD_LEASE_TOKEN={}", record.token);
    let mut vars = environ.split(|b| *b == 0);
    let (mut has_job, mut has_token) = (false, false);
    for var in &mut vars {
        has_job |= var == job.as_bytes();
        has_token |= var == token.as_bytes();
    }
    has_job && has_token
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    fn record(token: Token) -> Record {
        Record {
            v: 1,
            job: JobId::new(),
            queue: "q".into(),
            attempt: 1,
            token,
            boot: boot_id(),
        }
    }

    #[test]
    fn a_record_round_trips_and_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = record(7);
        write(dir.path(), 4242, &r).expect("write");
        let text = std::fs::read_to_string(dir.path().join("4242")).expect("read");
        assert_eq!(serde_json::from_str::<Record>(&text).expect("json"), r);
        remove(dir.path(), 4242);
        assert!(!dir.path().join("4242").exists());
    }

    #[test]
    fn sweep_kills_a_left_group_and_reports_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = record(99);
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 300 & sleep 300; wait"])
            .env("QD_JOB_ID", r.job.to_string())
            .env("QD_LEASE_TOKEN", "99")
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let pgid = i32::try_from(child.id()).expect("pid");
        // Until the shell has forked both sleeps the group has one member.
        let until = Instant::now() + Duration::from_secs(20);
        while live_members(pgid).len() < 3 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        write(dir.path(), pgid, &r).expect("write");
        let found = sweep(dir.path());
        let _ = child.wait();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].record, r);
        assert_eq!(found[0].killed, 3, "{found:?}");
        assert!(live_members(pgid).is_empty(), "the group is gone");
        assert!(found[0].reason().contains("killed the 3 process(es)"));
        assert!(std::fs::read_dir(dir.path()).expect("dir").next().is_none());
    }

    #[test]
    fn sweep_leaves_a_group_that_does_not_carry_the_attempt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = record(5);
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .env("QD_JOB_ID", r.job.to_string())
            .env("QD_LEASE_TOKEN", "6")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pgid = i32::try_from(child.id()).expect("pid");
        write(dir.path(), pgid, &r).expect("write");
        let found = sweep(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].killed, 0,
            "another token: not this attempt's group"
        );
        assert_eq!(live_members(pgid).len(), 1, "still running");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn sweep_of_a_missing_folder_finds_nothing() {
        assert!(sweep(Path::new("/nonexistent/qd-attempts")).is_empty());
    }
}
