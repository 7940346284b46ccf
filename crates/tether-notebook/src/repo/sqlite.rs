//! Notebook repository in the same SQLite file as the store, written through
//! the store's group-committing writer. "Most recent session for this root
//! and principal" is one short range of `nb_sessions_by_root`.
//!
//! A notebook session's row is not rewritten by every thought: its
//! `updated_at_ms` (which both session indexes order by) moves at most once
//! per [`ROW_RECENCY_MS`], and its counters with it. Rewriting the row and
//! moving two index entries was a third of a thought's writes. Reads take
//! the exact values from the thoughts themselves ([`READ_COLUMNS`]), and
//! orderings by recency look at every session whose row is within
//! [`ROW_RECENCY_MS`] of the cut, then order by the exact time.
//!
//! Thoughts are appended to `nb_thoughts` in rowid order with no index of
//! their own: an index ordered by session takes each thought to its own
//! page (one 4 KiB WAL frame per thought, half the writer's work). Where a
//! session's thoughts are is kept in `nb_thought_index`, filled for many
//! thoughts at once, sorted by session ([`settle`]): every [`SETTLE_EVERY`]
//! thoughts, before any read of thoughts, and on open. Reads therefore see
//! every thought that was answered, through the index.
//!
//! The tables and the conversions of earlier layouts are in [`schema`].

mod schema;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use tether_store::sqlite::SqliteDb;

use super::{NotebookRepo, NotebookSession, RepoError, SearchHit, SessionFilter, StoredThought};
use crate::thought::{Recorded, ThoughtInput};

/// Thoughts appended between two settles on the hot path: the settle writes
/// each active session's index page once for this many thoughts. A settle
/// of 4,096 thoughts holds the writer a few milliseconds (fifth round in
/// docs/benchmarks.md).
const SETTLE_EVERY: u64 = 4_096;

/// Indexes the thoughts appended since the last settle, sorted so each index
/// page is written once. Numbers are exact by construction (one writer,
/// exact counts); a thought whose number is taken anyway stays out of the
/// index with an error in the log rather than blocking every later settle.
fn settle(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let through: i64 = conn.prepare_cached("SELECT through FROM nb_settled")?.query_row([], |r| r.get(0))?;
    let (pending, last): (i64, Option<i64>) = conn
        .prepare_cached("SELECT COUNT(*), MAX(id) FROM nb_thoughts WHERE id > ?1")?
        .query_row([through], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let Some(last) = last else { return Ok(()) };
    let indexed = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO nb_thought_index(session_id, idx, thought)
             SELECT session_id, idx, id FROM nb_thoughts WHERE id > ?1 ORDER BY session_id, idx",
        )?
        .execute([through])?;
    conn.prepare_cached("UPDATE nb_settled SET through = ?1")?.execute([last])?;
    if (indexed as i64) < pending {
        tracing::error!(
            left_out = pending - indexed as i64,
            "thoughts whose numbers were already taken were left out of the index"
        );
    }
    Ok(())
}

/// Which appended thoughts a read may rely on being indexed.
#[derive(Default)]
struct Indexing {
    /// Thoughts appended inside requests, counted after each is queued.
    appended: AtomicU64,
    /// `appended` as it was when a settle that has committed since was queued.
    settled_through: AtomicU64,
}

pub struct SqliteNotebook {
    db: SqliteDb,
    /// Thought and branch counts of recently written notebook sessions, so a
    /// thought can be answered before it is committed (see `append_thought`).
    /// Exact: one process writes a file (it is locked), all through here.
    counts: tokio::sync::Mutex<HashMap<(String, String), Counts>>,
    indexing: Indexing,
}

/// Notebook sessions whose counts are kept; beyond, the map starts over.
const COUNTED_SESSIONS: usize = 4_096;

#[derive(Default)]
struct Counts {
    /// `thoughts` and `branches` are what the table holds plus the thoughts
    /// queued since; false until a thought counted by the table told them.
    known: bool,
    thoughts: u64,
    /// Sorted, as the table reads them.
    branches: Vec<String>,
    /// Thoughts being counted by the table right now: until they are
    /// committed, nothing is answered from these counts (it would take a
    /// number one of them is about to take).
    counting: u32,
    /// Set (on the writer) when a queued thought of the session failed: the
    /// counts are then wrong and are read again.
    stale: Arc<AtomicBool>,
    /// The `updated_at_ms` last written to the session's row (or earlier).
    row_updated_ms: i64,
}

/// A thought rewrites its notebook session's row only if the row's
/// `updated_at_ms` is at least this old, so the row trails the session's
/// last thought by less than this.
const ROW_RECENCY_MS: i64 = 1_000;

/// The columns of [`row_to_session`] for a row aliased `s`, with the exact
/// last update and counts (the row's may trail them, see the module doc):
/// two lookups on `nb_thought_index` and a count of its branches.
const READ_COLUMNS: &str = "s.id, s.principal, s.title, s.tags, s.root_uri, s.created_at_ms,
    MAX(s.updated_at_ms, COALESCE((SELECT t.recorded_at_ms FROM nb_thought_index i JOIN nb_thoughts t ON t.id = i.thought
                                   WHERE i.session_id = s.id ORDER BY i.idx DESC LIMIT 1), 0)),
    MAX(s.thought_count, COALESCE((SELECT MAX(i.idx) FROM nb_thought_index i WHERE i.session_id = s.id), 0)),
    MAX(s.branch_count, (SELECT COUNT(*) FROM nb_branches b WHERE b.session_id = s.id))";

impl Counts {
    fn usable(&mut self) -> bool {
        if self.stale.swap(false, Ordering::AcqRel) {
            self.known = false;
        }
        self.known && self.counting == 0
    }

    /// The counts after `thought`, which gets number `thoughts + 1`.
    fn record(&mut self, thought: &ThoughtInput) -> Recorded {
        self.thoughts += 1;
        if let Some((branch, _)) = thought.branch()
            && let Err(at) = self.branches.binary_search_by(|b| b.as_str().cmp(branch))
        {
            self.branches.insert(at, branch.to_owned());
        }
        Recorded { thought_history_length: self.thoughts, branches: self.branches.clone() }
    }
}

/// Appends thought number `idx` of a session whose counts are known, and
/// with `touch_row` writes its session's row; the row's counters only ever
/// grow (a later thought may commit in the same batch).
#[allow(clippy::too_many_arguments)]
fn append_thought(
    conn: &rusqlite::Connection,
    session_id: &str,
    idx: u64,
    body: &str,
    thought: &ThoughtInput,
    branch_count: usize,
    now: i64,
    touch_row: bool,
) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT INTO nb_thoughts(session_id, idx, body, recorded_at_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![session_id, idx as i64, body, now])?;
    if let Some((branch, from)) = thought.branch() {
        conn.prepare_cached("INSERT OR IGNORE INTO nb_branches(session_id, branch_id, from_thought) VALUES (?1, ?2, ?3)")?
            .execute(params![session_id, branch, from as i64])?;
    }
    if !touch_row {
        return Ok(());
    }
    conn.prepare_cached(
        "UPDATE nb_sessions SET thought_count = MAX(thought_count, ?1), branch_count = MAX(branch_count, ?2),
         updated_at_ms = MAX(updated_at_ms, ?3) WHERE id = ?4",
    )?
    .execute(params![idx as i64, branch_count as i64, now, session_id])?;
    Ok(())
}

impl SqliteNotebook {
    pub async fn new(db: SqliteDb) -> Result<Self, RepoError> {
        db.write(|ctx| {
            schema::create_or_convert(&ctx.conn)?;
            // Thoughts appended before a crash or stop, or by an earlier layout.
            Ok(settle(&ctx.conn)?)
        })
        .await?;
        Ok(Self { db, counts: tokio::sync::Mutex::new(HashMap::new()), indexing: Indexing::default() })
    }

    /// Waits until every thought queued so far (in particular every thought
    /// already answered) is in `nb_thought_index`, where reads look.
    async fn settled(&self) -> Result<(), RepoError> {
        let appended = self.indexing.appended.load(Ordering::Acquire);
        if self.indexing.settled_through.load(Ordering::Acquire) >= appended {
            return Ok(());
        }
        self.db.write(|ctx| Ok(settle(&ctx.conn)?)).await?;
        self.indexing.settled_through.fetch_max(appended, Ordering::AcqRel);
        Ok(())
    }

    /// Appends a thought counted by the table, and waits for its commit.
    async fn append_counted(
        &self,
        principal: &str,
        session_id: &str,
        thought: &ThoughtInput,
        body: String,
    ) -> Result<Recorded, RepoError> {
        let (principal, session_id) = (principal.to_owned(), session_id.to_owned());
        let missing = session_id.clone();
        let thought = thought.clone();
        let recorded = self
            .db
            .write(move |ctx| {
                let conn = &ctx.conn;
                settle(conn)?;
                let counts: Option<(i64, i64)> = conn
                    .prepare_cached(&format!("SELECT {READ_COLUMNS} FROM nb_sessions s WHERE s.id = ?1 AND s.principal = ?2"))?
                    .query_row(params![session_id, principal], |r| Ok((r.get(7)?, r.get(8)?)))
                    .optional()?;
                let Some((count, branch_count)) = counts else { return Ok(None) };
                let now = tether_store::now_ms();
                conn.prepare_cached("INSERT INTO nb_thoughts(session_id, idx, body, recorded_at_ms) VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![session_id, count + 1, body, now])?;
                // Indexed at once (everything before it was settled above); a
                // number taken behind the repository's back fails the thought.
                let id = conn.last_insert_rowid();
                conn.prepare_cached("INSERT INTO nb_thought_index(session_id, idx, thought) VALUES (?1, ?2, ?3)")?
                    .execute(params![session_id, count + 1, id])?;
                conn.prepare_cached("UPDATE nb_settled SET through = ?1")?.execute([id])?;
                let branch = thought.branch();
                if let Some((branch, from)) = &branch {
                    conn.prepare_cached(
                        "INSERT OR IGNORE INTO nb_branches(session_id, branch_id, from_thought) VALUES (?1, ?2, ?3)",
                    )?
                    .execute(params![session_id, branch, *from as i64])?;
                }
                // Most notebooks never branch: no branch table read for them.
                let branches: Vec<String> = if branch.is_none() && branch_count == 0 {
                    Vec::new()
                } else {
                    conn.prepare_cached("SELECT branch_id FROM nb_branches WHERE session_id = ?1 ORDER BY branch_id")?
                        .query_map(params![session_id], |r| r.get(0))?
                        .collect::<Result<_, _>>()?
                };
                conn.prepare_cached(
                    "UPDATE nb_sessions SET thought_count = ?1, branch_count = ?2, updated_at_ms = ?3 WHERE id = ?4",
                )?
                .execute(params![count + 1, branches.len() as i64, now, session_id])?;
                Ok(Some(Recorded { thought_history_length: (count + 1) as u64, branches }))
            })
            .await?;
        recorded.ok_or(RepoError::NotFound(missing))
    }
}

const COLUMNS: &str = "id, principal, title, tags, root_uri, created_at_ms, updated_at_ms, thought_count, branch_count";

fn row_to_session(r: &rusqlite::Row<'_>) -> rusqlite::Result<NotebookSession> {
    let tags: String = r.get(3)?;
    Ok(NotebookSession {
        id: r.get(0)?,
        principal: r.get(1)?,
        title: r.get(2)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        mcp_root_uri: r.get(4)?,
        created_at_ms: r.get(5)?,
        updated_at_ms: r.get(6)?,
        thought_count: r.get::<_, i64>(7)? as u64,
        branch_count: r.get::<_, i64>(8)? as u64,
    })
}

fn storage(e: impl std::fmt::Display) -> tether_store::StoreError {
    tether_store::StoreError::Backend(e.to_string())
}

#[async_trait]
impl NotebookRepo for SqliteNotebook {
    async fn create_session(&self, s: &NotebookSession) -> Result<(), RepoError> {
        let s = s.clone();
        let tags = serde_json::to_string(&s.tags).map_err(|e| RepoError::Storage(e.to_string()))?;
        self.db
            .write(move |ctx| {
                ctx.conn.execute(
                    &format!("INSERT INTO nb_sessions({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
                    params![
                        s.id,
                        s.principal,
                        s.title,
                        tags,
                        s.mcp_root_uri,
                        s.created_at_ms,
                        s.updated_at_ms,
                        s.thought_count as i64,
                        s.branch_count as i64
                    ],
                )?;
                Ok(())
            })
            .await?;
        Ok(())
    }

    async fn get_session(&self, principal: &str, id: &str) -> Result<Option<NotebookSession>, RepoError> {
        self.settled().await?;
        let (principal, id) = (principal.to_owned(), id.to_owned());
        Ok(self
            .db
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(&format!("SELECT {READ_COLUMNS} FROM nb_sessions s WHERE s.id = ?1 AND s.principal = ?2"))?
                    .query_row(params![id, principal], row_to_session)
                    .optional()?)
            })
            .await?)
    }

    /// Inside a request (a [`tether_store::fence`] scope) and with the
    /// session's counts known, the thought is queued for the next group
    /// commit and answered at once: the response's events follow it through
    /// the same writer and are stored only if it was (one commit wait per
    /// call instead of two). Otherwise (first thought of a session since
    /// start, outside a request) it is written and awaited, counted by the
    /// table.
    async fn append_thought(&self, principal: &str, session_id: &str, thought: &ThoughtInput) -> Result<Recorded, RepoError> {
        let body = serde_json::to_string(thought).map_err(|e| RepoError::Storage(e.to_string()))?;
        let key = (principal.to_owned(), session_id.to_owned());
        let mut counts = self.counts.lock().await;
        if tether_store::fence::in_scope()
            && let Some(known) = counts.get_mut(&key).and_then(|c| c.usable().then_some(c))
        {
            let recorded = known.record(thought);
            let stale = known.stale.clone();
            let (session_id, thought) = (session_id.to_owned(), thought.clone());
            let (idx, branch_count, now) = (recorded.thought_history_length, recorded.branches.len(), tether_store::now_ms());
            let touch_row = now - known.row_updated_ms >= ROW_RECENCY_MS;
            if touch_row {
                known.row_updated_ms = now;
            }
            // Queued under the lock: thoughts of a session reach the writer in
            // number order, and `indexing.appended` counts in queue order.
            let queued_before = self.indexing.appended.load(Ordering::Acquire);
            let settle_after = (queued_before + 1).is_multiple_of(SETTLE_EVERY);
            let queued = self
                .db
                .write_deferred(
                    move |ctx| {
                        append_thought(&ctx.conn, &session_id, idx, &body, &thought, branch_count, now, touch_row)?;
                        if settle_after {
                            settle(&ctx.conn)?;
                        }
                        Ok(())
                    },
                    move || stale.store(true, Ordering::Release),
                )
                .await;
            // Counted once queued: a read that sees this count settles after it.
            self.indexing.appended.store(queued_before + 1, Ordering::Release);
            return match queued {
                Some(Ok(())) => Ok(recorded),
                other => {
                    known.known = false;
                    Err(match other {
                        Some(Err(e)) => e.into(),
                        _ => RepoError::Storage("the thought could not be queued outside a request".into()),
                    })
                }
            };
        }
        if counts.len() >= COUNTED_SESSIONS {
            counts.retain(|_, c| c.counting > 0);
        }
        counts.entry(key.clone()).or_default().counting += 1;
        drop(counts);
        let before = tether_store::now_ms();

        let counted = self.append_counted(principal, session_id, thought, body).await;
        let mut counts = self.counts.lock().await;
        if let Some(known) = counts.get_mut(&key) {
            known.counting = known.counting.saturating_sub(1);
            // Calls counted together finish in any order: keep the furthest.
            if let Ok(recorded) = &counted
                && (!known.known || recorded.thought_history_length >= known.thoughts)
            {
                known.known = true;
                known.thoughts = recorded.thought_history_length;
                known.branches = recorded.branches.clone();
                known.row_updated_ms = before;
            }
        }
        counted
    }

    async fn thoughts(&self, principal: &str, session_id: &str) -> Result<Vec<StoredThought>, RepoError> {
        self.settled().await?;
        let (principal, session_id) = (principal.to_owned(), session_id.to_owned());
        Ok(self
            .db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT t.body, t.recorded_at_ms FROM nb_sessions s JOIN nb_thought_index i ON i.session_id = s.id
                     JOIN nb_thoughts t ON t.id = i.thought
                     WHERE s.id = ?1 AND s.principal = ?2 ORDER BY i.idx",
                )?;
                let rows =
                    stmt.query_map(params![session_id, principal], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                rows.map(|row| {
                    let (body, recorded_at_ms) = row?;
                    let input: ThoughtInput = serde_json::from_str(&body).map_err(storage)?;
                    Ok(StoredThought { input, recorded_at_ms })
                })
                .collect()
            })
            .await?)
    }

    async fn latest_for_root(&self, principal: &str, root: &str) -> Result<Option<NotebookSession>, RepoError> {
        self.settled().await?;
        let (principal, root) = (principal.to_owned(), root.to_owned());
        Ok(self
            .db
            .read(move |conn| {
                Ok(conn
                    // The newest row and every row within ROW_RECENCY_MS of
                    // it, by the exact time of their last thought.
                    .prepare_cached(&format!(
                        "SELECT {READ_COLUMNS} FROM nb_sessions s INDEXED BY nb_sessions_by_root
                         WHERE s.principal = ?1 AND s.root_uri = ?2
                         AND s.updated_at_ms >= (SELECT MAX(updated_at_ms) FROM nb_sessions INDEXED BY nb_sessions_by_root
                                                 WHERE principal = ?1 AND root_uri = ?2) - {ROW_RECENCY_MS}
                         ORDER BY 7 DESC, s.id DESC LIMIT 1"
                    ))?
                    .query_row(params![principal, root], row_to_session)
                    .optional()?)
            })
            .await?)
    }

    async fn list_sessions(&self, principal: &str, filter: &SessionFilter) -> Result<Vec<NotebookSession>, RepoError> {
        self.settled().await?;
        let principal = principal.to_owned();
        let filter = filter.clone();
        Ok(self
            .db
            .read(move |conn| {
                // Tags are a JSON array; the tag filter matches one exact element.
                let tag = filter.tag.as_ref().map(|t| serde_json::to_string(t).unwrap_or_default());
                // One statement per shape, so each uses its index (an `?2 IS NULL OR`
                // condition would defeat nb_sessions_by_root).
                let root_clause = if filter.root.is_some() { "AND root_uri = ?2" } else { "AND ?2 IS NULL" };
                let matching = format!("principal = ?1 {root_clause} AND (?3 IS NULL OR instr(tags, ?3) > 0)");
                // The `limit` newest rows and every row within ROW_RECENCY_MS
                // of the last of them, by the exact time of their last thought.
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {READ_COLUMNS} FROM nb_sessions s WHERE {matching}
                     AND s.updated_at_ms >= COALESCE((SELECT updated_at_ms FROM nb_sessions WHERE {matching}
                                                      ORDER BY updated_at_ms DESC LIMIT 1 OFFSET MAX(?4, 1) - 1),
                                                     -9223372036854775807) - {ROW_RECENCY_MS}
                     ORDER BY 7 DESC, s.id DESC LIMIT ?4"
                ))?;
                let rows = stmt.query_map(params![principal, filter.root, tag, filter.limit as i64], row_to_session)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?)
    }

    async fn search(&self, principal: &str, text: &str, limit: usize) -> Result<Vec<SearchHit>, RepoError> {
        self.settled().await?;
        let principal = principal.to_owned();
        let pattern = format!("%{}%", text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
        Ok(self
            .db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT s.id, s.title, i.idx, t.body FROM nb_sessions s JOIN nb_thought_index i ON i.session_id = s.id
                     JOIN nb_thoughts t ON t.id = i.thought
                     WHERE s.principal = ?1 AND json_extract(t.body, '$.thought') LIKE ?2 ESCAPE '\\'
                     ORDER BY s.updated_at_ms DESC, i.idx LIMIT ?3",
                )?;
                let rows = stmt.query_map(params![principal, pattern, limit as i64], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?))
                })?;
                rows.map(|row| {
                    let (session_id, session_title, index, body) = row?;
                    let input: ThoughtInput = serde_json::from_str(&body).map_err(storage)?;
                    Ok(SearchHit {
                        session_id,
                        session_title,
                        index: index as u64,
                        thought_number: input.thought_number,
                        thought: input.thought,
                    })
                })
                .collect()
            })
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use tether_store::StoreConfig;
    use tether_store::sqlite::SqliteStore;

    use super::*;

    pub(super) fn step(n: u64) -> ThoughtInput {
        ThoughtInput::parse(
            serde_json::json!({"thought": format!("step {n}"), "thoughtNumber": n, "totalThoughts": 9, "nextThoughtNeeded": true})
                .as_object()
                .unwrap(),
        )
        .unwrap()
    }

    pub(super) async fn open(path: &std::path::Path) -> (SqliteStore, SqliteNotebook) {
        let store = SqliteStore::open(path, StoreConfig::default()).await.unwrap();
        let repo = SqliteNotebook::new(store.db().clone()).await.unwrap();
        (store, repo)
    }

    /// Inside a request, a thought is answered before its commit and
    /// committed with the response that follows it; numbering stays exact
    /// and nothing is lost across a reopen.
    #[tokio::test]
    async fn thoughts_answered_before_their_commit_are_stored_with_the_response() {
        use tether_store::{EventKind, Store};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nb.db");
        {
            let (store, repo) = open(&path).await;
            let session = NotebookSession::new("p", None, Vec::new(), None);
            repo.create_session(&session).await.unwrap();
            for n in 1..=5u64 {
                let stream = format!("r{n}");
                let (recorded, first) = tether_store::fence::scope(async {
                    let recorded = repo.append_thought("p", &session.id, &step(n)).await.unwrap();
                    let events = vec![(EventKind::Prime, bytes::Bytes::new()), (EventKind::Final, bytes::Bytes::from("ok"))];
                    (recorded, store.start_stream("s", &stream, events).await)
                })
                .await;
                assert_eq!(recorded.thought_history_length, n);
                assert_eq!(first.unwrap(), 1, "the response is stored");
            }
            let stored: Vec<String> =
                repo.thoughts("p", &session.id).await.unwrap().into_iter().map(|t| t.input.thought).collect();
            assert_eq!(stored, (1..=5).map(|n| format!("step {n}")).collect::<Vec<_>>());
        }
        let (_store, repo) = open(&path).await;
        let sessions = repo.list_sessions("p", &SessionFilter { limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].thought_count, 5, "the counters were committed too");
        assert_eq!(repo.thoughts("p", &sessions[0].id).await.unwrap().len(), 5);
    }

    /// Thoughts queued within a second leave their session's row alone, and
    /// every read still sees the exact counts and the exact recency order.
    #[tokio::test]
    async fn a_row_written_at_most_once_a_second_still_reads_exactly() {
        use tether_store::{EventKind, Store};
        let dir = tempfile::tempdir().unwrap();
        let (store, repo) = open(&dir.path().join("nb.db")).await;
        let root = Some("file:///work/project".to_owned());
        let a = NotebookSession::new("p", None, Vec::new(), root.clone());
        let b = NotebookSession::new("p", None, Vec::new(), root.clone());
        repo.create_session(&a).await.unwrap();
        repo.create_session(&b).await.unwrap();
        let started = std::time::Instant::now();
        // Counted by the table (outside a request): these write the rows.
        repo.append_thought("p", &a.id, &step(1)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        repo.append_thought("p", &b.id, &step(1)).await.unwrap();
        // Queued inside requests: B once more, then A twice, A last.
        for (n, (session, number)) in [(&b, 2), (&a, 2), (&a, 3)].into_iter().enumerate() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let stored = tether_store::fence::scope(async {
                repo.append_thought("p", &session.id, &step(number)).await.unwrap();
                store.start_stream("s", &format!("r{n}"), vec![(EventKind::Final, bytes::Bytes::from("ok"))]).await
            })
            .await;
            stored.unwrap();
        }
        let quick = started.elapsed() < std::time::Duration::from_millis(ROW_RECENCY_MS as u64 * 9 / 10);

        let got_a = repo.get_session("p", &a.id).await.unwrap().unwrap();
        assert_eq!(got_a.thought_count, 3);
        let latest = repo.latest_for_root("p", root.as_deref().unwrap()).await.unwrap().unwrap();
        assert_eq!(latest.id, a.id, "A had the last thought");
        assert_eq!(latest.thought_count, 3);
        let filter = SessionFilter { root: root.clone(), limit: 10, ..Default::default() };
        let listed: Vec<(String, u64)> =
            repo.list_sessions("p", &filter).await.unwrap().into_iter().map(|s| (s.id, s.thought_count)).collect();
        assert_eq!(listed, vec![(a.id.clone(), 3), (b.id.clone(), 2)]);
        let one = SessionFilter { limit: 1, ..filter };
        assert_eq!(repo.list_sessions("p", &one).await.unwrap()[0].id, a.id, "the limit cuts after the exact order");

        let id = a.id.clone();
        let row_count: i64 = store
            .db()
            .read(move |conn| Ok(conn.query_row("SELECT thought_count FROM nb_sessions WHERE id = ?1", [&id], |r| r.get(0))?))
            .await
            .unwrap();
        if quick {
            assert_eq!(row_count, 1, "the queued thoughts did not rewrite A's row");
        }
    }

    /// A queued thought that fails keeps the response that relied on it out
    /// of the store, and the next thought is counted from the table again.
    #[tokio::test]
    async fn a_failed_queued_thought_keeps_its_response_out() {
        use tether_store::{EventKind, Store, StoreError};
        let dir = tempfile::tempdir().unwrap();
        let (store, repo) = open(&dir.path().join("nb.db")).await;
        let session = NotebookSession::new("p", None, Vec::new(), None);
        repo.create_session(&session).await.unwrap();
        repo.append_thought("p", &session.id, &step(1)).await.unwrap();
        // The writer's next thought fails (as a full disk would fail it).
        let fail = "CREATE TEMP TRIGGER fail_thoughts BEFORE INSERT ON nb_thoughts BEGIN SELECT RAISE(ABORT, 'injected'); END";
        store.db().write(move |ctx| Ok(ctx.conn.execute(fail, [])?)).await.unwrap();

        let stored = tether_store::fence::scope(async {
            repo.append_thought("p", &session.id, &step(2)).await.unwrap();
            store
                .start_stream(
                    "s",
                    "r2",
                    vec![(EventKind::Prime, bytes::Bytes::new()), (EventKind::Final, bytes::Bytes::from("ok"))],
                )
                .await
        })
        .await;
        assert!(matches!(stored, Err(StoreError::EarlierWriteFailed(_))), "{stored:?}");
        assert!(store.read_after("s", "r2", 0, 10).await.unwrap().is_empty(), "no response claims the thought was stored");

        store.db().write(|ctx| Ok(ctx.conn.execute("DROP TRIGGER fail_thoughts", [])?)).await.unwrap();
        let again = tether_store::fence::scope(repo.append_thought("p", &session.id, &step(2))).await.unwrap();
        assert_eq!(again.thought_history_length, 2, "counted from the table: the failed thought took no number");
        assert_eq!(repo.thoughts("p", &session.id).await.unwrap().len(), 2);
    }

    pub(super) async fn count(store: &SqliteStore, query: &'static str) -> i64 {
        store.db().read(move |conn| Ok(conn.query_row(query, [], |r| r.get(0))?)).await.unwrap()
    }

    const UNINDEXED: &str = "SELECT COUNT(*) FROM nb_thoughts WHERE id > (SELECT through FROM nb_settled)";

    /// Thoughts appended inside requests wait for the index, at most
    /// SETTLE_EVERY of them; every read sees them at once, and a reopen
    /// indexes what a stop left.
    #[tokio::test]
    async fn thoughts_are_read_at_once_and_indexed_in_bulk() {
        use tether_store::{EventKind, Store};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nb.db");
        let root = "file:///work/project";
        let session = NotebookSession::new("p", None, Vec::new(), Some(root.to_owned()));
        {
            let (store, repo) = open(&path).await;
            repo.create_session(&session).await.unwrap();
            repo.append_thought("p", &session.id, &step(1)).await.unwrap();
            let total = SETTLE_EVERY + 3;
            tether_store::fence::scope(async {
                for n in 2..=total {
                    assert_eq!(repo.append_thought("p", &session.id, &step(n)).await.unwrap().thought_history_length, n);
                }
                store.start_stream("s", "r1", vec![(EventKind::Final, bytes::Bytes::from("ok"))]).await.unwrap();
            })
            .await;
            let waiting = count(&store, UNINDEXED).await;
            assert!(
                waiting > 0 && waiting < SETTLE_EVERY as i64,
                "the hot path indexed the first {SETTLE_EVERY}: {waiting} left"
            );

            assert_eq!(repo.get_session("p", &session.id).await.unwrap().unwrap().thought_count, total);
            assert_eq!(count(&store, UNINDEXED).await, 0, "a read settles first");
            assert_eq!(repo.latest_for_root("p", root).await.unwrap().unwrap().thought_count, total);
            let numbers: Vec<u64> =
                repo.thoughts("p", &session.id).await.unwrap().iter().map(|t| t.input.thought_number).collect();
            assert_eq!(numbers, (1..=total).collect::<Vec<_>>(), "every thought once, in order");

            // Two more, and no read before the stop.
            tether_store::fence::scope(async {
                repo.append_thought("p", &session.id, &step(total + 1)).await.unwrap();
                repo.append_thought("p", &session.id, &step(total + 2)).await.unwrap();
                store.start_stream("s", "r2", vec![(EventKind::Final, bytes::Bytes::from("ok"))]).await.unwrap();
            })
            .await;
            assert_eq!(count(&store, UNINDEXED).await, 2);
        }
        let (store, repo) = open(&path).await;
        assert_eq!(count(&store, UNINDEXED).await, 0, "indexed on open");
        assert_eq!(count(&store, "SELECT COUNT(*) FROM nb_thought_index").await, (SETTLE_EVERY + 5) as i64);
        let hits = repo.search("p", &format!("step {}", SETTLE_EVERY + 5), 10).await.unwrap();
        assert_eq!(hits.len(), 1, "the last thought is found");
    }
}
