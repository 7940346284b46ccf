//! Sessionless (2026-07-28) clients of this upstream: passed through to an
//! upstream that speaks that revision too ([`Passthrough`], found by
//! `server/discover`), else served on a pooled upstream connection of their
//! principal ([`crate::sessionless`]); tools named in `task_tools` run as
//! durable tasks, with this gateway as their [`OperationRunner`].

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tether_server::{Authorized, OperationCtx, OperationRunner, OperationSpec, RawResult, RequestCtx, RpcError, raw_result};
use tether_wire::meta;

use super::Gateway;
use crate::connector::Passthrough;
use crate::sessionless::{self, Pool};

/// What serves an upstream's sessionless clients, shared by its endpoint
/// and the virtual servers it is a member of.
#[derive(Clone)]
pub(super) struct Sessionless {
    /// Upstream connections of sessionless (2026-07-28) clients.
    pub(super) pool: Arc<Pool>,
    /// The upstream as a 2026-07-28 server for sessionless clients, once
    /// `server/discover` found it speaks that revision.
    pub(super) passthrough: Arc<OnceLock<Arc<dyn Passthrough>>>,
}

impl Sessionless {
    pub(super) fn new(pool: Arc<Pool>) -> Self {
        Self { pool, passthrough: Arc::default() }
    }
}

impl Gateway {
    /// A sessionless (2026-07-28) client's request: served on a pooled
    /// upstream connection of its principal (see `sessionless`).
    pub(super) async fn sessionless_request(
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
        if let Some(passthrough) = self.sessionless.passthrough.get() {
            return passthrough.request(&ctx, method, params).await;
        }
        let authorization = self.sessionless_authorization(ctx.authorized());
        let principal = ctx.principal();
        let pooled = sessionless::pool_session(principal);
        let connect = |sink| self.connect(&pooled, principal, sessionless::initialize_params(), authorization, None, sink);
        let held = self.sessionless.pool.hold_for_request(&ctx, connect).await?;
        let level = ctx.request_meta().and_then(|m| m.get(meta::LOG_LEVEL)).and_then(Value::as_str);
        held.want_log_level(level).await;
        let timer = tether_server::metrics::upstream_request_started();
        let result = held.request(method, Some(Value::Object(sessionless::upstream_params(params)))).await;
        timer.done(&self.config.name);
        result
    }

    /// The client's `Authorization` for a sessionless request's upstream
    /// connection (only with `forward_auth`).
    fn sessionless_authorization(&self, presented: Option<&Authorized>) -> Option<String> {
        let token = presented.and_then(Authorized::bearer_token)?;
        self.connector.needs_client_authorization().then(|| crate::link::bearer_header(token))
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
        let held = self.sessionless.pool.hold_for_task(ctx.clone(), connect).await?;
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
