//! The client's MCP roots as the notebook sees them: the list it last
//! reported and the root bound for this MCP session, both kept in the
//! session's durable app state so they survive reconnects and restarts.
//!
//! Roots are asked for after `notifications/initialized`, again on
//! `notifications/roots/list_changed`, and, if a tool needs them before any
//! answer arrived, within the tool call itself (bounded wait).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tether_server::{RequestCtx, SessionCtx};

pub(crate) const ROOTS: &str = "roots";
pub(crate) const BOUND_ROOT: &str = "boundRoot";
/// Wait for an answer to a `roots/list` asked within a tool call.
pub(crate) const IN_CALL_WAIT: Duration = Duration::from_secs(3);
/// Wait for an answer to a `roots/list` asked on the standalone stream
/// (the client may open its GET a little later).
const BACKGROUND_WAIT: Duration = Duration::from_secs(60);
/// Roots kept from one answer.
const MAX_ROOTS: usize = 100;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Root {
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What the app state says about roots.
#[derive(Debug, Clone, Default)]
pub(crate) struct RootsView {
    /// `None` until the client answered `roots/list` once.
    pub reported: Option<Vec<Root>>,
    pub bound: Option<String>,
}

pub(crate) fn view(app: &Map<String, Value>) -> RootsView {
    RootsView {
        reported: app.get(ROOTS).and_then(|v| serde_json::from_value(v.clone()).ok()),
        bound: app.get(BOUND_ROOT).and_then(Value::as_str).map(str::to_owned),
    }
}

pub(crate) fn client_supports_roots(capabilities: &Value) -> bool {
    capabilities.get("roots").is_some_and(Value::is_object)
}

pub(crate) fn parse_answer(result: &Value) -> Vec<Root> {
    result
        .get("roots")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|r| serde_json::from_value::<Root>(r.clone()).ok())
                .filter(|r| !r.uri.is_empty())
                .take(MAX_ROOTS)
                .collect()
        })
        .unwrap_or_default()
}

/// Records a reported list; binds the only root, drops a binding to a root
/// that is no longer listed.
pub(crate) async fn record(ctx: &SessionCtx, roots: Vec<Root>) -> Result<RootsView, tether_server::RpcError> {
    let app = ctx
        .update_app_state(|app| {
            app.insert(ROOTS.into(), json!(roots));
            let bound = app.get(BOUND_ROOT).and_then(Value::as_str).map(str::to_owned);
            if bound.as_ref().is_some_and(|b| !roots.iter().any(|r| &r.uri == b)) {
                app.remove(BOUND_ROOT);
            }
            if roots.len() == 1 {
                app.insert(BOUND_ROOT.into(), json!(roots[0].uri));
            }
        })
        .await?;
    Ok(view(&app))
}

/// Asks the client for its roots on the standalone stream and records the
/// answer (after `initialized` and on `list_changed`).
pub(crate) async fn refresh(ctx: SessionCtx) {
    if !client_supports_roots(&ctx.client_capabilities()) {
        return;
    }
    match ctx.request_client("roots/list", None, BACKGROUND_WAIT).await {
        Ok(result) => {
            let roots = parse_answer(&result);
            let n = roots.len();
            match record(&ctx, roots).await {
                Ok(v) => tracing::info!(session = ctx.session_id(), roots = n, bound = ?v.bound, "client roots recorded"),
                Err(e) => tracing::warn!(session = ctx.session_id(), error = %e.message, "could not record client roots"),
            }
        }
        Err(e) => tracing::info!(session = ctx.session_id(), error = %e.message, "client did not answer roots/list"),
    }
}

/// The roots of a sessionless (2026-07-28) caller that declared roots,
/// asked through the request itself (the engine turns the ask into an
/// `input_required` round); `None` if it did not declare roots.
pub(crate) async fn sessionless_roots(ctx: &RequestCtx) -> Result<Option<Vec<Root>>, tether_server::RpcError> {
    if !client_supports_roots(ctx.caller().client_capabilities()) {
        return Ok(None);
    }
    let answer = ctx.request_client("roots/list", None, IN_CALL_WAIT).await?;
    Ok(Some(parse_answer(&answer)))
}

/// The one root of a sessionless caller that declared roots (see
/// [`sessionless_roots`]); `None` if it has no roots or several.
pub(crate) async fn sessionless_root(ctx: &RequestCtx) -> Result<Option<String>, tether_server::RpcError> {
    let mut roots = sessionless_roots(ctx).await?.unwrap_or_default();
    Ok(if roots.len() == 1 { roots.pop().map(|r| r.uri) } else { None })
}

/// The roots for a tool call: if the client supports roots and never
/// answered, ask now on the call's own stream and wait a few seconds.
pub(crate) async fn ensure(ctx: &RequestCtx) -> Result<RootsView, tether_server::RpcError> {
    let session = ctx.require_session()?;
    let current = view(&session.app_state().await);
    if current.reported.is_some() || !client_supports_roots(&session.client_capabilities()) {
        return Ok(current);
    }
    match ctx.request_client("roots/list", None, IN_CALL_WAIT).await {
        Ok(result) => record(&session, parse_answer(&result)).await,
        Err(e) => {
            tracing::info!(session = session.session_id(), error = %e.message, "proceeding without roots");
            Ok(current)
        }
    }
}
