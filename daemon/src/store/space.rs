//! The SQLite file's space: giving pruned pages back and keeping the WAL bounded.
//!
//! - `auto_vacuum = INCREMENTAL`: deleted rows leave free pages that new rows reuse;
//!   `PRAGMA incremental_vacuum(N)` returns up to N of them to the file system. A
//!   database can only change its auto-vacuum mode through a `VACUUM`, which cannot
//!   run inside a transaction (so not inside a migration step): [`adopt`] runs it
//!   once at open for a file that is not incremental yet (an empty new file costs
//!   nothing; an existing one is rewritten once). The mode lives in the file header,
//!   so the check itself is the version: a crash before the `VACUUM` ends just
//!   repeats it at the next open.
//! - The WAL: SQLite checkpoints it after any commit that leaves it over
//!   `wal_autocheckpoint` pages (1000, ~4 MiB); qd's only connection is the writer,
//!   so every checkpoint completes and the next transaction rewinds the WAL. With
//!   `journal_size_limit` a rewound WAL file is also truncated back to 64 MiB, so one
//!   large batch does not leave a large file behind.

use std::path::Path;

use rusqlite::Connection;

/// The WAL file is truncated back to this many bytes after a checkpoint rewinds it.
pub const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

/// Makes a new, empty database incremental before its first table exists (SQLite
/// then needs no rewrite); a file with tables is left to [`adopt`].
pub fn start_incremental(conn: &Connection) -> rusqlite::Result<()> {
    let tables: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_schema", [], |r| r.get(0))?;
    if tables == 0 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    Ok(())
}

/// Sets the WAL limits and converts the file to incremental auto-vacuum if needed.
/// A failed conversion (e.g. no room for the rewrite) is logged and leaves the file
/// as it was: qd runs, it only gives no space back until a later open converts it.
pub fn adopt(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    conn.pragma_update(None, "wal_autocheckpoint", 1000)?;
    let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    let tables: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_schema", [], |r| r.get(0))?;
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    if tables > 0 {
        tracing::info!(path = %path.display(), "Converting the store to incremental auto-vacuum; the file is rewritten once.");
    }
    if let Err(err) = conn.execute_batch("VACUUM") {
        tracing::warn!(path = %path.display(), %err, "Store conversion to incremental auto-vacuum failed; pruned space is reused but not given back.");
    }
    Ok(())
}

/// `PRAGMA auto_vacuum` of an incremental database.
const INCREMENTAL: i64 = 2;

/// Releases free pages beyond `keep_free`, at most `max_pages`; see
/// `Backend::release_space`.
pub fn release(conn: &Connection, keep_free: u32, max_pages: u32) -> rusqlite::Result<u32> {
    let free: u32 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    let n = free.saturating_sub(keep_free).min(max_pages);
    if n == 0 {
        return Ok(0);
    }
    // Each step of the statement releases one page: run it to the end.
    // PRAGMA arguments cannot be bound; `n` is a number.
    let mut stmt = conn.prepare(&format!("PRAGMA incremental_vacuum({n})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    let left: u32 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    Ok(free.saturating_sub(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(conn: &Connection) -> i64 {
        conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .expect("auto_vacuum")
    }

    #[test]
    fn a_new_file_is_incremental_before_wal_mode_and_its_tables_so_adopt_rewrites_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new.db");
        let conn = Connection::open(&path).expect("open");
        start_incremental(&conn).expect("start");
        // What the backend does next: WAL mode, then the migrations' tables.
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB);")
            .expect("tables");
        assert_eq!(mode(&conn), INCREMENTAL, "no VACUUM needed to get here");

        let old = dir.path().join("old.db");
        let conn = Connection::open(&old).expect("open old");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB);")
            .expect("tables");
        start_incremental(&conn).expect("start on a file with tables");
        assert_eq!(mode(&conn), 0, "a file with tables is left to adopt");
    }

    #[test]
    fn an_existing_file_is_converted_and_gives_pruned_pages_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO t SELECT randomblob(8000) FROM n;",
        )
        .expect("fill");
        adopt(&conn, &path).expect("adopt");
        let mode: i64 = conn
            .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, INCREMENTAL);
        conn.execute_batch("DELETE FROM t").expect("delete");
        let pages = |c: &Connection| -> u32 {
            c.pragma_query_value(None, "page_count", |r| r.get(0))
                .expect("page_count")
        };
        let before = pages(&conn);
        assert_eq!(release(&conn, 10, 100).expect("release"), 100);
        assert_eq!(pages(&conn), before - 100, "the file shrank by 100 pages");
        let rest = release(&conn, 10, u32::MAX).expect("release the rest");
        assert!(rest > 0);
        assert_eq!(release(&conn, 10, u32::MAX).expect("nothing left"), 0);
        let free: u32 = conn
            .pragma_query_value(None, "freelist_count", |r| r.get(0))
            .expect("free");
        assert_eq!(free, 10, "keep_free pages stay for reuse");
    }
}
