//! [`Policy`]: which tools, prompts and resources a principal may use on
//! an endpoint, written as CEL expressions over its token's claims
//! (`[[policies]]` in the config file), and [`Policed`], the application
//! wrapper that applies it.
//!
//! A rule covers the tools, prompts and resources whose names (a
//! resource's URI, normalised by `uri`, its globs likewise) match its
//! `tools`, `prompts` and `resources` globs, on
//! the endpoints whose names match its endpoint glob (`""` is `/mcp`); a
//! rule that names none of the three covers every one of them. A
//! [`Target`] is allowed when every rule covering it allows; a resource URI
//! that cannot be normalised safely is refused wherever a rule's resource
//! glob covers its scheme. An expression
//! sees `jwt` (the access token's claims, `jwt.scope` as a list of scopes,
//! so a rule asks `"tickets:write" in jwt.scope`; empty for a static
//! token), `principal`, and `mcp` (`mcp.endpoint`, `mcp.method`, `mcp.name`,
//! and one of `mcp.tool.name`, `mcp.prompt.name`, `mcp.resource.uri`). An
//! expression that does not evaluate to a boolean denies (and is logged).
//! What is denied is left out of `tools/list`, `prompts/list` and
//! `resources/list`; a `tools/call`, `prompts/get`, `resources/read` or
//! `resources/subscribe` of it is refused before it reaches the
//! application: with a rule that names the `scope` it needs, HTTP 403
//! `insufficient_scope` naming every such scope (the front does that),
//! else a JSON-RPC error. Each decision on a use, and each item left out
//! of a list, goes to the [`AuditLog`] when one is set.
//!
//! `[scope_implies]` says which scopes a broader one brings along
//! (`"tools:write" = ["tools:read"]`, followed transitively): a token's
//! `jwt.scope` holds them too, and a challenge names only the broadest of
//! the scopes a request needs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tether_wire::RpcError;

use crate::app::Origin;
pub use crate::audit::AuditLog;
pub use policed::{Policed, filter_list};

mod policed;
mod uri;

/// The config file's policy keys: `[[policies]]` and `[scope_implies]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PolicyConfig {
    /// `[[policies]]`, in order.
    #[serde(default)]
    pub policies: Vec<RuleConfig>,
    /// A scope and the narrower scopes it brings along.
    #[serde(default)]
    pub scope_implies: BTreeMap<String, Vec<String>>,
}

/// One `[[policies]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Glob over endpoint names (`""` is `/mcp`); default every endpoint.
    #[serde(default = "every")]
    pub endpoint: String,
    /// Globs over tool names.
    pub tools: Option<Vec<String>>,
    /// Globs over prompt names.
    pub prompts: Option<Vec<String>>,
    /// Globs over resource URIs.
    pub resources: Option<Vec<String>>,
    /// The CEL expression; true allows.
    pub allow: String,
    /// The scope a denial by this rule asks for (`insufficient_scope`).
    pub scope: Option<String>,
}

fn every() -> String {
    "*".to_owned()
}

struct Rule {
    endpoint: glob::Pattern,
    tools: Vec<glob::Pattern>,
    prompts: Vec<glob::Pattern>,
    resources: Vec<glob::Pattern>,
    program: cel::Program,
    source: String,
    scope: Option<String>,
}

impl Rule {
    fn covers(&self, endpoint: &str, target: &Target<'_>) -> bool {
        let globs = match target {
            Target::Tool(_) => &self.tools,
            Target::Prompt(_) => &self.prompts,
            Target::Resource(_) => &self.resources,
        };
        self.endpoint.matches(endpoint) && globs.iter().any(|g| g.matches(target.name()))
    }

    /// Whether a resource URI of `scheme` that cannot be normalised falls
    /// under this rule (`None`: no scheme could be read; any resource glob covers it).
    fn covers_scheme(&self, endpoint: &str, scheme: Option<&str>) -> bool {
        self.endpoint.matches(endpoint) && self.resources.iter().any(|g| uri::glob_covers_scheme(g.as_str(), scheme))
    }
}

/// What a request uses: a tool, a prompt or a resource, by name (a resource by URI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// A tool, by name.
    Tool(&'a str),
    /// A prompt, by name.
    Prompt(&'a str),
    /// A resource, by URI.
    Resource(&'a str),
}

impl<'a> Target<'a> {
    /// What `method` with `params` uses, if it is one of the uses policies
    /// decide; `-32602` when the name (or URI) it names is missing or not a
    /// string, so nothing reaches an application a policy could not decide on.
    pub fn of(method: &str, params: Option<&'a Map<String, Value>>) -> Result<Option<Self>, RpcError> {
        let field = |key: &str| match params.and_then(|p| p.get(key)) {
            Some(Value::String(name)) => Ok(name.as_str()),
            Some(_) => Err(RpcError::invalid_params(format!("{method}: params.{key} must be a string"))),
            None => Err(RpcError::invalid_params(format!("{method} needs params.{key}"))),
        };
        Ok(match method {
            "tools/call" => Some(Self::Tool(field("name")?)),
            "prompts/get" => Some(Self::Prompt(field("name")?)),
            "resources/read" | "resources/subscribe" => Some(Self::Resource(field("uri")?)),
            _ => None,
        })
    }

    /// The same kind of use, of `name`.
    pub fn renamed(&self, name: &'a str) -> Self {
        match self {
            Self::Tool(_) => Self::Tool(name),
            Self::Prompt(_) => Self::Prompt(name),
            Self::Resource(_) => Self::Resource(name),
        }
    }

    /// The name, or a resource's URI.
    pub fn name(&self) -> &'a str {
        match self {
            Self::Tool(name) | Self::Prompt(name) | Self::Resource(name) => name,
        }
    }

    /// `tool`, `prompt` or `resource`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Tool(_) => "tool",
            Self::Prompt(_) => "prompt",
            Self::Resource(_) => "resource",
        }
    }

    fn mcp(&self, endpoint: &str, method: &str) -> Value {
        let own = match self {
            Self::Tool(name) => json!({"name": name}),
            Self::Prompt(name) => json!({"name": name}),
            Self::Resource(uri) => json!({"uri": uri}),
        };
        json!({"endpoint": endpoint, "method": method, "name": self.name(), self.kind(): own})
    }
}

/// What a principal may do with one [`Target`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by these rules (their sources; none when no rule covers it).
    Allow {
        /// The rules that allowed it.
        rules: Vec<String>,
    },
    /// Refused by these rules (their sources), asking for these scopes
    /// (none: no rule that denied names one).
    Deny {
        /// The rules that refused it.
        rules: Vec<String>,
        /// The scopes that would allow it.
        scopes: Vec<String>,
    },
}

/// Who is asking, as the rules see it.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// The principal.
    pub principal: String,
    /// The access token's claims (`Value::Null` for a static token).
    pub claims: Arc<Value>,
}

impl Decision {
    /// Whether it allows.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allow { .. })
    }

    /// Both decisions at once: allowed when both allow, else denied by
    /// every rule that denied, asking for every scope they ask.
    fn and(self, other: Decision) -> Decision {
        match (self, other) {
            (Self::Allow { mut rules }, Self::Allow { rules: more }) => {
                rules.extend(more);
                Self::Allow { rules }
            }
            (Self::Deny { mut rules, mut scopes }, Self::Deny { rules: more, scopes: asked }) => {
                rules.extend(more);
                for scope in asked {
                    if !scopes.contains(&scope) {
                        scopes.push(scope);
                    }
                }
                Self::Deny { rules, scopes }
            }
            (deny @ Self::Deny { .. }, Self::Allow { .. }) | (Self::Allow { .. }, deny @ Self::Deny { .. }) => deny,
        }
    }
}

/// Every rule of the config, and where decisions are written.
pub struct Policy {
    rules: Vec<Rule>,
    audit: Option<AuditLog>,
    /// A scope and the narrower scopes it brings along (as configured).
    implies: BTreeMap<String, Vec<String>>,
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
                // Naming none of the three covers every one.
                let every = r.tools.is_none() && r.prompts.is_none() && r.resources.is_none();
                let globs = |list: &Option<Vec<String>>| match (list, every) {
                    (Some(list), _) => list.iter().map(|g| pattern(g)).collect::<Result<Vec<_>, _>>(),
                    (None, true) => pattern("*").map(|p| vec![p]),
                    (None, false) => Ok(Vec::new()),
                };
                Ok(Rule {
                    endpoint: pattern(&r.endpoint)?,
                    tools: globs(&r.tools)?,
                    prompts: globs(&r.prompts)?,
                    resources: globs(&uri::normalize_globs(&r.resources).map_err(|e| format!("{what}: {e}"))?)?,
                    program: cel::Program::compile(&r.allow).map_err(|e| format!("{what}: allow is not CEL: {e}"))?,
                    source: r.allow,
                    scope: r.scope,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { rules, audit: None, implies: BTreeMap::new() })
    }

    /// The policy of the config file's `[[policies]]` and `[scope_implies]`.
    pub fn from_config(config: PolicyConfig) -> Result<Self, String> {
        let mut policy = Self::new(config.policies)?;
        policy.implies = config.scope_implies;
        Ok(policy)
    }

    /// `scopes` with every scope they imply, transitively.
    fn with_implied(&self, scopes: Vec<String>) -> Vec<String> {
        let mut all = scopes;
        let mut i = 0;
        while i < all.len() {
            for narrower in self.implies.get(&all[i]).into_iter().flatten() {
                if !all.contains(narrower) {
                    all.push(narrower.clone());
                }
            }
            i += 1;
        }
        all
    }

    /// Every decision on a use, and every item left out of a list, is written to `audit`.
    pub fn with_audit(mut self, audit: AuditLog) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Whether `subject` may use `target` on `endpoint` (by `method`).
    pub fn decide(&self, endpoint: &str, method: &str, target: Target<'_>, subject: &Subject) -> Decision {
        // A resource is matched (and seen by the expressions) by its
        // normalised URI; one that cannot be normalised safely is refused
        // where a rule covers its scheme.
        let normalized;
        let target = match target {
            Target::Resource(raw) => match uri::normalize(raw) {
                Ok(uri) => {
                    normalized = uri;
                    Target::Resource(&normalized)
                }
                Err(bad) if self.rules.iter().any(|r| r.covers_scheme(endpoint, bad.scheme.as_deref())) => {
                    return Decision::Deny {
                        rules: vec![format!("the resource URI cannot be normalised: {bad}")],
                        scopes: Vec::new(),
                    };
                }
                Err(_) => return Decision::Allow { rules: Vec::new() },
            },
            other => other,
        };
        let covering: Vec<&Rule> = self.rules.iter().filter(|r| r.covers(endpoint, &target)).collect();
        if covering.is_empty() {
            return Decision::Allow { rules: Vec::new() };
        }
        let jwt = jwt_view(&subject.claims, |scopes| self.with_implied(scopes));
        let mcp = target.mcp(endpoint, method);
        let (mut denying, mut scopes) = (Vec::new(), Vec::new());
        for rule in &covering {
            if !allows(rule, &jwt, &subject.principal, &mcp) {
                denying.push(rule.source.clone());
                scopes.extend(rule.scope.clone());
            }
        }
        if denying.is_empty() {
            return Decision::Allow { rules: covering.iter().map(|r| r.source.clone()).collect() };
        }
        scopes.dedup();
        // One challenge names the broadest: a scope another one asked brings along is left out.
        let asked = scopes.clone();
        scopes.retain(|s| !asked.iter().any(|t| t != s && self.with_implied(vec![t.clone()]).contains(s)));
        Decision::Deny { rules: denying, scopes }
    }

    /// Whether `subject` may use `target` on `endpoint` where the endpoint
    /// serves it from `origin` (a virtual server's member): the rules of
    /// both the endpoint (the name the client sees) and the member's own
    /// endpoint (its own name) decide, so no endpoint is a way around a
    /// member's rules.
    pub fn decide_through(
        &self,
        endpoint: &str,
        method: &str,
        target: Target<'_>,
        origin: Option<&Origin>,
        subject: &Subject,
    ) -> Decision {
        self.through(self.decide(endpoint, method, target, subject), method, target, origin, subject)
    }

    /// `seen`, the decision on the name the client sees, joined with the
    /// rules of the member `origin` names (as [`Self::decide_through`]).
    pub fn through(
        &self,
        seen: Decision,
        method: &str,
        target: Target<'_>,
        origin: Option<&Origin>,
        subject: &Subject,
    ) -> Decision {
        match origin {
            Some(origin) => seen.and(self.decide(&origin.endpoint, method, target.renamed(&origin.name), subject)),
            None => seen,
        }
    }

    /// Writes `decision` to the audit log, if one is set.
    pub fn record(
        &self,
        endpoint: &str,
        method: &str,
        target: Target<'_>,
        origin: Option<&Origin>,
        principal: &str,
        decision: &Decision,
    ) {
        if let Some(audit) = &self.audit {
            audit.record(endpoint, method, target, origin, principal, decision);
        }
    }

    /// Whether any rule covers `endpoint` (the others are left alone).
    pub fn covers(&self, endpoint: &str) -> bool {
        self.rules.iter().any(|r| r.endpoint.matches(endpoint))
    }

    /// The refusal of a use `decision` denied, worded for the client.
    pub fn refusal_message(subject: &Subject, target: Target<'_>, origin: Option<&Origin>, decision: &Decision) -> String {
        let Decision::Deny { scopes, .. } = decision else { return String::new() };
        let through = match origin {
            Some(o) => format!(" (`{}` of `/mcp/{}`)", o.name, o.endpoint),
            None => String::new(),
        };
        let head = format!("`{}` may not use the {} `{}`{through} here", subject.principal, target.kind(), target.name());
        match (scopes.is_empty(), subject.claims.is_null() && subject.principal != crate::app::ANONYMOUS) {
            (true, _) => format!("{head}: the endpoint's policy refuses it"),
            (false, false) => format!("{head} without the scope {}; get a token with it and retry", scopes.join(" ")),
            (false, true) => format!(
                "{head} without the scope {}: a token of the token file carries no OAuth scopes or claims; use an access token of the authorization server that has it",
                scopes.join(" ")
            ),
        }
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

/// The claims as the rules see them: `scope` always a list, with what
/// `expand` adds (the scopes they imply).
fn jwt_view(claims: &Value, expand: impl Fn(Vec<String>) -> Vec<String>) -> Value {
    let mut view = claims.as_object().cloned().unwrap_or_default();
    let scopes: Vec<String> = match (view.get("scope"), view.get("scp")) {
        (Some(Value::String(s)), _) => s.split_whitespace().map(str::to_owned).collect(),
        (Some(Value::Array(a)), _) | (_, Some(Value::Array(a))) => {
            a.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    };
    view.insert("scope".into(), json!(expand(scopes)));
    Value::Object(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(endpoint: &str, tools: &[&str], allow: &str, scope: Option<&str>) -> RuleConfig {
        RuleConfig {
            endpoint: endpoint.into(),
            tools: Some(tools.iter().map(|t| t.to_string()).collect()),
            prompts: None,
            resources: None,
            allow: allow.into(),
            scope: scope.map(str::to_owned),
        }
    }

    fn allowed(decision: Decision) -> bool {
        decision.is_allowed()
    }

    fn subject(scope: &str) -> Subject {
        Subject { principal: "svc@http://as".into(), claims: Arc::new(json!({"sub": "svc", "scope": scope})) }
    }

    #[test]
    fn a_tool_is_allowed_when_every_rule_covering_it_allows() {
        let policy = Policy::new(vec![
            rule("*", &["write_*"], r#""tools:write" in jwt.scope"#, Some("tools:write")),
            rule("fx", &["*"], r#"mcp.tool.name.startsWith("read_") || "tools:read" in jwt.scope"#, Some("tools:read")),
        ])
        .unwrap();
        let reader = subject("tools:read");
        assert_eq!(
            policy.decide("", "tools/call", Target::Tool("read_a"), &reader),
            Decision::Allow { rules: vec![] },
            "no rule of /mcp covers it"
        );
        assert_eq!(
            policy.decide("", "tools/call", Target::Tool("write_a"), &reader),
            Decision::Deny { rules: vec![r#""tools:write" in jwt.scope"#.into()], scopes: vec!["tools:write".into()] }
        );
        assert!(allowed(policy.decide("", "tools/call", Target::Tool("write_a"), &subject("tools:read tools:write"))));
        let nobody = subject("");
        assert!(allowed(policy.decide("fx", "tools/call", Target::Tool("read_x"), &nobody)), "the name alone allows");
        assert!(
            allowed(policy.decide("fx", "prompts/get", Target::Prompt("write_x"), &nobody)),
            "a rule naming tools covers no prompt"
        );
        match policy.decide("fx", "tools/call", Target::Tool("write_x"), &nobody) {
            Decision::Deny { scopes, .. } => assert_eq!(scopes, ["tools:write", "tools:read"], "every scope asked at once"),
            other => panic!("{other:?}"),
        }
        // A static token has no claims: scope rules deny it.
        let static_token = Subject { principal: "alice".into(), claims: Arc::new(Value::Null) };
        assert!(!allowed(policy.decide("", "tools/call", Target::Tool("write_a"), &static_token)));
    }

    #[test]
    fn a_use_through_another_endpoint_is_decided_by_its_members_rules_too() {
        let policy = Policy::new(vec![rule("u1", &["delete"], r#""tools:write" in jwt.scope"#, Some("tools:write"))]).unwrap();
        let origin = Origin { endpoint: "u1".into(), name: "delete".into() };
        let reader = subject("tools:read");
        assert!(allowed(policy.decide("team", "tools/call", Target::Tool("u1__delete"), &reader)), "the name alone");
        let through = policy.decide_through("team", "tools/call", Target::Tool("u1__delete"), Some(&origin), &reader);
        assert_eq!(
            through,
            Decision::Deny { rules: vec![r#""tools:write" in jwt.scope"#.into()], scopes: vec!["tools:write".into()] }
        );
        assert!(allowed(policy.decide_through(
            "team",
            "tools/call",
            Target::Tool("u1__delete"),
            Some(&origin),
            &subject("tools:write")
        )));
        let message = Policy::refusal_message(&reader, Target::Tool("u1__delete"), Some(&origin), &through);
        assert!(message.contains("`delete` of `/mcp/u1`") && message.contains("tools:write"), "{message}");
        // A token of the token file has no claims: told so.
        let file_token = Subject { principal: "alice".into(), claims: Arc::new(Value::Null) };
        let denied = policy.decide_through("team", "tools/call", Target::Tool("u1__delete"), Some(&origin), &file_token);
        let message = Policy::refusal_message(&file_token, Target::Tool("u1__delete"), Some(&origin), &denied);
        assert!(message.contains("token file carries no OAuth scopes"), "{message}");
        // A call whose name is not a string is no use a policy can decide on.
        for params in [json!({"name": ["delete"]}), json!({"name": null}), json!({})] {
            assert_eq!(Target::of("tools/call", params.as_object()).unwrap_err().code, tether_wire::code::INVALID_PARAMS);
        }
    }

    #[test]
    fn lists_keep_only_the_allowed_tools_and_bad_rules_are_named() {
        let policy = Policy::new(vec![rule("*", &["secret"], "false", None)]).unwrap();
        let listed = json!({"tools": [{"name": "open"}, {"name": "secret"}], "nextCursor": "x"});
        let kept = filter_list(&policy, "", "tools/list", &subject(""), None, listed.as_object().cloned().unwrap());
        assert_eq!(Value::Object(kept), json!({"tools": [{"name": "open"}], "nextCursor": "x"}));
        assert!(Policy::new(vec![rule("*", &["*"], "jwt.scope.exists(", None)]).unwrap_err().contains("#1"));
        assert!(Policy::new(vec![rule("[", &["*"], "true", None)]).unwrap_err().contains("not a pattern"));
        // Not a boolean: denied.
        let odd = Policy::new(vec![rule("*", &["*"], "1 + 1", None)]).unwrap();
        assert!(!allowed(odd.decide("", "tools/call", Target::Tool("x"), &subject(""))));
    }

    #[test]
    fn prompts_and_resources_are_covered_by_their_globs_or_by_a_rule_naming_nothing() {
        let mut prompts = rule("*", &[], r#"mcp.prompt.name != "secret" || "admin" in jwt.scope"#, Some("admin"));
        prompts.tools = None;
        prompts.prompts = Some(vec!["*".into()]);
        let mut files = rule("*", &[], r#"mcp.resource.uri.startsWith("file:///public/")"#, None);
        files.tools = None;
        files.resources = Some(vec!["file://*".into()]);
        let policy = Policy::new(vec![prompts, files]).unwrap();
        let nobody = subject("");
        assert!(allowed(policy.decide("", "prompts/get", Target::Prompt("greet"), &nobody)));
        assert_eq!(
            policy.decide("", "prompts/get", Target::Prompt("secret"), &nobody),
            Decision::Deny {
                rules: vec![r#"mcp.prompt.name != "secret" || "admin" in jwt.scope"#.into()],
                scopes: vec!["admin".into()]
            }
        );
        assert!(allowed(policy.decide("", "prompts/get", Target::Prompt("secret"), &subject("admin"))));
        assert!(allowed(policy.decide("", "resources/read", Target::Resource("file:///public/a"), &nobody)));
        assert!(!allowed(policy.decide("", "resources/read", Target::Resource("file:///etc/passwd"), &nobody)));
        assert!(allowed(policy.decide("", "resources/read", Target::Resource("https://x/y"), &nobody)), "not covered");
        assert!(allowed(policy.decide("", "tools/call", Target::Tool("secret"), &nobody)), "no rule names tools");

        let listed = json!({"resources": [{"uri": "file:///public/a"}, {"uri": "file:///etc/passwd"}]});
        let kept = filter_list(&policy, "", "resources/list", &nobody, None, listed.as_object().cloned().unwrap());
        assert_eq!(Value::Object(kept), json!({"resources": [{"uri": "file:///public/a"}]}));

        // A rule naming none of tools, prompts and resources covers all three.
        let mut everything = rule("*", &[], r#""member" in jwt.scope"#, Some("member"));
        everything.tools = None;
        let policy = Policy::new(vec![everything]).unwrap();
        for target in [Target::Tool("a"), Target::Prompt("b"), Target::Resource("c://d")] {
            assert!(!allowed(policy.decide("", "x", target, &nobody)), "{target:?}");
            assert!(allowed(policy.decide("", "x", target, &subject("member"))), "{target:?}");
        }
        assert_eq!(Target::of("resources/subscribe", json!({"uri": "u://1"}).as_object()), Ok(Some(Target::Resource("u://1"))));
        assert_eq!(Target::of("tools/list", None), Ok(None));
    }

    #[test]
    fn a_broader_scope_brings_the_narrower_ones_and_a_challenge_names_the_broadest() {
        let config = PolicyConfig {
            policies: vec![
                rule("*", &["read_*", "write_*"], r#""tools:read" in jwt.scope"#, Some("tools:read")),
                rule("*", &["write_*"], r#""tools:write" in jwt.scope"#, Some("tools:write")),
            ],
            scope_implies: BTreeMap::from([
                ("tools:admin".to_owned(), vec!["tools:write".to_owned()]),
                ("tools:write".to_owned(), vec!["tools:read".to_owned()]),
            ]),
        };
        let policy = Policy::from_config(config).unwrap();
        assert!(allowed(policy.decide("", "tools/call", Target::Tool("read_a"), &subject("tools:write"))), "write brings read");
        assert!(allowed(policy.decide("", "tools/call", Target::Tool("write_a"), &subject("tools:admin"))), "transitively");
        match policy.decide("", "tools/call", Target::Tool("write_a"), &subject("")) {
            Decision::Deny { rules, scopes } => {
                assert_eq!(rules.len(), 2);
                assert_eq!(scopes, ["tools:write"], "tools:read comes with tools:write");
            }
            other => panic!("{other:?}"),
        }
    }
}
