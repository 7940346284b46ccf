//! The notebook's tables in the store's SQLite file, and the conversions of
//! earlier layouts, run once on open ([`create_or_convert`]).
//!
//! Invariant: after [`create_or_convert`] every table and index the
//! repository reads or writes exists, in this layout, and every thought an
//! earlier layout held is in `nb_thoughts` (indexed by the settle that
//! follows on open, see [`settle`](super::settle)); running it again
//! changes nothing.

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS nb_sessions(
    id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    title TEXT NOT NULL,
    tags TEXT NOT NULL,
    root_uri TEXT,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    thought_count INTEGER NOT NULL,
    branch_count INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS nb_sessions_by_root ON nb_sessions(principal, root_uri, updated_at_ms DESC);
CREATE INDEX IF NOT EXISTS nb_sessions_by_principal ON nb_sessions(principal, updated_at_ms DESC);
CREATE TABLE IF NOT EXISTS nb_branches(
    session_id TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    from_thought INTEGER NOT NULL,
    PRIMARY KEY(session_id, branch_id)
) WITHOUT ROWID;
"#;

/// Where a session's thoughts are: `(session_id, idx)` -> the thought's
/// rowid, filled by [`settle`](super::settle) for many thoughts at once.
const INDEX_TABLE: &str = "CREATE TABLE IF NOT EXISTS nb_thought_index(
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    thought INTEGER NOT NULL,
    PRIMARY KEY(session_id, idx)
) WITHOUT ROWID";

/// Earlier layouts kept a unique index on `nb_thoughts`; their thoughts are
/// indexed by the first settle (`through` starts at 0).
const DROP_EARLIER_INDEX: &str = "DROP INDEX IF EXISTS nb_thoughts_by_session;";

/// One earlier layout staged thoughts in a table of their own before moving them.
const MOVE_EARLIER_STAGED: &str = "INSERT INTO nb_thoughts(session_id, idx, body, recorded_at_ms)
        SELECT session_id, idx, body, recorded_at_ms FROM nb_thoughts_staged ORDER BY id;
    DROP TABLE nb_thoughts_staged;";

/// One row: every thought with a rowid up to `through` is in the index.
const SETTLED_TABLE: &str = "CREATE TABLE IF NOT EXISTS nb_settled(through INTEGER NOT NULL);
    INSERT INTO nb_settled(through) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM nb_settled);";

/// Thoughts in rowid order: a commit appends every session's new thoughts to
/// the same few pages (see the store's events table). No index on it: reads
/// find a session's thoughts through `nb_thought_index`. Files written before
/// this layout are converted on open.
const THOUGHTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS nb_thoughts(
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    body TEXT NOT NULL,
    recorded_at_ms INTEGER NOT NULL
)";

/// Creates the tables, converting an earlier layout's on the way.
pub(super) fn create_or_convert(conn: &rusqlite::Connection) -> tether_store::StoreResult<()> {
    tether_store::sqlite::rebuild_with_rowid(conn, "nb_thoughts", THOUGHTS_TABLE, "session_id, idx, body, recorded_at_ms")?;
    conn.execute(THOUGHTS_TABLE, [])?;
    conn.execute_batch(SCHEMA)?;
    conn.execute(INDEX_TABLE, [])?;
    conn.execute_batch(SETTLED_TABLE)?;
    conn.execute_batch(DROP_EARLIER_INDEX)?;
    let staged: bool =
        conn.query_row("SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = 'nb_thoughts_staged')", [], |r| r.get(0))?;
    if staged {
        conn.execute_batch(MOVE_EARLIER_STAGED)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tether_store::StoreConfig;
    use tether_store::sqlite::SqliteStore;

    use super::super::tests::{count, open, step};
    use super::super::{COLUMNS, SqliteNotebook};
    use super::*;
    use crate::repo::NotebookRepo;

    /// Thoughts of an earlier layout (`WITHOUT ROWID`) are converted on open, none lost.
    #[tokio::test]
    async fn thoughts_of_an_earlier_layout_survive_the_conversion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            let earlier = format!(
                "CREATE TABLE nb_thoughts(session_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,
                 recorded_at_ms INTEGER NOT NULL, PRIMARY KEY(session_id, idx)) WITHOUT ROWID;
                 {SCHEMA}"
            );
            conn.execute_batch(&earlier).unwrap();
            conn.execute(&format!("INSERT INTO nb_sessions({COLUMNS}) VALUES ('n1', 'p', 't', '[]', NULL, 1, 1, 2, 0)"), [])
                .unwrap();
            for idx in 1..=2 {
                let body =
                    format!(r#"{{"thought":"step {idx}","thoughtNumber":{idx},"totalThoughts":3,"nextThoughtNeeded":true}}"#);
                conn.execute(
                    "INSERT INTO nb_thoughts(session_id, idx, body, recorded_at_ms) VALUES ('n1', ?1, ?2, 5)",
                    rusqlite::params![idx, body],
                )
                .unwrap();
            }
        }
        let store = SqliteStore::open(&path, StoreConfig::default()).await.unwrap();
        let repo = SqliteNotebook::new(store.db().clone()).await.unwrap();
        let thoughts: Vec<String> = repo.thoughts("p", "n1").await.unwrap().into_iter().map(|t| t.input.thought).collect();
        assert_eq!(thoughts, ["step 1", "step 2"]);
        let input = crate::thought::ThoughtInput::parse(
            serde_json::json!({"thought": "step 3", "thoughtNumber": 3, "totalThoughts": 3, "nextThoughtNeeded": false})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(repo.append_thought("p", "n1", &input).await.unwrap().thought_history_length, 3, "numbering continues");
    }

    /// A file of the layout that staged whole thoughts in a table of their
    /// own (and kept a unique index on nb_thoughts) opens with every thought.
    #[tokio::test]
    async fn thoughts_of_the_staging_layout_survive_the_conversion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("staged.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(&format!(
                "{THOUGHTS_TABLE}; {SCHEMA}
                 CREATE UNIQUE INDEX nb_thoughts_by_session ON nb_thoughts(session_id, idx);
                 CREATE TABLE nb_thoughts_staged(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, idx INTEGER NOT NULL,
                     body TEXT NOT NULL, recorded_at_ms INTEGER NOT NULL);"
            ))
            .unwrap();
            conn.execute(&format!("INSERT INTO nb_sessions({COLUMNS}) VALUES ('n1', 'p', 't', '[]', NULL, 1, 1, 1, 0)"), [])
                .unwrap();
            for (table, idx) in [("nb_thoughts", 1), ("nb_thoughts_staged", 2)] {
                let body =
                    format!(r#"{{"thought":"step {idx}","thoughtNumber":{idx},"totalThoughts":3,"nextThoughtNeeded":true}}"#);
                conn.execute(
                    &format!("INSERT INTO {table}(session_id, idx, body, recorded_at_ms) VALUES ('n1', ?1, ?2, 5)"),
                    rusqlite::params![idx, body],
                )
                .unwrap();
            }
        }
        let (store, repo) = open(&path).await;
        let thoughts: Vec<String> = repo.thoughts("p", "n1").await.unwrap().into_iter().map(|t| t.input.thought).collect();
        assert_eq!(thoughts, ["step 1", "step 2"]);
        assert_eq!(repo.get_session("p", "n1").await.unwrap().unwrap().thought_count, 2);
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM sqlite_schema WHERE name IN ('nb_thoughts_staged', 'nb_thoughts_by_session')")
                .await,
            0
        );
        assert_eq!(repo.append_thought("p", "n1", &step(3)).await.unwrap().thought_history_length, 3, "numbering continues");
    }
}
