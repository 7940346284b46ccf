//! Forwarding both ways: a session's requests and notifications go to its
//! upstream connection (made if there is none), the answer comes back, and
//! what the upstream sends meanwhile reaches the client through the link
//! (see [`crate::link`]). A request that changes what a new connection must
//! replay (the log level, a subscription) is remembered in the session's
//! durable state once the upstream took it; an upstream that forgot its
//! session gets a request again on a new one where that is safe.

use serde_json::{Map, Value};
use tether_server::{RawResult, RequestCtx, RpcError, SessionCtx};

use super::Gateway;
use super::notes::{Notes, request_with_note};
use crate::progress::Progress;
use crate::state::SessionState;
use crate::upstream::UpstreamError;

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
        let mut connection = self.upstream(session, ctx.authorized()).await?;
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
            Notes::Leave if connection.upstream.resumable() => {
                request_with_note(ctx, &connection, &self.slot, method, params, issued.clone(), &track).await
            }
            // No note could help (a child of this process dies with it):
            // no timer either.
            Notes::Leave => connection.upstream.request(method, params).await,
            Notes::None => connection.upstream.request_tracked(method, params, &track).await,
        };
        // The upstream forgot its session: a new one, initialized as the
        // client initialized this session, takes the request again if the
        // upstream cannot have run it (its POST was refused) or running it
        // twice is harmless. The client sees only the result.
        if let (Err(e), Some(params)) = (&result, again)
            && *e == UpstreamError::ForgotSession
            && (track.point().is_none() || is_repeatable(method))
        {
            tracing::info!(upstream = %self.config.name, session = session.session_id(), %method, "the upstream forgot its session; sending the request again on a new one");
            connection = self.upstream(session, ctx.authorized()).await?;
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

    /// After a request that changes what a new connection must replay.
    async fn remember(&self, session: &SessionCtx, replayed: Replayed) -> Result<(), RpcError> {
        match replayed {
            Replayed::Nothing => Ok(()),
            Replayed::LogLevel(level) => {
                SessionState::update(session, &self.slot, |part| part.log_level.clone_from(&level)).await
            }
            Replayed::Subscription { uri, subscribe } => {
                SessionState::update(session, &self.slot, |part| {
                    part.subscriptions.retain(|u| u != &uri);
                    if subscribe {
                        part.subscriptions.push(uri.clone());
                    }
                })
                .await
            }
        }
    }

    /// A client notification, forwarded to the session's connection (made
    /// if there is none); one that cannot be is logged.
    pub(super) async fn notify_upstream(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
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
/// before the params go upstream (only these two kinds copy anything). A
/// level or a URI that is not a string is not replayed (the level is
/// forgotten).
enum Replayed {
    Nothing,
    LogLevel(Option<String>),
    Subscription { uri: String, subscribe: bool },
}

impl Replayed {
    fn of(method: &str, params: Option<&Map<String, Value>>) -> Self {
        let field = |k: &str| params.and_then(|p| p.get(k));
        match method {
            "logging/setLevel" => Self::LogLevel(field("level").and_then(Value::as_str).map(str::to_owned)),
            "resources/subscribe" | "resources/unsubscribe" => match field("uri").and_then(Value::as_str) {
                Some(uri) => Self::Subscription { uri: uri.to_owned(), subscribe: method == "resources/subscribe" },
                None => Self::Nothing,
            },
            _ => Self::Nothing,
        }
    }
}
