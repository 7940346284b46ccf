#![warn(missing_docs)]
//! Durable records for tether.
//!
//! The [`Store`] trait is what the server engine, the notebook and (later) the
//! Redis backend agree on. It speaks of appends, ranges, compare-and-set and
//! expiry, never of SQL, so every backend can pass the one shared
//! `conformance` suite (the `conformance` feature).
//!
//! Backends: [`memory::MemoryStore`] (tests, `--store memory`) and
//! [`sqlite::SqliteStore`] (embedded default: WAL, one writer with
//! group commit), [`redis::RedisStore`] (several replicas).

mod error;
mod model;
mod open;

#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod fence;
pub mod memory;
pub mod observe;
pub mod redis;
pub mod sqlite;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use error::{StoreError, StoreResult};
pub use model::{EventKind, SessionRecord, SessionStamp, StoredEvent, StreamSummary, VersionedValue, now_ms};
pub use open::{StoreConfig, StoreUrl, open_store};

use async_trait::async_trait;
use bytes::Bytes;

/// Everything tether keeps durably. Implementations must be safe to share
/// between tasks (`Arc<dyn Store>`), and every method is one atomic step:
/// callers never hold a lock across two calls.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    // ---- sessions -------------------------------------------------------

    /// Stores a new session. Fails with [`StoreError::Conflict`] if the ID exists.
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()>;

    /// Reads a session, `None` if it does not exist or has expired at `now_ms`.
    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>>;

    /// A session's revision and expiry, `None` as for [`Store::get_session`]:
    /// what a replica checks on every request to learn whether its cached
    /// copy is current, without reading (and parsing) the state.
    async fn session_stamp(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionStamp>> {
        Ok(self.get_session(id, now_ms).await?.map(|s| SessionStamp { revision: s.revision, expires_at_ms: s.expires_at_ms }))
    }

    /// Replaces `state` if the stored revision equals `expected_revision`;
    /// returns the new revision, or `None` if somebody else changed it first
    /// (or the session is gone).
    async fn update_session_state(&self, id: &str, expected_revision: u64, state: &serde_json::Value)
    -> StoreResult<Option<u64>>;

    /// Moves the session's expiry forward. Returns false if the session is gone.
    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool>;

    /// Deletes a session with its cursors and open event logs (finished ones
    /// too, or later through [`Store::drop_finished_streams`]).
    async fn delete_session(&self, id: &str) -> StoreResult<bool>;

    /// Sessions of one principal, most recently active first.
    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>>;

    /// Live sessions of one principal.
    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64>;

    /// One page of the live sessions of every principal (the admin API,
    /// `tether sessions list`): at most `limit` records after `cursor`, and
    /// the cursor of the next page (`None` at the end). The cursor is the
    /// backend's own (an ID on SQLite and in memory, a position on Redis,
    /// where a page may repeat or miss a session created or ended meanwhile).
    async fn scan_sessions(&self, cursor: Option<&str>, limit: usize, now_ms: i64) -> StoreResult<SessionPage>;

    /// Live sessions of every principal (the `tether_sessions_stored` gauge).
    async fn count_all_sessions(&self, now_ms: i64) -> StoreResult<u64>;

    /// Deletes up to `limit` sessions that expired before `now_ms` (with their
    /// logs) and returns their IDs.
    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>>;

    // ---- event logs -------------------------------------------------------

    /// Appends one event to a stream of a session and returns its sequence
    /// number (1 for the first event, then strictly increasing). The event is
    /// committed when this returns. Streams longer than the configured cap
    /// lose their oldest events.
    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64>;

    /// Appends several events to one stream in one commit; returns the
    /// sequence number of the first (the others follow it by one each).
    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        let mut first = None;
        for (kind, payload) in events {
            let seq = self.append(session, stream, kind, payload).await?;
            first.get_or_insert(seq);
        }
        first.ok_or_else(|| StoreError::Backend("append_batch needs at least one event".into()))
    }

    /// Appends the first events of a stream the caller has just named (it
    /// has no events yet); numbering starts at 1. A backend may skip looking
    /// up the stream's last number; if the stream did have events, the
    /// append fails or numbers after them; it never overwrites.
    async fn start_stream(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_batch(session, stream, events).await
    }

    /// Appends to a request stream its caller wrote before (the process
    /// that runs the stream's request), for a store that can lose appends
    /// it acknowledged while that caller lives (Redis under `normal`
    /// durability: a failover takes back what the replica had not copied).
    /// The first event is numbered above `floor` (the highest number the
    /// store gave the caller on this stream) as well as after the stream's
    /// last event, so a number a client may hold is never given to another
    /// event; a stream the store lost altogether starts again with
    /// `restart`, its priming event, at 1 (where every request stream's
    /// priming event stands). The default is [`Store::append_batch`]: the
    /// other backends lose nothing acknowledged while their writer lives.
    async fn append_continued(
        &self,
        session: &str,
        stream: &str,
        floor: u64,
        restart: Bytes,
        events: Vec<(EventKind, Bytes)>,
    ) -> StoreResult<u64> {
        let _ = (floor, restart);
        self.append_batch(session, stream, events).await
    }

    /// Starts a request stream again with its priming event `prime` (at 1)
    /// if the store lost it altogether (see [`Store::append_continued`]);
    /// true if it did. The default (a store that loses nothing while the
    /// stream's writer lives) does nothing.
    async fn restart_stream(&self, session: &str, stream: &str, prime: Bytes) -> StoreResult<bool> {
        let _ = (session, stream, prime);
        Ok(false)
    }

    /// Events of one stream with `seq > after`, in order, at most `limit`.
    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>>;

    /// One line per stream of the session that has no final event yet (a
    /// standalone stream, a request still running or cut off by a crash):
    /// first and last sequence number, in name order.
    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>>;

    /// Drops the events of finished streams, of every session, named in
    /// `[from, below)` whose final event was stored before
    /// `finished_before_ms`, at most about `limit` events; returns how many.
    /// The caller names streams by time, so a stream whose first and final
    /// events were stored together may count as finished when it was named.
    /// Backends whose `delete_session` drops every log of the session, and
    /// whose logs expire with it, may keep them until then (the default).
    async fn drop_finished_streams(
        &self,
        _from: &str,
        _below: &str,
        _finished_before_ms: i64,
        _limit: usize,
    ) -> StoreResult<u64> {
        Ok(0)
    }

    /// Summary of one stream, `None` if the session has no such stream.
    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>>;

    /// Remembers how far a stream was written to a client.
    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()>;

    /// The remembered cursor, 0 if none.
    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64>;

    // ---- key/value records with revisions and expiry ------------------------

    /// Reads a record (not expired at `now_ms`).
    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>>;

    /// Writes `value` if the current revision is `expected` (`None`: the key
    /// must not exist or be expired). Returns the new revision or `None` when
    /// the comparison failed. `expires_at_ms` of `None` never expires.
    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>>;

    /// Deletes a record; true if it existed.
    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool>;

    // ---- health ---------------------------------------------------------------

    /// Answers when the backend is reachable and writable.
    async fn ping(&self) -> StoreResult<()>;

    /// Waits until everything accepted so far is committed (used on shutdown).
    async fn flush(&self) -> StoreResult<()>;

    /// A short human name for logs and `/healthz` ("memory", "sqlite:/path").
    fn describe(&self) -> String;

    /// Changes each time commits that failed (a full disk, an I/O error)
    /// succeed again, for a caller that retries a write it owes (a primed
    /// request's final response) to try at once rather than at its next
    /// backoff. `None` for backends that do not track it; callers then keep
    /// to their timer.
    fn write_recoveries(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// What a crash, a power loss and a failover of the backend can lose
    /// of what was acknowledged, where the backend can tell (`/readyz`).
    fn durability(&self) -> Option<String> {
        None
    }

    /// True when other processes (replicas) share this store: what one
    /// process holds in memory may then be stale, and the store decides.
    fn is_shared(&self) -> bool {
        false
    }

    /// Announces something to every replica listening on
    /// [`Store::remote_appends`] without appending (e.g. "a GET took over
    /// this session's standalone stream"). A no-op for single-process backends.
    async fn announce(&self, _session: &str, _stream: &str, _seq: u64) -> StoreResult<()> {
        Ok(())
    }

    /// Appends committed by any process, announced for live delivery
    /// across replicas. `None` for single-process backends.
    fn remote_appends(&self) -> Option<tokio::sync::broadcast::Receiver<RemoteAppend>> {
        None
    }
}

/// A page of [`Store::scan_sessions`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionPage {
    /// The sessions of this page, in ID order.
    pub sessions: Vec<SessionRecord>,
    /// Where the next page starts; `None` when this was the last.
    pub next: Option<String>,
}

/// "An event was committed on this stream" (from any replica).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAppend {
    /// The session.
    pub session: String,
    /// The stream of that session.
    pub stream: String,
    /// The committed event's sequence number.
    pub seq: u64,
}
