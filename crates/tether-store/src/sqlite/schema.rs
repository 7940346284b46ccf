//! The file's layout: the tables and indexes the store keeps, and the
//! conversions that bring a file written by an earlier version to it.
//!
//! Everything here runs once, when the file is opened ([`apply`]), before
//! the writer starts; the notebook converts its own tables with
//! [`rebuild_with_rowid`] from a writer job. Keeping the layout and its
//! conversions together means a change of layout and the conversion of the
//! files it leaves behind are read (and reviewed) side by side.

use rusqlite::{Connection, OptionalExtension};

use crate::StoreResult;

/// The events table in rowid order: every commit appends its events to the
/// same few pages at the table's end, instead of one page (and its splits)
/// per session. The index that finds a stream's events (`events_by_name`)
/// is ordered by stream name first: request streams are named by time, so
/// a commit's index entries land on the same few pages too (ordered by
/// session first, every call dirtied a page of its own session: that was
/// half of all pages written). Files written before this layout are
/// converted on open.
///
/// What needs a session's streams (rehydration closes its open requests,
/// deleting the session drops its open streams) finds them in
/// `tracked_streams`: a row for every stream that stayed open across a
/// commit (standalone streams, slow requests), never for a quick request,
/// whose first and final events are committed together. Finished streams
/// are dropped by age ([`Store::drop_finished_streams`](crate::Store::drop_finished_streams)).
const EVENTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS events(
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    payload BLOB NOT NULL
)";

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS sessions(
    id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_principal ON sessions(principal, expires_at_ms);
CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions(expires_at_ms);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_name ON events(stream, session, seq);
CREATE TABLE IF NOT EXISTS tracked_streams(
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    finished_at_ms INTEGER,
    PRIMARY KEY(session, stream)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tracked_streams_by_finish ON tracked_streams(finished_at_ms)
    WHERE finished_at_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS cursors(
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY(session, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv(
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    expires_at_ms INTEGER,
    PRIMARY KEY(namespace, key)
) WITHOUT ROWID;
"#;

/// Converts `table`, if it is still a `WITHOUT ROWID` table, into the rowid
/// table `create` describes, keeping its rows (`columns` are copied), in
/// one transaction (the caller's, if one is open). Returns whether it did.
/// For layouts of earlier versions.
pub fn rebuild_with_rowid(conn: &Connection, table: &str, create: &str, columns: &str) -> StoreResult<bool> {
    let sql: Option<String> =
        conn.query_row("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1", [table], |r| r.get(0)).optional()?;
    if !sql.is_some_and(|sql| sql.to_ascii_uppercase().contains("WITHOUT ROWID")) {
        return Ok(false);
    }
    let old = format!("{table}_before_rowid");
    let steps = format!(
        "ALTER TABLE {table} RENAME TO {old};
         {create};
         INSERT INTO {table}({columns}) SELECT {columns} FROM {old};
         DROP TABLE {old};"
    );
    if conn.is_autocommit() {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {steps} COMMIT;")).inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    } else {
        // Inside the caller's transaction (a writer job): atomic with it.
        conn.execute_batch(&steps)?;
    }
    tracing::info!(table, "converted to the rowid layout");
    Ok(true)
}

/// From the layout before `tracked_streams`: its index, and its open streams.
const TRACK_EARLIER_STREAMS: &str = "
    DROP INDEX IF EXISTS events_by_stream;
    INSERT OR IGNORE INTO tracked_streams(session, stream, finished_at_ms)
        SELECT session, stream, NULL FROM events GROUP BY session, stream HAVING MAX(kind = 2) = 0;";

fn table_exists(conn: &Connection, table: &str) -> StoreResult<bool> {
    Ok(conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1", [table], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Creates what is missing and converts the layouts of earlier versions, on
/// the connection that becomes the writer's.
pub(super) fn apply(conn: &Connection) -> StoreResult<()> {
    rebuild_with_rowid(conn, "events", EVENTS_TABLE, "session, stream, seq, kind, payload")?;
    conn.execute(EVENTS_TABLE, [])?;
    let earlier_layout = table_exists(conn, "events")? && !table_exists(conn, "tracked_streams")?;
    conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} {} COMMIT;", if earlier_layout { TRACK_EARLIER_STREAMS } else { "" }))
        .inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    Ok(())
}
