//! Real processes under `/bin/sh`: classification, environment, timeouts, cancel,
//! drop, and the process-group guarantee (grandchildren never outlive the attempt).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::job::JobId;

/// Bound for anything that should happen "soon" (2 shared cores in CI).
const SOON: Duration = Duration::from_secs(30);

fn spec(script: &str) -> CommandSpec {
    CommandSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_owned(), script.to_owned()],
        env: BTreeMap::new(),
        cwd: None,
        exit_codes: ExitCodes {
            transient: vec![75],
            permanent: vec![64, 65],
            throttled: vec![],
            other: ErrorClass::Transient,
            throttle_delay: Duration::from_secs(1),
        },
        timeout: Duration::from_secs(60),
        kill_grace: Duration::from_secs(5),
    }
}

fn job(payload: &[u8]) -> JobRun {
    JobRun {
        id: JobId::new(),
        queue: Arc::from("email"),
        tenant: Arc::from("acme"),
        attempt: 3,
        idempotency_key: "key-42".to_owned(),
        payload: payload.to_vec(),
        max_result: 64 * 1024,
        token: 41,
        lease: Duration::from_secs(30),
        parents: None,
    }
}

async fn run(spec: CommandSpec, payload: &[u8]) -> ExecResult {
    let exec = CommandExecutor::new(spec).expect("valid spec");
    let (job, cancel) = (job(payload), CancellationToken::new());
    let result =
        tokio::time::timeout(SOON, exec.run(&job, &cancel, &CancellationToken::new())).await;
    result.expect("the attempt ends within the bound")
}

fn failure(result: ExecResult) -> Failure {
    match result {
        ExecResult::Failure(f) => f,
        ExecResult::Success { detail, .. } => panic!("expected a failure, got success {detail:?}"),
    }
}

/// Polls until `path` holds a pid (the script writes it when it is running).
async fn read_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + SOON;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Running, i.e. present in /proc and not a zombie waiting for its reaper.
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            !matches!(state, Some("Z" | "X") | None)
        }
        Err(_) => false,
    }
}

/// Waits until none of `pids` runs. On failure it SIGKILLs them first: a leader left
/// running would also block the test runtime's shutdown (its `waitid` thread), turning
/// a clear failure into a hang.
async fn assert_gone_soon(pids: &[i32]) {
    let deadline = Instant::now() + SOON;
    while let Some(&pid) = pids.iter().find(|&&pid| is_running(pid)) {
        if Instant::now() >= deadline {
            for &pid in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
            panic!("process {pid} is still running");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's and the grandchild's pids, as written by [`pids_then`].
async fn group_pids(dir: &Path) -> [i32; 2] {
    [
        read_pid(&dir.join("leader")).await,
        read_pid(&dir.join("grandchild")).await,
    ]
}

/// A script that records its own pid and a `sleep 1000` grandchild's pid, then waits.
fn pids_then(dir: &Path, tail: &str) -> String {
    format!(
        "echo $$ > {d}/leader; sleep 1000 & echo $! > {d}/grandchild.tmp; \
         mv {d}/grandchild.tmp {d}/grandchild; {tail}",
        d = dir.display()
    )
}

#[tokio::test]
async fn success_sees_payload_env_and_cwd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = spec(
        "printf '%s\\n' \"$QD_JOB_ID\" \"$QD_IDEMPOTENCY_KEY\" \"$QD_ATTEMPT\" \"$QD_QUEUE\" \
         \"$QD_TENANT\" \"$QD_LEASE_TOKEN\" \"$EXTRA\" \"$PWD\" > env.txt; cat > stdin.txt; echo done",
    );
    s.env.insert("EXTRA".into(), "from-spec".into());
    s.env.insert("QD_QUEUE".into(), "spoofed".into());
    s.cwd = Some(dir.path().to_owned());
    let exec = CommandExecutor::new(s).expect("valid spec");
    let job = job(b"hello payload");
    let result = exec
        .run(&job, &CancellationToken::new(), &CancellationToken::new())
        .await;

    assert_eq!(
        result,
        ExecResult::Success {
            detail: Some("done".into()),
            result: None,
        }
    );
    let env = std::fs::read_to_string(dir.path().join("env.txt")).expect("env.txt");
    let cwd = dir.path().canonicalize().expect("canonical dir");
    let expected = [
        job.id.to_string().as_str(),
        "key-42",
        "3",
        "email",
        "acme",
        "41",
        "from-spec",
        cwd.to_str().expect("utf-8 path"),
    ]
    .map(|l| format!("{l}\n"))
    .concat();
    assert_eq!(env, expected);
    let stdin = std::fs::read(dir.path().join("stdin.txt")).expect("stdin.txt");
    assert_eq!(stdin, b"hello payload");
}

#[tokio::test]
async fn exit_75_is_transient_with_stderr_tail() {
    let f = failure(run(spec("echo 'smtp busy' >&2; exit 75"), b"").await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "exit 75: smtp busy".into(),
            retry_after: None
        }
    );
}

#[tokio::test]
async fn exit_65_is_permanent() {
    let f = failure(run(spec("echo 'bad address' >&2; exit 65"), b"").await);
    assert_eq!(
        f,
        Failure::Permanent {
            error: "exit 65: bad address".into()
        }
    );
}

#[tokio::test]
async fn other_codes_follow_the_configured_class() {
    let f = failure(run(spec("exit 3"), b"").await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "exit 3".into(),
            retry_after: None
        }
    );

    let mut s = spec("exit 3");
    s.exit_codes.other = ErrorClass::Permanent;
    assert_eq!(
        failure(run(s, b"").await),
        Failure::Permanent {
            error: "exit 3".into()
        }
    );
}

#[tokio::test]
async fn throttled_code_carries_the_throttle_delay() {
    let mut s = spec("exit 42");
    s.exit_codes.throttled = vec![42];
    s.exit_codes.throttle_delay = Duration::from_secs(7);
    let f = failure(run(s, b"").await);
    assert_eq!(
        f,
        Failure::Throttled {
            retry_after: Duration::from_secs(7),
            error: "exit 42".into()
        }
    );
}

#[tokio::test]
async fn killed_by_a_foreign_signal_is_transient() {
    let f = failure(run(spec("kill -KILL $$"), b"").await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "killed by signal SIGKILL".into(),
            retry_after: None
        }
    );
}

#[tokio::test]
async fn missing_program_is_transient() {
    let mut s = spec("");
    s.program = PathBuf::from("/nonexistent/qd-test-program");
    let f = failure(run(s, b"").await);
    assert!(
        matches!(&f, Failure::Transient { error, .. } if error.starts_with("cannot start /nonexistent")),
        "{f:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_group_with_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = spec(&pids_then(dir.path(), "echo 'working' >&2; wait"));
    s.timeout = Duration::from_millis(500);
    let f = failure(run(s, b"").await);

    assert!(
        matches!(&f, Failure::TimedOut { error }
            if error.contains("stopped by SIGTERM") && error.ends_with(": working")),
        "{f:?}"
    );
    assert_gone_soon(&group_pids(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_ignoring_sigterm_is_sigkilled_after_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The ignored disposition is inherited by the `sleep` grandchild too.
    let script = format!("trap '' TERM; {}", pids_then(dir.path(), "wait"));
    let mut s = spec(&script);
    s.timeout = Duration::from_millis(300);
    s.kill_grace = Duration::from_millis(700);
    let started = Instant::now();
    let f = failure(run(s, b"").await);

    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "SIGKILL came before the grace"
    );
    assert!(
        matches!(&f, Failure::TimedOut { error } if error.contains("SIGKILLed")),
        "{f:?}"
    );
    assert_gone_soon(&group_pids(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_interrupts_and_kills_the_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exec = CommandExecutor::new(spec(&pids_then(dir.path(), "wait"))).expect("valid spec");
    let (cancel, revoked) = (CancellationToken::new(), CancellationToken::new());
    let job = job(b"");
    let attempt = exec.run(&job, &cancel, &revoked);
    let canceller = async {
        let pids = group_pids(dir.path()).await;
        cancel.cancel();
        pids
    };
    let (result, pids) = tokio::time::timeout(SOON, async { tokio::join!(attempt, canceller) })
        .await
        .expect("the attempt ends within the bound");

    assert!(matches!(failure(result), Failure::Interrupted { .. }));
    assert_gone_soon(&pids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_stops_the_group_with_sigterm_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The trap is installed before the pids are written: the test revokes as soon as
    // it sees them, and a SIGTERM before the trap would kill the shell silently.
    let script = format!(
        "trap 'echo term > {}/term; exit 143' TERM; {}",
        dir.path().display(),
        pids_then(dir.path(), "wait")
    );
    let exec = CommandExecutor::new(spec(&script)).expect("spec");
    let (cancel, revoked) = (CancellationToken::new(), CancellationToken::new());
    let job = job(b"");
    let attempt = exec.run(&job, &cancel, &revoked);
    let revoker = async {
        let pids = group_pids(dir.path()).await;
        revoked.cancel();
        pids
    };
    let (result, pids) = tokio::time::timeout(SOON, async { tokio::join!(attempt, revoker) })
        .await
        .expect("the attempt ends within the bound");

    let f = failure(result);
    assert!(
        matches!(&f, Failure::Interrupted { reason } if reason.contains("cancelled by an operator; stopped by SIGTERM")),
        "{f:?}"
    );
    assert!(dir.path().join("term").exists(), "the leader saw SIGTERM");
    assert_gone_soon(&pids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_attempt_kills_the_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exec = Arc::new(CommandExecutor::new(spec(&pids_then(dir.path(), "wait"))).expect("spec"));
    let task = tokio::spawn({
        let exec = Arc::clone(&exec);
        async move {
            exec.run(
                &job(b""),
                &CancellationToken::new(),
                &CancellationToken::new(),
            )
            .await
        }
    });
    let pids = group_pids(dir.path()).await;
    assert!(pids.iter().all(|&pid| is_running(pid)));

    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    assert_gone_soon(&pids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stragglers_are_killed_after_a_clean_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = spec(&pids_then(dir.path(), "exit 0"));
    // The grandchild holds stdout open; the attempt must still end promptly.
    assert_eq!(
        run(s, b"").await,
        ExecResult::Success {
            detail: None,
            result: None,
        }
    );
    assert_gone_soon(&group_pids(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_stderr_keeps_only_a_bounded_tail() {
    let s = spec("head -c 10000000 /dev/zero | tr '\\0' x >&2; echo ' the end' >&2; exit 75");
    let Failure::Transient { error, .. } = failure(run(s, b"").await) else {
        panic!("expected transient");
    };
    assert!(error.starts_with("exit 75: xxx"), "{}", &error[..40]);
    assert!(error.ends_with("x the end"));
    assert!(
        error.len() <= "exit 75: ".len() + OUTPUT_LIMIT,
        "{}",
        error.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_that_never_reads_stdin_does_not_hang() {
    let payload = vec![b'p'; 1024 * 1024];
    assert_eq!(
        run(spec("exit 0"), &payload).await,
        ExecResult::Success {
            detail: None,
            result: None,
        }
    );
    let f = failure(run(spec("sleep 0.2; exit 75"), &payload).await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "exit 75".into(),
            retry_after: None
        }
    );
}

#[test]
fn tail_keeps_the_last_bytes_only() {
    let mut tail = Tail::default();
    tail.push(&vec![b'a'; OUTPUT_LIMIT - 1]);
    tail.push(b"bc");
    assert_eq!(tail.buf.len(), OUTPUT_LIMIT);
    assert!(tail.buf.starts_with(b"aa") && tail.buf.ends_with(b"abc"));
    tail.push(&vec![b'z'; 3 * OUTPUT_LIMIT]);
    assert_eq!(tail.buf, vec![b'z'; OUTPUT_LIMIT]);
}

#[test]
fn invalid_settings_are_named() {
    let mut s = spec("true");
    s.env.insert("A=B".into(), "x".into());
    let err = CommandExecutor::new(s).expect_err("bad env name");
    assert_eq!(err.to_string().split(':').next(), Some("executor.env.A=B"));

    let mut s = spec("true");
    s.args.push("nul\0".into());
    let err = CommandExecutor::new(s).expect_err("NUL in arg");
    assert!(err.to_string().starts_with("executor.args[2]:"), "{err}");

    let mut s = spec("true");
    s.timeout = Duration::ZERO;
    assert!(CommandExecutor::new(s).is_err());
}
