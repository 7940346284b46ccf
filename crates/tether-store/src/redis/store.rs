//! The [`Store`] on Redis: sessions, event logs, cursors and key/value
//! records as calls of the scripts ([`super::scripts`]) and plain commands
//! on the keys [`super::layout`] names, and the indexes over all sessions.
//!
//! Invariant: a session's own keys change only in one script on its slot.
//! The indexes (by principal, by expiry) live in other slots and are
//! written after it, so they are hints: the reaper's script checks the
//! session's own hash before it drops anything.

use async_trait::async_trait;
use bytes::Bytes;
use redis::{AsyncCommands, Value as RValue};
use tokio::sync::broadcast;

use super::events::{decode_whole, encode_whole, stored_event};
use super::{Call, RedisStore, unavailable};
use crate::{
    EventKind, RemoteAppend, SessionRecord, Store, StoreError, StoreResult, StoredEvent, StreamSummary, VersionedValue, now_ms,
};

impl RedisStore {
    async fn read_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(format!("{}s", self.base(id)))
            .arg(&["principal", "created", "expires", "revision", "state"][..])
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let [Some(principal), Some(created), Some(expires), Some(revision), Some(state)] =
            <[Option<Vec<u8>>; 5]>::try_from(values).map_err(|_| StoreError::Corrupt(format!("session {id}")))?
        else {
            return Ok(None);
        };
        let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| StoreError::Corrupt(format!("session {id}")));
        let num = |b: Vec<u8>| text(b)?.parse::<i64>().map_err(|_| StoreError::Corrupt(format!("session {id}")));
        Ok(Some(SessionRecord {
            id: id.to_owned(),
            principal: text(principal)?,
            created_at_ms: num(created)?,
            expires_at_ms: num(expires)?,
            revision: num(revision)? as u64,
            state: serde_json::from_slice(&state).map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?,
        }))
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn create_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let state = serde_json::to_string(&s.state).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = self.conn.clone();
        let base = self.base(&s.id);
        let created: i64 = self
            .scripts
            .create
            .key(format!("{base}s"))
            .arg(&base)
            .arg(&s.principal)
            .arg(s.created_at_ms)
            .arg(s.expires_at_ms)
            .arg(s.revision)
            .arg(state)
            .arg(now_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if created != 1 {
            return Err(StoreError::Conflict(format!("session {}", s.id)));
        }
        self.index(&s.id, &s.principal, s.expires_at_ms).await
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        Ok(self.read_session(id).await?.filter(|s| s.expires_at_ms > now_ms))
    }

    async fn session_stamp(&self, id: &str, now_ms: i64) -> StoreResult<Option<crate::SessionStamp>> {
        let read = Call::new().arg("HMGET").arg(format!("{}s", self.base(id))).arg("revision").arg("expires");
        let (revision, expires): (Option<u64>, Option<i64>) = redis::from_redis_value(self.stamps.call(read).await?)
            .map_err(|e| StoreError::Corrupt(format!("session {id}: {e}")))?;
        Ok(match (revision, expires) {
            (Some(revision), Some(expires_at_ms)) if expires_at_ms > now_ms => {
                Some(crate::SessionStamp { revision, expires_at_ms })
            }
            _ => None,
        })
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = self.conn.clone();
        let r: i64 = self
            .scripts
            .update
            .key(format!("{}s", self.base(id)))
            .arg(expected)
            .arg(state)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let base = self.base(id);
        let touched: Option<(String, i64)> = self
            .scripts
            .touch
            .key(format!("{base}s"))
            .arg(&base)
            .arg(expires_at_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some((principal, expires)) = touched else { return Ok(false) };
        self.index(id, &principal, expires).await?;
        Ok(true)
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let base = self.base(id);
        let principal: Option<String> =
            self.scripts.delete.key(format!("{base}s")).arg(&base).invoke_async(&mut conn).await.map_err(unavailable)?;
        self.unindex(id, principal.as_deref()).await?;
        Ok(principal.is_some())
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let now = now_ms();
        let ids = self.live_ids(&self.key(&["sp:", principal]), now, 0, limit).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self.get_session(&id, now).await? {
                out.push(s);
            }
        }
        Ok(out)
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        conn.zcount(self.key(&["sp:", principal]), format!("({now_ms}"), "+inf").await.map_err(unavailable)
    }

    /// Pages by position in the expiry index (`sx`), most recently active first.
    async fn scan_sessions(&self, cursor: Option<&str>, limit: usize, now_ms: i64) -> StoreResult<crate::SessionPage> {
        let offset: usize = match cursor {
            None => 0,
            Some(c) => c.parse().map_err(|_| StoreError::Backend(format!("`{c}` is not a page cursor of this store")))?,
        };
        let ids = self.live_ids(&self.key(&["sx"]), now_ms, offset, limit.saturating_add(1)).await?;
        let more = ids.len() > limit;
        let mut sessions = Vec::with_capacity(ids.len().min(limit));
        for id in ids.iter().take(limit) {
            if let Some(s) = self.get_session(id, now_ms).await? {
                sessions.push(s);
            }
        }
        let next = more.then(|| (offset + limit).to_string());
        Ok(crate::SessionPage { sessions, next })
    }

    async fn count_all_sessions(&self, now_ms: i64) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        conn.zcount(self.key(&["sx"]), format!("({now_ms}"), "+inf").await.map_err(unavailable)
    }

    /// Candidates from the by-expiry index, each dropped by a script on its
    /// own slot that checks the session's hash first: one renewed meanwhile
    /// is kept (and its index entry left for its new expiry).
    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        let candidates: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.key(&["sx"]))
            .arg("-inf")
            .arg(now_ms)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut dropped = Vec::with_capacity(candidates.len());
        for id in candidates {
            let base = self.base(&id);
            let (outcome, detail): (i64, String) = self
                .scripts
                .expire
                .key(format!("{base}s"))
                .arg(&base)
                .arg(now_ms)
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            match outcome {
                1 => {
                    self.unindex(&id, Some(&detail)).await?;
                    dropped.push(id);
                }
                // Gone already (its keys expired natively): only the index entry is left.
                0 => {
                    let _: i64 = conn.zrem(self.key(&["sx"]), &id).await.map_err(unavailable)?;
                    dropped.push(id);
                }
                // Renewed after the index was read: the renewal re-indexes it.
                _ => {}
            }
        }
        Ok(dropped)
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        self.append_batch(session, stream, vec![(kind, payload)]).await
    }

    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, false).await
    }

    /// A stream that starts with its final event is stored whole (`append.lua`).
    async fn start_stream(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, true).await
    }

    /// `append.lua`'s mode 'above'.
    async fn append_continued(
        &self,
        session: &str,
        stream: &str,
        floor: u64,
        restart: Bytes,
        events: Vec<(EventKind, Bytes)>,
    ) -> StoreResult<u64> {
        if events.is_empty() {
            return Err(StoreError::Backend("append_continued needs at least one event".into()));
        }
        let count = events.len() as u64;
        let first = self.append_above(session, stream, floor, restart, events).await?;
        if first == 0 {
            return Err(StoreError::Corrupt(format!("an append to stream {stream} answered 0")));
        }
        self.announce_append(session, stream, first + count - 1).await;
        Ok(first)
    }

    /// `append.lua`'s mode 'above' without events.
    async fn restart_stream(&self, session: &str, stream: &str, prime: Bytes) -> StoreResult<bool> {
        let restarted = self.append_above(session, stream, 0, prime, Vec::new()).await? == 1;
        if restarted {
            self.announce_append(session, stream, 1).await;
        }
        Ok(restarted)
    }

    /// One round trip: the Redis Stream's entries after `after` and the
    /// stream stored whole, whichever exists.
    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        // Read as raw replies and taken apart by value: a replay reads
        // thousands of entries, and each payload is moved, not copied.
        // Both forms in one round trip, the Redis Stream first: a stream
        // moved from the whole form in between reads as empty (its
        // announcement wakes the reader again), never as both forms.
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE")
            .arg(format!("{base}e:{stream}"))
            .arg(format!("(0-{after}"))
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .cmd("GET")
            .arg(format!("{base}d:{stream}"));
        if self.conn.waits_for_replicas() {
            // A read sees writes applied but not yet on a replica (their
            // WAIT may still fail, and a failover lose them). A small write
            // after it on the same node, whose WAIT the connection makes,
            // shows nothing a failover can take back.
            pipe.cmd("SET").arg(format!("{base}barrier")).arg(1).arg("PX").arg(60_000).ignore();
        }
        let (entries, whole): (RValue, RValue) = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        let corrupt = || StoreError::Corrupt(format!("an event of stream {stream} of session {session}"));
        let events: Vec<StoredEvent> = match (entries, whole) {
            (RValue::Array(entries), RValue::Nil) => {
                entries.into_iter().map(|entry| stored_event(entry).ok_or_else(corrupt)).collect::<StoreResult<_>>()?
            }
            (RValue::Array(entries), RValue::BulkString(blob)) if entries.is_empty() => {
                let events = decode_whole(Bytes::from(blob)).ok_or_else(corrupt)?;
                events.into_iter().filter(|e| e.seq > after).take(limit).collect()
            }
            _ => return Err(corrupt()),
        };
        Ok(events)
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let mut out: Vec<StreamSummary> = self.stream_summaries(session, "").await?.into_iter().filter(|s| !s.finished).collect();
        out.sort_by(|a, b| a.stream.cmp(&b.stream));
        Ok(out)
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        if stream.is_empty() {
            return Ok(None);
        }
        Ok(self.stream_summaries(session, stream).await?.into_iter().next())
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        let _: i64 = self
            .scripts
            .set_cursor
            .key(format!("{base}s"))
            .key(format!("{base}c"))
            .arg(stream)
            .arg(seq)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = conn.hget(format!("{}c", self.base(session)), stream).await.map_err(unavailable)?;
        Ok(v.unwrap_or(0))
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let mut conn = self.conn.clone();
        let (record, _) = self.kv_keys(namespace, key);
        let values: Vec<Option<Vec<u8>>> =
            redis::cmd("HMGET").arg(record).arg(&["v", "r", "x"][..]).query_async(&mut conn).await.map_err(unavailable)?;
        let mut values = values.into_iter();
        let (Some(Some(value)), Some(Some(revision))) = (values.next(), values.next()) else { return Ok(None) };
        let expires: Option<i64> = values
            .next()
            .flatten()
            .and_then(|x| String::from_utf8(x).ok())
            .filter(|x| !x.is_empty())
            .and_then(|x| x.parse().ok());
        if expires.is_some_and(|t| t <= now_ms) {
            return Ok(None);
        }
        let revision = String::from_utf8(revision)
            .ok()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| StoreError::Corrupt(format!("kv {namespace}/{key}")))?;
        Ok(Some(VersionedValue { value: Bytes::from(value), revision, expires_at_ms: expires }))
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let mut conn = self.conn.clone();
        let (record, counter) = self.kv_keys(namespace, key);
        let r: i64 = self
            .scripts
            .kv_cas
            .key(record)
            .key(counter)
            .arg(expected.map(|e| e.to_string()).unwrap_or_default())
            .arg(value.as_ref())
            .arg(expires_at_ms.map(|e| e.to_string()).unwrap_or_default())
            .arg(now_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = conn.del(self.kv_keys(namespace, key).0).await.map_err(unavailable)?;
        Ok(n > 0)
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.map_err(unavailable)?;
        Ok(())
    }

    async fn flush(&self) -> StoreResult<()> {
        Ok(())
    }

    fn durability(&self) -> Option<String> {
        Some(self.durability.clone())
    }

    fn describe(&self) -> String {
        let kind = if self.conn.is_cluster() { "cluster " } else { "" };
        format!("{kind}{} (prefix {})", self.url, self.prefix)
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn announce(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        if self.conn.is_cluster() {
            return self.announce_sharded(session, stream, seq).await;
        }
        let mut conn = self.conn.clone();
        let _: i64 = conn.publish(self.key(&["live"]), format!("{session}\n{stream}\n{seq}")).await.map_err(unavailable)?;
        Ok(())
    }

    fn remote_appends(&self) -> Option<broadcast::Receiver<RemoteAppend>> {
        Some(self.remote.subscribe())
    }
}

impl RedisStore {
    /// The by-principal and by-expiry entries of a session: what its
    /// script cannot write, since they live in other slots.
    async fn index(&self, id: &str, principal: &str, expires_at_ms: i64) -> StoreResult<()> {
        let (mut by_principal, mut by_expiry) = (self.conn.clone(), self.conn.clone());
        let (_, _): (i64, i64) = futures::try_join!(
            by_principal.zadd(self.key(&["sp:", principal]), id, expires_at_ms),
            by_expiry.zadd(self.key(&["sx"]), id, expires_at_ms),
        )
        .map_err(unavailable)?;
        Ok(())
    }

    async fn unindex(&self, id: &str, principal: Option<&str>) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: i64 = conn.zrem(self.key(&["sx"]), id).await.map_err(unavailable)?;
        if let Some(principal) = principal {
            let _: i64 = conn.zrem(self.key(&["sp:", principal]), id).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// One call of the append operation (`append.lua`), batched with other
    /// appends on a single server (on a cluster a second round trip, the
    /// sharded announcement). `fresh`: the caller has just named the stream.
    async fn append_events(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>, fresh: bool) -> StoreResult<u64> {
        let Some((last_kind, _)) = events.last() else {
            return Err(StoreError::Backend("append_batch needs at least one event".into()));
        };
        let base = self.base(session);
        let count = events.len() as u64;
        let mut call = Call::new().key(format!("{base}s")).arg(base).arg(session.to_owned()).arg(stream.to_owned()).num(self.cap);
        call = if fresh && *last_kind == EventKind::Final {
            call.arg("done").num(count).arg(encode_whole(&events)).num(self.finished_ttl_ms)
        } else {
            events.into_iter().fold(call.arg("add"), |call, (kind, payload)| call.num(kind as u8).arg(payload))
        };
        let first = match self.append.call(call).await? {
            RValue::Int(first) if first > 0 => first as u64,
            other => return Err(StoreError::Corrupt(format!("an append to stream {stream} answered {other:?}"))),
        };
        self.announce_append(session, stream, first + count - 1).await;
        Ok(first)
    }

    /// One call of `append.lua` in mode 'above' (see
    /// [`Store::append_continued`]): the first event's seq, or with no
    /// events 1 if the stream was started again, else 0.
    async fn append_above(
        &self,
        session: &str,
        stream: &str,
        floor: u64,
        restart: Bytes,
        events: Vec<(EventKind, Bytes)>,
    ) -> StoreResult<u64> {
        let base = self.base(session);
        let call = Call::new().key(format!("{base}s")).arg(base).arg(session.to_owned()).arg(stream.to_owned()).num(self.cap);
        let call = call.arg("above").num(floor).arg(restart);
        let call = events.into_iter().fold(call, |call, (kind, payload)| call.num(kind as u8).arg(payload));
        match self.append.call(call).await? {
            RValue::Int(first) if first >= 0 => Ok(first as u64),
            other => Err(StoreError::Corrupt(format!("an append to stream {stream} answered {other:?}"))),
        }
    }

    /// On a cluster, where the script cannot publish: the sharded announcement of an append.
    async fn announce_append(&self, session: &str, stream: &str, last: u64) {
        if self.conn.is_cluster()
            && let Err(e) = self.announce_sharded(session, stream, last).await
        {
            // Stored is what counts; other replicas' pumps poll the store too.
            tracing::debug!(%session, error = %e, "could not announce an append");
        }
    }

    /// IDs in an index (by expiry) of sessions alive at `now_ms`, latest
    /// expiry first: `limit` of them from position `offset`.
    async fn live_ids(&self, index: &str, now_ms: i64, offset: usize, limit: usize) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        redis::cmd("ZRANGE")
            .arg(index)
            .arg("+inf")
            .arg(format!("({now_ms}"))
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(offset)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)
    }

    /// The open streams of a session (`one` empty) or one stream, as the `streams` script reports them.
    async fn stream_summaries(&self, session: &str, one: &str) -> StoreResult<Vec<StreamSummary>> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        let rows: Vec<(String, i64, i64, i64)> = self
            .scripts
            .streams
            .key(format!("{base}ss"))
            .arg(&base)
            .arg(one)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(stream, first, last, fin)| StreamSummary {
                stream,
                first_seq: first as u64,
                last_seq: last as u64,
                finished: fin == 1,
            })
            .collect())
    }
}
