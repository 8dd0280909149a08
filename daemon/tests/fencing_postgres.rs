//! Self-fencing on a PostgreSQL cluster, through real processes: node a's database
//! connections hang (node a reaches PostgreSQL through a socket proxy in the test
//! that, during the cut, forwards nothing and connects nothing, without resetting
//! a connection, as a network partition does) while it runs a long command job. Node a must stop that run before node b may start the job again (each
//! run appends its start and stop to a file: no two runs overlap), answer an
//! enqueue within a few seconds with `503`, and from `node_timeout` on the two
//! nodes never both report being the leader. The same run must also be stopped
//! in time when the whole qd process of node a is frozen (`SIGSTOP`): its
//! watchdog stops the job's processes without the daemon.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::pg::{self, Database};
use common::{Qd, script, signal, wait_for};
use serde_json::json;

/// How long the job's program runs when nobody stops it.
const RUN_SECS: u64 = 15;

fn node(db: &Database, name: &str, body: &str) -> Qd {
    let daemon = format!(
        "node_name = \"{name}\"\nnode_timeout = \"5s\"\nfence_wait = \"4s\"\npoll_interval = \"200ms\"\n"
    );
    Qd::configure_node(db, &daemon, body)
}

/// One run of the job, from the file its program writes: start and stop in
/// nanoseconds since the epoch (`None` when the run left no stop line).
#[derive(Debug)]
struct Run {
    token: String,
    start: u128,
    stop: Option<u128>,
}

fn runs(path: &std::path::Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [what, token, at] = parts[..] else {
            panic!("unexpected line {line:?} in\n{text}");
        };
        let at: u128 = at.parse().expect("a time");
        match what {
            "start" => runs.push(Run {
                token: token.to_owned(),
                start: at,
                stop: None,
            }),
            "stop" => {
                let run = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.token == token && r.stop.is_none())
                    .unwrap_or_else(|| panic!("a stop without its start in\n{text}"));
                run.stop = Some(at);
            }
            other => panic!("unexpected {other:?} in\n{text}"),
        }
    }
    runs
}

/// A partition between node a and PostgreSQL: a proxy on a Unix socket of its own
/// that forwards to the cluster's socket while open. Cut, it forwards no byte and
/// connects no new client (both wait, nothing is reset); healed, what waited goes
/// through. Stopping PostgreSQL's backends instead leaves a race: a connection
/// node a opens during the cut works until the stopper finds its backend, and
/// one heartbeat written through it keeps node a alive and the leader.
struct Partition {
    dir: tempfile::TempDir,
    cut: Arc<AtomicBool>,
}

impl Partition {
    fn open(db: &Database) -> Partition {
        let upstream = db
            .url
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("host="))
            .map(|host| std::path::Path::new(host).join(".s.PGSQL.5432"))
            .expect("the test database's url names its socket directory");
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join(".s.PGSQL.5432"))
            .expect("bind the proxy's socket");
        let cut = Arc::new(AtomicBool::new(false));
        let gate = cut.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (gate, upstream) = (gate.clone(), upstream.clone());
                thread::spawn(move || {
                    wait_healed(&gate);
                    let Ok(server) = std::os::unix::net::UnixStream::connect(&upstream) else {
                        return;
                    };
                    let (c, s) = (client.try_clone(), server.try_clone());
                    let (Ok(c), Ok(s)) = (c, s) else { return };
                    let back = gate.clone();
                    thread::spawn(move || pump(s, c, &back));
                    pump(client, server, &gate);
                });
            }
        });
        Partition { dir, cut }
    }

    /// Node a's connection string: the test database through this proxy.
    fn url(&self, db: &Database) -> String {
        db.url
            .split_whitespace()
            .map(|kv| match kv.strip_prefix("host=") {
                Some(_) => format!("host={}", self.dir.path().display()),
                None => kv.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn wait_healed(cut: &AtomicBool) {
    while cut.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(10));
    }
}

/// Copies `from` to `to` until either side closes, holding each chunk (and the
/// close) while the partition is cut.
fn pump(
    mut from: std::os::unix::net::UnixStream,
    mut to: std::os::unix::net::UnixStream,
    cut: &AtomicBool,
) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).unwrap_or(0);
        wait_healed(cut);
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            let _ = to.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// Whether `qd` reports being the cluster's leader (`qd_cluster_leader 1`).
fn leads(qd: &Qd) -> bool {
    qd.scrape().lines().any(|l| l == "qd_cluster_leader 1")
}

/// The job's program (appends its start and stop to `file`, runs [`RUN_SECS`]
/// unless stopped; its trap ignores further `SIGTERM`s first, so the fenced worker's
/// and the watchdog's, which may both come, write one stop line with its time) and the queue `long` running it on a node.
fn long_job(dir: &std::path::Path, file: &std::path::Path) -> String {
    let prog = script(
        dir,
        "job.sh",
        &format!(
            "f={f}\n\
             echo \"start $QD_LEASE_TOKEN $(date +%s%N)\" >> $f\n\
             trap 'trap \"\" TERM; echo \"stop $QD_LEASE_TOKEN $(date +%s%N)\" >> $f; exit 143' TERM\n\
             sleep {RUN_SECS} &\n\
             wait $!\n\
             echo \"stop $QD_LEASE_TOKEN $(date +%s%N)\" >> $f\n",
            f = file.display()
        ),
    );
    format!(
        "[queues.long]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 1, max = 1 }}\nlease = \"60s\"\nheartbeat = \"1s\"\n\
         kill_grace = \"2s\"\n",
        prog.display()
    )
}

/// Node a (on `db_a`) takes the long job and starts its run; then node b (on
/// `db`) starts. Answers both nodes and the job's id.
fn start_run(
    db_a: &Database,
    db: &Database,
    body: &str,
    file: &std::path::Path,
) -> (Qd, Qd, String) {
    let mut a = node(db_a, "a", body);
    a.spawn(&[]);
    let id = a.enqueue("long", "x");
    wait_for("node a to start the run", Duration::from_secs(60), || {
        (!runs(file).is_empty()).then_some(())
    });
    let mut b = node(db, "b", body);
    b.spawn(&[]);
    assert_eq!(runs(file).len(), 1, "node a runs the job, not b");
    (a, b, id)
}

/// Asserts that the first run (node a's) was stopped gracefully before it ended
/// by itself, and that no two runs overlap.
fn assert_runs_apart(file: &std::path::Path, a: &Qd) {
    let runs = runs(file);
    assert!(runs.len() >= 2, "the job ran again elsewhere: {runs:?}");
    let first = &runs[0];
    let first_stop = first
        .stop
        .unwrap_or_else(|| panic!("node a's run was never stopped gracefully: {runs:?}"));
    let first_ran = Duration::from_nanos((first_stop - first.start) as u64);
    assert!(
        first_ran < Duration::from_secs(RUN_SECS - 1),
        "node a's run was not cut short ({first_ran:?}): {runs:?}"
    );
    for pair in runs.windows(2) {
        let stop = pair[0]
            .stop
            .unwrap_or_else(|| panic!("a run without its stop: {runs:?}"));
        assert!(
            stop <= pair[1].start,
            "two runs overlapped by {:?}: {runs:?}\nnode a:\n{}",
            Duration::from_nanos((stop - pair[1].start) as u64),
            a.logs()
        );
    }
}

#[test]
fn a_node_cut_off_from_its_database_stops_its_run_before_another_node_starts_it() {
    let Some(db) = pg::database() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("runs");
    let body = long_job(work.path(), &file);
    let partition = Partition::open(&db);
    let mut db_a = db.clone();
    db_a.url = partition.url(&db);
    let (a, b, id) = start_run(&db_a, &db, &body, &file);

    partition.cut();
    let cut_at = Instant::now();

    // The cut-off node answers quickly, with the documented 503.
    let asked = Instant::now();
    let (status, answer) = a.post("/v1/queues/long/jobs", &json!({"payload": "y"}));
    let took = asked.elapsed();
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "store_error", "{answer}");
    assert!(
        took < Duration::from_secs(10),
        "the enqueue took {took:?}: {answer}"
    );

    // From node_timeout on, never both leaders: b is scraped first, so a leader
    // a seen after it was the leader at b's scrape too (a cut-off node does not
    // become the leader again).
    let mut both = Vec::new();
    let (mut sampled, mut b_led, mut a_led_last) = (0, false, true);
    while cut_at.elapsed() < Duration::from_secs(16) {
        let b_leads = leads(&b);
        let a_leads = leads(&a);
        if cut_at.elapsed() >= Duration::from_secs(5) {
            sampled += 1;
            b_led |= b_leads;
            a_led_last = a_leads;
            if a_leads && b_leads {
                both.push(cut_at.elapsed());
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    partition.heal();
    assert!(sampled > 10, "too few leader samples ({sampled})");
    assert!(
        both.is_empty(),
        "both nodes reported being the leader at {both:?} after the cut"
    );
    assert!(b_led, "node b never took over as the leader");
    assert!(
        !a_led_last,
        "the cut-off node a still reports being the leader"
    );

    let job = b.wait_final(&id, Duration::from_secs(120));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_runs_apart(&file, &a);
    let log = a.logs();
    assert!(log.contains("this node is fenced"), "{log}");
}

#[test]
fn a_frozen_node_has_its_run_stopped_by_the_watchdog_before_another_node_starts_it() {
    let Some(db) = pg::database() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("runs");
    let body = long_job(work.path(), &file);
    let (a, b, id) = start_run(&db, &db, &body, &file);
    signal(a.pid(), "STOP");
    let job = b.wait_final(&id, Duration::from_secs(120));
    signal(a.pid(), "CONT");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_runs_apart(&file, &a);
}
