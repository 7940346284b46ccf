//! In-process backend: everything in one mutex-guarded map. For tests and
//! for `--store memory` (nothing survives a restart).

mod packed;

use std::collections::{HashMap, VecDeque};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use crate::{
    EventKind, SessionRecord, Store, StoreConfig, StoreError, StoreResult, StoredEvent, StreamSummary, VersionedValue, now_ms,
};
use packed::{Packed, Packer};

struct KeptEvent {
    seq: u64,
    kind: EventKind,
    payload: Packed,
}

impl KeptEvent {
    fn event(&self) -> StoredEvent {
        StoredEvent { seq: self.seq, kind: self.kind, payload: self.payload.to_bytes() }
    }
}

struct StreamLog {
    next_seq: u64,
    events: VecDeque<KeptEvent>,
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
                if self.0.capacity() == 0 {
                    // A `Vec`'s first growth makes room for four (a third of an idle session's bytes).
                    self.0.reserve_exact(1);
                }
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
        if self.0.capacity() > 2 * self.0.len() {
            self.0.shrink_to_fit();
        }
        dropped
    }
}

/// A session as kept: the ID is the map's key and the state is kept as its
/// packed JSON text (a `serde_json::Value` tree takes several times the bytes
/// of its text, and many idle sessions are mostly state).
struct KeptSession {
    principal: Box<str>,
    created_at_ms: i64,
    expires_at_ms: i64,
    revision: u64,
    state: Packed,
}

fn pack_state(packer: &mut Packer, state: &serde_json::Value) -> StoreResult<Packed> {
    let text = serde_json::to_vec(state).map_err(|e| StoreError::Backend(e.to_string()))?;
    Ok(packer.pack(&text))
}

impl KeptSession {
    fn keep(s: &SessionRecord, states: &mut Packer) -> StoreResult<Self> {
        Ok(Self {
            principal: s.principal.as_str().into(),
            created_at_ms: s.created_at_ms,
            expires_at_ms: s.expires_at_ms,
            revision: s.revision,
            state: pack_state(states, &s.state)?,
        })
    }

    fn record(&self, id: &str) -> StoreResult<SessionRecord> {
        Ok(SessionRecord {
            id: id.to_owned(),
            principal: self.principal.to_string(),
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            revision: self.revision,
            state: serde_json::from_slice(&self.state.to_bytes())
                .map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?,
        })
    }
}

/// What is kept under one session ID: one map entry and one copy of the ID
/// (streams may be appended under an ID that has no session record).
#[derive(Default)]
struct Slot {
    session: Option<KeptSession>,
    streams: Streams,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<Box<str>, Slot>,
    cursors: HashMap<(String, String), u64>,
    /// namespace -> key -> record (one copy of each key, no allocation to look one up).
    kv: HashMap<Box<str>, HashMap<Box<str>, KeptValue>>,
    kv_revision: u64,
    events_packer: Packer,
    states_packer: Packer,
    values_packer: Packer,
}

struct KeptValue {
    value: Packed,
    revision: u64,
    expires_at_ms: Option<i64>,
}

impl Inner {
    fn session(&self, id: &str) -> Option<&KeptSession> {
        self.slots.get(id)?.session.as_ref()
    }

    fn session_mut(&mut self, id: &str) -> Option<&mut KeptSession> {
        self.slots.get_mut(id)?.session.as_mut()
    }

    fn sessions(&self) -> impl Iterator<Item = (&str, &KeptSession)> {
        self.slots.iter().filter_map(|(id, slot)| Some((&**id, slot.session.as_ref()?)))
    }

    fn streams(&self, id: &str) -> Option<&Streams> {
        self.slots.get(id).map(|slot| &slot.streams)
    }

    /// Forgets the session, its streams and its cursors; whether it had a record.
    fn remove(&mut self, id: &str) -> bool {
        self.cursors.retain(|(s, _), _| s != id);
        self.slots.remove(id).is_some_and(|slot| slot.session.is_some())
    }
}

impl KeptValue {
    fn live(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|t| t > now_ms)
    }
}

/// The in-memory backend.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    config: StoreConfig,
}

impl MemoryStore {
    /// An empty store.
    pub fn new(config: StoreConfig) -> Self {
        Self { inner: Mutex::new(Inner::default()), config }
    }
}

/// The value under `key`, inserted if missing. Looked up first: `entry`
/// would copy the key on every call (every append).
fn entry<'m, V: Default>(map: &'m mut HashMap<Box<str>, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.into(), V::default());
    }
    match map.get_mut(key) {
        Some(value) => value,
        None => unreachable!("inserted above"),
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
        let mut inner = self.inner.lock();
        if let Some(existing) = inner.session(&session.id)
            && existing.expires_at_ms > now_ms()
        {
            return Err(StoreError::Conflict(format!("session {}", session.id)));
        }
        let kept = KeptSession::keep(session, &mut inner.states_packer)?;
        inner.slots.entry(session.id.as_str().into()).or_default().session = Some(kept);
        Ok(())
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        let inner = self.inner.lock();
        inner.session(id).filter(|s| s.expires_at_ms > now_ms).map(|s| s.record(id)).transpose()
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        match inner.slots.get_mut(id).and_then(|slot| slot.session.as_mut()) {
            Some(s) if s.revision == expected => {
                s.state = pack_state(&mut inner.states_packer, state)?;
                s.revision += 1;
                Ok(Some(s.revision))
            }
            _ => Ok(None),
        }
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        match inner.session_mut(id) {
            Some(s) => {
                s.expires_at_ms = s.expires_at_ms.max(expires_at_ms);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        Ok(inner.remove(id))
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let inner = self.inner.lock();
        let now = now_ms();
        let mut out = inner
            .sessions()
            .filter(|(_, s)| &*s.principal == principal && s.expires_at_ms > now)
            .map(|(id, s)| s.record(id))
            .collect::<StoreResult<Vec<_>>>()?;
        out.sort_by(|a, b| b.expires_at_ms.cmp(&a.expires_at_ms).then(a.id.cmp(&b.id)));
        out.truncate(limit);
        Ok(out)
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let inner = self.inner.lock();
        Ok(inner.sessions().filter(|(_, s)| &*s.principal == principal && s.expires_at_ms > now_ms).count() as u64)
    }

    async fn scan_sessions(&self, cursor: Option<&str>, limit: usize, now_ms: i64) -> StoreResult<crate::SessionPage> {
        let inner = self.inner.lock();
        let after = cursor.unwrap_or("");
        let mut ids: Vec<&str> =
            inner.sessions().filter(|(id, s)| *id > after && s.expires_at_ms > now_ms).map(|(id, _)| id).collect();
        ids.sort_unstable();
        let more = ids.len() > limit;
        ids.truncate(limit);
        let sessions = ids
            .iter()
            .filter_map(|id| inner.sessions().find(|(i, _)| i == id).map(|(i, s)| s.record(i)))
            .collect::<StoreResult<Vec<_>>>()?;
        let next = if more { sessions.last().map(|s| s.id.clone()) } else { None };
        Ok(crate::SessionPage { sessions, next })
    }

    async fn count_all_sessions(&self, now_ms: i64) -> StoreResult<u64> {
        let inner = self.inner.lock();
        Ok(inner.sessions().filter(|(_, s)| s.expires_at_ms > now_ms).count() as u64)
    }

    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let mut inner = self.inner.lock();
        let expired: Vec<String> =
            inner.sessions().filter(|(_, s)| s.expires_at_ms <= now_ms).take(limit).map(|(id, _)| id.to_owned()).collect();
        for id in &expired {
            inner.remove(id);
        }
        for records in inner.kv.values_mut() {
            records.retain(|_, v| v.live(now_ms));
        }
        Ok(expired)
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        let cap = self.config.max_events_per_stream.max(1) as usize;
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let payload = inner.events_packer.pack(&payload);
        let log = entry(&mut inner.slots, session).streams.get_or_insert(stream);
        let seq = log.next_seq;
        log.next_seq += 1;
        if kind == EventKind::Final {
            log.finished_at_ms = Some(now_ms());
        }
        log.events.push_back(KeptEvent { seq, kind, payload });
        while log.events.len() > cap {
            log.events.pop_front();
        }
        Ok(seq)
    }

    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let inner = self.inner.lock();
        let Some(log) = inner.streams(session).and_then(|l| l.get(stream)) else {
            return Ok(Vec::new());
        };
        let start = log.events.partition_point(|e| e.seq <= after);
        Ok(log.events.iter().skip(start).take(limit).map(KeptEvent::event).collect())
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let inner = self.inner.lock();
        Ok(inner
            .streams(session)
            .map(|l| l.iter().filter(|(_, log)| !log.finished()).map(|(name, log)| summary(name, log)).collect())
            .unwrap_or_default())
    }

    /// Finished request streams leave memory by age, as on SQLite: a
    /// long-lived session does not keep every answer it ever gave.
    async fn drop_finished_streams(&self, from: &str, below: &str, finished_before_ms: i64, limit: usize) -> StoreResult<u64> {
        let mut inner = self.inner.lock();
        let mut dropped = 0;
        for slot in inner.slots.values_mut() {
            if dropped >= limit {
                break;
            }
            dropped += slot.streams.drop_finished(from, below, finished_before_ms, limit - dropped);
        }
        inner.slots.retain(|_, slot| slot.session.is_some() || !slot.streams.0.is_empty());
        Ok(dropped as u64)
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        let inner = self.inner.lock();
        Ok(inner.streams(session).and_then(|l| l.get(stream)).map(|log| summary(stream, log)))
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        if inner.session(session).is_none() {
            return Ok(());
        }
        let c = inner.cursors.entry((session.to_owned(), stream.to_owned())).or_default();
        *c = (*c).max(seq);
        Ok(())
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let inner = self.inner.lock();
        Ok(inner.cursors.get(&(session.to_owned(), stream.to_owned())).copied().unwrap_or(0))
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let inner = self.inner.lock();
        Ok(inner.kv.get(namespace).and_then(|records| records.get(key)).filter(|v| v.live(now_ms)).map(|v| VersionedValue {
            value: v.value.to_bytes(),
            revision: v.revision,
            expires_at_ms: v.expires_at_ms,
        }))
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let mut inner = self.inner.lock();
        let now = now_ms();
        let inner = &mut *inner;
        let current = inner.kv.get(namespace).and_then(|records| records.get(key)).filter(|v| v.live(now)).map(|v| v.revision);
        if current != expected {
            return Ok(None);
        }
        inner.kv_revision += 1;
        let revision = inner.kv_revision;
        let value = inner.values_packer.pack(&value);
        entry(&mut inner.kv, namespace).insert(key.into(), KeptValue { value, revision, expires_at_ms });
        Ok(Some(revision))
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        Ok(inner.kv.get_mut(namespace).and_then(|records| records.remove(key)).is_some())
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn flush(&self) -> StoreResult<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
