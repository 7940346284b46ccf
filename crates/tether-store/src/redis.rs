//! Redis backend, for several replicas sharing one store.
//!
//! Every multi-key step is one Lua script (`redis/scripts/`), so it is atomic on the server and
//! no lock is ever held across a network round trip. Layout under the prefix
//! `P` (default `tether:`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P s:{id}` | hash | session: principal, created, expires, revision, state |
//! | `P sp:{principal}` / `P sx` | zset | sessions by principal / by expiry |
//! | `P ss:{id}` | set | stream names of a session |
//! | `P e:{id}:{stream}` | stream | events, entry ID `0-{seq}`, capped with `MAXLEN` |
//! | `P q:{id}` / `P f:{id}` / `P c:{id}` | hash | last seq / finished / cursor per stream |
//! | `P kv:{ns}:{key}` | hash | value, revision, expiry (plus a native TTL) |
//! | `P kvrev` | counter | key/value revisions, never reused |
//! | channel `P live` | pub/sub | `{session}\n{stream}\n{seq}` after every append |
//!
//! Session keys expire with their session (native TTLs), the reaper removes
//! index entries. Keys are computed inside scripts from the prefix, so this
//! targets a single Redis server (or a primary), not Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value as RValue};
use tokio::sync::broadcast;

use crate::{
    EventKind, RemoteAppend, SessionRecord, Store, StoreConfig, StoreError, StoreResult, StoredEvent, StreamSummary,
    VersionedValue, now_ms,
};

/// Announcements buffered for live delivery; a slow consumer falls back to reading the store.
const REMOTE_BUFFER: usize = 1024;

/// `redis://user:secret@host` → `redis://user:***@host` for logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => format!("{}***{}", &url[..s + 3], &url[at..]),
            }
        }
        _ => url.to_owned(),
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    crate::observe::error();
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Backend(format!("redis: {e}"))
    }
}

/// The function `drop(p, id)` the scripts that remove sessions begin with.
const DROP_SESSION: &str = include_str!("redis/scripts/drop_session.lua");

/// One script per multi-key step; each file says at its top what the script
/// does and what its KEYS and ARGV are.
struct Scripts {
    create: Script,
    update: Script,
    touch: Script,
    delete: Script,
    expire: Script,
    append: Script,
    streams: Script,
    set_cursor: Script,
    kv_cas: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_drop = |body: &str| Script::new(&format!("{DROP_SESSION}\n{body}"));
        Self {
            create: with_drop(include_str!("redis/scripts/create_session.lua")),
            update: Script::new(include_str!("redis/scripts/update_session_state.lua")),
            touch: Script::new(include_str!("redis/scripts/touch_session.lua")),
            delete: with_drop(include_str!("redis/scripts/delete_session.lua")),
            expire: with_drop(include_str!("redis/scripts/expire_sessions.lua")),
            append: Script::new(include_str!("redis/scripts/append.lua")),
            streams: Script::new(include_str!("redis/scripts/streams.lua")),
            set_cursor: Script::new(include_str!("redis/scripts/set_cursor.lua")),
            kv_cas: Script::new(include_str!("redis/scripts/kv_compare_and_set.lua")),
        }
    }
}

/// The [`Store`] on Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: Arc<str>,
    url: Arc<str>,
    cap: u64,
    scripts: Arc<Scripts>,
    remote: broadcast::Sender<RemoteAppend>,
    /// The listener task stops when the last clone of the store is gone.
    _alive: Arc<()>,
}

impl RedisStore {
    /// Connects (failing fast with a readable error if Redis does not answer)
    /// and starts the live-announcement listener, which reconnects by itself.
    pub async fn open(url: &str, config: StoreConfig) -> StoreResult<Self> {
        let client = redis::Client::open(url).map_err(|e| StoreError::Config(format!("bad redis URL {}: {e}", redacted(url))))?;
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn =
            tokio::time::timeout(Duration::from_secs(5), ConnectionManager::new_with_config(client.clone(), manager_config))
                .await
                .map_err(|_| StoreError::Unavailable(format!("redis at {} did not answer within 5s", redacted(url))))?
                .map_err(|e| StoreError::Unavailable(format!("cannot connect to redis at {}: {e}", redacted(url))))?;
        let (remote, _) = broadcast::channel(REMOTE_BUFFER);
        let alive = Arc::new(());
        let store = Self {
            _alive: alive.clone(),
            conn,
            prefix: config.redis_prefix.clone().into(),
            url: redacted(url).into(),
            cap: config.max_events_per_stream.max(1),
            scripts: Arc::new(Scripts::new()),
            remote: remote.clone(),
        };
        tokio::spawn(listen(client, format!("{}live", store.prefix), remote, Arc::downgrade(&alive)));
        Ok(store)
    }

    /// A connection for other repositories (the notebook) under the same prefix.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.to_string();
        for p in parts {
            k.push_str(p);
        }
        k
    }
}

/// Forwards `P live` announcements into `tx` until the store is dropped;
/// reconnects with a capped backoff when Redis goes away.
async fn listen(client: redis::Client, channel: String, tx: broadcast::Sender<RemoteAppend>, alive: std::sync::Weak<()>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if alive.upgrade().is_none() {
            return;
        }
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                if pubsub.subscribe(&channel).await.is_ok() {
                    backoff = Duration::from_millis(100);
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if alive.upgrade().is_none() {
                            return;
                        }
                        let Ok(text) = msg.get_payload::<String>() else { continue };
                        let mut parts = text.splitn(3, '\n');
                        if let (Some(session), Some(stream), Some(seq)) = (parts.next(), parts.next(), parts.next())
                            && let Ok(seq) = seq.parse()
                        {
                            let _ = tx.send(RemoteAppend { session: session.into(), stream: stream.into(), seq });
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "redis pub/sub unavailable; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn field<'a>(fields: &'a [(String, RValue)], name: &str) -> Option<&'a RValue> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn as_bytes(v: Option<&RValue>) -> Option<Vec<u8>> {
    match v? {
        RValue::BulkString(b) => Some(b.clone()),
        RValue::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn as_i64(v: Option<&RValue>) -> Option<i64> {
    match v? {
        RValue::Int(i) => Some(*i),
        other => as_bytes(Some(other)).and_then(|b| String::from_utf8(b).ok()).and_then(|s| s.parse().ok()),
    }
}

impl RedisStore {
    async fn read_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(self.key(&["s:", id]))
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
        let created: i64 = self
            .scripts
            .create
            .arg(&*self.prefix)
            .arg(&s.id)
            .arg(&s.principal)
            .arg(s.created_at_ms)
            .arg(s.expires_at_ms)
            .arg(s.revision)
            .arg(state)
            .arg(now_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if created == 1 { Ok(()) } else { Err(StoreError::Conflict(format!("session {}", s.id))) }
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        Ok(self.read_session(id).await?.filter(|s| s.expires_at_ms > now_ms))
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = self.conn.clone();
        let r: i64 = self
            .scripts
            .update
            .key(self.key(&["s:", id]))
            .arg(expected)
            .arg(state)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let r: i64 = self
            .scripts
            .touch
            .arg(&*self.prefix)
            .arg(id)
            .arg(expires_at_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(r == 1)
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let r: i64 = self.scripts.delete.arg(&*self.prefix).arg(id).invoke_async(&mut conn).await.map_err(unavailable)?;
        Ok(r > 0)
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let mut conn = self.conn.clone();
        let now = now_ms();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.key(&["sp:", principal]))
            .arg("+inf")
            .arg(format!("({now}"))
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
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
        let mut conn = self.conn.clone();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.key(&["sx"]))
            .arg("+inf")
            .arg(format!("({now_ms}"))
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(offset)
            .arg(limit.saturating_add(1))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
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

    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        self.scripts.expire.arg(&*self.prefix).arg(now_ms).arg(limit).invoke_async(&mut conn).await.map_err(unavailable)
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        self.append_batch(session, stream, vec![(kind, payload)]).await
    }

    /// All events in one script: one round trip, numbered together.
    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        if events.is_empty() {
            return Err(StoreError::Backend("append_batch needs at least one event".into()));
        }
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.append.prepare_invoke();
        invocation.arg(&*self.prefix).arg(session).arg(stream).arg(self.cap);
        for (kind, payload) in &events {
            invocation.arg(*kind as u8).arg(payload.as_ref());
        }
        let first: i64 = invocation.invoke_async(&mut conn).await.map_err(unavailable)?;
        Ok(first as u64)
    }

    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.conn.clone();
        let entries: Vec<(String, Vec<(String, RValue)>)> = redis::cmd("XRANGE")
            .arg(self.key(&["e:", session, ":", stream]))
            .arg(format!("(0-{after}"))
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        entries
            .into_iter()
            .map(|(id, fields)| {
                let seq = id
                    .strip_prefix("0-")
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| StoreError::Corrupt(format!("event id {id}")))?;
                let kind = as_i64(field(&fields, "k"))
                    .and_then(|k| EventKind::from_u8(k as u8))
                    .ok_or_else(|| StoreError::Corrupt(format!("event {id} kind")))?;
                let payload = as_bytes(field(&fields, "p")).ok_or_else(|| StoreError::Corrupt(format!("event {id} payload")))?;
                Ok(StoredEvent { seq, kind, payload: Bytes::from(payload) })
            })
            .collect()
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let mut conn = self.conn.clone();
        let rows: Vec<(String, i64, i64, i64)> =
            self.scripts.streams.arg(&*self.prefix).arg(session).arg("").invoke_async(&mut conn).await.map_err(unavailable)?;
        let mut out: Vec<StreamSummary> = rows
            .into_iter()
            .filter(|(_, _, _, fin)| *fin != 1)
            .map(|(stream, first, last, _)| StreamSummary {
                stream,
                first_seq: first as u64,
                last_seq: last as u64,
                finished: false,
            })
            .collect();
        out.sort_by(|a, b| a.stream.cmp(&b.stream));
        Ok(out)
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        if stream.is_empty() {
            return Ok(None);
        }
        let mut conn = self.conn.clone();
        let rows: Vec<(String, i64, i64, i64)> = self
            .scripts
            .streams
            .arg(&*self.prefix)
            .arg(session)
            .arg(stream)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(rows.into_iter().next().map(|(stream, first, last, fin)| StreamSummary {
            stream,
            first_seq: first as u64,
            last_seq: last as u64,
            finished: fin == 1,
        }))
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .scripts
            .set_cursor
            .arg(&*self.prefix)
            .arg(session)
            .arg(stream)
            .arg(seq)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = conn.hget(self.key(&["c:", session]), stream).await.map_err(unavailable)?;
        Ok(v.unwrap_or(0))
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(self.key(&["kv:", namespace, ":", key]))
            .arg(&["v", "r", "x"][..])
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
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
        let r: i64 = self
            .scripts
            .kv_cas
            .key(self.key(&["kv:", namespace, ":", key]))
            .key(self.key(&["kvrev"]))
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
        let n: i64 = conn.del(self.key(&["kv:", namespace, ":", key])).await.map_err(unavailable)?;
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

    fn describe(&self) -> String {
        format!("{} (prefix {})", self.url, self.prefix)
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn announce(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: i64 = conn.publish(self.key(&["live"]), format!("{session}\n{stream}\n{seq}")).await.map_err(unavailable)?;
        Ok(())
    }

    fn remote_appends(&self) -> Option<broadcast::Receiver<RemoteAppend>> {
        Some(self.remote.subscribe())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(super::redacted("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
        assert_eq!(super::redacted("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(super::redacted("rediss://:pw@h"), "rediss://:***@h");
    }
}
