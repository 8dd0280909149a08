//! The engine-neutral contract of the store: which stored states each intent
//! applies to, whether it may touch a leased job, which states the start-up load
//! and `max_depth` count, and how a set of states is spelled in SQL. Stated once
//! here as data; the engines (`memory.rs`, `sqlite.rs`, `postgres.rs`) take their
//! conditions from it instead of spelling their own, and the conformance suite
//! (`store/tests/conformance.rs`) holds every engine to it. The history cap is
//! [`super::history`], the prune scope [`super::PruneScope`]. Takes no messages.
//!
//! A lease is never a stored state: a leased job is stored ready or delayed with a
//! lease beside it (SQLite: `temp.leases`; PostgreSQL: `lease_token` in the row;
//! the model: `Row::lease`), so every intent below is a condition on the stored
//! state plus a [`LeaseRule`].

use crate::job::State;

/// Every state a job row may hold in the store (never [`State::Leased`]), in
/// life-cycle order: what the engines' `CHECK` constraints allow.
pub const STORED: [State; 7] = [
    State::Delayed,
    State::Ready,
    State::Succeeded,
    State::Dead,
    State::Cancelled,
    State::Waiting,
    State::Blocked,
];

/// The stored states a worker may lease, in the order the claim indexes spell them.
const CLAIMABLE: &[State] = &[State::Ready, State::Delayed];

/// The states the start-up load of a local store reads
/// ([`super::Backend::load_unfinished`]): every job that may still run.
pub const UNFINISHED: &[State] = &[
    State::Delayed,
    State::Ready,
    State::Dead,
    State::Waiting,
    State::Blocked,
];

/// The stored states that count against a queue's or a tenant's `max_depth`
/// (a leased job is stored ready or delayed, so it counts too).
pub const DEPTH: &[State] = &[State::Ready, State::Delayed, State::Waiting, State::Blocked];

/// A change of stored jobs, each item conditioned on the state the store holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// A lease is taken ([`super::Backend::claim`]).
    Claim,
    /// An attempt ends: ack, nack, lease expiry, a lost worker
    /// ([`super::Backend::complete`], and on a shared store
    /// [`super::SharedStore::expire`] and [`super::SharedStore::end_if_due`]).
    Complete,
    /// A dead job goes back to ready ([`super::Backend::redrive`]).
    Redrive,
    /// An operator cancels a job that is not running ([`super::Backend::cancel`]).
    Cancel,
    /// A dead job is deleted ([`super::Backend::purge`]).
    Purge,
    /// A finished job past its retention is deleted
    /// ([`super::Backend::prune_finished`]); the states in the order a batch takes
    /// them.
    Prune,
    /// A job waiting on parents changes state as its edge counters call for
    /// ([`super::Backend::move_edges`], [`super::Backend::release_edges`]).
    Settle,
}

/// What an intent requires of a job's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseRule {
    /// The job holds no lease.
    Unleased,
    /// The lease being ended, fenced by its token: on a shared store the stored
    /// lease has that token; with local leases no other lease is recorded and the
    /// stored `lease_seq` is older than the token (the lease itself may not be
    /// recorded yet, see [`super::Backend::leases_are_local`]).
    Own,
    /// Only prune and purge, whose states are never leased, and settle, whose
    /// states are never claimed: no lease can exist.
    Irrelevant,
}

impl Intent {
    /// Every intent, for tests and documentation.
    pub const ALL: [Intent; 7] = [
        Intent::Claim,
        Intent::Complete,
        Intent::Redrive,
        Intent::Cancel,
        Intent::Purge,
        Intent::Prune,
        Intent::Settle,
    ];

    /// The stored states it applies to.
    pub const fn states(self) -> &'static [State] {
        match self {
            Intent::Claim | Intent::Complete => CLAIMABLE,
            Intent::Redrive | Intent::Purge => &[State::Dead],
            Intent::Cancel => &[
                State::Delayed,
                State::Ready,
                State::Dead,
                State::Waiting,
                State::Blocked,
            ],
            Intent::Prune => &[State::Succeeded, State::Cancelled],
            Intent::Settle => &[State::Waiting, State::Blocked],
        }
    }

    /// What it requires of the job's lease.
    pub const fn lease(self) -> LeaseRule {
        match self {
            Intent::Claim | Intent::Redrive | Intent::Cancel => LeaseRule::Unleased,
            Intent::Complete => LeaseRule::Own,
            Intent::Purge | Intent::Prune | Intent::Settle => LeaseRule::Irrelevant,
        }
    }

    /// Whether it applies to a job stored in `state` (its lease rule aside).
    pub fn applies_to(self, state: State) -> bool {
        self.states().contains(&state)
    }

    /// Its states as a SQL condition on `column` ([`any_of`]).
    pub fn sql(self, column: &str) -> String {
        any_of(column, self.states())
    }
}

/// `column` holds one of `states`, as SQL both engines run without extra cost:
/// one state is `=`; two are an `IN` list, or a `NOT IN` list of the two
/// [`STORED`] states left out (with the engines' `CHECK`, the same rows); more are
/// `OR` terms, since SQLite builds a temporary index at every run of a statement
/// with an `IN` list of three or more constants. States other than [`STORED`]
/// ones are never stored and are left out; none left is `FALSE`. A list keeps the
/// order of `states` (an index condition matches only its own spelling).
pub fn any_of(column: &str, states: &[State]) -> String {
    let wanted: Vec<State> = states
        .iter()
        .copied()
        .filter(|s| STORED.contains(s))
        .collect();
    let others: Vec<State> = STORED
        .iter()
        .copied()
        .filter(|s| !states.contains(s))
        .collect();
    let list = |states: &[State]| {
        states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (wanted.as_slice(), others.as_slice()) {
        ([], _) => "FALSE".to_owned(),
        (_, []) => format!("{column} IS NOT NULL"),
        ([one], _) => format!("{column} = '{}'", one.as_str()),
        (_, [one]) => format!("{column} <> '{}'", one.as_str()),
        ([_, _], _) => format!("{column} IN ({})", list(&wanted)),
        (_, [_, _]) => format!("{column} NOT IN ({})", list(&others)),
        _ => {
            let terms: Vec<String> = wanted
                .iter()
                .map(|s| format!("{column} = '{}'", s.as_str()))
                .collect();
            format!("({})", terms.join(" OR "))
        }
    }
}

/// `column` holds none of `states`: [`any_of`] the other [`STORED`] states.
pub fn none_of(column: &str, states: &[State]) -> String {
    let others: Vec<State> = STORED
        .iter()
        .copied()
        .filter(|s| !states.contains(s))
        .collect();
    any_of(column, &others)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The states `condition` (as [`any_of`] spells it) selects, read back by
    /// evaluating it in SQLite over a one-column table of every stored state.
    fn selected(condition: &str) -> Vec<State> {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE t (state TEXT NOT NULL)")
            .expect("create");
        for state in STORED {
            conn.execute("INSERT INTO t VALUES (?1)", [state.as_str()])
                .expect("insert");
        }
        let sql = format!("SELECT state FROM t WHERE {condition} ORDER BY rowid");
        let mut stmt = conn.prepare(&sql).expect(&sql);
        stmt.query_map([], |r| r.get::<_, String>(0))
            .expect("query")
            .map(|s| s.expect("row").parse().expect("state"))
            .collect()
    }

    #[test]
    fn every_intents_condition_selects_exactly_its_states() {
        for intent in Intent::ALL {
            let want: Vec<State> = STORED
                .into_iter()
                .filter(|s| intent.applies_to(*s))
                .collect();
            assert_eq!(
                selected(&intent.sql("state")),
                want,
                "{intent:?}: {}",
                intent.sql("state")
            );
        }
        for states in [UNFINISHED, DEPTH, &STORED, &[], &[State::Leased]] {
            let want: Vec<State> = STORED.into_iter().filter(|s| states.contains(s)).collect();
            assert_eq!(selected(&any_of("state", states)), want, "{states:?}");
            let rest: Vec<State> = STORED.into_iter().filter(|s| !states.contains(s)).collect();
            assert_eq!(selected(&none_of("state", states)), rest, "{states:?}");
        }
    }

    #[test]
    fn no_condition_is_an_in_list_of_three_or_more() {
        let spelled: Vec<String> = Intent::ALL
            .iter()
            .map(|i| i.sql("j.state"))
            .chain([UNFINISHED, DEPTH].map(|s| any_of("j.state", s)))
            .collect();
        for sql in spelled {
            if let Some(list) = sql.split(" IN (").nth(1) {
                assert!(list.matches(',').count() < 2, "{sql}");
            }
        }
        assert_eq!(
            Intent::Complete.sql("state"),
            "state IN ('ready', 'delayed')"
        );
        assert_eq!(
            Intent::Cancel.sql("state"),
            "state NOT IN ('succeeded', 'cancelled')"
        );
        assert_eq!(Intent::Purge.sql("j.state"), "j.state = 'dead'");
    }

    #[test]
    fn the_intents_respect_the_life_cycle() {
        for intent in Intent::ALL {
            assert!(
                !intent.applies_to(State::Leased),
                "{intent:?}: never stored"
            );
            assert!(intent.states().iter().all(|s| STORED.contains(s)));
        }
        // What a worker may hold is exactly what an attempt's end applies to.
        assert_eq!(Intent::Claim.states(), Intent::Complete.states());
        // Nothing that ended successfully or was cancelled changes again but by
        // pruning; a running job is ended only under its own lease.
        for state in Intent::Prune.states() {
            let changes: Vec<Intent> = Intent::ALL
                .into_iter()
                .filter(|i| i.applies_to(*state))
                .collect();
            assert_eq!(changes, [Intent::Prune], "{state:?}");
        }
        assert_eq!(Intent::Complete.lease(), LeaseRule::Own);
        for intent in [Intent::Redrive, Intent::Cancel, Intent::Claim] {
            assert_eq!(intent.lease(), LeaseRule::Unleased, "{intent:?}");
        }
        // Whatever a prune keeps may still run, and the start-up load reads it all.
        let kept: Vec<State> = STORED
            .into_iter()
            .filter(|s| !Intent::Prune.applies_to(*s))
            .collect();
        assert_eq!(kept, UNFINISHED);
        assert!(DEPTH.iter().all(|s| UNFINISHED.contains(s)));
        assert!(
            !DEPTH.contains(&State::Dead),
            "the DLQ does not fill a queue"
        );
    }
}
