//! Job dependencies on PostgreSQL across two stores (two nodes) on one database,
//! with the two transactions held open at once (a barrier inside each operation),
//! so the races the issue names happen every time rather than by luck: two
//! parents of one child finishing at the same moment (no lost wake-up), and a
//! child enqueued while its parent finishes (never missed), in both orders.

use std::sync::{Arc, Barrier};
use std::thread;

use super::pg::database;
use super::postgres::{node, open_pg};
use super::*;
use crate::deps::{After, AfterPolicy, Edge};

/// Time for the other node's statement to reach the lock it must wait for. The
/// outcome checked never depends on it: it only gives a missing lock the chance
/// to show.
const LET_THE_OTHER_GO: Duration = Duration::from_millis(300);

fn after(parents: &[&Job]) -> After {
    After {
        parents: parents.iter().map(|p| p.id).collect(),
        policy: AfterPolicy::Succeeded,
        refs: Vec::new(),
    }
}

fn enqueue_child(b: &mut dyn Backend, child: &Job, parents: &[&Job]) -> Result<State, StoreError> {
    let record = NewRecord {
        job: child.clone(),
        payload: b"child".to_vec(),
    };
    let answer = b.enqueue_after(&[record], &[after(parents)], false)?;
    assert_eq!(answer[0].0, Inserted::New);
    Ok(answer[0].1)
}

/// The ack of `job`'s lease of token 1, written and its edges moved, as the
/// Broker writes every end.
fn ack_and_move(b: &mut dyn Backend, job: &Job) -> Result<Vec<Job>, StoreError> {
    let t = Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: 1,
            updated_at: 2_000,
            ..job.clone()
        },
        entry: None,
        result: None,
    };
    assert_eq!(b.complete(std::slice::from_ref(&t))?, vec![true]);
    b.move_edges(&[(t.job.id, State::Succeeded)], 2_000)
}

fn stored(db: &super::pg::Database, id: JobId, what: &str) -> String {
    db.psql(&format!("SELECT {what} FROM qd_jobs WHERE id = '{}'", id.0))
}

fn claim(store: &Store, job: &Job) {
    let lease = leased(job, 1);
    assert_eq!(
        block(store, move |s| s
            .claim_for(&[lease], Duration::from_secs(600))),
        Ok(vec![Some(b"p".to_vec())])
    );
}

#[test]
fn two_parents_of_one_child_finishing_at_once_on_two_nodes_release_it_exactly_once() {
    let Some(db) = database() else { return };
    let (a, b) = (open_pg(&db.url, &node("a")), open_pg(&db.url, &node("b")));
    for round in 0..5u128 {
        let (p1, p2, child) = (
            job(round * 10 + 1, "q", None),
            job(round * 10 + 2, "q", None),
            job(round * 10 + 3, "q", None),
        );
        for p in [&p1, &p2] {
            let p = p.clone();
            block(&a, move |s| insert(s, &p, b"p")).expect("insert a parent");
        }
        claim(&a, &p1);
        claim(&b, &p2);
        let (c, q1, q2) = (child.clone(), p1.clone(), p2.clone());
        let state = block(&a, move |s| enqueue_child(s, &c, &[&q1, &q2])).expect("enqueue");
        assert_eq!(state, State::Waiting);

        // Both acks are written, then both move their edges while both
        // transactions are open.
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [(a.clone(), p1.clone()), (b.clone(), p2.clone())]
            .into_iter()
            .map(|(store, parent)| {
                let barrier = barrier.clone();
                thread::spawn(move || {
                    block(&store, move |s| {
                        let t = Transition {
                            job: Job {
                                state: State::Succeeded,
                                attempts: 1,
                                lease_seq: 1,
                                updated_at: 2_000,
                                ..parent.clone()
                            },
                            entry: None,
                            result: None,
                        };
                        assert_eq!(s.complete(std::slice::from_ref(&t))?, vec![true]);
                        barrier.wait();
                        s.move_edges(&[(parent.id, State::Succeeded)], 2_000)
                    })
                })
            })
            .collect();
        let released: Vec<Job> = racers
            .into_iter()
            .flat_map(|r| r.join().expect("racer").expect("ack and move"))
            .collect();
        assert_eq!(
            released.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(),
            vec![(child.id, State::Ready)],
            "round {round}: exactly one of the two nodes releases the child"
        );
        assert_eq!(
            stored(
                &db,
                child.id,
                "state || ' ' || deps_unmet || ' ' || deps_broken"
            ),
            "ready 0 0",
            "round {round}"
        );
        assert_eq!(
            db.psql(&format!(
                "SELECT string_agg(state, ',') FROM qd_job_edges WHERE child = '{}'",
                child.id.0
            )),
            "met,met"
        );
    }
}

#[test]
fn a_child_enqueued_while_its_parent_finishes_on_another_node_is_never_missed() {
    let Some(db) = database() else { return };
    let (a, b) = (open_pg(&db.url, &node("a")), open_pg(&db.url, &node("b")));
    for enqueue_first in [true, false] {
        let base = if enqueue_first { 100 } else { 200 };
        let (parent, child) = (job(base + 1, "q", None), job(base + 2, "q", None));
        let p = parent.clone();
        block(&b, move |s| insert(s, &p, b"p")).expect("insert the parent");
        claim(&b, &parent);
        let barrier = Arc::new(Barrier::new(2));
        // The first writer holds its transaction open past the barrier, so the
        // second one's statements meet its locks.
        let (bar, c, p, node_a) = (barrier.clone(), child.clone(), parent.clone(), a.clone());
        let enqueue = thread::spawn(move || {
            block(&node_a, move |s| {
                if enqueue_first {
                    let state = enqueue_child(s, &c, &[&p])?;
                    bar.wait();
                    thread::sleep(LET_THE_OTHER_GO);
                    Ok((state, Vec::<Job>::new()))
                } else {
                    bar.wait();
                    Ok((enqueue_child(s, &c, &[&p])?, Vec::new()))
                }
            })
        });
        let (bar, p, node_b) = (barrier.clone(), parent.clone(), b.clone());
        let finish = thread::spawn(move || {
            block(&node_b, move |s| {
                if enqueue_first {
                    bar.wait();
                    ack_and_move(s, &p)
                } else {
                    let moved = ack_and_move(s, &p)?;
                    bar.wait();
                    thread::sleep(LET_THE_OTHER_GO);
                    Ok(moved)
                }
            })
        });
        let (state, _) = enqueue.join().expect("enqueue").expect("enqueued");
        let moved = finish.join().expect("finish").expect("finished");
        if enqueue_first {
            assert_eq!(state, State::Waiting, "the parent was not final yet");
            assert_eq!(
                moved.iter().map(|j| (j.id, j.state)).collect::<Vec<_>>(),
                vec![(child.id, State::Ready)],
                "the parent's end saw the new edge"
            );
        } else {
            assert_eq!(state, State::Ready, "the enqueue read the committed end");
            assert!(moved.is_empty(), "{moved:?}");
        }
        assert_eq!(
            stored(&db, child.id, "state || ' ' || deps_unmet"),
            "ready 0",
            "enqueue first: {enqueue_first}"
        );
    }
}

#[test]
fn a_dead_parent_blocks_its_child_a_redrive_reopens_it_and_retention_keeps_the_parent() {
    let Some(db) = database() else { return };
    let a = open_pg(&db.url, &node("a"));
    let (parent, done, child) = (job(1, "q", None), job(2, "q", None), job(3, "q", None));
    for p in [&parent, &done] {
        let p = p.clone();
        block(&a, move |s| insert(s, &p.clone(), b"p")).expect("insert");
    }
    claim(&a, &parent);
    claim(&a, &done);
    let d = done.clone();
    block(&a, move |s| ack_and_move(s, &d)).expect("ack the other parent");
    let (c, p, d) = (child.clone(), parent.clone(), done.clone());
    let state = block(&a, move |s| enqueue_child(s, &c, &[&p, &d])).expect("enqueue");
    assert_eq!(state, State::Waiting, "one parent is final already");
    assert_eq!(stored(&db, child.id, "deps_unmet"), "1");

    let dead = Transition {
        job: Job {
            state: State::Dead,
            attempts: 1,
            lease_seq: 1,
            updated_at: 3_000,
            ..parent.clone()
        },
        entry: None,
        result: None,
    };
    let moved = block(&a, move |s| {
        assert_eq!(s.complete(std::slice::from_ref(&dead))?, vec![true]);
        s.move_edges(&[(dead.job.id, State::Dead)], 3_000)
    })
    .expect("the parent dies");
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].state, State::Blocked);
    let detail = block(&a, move |s| s.job(JobId(Uuid::from_u128(3)))).expect("read");
    let history = format!("{:?}", detail.expect("the child").history);
    assert!(history.contains(&parent.id.to_string()), "{history}");

    // Retention keeps a finished parent a held job names; the depth counts the
    // held child.
    let pruned = block(&a, |s| {
        s.prune_finished(&PruneScope::Queue("q".into()), 10_000, 10)
    })
    .expect("prune");
    assert_eq!(
        pruned, 0,
        "the succeeded parent is named by a blocked child"
    );
    assert_eq!(
        db.psql("SELECT sum(depth) FROM qd_queue_depths WHERE queue = 'q'"),
        "1",
        "the blocked child counts toward max_depth"
    );

    let redrive = Transition {
        job: Job {
            state: State::Ready,
            updated_at: 4_000,
            ..dead_of(&parent)
        },
        entry: None,
        result: None,
    };
    let moved = block(&a, move |s| {
        assert_eq!(s.redrive(std::slice::from_ref(&redrive))?, vec![true]);
        s.move_edges(&[(redrive.job.id, State::Ready)], 4_000)
    })
    .expect("redrive");
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].state,
        State::Waiting,
        "back to waiting in the redrive"
    );
    assert_eq!(
        stored(&db, child.id, "deps_unmet || ' ' || deps_broken"),
        "1 0"
    );
    let edges = block(&a, move |s| s.edges(JobId(Uuid::from_u128(3)))).expect("edges");
    assert_eq!(
        edges.parents,
        vec![(parent.id, Edge::Open), (done.id, Edge::Met)]
    );
    let dependents = block(&a, move |s| s.dependents(JobId(Uuid::from_u128(1)))).expect("down");
    assert_eq!(dependents, vec![child.id]);
}

fn dead_of(job: &Job) -> Job {
    Job {
        state: State::Dead,
        attempts: 1,
        lease_seq: 1,
        ..job.clone()
    }
}

/// A child enqueued on one node while another purges its dead parent is never
/// stranded: the purge's check (`blocked_by`) locks the parent, which the
/// enqueue locks `FOR SHARE`. Purge first: the enqueue waits, then finds no
/// parent. Enqueue first: the check waits, then sees the child and holds the
/// parent back.
#[test]
fn a_child_enqueued_while_its_dead_parent_is_purged_on_another_node_is_never_stranded() {
    let Some(db) = database() else { return };
    let (a, b) = (open_pg(&db.url, &node("a")), open_pg(&db.url, &node("b")));
    for purge_first in [true, false] {
        let base = if purge_first { 300 } else { 400 };
        let (parent, child) = (
            Job {
                state: State::Dead,
                ..job(base + 1, "q", None)
            },
            job(base + 2, "q", None),
        );
        let p = parent.clone();
        block(&a, move |s| insert(s, &p, b"p")).expect("insert the dead parent");
        let barrier = Arc::new(Barrier::new(2));
        // The first writer holds its transaction open past the barrier, so the
        // second one's statements meet its locks.
        let (bar, id, node_a) = (barrier.clone(), parent.id, a.clone());
        let purge = thread::spawn(move || {
            block(&node_a, move |s| {
                if !purge_first {
                    bar.wait();
                }
                let held = s.blocked_by(id)?;
                if purge_first {
                    bar.wait();
                    thread::sleep(LET_THE_OTHER_GO);
                }
                let purged = if held.is_empty() {
                    s.purge(&[id])?
                } else {
                    vec![false]
                };
                Ok((held, purged))
            })
        });
        let (bar, c, p, node_b) = (barrier.clone(), child.clone(), parent.clone(), b.clone());
        let enqueue = thread::spawn(move || {
            block(&node_b, move |s| {
                if purge_first {
                    bar.wait();
                    return enqueue_child(s, &c, &[&p]);
                }
                let state = enqueue_child(s, &c, &[&p])?;
                bar.wait();
                thread::sleep(LET_THE_OTHER_GO);
                Ok(state)
            })
        });
        let (held, purged) = purge.join().expect("purge").expect("purged");
        let enqueued = enqueue.join().expect("enqueue");
        if purge_first {
            assert!(held.is_empty(), "{held:?}");
            assert_eq!(purged, vec![true]);
            assert!(
                matches!(enqueued, Err(StoreError::After { .. })),
                "the enqueue found no parent: {enqueued:?}"
            );
        } else {
            assert_eq!(enqueued, Ok(State::Blocked));
            assert_eq!(held, vec![child.id], "the check saw the committed child");
            assert_eq!(purged, vec![false]);
        }
        assert_eq!(
            db.psql(&format!(
                "SELECT count(*) FROM qd_job_edges e WHERE NOT EXISTS \
                 (SELECT 1 FROM qd_jobs p WHERE p.id = e.parent) AND e.child = '{}'",
                child.id.0
            )),
            "0",
            "purge first: {purge_first}: no edge names a purged parent"
        );
    }
}
