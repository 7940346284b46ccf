//! [`Policed`]: an endpoint's application with the [`Policy`] applied to
//! what it answers, and [`filter_list`], the lists with only what a caller
//! may use. Through a virtual server, both decide on the name the client
//! sees and on the member's own ([`McpApp::origins`]).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tether_wire::RpcError;

use super::{Policy, Subject, Target};
use crate::app::{CutOff, Initialize, McpApp, Origins, RawResult, SessionEnd, raw_result};
use crate::engine::{RequestCtx, SessionCtx};

/// A `tools/list`, `prompts/list` or `resources/list` result with only what
/// `subject` may use (what is left out is audited as `hidden`); other
/// results as they are.
pub fn filter_list(
    policy: &Policy,
    endpoint: &str,
    method: &str,
    subject: &Subject,
    origins: Option<&dyn Origins>,
    mut result: Map<String, Value>,
) -> Map<String, Value> {
    let (key, target): (&str, fn(&str) -> Target<'_>) = match method {
        "tools/list" => ("tools", |name| Target::Tool(name)),
        "prompts/list" => ("prompts", |name| Target::Prompt(name)),
        "resources/list" => ("resources", |uri| Target::Resource(uri)),
        _ => return result,
    };
    let field = if key == "resources" { "uri" } else { "name" };
    if let Some(Value::Array(items)) = result.get_mut(key) {
        items.retain(|item| {
            let name = item.get(field).and_then(Value::as_str).unwrap_or_default();
            let origin = origins.and_then(|o| o.origin(target(name)));
            let decision = policy.decide_through(endpoint, method, target(name), origin.as_ref(), subject);
            if !decision.is_allowed() {
                policy.record(endpoint, method, target(name), origin.as_ref(), &subject.principal, &decision);
            }
            decision.is_allowed()
        });
    }
    result
}

/// An endpoint's application with the policy applied to what it answers:
/// `tools/list` keeps only the tools the caller may use, and a call of
/// another is refused (the HTTP front refuses it first, with its status;
/// this is the same rule for whatever reaches the application otherwise).
pub struct Policed {
    inner: Arc<dyn McpApp>,
    endpoint: String,
    policy: Arc<Policy>,
}

impl Policed {
    /// `app` served at `endpoint` under `policy` (as it is without one, or
    /// when no rule covers the endpoint nor any of `members`, the endpoints
    /// whose tools it serves under its own names: a virtual server's members).
    pub fn wrap(app: Arc<dyn McpApp>, endpoint: &str, members: &[String], policy: Option<&Arc<Policy>>) -> Arc<dyn McpApp> {
        match policy {
            Some(policy) if policy.covers(endpoint) || members.iter().any(|m| policy.covers(m)) => {
                Arc::new(Self { inner: app, endpoint: endpoint.to_owned(), policy: policy.clone() })
            }
            _ => app,
        }
    }

    /// Who asks, as the front verified it (no claims for a request that did
    /// not come through the front).
    fn subject(ctx: &RequestCtx) -> Subject {
        let claims = ctx.authorized().map(|a| a.claims().clone()).unwrap_or_default();
        Subject { principal: ctx.principal().to_owned(), claims }
    }
}

#[async_trait]
impl McpApp for Policed {
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        self.inner.initialize(init).await
    }

    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        let policy = &self.policy;
        if matches!(method, "tools/list" | "prompts/list" | "resources/list") {
            let subject = Self::subject(&ctx);
            let raw = self.inner.handle_request(ctx.clone(), method, params).await?;
            let result: Map<String, Value> = serde_json::from_str(raw.get())
                .map_err(|e| RpcError::internal(format!("{method} answered with no object: {e}")))?;
            // Read after the list: the names are the ones it holds now.
            let origins = self.inner.origins(&ctx).await;
            return raw_result(&filter_list(policy, &self.endpoint, method, &subject, origins.as_deref(), result));
        }
        let Some(target) = Target::of(method, params.as_ref())? else {
            return self.inner.handle_request(ctx, method, params).await;
        };
        let subject = Self::subject(&ctx);
        let origin = self.inner.origins(&ctx).await.and_then(|o| o.origin(target));
        // The front's decision on the name the client sees, where it made
        // one; then only the rule of the member the name comes from.
        let decision = match ctx.authorized().and_then(|a| a.decision_on(method, target)) {
            Some(seen) => policy.through(seen.clone(), method, target, origin.as_ref(), &subject),
            None => policy.decide_through(&self.endpoint, method, target, origin.as_ref(), &subject),
        };
        policy.record(&self.endpoint, method, target, origin.as_ref(), &subject.principal, &decision);
        if decision.is_allowed() {
            return self.inner.handle_request(ctx, method, params).await;
        }
        Err(RpcError::new(tether_wire::code::SERVER_ERROR, Policy::refusal_message(&subject, target, origin.as_ref(), &decision)))
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        self.inner.on_notification(ctx, method, params).await
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        self.inner.on_session_end(ended).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }

    async fn discover(&self) -> Option<Map<String, Value>> {
        self.inner.discover().await
    }

    fn passes_input_through(&self) -> bool {
        self.inner.passes_input_through()
    }

    fn describe_session(
        &self,
        app_state: &Map<String, Value>,
        local: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> Option<Value> {
        self.inner.describe_session(app_state, local)
    }

    fn list_changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        self.inner.list_changes()
    }

    fn unavailable(&self) -> Option<RpcError> {
        self.inner.unavailable()
    }

    async fn recover_request(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        self.inner.recover_request(ctx, cut_off).await
    }

    fn recovers_unnoted(&self) -> bool {
        self.inner.recovers_unnoted()
    }

    async fn origins(&self, ctx: &RequestCtx) -> Option<Arc<dyn Origins>> {
        self.inner.origins(ctx).await
    }

    fn describe(&self) -> Option<Value> {
        self.inner.describe()
    }
}
