//! Crashes: 2,000 jobs, each attempt SIGKILLs itself with probability 5% (2.5% before
//! its side effect, 2.5% after it, drawn from /dev/urandom). The effect is a row in a
//! SQLite file written by the `sqlite3` CLI. Three runs:
//! - ack first: an external worker (this runner) acks each job, then runs it; qd has
//!   no such mode, and this run shows why: every crash before the effect loses a job
//!   that qd already reported succeeded;
//! - ack last (qd's workers): a plain `INSERT` per execution; crashes after the effect
//!   re-run it, so duplicates appear;
//! - ack last + idempotent effect: `INSERT .. ON CONFLICT(key) DO UPDATE SET
//!   absorbed = absorbed + 1` keyed by `QD_IDEMPOTENCY_KEY`: one row per key, and the
//!   absorbed re-runs are counted.
//!
//! On a cluster ([`Setup::Cluster`]) the jobs are enqueued through both nodes, the
//! 4 workers are split 2 and 2 (external workers of the ack-first run lease and ack
//! on their own node), and node 1 is SIGKILLed once a third of the jobs succeeded:
//! the job processes it started run on (their effects land), and its leases end by
//! node 0's sweep, so those jobs run again on node 0.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::Row;
use crate::daemon::Api;
use crate::fleet::{Fleet, Killed, Setup};
use crate::scratch::Scratch;

const JOBS: usize = 2_000;

const SCRIPT: &str = r#"cat >/dev/null
r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
r=$((r % 1000))
[ "$r" -lt 25 ] && kill -9 $$
if [ "$1" = dedup ]; then
  sql="INSERT INTO effects(key) VALUES('$QD_IDEMPOTENCY_KEY') ON CONFLICT(key) DO UPDATE SET absorbed = absorbed + 1;"
else
  sql="INSERT INTO log(key) VALUES('$QD_IDEMPOTENCY_KEY');"
fi
sqlite3 -cmd ".timeout 30000" "$DB" "$sql" || exit 75
[ "$r" -lt 50 ] && kill -9 $$
exit 0"#;

/// (lost, duplicate effects, absorbed re-runs) for one run's database.
fn count(db: &Path, dedup: bool) -> Result<(usize, usize, usize)> {
    let conn = rusqlite::Connection::open(db)?;
    let q = |sql: &str| -> Result<usize> {
        let n: i64 = conn.query_row(sql, [], |r| r.get(0))?;
        Ok(usize::try_from(n).unwrap_or(0))
    };
    if dedup {
        let keys = q("SELECT COUNT(*) FROM effects")?;
        Ok((
            JOBS - keys,
            0,
            q("SELECT COALESCE(SUM(absorbed), 0) FROM effects")?,
        ))
    } else {
        let rows = q("SELECT COUNT(*) FROM log")?;
        let keys = q("SELECT COUNT(DISTINCT key) FROM log")?;
        Ok((JOBS - keys, rows - keys, 0))
    }
}

fn create_db(dir: &Path) -> Result<std::path::PathBuf> {
    let db = dir.join("effects.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE log(key TEXT NOT NULL);
         CREATE TABLE effects(key TEXT PRIMARY KEY, absorbed INTEGER NOT NULL DEFAULT 0);",
    )?;
    Ok(db)
}

fn bodies() -> Vec<serde_json::Value> {
    (0..JOBS)
        .map(|i| json!({ "payload": "effect", "idempotency_key": format!("k-{i}") }))
        .collect()
}

/// What one ack-last run measured.
struct AckLast {
    lost: usize,
    dups: usize,
    absorbed: usize,
    dead: usize,
    secs: f64,
    killed: Option<Killed>,
}

/// Ack last: qd's own workers run the script.
async fn ack_last(setup: &Setup, dedup: bool) -> Result<AckLast> {
    let dir = Scratch::new("crashes")?;
    let db = create_db(&dir.0)?;
    let prog = dir.script("effect.sh", SCRIPT)?;
    let mode = if dedup { "dedup" } else { "plain" };
    let fleet = Fleet::start(setup, &dir.0, |node| {
        let w = setup.share(4, node);
        format!(
            "[queues.crash]\nexecutor = {{ kind = \"command\", program = \"{}\", args = [\"{mode}\"], env = {{ DB = \"{}\" }} }}\n\
             workers = {{ min = {w}, max = {w} }}\nmax_attempts = 20\nbackoff = {{ base = \"50ms\", max = \"500ms\" }}\n",
            prog.display(),
            db.display()
        )
    })
    .await?;
    let start = Instant::now();
    let ids = fleet.enqueue_all("crash", bodies()).await?;
    let kill = fleet.kill_later(JOBS / 3)?;
    let jobs = fleet
        .api()
        .wait_final(&ids, Duration::from_secs(600))
        .await?;
    let secs = start.elapsed().as_secs_f64();
    let killed = kill.finish().await?;
    let dead = jobs.iter().filter(|j| j["state"] != "succeeded").count() + ids.len() - jobs.len();
    let (lost, dups, absorbed) = count(&db, dedup)?;
    Ok(AckLast {
        lost,
        dups,
        absorbed,
        dead,
        secs,
        killed,
    })
}

/// One external worker that acks before running the job, until `stop`.
async fn ack_first_worker(
    api: Api,
    prog: Arc<Path>,
    db: Arc<Path>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    while !stop.load(Ordering::SeqCst) {
        for job in api.lease("crash", "ack-first", 8, 0.5).await? {
            let id = job["id"].as_str().context("id")?;
            let (status, answer) = api
                .post(
                    &format!("/v1/jobs/{id}/ack"),
                    &json!({ "token": job["token"] }),
                )
                .await?;
            anyhow::ensure!(status == 200, "ack answered {status}: {answer}");
            let key = job["idempotency_key"].as_str().context("key")?;
            // The job "runs" after its ack; its exit status no longer matters to anyone.
            let _ = tokio::process::Command::new(&*prog)
                .arg("plain")
                .env("DB", &*db)
                .env("QD_IDEMPOTENCY_KEY", key)
                .stdin(std::process::Stdio::null())
                .status()
                .await;
        }
    }
    Ok(())
}

/// Ack first, emulated by external workers (2 per node on a cluster, 4 on one
/// node); returns (lost, dups, s, the kill).
async fn ack_first(setup: &Setup) -> Result<(usize, usize, f64, Option<Killed>)> {
    let dir = Scratch::new("ack-first")?;
    let db: Arc<Path> = create_db(&dir.0)?.into();
    let prog: Arc<Path> = dir.script("effect.sh", SCRIPT)?.into();
    let fleet = Fleet::start(setup, &dir.0, |_| {
        "[queues.crash]\nexecutor = { kind = \"external\" }\n".to_owned()
    })
    .await?;
    let start = Instant::now();
    let ids = fleet.enqueue_all("crash", bodies()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for (node, api) in fleet.apis().into_iter().enumerate() {
        for _ in 0..setup.share(4, node) {
            let worker = ack_first_worker(api.clone(), prog.clone(), db.clone(), stop.clone());
            let victim = fleet.is_victim(node);
            // A worker of the killed node fails on its next request; that is the
            // crash, not the runner's error.
            set.spawn(async move {
                worker
                    .await
                    .or_else(|e| if victim { Ok(()) } else { Err(e) })
            });
        }
    }
    let kill = fleet.kill_later(JOBS / 3)?;
    let done = fleet
        .api()
        .wait_final(&ids, Duration::from_secs(600))
        .await?;
    stop.store(true, Ordering::SeqCst);
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    let killed = kill.finish().await?;
    anyhow::ensure!(
        done.len() == JOBS,
        "{} jobs not acked within 600 s",
        JOBS - done.len()
    );
    let (lost, dups, _) = count(&db, false)?;
    Ok((lost, dups, start.elapsed().as_secs_f64(), killed))
}

/// Runs the three crash experiments and returns their rows.
pub async fn run(setup: &Setup) -> Result<Vec<Row>> {
    let (lost, dups, secs, killed) = ack_first(setup).await?;
    let mut rows = vec![Row::new(
        "Ack first, 5% crashes (external worker acking before work; not a qd mode)",
        "99 lost, 0 duplicate effects",
        format!(
            "{lost} lost, {dups} duplicate effects ({secs:.0} s){}",
            Killed::describe(killed.as_ref())
        ),
    )];
    let r = ack_last(setup, false).await?;
    rows.push(Row::new(
        "Ack last (qd), 5% crashes",
        "0 lost, 65 duplicate effects",
        format!(
            "{} lost, {} duplicate effects, {} dead ({:.0} s){}",
            r.lost,
            r.dups,
            r.dead,
            r.secs,
            Killed::describe(r.killed.as_ref())
        ),
    ));
    let r = ack_last(setup, true).await?;
    rows.push(Row::new(
        "Ack last (qd) + effect keyed by QD_IDEMPOTENCY_KEY",
        "0 lost, 0 duplicates",
        format!(
            "{} lost, {} duplicates ({} re-runs absorbed), {} dead ({:.0} s){}",
            r.lost,
            r.dups,
            r.absorbed,
            r.dead,
            r.secs,
            Killed::describe(r.killed.as_ref())
        ),
    ));
    Ok(rows)
}
