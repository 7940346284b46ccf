//! Sessionless (2026-07-28) clients of a session-era upstream: every stdio
//! server and most HTTP servers deployed today.
//!
//! Such a client has no session to hold an upstream connection under, so the
//! gateway keeps a small pool of upstream connections per principal (never
//! shared between principals: an upstream's state, its roots or log level,
//! belongs to one client). A request holds one connection for as long as it
//! runs, so whatever the upstream sends meanwhile (progress, log messages,
//! its own requests) is that request's, with no guessing.
//!
//! The upstream's requests (`roots/list`, `sampling/createMessage`,
//! `elicitation/create`) become MRTR rounds: the round ends
//! `input_required` (the upstream call is cancelled), the client repeats the
//! request with its answers, the call runs again and meets the same asks,
//! in the same order, with their answers (`tether_server`'s `engine/mrtr`).
//!
//! A tool named in the upstream's `task_tools` runs as a durable operation
//! that a client which declared the Tasks extension follows as a task; its
//! record is the engine's, so any replica answers `tasks/get`. Such a task
//! cannot ask its client anything: the upstream's requests are refused.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tether_server::{OperationCtx, RawResult, RequestCtx, RpcError};
use tether_wire::{meta, revision};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::link;
use futures::future::BoxFuture;

use crate::upstream::{PeerMessage, PeerSink, Started, Upstream};

/// What a principal's pooled connections are started for, as logs and the
/// keeper name them: a child an earlier engine started for the same
/// principal is taken over by this name (see `crate::stdio::kept`).
pub(crate) fn pool_session(principal: &str) -> String {
    format!("(sessionless {principal})")
}

/// How often idle pooled connections are looked for.
const POOL_SWEEP: Duration = Duration::from_secs(5);

/// The `_meta` namespace of the 2026-07-28 per-request declarations, which a
/// session-era upstream got once, in `initialize`.
const SPEC_META_PREFIX: &str = "io.modelcontextprotocol/";

/// What the gateway tells a session-era upstream about the client in the
/// `initialize` of a pooled connection: every capability a sessionless
/// client may bring (each request says whether its client really has it;
/// an ask of one it lacks is refused to the upstream with `-32021`).
pub(crate) fn initialize_params() -> Value {
    json!({
        "protocolVersion": revision::LATEST,
        "capabilities": {"roots": {"listChanged": false}, "sampling": {}, "elicitation": {}},
        "clientInfo": {"name": "tether-gateway", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// What the upstream's `initialize` result says, as `server/discover` says
/// it. Lists and resources that change cannot be followed by a sessionless
/// client through the gateway yet (no `subscriptions/listen` relay), so
/// `listChanged` and `subscribe` are not claimed.
pub(crate) fn describe(initialize_result: &Map<String, Value>, has_task_tools: bool) -> Map<String, Value> {
    let mut capabilities = initialize_result.get("capabilities").and_then(Value::as_object).cloned().unwrap_or_default();
    for (_, capability) in capabilities.iter_mut() {
        if let Value::Object(c) = capability {
            c.remove("listChanged");
            c.remove("subscribe");
        }
    }
    if has_task_tools {
        capabilities.insert("extensions".into(), json!({(meta::TASKS_EXTENSION): {}}));
    }
    let mut described = Map::new();
    described.insert("capabilities".into(), Value::Object(capabilities));
    for key in ["serverInfo", "instructions"] {
        if let Some(v) = initialize_result.get(key) {
            described.insert(key.into(), v.clone());
        }
    }
    described
}

/// A sessionless request's params as a session-era upstream should see
/// them: without the per-request declarations and tether's own keys.
pub(crate) fn upstream_params(mut params: Map<String, Value>) -> Map<String, Value> {
    if let Some(Value::Object(m)) = params.get_mut("_meta") {
        m.retain(|k, _| !k.starts_with(SPEC_META_PREFIX) && !k.starts_with(meta::TETHER_PREFIX));
        if m.is_empty() {
            params.remove("_meta");
        }
    }
    params
}

/// Upstream connections for sessionless clients, idle ones by principal.
pub(crate) struct Pool {
    idle: Mutex<HashMap<String, Vec<Arc<Pooled>>>>,
    /// One permit per open pooled connection (idle or held).
    open: Arc<Semaphore>,
    max: usize,
    /// The sweep of idle connections, stopped by [`Pool::close_all`] or drop.
    sweeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.get_mut().take() {
            sweeper.abort();
        }
    }
}

/// One upstream connection of the pool.
pub(crate) struct Pooled {
    pub(crate) upstream: Arc<dyn Upstream>,
    holder: Mutex<Option<Holder>>,
    /// The log level last set upstream on this connection.
    log_level: Mutex<Option<String>>,
    idle_since: Mutex<Instant>,
    _open: OwnedSemaphorePermit,
}

/// Who holds a pooled connection now.
#[derive(Clone)]
enum Holder {
    /// A sessionless request; `asked` fires when it asked its client
    /// something that needs another round.
    Request { ctx: RequestCtx, asked: CancellationToken },
    /// A task's work (cannot ask its client anything).
    Task(Arc<OperationCtx>),
}

/// A pooled connection held by one request or task; back to the pool (or
/// closed, if it died) when dropped.
pub(crate) struct Held {
    pub(crate) pooled: Arc<Pooled>,
    pool: Arc<Pool>,
    principal: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        *self.pooled.holder.lock() = None;
        if !self.pooled.upstream.is_alive() {
            return;
        }
        *self.pooled.idle_since.lock() = Instant::now();
        self.pool.idle.lock().entry(self.principal.clone()).or_default().push(self.pooled.clone());
    }
}

impl Held {
    /// Sets the log level upstream when this request wants another one than
    /// the connection has (the engine filters what reaches the client).
    /// An upstream without logging refuses; the request goes on without.
    pub(crate) async fn want_log_level(&self, level: Option<&str>) {
        let Some(level) = level else { return };
        {
            let mut current = self.pooled.log_level.lock();
            if current.as_deref() == Some(level) {
                return;
            }
            *current = Some(level.to_owned());
        }
        let set = self.pooled.upstream.request("logging/setLevel", Some(json!({"level": level}))).await;
        if let Err(e) = set {
            tracing::debug!(level, error = %e, "the upstream did not take a log level");
        }
    }

    /// Sends a request upstream for the sessionless request holding this
    /// connection, ending early (and cancelling it upstream) when the request
    /// asked its client something that needs another round; what the
    /// upstream sent before its answer reaches the client first.
    pub(crate) async fn request(&self, method: &str, params: Option<Value>) -> Result<RawResult, RpcError> {
        let asked = match self.pooled.holder() {
            Some(Holder::Request { asked, .. }) => asked,
            _ => CancellationToken::new(),
        };
        tokio::select! {
            result = self.pooled.upstream.request(method, params) => result.map_err(Into::into),
            // The round ends here; the engine answers `input_required`.
            () = asked.cancelled() => Err(RpcError::internal("input required from the client")),
        }
    }
}

impl Pool {
    pub(crate) fn new(max: usize, idle_timeout: Duration) -> Arc<Self> {
        let pool = Arc::new(Self {
            idle: Mutex::default(),
            open: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            sweeper: Mutex::default(),
        });
        let sweeper = tokio::spawn(sweep_idle(Arc::downgrade(&pool), idle_timeout));
        *pool.sweeper.lock() = Some(sweeper);
        pool
    }

    /// An idle live connection of `principal`, if the pool has one.
    fn take_idle(&self, principal: &str) -> Option<Arc<Pooled>> {
        let mut idle = self.idle.lock();
        let list = idle.get_mut(principal)?;
        while let Some(pooled) = list.pop() {
            if pooled.upstream.is_alive() {
                return Some(pooled);
            }
        }
        idle.remove(principal);
        None
    }

    /// Room for one more connection: a free permit, else the least recently
    /// used idle connection (of any principal) is closed for it.
    async fn room(&self) -> Result<OwnedSemaphorePermit, RpcError> {
        if let Ok(permit) = self.open.clone().try_acquire_owned() {
            return Ok(permit);
        }
        if self.close_oldest_idle(None).await {
            return self.open.clone().try_acquire_owned().map_err(|_| self.busy());
        }
        Err(self.busy())
    }

    /// Lets go of every idle connection (at shutdown: a kept child stays
    /// with the keeper for the next engine, see [`Upstream::leave`]), in
    /// parallel, and stops the sweep.
    pub(crate) async fn close_all(&self) {
        if let Some(sweeper) = self.sweeper.lock().take() {
            sweeper.abort();
        }
        let idle: Vec<Arc<Pooled>> = self.idle.lock().drain().flat_map(|(_, list)| list).collect();
        futures::future::join_all(idle.iter().map(|pooled| pooled.upstream.leave())).await;
    }

    /// Closes the least recently used idle connection (of `principal` only,
    /// if given); false if there was none.
    pub(crate) async fn close_oldest_idle(&self, principal: Option<&str>) -> bool {
        let oldest = {
            let mut idle = self.idle.lock();
            let found = idle
                .iter()
                .filter(|(p, _)| principal.is_none_or(|only| only == p.as_str()))
                .flat_map(|(p, list)| list.iter().enumerate().map(move |(i, c)| (p.clone(), i, c.idle_for())))
                .max_by_key(|(_, _, idle_for)| *idle_for)
                .map(|(p, i, _)| (p, i));
            found.and_then(|(owner, index)| {
                let list = idle.get_mut(&owner)?;
                let pooled = list.remove(index);
                if list.is_empty() {
                    idle.remove(&owner);
                }
                Some(pooled)
            })
        };
        let Some(pooled) = oldest else { return false };
        pooled.upstream.close(true).await;
        true
    }

    fn busy(&self) -> RpcError {
        RpcError::internal(format!("all {} upstream connections for sessionless clients are busy; try again shortly", self.max))
    }
}

impl Pool {
    /// A connection of `principal` held by `ctx` until the returned guard
    /// drops: an idle one, else a new one (`connect` makes it).
    pub(crate) async fn hold_for_request<F, Fut>(self: &Arc<Self>, ctx: &RequestCtx, connect: F) -> Result<Held, RpcError>
    where
        F: FnOnce(Arc<dyn PeerSink>) -> Fut,
        Fut: Future<Output = Result<Started, RpcError>>,
    {
        let holder = Holder::Request { ctx: ctx.clone(), asked: CancellationToken::new() };
        self.hold(ctx.principal(), holder, connect).await
    }

    /// The same for a task's work.
    pub(crate) async fn hold_for_task<F, Fut>(self: &Arc<Self>, op: Arc<OperationCtx>, connect: F) -> Result<Held, RpcError>
    where
        F: FnOnce(Arc<dyn PeerSink>) -> Fut,
        Fut: Future<Output = Result<Started, RpcError>>,
    {
        let principal = op.principal().to_owned();
        self.hold(&principal, Holder::Task(op), connect).await
    }

    async fn hold<F, Fut>(self: &Arc<Self>, principal: &str, holder: Holder, connect: F) -> Result<Held, RpcError>
    where
        F: FnOnce(Arc<dyn PeerSink>) -> Fut,
        Fut: Future<Output = Result<Started, RpcError>>,
    {
        let pooled = match self.take_idle(principal) {
            Some(pooled) => pooled,
            None => {
                let permit = self.room().await?;
                let sink = Arc::new(PoolSink::default());
                let Started { upstream, resumed, .. } = connect(sink.clone()).await?;
                if !resumed {
                    upstream.notify("notifications/initialized", None).await?;
                }
                let pooled = Arc::new(Pooled {
                    upstream,
                    holder: Mutex::new(None),
                    log_level: Mutex::new(None),
                    idle_since: Mutex::new(Instant::now()),
                    _open: permit,
                });
                let _ = sink.pooled.set(Arc::downgrade(&pooled));
                pooled
            }
        };
        *pooled.holder.lock() = Some(holder);
        Ok(Held { pooled, pool: self.clone(), principal: principal.to_owned() })
    }
}

/// Where a pooled connection's upstream hands what it sends on its own:
/// to the request or task holding the connection, each delivered before
/// the transport reads on (so before the answer that follows it).
#[derive(Default)]
pub(crate) struct PoolSink {
    pooled: OnceLock<Weak<Pooled>>,
}

impl PeerSink for PoolSink {
    fn deliver(&self, message: PeerMessage) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(pooled) = self.pooled.get().and_then(Weak::upgrade) else { return };
            pooled.dispatch(message).await;
        })
    }
}

impl Pooled {
    async fn dispatch(&self, message: PeerMessage) {
        match message {
            PeerMessage::Notification { method, params } => match self.holder() {
                Some(Holder::Request { ctx, .. }) if !link::is_session_level(&method) => {
                    if let Err(e) = ctx.notify(&method, params).await {
                        tracing::debug!(%method, error = %e.message, "an upstream notification did not reach its sessionless client");
                    }
                }
                Some(Holder::Task(op)) if method == "notifications/progress" => {
                    let field = |k: &str| params.as_ref().and_then(|p| p.get(k));
                    let done = field("progress").and_then(Value::as_f64).unwrap_or(0.0);
                    op.progress(done, field("total").and_then(Value::as_f64), field("message").and_then(Value::as_str));
                }
                _ => tracing::debug!(%method, "an upstream notification with no sessionless client to go to"),
            },
            PeerMessage::Request { id, method, params } => {
                let upstream = &self.upstream;
                match self.holder() {
                    Some(Holder::Request { ctx, asked }) => {
                        // Answered at once: the engine holds no request open
                        // for a sessionless client; an unanswered ask ends the round.
                        let answer = ctx.request_client(&method, params, link::CLIENT_ANSWER_WAIT).await;
                        if ctx.awaits_input() {
                            asked.cancel();
                        }
                        if let Err(e) = upstream.answer(id, answer).await {
                            tracing::debug!(%method, error = %e.message, "could not answer the upstream");
                        }
                    }
                    holder => {
                        let why = match holder {
                            Some(_) => "a task cannot ask its client anything through tether yet",
                            None => "no client request is in progress on this connection",
                        };
                        let refused = RpcError::new(tether_wire::code::METHOD_NOT_FOUND, format!("{method}: {why}"));
                        if let Err(e) = upstream.answer(id, Err(refused)).await {
                            tracing::debug!(%method, error = %e.message, "could not answer the upstream");
                        }
                    }
                }
            }
        }
    }
}

impl Pooled {
    fn idle_for(&self) -> Duration {
        self.idle_since.lock().elapsed()
    }

    fn holder(&self) -> Option<Holder> {
        self.holder.lock().clone()
    }
}

/// Closes pooled connections unused for `idle` (until the pool is gone).
async fn sweep_idle(pool: Weak<Pool>, idle: Duration) {
    let mut tick = tokio::time::interval(POOL_SWEEP.min(idle));
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let stale: Vec<Arc<Pooled>> = {
            let mut map = pool.idle.lock();
            let mut stale = Vec::new();
            for list in map.values_mut() {
                let (old, keep): (Vec<_>, Vec<_>) = list.drain(..).partition(|c| c.idle_for() >= idle);
                *list = keep;
                stale.extend(old);
            }
            map.retain(|_, list| !list.is_empty());
            stale
        };
        for pooled in stale {
            tracing::info!("closing an idle upstream connection of sessionless clients");
            pooled.upstream.close(true).await;
        }
    }
}
