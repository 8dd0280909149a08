//! The attempt watchdog: a small process between qd and a job's program that stops
//! the job's process group when qd dies or freezes.
//!
//! qd starts `qd __watchdog --grace-ms G --stall-ms S -- PROGRAM ARGS...` as the
//! leader of the attempt's process group. Its stdin is the **lifeline**: qd writes
//! the payload's length (8 bytes, big-endian) and the payload, then a beat every
//! [`BEAT`] ([`beat`]). The watchdog starts the program in the same group, hands it the payload
//! on its own stdin pipe and lets it inherit stdout and stderr (qd reads them
//! directly). When the lifeline ends (qd exited, however it died: the kernel closes
//! its end) or stays silent for `S` (qd is frozen, e.g. `SIGSTOP` or a stuck host
//! thread), the watchdog sends the group SIGTERM and, `G` later, SIGKILL.
//!
//! On a cluster node each beat also carries how long the node may still act on
//! its leases (its fencing deadline, `fence.rs`): the watchdog stops the group the
//! same way once that deadline passes without a later beat moving it. So a node
//! that is frozen, or cut off from its database, has its command attempts stopped
//! by the time the leader may hand their jobs to another node, whatever the
//! daemon itself does then. This does
//! not depend on which thread of qd spawned it (the caveat of `PR_SET_PDEATHSIG`) nor
//! on qd running at all.
//!
//! Otherwise it is transparent: it ignores the signals qd sends the group (the
//! program gets its own copy), exits with the program's exit code, or dies by the
//! signal that killed the program, so qd classifies the attempt as before.
//!
//! Runs with no async runtime and no logging: its stderr is the job's.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::getpgrp;

/// How often qd writes a lifeline byte.
pub const BEAT: Duration = Duration::from_millis(500);

/// One lifeline beat: `.` (alive), or, with a fencing deadline `remaining` from
/// now, its milliseconds in ASCII digits and `;`.
pub fn beat(remaining: Option<Duration>) -> Vec<u8> {
    match remaining {
        None => b".".to_vec(),
        Some(left) => format!("{};", left.as_millis()).into_bytes(),
    }
}

/// Reads beats from the lifeline's bytes, which may arrive cut anywhere.
#[derive(Default)]
struct Beats {
    digits: Option<u64>,
}

impl Beats {
    /// Takes one byte; answers `Some(deadline)` for a beat (`None` inside it for
    /// `.`, which carries no deadline), `None` while a deadline is still being read.
    fn push(&mut self, byte: u8) -> Option<Option<Duration>> {
        match byte {
            b'0'..=b'9' => {
                let digit = u64::from(byte - b'0');
                self.digits = Some(
                    self.digits
                        .unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(digit),
                );
                None
            }
            b';' => Some(Some(Duration::from_millis(self.digits.take().unwrap_or(0)))),
            _ => {
                self.digits = None;
                Some(None)
            }
        }
    }
}

/// Signals sent to the whole group that the watchdog outlives: the program handles
/// them as it likes, and the watchdog reports how the program ended.
const PASSED_THROUGH: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGQUIT,
];

/// Exit code when the program cannot be started (as a shell answers).
const CANNOT_START: u8 = 127;

/// What `qd __watchdog` was asked to do.
#[derive(Debug)]
pub struct Orders {
    /// Time between SIGTERM and SIGKILL of the group once the lifeline is lost.
    pub grace: Duration,
    /// Longest silence of the lifeline before qd is taken for frozen.
    pub stall: Duration,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Runs the watchdog to the end of the program; the process's exit code (or the
/// program's fatal signal, re-raised) follows the program's.
pub fn run(orders: Orders) -> ExitCode {
    let ignored = Arc::new(AtomicBool::new(false));
    for sig in PASSED_THROUGH {
        // A handled signal is reset to its default in the program by exec.
        let _ = signal_hook::flag::register(sig, ignored.clone());
    }
    let mut lifeline = io::stdin();
    let payload = match read_payload(&mut lifeline) {
        Ok(payload) => payload,
        // qd died before the attempt began: nothing was started.
        Err(_) => return ExitCode::from(CANNOT_START),
    };
    let Some((program, args)) = orders.command.split_first() else {
        eprintln!("qd watchdog: no program given");
        return ExitCode::from(CANNOT_START);
    };
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cannot start {}: {e}", program.to_string_lossy());
            return ExitCode::from(CANNOT_START);
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            // A program that exits without reading its input is fine.
            let _ = stdin.write_all(&payload);
        });
    }
    let lost = Arc::new(AtomicBool::new(false));
    watch(lifeline, orders.grace, orders.stall, lost.clone());
    let status = child.wait();
    if lost.load(Ordering::SeqCst) {
        // qd is gone: nobody else will stop what the program left in the group.
        let _ = killpg(getpgrp(), Signal::SIGKILL);
    }
    match status {
        Ok(status) => exit_like(status),
        Err(e) => {
            eprintln!("qd watchdog: cannot wait for the program: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the lifeline's header: the payload's length, then the payload.
fn read_payload(lifeline: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0_u8; 8];
    lifeline.read_exact(&mut len)?;
    let len = usize::try_from(u64::from_be_bytes(len))
        .map_err(|_| io::Error::other("payload length does not fit"))?;
    let mut payload = Vec::new();
    lifeline.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() == len {
        Ok(payload)
    } else {
        Err(io::ErrorKind::UnexpectedEof.into())
    }
}

/// Watches the lifeline on two threads: one reads it (each byte is a sign of life,
/// EOF or an error is qd's death; a beat may carry a fencing deadline), one stops
/// the group when it is lost, silent for `stall` or past the last deadline.
fn watch(
    mut lifeline: impl Read + Send + 'static,
    grace: Duration,
    stall: Duration,
    lost: Arc<AtomicBool>,
) {
    let last = Arc::new(Mutex::new(Instant::now()));
    let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let closed = Arc::new(AtomicBool::new(false));
    {
        let (last, deadline, closed) = (last.clone(), deadline.clone(), closed.clone());
        std::thread::spawn(move || {
            let mut buf = [0_u8; 64];
            let mut beats = Beats::default();
            while let Ok(n @ 1..) = lifeline.read(&mut buf) {
                let now = Instant::now();
                *last.lock().unwrap_or_else(|e| e.into_inner()) = now;
                for byte in &buf[..n] {
                    if let Some(Some(left)) = beats.push(*byte) {
                        // A deadline beyond the clock's range is none.
                        *deadline.lock().unwrap_or_else(|e| e.into_inner()) = now.checked_add(left);
                    }
                }
            }
            closed.store(true, Ordering::SeqCst);
        });
    }
    std::thread::spawn(move || {
        let tick = (stall / 4).clamp(Duration::from_millis(20), Duration::from_millis(100));
        loop {
            std::thread::sleep(tick);
            let silent = last.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
            let fenced = deadline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|d| Instant::now() >= d);
            if closed.load(Ordering::SeqCst) || silent > stall || fenced {
                break;
            }
        }
        lost.store(true, Ordering::SeqCst);
        let _ = killpg(getpgrp(), Signal::SIGTERM);
        std::thread::sleep(grace);
        let _ = killpg(getpgrp(), Signal::SIGKILL);
    });
}

/// Ends this process the way the program ended.
fn exit_like(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if let Some(sig) = status.signal() {
        if PASSED_THROUGH.contains(&sig) {
            let _ = signal_hook::low_level::emulate_default_handler(sig);
        } else if let Ok(signal) = Signal::try_from(sig) {
            let _ = nix::sys::signal::raise(signal);
        }
        return ExitCode::from(u8::try_from(128 + sig).unwrap_or(1));
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_read_from_its_length_prefix() {
        let mut input: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 3, b'a', b'b', b'c', b'.', b'.'];
        assert_eq!(read_payload(&mut input).expect("payload"), b"abc");
        assert_eq!(
            input, b"..",
            "the beats after the payload are left for the watch"
        );
    }

    #[test]
    fn beats_carry_the_fencing_deadline_whatever_the_cuts() {
        let mut beats = Beats::default();
        let bytes: Vec<u8> = [
            beat(None),
            beat(Some(Duration::from_millis(1234))),
            beat(None),
        ]
        .concat();
        let read: Vec<Option<Duration>> = bytes.iter().filter_map(|b| beats.push(*b)).collect();
        assert_eq!(read, [None, Some(Duration::from_millis(1234)), None]);
        assert_eq!(beat(Some(Duration::ZERO)), b"0;");
        // A run of digits that overflows saturates instead of wrapping.
        let mut beats = Beats::default();
        let huge = "9".repeat(40) + ";";
        let read: Vec<_> = huge.bytes().filter_map(|b| beats.push(b)).collect();
        assert_eq!(read, [Some(Duration::from_millis(u64::MAX))]);
    }

    #[test]
    fn a_lifeline_cut_inside_the_payload_is_an_error() {
        let mut input: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 9, b'a'];
        assert!(read_payload(&mut input).is_err());
        let mut empty: &[u8] = &[];
        assert!(read_payload(&mut empty).is_err());
    }
}
