//! Self-fencing of a cluster node: how long this node may still act on the leases
//! it holds, measured from its last successful node heartbeat on the monotonic
//! clock, and the signal that it must stop.
//!
//! A node's heartbeat (`cluster.rs`, every fifth of `node_timeout`) is what keeps
//! its leases in the shared store. Once the start of the last heartbeat that
//! succeeded is `node_timeout` old, the leader may take this node for dead: from
//! then on this node is **fenced**. Its workers stop their running attempts
//! (SIGTERM, SIGKILL `kill_grace` later, `worker_pool/worker.rs`), each command
//! attempt's watchdog is told the same deadline through its lifeline and kills
//! the group by itself if the daemon freezes ([`remaining`]), and it stops
//! reporting itself as the leader. The leader waits `fence_wait` beyond
//! `node_timeout` before it ends the leases, which covers that stop
//! (`daemon/docs/cluster.md`). A heartbeat that succeeds again lifts the fence.
//!
//! The state is process-wide (one node per process) and takes no messages: the
//! Cluster actor calls [`arm`] and [`beat_ok`], its fencing task calls [`check`],
//! workers wait on [`fenced`] and executors read [`remaining`]. A process that
//! never armed it (SQLite, one node) is never fenced.

use std::sync::LazyLock;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How often the fencing task looks at the heartbeat's age.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

struct State {
    /// `node_timeout` once armed.
    timeout: Option<Duration>,
    /// When the last heartbeat that succeeded started.
    last_ok: Instant,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| {
    Mutex::new(State {
        timeout: None,
        last_ok: Instant::now(),
    })
});

static FENCED: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::Sender::new(false));

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts fencing with `node_timeout`, counting from now (the node just opened
/// the store, which recorded its heartbeat).
pub fn arm(node_timeout: Duration) {
    let mut s = state();
    s.timeout = Some(node_timeout);
    s.last_ok = Instant::now();
}

/// Records a heartbeat that succeeded and had started at `started`; lifts the
/// fence if it was up. Answers whether it was.
pub fn beat_ok(started: Instant) -> bool {
    {
        let mut s = state();
        s.last_ok = s.last_ok.max(started);
    }
    FENCED.send_replace(false)
}

/// How long this node may still act on its leases: `node_timeout` after the start
/// of its last successful heartbeat, less the time since. `None` when fencing is
/// not armed (a store only this node writes).
pub fn remaining() -> Option<Duration> {
    let s = state();
    let timeout = s.timeout?;
    Some((s.last_ok + timeout).saturating_duration_since(Instant::now()))
}

/// How old the last successful heartbeat is (from its start); `None` unarmed.
pub fn heartbeat_age() -> Option<Duration> {
    let s = state();
    s.timeout?;
    Some(s.last_ok.elapsed())
}

/// Raises the fence once [`remaining`] reached zero; answers `true` only when
/// this call raised it.
pub fn check() -> bool {
    if remaining() != Some(Duration::ZERO) {
        return false;
    }
    !FENCED.send_replace(true)
}

/// Whether the fence is up.
pub fn is_fenced() -> bool {
    *FENCED.borrow()
}

/// Resolves once the fence is up (at once if it already is).
pub async fn fenced() {
    let mut rx = FENCED.subscribe();
    // The sender lives in a static: the wait ends only when the value is true.
    let _ = rx.wait_for(|up| *up).await;
}
