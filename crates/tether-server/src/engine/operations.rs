//! Resumable operations (seed "resume tokens for long-running operations").
//!
//! A call of a resumable tool becomes a durable operation: a record plus its
//! result chunks in the store. The work runs in its own task and continues
//! when the client disconnects. Each response carries one chunk (or, while
//! nothing new is ready after `resume_wait`, an empty pending result) and,
//! unless it is the last, `_meta.nextResumeToken`. The client repeats the
//! request with only `_meta.resumeToken` changed.
//!
//! Its resume tokens (format, MAC, request binding) are in `token.rs`; this
//! module is the operation itself: its record, chunks, work and claims.

mod token;
pub(super) mod whole;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tether_store::{Store, StoreError, now_ms};
use tokio::sync::watch;

use futures::FutureExt;
use tether_wire::meta;

use super::{Inner, RequestCtx};
use crate::app::{OperationRunner, OperationSpec, RpcError};
use token::index_of;
pub use token::{binding, parse, seal};

const OP_NAMESPACE: &str = "op";
/// The IDs of the operations each session started, newest last (for operators).
const SESSION_INDEX_NAMESPACE: &str = "op-session";
/// Operations kept in a session's index.
const MAX_INDEXED: usize = 64;
pub(super) const CHUNK_NAMESPACE: &str = "op-chunk";
/// Pause between store polls when the operation runs in another process.
const REMOTE_POLL: Duration = Duration::from_millis(100);

/// The error of an operation a restart cut off that cannot be run again.
pub const INTERRUPTED_MESSAGE: &str =
    "operation interrupted by a server restart before it finished; call the tool again without resumeToken";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum OpState {
    Running,
    Done,
    Failed,
    Interrupted,
    /// Ended by `tasks/cancel`.
    Cancelled,
}

/// One operation, also seen as a task (`engine/tasks.rs`): one record, two
/// wire projections.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct OpRecord {
    pub principal: String,
    /// The MCP session that started it (its app state is readable from the
    /// work); empty for a sessionless request.
    pub session: String,
    pub binding: String,
    pub tool: String,
    pub arguments: Map<String, Value>,
    pub restartable: bool,
    pub state: OpState,
    pub chunks: u64,
    pub error: Option<Value>,
    pub owner: String,
    /// The final chunk was delivered: every token of this operation is expired.
    pub completed: bool,
    pub expires_at_ms: i64,
    #[serde(default)]
    pub created_at_ms: i64,
    #[serde(default)]
    pub updated_at_ms: i64,
    /// The largest chunk its work should push: a page for a client that
    /// pages, the whole result (up to the cap) for the others. Records
    /// written before it was kept were all paged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_bytes: Option<usize>,
    /// A sessionless request's `_meta`, which carries what a session would
    /// hold, for the work to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_meta: Option<Map<String, Value>>,
}

/// What a new operation is: who started it, for what, answered how.
pub(super) struct NewOperation {
    /// The MCP session that started it; empty for a sessionless request.
    pub session: String,
    pub principal: String,
    pub tool: String,
    pub arguments: Map<String, Value>,
    pub binding: String,
    pub spec: OperationSpec,
    pub chunk_bytes: usize,
    pub request_meta: Option<Map<String, Value>>,
}

/// What the waiting request watches while the work runs in this process.
#[derive(Debug, Clone, Default)]
pub(super) struct Status {
    chunks: u64,
    finished: bool,
    progress: Option<(f64, Option<f64>, Option<String>)>,
}

/// Operations running in this process, at most `max_tasks` at once and
/// `max_tasks_per_principal` of one principal's.
pub(crate) struct Operations {
    live: Mutex<HashMap<String, (watch::Sender<Status>, tokio_util::sync::CancellationToken)>>,
    admission: super::quota::Admission,
    /// The operations' records in the store.
    pub(super) records: OpRecords,
}

/// The operations' durable records (and their chunks) in the store: read,
/// changed by compare-and-set, claimed from a dead owner, finished. Cheap
/// to clone: what an operation's work holds, instead of the whole engine.
#[derive(Clone)]
pub(crate) struct OpRecords {
    store: Arc<dyn Store>,
    /// This process, the owner it writes.
    instance: String,
    /// How long a record and its chunks are kept (`--operation-ttl`).
    ttl: std::time::Duration,
    /// A whole result is cut here (`--max-result-bytes`), a page there
    /// (`--result-chunk-bytes`).
    max_result_bytes: usize,
    result_chunk_bytes: usize,
}

/// The room one operation's work takes while it runs here, given back when
/// the work ends.
pub(super) type Slot = super::quota::Admitted;

/// What a resumable operation's work sees.
pub struct OperationCtx {
    records: OpRecords,
    id: String,
    principal: String,
    session: String,
    status: watch::Sender<Status>,
    resume_from: u64,
    chunk_bytes: usize,
    request_meta: Option<Arc<Map<String, Value>>>,
}

fn invalid(reason: &str) -> RpcError {
    RpcError::invalid_params(format!("invalid resumeToken: {reason}"))
}

pub(super) fn storage(e: StoreError) -> RpcError {
    RpcError::internal(format!("storage unavailable: {e}"))
}

fn encode(record: &OpRecord) -> Result<Bytes, RpcError> {
    serde_json::to_vec(record).map(Bytes::from).map_err(|e| RpcError::internal(e.to_string()))
}

pub(super) fn chunk_key(id: &str, index: u64) -> String {
    format!("{id}.{index}")
}

impl OperationCtx {
    /// Who started the operation.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The app state of the MCP session that started the operation, as
    /// stored now (empty if that session ended).
    pub async fn app_state(&self) -> Map<String, Value> {
        match self.records.store.get_session(&self.session, now_ms()).await {
            Ok(Some(record)) => serde_json::from_value::<super::SessionState>(record.state).map(|s| s.app).unwrap_or_default(),
            _ => Map::new(),
        }
    }

    /// Chunks stored before a restart: produce the result again but push
    /// only from this index on.
    pub fn resume_from(&self) -> u64 {
        self.resume_from
    }

    /// Largest chunk to push: `--result-chunk-bytes` for a client that
    /// pages, `--max-result-bytes` for one that gets the result whole.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The `_meta` of the sessionless (2026-07-28) request that started the
    /// operation, which carries what a session would hold; `None` for one
    /// started in a session.
    pub fn request_meta(&self) -> Option<&Map<String, Value>> {
        self.request_meta.as_deref()
    }

    /// Stores the next chunk of the result.
    pub async fn push(&self, chunk: rmcp::model::CallToolResult) -> Result<(), RpcError> {
        self.push_value(serde_json::to_value(chunk).map_err(|e| RpcError::internal(e.to_string()))?).await
    }

    /// Stores the next chunk of the result, a `CallToolResult` as JSON (as an
    /// upstream server answered it).
    pub async fn push_value(&self, mut value: Value) -> Result<(), RpcError> {
        let store = &self.records.store;
        let index = self.status.borrow().chunks;
        if let Some(o) = value.as_object_mut() {
            o.remove("resultType");
        }
        let expires = now_ms() + self.records.ttl.as_millis() as i64;
        let bytes = Bytes::from(value.to_string());
        store
            .kv_compare_and_set(CHUNK_NAMESPACE, &chunk_key(&self.id, index), None, bytes, Some(expires))
            .await
            .map_err(storage)?;
        self.records.update(&self.id, |r| r.chunks = r.chunks.max(index + 1)).await?;
        self.status.send_modify(|s| s.chunks = index + 1);
        Ok(())
    }

    /// Progress, forwarded as `notifications/progress` to a client that waits
    /// and asked for progress.
    pub fn progress(&self, done: f64, total: Option<f64>, message: Option<&str>) {
        self.status.send_modify(|s| s.progress = Some((done, total, message.map(str::to_owned))));
    }
}

impl OpRecords {
    pub(crate) fn new(store: Arc<dyn Store>, instance: &str, config: &crate::config::EngineConfig) -> Self {
        Self {
            store,
            instance: instance.to_owned(),
            ttl: config.operation_ttl,
            max_result_bytes: config.max_result_bytes,
            result_chunk_bytes: config.result_chunk_bytes,
        }
    }

    /// How long a record and its chunks are kept.
    pub(super) fn ttl(&self) -> std::time::Duration {
        self.ttl
    }

    /// Compare-and-set loop on an operation record.
    pub(super) async fn update(&self, id: &str, mut f: impl FnMut(&mut OpRecord)) -> Result<OpRecord, RpcError> {
        let updated = self
            .update_if(id, |r| {
                f(r);
                r.updated_at_ms = now_ms();
                true
            })
            .await?;
        updated.ok_or_else(|| RpcError::internal("operation record expired"))
    }

    /// Compare-and-set loop on an operation record that writes only when `f`
    /// says so; `None` when the record is gone or `f` declined.
    pub(super) async fn update_if(
        &self,
        id: &str,
        mut f: impl FnMut(&mut OpRecord) -> bool,
    ) -> Result<Option<OpRecord>, RpcError> {
        for _ in 0..8 {
            let Some(stored) = self.store.kv_get(OP_NAMESPACE, id, now_ms()).await.map_err(storage)? else { return Ok(None) };
            let mut record: OpRecord = serde_json::from_slice(&stored.value)
                .map_err(|e| RpcError::internal(format!("operation record unreadable: {e}")))?;
            if !f(&mut record) {
                return Ok(None);
            }
            let done = self
                .store
                .kv_compare_and_set(OP_NAMESPACE, id, Some(stored.revision), encode(&record)?, Some(record.expires_at_ms))
                .await
                .map_err(storage)?;
            if done.is_some() {
                return Ok(Some(record));
            }
        }
        Err(RpcError::internal("operation record kept changing; try again"))
    }

    /// Moves a running operation from `dead_owner` to this process; `None` if
    /// someone else moved it first (or it is no longer running).
    pub(super) async fn claim(&self, id: &str, dead_owner: &str) -> Result<Option<OpRecord>, RpcError> {
        self.update_if(id, |r| {
            let still_orphaned = r.owner == dead_owner && r.state == OpState::Running;
            if still_orphaned {
                r.owner = self.instance.clone();
            }
            still_orphaned
        })
        .await
    }

    /// Stores the record of a new operation `id` (committed when this returns).
    async fn insert(&self, id: &str, record: &OpRecord) -> Result<(), RpcError> {
        self.store
            .kv_compare_and_set(OP_NAMESPACE, id, None, encode(record)?, Some(record.expires_at_ms))
            .await
            .map_err(storage)?
            .ok_or_else(|| RpcError::internal("operation id collision"))?;
        Ok(())
    }

    /// The record of operation `id`, if stored.
    pub(super) async fn load(&self, id: &str) -> Result<Option<OpRecord>, RpcError> {
        let stored = self.store.kv_get(OP_NAMESPACE, id, now_ms()).await.map_err(storage)?;
        Ok(stored.and_then(|s| serde_json::from_slice(&s.value).ok()))
    }
}

impl Operations {
    fn status(&self, id: &str) -> Option<watch::Receiver<Status>> {
        self.live.lock().get(id).map(|(s, _)| s.subscribe())
    }

    /// Whether the operation's work runs in this process.
    pub(super) fn runs_here(&self, id: &str) -> bool {
        self.live.lock().contains_key(id)
    }

    /// Waits (at most until `deadline`) for work running here to finish;
    /// `true` if it did.
    pub(super) async fn finished_by(&self, id: &str, deadline: tokio::time::Instant) -> bool {
        let Some(mut status) = self.status(id) else { return false };
        let finished = tokio::time::timeout_at(deadline, status.wait_for(|s| s.finished)).await;
        matches!(finished, Ok(Ok(_)))
    }

    /// Stops work running here (`tasks/cancel`); the record says why.
    pub(super) fn cancel(&self, id: &str) {
        let found = self.live.lock().get(id).cloned();
        if let Some((_, cancel)) = found {
            cancel.cancel();
        }
    }

    pub(crate) fn new(admission: super::quota::Admission, records: OpRecords) -> Self {
        Self { live: Mutex::default(), admission, records }
    }

    /// Room for one more operation of `principal`'s to run here, or the
    /// refusal that names the bound it would cross (over HTTP: 429 for the
    /// principal's share, 503 for the server's ceiling).
    pub(super) fn slot(&self, principal: &str) -> Result<Slot, RpcError> {
        self.admission.admit(principal).map_err(|refused| match refused {
            super::quota::Refused::Share(limit, m) => RpcError::principal_limit_reached(limit, m),
            super::quota::Refused::Ceiling(limit, m) => RpcError::limit_reached(limit, m, Map::new()),
        })
    }

    /// Runs the operation's work in its own task, from chunk `resume_from`.
    /// A panic in the work fails the operation; a shutdown that cannot wait
    /// leaves it running in the store, to be restarted (or reported
    /// interrupted) by the next process a client asks.
    pub(super) fn start(
        &self,
        inner: Arc<Inner>,
        runner: Arc<dyn OperationRunner>,
        id: String,
        record: &OpRecord,
        slot: Slot,
    ) -> watch::Receiver<Status> {
        let (tx, rx) = watch::channel(Status { chunks: record.chunks, ..Status::default() });
        let cancel = tokio_util::sync::CancellationToken::new();
        self.live.lock().insert(id.clone(), (tx.clone(), cancel.clone()));
        let ctx = OperationCtx {
            records: self.records.clone(),
            id: id.clone(),
            principal: record.principal.clone(),
            session: record.session.clone(),
            status: tx,
            resume_from: record.chunks,
            chunk_bytes: record.chunk_bytes.unwrap_or(inner.config.result_chunk_bytes),
            request_meta: record.request_meta.clone().map(Arc::new),
        };
        let (tool, arguments) = (record.tool.clone(), record.arguments.clone());
        let tracker = inner.clone();
        tracker.life.spawn(async move {
            let _slot = slot;
            let status = ctx.status.clone();
            let work = std::panic::AssertUnwindSafe(runner.run_operation(ctx, &tool, arguments)).catch_unwind();
            let outcome = tokio::select! {
                outcome = work => outcome.unwrap_or_else(|_| {
                    tracing::error!(operation = %id, %tool, "the application panicked running an operation");
                    Err(RpcError::internal(super::PANICKED_MESSAGE))
                }),
                _ = inner.life.interrupt.cancelled() => return,
                // The record already says cancelled.
                _ = cancel.cancelled() => Err(RpcError::cancelled()),
            };
            // A cancelled operation stays cancelled, whatever its work did.
            let update = inner
                .operations
                .records
                .update_if(&id, |r| {
                    if r.state != OpState::Running {
                        return false;
                    }
                    match &outcome {
                        Ok(()) => r.state = OpState::Done,
                        Err(e) => {
                            r.state = OpState::Failed;
                            r.error = Some(e.to_object());
                        }
                    }
                    r.updated_at_ms = now_ms();
                    true
                })
                .await;
            if let Err(e) = update {
                tracing::error!(operation = %id, error = %e.message, "could not record the end of an operation");
            }
            status.send_modify(|s| s.finished = true);
            inner.operations.live.lock().remove(&id);
        });
        rx
    }
}

/// Runs one `tools/call` of a resumable tool for a client that pages (a
/// new call or a resumed one): one chunk per answer.
pub(super) async fn call(
    ctx: &RequestCtx,
    runner: Arc<dyn OperationRunner>,
    new: NewOperation,
    token: Option<&str>,
) -> Result<Value, RpcError> {
    let inner = ctx.inner().clone();
    let key = inner.key.get(inner.store.as_ref()).await.map_err(storage)?;

    let (id, index) = match token {
        None => {
            let (raw, _) = create(&inner, runner, new).await?;
            (raw, 0)
        }
        Some(token) => {
            let (raw, presented) = parse(token).ok_or_else(|| invalid("unknown token"))?;
            let id = hex::encode(raw);
            let record = inner.operations.records.load(&id).await?.ok_or_else(|| invalid("unknown or expired token"))?;
            let index = index_of(&key, &raw, &presented, record.chunks).ok_or_else(|| invalid("unknown token"))?;
            if record.principal != new.principal || record.binding != new.binding {
                return Err(invalid(
                    "it does not match this request (resend the original request, changing only _meta.resumeToken)",
                ));
            }
            if record.completed {
                return Err(invalid("expired: the operation completed"));
            }
            if record.expires_at_ms <= now_ms() {
                return Err(invalid("expired"));
            }
            if orphaned(&inner, &id, &record).await {
                // Its process died. Restartable work continues from its cursor; other work says so.
                if record.restartable {
                    // Only the resume that moves the record from the dead
                    // owner to this process restarts the work: two replicas,
                    // or two resumes here, must not both run it.
                    // Without room for it here, it stays orphaned for a later resume to restart.
                    if let Ok(slot) = inner.operations.slot(&record.principal)
                        && let Some(claimed) = inner.operations.records.claim(&id, &record.owner).await?
                    {
                        tracing::info!(operation = %id, from_chunk = claimed.chunks, "restarting an interrupted operation");
                        inner.operations.start(inner.clone(), runner, id.clone(), &claimed, slot);
                    }
                } else {
                    inner
                        .operations
                        .records
                        .update(&id, |r| {
                            r.state = OpState::Interrupted;
                            r.completed = true;
                        })
                        .await?;
                    return Ok(json!({"content": [{"type": "text", "text": INTERRUPTED_MESSAGE}], "isError": true}));
                }
            }
            (raw, index)
        }
    };
    respond(ctx, &inner, &key, &id, index).await
}

/// Stores a new operation's record (committed before this returns: a
/// `tasks/get` on any replica finds it) and starts its work here.
pub(super) async fn create(
    inner: &Arc<Inner>,
    runner: Arc<dyn OperationRunner>,
    new: NewOperation,
) -> Result<([u8; 16], OpRecord), RpcError> {
    let NewOperation { session, principal, tool, arguments, binding, spec, chunk_bytes, request_meta } = new;
    // Refused before anything is stored: a refusal leaves no task behind.
    let slot = inner.operations.slot(&principal)?;
    let raw: [u8; 16] = rand::random();
    let id = hex::encode(raw);
    let now = now_ms();
    let record = OpRecord {
        session,
        principal,
        binding,
        tool,
        arguments,
        restartable: spec.restartable,
        state: OpState::Running,
        chunks: 0,
        error: None,
        owner: inner.operations.records.instance.clone(),
        completed: false,
        expires_at_ms: now + inner.operations.records.ttl.as_millis() as i64,
        created_at_ms: now,
        updated_at_ms: now,
        chunk_bytes: Some(chunk_bytes),
        request_meta,
    };
    inner.operations.records.insert(&id, &record).await?;
    if !record.session.is_empty() {
        inner.operations.records.index_for_session(&record.session, &id, record.expires_at_ms).await;
    }
    inner.operations.start(inner.clone(), runner, id, &record, slot);
    Ok((raw, record))
}

impl OpRecords {
    /// Notes operation `id` in its session's index. The index serves operators
    /// only: a failure to write it is logged, never the operation's.
    async fn index_for_session(&self, session: &str, id: &str, expires_at_ms: i64) {
        for _ in 0..8 {
            let current = match self.store.kv_get(SESSION_INDEX_NAMESPACE, session, now_ms()).await {
                Ok(current) => current,
                Err(e) => {
                    tracing::warn!(%session, operation = %id, error = %e, "could not index an operation under its session");
                    return;
                }
            };
            let (mut ids, expected) = match current {
                Some(v) => (serde_json::from_slice::<Vec<String>>(&v.value).unwrap_or_default(), Some(v.revision)),
                None => (Vec::new(), None),
            };
            ids.push(id.to_owned());
            let excess = ids.len().saturating_sub(MAX_INDEXED);
            ids.drain(..excess);
            let Ok(bytes) = serde_json::to_vec(&ids) else { return };
            match self
                .store
                .kv_compare_and_set(SESSION_INDEX_NAMESPACE, session, expected, Bytes::from(bytes), Some(expires_at_ms))
                .await
            {
                Ok(Some(_)) => return,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(%session, operation = %id, error = %e, "could not index an operation under its session");
                    return;
                }
            }
        }
    }

    /// The final answer went out: every token of the operation is now expired,
    /// and its chunks are freed.
    pub(super) async fn finish(&self, id: &str, chunks: u64) {
        if let Err(e) = self.update(id, |r| r.completed = true).await {
            tracing::warn!(operation = %id, error = %e.message, "could not mark an operation completed");
        }
        for i in 0..chunks {
            let _ = self.store.kv_delete(CHUNK_NAMESPACE, &chunk_key(id, i)).await;
        }
    }
}

/// The operations session `session` started that are still stored, oldest
/// first, as operators see them (each is also a task under its ID);
/// `running_here` says whether this process runs one's work.
pub async fn of_session(store: &dyn Store, session: &str, running_here: impl Fn(&str) -> bool) -> Result<Vec<Value>, StoreError> {
    let Some(index) = store.kv_get(SESSION_INDEX_NAMESPACE, session, now_ms()).await? else {
        return Ok(Vec::new());
    };
    let ids: Vec<String> = serde_json::from_slice(&index.value).unwrap_or_default();
    let mut found = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(stored) = store.kv_get(OP_NAMESPACE, &id, now_ms()).await? else { continue };
        let Ok(r) = serde_json::from_slice::<OpRecord>(&stored.value) else { continue };
        found.push(json!({
            "id": id,
            "tool": r.tool,
            "state": r.state,
            "chunks": r.chunks,
            "restartable": r.restartable,
            "running_here": running_here(&id),
            "created_at_ms": r.created_at_ms,
            "updated_at_ms": r.updated_at_ms,
            "expires_at_ms": r.expires_at_ms,
        }));
    }
    Ok(found)
}

/// Whether a running operation's process is gone (it runs nowhere now).
pub(super) async fn orphaned(inner: &Inner, id: &str, record: &OpRecord) -> bool {
    record.state == OpState::Running
        && !inner.operations.runs_here(id)
        && record.owner != inner.instance
        && !(inner.store.is_shared() && inner.replicas.is_alive(&record.owner).await.unwrap_or(true))
}

/// Forwards the work's progress to the waiting request when it changed.
async fn forward_progress(
    ctx: &RequestCtx,
    progress: &Option<(f64, Option<f64>, Option<String>)>,
    last: &mut Option<(f64, Option<f64>, Option<String>)>,
) {
    if progress.is_some() && progress != last {
        if let Some((done, total, message)) = progress {
            let _ = ctx.progress(*done, *total, message.as_deref()).await;
        }
        last.clone_from(progress);
    }
}

/// Waits until the work of operation `id`, running here, has finished,
/// forwarding its progress to the waiting request; at most the operation's
/// lifetime (`operation_ttl`), after which its record is gone anyway.
/// Returns at once if it does not run here (it finished already).
pub(super) async fn wait_finished(ctx: &RequestCtx, inner: &Inner, id: &str) {
    let Some(mut status) = inner.operations.status(id) else { return };
    let deadline = tokio::time::Instant::now() + inner.config.operation_ttl;
    let mut last_progress = None;
    loop {
        let (finished, progress) = {
            let s = status.borrow_and_update();
            (s.finished, s.progress.clone())
        };
        forward_progress(ctx, &progress, &mut last_progress).await;
        if finished {
            return;
        }
        match tokio::time::timeout_at(deadline, status.changed()).await {
            Ok(Ok(())) => continue,
            // The work's task is gone (the process is being interrupted) or the lifetime is over.
            _ => return,
        }
    }
}

/// Waits (bounded) for chunk `index`, then answers with it or a pending result.
async fn respond(ctx: &RequestCtx, inner: &Arc<Inner>, key: &[u8; 32], raw: &[u8; 16], index: u64) -> Result<Value, RpcError> {
    let id = hex::encode(raw);
    let deadline = tokio::time::Instant::now() + inner.config.resume_wait;
    if let Some(mut status) = inner.operations.status(&id) {
        let mut last_progress = None;
        loop {
            let (ready, progress) = {
                let s = status.borrow_and_update();
                // Wait for the chunk after this one too (or the end), so the
                // answer can say whether this chunk is the last.
                (s.chunks > index + 1 || s.finished, s.progress.clone())
            };
            forward_progress(ctx, &progress, &mut last_progress).await;
            if ready {
                break;
            }
            match tokio::time::timeout_at(deadline, status.changed()).await {
                Ok(Ok(())) => continue,
                _ => break,
            }
        }
    } else {
        // Running elsewhere (another replica) or already over: poll the record.
        while tokio::time::Instant::now() < deadline {
            match inner.operations.records.load(&id).await? {
                Some(r) if r.state == OpState::Running && r.chunks <= index + 1 => tokio::time::sleep(REMOTE_POLL).await,
                _ => break,
            }
        }
    }

    let record = inner.operations.records.load(&id).await?.ok_or_else(|| invalid("unknown or expired token"))?;
    if record.state == OpState::Cancelled {
        inner.operations.records.finish(&id, record.chunks).await;
        return Err(RpcError::cancelled());
    }
    if record.state == OpState::Failed {
        inner.operations.records.finish(&id, record.chunks).await;
        let e = record.error.unwrap_or(Value::Null);
        return Err(RpcError::from_object(&e));
    }
    if record.chunks > index {
        let stored = inner
            .store
            .kv_get(CHUNK_NAMESPACE, &chunk_key(&id, index), now_ms())
            .await
            .map_err(storage)?
            .ok_or_else(|| invalid("expired: the result was dropped"))?;
        let mut chunk: Value = serde_json::from_slice(&stored.value).map_err(|e| RpcError::internal(e.to_string()))?;
        let last = record.state == OpState::Done && index + 1 == record.chunks;
        if last {
            inner.operations.records.finish(&id, record.chunks).await;
        } else {
            set_meta(&mut chunk, meta::NEXT_RESUME_TOKEN, json!(seal(key, raw, index + 1)));
            set_meta(&mut chunk, meta::TASK_ID, json!(id));
        }
        return Ok(chunk);
    }
    if record.state == OpState::Done {
        // Finished without (more) chunks: an empty final result.
        inner.operations.records.finish(&id, record.chunks).await;
        return Ok(json!({"content": []}));
    }
    // Not ready within the wait budget: same point of progress, same token.
    let mut pending = json!({"content": [{"type": "text", "text": "still working; call again with _meta.resumeToken"}]});
    set_meta(&mut pending, meta::NEXT_RESUME_TOKEN, json!(seal(key, raw, index)));
    set_meta(&mut pending, meta::PENDING, json!(true));
    set_meta(&mut pending, meta::TASK_ID, json!(id));
    Ok(pending)
}

fn set_meta(result: &mut Value, key: &str, value: Value) {
    if let Some(obj) = result.as_object_mut() {
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert(key.to_owned(), value);
        }
    }
}
