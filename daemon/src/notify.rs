//! systemd service notifications (`sd_notify(3)`): readiness, status text, stopping
//! and watchdog pings, for `Type=notify` + `WatchdogSec=` in `deploy/systemd/qd.service`.
//!
//! A thin wrapper over the `sd-notify` crate. Every call is a no-op returning `Ok`
//! when `NOTIFY_SOCKET` is unset (run by hand, in tests, in a container), so callers
//! never branch on "are we under systemd". A failed send is logged at debug level
//! here and returned; callers may ignore it, since a missed notification is
//! systemd's problem to time out on, not qd's to crash on.
//!
//! Who calls what: `main` sends [`ready`] once the store is open, the metrics
//! listener is bound and the supervisor has started its tree (the HTTP API and the
//! admin socket bind in their actors' `pre_start`); the supervisor sends [`stopping`]
//! when shutdown begins; the Gauges actor ([`crate::gauges`]) pings [`watchdog_ping`]
//! on each tick (every 1 s, or half of [`watchdog_interval`] if shorter) but only when
//! the Broker answered every question, so a wedged tree stops the pings and
//! systemd restarts qd. `daemon/tests/metrics.rs` checks all three through the binary.

use std::io;
use std::time::Duration;

use sd_notify::NotifyState;

/// Sends one state to the service manager; logs a failure at debug level.
fn send(state: NotifyState<'_>) -> io::Result<()> {
    sd_notify::notify(std::slice::from_ref(&state)).inspect_err(|error| {
        tracing::debug!(%error, %state, "sd_notify failed; systemd did not get this notification.");
    })
}

/// `READY=1`: start-up is complete; systemd marks the unit active and starts the
/// watchdog clock. Send once, after the store is open and every listener is bound.
pub fn ready() -> io::Result<()> {
    send(NotifyState::Ready)
}

/// `STOPPING=1`: graceful shutdown has begun (shown as "deactivating").
pub fn stopping() -> io::Result<()> {
    send(NotifyState::Stopping)
}

/// `STATUS=<text>`: one line shown by `systemctl status qd`. Newlines would end
/// the field in the protocol, so they are replaced by spaces.
pub fn status(text: &str) -> io::Result<()> {
    let line = text.replace(['\n', '\r'], " ");
    send(NotifyState::Status(&line))
}

/// The watchdog timeout systemd set (`WATCHDOG_USEC`, honouring `WATCHDOG_PID`), or
/// `None` when the watchdog is off or meant for another process (a job command
/// inherits the variables but not the PID). Ping at half this interval, as
/// `sd_watchdog_enabled(3)` recommends.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

/// `WATCHDOG=1`: "still alive". systemd kills and restarts qd (`Restart=on-failure`)
/// when no ping arrives within [`watchdog_interval`].
pub fn watchdog_ping() -> io::Result<()> {
    send(NotifyState::Watchdog)
}

#[cfg(test)]
mod tests;
