//! The audit trail of admin changes: one INFO line per change, with target
//! `qd::audit`, naming who (the peer's uid from `SO_PEERCRED`), what (the op and
//! its object) and the state before and after, e.g.
//! `INFO qd::audit: Admin change. uid=1000 op="queue_pause" what="queue email" before="workers=1..16 paused=no" after="workers=1..16 paused=yes"`.
//! A change made from the web console names its author instead of a uid:
//! `by="console:ops-alice"` (the token's name).
//! Read-only requests leave no line.

use crate::daemon::Daemon;

/// Who asked for a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Author {
    /// A qctl user, by the uid the kernel reported for the socket peer.
    Uid(u32),
    /// A console session, by its token's name (`None`: a loopback console without
    /// a token file, where nobody logs in).
    Console(Option<String>),
}

impl std::fmt::Display for Author {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Author::Uid(uid) => write!(f, "uid {uid}"),
            Author::Console(Some(name)) => write!(f, "console:{name}"),
            Author::Console(None) => f.write_str("console:anonymous"),
        }
    }
}

/// Logs one change made by `author`.
pub(super) fn change(author: &Author, op: &str, what: &str, before: &str, after: &str) {
    match author {
        Author::Uid(uid) => {
            tracing::info!(target: "qd::audit", uid, op, what, before, after, "Admin change.");
        }
        Author::Console(_) => {
            let by = author.to_string();
            tracing::info!(target: "qd::audit", by, op, what, before, after, "Admin change.");
        }
    }
}

/// The override scope `scope`/`name` as a line reads it: `tenant acme`.
pub(super) fn scope_name(scope: &str, name: &str) -> String {
    format!("{scope} {name}")
}

/// Every overridable value of one scope, in force now: what a change's `before`
/// and `after` show (`weight=3 max_concurrency=10 max_depth=queue default`).
pub(super) fn scope_state(d: &Daemon, scope: &str, name: &str) -> String {
    let l = &d.limits;
    match scope {
        "tenant" => {
            let t = l.tenant(name);
            let concurrency = t
                .max_concurrency
                .map_or("unlimited".into(), |n| n.to_string());
            let depth = t
                .max_depth
                .map_or("queue default".into(), |n| n.to_string());
            format!(
                "weight={} max_concurrency={concurrency} max_depth={depth}",
                t.weight
            )
        }
        "queue" => match d.config().queues.get(name) {
            Some(q) => {
                let (min, max) = l.workers(name, &q.workers);
                let paused = if l.paused(name) { "yes" } else { "no" };
                format!("workers={min}..{max} paused={paused}")
            }
            None => "-".into(),
        },
        "limiter" => l.limiter(name).map_or("-".into(), |r| {
            format!("per_second={} burst={}", r.per_second, r.burst)
        }),
        _ => "-".into(),
    }
}

/// Logs one change of several jobs (a redrive or purge batch); nothing when `ids`
/// is empty.
pub(super) fn jobs<T: ToString>(author: &Author, op: &str, ids: &[T], before: &str, after: &str) {
    if !ids.is_empty() {
        let what = format!("{} jobs: {}", ids.len(), ids_text(ids));
        change(author, op, &what, before, after);
    }
}

/// A list of job ids for a line: all of them up to 20, then `... and N more`.
fn ids_text<T: ToString>(ids: &[T]) -> String {
    const SHOWN: usize = 20;
    let mut text: Vec<String> = ids.iter().take(SHOWN).map(ToString::to_string).collect();
    if ids.len() > SHOWN {
        text.push(format!("... and {} more", ids.len() - SHOWN));
    }
    text.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_id_lists_are_cut_with_a_count() {
        assert_eq!(ids_text(&[1, 2]), "1 2");
        let many: Vec<u32> = (0..25).collect();
        assert!(ids_text(&many).ends_with("19 ... and 5 more"));
    }
}
