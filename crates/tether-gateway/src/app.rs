//! [`Gateway`]: the application served at `/mcp/NAME` for one upstream. It
//! forwards every client request and notification to the session's upstream
//! connection and everything the upstream sends back, and rebuilds the
//! connection from the stored `initialize` whenever it is gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tether_server::{
    ClientAuthorization, CutOff, EndReason, Initialize, McpApp, OperationCtx, OperationRunner, OperationSpec, RawResult,
    RequestCtx, RpcError, SessionCtx, SessionEnd, raw_result,
};
use tether_wire::meta;

use crate::backoff::Backoff;
use crate::config::UpstreamConfig;
use crate::connector::{Connector, StartRequest};
use crate::link::{self, Connection, Link, LinkSink, ListChanges, Progress};
use crate::links::Links;
use crate::passthrough::Passthrough;
use crate::processes::{Limit, Processes};
use crate::sessionless::{self, Pool};
use crate::slot::Slot;
use crate::upstream::{PeerMessage, PeerSink, Started};

/// One upstream, served to every session of its endpoint (or, as a member
/// of a virtual server, to every session of that server's endpoint).
pub struct Gateway {
    config: UpstreamConfig,
    /// Where this gateway keeps its part of a session.
    slot: Slot,
    /// The links of every session with a connection to this upstream (shared
    /// by the upstream's endpoint and the virtual servers it is a member of).
    links: Arc<Links>,
    /// The backoff of an upstream that keeps failing.
    backoff: Arc<Backoff>,
    /// Upstream connections of sessionless (2026-07-28) clients.
    pool: Arc<Pool>,
    /// The cap on live children (a command upstream only).
    processes: Option<Arc<Processes>>,
    /// The upstream's transport.
    connector: Arc<dyn Connector>,
    /// This gateway as the runner of its tasks' work.
    me: Weak<Gateway>,
    /// The upstream as a 2026-07-28 server for sessionless clients, once
    /// `server/discover` found it speaks that revision.
    passthrough: Arc<std::sync::OnceLock<Passthrough>>,
    /// Background sweeps (idle children), stopped at shutdown or drop.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// A member's list changes go to its virtual server (see [`ListChanges`]).
    changes: Option<Arc<dyn ListChanges>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

impl Gateway {
    /// Needs a Tokio runtime (a sweep stops idle children).
    pub fn new(config: UpstreamConfig) -> Arc<Self> {
        let connector = crate::connector::for_config(&config);
        let capacity = connector.capacity();
        let pool = Pool::new(capacity.pool_max, capacity.pool_idle);
        let gateway = Arc::new_cyclic(|me| Self {
            config,
            slot: Slot::Alone,
            connector,
            links: Arc::default(),
            backoff: Arc::default(),
            pool,
            processes: capacity.processes,
            me: me.clone(),
            passthrough: Arc::default(),
            tasks: Mutex::default(),
            changes: None,
        });
        if let Some(idle) = capacity.idle_timeout {
            let links = Arc::downgrade(&gateway.links);
            gateway.tasks.lock().push(tokio::spawn(crate::links::sweep_idle(links, idle)));
        }
        gateway
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether some of this upstream's tools run as durable tasks (`task_tools`).
    pub(crate) fn has_task_tools(&self) -> bool {
        !self.config.task_tools.is_empty()
    }

    /// This upstream as the member `member` of a virtual server: its part
    /// of a session lives beside the other members' (see [`Slot`]), while
    /// its children, its cap, its backoff, its sessionless pool and its idle
    /// sweep stay the upstream's own, shared with its endpoint.
    pub(crate) fn member(&self, member: &str, changes: Arc<dyn ListChanges>) -> Arc<Gateway> {
        Arc::new_cyclic(|me| Self {
            config: self.config.clone(),
            slot: Slot::Member(member.to_owned()),
            connector: self.connector.clone(),
            links: self.links.clone(),
            backoff: self.backoff.clone(),
            pool: self.pool.clone(),
            processes: self.processes.clone(),
            me: me.clone(),
            passthrough: self.passthrough.clone(),
            tasks: Mutex::default(),
            changes: Some(changes),
        })
    }

    /// Starts a connection for `principal` and initializes it with the
    /// client's params. A child starts only with a place under the cap
    /// (see [`Processes`]).
    async fn connect(
        &self,
        session: &str,
        principal: &str,
        params: Value,
        authorization: Option<String>,
        making: Option<&Arc<Link>>,
        sink: Arc<dyn PeerSink>,
    ) -> Result<Started, RpcError> {
        self.backoff.check(&self.config.name)?;
        let permit = match &self.processes {
            Some(processes) => Some(processes.take(principal, |limit| self.make_room(limit, principal, making)).await?),
            None => None,
        };
        let started = self.connector.start(StartRequest { session, params, authorization, permit, sink }).await;
        match &started {
            Ok(_) => self.backoff.succeeded(),
            Err(e) => self.backoff.failed(&self.config.name, &e.message),
        }
        started
    }

    /// Stops the least recently used idle child that frees a place for
    /// `principal` under `limit` (its session lives on and starts a new one
    /// later): a session's, else one pooled for sessionless clients.
    /// `making` is the link a new connection is being made for (its lock is
    /// held by the caller).
    async fn make_room(&self, limit: Limit, principal: &str, making: Option<&Arc<Link>>) {
        if self.links.stop_oldest_idle(limit, principal, making).await {
            tracing::info!(upstream = %self.config.name, "stopped the least recently used idle child to make room (max_processes)");
            return;
        }
        let only = (limit == Limit::Principal).then_some(principal);
        self.pool.close_oldest_idle(only).await;
    }

    /// The session's live connection, made (and initialized the way the
    /// client initialized this session) if there is none.
    /// `authorization` is the client's header of the request that needs it
    /// (sent upstream only with `forward_auth`).
    async fn upstream(&self, session: &SessionCtx, authorization: Option<&ClientAuthorization>) -> Result<Connection, RpcError> {
        let link = self.slot.link(session);
        let authorization = self.forwarded(&link, authorization);
        let mut live = link.live.lock().await;
        if let Some(connection) = live.as_ref().filter(|c| c.upstream.is_alive()) {
            connection.upstream.present(authorization.as_deref());
            // The first request of the session `initialize` made the
            // connection for: what the upstream sent meanwhile goes out now.
            if connection.sink.attach(session).await {
                connection.upstream.tag_session(session.session_id());
            }
            return Ok(connection.clone());
        }
        // Connecting is the rare path and its future is large (a child's
        // start, an upstream `initialize`): boxed, so that the future of
        // every request, which holds this one, stays small to move.
        Box::pin(self.reconnect(session, &link, &mut live, authorization)).await
    }

    /// [`Self::upstream`] when the session has no live connection: attaches
    /// to the stored upstream session, or starts a new one and replays what
    /// the client set up.
    async fn reconnect(
        &self,
        session: &SessionCtx,
        link: &Arc<Link>,
        live: &mut Option<Connection>,
        authorization: Option<String>,
    ) -> Result<Connection, RpcError> {
        if live.take().is_some() {
            tether_server::metrics::upstream_restart(&self.config.name);
            tracing::info!(upstream = %self.config.name, session = session.session_id(), "upstream connection gone; starting a new one");
        }
        let app = session.app_state().await;
        let stored = app.get(&self.slot.state_key()).cloned().unwrap_or(Value::Null);
        // An HTTP upstream session opened by another replica (or before a
        // restart) is carried on as it is: the upstream keeps its state.
        let sink = LinkSink::new(link, &self.config.name, self.changes.clone());
        sink.attach(session).await;
        if let Some(carry_on) = stored.get("carryOn").filter(|c| !c.is_null()) {
            let attached = self.connector.attach(session.session_id(), carry_on, authorization.clone(), sink.clone()).await;
            if let Some(upstream) = attached {
                return Ok(self.go_live(session, link, live, Connection::new(upstream, sink)));
            }
        }
        // A member added to its virtual server after the session began is
        // initialized the way the client initialized the others.
        let params =
            stored.get("initialize").or_else(|| self.slot.sibling_initialize(&app)).cloned().unwrap_or_else(|| json!({}));
        let started =
            self.connect(session.session_id(), session.principal(), params, authorization, Some(link), sink.clone()).await?;
        let Started { upstream, carry_on, resumed, .. } = started;
        // From here the upstream's requests can be answered (the replays below may bring some).
        let connection = Connection::new(upstream.clone(), sink);
        let carry_on = carry_on.unwrap_or(Value::Null);
        session
            .update_app_state(|app| {
                self.slot.state_of(app).insert("carryOn".into(), carry_on.clone());
            })
            .await?;
        // The client did all this once; a new connection must see it too
        // (a child taken over as it was has seen it).
        if resumed {
            return Ok(self.go_live(session, link, live, connection));
        }
        upstream.notify("notifications/initialized", None).await?;
        if let Some(level) = stored.get("logLevel").filter(|l| l.is_string()) {
            upstream.request("logging/setLevel", Some(json!({"level": level}))).await?;
        }
        for uri in stored.get("subscriptions").and_then(Value::as_array).into_iter().flatten() {
            upstream.request("resources/subscribe", Some(json!({"uri": uri}))).await?;
        }
        Ok(self.go_live(session, link, live, connection))
    }

    /// The client's `Authorization` for the connector, where it needs it
    /// (`forward_auth`, a token exchange): this request's (remembered in
    /// memory for connections a notification opens), else none.
    fn forwarded(&self, link: &Link, authorization: Option<&ClientAuthorization>) -> Option<String> {
        if !self.connector.needs_client_authorization() {
            return None;
        }
        link.authorization(authorization).map(|a| a.header_value().to_owned())
    }

    /// A new connection becomes the session's live one.
    fn go_live(
        &self,
        session: &SessionCtx,
        link: &Arc<Link>,
        live: &mut Option<Connection>,
        connection: Connection,
    ) -> Connection {
        link.set_principal(session.principal());
        link.touch();
        self.links.register(link);
        *live = Some(connection.clone());
        connection
    }

    /// After a request that changes what a new connection must replay.
    async fn remember(&self, session: &SessionCtx, replayed: Replayed) -> Result<(), RpcError> {
        match replayed {
            Replayed::Nothing => return Ok(()),
            Replayed::LogLevel(level) => {
                session
                    .update_app_state(|app| {
                        self.slot.state_of(app).insert("logLevel".into(), level.clone());
                    })
                    .await?;
            }
            Replayed::Subscription { uri, subscribe } => {
                session
                    .update_app_state(|app| {
                        let list = self.slot.state_of(app).entry("subscriptions").or_insert_with(|| json!([]));
                        if let Some(list) = list.as_array_mut() {
                            list.retain(|u| u != &uri);
                            if subscribe {
                                list.push(uri.clone());
                            }
                        }
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// Whether a forwarded request leaves a recovery note once it runs long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notes {
    /// The request is the client's own: a tether crash must not end it.
    Leave,
    /// One of several requests made for one client request (a virtual
    /// server's merged list): it is made again rather than picked up.
    None,
}

impl Gateway {
    /// Forwards a session's request to the session's upstream connection
    /// (made if there is none) and returns the upstream's answer; what the
    /// upstream sends meanwhile reaches the client (see [`crate::link`]).
    pub(crate) async fn forward(
        &self,
        ctx: &RequestCtx,
        session: &SessionCtx,
        method: &str,
        params: Option<Map<String, Value>>,
        notes: Notes,
    ) -> Result<RawResult, RpcError> {
        let mut connection = self.upstream(session, ctx.client_authorization()).await?;
        let link = self.slot.link(session);
        let mut params = params;
        let progress = Progress::issue(params.as_mut());
        let issued = progress.as_ref().map(|p| p.issued.clone());
        let kept_progress = connection.upstream.keeps_calls().then(|| progress.clone()).flatten();
        let _in_flight = link.enter(ctx, progress);
        let replayed = Replayed::of(method, params.as_ref());
        let timer = tether_server::metrics::upstream_request_started();
        let params = params.map(Value::Object);
        // Kept for a second try only where an upstream can forget sessions.
        let again = self.connector.forgets_sessions().then(|| params.clone());
        let track = tether_client::RequestTrack::new();
        let mut result = match notes {
            // A kept child's call outlives this process without a note.
            Notes::Leave if connection.upstream.keeps_calls() => {
                connection.upstream.request_for(ctx, method, params, kept_progress.as_ref()).await
            }
            Notes::Leave => request_with_note(ctx, &connection, &self.slot, method, params, issued.clone(), &track).await,
            Notes::None => connection.upstream.request_tracked(method, params, &track).await,
        };
        // The upstream forgot its session: a new one, initialized as the
        // client initialized this session, takes the request again if the
        // upstream cannot have run it (its POST was refused) or running it
        // twice is harmless. The client sees only the result.
        if let (Err(e), Some(params)) = (&result, again)
            && e.message == crate::upstream::UPSTREAM_FORGOT_SESSION
            && (track.point().is_none() || is_repeatable(method))
        {
            tracing::info!(upstream = %self.config.name, session = session.session_id(), %method, "the upstream forgot its session; sending the request again on a new one");
            connection = self.upstream(session, ctx.client_authorization()).await?;
            let track = tether_client::RequestTrack::new();
            result = match notes {
                Notes::Leave => request_with_note(ctx, &connection, &self.slot, method, params, issued, &track).await,
                Notes::None => connection.upstream.request(method, params).await,
            };
        }
        timer.done(&self.config.name);
        // What the upstream sent before its answer was delivered before the
        // answer came back (the transport hands it to the sink first).
        let result = result?;
        self.remember(session, replayed).await?;
        Ok(result)
    }

    /// Lets go of a session's connection when the session leaves this
    /// process; ends the upstream session only if the session is gone for good.
    pub(crate) async fn session_ended(&self, ended: &SessionEnd) {
        let Some(link) = self.slot.ended_link(ended) else { return };
        if let Some(connection) = link.live.lock().await.take() {
            // Only a session that is gone for good ends its upstream session;
            // one that merely left this process is carried on elsewhere, and
            // at a shutdown (maybe a handover to a new engine) a kept child
            // stays with the keeper, which stops it if no engine comes.
            match ended.reason {
                EndReason::Deleted | EndReason::Expired => connection.upstream.close(true).await,
                EndReason::Shutdown => connection.upstream.leave().await,
                EndReason::Evicted => connection.upstream.close(false).await,
            }
        }
    }

    /// A connection outside any session, initialized as a sessionless
    /// client's would be, for a look at what the upstream offers (the
    /// caller closes it); what the upstream sends on its own is dropped.
    pub(crate) async fn probe(&self) -> Result<Arc<dyn crate::upstream::Upstream>, RpcError> {
        let nowhere: Arc<dyn PeerSink> = Arc::new(tokio::sync::mpsc::channel::<PeerMessage>(1).0);
        let started = self.connect("(probe)", "(probe)", sessionless::initialize_params(), None, None, nowhere).await?;
        started.upstream.notify("notifications/initialized", None).await?;
        Ok(started.upstream)
    }

    /// Whether the session's connection to this upstream is up.
    pub(crate) fn is_live(&self, session: &SessionCtx) -> bool {
        let link = self.slot.link(session);
        link.live.try_lock().is_ok_and(|live| live.as_ref().is_some_and(|c| c.upstream.is_alive()))
    }

    /// This upstream's part of a session, for operators: `connected` (this
    /// process holds a live connection), `stored` (a later request connects,
    /// carrying on the stored upstream session where the transport can) or
    /// `not started`; and the upstream's session ID, for an HTTP upstream.
    pub(crate) fn session_view(
        &self,
        app_state: &Map<String, Value>,
        local: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> Value {
        let stored = app_state.get(&self.slot.state_key());
        let state = match (stored, local) {
            (None, _) => "not started",
            (Some(_), Some(local)) if self.slot.is_connected(local) => "connected",
            (Some(_), _) => "stored",
        };
        let upstream_session = stored.and_then(|s| s.get("carryOn")).and_then(|c| c.get("sessionId")).cloned();
        let mut view = json!({"upstream": self.config.name, "state": state, "upstream_session": upstream_session});
        if let Slot::Member(member) = &self.slot {
            view["member"] = json!(member);
        }
        view
    }

    /// The link an `initialize` gives this part of its new session.
    pub(crate) fn link_for(&self, init: &mut Initialize<'_>) -> Arc<Link> {
        self.slot.link_for(init)
    }

    /// A new session's connection, on `link`: started and initialized with
    /// the client's params. Returns the upstream's `initialize` result and
    /// this part's durable state (for [`Slot::state_key`]). Takes the
    /// `initialize` shared, so a virtual server opens its members at once.
    pub(crate) async fn open(&self, init: &Initialize<'_>, link: &Arc<Link>) -> Result<(Map<String, Value>, Value), RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let params = upstream_params(init.params);
        link.set_principal(init.caller.principal.as_str());
        let authorization = self.forwarded(link, init.client_authorization());
        // What the upstream sends before the session exists waits in the sink.
        let sink = LinkSink::new(link, &self.config.name, self.changes.clone());
        let started = self
            .connect(init.session_id(), &init.caller.principal, params.clone(), authorization, Some(link), sink.clone())
            .await?;
        let Started { upstream, initialize_result, carry_on, .. } = started;
        let result: Map<String, Value> = serde_json::from_str(initialize_result.get()).map_err(|e| {
            RpcError::internal(format!("upstream `{}` answered initialize with no object: {e}", self.config.name))
        })?;
        let capabilities = result.get("capabilities").cloned().unwrap_or(Value::Null);
        let state = json!({"initialize": without_trace_context(params), "carryOn": carry_on, "capabilities": capabilities});
        *link.live.lock().await = Some(Connection::new(upstream, sink));
        // Idle from now on until a request uses it (so it can make room).
        link.touch();
        self.links.register(link);
        Ok((result, state))
    }

    /// Whether what the upstream answers may depend on who asks: it is
    /// given the client's own token (a virtual server then keeps its lists
    /// per principal).
    pub(crate) fn answers_per_caller(&self) -> bool {
        self.connector.needs_client_authorization()
    }

    /// The capabilities the upstream declared when this part of the session
    /// was opened (none before, or for a session opened before they were kept).
    pub(crate) fn stored_capabilities<'a>(&self, app_state: &'a Map<String, Value>) -> Option<&'a Value> {
        app_state.get(&self.slot.state_key())?.get("capabilities").filter(|c| c.is_object())
    }

    /// Keeps this part's durable state from [`Self::open`] in the new session.
    pub(crate) fn keep(&self, init: &mut Initialize<'_>, state: Value) {
        init.set_app_state(self.slot.state_key(), state);
    }

    /// A member's part of an `initialize` it could not answer (its upstream
    /// is down): the client's params are kept, so the first request that
    /// needs the member starts its connection the way the client asked.
    pub(crate) fn initialize_later(&self, init: &mut Initialize<'_>) {
        let params = upstream_params(init.params);
        init.set_app_state(self.slot.state_key(), json!({"initialize": without_trace_context(params), "carryOn": null}));
    }
}

impl Gateway {
    /// A sessionless (2026-07-28) client's request: served on a pooled
    /// upstream connection of its principal (see `sessionless`).
    async fn sessionless_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        let params = params.unwrap_or_default();
        match method {
            "tasks/get" | "tasks/update" | "tasks/cancel" if self.has_task_tools() => {
                return raw_result(&ctx.answer_tasks_method(self.runner()?, method, &params).await?);
            }
            "tools/call" => {
                let tool = params.get("name").and_then(Value::as_str).unwrap_or_default();
                if self.config.is_task_tool(tool) {
                    // A task for a client that declared the extension; else
                    // inline (whole, or in pages for a client that asked).
                    let spec = OperationSpec { restartable: false, expected_duration_ms: 0 };
                    return raw_result(&ctx.call_operation(self.runner()?, params, spec).await?);
                }
            }
            _ => {}
        }
        if let Some(passthrough) = self.passthrough.get() {
            return passthrough.request(&ctx, method, params).await;
        }
        let authorization = self.sessionless_authorization(ctx.client_authorization());
        let principal = ctx.principal();
        let pooled = sessionless::pool_session(principal);
        let connect = |sink| self.connect(&pooled, principal, sessionless::initialize_params(), authorization, None, sink);
        let held = self.pool.hold_for_request(&ctx, connect).await?;
        let level = ctx.request_meta().and_then(|m| m.get(meta::LOG_LEVEL)).and_then(Value::as_str);
        held.want_log_level(level).await;
        let timer = tether_server::metrics::upstream_request_started();
        let result = held.request(method, Some(Value::Object(sessionless::upstream_params(params)))).await;
        timer.done(&self.config.name);
        result
    }

    /// The client's `Authorization` for a sessionless request's upstream
    /// connection (only with `forward_auth`).
    fn sessionless_authorization(&self, presented: Option<&ClientAuthorization>) -> Option<String> {
        match presented {
            Some(presented) if self.connector.needs_client_authorization() => Some(presented.header_value().to_owned()),
            _ => None,
        }
    }

    fn runner(&self) -> Result<Arc<dyn OperationRunner>, RpcError> {
        let me = self.me.upgrade().ok_or_else(|| RpcError::internal("this upstream was removed"))?;
        Ok(me)
    }
}

#[async_trait]
impl OperationRunner for Gateway {
    /// A task's work: the tool call on a pooled connection of the task's
    /// principal; its result is the task's.
    async fn run_operation(&self, ctx: OperationCtx, tool: &str, arguments: Map<String, Value>) -> Result<(), RpcError> {
        let ctx = Arc::new(ctx);
        let principal = ctx.principal().to_owned();
        let pooled = sessionless::pool_session(&principal);
        let connect = |sink| self.connect(&pooled, &principal, sessionless::initialize_params(), None, None, sink);
        let held = self.pool.hold_for_task(ctx.clone(), connect).await?;
        let params = json!({"name": tool, "arguments": arguments, "_meta": {"progressToken": "tether-task"}});
        let timer = tether_server::metrics::upstream_request_started();
        let result = held.request("tools/call", Some(params)).await;
        timer.done(&self.config.name);
        let result: Value = serde_json::from_str(result?.get()).map_err(|e| {
            RpcError::internal(format!("upstream `{}` answered tools/call with no object: {e}", self.config.name))
        })?;
        ctx.push_value(result).await
    }
}

/// How long a request runs before it leaves a recovery note (quick ones,
/// most of them, never write one).
const NOTE_AFTER: Duration = Duration::from_millis(100);
/// The recovery note's fields: the upstream's ID of the request, the
/// first event ID of its answer stream there, and the progress token the
/// upstream was given for it (if any).
const NOTE_REQUEST_ID: &str = "upstreamRequestId";
const NOTE_AFTER_EVENT: &str = "after";
const NOTE_PROGRESS_TOKEN: &str = "progressToken";
/// The member of a virtual server that runs the request.
pub(crate) const NOTE_MEMBER: &str = "member";

/// Sends a request upstream; once it has run for [`NOTE_AFTER`] and the
/// upstream named a point of its answer stream, leaves a recovery note
/// (see [`Gateway::recover_request`]) so that a tether crash does not end it.
async fn request_with_note(
    ctx: &RequestCtx,
    connection: &Connection,
    slot: &Slot,
    method: &str,
    params: Option<Value>,
    issued_progress_token: Option<Value>,
    track: &tether_client::RequestTrack,
) -> Result<tether_server::RawResult, RpcError> {
    let request = connection.upstream.request_tracked(method, params, track);
    let mut request = std::pin::pin!(request);
    // A `Sleep` on the stack, re-armed: no allocation for the quick requests.
    let mut check = std::pin::pin!(tokio::time::sleep(NOTE_AFTER));
    let mut noted = false;
    loop {
        tokio::select! {
            biased;
            result = &mut request => return result,
            () = &mut check, if !noted => {
                if let Some((request_id, after)) = track.point() {
                    noted = true;
                    let mut note = json!({NOTE_REQUEST_ID: request_id, NOTE_AFTER_EVENT: after});
                    if let Some(token) = &issued_progress_token {
                        note[NOTE_PROGRESS_TOKEN] = token.clone();
                    }
                    if let Slot::Member(member) = slot {
                        note[NOTE_MEMBER] = json!(member);
                    }
                    if let Err(e) = ctx.leave_recovery_note(note).await {
                        tracing::warn!(error = %e.message, "could not store a request's recovery note; a crash now ends it as interrupted");
                    }
                } else {
                    check.as_mut().reset(tokio::time::Instant::now() + NOTE_AFTER);
                }
            }
        }
    }
}

/// Whether a request may be sent twice without harm (it only reads, or
/// sets what it sets again).
fn is_repeatable(method: &str) -> bool {
    matches!(
        method,
        "ping"
            | "tools/list"
            | "prompts/list"
            | "prompts/get"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "completion/complete"
            | "logging/setLevel"
    )
}

/// What a request changes in what a new connection must replay, taken
/// before the params go upstream (only these two kinds copy anything).
enum Replayed {
    Nothing,
    LogLevel(Value),
    Subscription { uri: Value, subscribe: bool },
}

impl Replayed {
    fn of(method: &str, params: Option<&Map<String, Value>>) -> Self {
        let field = |k: &str| params.and_then(|p| p.get(k)).cloned();
        match method {
            "logging/setLevel" => Self::LogLevel(field("level").unwrap_or(Value::Null)),
            "resources/subscribe" | "resources/unsubscribe" => match field("uri") {
                Some(uri) => Self::Subscription { uri, subscribe: method == "resources/subscribe" },
                None => Self::Nothing,
            },
            _ => Self::Nothing,
        }
    }
}

/// The client's `initialize` params as the upstream should see them:
/// without tether's own `_meta` keys (the resume token is tether's).
fn upstream_params(params: &Map<String, Value>) -> Value {
    let mut params = params.clone();
    if let Some(Value::Object(m)) = params.get_mut("_meta") {
        m.retain(|k, _| !k.starts_with(meta::TETHER_PREFIX));
    }
    Value::Object(params)
}

/// `initialize` params to keep for later connections: a trace context
/// belongs to the request that carried it, not to the replays.
fn without_trace_context(mut params: Value) -> Value {
    if let Some(Value::Object(m)) = params.get_mut("_meta") {
        m.remove(meta::TRACEPARENT);
        m.remove(meta::TRACESTATE);
    }
    params
}

#[async_trait]
impl McpApp for Gateway {
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        let link = self.slot.link_for(init);
        let (result, state) = self.open(init, &link).await?;
        init.set_app_state(self.slot.state_key(), state);
        Ok(result)
    }

    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let Some(session) = ctx.session() else {
            // Boxed: its future is large and the session era never takes it.
            return Box::pin(self.sessionless_request(ctx, method, params)).await;
        };
        self.forward(&ctx, &session, method, params, Notes::Leave).await
    }

    /// A request cut off by a tether crash while its upstream ran it: its
    /// answer is picked up from the upstream's stream where the note says
    /// (an HTTP upstream that keeps its streams: `Last-Event-ID`), and what
    /// the upstream sent meanwhile is delivered, less what the client had
    /// already. An upstream that cannot resume it ends it with
    /// [`crate::upstream::UPSTREAM_RESTARTED`].
    async fn recover_request(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let session = ctx.require_session()?;
        let note = &cut_off.note;
        let (request_id, after, connection, progress) = if note.is_null() {
            // No note: a kept child's call, found by its client request.
            let Some(stream) = ctx.stream_name() else { return Err(RpcError::internal(crate::upstream::UPSTREAM_RESTARTED)) };
            let key = crate::upstream::request_key(session.session_id(), stream);
            let connection = self.upstream(&session, None).await?;
            let Some(call) = connection.upstream.cut_off_call(&key) else {
                return Err(RpcError::internal(tether_server::engine::INTERRUPTED_MESSAGE));
            };
            (call.id, String::new(), connection, call.progress)
        } else {
            let (Some(request_id), Some(after)) = (note.get(NOTE_REQUEST_ID), note.get(NOTE_AFTER_EVENT).and_then(Value::as_str))
            else {
                return Err(RpcError::internal(crate::upstream::UPSTREAM_RESTARTED));
            };
            let connection = self.upstream(&session, None).await?;
            // Only what carries the token the upstream was given for this
            // very request (or none) is this request's.
            let progress = match (note.get(NOTE_PROGRESS_TOKEN), ctx.progress_token()) {
                (Some(issued), Some(client)) => Some(Progress { issued: issued.clone(), client: client.clone() }),
                _ => None,
            };
            (request_id.clone(), after.to_owned(), connection, progress)
        };
        let link = self.slot.link(&session);
        let _in_flight = link.enter(&ctx, progress.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(link::RESUMED_BUFFER);
        let resumed = connection.upstream.resume(request_id, &after, tx);
        let mut resumed = std::pin::pin!(resumed);
        let mut already = link::AlreadySent::new(cut_off.sent);
        tracing::info!(upstream = %self.config.name, session = session.session_id(), "picking up a request cut off by a restart from its upstream");
        let deliver = async |message, already: &mut link::AlreadySent| match Progress::translate(progress.as_ref(), message) {
            Ok(message) if !already.contains(&message) => {
                link::deliver_to_request(&ctx, Some(&connection.upstream), message).await
            }
            Ok(_) => {}
            Err(foreign) => link::drop_foreign(&self.config.name, session.session_id(), &foreign),
        };
        loop {
            tokio::select! {
                biased;
                Some(message) = rx.recv() => deliver(message, &mut already).await,
                result = &mut resumed => {
                    while let Ok(message) = rx.try_recv() {
                        deliver(message, &mut already).await;
                    }
                    return result;
                }
            }
        }
    }

    /// A kept child's calls are found again without a note (see [`crate::kept`]).
    fn recovers_unnoted(&self) -> bool {
        crate::kept::keeper().is_some() && matches!(self.config.target, crate::config::Target::Command(_))
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        let upstream = match self.upstream(&ctx, None).await {
            Ok(c) => c.upstream,
            Err(e) => {
                tracing::warn!(upstream = %self.config.name, session = ctx.session_id(), %method, error = %e.message, "notification not forwarded");
                return;
            }
        };
        if let Err(e) = upstream.notify(method, params.map(Value::Object)).await {
            tracing::warn!(upstream = %self.config.name, session = ctx.session_id(), %method, error = %e.message, "notification not forwarded");
        }
    }

    /// The upstream's own `initialize` result, as a sessionless client's
    /// `server/discover` says it (a connection is opened to ask, then closed;
    /// the engine keeps the answer). `None` while the upstream cannot be
    /// reached, so the next `server/discover` asks again.
    async fn discover(&self) -> Option<Map<String, Value>> {
        let has_task_tools = !self.config.task_tools.is_empty();
        if let Some((passthrough, described)) = self.connector.passthrough().await {
            let _ = self.passthrough.set(passthrough);
            return Some(sessionless::describe(&described, has_task_tools));
        }
        // Nobody to tell what the upstream says meanwhile: a closed channel drops it.
        let nowhere: Arc<dyn PeerSink> = Arc::new(tokio::sync::mpsc::channel::<PeerMessage>(1).0);
        let started = self.connect("(discover)", "(discover)", sessionless::initialize_params(), None, None, nowhere).await;
        let Started { upstream, initialize_result, .. } = match started {
            Ok(started) => started,
            Err(e) => {
                tracing::warn!(upstream = %self.config.name, error = %e.message, "could not describe the upstream to a sessionless client");
                return None;
            }
        };
        upstream.close(true).await;
        let result: Map<String, Value> = serde_json::from_str(initialize_result.get()).ok()?;
        Some(sessionless::describe(&result, has_task_tools))
    }

    fn passes_input_through(&self) -> bool {
        self.passthrough.get().is_some()
    }

    fn describe_session(
        &self,
        app_state: &Map<String, Value>,
        local: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> Option<Value> {
        Some(json!([self.session_view(app_state, local)]))
    }

    /// Its state, connections and shares (`describe.rs`).
    fn describe(&self) -> Option<Value> {
        Some(crate::describe::upstream(&self.config, &self.links, &self.backoff, self.processes.as_deref()))
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        self.session_ended(&ended).await;
    }

    /// Stops every child and lets go of every upstream connection this
    /// process holds (sessions' and the sessionless pool's), in parallel,
    /// and the background sweeps. Upstream sessions are not ended: the
    /// tether sessions carry on after a restart or on another replica.
    async fn shutdown(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        let closing = self.links.live().into_iter().map(|link| async move {
            if let Some(connection) = link.live.lock().await.take() {
                connection.upstream.leave().await;
            }
        });
        futures::future::join(futures::future::join_all(closing), self.pool.close_all()).await;
        if let Some(processes) = &self.processes {
            tracing::info!(upstream = %self.config.name, left = processes.live(), "upstream stopped for shutdown");
        }
    }
}
