//! What changes when several replicas share one store (Redis).
//!
//! - Live delivery: appends by other replicas arrive as store announcements
//!   and nudge local pumps, which read the events from the store.
//! - Freshness: a session's durable state is re-read on every request, since
//!   another replica may have changed it.
//! - Ownership: each replica keeps a lease record alive (`replica_lease`); a
//!   request stream is closed as "interrupted" only when its owner's lease
//!   has lapsed.
//! - A client waiting here on a stream another replica owns (and runs, or
//!   ran) asks that replica to look at it: if it is not running the request
//!   any more and the store has no final response (a failover lost it), the
//!   owner ends it (see `running.rs`). The ask is repeated on every
//!   keep-alive of the waiting stream, since pub/sub keeps nothing.
//! - A client resuming a request stream the store does not have (a
//!   failover took it back altogether, with its priming event, which names
//!   its owner) asks every replica: the one that runs its request starts it
//!   again with its priming event, the one that ended it ends it again with
//!   an error saying the response was lost (`recovery.rs`), and the client
//!   resumes it; if none claims it within [`LOST_STREAM_WAIT`], the resume
//!   is refused as a stream nobody knows.
//! - Answers to server-to-client requests may be POSTed to any replica: the
//!   one that receives it stores it and announces it; the one that waits
//!   picks it up when the announcement arrives (and polls, slowly, in case
//!   an announcement was lost).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tether_store::{Store, StoreError, StreamSummary, now_ms};
use tokio::sync::{broadcast, oneshot};

use super::live::StreamKind;
use super::session::{ClientAnswer, Session, SessionState};
use super::{EngineError, Inner};

const LEASE_NAMESPACE: &str = "lease";
const ANSWER_NAMESPACE: &str = "answer";
const STANDALONE_NAMESPACE: &str = "standalone-live";
/// Announcement "stream" name of a standalone takeover, followed by the instance.
const TAKEOVER: &str = "~takeover.";
/// Announcement "stream" name of a stored answer, followed by the request key.
const ANSWERED: &str = "~answer.";
/// Announcement "stream" name of an ask to look at a request stream,
/// followed by `STREAM.OWNER` (neither holds a dot; no owner: every replica).
const CHECK: &str = "~check.";
/// How long a client resuming a stream the store does not have waits for a
/// replica to claim it (asked again every [`LOST_STREAM_ASK`], since
/// pub/sub keeps nothing).
pub(crate) const LOST_STREAM_WAIT: Duration = Duration::from_secs(5);
const LOST_STREAM_ASK: Duration = Duration::from_secs(1);
/// Fallback only: answers are announced. Slow, so that many pending
/// requests do not turn into a stream of store reads.
const ANSWER_POLL: Duration = Duration::from_secs(2);
const ANSWER_TTL: Duration = Duration::from_secs(600);

/// This replica's records in the shared store and its asks to the others:
/// its lease, its hold of standalone streams, stored answers,
/// announcements. Cheap to clone: what a task that only touches these
/// needs, instead of the whole engine.
#[derive(Clone)]
pub(crate) struct Replicas {
    store: Arc<dyn Store>,
    instance: Arc<str>,
    lease: Duration,
    keepalive: Duration,
    session_ttl: Duration,
}

/// Starts the announcement listener and the lease heartbeat.
pub(crate) fn start(inner: &Arc<Inner>) {
    if let Some(mut appends) = inner.store.remote_appends() {
        let weak = Arc::downgrade(inner);
        let hub = inner.hub.clone();
        let shutdown = inner.life.shutdown.clone();
        inner.life.spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    received = appends.recv() => match received {
                        Ok(a) => match a.stream.strip_prefix(TAKEOVER) {
                            Some(by) => {
                                let Some(inner) = weak.upgrade() else { return };
                                if by != inner.instance && inner.cached(&a.session).is_some() {
                                    taken_over(inner, a.session.clone());
                                }
                            }
                            None => match a.stream.strip_prefix(ANSWERED) {
                                Some(request) => {
                                    let Some(inner) = weak.upgrade() else { return };
                                    deliver_stored_answer(inner, a.session.clone(), request.to_owned());
                                }
                                None => match a.stream.strip_prefix(CHECK).and_then(|c| c.split_once('.')) {
                                    Some((stream, owner)) => {
                                        let Some(inner) = weak.upgrade() else { return };
                                        let anyone = owner.is_empty();
                                        if owner == inner.instance || (anyone && inner.running.knows(stream)) {
                                            check_own_stream(inner, a.session.clone(), stream.to_owned(), anyone);
                                        }
                                    }
                                    None => hub.nudge(&a.session, &a.stream, a.seq),
                                },
                            },
                        },
                        Err(broadcast::error::RecvError::Lagged(_)) => hub.nudge_all(),
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
    }
    // Held weakly: a dropped engine's heartbeat stops with it.
    let weak = Arc::downgrade(inner);
    let shutdown = inner.life.shutdown.clone();
    let lease = inner.replicas.lease;
    inner.life.spawn(async move {
        // Renew three times per lease, so one slow round does not kill it.
        // The lease outlives the shutdown signal: requests still draining
        // are this replica's, and `release_lease` ends it after the drain.
        let mut tick = tokio::time::interval(lease / 3);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(inner) = weak.upgrade() else { return };
            if let Err(e) = inner.replicas.renew_lease().await {
                tracing::warn!(error = %e, "could not renew this replica's lease");
            }
        }
    });
}

/// A request stream of `session` that the store does not have, which a
/// client resumes: asks every replica to claim it ([`Replicas::ask_anyone`]; this one
/// first) and waits up to [`LOST_STREAM_WAIT`] for it to be stored again.
/// Its summary then, `None` if nobody claimed it.
pub(crate) async fn find_lost_stream(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
    stream: &str,
) -> Result<Option<StreamSummary>, EngineError> {
    if !inner.revive_own(session, stream).await? {
        // Subscribed before asking: the claim's append nudges it.
        let mut sub = inner.hub.subscribe(&session.id, stream, StreamKind::Request);
        let deadline = tokio::time::Instant::now() + LOST_STREAM_WAIT;
        while tokio::time::Instant::now() < deadline {
            inner.replicas.ask_anyone(&session.id, stream).await;
            let next_ask = (tokio::time::Instant::now() + LOST_STREAM_ASK).min(deadline);
            tokio::select! {
                _ = sub.rx.recv() => break,
                _ = tokio::time::sleep_until(next_ask) => {
                    if inner.store.stream(&session.id, stream).await?.is_some() {
                        break;
                    }
                }
                _ = inner.life.shutdown.cancelled() => break,
            }
        }
    }
    Ok(inner.store.stream(&session.id, stream).await?)
}

/// Another replica asked this one, the owner of `stream`, to look at it,
/// or asked every replica (`lost`: the store does not have the stream): a
/// request this replica no longer runs whose final response the store does
/// not have is ended, a stream the store lost while its request runs here
/// is started again ([`Inner::revive_own`], [`Inner::close_if_orphaned`]).
fn check_own_stream(inner: Arc<Inner>, session: String, stream: String, lost: bool) {
    let tracker = inner.clone();
    tracker.life.spawn(async move {
        let checked = match inner.load(&session).await {
            // A lost stream: what this replica knows of it (it may run it).
            Ok(Some(loaded)) if lost => inner.revive_own(&loaded, &stream).await.map(|_| ()),
            Ok(Some(loaded)) => inner.close_if_orphaned(&loaded, &stream, super::recovery::AskOwner::No).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            tracing::warn!(%session, %stream, error = %e, "could not look at a request stream another replica asked about");
        }
    });
}

/// Another replica announced that a GET there took the session's
/// standalone stream: ours ends, unless the store says this replica holds
/// it now (a GET here came after that one, and its announcement arrived
/// late: pub/sub orders nothing across a cluster's nodes).
fn taken_over(inner: Arc<Inner>, session: String) {
    let task = inner.clone();
    inner.life.spawn(async move {
        if task.replicas.holds_standalone(&session).await {
            return;
        }
        if let Some(session) = task.cached(&session) {
            session.standalone_owner.send_modify(|g| *g += 1);
        }
    });
}

/// Attempts of a GET to take the standalone stream's record from the
/// keep-alives of the replica that held it (each may renew it meanwhile).
const TAKE_ATTEMPTS: usize = 8;

fn answer_key(session: &str, request: &str) -> String {
    format!("{session}/{request}")
}

/// Takes a stored answer and hands it to the request waiting here, if one does.
fn deliver_stored_answer(inner: Arc<Inner>, session: String, request: String) {
    let Some(cached) = inner.cached(&session) else { return };
    let waiting = cached.pending.lock().contains_key(&request);
    if !waiting {
        return;
    }
    let tracker = inner.clone();
    tracker.life.spawn(async move {
        if let Some(answer) = inner.replicas.take_answer(&session, &request).await
            && let Some(tx) = cached.pending.lock().remove(&request)
        {
            let _ = tx.send(answer);
        }
    });
}

impl Replicas {
    pub(crate) fn new(store: Arc<dyn Store>, instance: &str, config: &super::EngineConfig) -> Self {
        Self {
            store,
            instance: instance.into(),
            lease: config.replica_lease,
            keepalive: config.keepalive,
            session_ttl: config.session_ttl,
        }
    }

    /// This replica stops: nothing of it runs any more (after the drain).
    pub(crate) async fn release_lease(&self) {
        if let Err(e) = self.store.kv_delete(LEASE_NAMESPACE, &self.instance).await {
            tracing::warn!(error = %e, "could not release this replica's lease; other replicas wait for it to lapse");
        }
    }

    async fn renew_lease(&self) -> Result<(), StoreError> {
        let expires = Some(now_ms() + self.lease.as_millis() as i64);
        let current = self.store.kv_get(LEASE_NAMESPACE, &self.instance, now_ms()).await?.map(|v| v.revision);
        self.store.kv_compare_and_set(LEASE_NAMESPACE, &self.instance, current, Bytes::from_static(b"1"), expires).await?;
        Ok(())
    }

    /// Whether replica `instance` renewed its lease recently.
    pub(crate) async fn is_alive(&self, instance: &str) -> Result<bool, EngineError> {
        if instance.is_empty() {
            return Ok(false);
        }
        Ok(self.store.kv_get(LEASE_NAMESPACE, instance, now_ms()).await?.is_some())
    }

    /// Asks the replica that owns `stream` (alive, by its lease) to look at it:
    /// see [`check_own_stream`].
    pub(crate) async fn ask_to_check(&self, session: &str, stream: &str, owner: &str) {
        if let Err(e) = self.store.announce(session, &format!("{CHECK}{stream}.{owner}"), 0).await {
            tracing::warn!(%session, %stream, error = %e, "could not ask a request's replica to look at it");
        }
    }

    /// Asks every replica whether it runs or ran the request of `stream`,
    /// which the store does not have: see [`check_own_stream`].
    pub(crate) async fn ask_anyone(&self, session: &str, stream: &str) {
        self.ask_to_check(session, stream, "").await;
    }

    /// A GET opened the standalone stream here (and holds it in the store
    /// already): other replicas end theirs.
    pub(crate) async fn announce_takeover(&self, session: &str, generation: u64) {
        let stream = format!("{TAKEOVER}{}", self.instance);
        if let Err(e) = self.store.announce(session, &stream, generation).await {
            tracing::warn!(%session, error = %e, "could not announce a standalone takeover");
        }
    }

    /// Writes that this replica holds the session's standalone stream if the
    /// record is still at `seen` (its revision as read; `None`: no record).
    /// Ok(false) when it changed meanwhile.
    async fn hold_standalone(&self, session: &str, seen: Option<u64>) -> Result<bool, StoreError> {
        // Renewed on every keep-alive; it lapses by itself if the replica dies.
        let expires = Some(now_ms() + 2 * self.keepalive.as_millis() as i64);
        let value = Bytes::from(self.instance.as_bytes().to_vec());
        Ok(self.store.kv_compare_and_set(STANDALONE_NAMESPACE, session, seen, value, expires).await?.is_some())
    }

    /// A GET here took the session's standalone stream: the record names this
    /// replica, whoever held it (a renewal of the old holder racing the write
    /// is tried again).
    pub(crate) async fn take_standalone(&self, session: &str) {
        for _ in 0..TAKE_ATTEMPTS {
            let seen = self.store.kv_get(STANDALONE_NAMESPACE, session, now_ms()).await.ok().flatten().map(|v| v.revision);
            match self.hold_standalone(session, seen).await {
                Ok(true) => return,
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(%session, error = %e, "could not record this replica's hold of a standalone stream");
                    return;
                }
            }
        }
        tracing::warn!(%session, "could not record this replica's hold of a standalone stream; the replica that held it ends its stream at its next keep-alive");
    }

    /// Renews this replica's hold of the session's standalone stream on a
    /// keep-alive; false when another replica's GET holds it now (its
    /// announcement may have been lost: pub/sub keeps nothing), so this
    /// stream ends instead of taking the hold back. The renewal is written
    /// only over the record it read, so a GET elsewhere that took the stream
    /// meanwhile keeps it.
    pub(crate) async fn renew_standalone(&self, session: &str) -> bool {
        let held = self.store.kv_get(STANDALONE_NAMESPACE, session, now_ms()).await.ok().flatten();
        if held.as_ref().is_some_and(|v| v.value.as_ref() != self.instance.as_bytes()) {
            return false;
        }
        // A store that does not answer keeps the stream: the hold lapses by itself.
        self.hold_standalone(session, held.map(|v| v.revision)).await.unwrap_or(true)
    }

    /// The standalone stream is no longer held here (unless another replica took it).
    pub(crate) async fn unmark_standalone(&self, session: &str) {
        if let Ok(Some(v)) = self.store.kv_get(STANDALONE_NAMESPACE, session, now_ms()).await
            && v.value.as_ref() == self.instance.as_bytes()
        {
            let _ = self.store.kv_delete(STANDALONE_NAMESPACE, session).await;
        }
    }

    /// Whether the store says this replica holds the session's standalone stream.
    async fn holds_standalone(&self, session: &str) -> bool {
        let held = self.store.kv_get(STANDALONE_NAMESPACE, session, now_ms()).await.ok().flatten();
        held.is_some_and(|v| v.value.as_ref() == self.instance.as_bytes())
    }

    /// Whether some replica holds a live standalone GET of this session.
    pub(crate) async fn standalone_live_anywhere(&self, session: &str) -> bool {
        matches!(self.store.kv_get(STANDALONE_NAMESPACE, session, now_ms()).await, Ok(Some(_)))
    }

    /// Brings the cached session up to date with the store: one small read of
    /// its revision and expiry, and the state only when another replica changed
    /// it. False if the session is gone.
    pub(crate) async fn refresh(&self, session: &Session) -> Result<bool, EngineError> {
        let now = now_ms();
        let Some(stamp) = self.store.session_stamp(&session.id, now).await? else { return Ok(false) };
        if stamp.revision > session.durable.lock().await.revision {
            let Some(record) = self.store.get_session(&session.id, now).await? else { return Ok(false) };
            let mut durable = session.durable.lock().await;
            if record.revision > durable.revision
                && let Ok(state) = serde_json::from_value::<SessionState>(record.state)
            {
                session.set_caller_from(&state);
                durable.state = state;
                durable.revision = record.revision;
            }
        }
        // Activity on other replicas counts.
        let ttl = self.session_ttl.as_millis() as i64;
        let seen_elsewhere = stamp.expires_at_ms - ttl - ttl / 10;
        session.last_seen.fetch_max(seen_elsewhere, std::sync::atomic::Ordering::Relaxed);
        session.expires_persisted.fetch_max(stamp.expires_at_ms, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// Stores a client's answer for the replica whose request waits for it,
    /// and announces it so that replica picks it up at once.
    pub(crate) async fn post_answer(&self, session: &str, request: &str, outcome: ClientAnswer) -> Result<(), EngineError> {
        let body = match outcome {
            Ok(result) => serde_json::json!({"result": result}),
            Err(error) => serde_json::json!({"error": error}),
        };
        let expires = Some(now_ms() + ANSWER_TTL.as_millis() as i64);
        self.store
            .kv_compare_and_set(ANSWER_NAMESPACE, &answer_key(session, request), None, Bytes::from(body.to_string()), expires)
            .await?;
        // An announcement is one line per field; a key with a newline waits for the poll.
        if !request.contains('\n')
            && let Err(e) = self.store.announce(session, &format!("{ANSWERED}{request}"), 0).await
        {
            tracing::debug!(%session, error = %e, "could not announce an answer; the waiting replica will poll for it");
        }
        Ok(())
    }

    /// Reads and removes a stored answer.
    async fn take_answer(&self, session: &str, request: &str) -> Option<ClientAnswer> {
        let key = answer_key(session, request);
        let stored = self.store.kv_get(ANSWER_NAMESPACE, &key, now_ms()).await.ok()??;
        let _ = self.store.kv_delete(ANSWER_NAMESPACE, &key).await;
        let body: Value = serde_json::from_slice(&stored.value).unwrap_or(Value::Null);
        Some(match body.get("result") {
            Some(r) => Ok(r.clone()),
            None => Err(body.get("error").cloned().unwrap_or(Value::Null)),
        })
    }

    /// The answer to a server-to-client request: delivered locally, or stored by
    /// another replica.
    pub(crate) async fn await_answer(
        &self,
        session: &str,
        request: &str,
        mut local: oneshot::Receiver<ClientAnswer>,
    ) -> ClientAnswer {
        loop {
            tokio::select! {
                answer = &mut local => {
                    return answer.unwrap_or_else(|_| Err(tether_wire::RpcError::internal("session ended before the client answered").to_object()));
                }
                _ = tokio::time::sleep(ANSWER_POLL) => {
                    if let Some(answer) = self.take_answer(session, request).await {
                        return answer;
                    }
                }
            }
        }
    }
}
