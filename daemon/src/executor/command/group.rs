//! A child process that leads its own process group, and the guarantee that the
//! group never outlives the attempt.
//!
//! The child is spawned with `process_group(0)`, so its pid is also the group id and
//! every descendant that does not call `setsid`/`setpgid` shares it. Signals go to
//! the whole group (`killpg`), so `sh -c 'work & other'` is stopped as one unit.
//!
//! **Why wait without reaping.** Once a pid is reaped the kernel may hand it to a new
//! process, and a `killpg` sent afterwards could hit an unrelated group. So the leader's
//! exit is observed with `waitid(WEXITED | WNOWAIT)`, which leaves it a zombie: while
//! the zombie exists its pid (and so the group id) cannot be reused. Stragglers are
//! SIGKILLed while the pid is still pinned, and only then is the leader reaped, once,
//! by tokio. If the owning future is dropped first, [`Drop`] SIGKILLs the group and
//! tokio's orphan reaper collects the leader, so no process and no zombie is left.
//!
//! **Why record it.** When qd itself dies, nothing above runs. The group's id is
//! written to `data_dir/attempts/` ([`crate::attempt_groups`]) while it runs, so the
//! next start can stop whatever is left before it dispatches the job again.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::attempt_groups::{self, Record};

/// A spawned child leading its own process group; SIGKILLs the group on drop unless
/// the leader has been reaped.
#[derive(Debug)]
pub(super) struct ProcessGroup {
    child: Child,
    pgid: Pid,
    reaped: bool,
    /// The folder holding this group's record, when it was written.
    recorded: Option<PathBuf>,
}

impl ProcessGroup {
    /// Spawns `command` as the leader of a new process group, and records the group
    /// in `record`'s folder if one is given (a record that cannot be written is
    /// logged; the attempt runs anyway).
    pub(super) fn spawn(
        command: &mut Command,
        record: Option<(&Path, Record)>,
    ) -> io::Result<ProcessGroup> {
        let child = command.process_group(0).kill_on_drop(false).spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("the child exited before its pid was read"))?;
        let pgid = i32::try_from(pid)
            .map(Pid::from_raw)
            .map_err(|_| io::Error::other(format!("pid {pid} does not fit a pid_t")))?;
        let recorded = record.and_then(|(dir, record)| {
            match attempt_groups::write(dir, pgid.as_raw(), &record) {
                Ok(()) => Some(dir.to_path_buf()),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), job = %record.job, error = %e,
                        "Cannot record the attempt's process group; a crash of qd now would leave it to its watchdog alone.");
                    None
                }
            }
        });
        Ok(ProcessGroup {
            child,
            pgid,
            reaped: false,
            recorded,
        })
    }

    /// The child's stdio handles (each `Some` only the first time).
    pub(super) fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends `signal` to every process of the group. A group that is already gone is
    /// not an error; any other failure is logged (there is nothing better to do).
    pub(super) fn signal(&self, signal: Signal) {
        if self.reaped {
            return;
        }
        match killpg(self.pgid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pgid = %self.pgid, signal = %signal, error = %e,
                "Cannot signal the job's process group."),
        }
    }

    /// Resolves when the leader has exited, leaving it unreaped (a zombie) so the group
    /// id stays pinned. Call once per attempt. The wait holds a blocking-pool thread
    /// until the leader exits, which every path guarantees (exit, SIGKILL on timeout or
    /// cancel, SIGKILL on drop); a runtime's shutdown waits for that thread.
    pub(super) fn leader_exit(&self) -> JoinHandle<()> {
        let pid = self.pgid;
        tokio::task::spawn_blocking(move || {
            loop {
                match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                    Err(Errno::EINTR) => continue,
                    Ok(_) => return,
                    Err(e) => {
                        tracing::warn!(pid = %pid, error = %e,
                            "Cannot wait for the job's process; reaping it directly.");
                        return;
                    }
                }
            }
        })
    }

    /// Reaps the leader (exactly once) and returns how it ended. After this the group
    /// is no longer signalled, because its id may be reused.
    pub(super) async fn reap(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.reaped = true;
        Ok(status)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(dir) = &self.recorded {
            attempt_groups::remove(dir, self.pgid.as_raw());
        }
    }
}
