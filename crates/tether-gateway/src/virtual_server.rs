//! [`VirtualServer`]: the application served at `/mcp/NAME` for a
//! `[servers.NAME]` table: several upstreams (its members) behind one
//! endpoint and one client session.
//!
//! Each member is a [`Gateway`] of its own upstream in a member [`Slot`]:
//! the client's tether session holds one upstream session per member, each
//! stored, carried on and recovered by that member exactly as a single
//! upstream's is (after a `kill -9`, on another replica, after its child
//! died). This module only merges and routes: lists are read from every
//! member once, shared by every session ([`MemberLists`]: read again when a
//! member says a list changed), and merged into one [`Catalog`] (merged
//! again when a member's lists change, the names staying with the members
//! that hold them); a call, `prompts/get`, a resource request or a
//! completion goes to the member that owns the name or URI; `logging/setLevel`
//! and the client's notifications go to every member. What a member sends
//! on its own reaches the client through its link, so a sampling request
//! is answered back to the member that asked, and progress and
//! cancellation follow the call to its member. A member's `list_changed`
//! becomes one notification to the client however many members change
//! within a moment (`changes`). A member that cannot be reached is hidden (its
//! tools leave the lists, `list_changed` tells the client, its calls get
//! an error naming it) or, with `on_member_down = "fail"`, refuses every
//! request until it is back.
//!
//! Policies see through the merge: [`McpApp::origins`] gives them the
//! catalog, so a rule of `/mcp/MEMBER` decides on the member's tools here too.
//!
//! Here: the server, its members' `initialize` merged, the catalog a
//! request sees and who is down; `route` sends each request to its member;
//! `changes` tells a member's `list_changed` once.
//!
//! [`Slot`]: crate::slot::Slot
//! [`MemberLists`]: crate::member_lists::MemberLists

mod changes;
mod route;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::future::{BoxFuture, join_all};
use serde_json::{Map, Value, json};
use tether_server::{CutOff, Initialize, McpApp, Origins, RawResult, RequestCtx, RpcError, SessionCtx, SessionEnd, raw_result};
use tokio::sync::broadcast;

use self::changes::{Changes, LISTS, Relay, tell};
use crate::app::{Gateway, Note, Notes};
use crate::catalog::{Catalog, Collision, Listed};
use crate::config::{MemberDown, ServerConfig};
use crate::member_lists::{DOWN_RECHECK, MemberLists, read_lists};
use crate::slot::Members;
use crate::state::SessionState;

/// What each member listed (`None`: it could not be reached), in member order.
type AllListed = Vec<Option<Arc<Listed>>>;

/// Contested names logged at most (each once).
const MAX_LOGGED_COLLISIONS: usize = 10_000;

/// Several upstreams behind one endpoint.
pub struct VirtualServer {
    config: ServerConfig,
    /// The members, in the order of `config.upstreams`.
    members: Vec<Arc<Gateway>>,
    /// List changes for `subscriptions/listen` streams.
    changes: Arc<Changes>,
    /// The members down at the last look of any client (`None`: no look
    /// yet), and when that look was.
    down: parking_lot::Mutex<Option<Vec<usize>>>,
    looked: parking_lot::Mutex<Option<Instant>>,
    /// Every member's lists, shared by every session.
    lists: Arc<MemberLists>,
    /// The members' lists last merged and their catalog (see [`Self::merged_catalog`]).
    current: parking_lot::Mutex<Option<(AllListed, Arc<Catalog>)>>,
    /// A catalog with every member up, shared by every member's lists, and
    /// [`MemberLists::changes`] before they were read: good for every
    /// request until a member announces a change (the usual call's one look).
    settled: parking_lot::RwLock<Option<(u64, Arc<Catalog>)>>,
    /// Whether a member's lists are read per principal (then nothing is settled).
    per_caller: bool,
    /// The contested names already logged.
    logged: parking_lot::Mutex<HashSet<(&'static str, String)>>,
}

impl VirtualServer {
    /// The virtual server of `config`, its members taken from `upstreams`
    /// (the gateways of every configured upstream, by name).
    pub fn new(config: ServerConfig, upstreams: &HashMap<String, Arc<Gateway>>) -> Result<Arc<Self>, String> {
        let changes = Arc::new(Changes { sender: broadcast::channel(16).0, pending: parking_lot::Mutex::default() });
        let lists = Arc::new(MemberLists::new(&config.name, &config.upstreams, config.max_list_bytes));
        let members = config
            .upstreams
            .iter()
            .enumerate()
            .map(|(member, name)| match upstreams.get(name) {
                Some(gateway) => {
                    let relay = Arc::new(Relay { changes: changes.clone(), lists: lists.clone(), member });
                    Ok(gateway.member(name, relay))
                }
                None => Err(format!("[servers.{}] upstreams: `{name}` is not an upstream", config.name)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let per_caller = members.iter().any(|m| m.answers_per_caller());
        Ok(Arc::new(Self {
            config,
            members,
            changes,
            down: parking_lot::Mutex::default(),
            looked: parking_lot::Mutex::default(),
            lists,
            current: parking_lot::Mutex::default(),
            settled: parking_lot::RwLock::default(),
            per_caller,
            logged: parking_lot::Mutex::default(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The members' names (each also an endpoint, `/mcp/MEMBER`), in priority order.
    pub fn members(&self) -> &[String] {
        &self.config.upstreams
    }

    /// The start-up look: every member is asked for its lists once, and a
    /// name two members offer under `names = "none"` (or a rename onto a
    /// taken name), or a URI two members list, refuses the start, naming
    /// both. A member that cannot be reached is only logged: it may come up
    /// later, and is hidden until then.
    pub async fn check(&self) -> Result<(), String> {
        let listed = join_all(self.members.iter().map(async |member| {
            let upstream = match member.probe().await {
                Ok(upstream) => upstream,
                Err(e) => {
                    tracing::warn!(server = %self.config.name, member = member.name(), error = %e.message, "member not reachable at start; its names are checked when it is up");
                    return None;
                }
            };
            let ask = |method: &'static str, params: Option<Map<String, Value>>| -> BoxFuture<'_, Result<RawResult, RpcError>> {
                let upstream = upstream.clone();
                Box::pin(async move { upstream.request(method, params.map(Value::Object)).await.map_err(Into::into) })
            };
            let listed = read_lists(&ask, None, self.config.max_list_bytes).await;
            upstream.close(true).await;
            match listed {
                Ok((listed, _)) => Some(Arc::new(listed)),
                Err(e) => {
                    tracing::warn!(server = %self.config.name, member = member.name(), error = %e.message, "member could not be listed at start; its names are checked when it is up");
                    None
                }
            }
        }))
        .await;
        let catalog = Catalog::merge(&self.config, &listed, None);
        match catalog.collisions.first() {
            Some(collision) => Err(format!("[servers.{}]: {collision}", self.config.name)),
            None => Ok(()),
        }
    }

    /// A request of `member`, on the session's connection or (a sessionless
    /// client) the member's pool.
    async fn ask(
        &self,
        ctx: &RequestCtx,
        member: usize,
        method: &str,
        params: Option<Map<String, Value>>,
        notes: Notes,
    ) -> Result<RawResult, RpcError> {
        let gateway = &self.members[member];
        match ctx.session() {
            Some(session) => gateway.forward(ctx, &session, method, params, notes).await,
            None => gateway.handle_request(ctx.clone(), method, params).await,
        }
    }

    /// The merged lists for this request: each member's shared lists (read
    /// through this request's session or pool when none are fresh), merged.
    async fn catalog(&self, ctx: &RequestCtx) -> Arc<Catalog> {
        let session = ctx.session();
        if let Some(catalog) = self.settled() {
            self.seen_by(session, &catalog);
            return catalog;
        }
        let changes = self.lists.changes();
        let principal = |member: usize| self.members[member].answers_per_caller().then(|| ctx.principal());
        let listed = match (0..self.members.len()).map(|m| self.lists.cached(m, principal(m))).collect() {
            Some(listed) => listed,
            None => {
                // A state that cannot be read asks a member for every list;
                // the request itself then says why it cannot be served.
                let state = match &session {
                    Some(session) => SessionState::read(&session.app_state().await).unwrap_or_default(),
                    None => SessionState::default(),
                };
                let state = &state;
                join_all((0..self.members.len()).map(|member| async move {
                    let ask = |method: &'static str,
                               params: Option<Map<String, Value>>|
                     -> BoxFuture<'_, Result<RawResult, RpcError>> {
                        Box::pin(self.ask(ctx, member, method, params, Notes::None))
                    };
                    let capabilities = self.members[member].stored_capabilities(state);
                    self.lists.get(member, principal(member), capabilities, &ask).await
                }))
                .await
            }
        };
        let catalog = self.merged_catalog(listed);
        if catalog.down.is_empty() && !self.per_caller {
            *self.settled.write() = Some((changes, catalog.clone()));
        }
        self.look(&catalog);
        self.seen_by(session, &catalog);
        catalog
    }

    /// The settled catalog, if no member announced a change since it was read.
    fn settled(&self) -> Option<Arc<Catalog>> {
        match &*self.settled.read() {
            Some((changes, catalog)) if *changes == self.lists.changes() => Some(catalog.clone()),
            _ => None,
        }
    }

    /// Tells the session's client `list_changed` when the members down
    /// changed since it last looked.
    fn seen_by(&self, session: Option<SessionCtx>, catalog: &Catalog) {
        if let Some(session) = session {
            let members = session.local::<Members>();
            // What the session's client last saw down; told when it changes.
            let mut seen = members.down.lock();
            if seen.as_ref() != Some(&catalog.down) {
                let before = seen.replace(catalog.down.clone());
                drop(seen);
                if before.is_some() {
                    for method in LISTS {
                        tell(&session, &members, method);
                    }
                }
            }
        }
    }

    /// Notes what `catalog` shows down, for `on_member_down = "fail"` and
    /// the listen streams (told when it changes). Nothing to write while
    /// every member is up and was up at the last look: the usual call.
    fn look(&self, catalog: &Catalog) {
        if catalog.down.is_empty() && self.down.lock().as_ref().is_some_and(Vec::is_empty) {
            return;
        }
        *self.looked.lock() = Some(Instant::now());
        let before = self.down.lock().replace(catalog.down.clone());
        if before.is_some_and(|before| before != catalog.down) {
            for method in LISTS {
                self.changes.publish(method);
            }
        }
    }

    /// The catalog of `listed`: the one last made when the members' lists
    /// are the same reads (as they are for every session until one
    /// changes), else merged again with the last one deciding who keeps a
    /// contested name. A contest is logged once.
    fn merged_catalog(&self, listed: AllListed) -> Arc<Catalog> {
        let mut current = self.current.lock();
        let same = |a: &Option<Arc<Listed>>, b: &Option<Arc<Listed>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if let Some((last, catalog)) = current.as_ref()
            && last.len() == listed.len()
            && last.iter().zip(&listed).all(|(a, b)| same(a, b))
        {
            return catalog.clone();
        }
        let before = current.as_ref().map(|(_, catalog)| catalog.clone());
        let catalog = Arc::new(Catalog::merge(&self.config, &listed, before.as_deref()));
        self.log_contests(&catalog.collisions);
        *current = Some((listed, catalog.clone()));
        catalog
    }

    fn log_contests(&self, collisions: &[Collision]) {
        let mut logged = self.logged.lock();
        for collision in collisions {
            if logged.len() < MAX_LOGGED_COLLISIONS && logged.insert((collision.what, collision.name.clone())) {
                tracing::warn!(server = %self.config.name, "{collision}; {} keeps it", collision.first);
            }
        }
    }

    /// The members' `initialize` results (or descriptions) as one: the
    /// capabilities any member has (lists always `listChanged`: tether
    /// relays them), the oldest revision a member answered, and their
    /// instructions, each under its member's name.
    fn merged(&self, answered: &[(usize, Map<String, Value>)], requested: &str) -> Map<String, Value> {
        let has =
            |capability: &str| answered.iter().any(|(_, r)| r.get("capabilities").and_then(|c| c.get(capability)).is_some());
        let subscribe = answered.iter().any(|(_, r)| {
            r.get("capabilities").and_then(|c| c.get("resources")).and_then(|c| c.get("subscribe")) == Some(&json!(true))
        });
        let mut capabilities = Map::new();
        for list in ["tools", "prompts"] {
            if has(list) {
                capabilities.insert(list.into(), json!({"listChanged": true}));
            }
        }
        if has("resources") {
            capabilities.insert("resources".into(), json!({"listChanged": true, "subscribe": subscribe}));
        }
        for plain in ["logging", "completions"] {
            if has(plain) {
                capabilities.insert(plain.into(), json!({}));
            }
        }
        // Extensions (the Tasks extension of members' task tools): the union.
        let mut extensions = Map::new();
        for (_, r) in answered {
            if let Some(Value::Object(e)) = r.get("capabilities").and_then(|c| c.get("extensions")) {
                extensions.extend(e.clone());
            }
        }
        if !extensions.is_empty() {
            capabilities.insert("extensions".into(), Value::Object(extensions));
        }
        let version = answered
            .iter()
            .filter_map(|(_, r)| r.get("protocolVersion").and_then(Value::as_str))
            .min()
            .unwrap_or(requested)
            .to_owned();
        let instructions: Vec<String> = answered
            .iter()
            .filter_map(|(m, r)| {
                r.get("instructions").and_then(Value::as_str).map(|i| format!("## {}\n{i}", self.config.upstreams[*m]))
            })
            .collect();
        let mut result = Map::new();
        result.insert("protocolVersion".into(), Value::String(version));
        result.insert("capabilities".into(), Value::Object(capabilities));
        result.insert(
            "serverInfo".into(),
            json!({"name": self.config.name, "title": format!("tether virtual server {}", self.config.name), "version": env!("CARGO_PKG_VERSION")}),
        );
        if !instructions.is_empty() {
            result.insert("instructions".into(), Value::String(instructions.join("\n\n")));
        }
        result
    }
}

#[async_trait]
impl McpApp for VirtualServer {
    /// Every member's `initialize` at once, into the same session; a member
    /// that cannot be reached is started by the first request that needs it
    /// (or, with `on_member_down = "fail"`, refuses the `initialize`).
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        let links: Vec<_> = self.members.iter().map(|gateway| gateway.link_for(init)).collect();
        // Every member is started at once (a child each, an HTTP session each).
        let shared: &Initialize<'_> = init;
        let opened = join_all(self.members.iter().zip(&links).map(|(gateway, link)| gateway.open(shared, link))).await;
        let mut answered = Vec::new();
        let mut down = Vec::new();
        let mut state = SessionState::default();
        for ((member, gateway), opened) in self.members.iter().enumerate().zip(opened) {
            match opened {
                Ok((result, part)) => {
                    gateway.keep(&mut state, part);
                    answered.push((member, result));
                }
                Err(e) if self.config.on_member_down == MemberDown::Hide => {
                    tracing::warn!(server = %self.config.name, member = gateway.name(), error = %e.message, "member not reachable; hidden until it is");
                    gateway.initialize_later(&mut state, init);
                    down.push(member);
                }
                Err(e) => {
                    *self.looked.lock() = Some(Instant::now());
                    *self.down.lock() = Some(vec![member]);
                    return Err(RpcError::unavailable(
                        format!("{}: {}", self.member_down(member).message, e.message),
                        gateway.name(),
                    ));
                }
            }
        }
        if answered.is_empty() {
            return Err(RpcError::unavailable(
                format!("no member of virtual server `{}` can be reached now; try again later", self.config.name),
                &self.config.name,
            ));
        }
        state.keep_in(init);
        *init.local::<Members>().down.lock() = Some(down);
        let requested = init.caller.protocol_version().to_owned();
        Ok(self.merged(&answered, &requested))
    }

    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        match method {
            "ping" => raw_result(&json!({})),
            "tools/list" => self.list(&ctx, "tools", params.as_ref()).await,
            "prompts/list" => self.list(&ctx, "prompts", params.as_ref()).await,
            "resources/list" => self.list(&ctx, "resources", params.as_ref()).await,
            "resources/templates/list" => self.list(&ctx, "resourceTemplates", params.as_ref()).await,
            "tools/call"
            | "prompts/get"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "completion/complete" => self.routed(&ctx, method, params.unwrap_or_default()).await,
            "logging/setLevel" => self.set_level(&ctx, params).await,
            // A sessionless client's tasks (of members' `task_tools`) are
            // tether's, kept in its store: any member that runs tasks answers.
            "tasks/get" | "tasks/update" | "tasks/cancel" => match self.members.iter().position(|m| m.has_task_tools()) {
                Some(member) => self.ask(&ctx, member, method, params, Notes::None).await,
                None => Err(RpcError::method_not_found(method)),
            },
            other => Err(RpcError::method_not_found(other)),
        }
    }

    /// A call cut off by a crash is picked up by the member that ran it.
    async fn recover_request(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        let member = Note::of(&cut_off).and_then(|note| note.member);
        match member.and_then(|m| self.config.upstreams.iter().position(|u| *u == m)) {
            Some(member) => self.members[member].recover_request(ctx, cut_off).await,
            None => Err(crate::upstream::UpstreamError::Restarted.into()),
        }
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        join_all(self.members.iter().map(|member| member.on_notification(ctx.clone(), method, params.clone()))).await;
    }

    /// One description of the server for sessionless clients: the members'
    /// merged (those that can be reached).
    async fn discover(&self) -> Option<Map<String, Value>> {
        let described = join_all(self.members.iter().map(|m| m.discover())).await;
        let answered: Vec<(usize, Map<String, Value>)> =
            described.into_iter().enumerate().filter_map(|(m, d)| d.map(|d| (m, d))).collect();
        if answered.is_empty() {
            return None;
        }
        let mut merged = self.merged(&answered, tether_wire::revision::FIRST_SESSIONLESS);
        merged.remove("protocolVersion");
        // Sessionless clients have no subscriptions (list changes they get
        // on listen streams).
        if let Some(Value::Object(resources)) = merged.get_mut("capabilities").and_then(|c| c.get_mut("resources")) {
            resources.remove("subscribe");
        }
        Some(merged)
    }

    /// Each member's upstream session, and whether the session's client
    /// last saw it down.
    fn describe_session(
        &self,
        app_state: &Map<String, Value>,
        local: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> Option<Value> {
        let down = local.and_then(|l| l.downcast_ref::<Members>()).and_then(|m| m.down.lock().clone()).unwrap_or_default();
        let views = self.members.iter().enumerate().map(|(i, member)| {
            let mut view = member.session_view(app_state, local);
            view["down"] = json!(down.contains(&i));
            view
        });
        Some(Value::Array(views.collect()))
    }

    /// With `on_member_down = "fail"`, while a member was seen down in
    /// the last [`DOWN_RECHECK`]: every request is refused (503). After
    /// that a request goes through, and its look at the members decides again.
    fn unavailable(&self) -> Option<RpcError> {
        if self.config.on_member_down != MemberDown::Fail {
            return None;
        }
        let recent = self.looked.lock().is_some_and(|at| at.elapsed() < DOWN_RECHECK);
        let down = self.down.lock().as_ref().and_then(|d| d.first().copied());
        down.filter(|_| recent).map(|member| self.member_down(member))
    }

    fn list_changes(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.changes.sender.subscribe())
    }

    /// Its members, those down at the last look, and the names two members
    /// contest (`kept_by` holds it).
    fn describe(&self) -> Option<Value> {
        let current = self.current.lock();
        let catalog = current.as_ref().map(|(_, catalog)| catalog.clone());
        let down: Vec<&str> = catalog.iter().flat_map(|c| c.down.iter()).map(|&m| self.config.upstreams[m].as_str()).collect();
        let contested: Vec<Value> = catalog
            .iter()
            .flat_map(|c| c.collisions.iter())
            .map(|c| json!({"kind": c.what, "name": c.name, "kept_by": c.first, "also_offered_by": c.second}))
            .collect();
        Some(json!({
            "kind": "virtual_server",
            "members": self.config.upstreams,
            "names": format!("{:?}", self.config.names).to_lowercase(),
            "listed": catalog.is_some(),
            "down": down,
            "contested": contested,
        }))
    }

    /// The catalog: policies decide on a merged name as its member knows it.
    async fn origins(&self, ctx: &RequestCtx) -> Option<Arc<dyn Origins>> {
        Some(self.catalog(ctx).await)
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        join_all(self.members.iter().map(|member| member.session_ended(&ended))).await;
    }
}
