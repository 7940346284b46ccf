//! The [`Store`] on SQLite: sessions, event logs, cursors and key/value
//! records as statements on the tables [`super::schema`] lays out, each a
//! writer job or a pooled read.
//!
//! Also the writer's cache of each stream's last sequence number, which
//! only appends use: a `MAX(seq)` per append would be a lookup on the
//! events index inside every commit.

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};

use super::{SqliteStore, WriterCtx};
use crate::{EventKind, SessionRecord, Store, StoreError, StoreResult, StoredEvent, StreamSummary, VersionedValue, now_ms};

/// Sequence-number cache entries (sessions) kept by the writer before it starts over.
const SEQ_CACHE_SESSIONS: usize = 10_000;
/// Streams per session in that cache before it starts over for the session.
const SEQ_CACHE_STREAMS: usize = 64;

impl WriterCtx {
    fn next_seq(&mut self, session: &str, stream: &str) -> StoreResult<u64> {
        if self.seqs.len() > SEQ_CACHE_SESSIONS {
            self.seqs.clear();
        }
        let known = self.seqs.get(session).and_then(|m| m.get(stream)).copied();
        let last = match known {
            Some(v) => v,
            None => self
                .conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session = ?1 AND stream = ?2")?
                .query_row(params![session, stream], |r| r.get::<_, i64>(0))? as u64,
        };
        Ok(last + 1)
    }

    fn record_seq(&mut self, session: &str, stream: &str, seq: u64) {
        let streams = match self.seqs.get_mut(session) {
            Some(streams) => streams,
            None => self.seqs.entry(session.to_owned()).or_default(),
        };
        if streams.len() >= SEQ_CACHE_STREAMS {
            // Streams that never finished (their process stopped) are not
            // appended to again either.
            streams.clear();
        }
        match streams.get_mut(stream) {
            Some(last) => *last = seq,
            None => {
                streams.insert(stream.to_owned(), seq);
            }
        }
    }

    /// A stream that will not be appended to again (a later append would
    /// look its last number up).
    fn forget_stream(&mut self, session: &str, stream: &str) {
        if let Some(streams) = self.seqs.get_mut(session) {
            streams.remove(stream);
        }
    }

    fn forget_session(&mut self, session: &str) {
        self.seqs.remove(session);
    }
}

impl SqliteStore {
    /// Appends in one job; `new_stream`: the stream has no events (a
    /// wrong claim fails on the unique index instead of overwriting).
    async fn append_events(
        &self,
        session: &str,
        stream: &str,
        events: Vec<(EventKind, Bytes)>,
        new_stream: bool,
    ) -> StoreResult<u64> {
        if events.is_empty() {
            return Err(StoreError::Backend("append_batch needs at least one event".into()));
        }
        let session = session.to_owned();
        let stream = stream.to_owned();
        let finishes = events.iter().any(|(kind, _)| *kind == EventKind::Final);
        let depends_on = crate::fence::pending(finishes);
        self.db
            .write(move |ctx| {
                crate::fence::check(&depends_on)?;
                let first = if new_stream { 1 } else { ctx.next_seq(&session, &stream)? };
                let mut seq = first;
                for (kind, payload) in &events {
                    ctx.conn
                        .prepare_cached("INSERT INTO events(session, stream, seq, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)")?
                        .execute(params![session, stream, seq as i64, *kind as u8, payload.as_ref()])?;
                    if seq > ctx.max_events_per_stream {
                        ctx.conn
                            .prepare_cached("DELETE FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3")?
                            .execute(params![session, stream, (seq - ctx.max_events_per_stream) as i64])?;
                    }
                    seq += 1;
                }
                if finishes {
                    // Nothing follows a final response: a quick request's
                    // stream never enters the cache, a slow one's leaves it.
                    ctx.forget_stream(&session, &stream);
                } else {
                    ctx.record_seq(&session, &stream, seq - 1);
                }
                if finishes && first > 1 {
                    ctx.conn
                        .prepare_cached("UPDATE tracked_streams SET finished_at_ms = ?3 WHERE session = ?1 AND stream = ?2")?
                        .execute(params![session, stream, now_ms()])?;
                } else if !finishes && first == 1 {
                    ctx.conn
                        .prepare_cached("INSERT OR IGNORE INTO tracked_streams(session, stream) VALUES (?1, ?2)")?
                        .execute(params![session, stream])?;
                }
                Ok(first)
            })
            .await
    }
}

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, i64, i64, i64, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
}

fn to_record(row: (String, String, i64, i64, i64, String)) -> StoreResult<SessionRecord> {
    let (id, principal, created_at_ms, expires_at_ms, revision, state) = row;
    let state = serde_json::from_str(&state).map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?;
    Ok(SessionRecord { id, principal, created_at_ms, expires_at_ms, revision: revision as u64, state })
}

const SESSION_COLUMNS: &str = "id, principal, created_at_ms, expires_at_ms, revision, state";

/// Deletes a session with its cursors and tracked streams; its quick
/// request streams are left to [`Store::drop_finished_streams`].
fn delete_session_rows(conn: &Connection, id: &str) -> StoreResult<bool> {
    conn.prepare_cached(
        "DELETE FROM events WHERE (stream, session) IN (SELECT stream, session FROM tracked_streams WHERE session = ?1)",
    )?
    .execute(params![id])?;
    conn.prepare_cached("DELETE FROM tracked_streams WHERE session = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM cursors WHERE session = ?1")?.execute(params![id])?;
    Ok(conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute(params![id])? > 0)
}

fn stream_summary(conn: &Connection, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
    let row = conn
        .prepare_cached(
            "SELECT MIN(seq), MAX(seq), MAX(kind = 2) FROM events WHERE stream = ?2 AND session = ?1 HAVING COUNT(*) > 0",
        )?
        .query_row(params![session, stream], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
        .optional()?;
    Ok(row.map(|(first, last, finished)| StreamSummary {
        stream: stream.to_owned(),
        first_seq: first as u64,
        last_seq: last as u64,
        finished: finished != 0,
    }))
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let s = s.clone();
        let state = serde_json::to_string(&s.state).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.db
            .write(move |ctx| {
                // An expired leftover with the same ID is replaced.
                let now = now_ms();
                let live: Option<i64> = ctx
                    .conn
                    .query_row("SELECT expires_at_ms FROM sessions WHERE id = ?1", params![s.id], |r| r.get(0))
                    .optional()?;
                match live {
                    Some(t) if t > now => return Err(StoreError::Conflict(format!("session {}", s.id))),
                    Some(_) => {
                        delete_session_rows(&ctx.conn, &s.id)?;
                        ctx.forget_session(&s.id);
                    }
                    None => {}
                }
                ctx.conn.execute(
                    "INSERT INTO sessions(id, principal, created_at_ms, expires_at_ms, revision, state)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![s.id, s.principal, s.created_at_ms, s.expires_at_ms, s.revision as i64, state],
                )?;
                Ok(())
            })
            .await
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        let id = id.to_owned();
        self.db
            .read(move |conn| {
                let row = conn
                    .prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1 AND expires_at_ms > ?2"))?
                    .query_row(params![id, now_ms], session_from_row)
                    .optional()?;
                row.map(to_record).transpose()
            })
            .await
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let id = id.to_owned();
        let state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.db
            .write(move |ctx| {
                let n = ctx.conn.execute(
                    "UPDATE sessions SET state = ?1, revision = revision + 1 WHERE id = ?2 AND revision = ?3",
                    params![state, id, expected as i64],
                )?;
                Ok((n == 1).then_some(expected + 1))
            })
            .await
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let id = id.to_owned();
        self.db
            .write(move |ctx| {
                let n = ctx.conn.execute(
                    "UPDATE sessions SET expires_at_ms = MAX(expires_at_ms, ?1) WHERE id = ?2",
                    params![expires_at_ms, id],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.db
            .write(move |ctx| {
                ctx.forget_session(&id);
                delete_session_rows(&ctx.conn, &id)
            })
            .await
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let principal = principal.to_owned();
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions WHERE principal = ?1 AND expires_at_ms > ?2
                     ORDER BY expires_at_ms DESC, id LIMIT ?3"
                ))?;
                let rows = stmt.query_map(params![principal, now_ms(), limit as i64], session_from_row)?;
                rows.map(|r| to_record(r?)).collect()
            })
            .await
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let principal = principal.to_owned();
        self.db
            .read(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT COUNT(*) FROM sessions WHERE principal = ?1 AND expires_at_ms > ?2")?
                    .query_row(params![principal, now_ms], |r| r.get::<_, i64>(0))? as u64)
            })
            .await
    }

    async fn scan_sessions(&self, cursor: Option<&str>, limit: usize, now_ms: i64) -> StoreResult<crate::SessionPage> {
        let after = cursor.unwrap_or("").to_owned();
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions WHERE id > ?1 AND expires_at_ms > ?2 ORDER BY id LIMIT ?3"
                ))?;
                let rows = stmt.query_map(params![after, now_ms, limit.saturating_add(1) as i64], session_from_row)?;
                let mut sessions = rows.map(|r| to_record(r?)).collect::<StoreResult<Vec<_>>>()?;
                let more = sessions.len() > limit;
                sessions.truncate(limit);
                let next = if more { sessions.last().map(|s| s.id.clone()) } else { None };
                Ok(crate::SessionPage { sessions, next })
            })
            .await
    }

    async fn count_all_sessions(&self, now_ms: i64) -> StoreResult<u64> {
        self.db
            .read(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT COUNT(*) FROM sessions WHERE expires_at_ms > ?1")?
                    .query_row(params![now_ms], |r| r.get::<_, i64>(0))? as u64)
            })
            .await
    }

    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        self.db
            .write(move |ctx| {
                let ids: Vec<String> = {
                    let mut stmt = ctx.conn.prepare_cached("SELECT id FROM sessions WHERE expires_at_ms <= ?1 LIMIT ?2")?;
                    let rows = stmt.query_map(params![now_ms, limit as i64], |r| r.get(0))?;
                    rows.collect::<Result<_, _>>()?
                };
                for id in &ids {
                    delete_session_rows(&ctx.conn, id)?;
                    ctx.forget_session(id);
                }
                ctx.conn.execute("DELETE FROM kv WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1", params![now_ms])?;
                Ok(ids)
            })
            .await
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        self.append_batch(session, stream, vec![(kind, payload)]).await
    }

    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, false).await
    }

    async fn start_stream(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, true).await
    }

    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq, kind, payload FROM events WHERE session = ?1 AND stream = ?2 AND seq > ?3
                     ORDER BY seq LIMIT ?4",
                )?;
                let rows = stmt.query_map(params![session, stream, after as i64, limit as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, u8>(1)?, r.get::<_, Vec<u8>>(2)?))
                })?;
                rows.map(|row| {
                    let (seq, kind, payload) = row?;
                    let kind = EventKind::from_u8(kind).ok_or_else(|| StoreError::Corrupt(format!("event kind {kind}")))?;
                    Ok(StoredEvent { seq: seq as u64, kind, payload: Bytes::from(payload) })
                })
                .collect()
            })
            .await
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let session = session.to_owned();
        self.db
            .read(move |conn| {
                let names: Vec<String> = conn
                    .prepare_cached(
                        "SELECT stream FROM tracked_streams WHERE session = ?1 AND finished_at_ms IS NULL ORDER BY stream",
                    )?
                    .query_map(params![session], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                let mut open = Vec::with_capacity(names.len());
                for name in names {
                    open.extend(stream_summary(conn, &session, &name)?.filter(|s| !s.finished));
                }
                Ok(open)
            })
            .await
    }

    async fn drop_finished_streams(&self, from: &str, below: &str, finished_before_ms: i64, limit: usize) -> StoreResult<u64> {
        let (from, below) = (from.to_owned(), below.to_owned());
        self.db
            .write(move |ctx| {
                // Quick streams (never tracked) finished in the commit that named them.
                let mut dropped = ctx
                    .conn
                    .prepare_cached(
                        "DELETE FROM events WHERE id IN (
                            SELECT e.id FROM events e WHERE e.stream >= ?1 AND e.stream < ?2
                            AND NOT EXISTS (SELECT 1 FROM tracked_streams t WHERE t.session = e.session AND t.stream = e.stream)
                            LIMIT ?3)",
                    )?
                    .execute(params![from, below, limit as i64])?;
                let finished: Vec<(String, String)> = ctx
                    .conn
                    .prepare_cached(
                        "SELECT session, stream FROM tracked_streams WHERE finished_at_ms < ?3 AND stream >= ?1 AND stream < ?2 LIMIT ?4",
                    )?
                    .query_map(params![from, below, finished_before_ms, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                for (session, stream) in finished {
                    dropped += ctx
                        .conn
                        .prepare_cached("DELETE FROM events WHERE stream = ?2 AND session = ?1")?
                        .execute(params![session, stream])?;
                    ctx.conn
                        .prepare_cached("DELETE FROM tracked_streams WHERE session = ?1 AND stream = ?2")?
                        .execute(params![session, stream])?;
                }
                Ok(dropped as u64)
            })
            .await
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db.read(move |conn| stream_summary(conn, &session, &stream)).await
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .write(move |ctx| {
                ctx.conn.prepare_cached(
                    "INSERT INTO cursors(session, stream, seq) SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
                     ON CONFLICT(session, stream) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                )?
                .execute(params![session, stream, seq as i64])?;
                Ok(())
            })
            .await
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .read(move |conn| {
                let v: Option<i64> = conn
                    .prepare_cached("SELECT seq FROM cursors WHERE session = ?1 AND stream = ?2")?
                    .query_row(params![session, stream], |r| r.get(0))
                    .optional()?;
                Ok(v.unwrap_or(0) as u64)
            })
            .await
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .read(move |conn| {
                let row = conn
                    .prepare_cached(
                        "SELECT value, revision, expires_at_ms FROM kv WHERE namespace = ?1 AND key = ?2
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
                    )?
                    .query_row(params![namespace, key, now_ms], |r| {
                        Ok(VersionedValue {
                            value: Bytes::from(r.get::<_, Vec<u8>>(0)?),
                            revision: r.get::<_, i64>(1)? as u64,
                            expires_at_ms: r.get(2)?,
                        })
                    })
                    .optional()?;
                Ok(row)
            })
            .await
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .write(move |ctx| {
                let now = now_ms();
                let current: Option<u64> = ctx
                    .conn
                    .prepare_cached(
                        "SELECT revision FROM kv WHERE namespace = ?1 AND key = ?2
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
                    )?
                    .query_row(params![namespace, key, now], |r| r.get::<_, i64>(0))
                    .optional()?
                    .map(|v| v as u64);
                if current != expected {
                    return Ok(None);
                }
                let revision = ctx.kv_revision + 1;
                ctx.conn
                    .prepare_cached(
                        "INSERT INTO kv(namespace, key, value, revision, expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT(namespace, key) DO UPDATE SET value = excluded.value,
                         revision = excluded.revision, expires_at_ms = excluded.expires_at_ms",
                    )?
                    .execute(params![namespace, key, value.as_ref(), revision as i64, expires_at_ms])?;
                ctx.kv_revision = revision;
                Ok(Some(revision))
            })
            .await
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .write(move |ctx| {
                Ok(ctx.conn.execute("DELETE FROM kv WHERE namespace = ?1 AND key = ?2", params![namespace, key])? > 0)
            })
            .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.read(|conn| Ok(conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?)).await?;
        // An empty commit (`flush`) succeeds on a full disk: it writes no page.
        self.db.probe_writes().await?;
        // The empty commit can still fail: it shares its group commit with
        // jobs whose commit failed (the disk filled up just now). Say what
        // to do, as `probe_writes` does.
        self.flush().await.map_err(|e| match self.db.write_failure() {
            Some(_) => StoreError::Unavailable(format!(
                "commits fail ({e}): free disk space or fix the file system; tether tries again by itself"
            )),
            None => e,
        })
    }

    async fn flush(&self) -> StoreResult<()> {
        self.db.write(|_| Ok(())).await
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.db.path().display())
    }

    fn write_recoveries(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.db.write_recoveries())
    }
}
