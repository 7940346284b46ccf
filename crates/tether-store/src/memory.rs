//! In-process backend: everything in one mutex-guarded map. For tests and
//! for `--store memory` (nothing survives a restart).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    EventKind, SessionRecord, Store, StoreConfig, StoreError, StoreResult, StoredEvent, StreamSummary,
    VersionedValue, now_ms,
};

struct StreamLog {
    next_seq: u64,
    events: VecDeque<StoredEvent>,
    /// When its final event was appended (`None`: still open).
    finished_at_ms: Option<i64>,
}

impl StreamLog {
    fn new() -> Self {
        // Most streams are a quick request's: one event, ever.
        Self { next_seq: 1, events: VecDeque::with_capacity(1), finished_at_ms: None }
    }

    fn finished(&self) -> bool {
        self.finished_at_ms.is_some()
    }
}

/// A session's streams, sorted by name. A sorted `Vec` rather than a
/// `BTreeMap`: most sessions hold one or two streams, and a map's first
/// node alone takes about 800 bytes (the idle-session budget is 1 KiB).
/// Request streams are named by time, so a new one is pushed at the end.
#[derive(Default)]
struct Streams(Vec<(Box<str>, StreamLog)>);

impl Streams {
    fn get(&self, name: &str) -> Option<&StreamLog> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name)).ok().map(|i| &self.0[i].1)
    }

    fn get_or_insert(&mut self, name: &str) -> &mut StreamLog {
        let i = match self.0.binary_search_by(|(n, _)| (**n).cmp(name)) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (name.into(), StreamLog::new()));
                i
            }
        };
        &mut self.0[i].1
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &StreamLog)> {
        self.0.iter().map(|(n, log)| (&**n, log))
    }

    /// Drops the streams named in `[from, below)` that finished before
    /// `finished_before_ms`, until `budget` events were dropped; returns how many.
    fn drop_finished(&mut self, from: &str, below: &str, finished_before_ms: i64, budget: usize) -> usize {
        let mut dropped = 0;
        self.0.retain(|(name, log)| {
            let old = (from..below).contains(&&**name) && log.finished_at_ms.is_some_and(|t| t < finished_before_ms);
            if old && dropped < budget {
                dropped += log.events.len();
                return false;
            }
            true
        });
        dropped
    }
}

/// A session as kept: the ID is the map's key and the state is kept as its
/// JSON text (a `serde_json::Value` tree takes several times the bytes of
/// its text, and many idle sessions are mostly state).
struct KeptSession {
    principal: Box<str>,
    created_at_ms: i64,
    expires_at_ms: i64,
    revision: u64,
    state: Box<str>,
}

impl KeptSession {
    fn keep(s: &SessionRecord) -> StoreResult<Self> {
        Ok(Self {
            principal: s.principal.as_str().into(),
            created_at_ms: s.created_at_ms,
            expires_at_ms: s.expires_at_ms,
            revision: s.revision,
            state: serde_json::to_string(&s.state).map_err(|e| StoreError::Backend(e.to_string()))?.into(),
        })
    }

    fn record(&self, id: &str) -> StoreResult<SessionRecord> {
        Ok(SessionRecord {
            id: id.to_owned(),
            principal: self.principal.to_string(),
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            revision: self.revision,
            state: serde_json::from_str(&self.state).map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?,
        })
    }
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, KeptSession>,
    // session -> its streams
    logs: HashMap<Box<str>, Streams>,
    cursors: HashMap<(String, String), u64>,
    kv: HashMap<(String, String), VersionedValue>,
    kv_revision: u64,
}

/// The in-memory backend.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    config: StoreConfig,
}

impl MemoryStore {
    pub fn new(config: StoreConfig) -> Self {
        Self { inner: Mutex::new(Inner::default()), config }
    }

    fn lock(&self) -> StoreResult<std::sync::MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| StoreError::Backend("memory store lock poisoned".into()))
    }
}

fn summary(name: &str, log: &StreamLog) -> StreamSummary {
    StreamSummary {
        stream: name.to_owned(),
        first_seq: log.events.front().map(|e| e.seq).unwrap_or(log.next_seq),
        last_seq: log.next_seq.saturating_sub(1),
        finished: log.finished(),
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()> {
        let mut inner = self.lock()?;
        if let Some(existing) = inner.sessions.get(&session.id)
            && existing.expires_at_ms > now_ms() {
                return Err(StoreError::Conflict(format!("session {}", session.id)));
            }
        inner.sessions.insert(session.id.clone(), KeptSession::keep(session)?);
        Ok(())
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        let inner = self.lock()?;
        inner.sessions.get(id).filter(|s| s.expires_at_ms > now_ms).map(|s| s.record(id)).transpose()
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let mut inner = self.lock()?;
        match inner.sessions.get_mut(id) {
            Some(s) if s.revision == expected => {
                s.state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?.into();
                s.revision += 1;
                Ok(Some(s.revision))
            }
            _ => Ok(None),
        }
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        match inner.sessions.get_mut(id) {
            Some(s) => {
                s.expires_at_ms = s.expires_at_ms.max(expires_at_ms);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        inner.logs.remove(id);
        inner.cursors.retain(|(s, _), _| s != id);
        Ok(inner.sessions.remove(id).is_some())
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let inner = self.lock()?;
        let now = now_ms();
        let mut out = inner
            .sessions
            .iter()
            .filter(|(_, s)| &*s.principal == principal && s.expires_at_ms > now)
            .map(|(id, s)| s.record(id))
            .collect::<StoreResult<Vec<_>>>()?;
        out.sort_by(|a, b| b.expires_at_ms.cmp(&a.expires_at_ms).then(a.id.cmp(&b.id)));
        out.truncate(limit);
        Ok(out)
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let inner = self.lock()?;
        Ok(inner.sessions.values().filter(|s| &*s.principal == principal && s.expires_at_ms > now_ms).count() as u64)
    }

    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let mut inner = self.lock()?;
        let expired: Vec<String> = inner
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at_ms <= now_ms)
            .take(limit)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            inner.sessions.remove(id);
            inner.logs.remove(id.as_str());
            inner.cursors.retain(|(s, _), _| s != id);
        }
        inner.kv.retain(|_, v| v.expires_at_ms.is_none_or(|t| t > now_ms));
        Ok(expired)
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        let cap = self.config.max_events_per_stream.max(1) as usize;
        let mut inner = self.lock()?;
        let log = inner.logs.entry(session.into()).or_default().get_or_insert(stream);
        let seq = log.next_seq;
        log.next_seq += 1;
        if kind == EventKind::Final {
            log.finished_at_ms = Some(now_ms());
        }
        log.events.push_back(StoredEvent { seq, kind, payload });
        while log.events.len() > cap {
            log.events.pop_front();
        }
        Ok(seq)
    }

    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let inner = self.lock()?;
        let Some(log) = inner.logs.get(session).and_then(|l| l.get(stream)) else {
            return Ok(Vec::new());
        };
        let start = log.events.partition_point(|e| e.seq <= after);
        Ok(log.events.iter().skip(start).take(limit).cloned().collect())
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let inner = self.lock()?;
        Ok(inner
            .logs
            .get(session)
            .map(|l| l.iter().filter(|(_, log)| !log.finished()).map(|(name, log)| summary(name, log)).collect())
            .unwrap_or_default())
    }

    /// Finished request streams leave memory by age, as on SQLite: a
    /// long-lived session does not keep every answer it ever gave.
    async fn drop_finished_streams(&self, from: &str, below: &str, finished_before_ms: i64, limit: usize) -> StoreResult<u64> {
        let mut inner = self.lock()?;
        let mut dropped = 0;
        for streams in inner.logs.values_mut() {
            if dropped >= limit {
                break;
            }
            dropped += streams.drop_finished(from, below, finished_before_ms, limit - dropped);
        }
        inner.logs.retain(|_, streams| !streams.0.is_empty());
        Ok(dropped as u64)
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        let inner = self.lock()?;
        Ok(inner.logs.get(session).and_then(|l| l.get(stream)).map(|log| summary(stream, log)))
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut inner = self.lock()?;
        if !inner.sessions.contains_key(session) {
            return Ok(());
        }
        let c = inner.cursors.entry((session.to_owned(), stream.to_owned())).or_default();
        *c = (*c).max(seq);
        Ok(())
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let inner = self.lock()?;
        Ok(inner.cursors.get(&(session.to_owned(), stream.to_owned())).copied().unwrap_or(0))
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let inner = self.lock()?;
        Ok(inner
            .kv
            .get(&(namespace.to_owned(), key.to_owned()))
            .filter(|v| v.expires_at_ms.is_none_or(|t| t > now_ms))
            .cloned())
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let mut inner = self.lock()?;
        let now = now_ms();
        let k = (namespace.to_owned(), key.to_owned());
        let current = inner.kv.get(&k).filter(|v| v.expires_at_ms.is_none_or(|t| t > now)).map(|v| v.revision);
        if current != expected {
            return Ok(None);
        }
        inner.kv_revision += 1;
        let revision = inner.kv_revision;
        inner.kv.insert(k, VersionedValue { value, revision, expires_at_ms });
        Ok(Some(revision))
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        Ok(inner.kv.remove(&(namespace.to_owned(), key.to_owned())).is_some())
    }

    async fn ping(&self) -> StoreResult<()> {
        self.lock().map(|_| ())
    }

    async fn flush(&self) -> StoreResult<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
