//! The `WHERE … ORDER BY … LIMIT` tail of a [`JobFilter`] for the SQL backends: one
//! translation of the filter, spelled in each backend's [`Dialect`] (placeholders,
//! how a live lease shows, text search, the jobs table's name). The backends bind
//! the returned [`Arg`]s in order and prepend their own `SELECT … FROM`.

use super::{JobFilter, JobOrder};
use crate::job::{JobId, State};

/// How one SQL backend spells what the filter needs. The jobs table is aliased `j`.
pub(crate) struct Dialect {
    /// The n-th (1-based) placeholder: `?n` (SQLite) or `$n` (PostgreSQL).
    pub placeholder: fn(usize) -> String,
    /// True when no lease is recorded for `j`.
    pub unleased: &'static str,
    /// True when a lease is recorded for `j`.
    pub leased: &'static str,
    /// True when `j.last_error` contains the text bound at the given placeholder,
    /// ASCII case-insensitively.
    pub contains: fn(&str) -> String,
    /// The jobs table (for the cursor of [`JobOrder::RecentlyUpdated`]).
    pub jobs: &'static str,
    /// The condition of an index over only the ended and dead jobs, as a term over
    /// `j`, if the backend has one: a filter for one of those states repeats it so
    /// the planner may use that index (SQLite uses a partial index only then).
    pub ended: Option<&'static str>,
}

/// A value to bind, in placeholder order.
#[derive(Debug, PartialEq)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
    Id(JobId),
}

/// The filter's ` WHERE … ORDER BY … LIMIT …` (leading space) and its arguments.
pub(crate) fn tail(filter: &JobFilter, d: &Dialect) -> (String, Vec<Arg>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut args: Vec<Arg> = Vec::new();
    // Binds `value` as the next parameter and adds the clause made with its placeholder.
    let mut add = |make: &dyn Fn(&str) -> String, value: Arg| {
        args.push(value);
        clauses.push(make(&(d.placeholder)(args.len())));
    };
    if let Some(queue) = &filter.queue {
        add(&|p| format!("j.queue = {p}"), Arg::Text(queue.clone()));
    }
    if let Some(tenant) = &filter.tenant {
        add(&|p| format!("j.tenant = {p}"), Arg::Text(tenant.clone()));
    }
    match filter.state {
        Some(State::Leased) => {}
        // As every view shows it: a delayed job whose time has come is ready.
        Some(State::Ready) => add(
            &|p| {
                format!(
                    "(j.state = 'ready' OR (j.state = 'delayed' AND j.ready_at <= {p})) AND {}",
                    d.unleased
                )
            },
            Arg::Int(filter.now),
        ),
        Some(State::Delayed) => add(
            &|p| {
                format!(
                    "j.state = 'delayed' AND j.ready_at > {p} AND {}",
                    d.unleased
                )
            },
            Arg::Int(filter.now),
        ),
        Some(state) => add(
            &|p| match d.ended {
                Some(ended) => format!("{ended} AND j.state = {p}"),
                None => format!("j.state = {p}"),
            },
            Arg::Text(state.as_str().into()),
        ),
        None => {}
    }
    if let Some(text) = &filter.error_contains {
        add(&|p| (d.contains)(p), Arg::Text(text.clone()));
    }
    if let Some(since) = filter.updated_since {
        add(&|p| format!("j.updated_at >= {p}"), Arg::Int(since));
    }
    if let Some(after) = filter.after {
        let cursor = |p: &str| match filter.order {
            JobOrder::OldestFirst => format!("j.id > {p}"),
            JobOrder::NewestFirst => format!("j.id < {p}"),
            JobOrder::RecentlyUpdated => format!(
                "(j.updated_at, j.id) < (SELECT updated_at, id FROM {} WHERE id = {p})",
                d.jobs
            ),
        };
        add(&cursor, Arg::Id(after));
    }
    if filter.state == Some(State::Leased) {
        clauses.push(d.leased.into());
    }
    let mut sql = String::new();
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    args.push(Arg::Int(filter.limit.into()));
    let order = match filter.order {
        JobOrder::OldestFirst => "j.id",
        JobOrder::NewestFirst => "j.id DESC",
        JobOrder::RecentlyUpdated => "j.updated_at DESC, j.id DESC",
    };
    let limit = (d.placeholder)(args.len());
    sql.push_str(&format!(" ORDER BY {order} LIMIT {limit}"));
    (sql, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOLLAR: Dialect = Dialect {
        placeholder: |n| format!("${n}"),
        unleased: "j.lease IS NULL",
        leased: "j.lease IS NOT NULL",
        contains: |p| format!("strpos(j.last_error, {p}) > 0"),
        jobs: "t",
        ended: None,
    };

    #[test]
    fn every_field_becomes_a_clause_with_its_argument_in_placeholder_order() {
        let after = JobId(uuid::Uuid::from_u128(7));
        let filter = JobFilter {
            queue: Some("q".into()),
            state: Some(State::Ready),
            error_contains: Some("boom".into()),
            after: Some(after),
            order: JobOrder::RecentlyUpdated,
            limit: 5,
            now: 1_000,
            ..JobFilter::default()
        };
        let (sql, args) = tail(&filter, &DOLLAR);
        assert_eq!(
            sql,
            " WHERE j.queue = $1 AND (j.state = 'ready' OR (j.state = 'delayed' AND \
             j.ready_at <= $2)) AND j.lease IS NULL AND \
             strpos(j.last_error, $3) > 0 AND (j.updated_at, j.id) < \
             (SELECT updated_at, id FROM t WHERE id = $4) \
             ORDER BY j.updated_at DESC, j.id DESC LIMIT $5"
        );
        assert_eq!(
            args,
            vec![
                Arg::Text("q".into()),
                Arg::Int(1_000),
                Arg::Text("boom".into()),
                Arg::Id(after),
                Arg::Int(5)
            ]
        );
    }

    #[test]
    fn a_dead_or_ended_state_repeats_the_dialects_index_condition() {
        let with_index = Dialect {
            ended: Some("j.state IN ('dead')"),
            ..DOLLAR
        };
        let dead = JobFilter {
            state: Some(State::Dead),
            ..JobFilter::default()
        };
        assert_eq!(
            tail(&dead, &with_index).0,
            " WHERE j.state IN ('dead') AND j.state = $1 ORDER BY j.id LIMIT $2"
        );
        assert_eq!(
            tail(&dead, &DOLLAR).0,
            " WHERE j.state = $1 ORDER BY j.id LIMIT $2"
        );
    }

    #[test]
    fn leased_is_the_recorded_lease_and_no_filter_is_only_order_and_limit() {
        let leased = JobFilter {
            state: Some(State::Leased),
            ..JobFilter::default()
        };
        assert_eq!(
            tail(&leased, &DOLLAR).0,
            " WHERE j.lease IS NOT NULL ORDER BY j.id LIMIT $1"
        );
        assert_eq!(
            tail(&JobFilter::default(), &DOLLAR).0,
            " ORDER BY j.id LIMIT $1"
        );
    }
}
