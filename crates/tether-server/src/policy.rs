//! [`Policy`]: which tools a principal may use on an endpoint, written as
//! CEL expressions over its token's claims (`[[policies]]` in the config
//! file), and [`Policed`], the application wrapper that applies it.
//!
//! A rule covers the tools whose names match its globs on the endpoints
//! whose names match its endpoint glob (`""` is `/mcp`); a tool is allowed
//! when every rule covering it allows. An expression sees `jwt` (the access
//! token's claims, `jwt.scope` as a list of scopes, so a rule asks
//! `"tickets:write" in jwt.scope`; empty for a static token), `principal`,
//! and `mcp` (`mcp.endpoint`, `mcp.method`, `mcp.tool.name`). An expression that does not evaluate to a boolean
//! denies (and is logged). A denied tool is left out of `tools/list`; a call
//! of it is refused before it reaches the application: with a rule that
//! names the `scope` it needs, HTTP 403 `insufficient_scope` naming every
//! such scope (the front does that), else a JSON-RPC error.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tether_wire::RpcError;

use crate::app::{CutOff, Initialize, McpApp, RawResult, SessionEnd, raw_result};
use crate::engine::{RequestCtx, SessionCtx};
use crate::http::Auth;

/// One `[[policies]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Glob over endpoint names (`""` is `/mcp`); default every endpoint.
    #[serde(default = "every")]
    pub endpoint: String,
    /// Globs over tool names; default every tool.
    #[serde(default = "every_tool")]
    pub tools: Vec<String>,
    /// The CEL expression; true allows.
    pub allow: String,
    /// The scope a denial by this rule asks for (`insufficient_scope`).
    pub scope: Option<String>,
}

fn every() -> String {
    "*".to_owned()
}

fn every_tool() -> Vec<String> {
    vec!["*".to_owned()]
}

struct Rule {
    endpoint: glob::Pattern,
    tools: Vec<glob::Pattern>,
    program: cel::Program,
    source: String,
    scope: Option<String>,
}

/// What a principal may do with one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused by these rules (their sources), asking for these scopes
    /// (none: no rule that denied names one).
    Deny {
        rules: Vec<String>,
        scopes: Vec<String>,
    },
}

/// Who is asking, as the rules see it.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub principal: String,
    /// The access token's claims (`Value::Null` for a static token).
    pub claims: Value,
}

/// Every rule of the config.
pub struct Policy {
    rules: Vec<Rule>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.rules.iter().map(|r| &r.source)).finish()
    }
}

impl Policy {
    /// Compiles the rules; an expression or glob that does not parse names its rule.
    pub fn new(rules: Vec<RuleConfig>) -> Result<Self, String> {
        let rules = rules
            .into_iter()
            .enumerate()
            .map(|(n, r)| {
                let what = format!("[[policies]] #{}", n + 1);
                let pattern = |g: &str| glob::Pattern::new(g).map_err(|e| format!("{what}: `{g}` is not a pattern: {e}"));
                Ok(Rule {
                    endpoint: pattern(&r.endpoint)?,
                    tools: r.tools.iter().map(|t| pattern(t)).collect::<Result<_, _>>()?,
                    program: cel::Program::compile(&r.allow).map_err(|e| format!("{what}: allow is not CEL: {e}"))?,
                    source: r.allow,
                    scope: r.scope,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { rules })
    }

    /// Whether `subject` may use `tool` on `endpoint` (by `method`).
    pub fn decide(&self, endpoint: &str, method: &str, tool: &str, subject: &Subject) -> Decision {
        let covering: Vec<&Rule> =
            self.rules.iter().filter(|r| r.endpoint.matches(endpoint) && r.tools.iter().any(|t| t.matches(tool))).collect();
        if covering.is_empty() {
            return Decision::Allow;
        }
        let jwt = jwt_view(&subject.claims);
        let mcp = json!({"endpoint": endpoint, "method": method, "tool": {"name": tool}});
        let (mut rules, mut scopes) = (Vec::new(), Vec::new());
        for rule in covering {
            if !allows(rule, &jwt, &subject.principal, &mcp) {
                rules.push(rule.source.clone());
                scopes.extend(rule.scope.clone());
            }
        }
        if rules.is_empty() {
            Decision::Allow
        } else {
            scopes.dedup();
            Decision::Deny { rules, scopes }
        }
    }

    /// Whether any rule covers `endpoint` (the others are left alone).
    pub fn covers(&self, endpoint: &str) -> bool {
        self.rules.iter().any(|r| r.endpoint.matches(endpoint))
    }
}

fn allows(rule: &Rule, jwt: &Value, principal: &str, mcp: &Value) -> bool {
    let mut context = cel::Context::default();
    let added = context
        .add_variable("jwt", jwt)
        .and_then(|()| context.add_variable("principal", principal))
        .and_then(|()| context.add_variable("mcp", mcp));
    if let Err(e) = added {
        tracing::warn!(rule = %rule.source, error = %e, "a policy's variables could not be made; denied");
        return false;
    }
    match rule.program.execute(&context) {
        Ok(cel::Value::Bool(allowed)) => allowed,
        Ok(other) => {
            tracing::warn!(rule = %rule.source, result = ?other, "a policy did not evaluate to a boolean; denied");
            false
        }
        Err(e) => {
            tracing::debug!(rule = %rule.source, error = %e, "a policy could not be evaluated for this request; denied");
            false
        }
    }
}

/// The claims as the rules see them: `scope` always a list.
fn jwt_view(claims: &Value) -> Value {
    let mut view = claims.as_object().cloned().unwrap_or_default();
    let scopes: Vec<Value> = match (view.get("scope"), view.get("scp")) {
        (Some(Value::String(s)), _) => s.split_whitespace().map(|s| json!(s)).collect(),
        (Some(Value::Array(a)), _) | (_, Some(Value::Array(a))) => a.clone(),
        _ => Vec::new(),
    };
    view.insert("scope".into(), Value::Array(scopes));
    Value::Object(view)
}

/// The tools of a `tools/list` result `subject` may use (others removed).
pub fn filter_tools(policy: &Policy, endpoint: &str, subject: &Subject, mut result: Map<String, Value>) -> Map<String, Value> {
    if let Some(Value::Array(tools)) = result.get_mut("tools") {
        tools.retain(|tool| {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            policy.decide(endpoint, "tools/list", name, subject) == Decision::Allow
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
    auth: Auth,
}

impl Policed {
    /// `app` served at `endpoint` under `auth`'s policy (as it is when no
    /// rule covers the endpoint).
    pub fn wrap(app: Arc<dyn McpApp>, endpoint: &str, auth: &Auth) -> Arc<dyn McpApp> {
        match auth.policy() {
            Some(policy) if policy.covers(endpoint) => {
                Arc::new(Self { inner: app, endpoint: endpoint.to_owned(), auth: auth.clone() })
            }
            _ => app,
        }
    }

    async fn subject(&self, ctx: &RequestCtx) -> Subject {
        let authorization = ctx.client_authorization().map(|a| a.header_value());
        self.auth.subject(authorization, &self.endpoint, ctx.principal()).await
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
        let Some(policy) = self.auth.policy() else { return self.inner.handle_request(ctx, method, params).await };
        match method {
            "tools/list" => {
                let subject = self.subject(&ctx).await;
                let raw = self.inner.handle_request(ctx, method, params).await?;
                let result: Map<String, Value> = serde_json::from_str(raw.get())
                    .map_err(|e| RpcError::internal(format!("tools/list answered with no object: {e}")))?;
                raw_result(&filter_tools(policy, &self.endpoint, &subject, result))
            }
            "tools/call" => {
                let tool = params.as_ref().and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default().to_owned();
                let subject = self.subject(&ctx).await;
                match policy.decide(&self.endpoint, method, &tool, &subject) {
                    Decision::Allow => self.inner.handle_request(ctx, method, params).await,
                    Decision::Deny { .. } => Err(RpcError::new(
                        tether_wire::code::SERVER_ERROR,
                        format!("`{}` may not call `{tool}` here: the endpoint's policy refuses it", subject.principal),
                    )),
                }
            }
            _ => self.inner.handle_request(ctx, method, params).await,
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(endpoint: &str, tools: &[&str], allow: &str, scope: Option<&str>) -> RuleConfig {
        RuleConfig {
            endpoint: endpoint.into(),
            tools: tools.iter().map(|t| t.to_string()).collect(),
            allow: allow.into(),
            scope: scope.map(str::to_owned),
        }
    }

    fn subject(scope: &str) -> Subject {
        Subject { principal: "svc@http://as".into(), claims: json!({"sub": "svc", "scope": scope}) }
    }

    #[test]
    fn a_tool_is_allowed_when_every_rule_covering_it_allows() {
        let policy = Policy::new(vec![
            rule("*", &["write_*"], r#""tools:write" in jwt.scope"#, Some("tools:write")),
            rule("fx", &["*"], r#"mcp.tool.name.startsWith("read_") || "tools:read" in jwt.scope"#, Some("tools:read")),
        ])
        .unwrap();
        let reader = subject("tools:read");
        assert_eq!(policy.decide("", "tools/call", "read_a", &reader), Decision::Allow, "no rule of /mcp covers it");
        assert_eq!(
            policy.decide("", "tools/call", "write_a", &reader),
            Decision::Deny { rules: vec![r#""tools:write" in jwt.scope"#.into()], scopes: vec!["tools:write".into()] }
        );
        assert_eq!(policy.decide("", "tools/call", "write_a", &subject("tools:read tools:write")), Decision::Allow);
        let nobody = subject("");
        assert_eq!(policy.decide("fx", "tools/call", "read_x", &nobody), Decision::Allow, "the name alone allows");
        match policy.decide("fx", "tools/call", "write_x", &nobody) {
            Decision::Deny { scopes, .. } => assert_eq!(scopes, ["tools:write", "tools:read"], "every scope asked at once"),
            other => panic!("{other:?}"),
        }
        // A static token has no claims: scope rules deny it.
        let static_token = Subject { principal: "alice".into(), claims: Value::Null };
        assert!(matches!(policy.decide("", "tools/call", "write_a", &static_token), Decision::Deny { .. }));
    }

    #[test]
    fn lists_keep_only_the_allowed_tools_and_bad_rules_are_named() {
        let policy = Policy::new(vec![rule("*", &["secret"], "false", None)]).unwrap();
        let listed = json!({"tools": [{"name": "open"}, {"name": "secret"}], "nextCursor": "x"});
        let kept = filter_tools(&policy, "", &subject(""), listed.as_object().cloned().unwrap());
        assert_eq!(Value::Object(kept), json!({"tools": [{"name": "open"}], "nextCursor": "x"}));
        assert!(Policy::new(vec![rule("*", &["*"], "jwt.scope.exists(", None)]).unwrap_err().contains("#1"));
        assert!(Policy::new(vec![rule("[", &["*"], "true", None)]).unwrap_err().contains("not a pattern"));
        // Not a boolean: denied.
        let odd = Policy::new(vec![rule("*", &["*"], "1 + 1", None)]).unwrap();
        assert!(matches!(odd.decide("", "tools/call", "x", &subject("")), Decision::Deny { .. }));
    }
}
