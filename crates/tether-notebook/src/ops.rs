//! The `init` and `session` tools: finding, starting, loading, listing,
//! searching and exporting notebook sessions. Every lookup is scoped to the
//! caller's principal.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value, json};
use tether_server::tether_wire::meta;
use tether_server::{OperationCtx, RequestCtx, RpcError};

use crate::repo::{NotebookSession, SessionFilter};
use crate::roots::{self, RootsView};
use crate::{CURRENT_SESSION, Notebook, repo_error};

const DEFAULT_LIST_LIMIT: usize = 20;
const MAX_LIST_LIMIT: usize = 200;
const DEFAULT_SEARCH_LIMIT: usize = 50;

/// ISO 8601 (UTC, milliseconds) of a store timestamp.
pub fn iso(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// "just now", "5 min ago", "3 h ago", "2 days ago".
pub fn ago(ms: i64) -> String {
    let secs = ((tether_store::now_ms() - ms).max(0) / 1000) as u64;
    match secs {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86400 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86400),
    }
}

pub(crate) fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn limit_arg(args: &Map<String, Value>, default: usize) -> usize {
    args.get("limit").and_then(Value::as_u64).map(|n| (n as usize).clamp(1, MAX_LIST_LIMIT)).unwrap_or(default)
}

pub(crate) fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn summary(s: &NotebookSession) -> Value {
    json!({
        "sessionId": s.id, "title": s.title, "tags": s.tags, "mcpRootUri": s.mcp_root_uri,
        "thoughtCount": s.thought_count, "branchCount": s.branch_count,
        "createdAt": iso(s.created_at_ms), "updatedAt": iso(s.updated_at_ms),
    })
}

pub(crate) fn context_result(success: bool, session: Option<&NotebookSession>, message: String) -> CallToolResult {
    let v = json!({
        "success": success,
        "sessionId": session.map(|s| s.id.clone()),
        "title": session.map(|s| s.title.clone()),
        "thoughtCount": session.map(|s| s.thought_count),
        "mcpRootUri": session.and_then(|s| s.mcp_root_uri.clone()),
        "updatedAt": session.map(|s| iso(s.updated_at_ms)),
        "message": message,
    });
    if success { CallToolResult::structured(v) } else { CallToolResult::structured_error(v) }
}

impl Notebook {
    pub(crate) async fn init(&self, ctx: &RequestCtx, args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        if let Some(request_meta) = ctx.request_meta() {
            return self.sessionless_init(ctx, request_meta, args).await;
        }
        let principal = ctx.principal().to_owned();
        match str_arg(&args, "operation") {
            Some("list_roots") => {
                let v = roots::ensure(ctx).await?;
                Ok(CallToolResult::structured(json!({
                    "roots": v.reported.clone().unwrap_or_default(),
                    "boundRoot": v.bound,
                    "rootsSupported": roots::client_supports_roots(&ctx.require_session()?.client_capabilities()),
                })))
            }
            Some("bind_root") => {
                let Some(uri) = str_arg(&args, "rootUri") else {
                    return Ok(tool_error("bind_root needs rootUri: one of the roots from init list_roots"));
                };
                let v = roots::ensure(ctx).await?;
                let listed = v.reported.as_ref().is_some_and(|r| r.iter().any(|r| r.uri == uri));
                if !listed {
                    let known: Vec<String> = v.reported.unwrap_or_default().into_iter().map(|r| r.uri).collect();
                    return Ok(tool_error(format!(
                        "{uri} is not one of the client's roots ({}); call init list_roots",
                        known.join(", ")
                    )));
                }
                let uri = uri.to_owned();
                ctx.require_session()?
                    .update_app_state(|app| {
                        app.insert(roots::BOUND_ROOT.into(), json!(uri));
                    })
                    .await?;
                Ok(CallToolResult::structured(json!({"success": true, "boundRoot": uri})))
            }
            Some("start_new") => {
                let v = roots::ensure(ctx).await?;
                let title = str_arg(&args, "title").map(str::to_owned);
                let tags: Vec<String> = args
                    .get("tags")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().filter_map(Value::as_str).map(str::to_owned).take(32).collect())
                    .unwrap_or_default();
                let session = NotebookSession::new(&principal, title, tags, v.bound.clone());
                self.repo.create_session(&session).await.map_err(repo_error)?;
                self.make_current(ctx, &session.id).await?;
                let root = v.bound.as_deref().unwrap_or("no root");
                Ok(context_result(true, Some(&session), format!("Started session {} ({root})", session.id)))
            }
            Some("load_context") => self.load_context(ctx, &principal, &args).await,
            Some("list_sessions") => self.list(&principal, &args).await,
            Some("get_state") => {
                let app = ctx.require_session()?.app_state().await;
                let bound = roots::view(&app).bound;
                let current = match app.get(CURRENT_SESSION).and_then(Value::as_str) {
                    Some(id) => self.repo.get_session(&principal, id).await.map_err(repo_error)?,
                    None => None,
                };
                Ok(CallToolResult::structured(json!({
                    "boundRoot": bound,
                    "sessionId": current.as_ref().map(|s| s.id.clone()),
                    "title": current.as_ref().map(|s| s.title.clone()),
                    "thoughtCount": current.as_ref().map(|s| s.thought_count).unwrap_or(0),
                })))
            }
            other => Ok(tool_error(format!(
                "init needs operation: one of list_roots, bind_root, start_new, load_context, list_sessions, get_state (got {})",
                other.unwrap_or("none")
            ))),
        }
    }

    async fn load_context(
        &self,
        ctx: &RequestCtx,
        principal: &str,
        args: &Map<String, Value>,
    ) -> Result<CallToolResult, RpcError> {
        if let Some(id) = str_arg(args, "sessionId") {
            let Some(session) = self.repo.get_session(principal, id).await.map_err(repo_error)? else {
                return Ok(context_result(false, None, format!("Session {id} not found")));
            };
            let bound = roots::view(&ctx.require_session()?.app_state().await).bound;
            if session.mcp_root_uri.is_some() && session.mcp_root_uri != bound {
                tracing::info!(notebook_session = %session.id, root = ?session.mcp_root_uri, bound = ?bound,
                    "loading a session of another root by explicit sessionId");
            }
            self.make_current(ctx, &session.id).await?;
            let message = format!(
                "Loaded session {} ({} thoughts, last updated {})",
                session.id,
                session.thought_count,
                ago(session.updated_at_ms)
            );
            return Ok(context_result(true, Some(&session), message));
        }
        if !roots::client_supports_roots(&ctx.require_session()?.client_capabilities()) {
            tracing::warn!(
                session = ctx.require_session()?.session_id(),
                "client does not support MCP roots: load_context needs a sessionId; bind a root to recover sessions automatically"
            );
            return Ok(context_result(
                false,
                None,
                "This client does not report MCP roots, so load_context needs a sessionId (see init list_sessions). \
                 With roots support the session of this project is found automatically."
                    .into(),
            ));
        }
        let RootsView { reported, bound } = roots::ensure(ctx).await?;
        let Some(root) = bound else {
            let known: Vec<String> = reported.unwrap_or_default().into_iter().map(|r| r.uri).collect();
            let message = if known.is_empty() {
                "No root is bound, and the client lists no roots: add your project's directory as a root in the \
                 client, or pass sessionId (see init list_sessions)"
                    .to_owned()
            } else {
                format!("No root is bound: call init bind_root with one of [{}], or pass sessionId", known.join(", "))
            };
            return Ok(context_result(false, None, message));
        };
        match self.repo.latest_for_root(principal, &root).await.map_err(repo_error)? {
            Some(session) => {
                self.make_current(ctx, &session.id).await?;
                tracing::info!(notebook_session = %session.id, %root, "auto-recovered session for root");
                let message = format!(
                    "Auto-recovered session {} ({} thoughts, last updated {})",
                    session.id,
                    session.thought_count,
                    ago(session.updated_at_ms)
                );
                Ok(context_result(true, Some(&session), message))
            }
            None => Ok(context_result(false, None, format!("No sessions found for {root}. Use start_new to begin."))),
        }
    }

    pub(crate) async fn list(&self, principal: &str, args: &Map<String, Value>) -> Result<CallToolResult, RpcError> {
        let filter = SessionFilter {
            root: str_arg(args, "rootUri").map(str::to_owned),
            tag: str_arg(args, "tag").map(str::to_owned),
            limit: limit_arg(args, DEFAULT_LIST_LIMIT),
        };
        let sessions = self.repo.list_sessions(principal, &filter).await.map_err(repo_error)?;
        Ok(CallToolResult::structured(json!({"sessions": sessions.iter().map(summary).collect::<Vec<_>>()})))
    }

    /// The session named by `sessionId`, or the current one.
    async fn named_or_current(
        &self,
        principal: &str,
        current: Option<&str>,
        args: &Map<String, Value>,
    ) -> Result<Option<NotebookSession>, RpcError> {
        let Some(id) = str_arg(args, "sessionId").or(current) else { return Ok(None) };
        self.repo.get_session(principal, id).await.map_err(repo_error)
    }

    /// The `session` tool, run as a resumable operation: pushes its result
    /// (an export in chunks of at most `ctx.chunk_bytes()`).
    pub(crate) async fn session_operation(&self, ctx: OperationCtx, args: Map<String, Value>) -> Result<(), RpcError> {
        let principal = ctx.principal().to_owned();
        let app = ctx.app_state().await;
        // The MCP session's current notebook session, or the one a
        // sessionless request names in its `_meta`.
        let current = app
            .get(CURRENT_SESSION)
            .or_else(|| ctx.request_meta().and_then(|m| m.get(meta::NOTEBOOK_SESSION)))
            .and_then(Value::as_str);
        let result = match str_arg(&args, "operation") {
            Some("list") => self.list(&principal, &args).await?,
            Some("get") => match self.named_or_current(&principal, current, &args).await? {
                Some(session) => {
                    let thoughts = self.repo.thoughts(&principal, &session.id).await.map_err(repo_error)?;
                    CallToolResult::structured(json!({"session": summary(&session), "thoughts": thoughts}))
                }
                None => tool_error("no such session: pass sessionId (see session list) or start one with init start_new"),
            },
            Some("search") => match str_arg(&args, "query") {
                Some(query) => {
                    let hits =
                        self.repo.search(&principal, query, limit_arg(&args, DEFAULT_SEARCH_LIMIT)).await.map_err(repo_error)?;
                    CallToolResult::structured(json!({"query": query, "hits": hits}))
                }
                None => tool_error("search needs query: the text to find in thoughts"),
            },
            Some("export") => {
                let format = str_arg(&args, "format").unwrap_or("markdown");
                if format != "markdown" && format != "json" {
                    tool_error(format!("format must be markdown or json, got {format}"))
                } else {
                    match self.named_or_current(&principal, current, &args).await? {
                        Some(session) => {
                            let thoughts = self.repo.thoughts(&principal, &session.id).await.map_err(repo_error)?;
                            let document = crate::export::render(&session, &thoughts, format);
                            let chunks = crate::export::split(&document, ctx.chunk_bytes());
                            let total = chunks.len() as f64;
                            for (i, chunk) in chunks.iter().enumerate().skip(ctx.resume_from() as usize) {
                                ctx.push(CallToolResult::success(vec![ContentBlock::text(*chunk)])).await?;
                                ctx.progress(i as f64 + 1.0, Some(total), Some("exporting"));
                            }
                            return Ok(());
                        }
                        None => tool_error("no such session: pass sessionId (see session list) or start one with init start_new"),
                    }
                }
            }
            other => {
                tool_error(format!("session needs operation: one of list, get, search, export (got {})", other.unwrap_or("none")))
            }
        };
        if ctx.resume_from() == 0 {
            ctx.push(result).await?;
        }
        Ok(())
    }

    pub(crate) async fn make_current(&self, ctx: &RequestCtx, id: &str) -> Result<(), RpcError> {
        let id = id.to_owned();
        ctx.require_session()?
            .update_app_state(|app| {
                app.insert(CURRENT_SESSION.into(), json!(id));
            })
            .await?;
        Ok(())
    }
}
