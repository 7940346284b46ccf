//! The session's upstream connection, this gateway's part of the session:
//! opened by `initialize` (its durable part kept in the session), found
//! live, or rebuilt when it is gone (after a restart, on another replica,
//! after the child died): the stored upstream session carried on where the
//! transport can, else a new one started with the stored `initialize` and
//! what the client set up since (log level, subscriptions) replayed. Let go
//! of when the session leaves this process.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tether_server::{Authorized, EndReason, Initialize, RpcError, SessionCtx, SessionEnd};
use tether_wire::meta;

use super::Gateway;
use crate::link::{Connection, Link, LinkSink};
use crate::slot::Slot;
use crate::state::{Part, SessionState};
use crate::upstream::Started;

impl Gateway {
    /// The session's live connection, made (and initialized the way the
    /// client initialized this session) if there is none.
    /// `authorized` is what the front established about the request that
    /// needs it (its token sent upstream only with `forward_auth`).
    pub(super) async fn upstream(&self, session: &SessionCtx, authorized: Option<&Authorized>) -> Result<Connection, RpcError> {
        let link = self.slot.link(session);
        let authorization = self.forwarded(&link, authorized);
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
        let stored = SessionState::read(&session.app_state().await)?;
        let part = stored.part(&self.slot);
        // An HTTP upstream session opened by another replica (or before a
        // restart) is carried on as it is: the upstream keeps its state.
        let sink = LinkSink::new(link, &self.config.name, self.changes.clone());
        sink.attach(session).await;
        if let Some(carry_on) = part.and_then(|p| p.carry_on.as_ref()) {
            let attached = self.connector.attach(session.session_id(), carry_on, authorization.clone(), sink.clone()).await;
            if let Some(upstream) = attached {
                return Ok(self.go_live(session, link, live, Connection::new(upstream, sink)));
            }
        }
        // A member added to its virtual server after the session began is
        // initialized the way the client initialized the others.
        let params = Value::Object(stored.initialize_of(&self.slot).cloned().unwrap_or_default());
        let started =
            self.connect(session.session_id(), session.principal(), params, authorization, Some(link), sink.clone()).await?;
        let Started { upstream, carry_on, resumed, .. } = started;
        // From here the upstream's requests can be answered (the replays below may bring some).
        let connection = Connection::new(upstream.clone(), sink);
        SessionState::update(session, &self.slot, |part| part.carry_on.clone_from(&carry_on)).await?;
        // The client did all this once; a new connection must see it too
        // (a child taken over as it was has seen it).
        if resumed {
            return Ok(self.go_live(session, link, live, connection));
        }
        upstream.notify("notifications/initialized", None).await?;
        let Some(part) = part else { return Ok(self.go_live(session, link, live, connection)) };
        if let Some(level) = &part.log_level {
            upstream.request("logging/setLevel", Some(json!({"level": level}))).await?;
        }
        for uri in &part.subscriptions {
            upstream.request("resources/subscribe", Some(json!({"uri": uri}))).await?;
        }
        Ok(self.go_live(session, link, live, connection))
    }

    /// The client's `Authorization` for the connector, where it needs it
    /// (`forward_auth`, a token exchange): this request's (remembered in
    /// memory for connections a notification opens), else none.
    pub(super) fn forwarded(&self, link: &Link, authorized: Option<&Authorized>) -> Option<String> {
        if !self.connector.needs_client_authorization() {
            return None;
        }
        link.authorization(authorized)
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

    /// Whether the session's connection to this upstream is up.
    pub(crate) fn is_live(&self, session: &SessionCtx) -> bool {
        let link = self.slot.link(session);
        link.live.try_lock().is_ok_and(|live| live.as_ref().is_some_and(|c| c.upstream.is_alive()))
    }

    /// This upstream's part of a session, for operators: `connected` (this
    /// process holds a live connection), `stored` (a later request connects,
    /// carrying on the stored upstream session where the transport can),
    /// `not started`, or `unreadable` (with the `error`: a newer tether's
    /// state, see [`SessionState::read`]); and the upstream's session ID,
    /// for an HTTP upstream.
    pub(crate) fn session_view(
        &self,
        app_state: &Map<String, Value>,
        local: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> Value {
        let stored = SessionState::read(app_state);
        let part = stored.as_ref().ok().and_then(|s| s.part(&self.slot));
        let state = match (&stored, part, local) {
            (Err(_), ..) => "unreadable",
            (Ok(_), None, _) => "not started",
            (Ok(_), Some(_), Some(local)) if self.slot.is_connected(local) => "connected",
            (Ok(_), Some(_), _) => "stored",
        };
        let upstream_session = part.and_then(|p| p.carry_on.as_ref()).and_then(|c| c.get("sessionId")).cloned();
        let mut view = json!({"upstream": self.config.name, "state": state, "upstream_session": upstream_session});
        if let Err(e) = stored {
            view["error"] = json!(e.message);
        }
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
    /// this part of the session's durable state (see [`Self::keep`]). Takes
    /// the `initialize` shared, so a virtual server opens its members at once.
    pub(crate) async fn open(&self, init: &Initialize<'_>, link: &Arc<Link>) -> Result<(Map<String, Value>, Part), RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let params = upstream_params(init.params);
        link.set_principal(init.caller.principal.as_str());
        let authorization = self.forwarded(link, init.authorized());
        // What the upstream sends before the session exists waits in the sink.
        let sink = LinkSink::new(link, &self.config.name, self.changes.clone());
        let started = self
            .connect(
                init.session_id(),
                &init.caller.principal,
                Value::Object(params.clone()),
                authorization,
                Some(link),
                sink.clone(),
            )
            .await?;
        let Started { upstream, initialize_result, carry_on, .. } = started;
        let result: Map<String, Value> = serde_json::from_str(initialize_result.get()).map_err(|e| {
            RpcError::internal(format!("upstream `{}` answered initialize with no object: {e}", self.config.name))
        })?;
        let capabilities = result.get("capabilities").and_then(Value::as_object).cloned();
        let state = Part { initialize: Some(without_trace_context(params)), carry_on, capabilities, ..Part::default() };
        *link.live.lock().await = Some(Connection::new(upstream, sink));
        // Idle from now on until a request uses it (so it can make room).
        link.touch();
        self.links.register(link);
        Ok((result, state))
    }

    /// The capabilities the upstream declared when this part of the session
    /// was opened (none before, or for a session opened before they were kept).
    pub(crate) fn stored_capabilities<'a>(&self, state: &'a SessionState) -> Option<&'a Map<String, Value>> {
        state.part(&self.slot)?.capabilities.as_ref()
    }

    /// Keeps this part of a new session's durable state (from [`Self::open`]).
    pub(crate) fn keep(&self, state: &mut SessionState, part: Part) {
        state.put(&self.slot, part);
    }

    /// A member's part of an `initialize` it could not answer (its upstream
    /// is down): the client's params are kept, so the first request that
    /// needs the member starts its connection the way the client asked.
    pub(crate) fn initialize_later(&self, state: &mut SessionState, init: &Initialize<'_>) {
        let params = without_trace_context(upstream_params(init.params));
        state.put(&self.slot, Part { initialize: Some(params), ..Part::default() });
    }
}

/// The client's `initialize` params as the upstream should see them:
/// without tether's own `_meta` keys (the resume token is tether's).
fn upstream_params(params: &Map<String, Value>) -> Map<String, Value> {
    let mut params = params.clone();
    if let Some(Value::Object(m)) = params.get_mut("_meta") {
        m.retain(|k, _| !k.starts_with(meta::TETHER_PREFIX));
    }
    params
}

/// `initialize` params to keep for later connections: a trace context
/// belongs to the request that carried it, not to the replays.
fn without_trace_context(mut params: Map<String, Value>) -> Map<String, Value> {
    if let Some(Value::Object(m)) = params.get_mut("_meta") {
        m.remove(meta::TRACEPARENT);
        m.remove(meta::TRACESTATE);
    }
    params
}
