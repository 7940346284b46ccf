//! [`Gateway`]: the application served at `/mcp/NAME` for one upstream. It
//! forwards every client request and notification to the session's upstream
//! connection and everything the upstream sends back, and rebuilds the
//! connection from the stored `initialize` whenever it is gone.
//!
//! This module holds what the rooms below share: the upstream's
//! configuration, its transport, its cap, backoff and links, starting a
//! connection under them ([`Gateway::connect`]), and the [`McpApp`] that
//! hands each call to its room. The rooms, each an `impl Gateway` of its own:
//!
//! - `rebuild`: the session's connection: opened by `initialize`, found
//!   live or rebuilt from the session's stored state, let go of when the
//!   session leaves;
//! - `forward`: a session's requests and notifications forwarded both ways,
//!   and what a new connection must replay remembered;
//! - `notes`: recovery notes of requests that run long, and picking a
//!   request cut off by a crash up again;
//! - `sessionless`: sessionless clients (passed through, or on pooled
//!   connections) and `task_tools` as durable tasks;
//! - `discover`: what the upstream says of itself outside any session.

mod discover;
mod forward;
mod notes;
mod rebuild;
mod sessionless;

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tether_server::{CutOff, Initialize, McpApp, RawResult, RequestCtx, RpcError, SessionCtx, SessionEnd};

pub(crate) use self::notes::{Note, Notes};
use self::sessionless::Sessionless;
use crate::backoff::Backoff;
use crate::config::UpstreamConfig;
use crate::connector::{Connector, StartRequest};
use crate::link::{Link, ListChanges};
use crate::links::Links;
use crate::processes::{Limit, Processes};
use crate::sessionless::Pool;
use crate::slot::Slot;
use crate::state::SessionState;
use crate::upstream::{PeerSink, Started};

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
    /// What serves sessionless (2026-07-28) clients.
    sessionless: Sessionless,
    /// The cap on live children (a command upstream only).
    processes: Option<Arc<Processes>>,
    /// The upstream's transport.
    connector: Arc<dyn Connector>,
    /// This gateway as the runner of its tasks' work.
    me: Weak<Gateway>,
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
        let connector = crate::connect::for_config(&config);
        let capacity = connector.capacity();
        let pool = Pool::new(capacity.pool_max, capacity.pool_idle);
        let gateway = Arc::new_cyclic(|me| Self {
            config,
            slot: Slot::Alone,
            connector,
            links: Arc::default(),
            backoff: Arc::default(),
            sessionless: Sessionless::new(pool),
            processes: capacity.processes,
            me: me.clone(),
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

    /// Whether what the upstream answers may depend on who asks: it is
    /// given the client's own token (a virtual server then keeps its lists
    /// per principal).
    pub(crate) fn answers_per_caller(&self) -> bool {
        self.connector.needs_client_authorization()
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
            sessionless: self.sessionless.clone(),
            processes: self.processes.clone(),
            me: me.clone(),
            tasks: Mutex::default(),
            changes: Some(changes),
        })
    }

    /// Starts a connection for `principal` and initializes it with the
    /// client's params. A child starts only with a place under the cap
    /// (see [`Processes`]).
    pub(super) async fn connect(
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
        self.sessionless.pool.close_oldest_idle(only).await;
    }
}

#[async_trait]
impl McpApp for Gateway {
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        let link = self.slot.link_for(init);
        let (result, part) = self.open(init, &link).await?;
        let mut state = SessionState::default();
        self.keep(&mut state, part);
        state.keep_in(init);
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

    /// A request cut off by a tether crash, picked up where its recovery
    /// note says (see `notes`).
    async fn recover_request(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        self.recover(ctx, cut_off).await
    }

    /// A kept child's calls are found again without a note (see [`crate::stdio::kept`]).
    fn recovers_unnoted(&self) -> bool {
        crate::stdio::kept::keeper().is_some() && matches!(self.config.target, crate::config::Target::Command(_))
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        self.notify_upstream(ctx, method, params).await;
    }

    /// What the upstream says of itself (see `discover`).
    async fn discover(&self) -> Option<Map<String, Value>> {
        self.described().await
    }

    fn passes_input_through(&self) -> bool {
        self.sessionless.passthrough.get().is_some()
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
        futures::future::join(futures::future::join_all(closing), self.sessionless.pool.close_all()).await;
        if let Some(processes) = &self.processes {
            tracing::info!(upstream = %self.config.name, left = processes.live(), "upstream stopped for shutdown");
        }
    }
}
