//! `init` for a sessionless (2026-07-28) client. No MCP session remembers
//! its root or its current notebook session, so each request says them:
//! the root by the `root` argument or, for a client that declared roots, by
//! its answer to `roots/list` (asked through the request: an
//! `input_required` round); the notebook session by
//! `_meta["dev.tether/notebookSession"]`, which the results that pick one
//! name for the next calls.

use rmcp::model::{CallToolResult, MetaObject};
use serde_json::{Map, Value, json};
use tether_server::tether_wire::meta;
use tether_server::{RequestCtx, RpcError};

use crate::ops::{ago, context_result, str_arg, tool_error};
use crate::repo::NotebookSession;
use crate::{Notebook, repo_error, roots};

/// What to pass when the project cannot be known, in a user's words.
const PASS_ROOT: &str = "pass `root` (your project's directory as a URI, e.g. file:///home/me/project)";

/// A result that names the notebook session the next calls should go on in.
fn naming(mut result: CallToolResult, session: &NotebookSession) -> CallToolResult {
    let mut m = Map::new();
    m.insert(meta::NOTEBOOK_SESSION.into(), Value::String(session.id.clone()));
    result.meta = Some(MetaObject(m));
    result
}

impl Notebook {
    /// `init` without a session (see the module's comment).
    pub(crate) async fn sessionless_init(
        &self,
        ctx: &RequestCtx,
        request_meta: &Map<String, Value>,
        args: Map<String, Value>,
    ) -> Result<CallToolResult, RpcError> {
        let principal = ctx.principal().to_owned();
        match str_arg(&args, "operation") {
            Some("list_roots") => {
                let reported = roots::sessionless_roots(ctx).await?;
                let bound = match (str_arg(&args, "root"), reported.as_deref()) {
                    (Some(root), _) => Some(root.to_owned()),
                    (None, Some([only])) => Some(only.uri.clone()),
                    _ => None,
                };
                let mut answer = json!({
                    "roots": reported.clone().unwrap_or_default(),
                    "boundRoot": bound,
                    "rootsSupported": reported.is_some(),
                });
                if reported.is_none() && bound.is_none() {
                    answer["message"] = json!(format!(
                        "This client did not declare the roots capability: {PASS_ROOT} to init load_context and start_new."
                    ));
                }
                Ok(CallToolResult::structured(answer))
            }
            Some("bind_root") => {
                let Some(uri) = str_arg(&args, "rootUri") else {
                    return Ok(tool_error("bind_root needs rootUri: your project's directory as a URI"));
                };
                if let Some(reported) = roots::sessionless_roots(ctx).await?
                    && !reported.iter().any(|r| r.uri == uri)
                {
                    let known: Vec<String> = reported.into_iter().map(|r| r.uri).collect();
                    return Ok(tool_error(format!(
                        "{uri} is not one of the client's roots ({}); call init list_roots",
                        known.join(", ")
                    )));
                }
                Ok(CallToolResult::structured(json!({
                    "success": true,
                    "boundRoot": uri,
                    "message": format!(
                        "Without an MCP session nothing keeps this binding between calls: pass `root`: \"{uri}\" \
                         to init load_context and start_new."
                    ),
                })))
            }
            Some("start_new") => {
                let root = self.project_root(ctx, &args).await?.ok();
                let title = str_arg(&args, "title").map(str::to_owned);
                let tags: Vec<String> = args
                    .get("tags")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().filter_map(Value::as_str).map(str::to_owned).take(32).collect())
                    .unwrap_or_default();
                let session = NotebookSession::new(&principal, title, tags, root.clone());
                self.repo.create_session(&session).await.map_err(repo_error)?;
                let message = format!("Started session {} ({})", session.id, root.as_deref().unwrap_or("no root"));
                Ok(naming(context_result(true, Some(&session), message), &session))
            }
            Some("load_context") => {
                if let Some(id) = str_arg(&args, "sessionId") {
                    let Some(session) = self.repo.get_session(&principal, id).await.map_err(repo_error)? else {
                        return Ok(context_result(false, None, format!("Session {id} not found")));
                    };
                    let message = format!(
                        "Loaded session {} ({} thoughts, last updated {})",
                        session.id,
                        session.thought_count,
                        ago(session.updated_at_ms)
                    );
                    return Ok(naming(context_result(true, Some(&session), message), &session));
                }
                let root = match self.project_root(ctx, &args).await? {
                    Ok(root) => root,
                    Err(what_to_pass) => return Ok(context_result(false, None, what_to_pass)),
                };
                match self.repo.latest_for_root(&principal, &root).await.map_err(repo_error)? {
                    Some(session) => {
                        tracing::info!(notebook_session = %session.id, %root, "auto-recovered session for root (sessionless)");
                        let message = format!(
                            "Auto-recovered session {} ({} thoughts, last updated {})",
                            session.id,
                            session.thought_count,
                            ago(session.updated_at_ms)
                        );
                        Ok(naming(context_result(true, Some(&session), message), &session))
                    }
                    None => Ok(context_result(
                        false,
                        None,
                        format!("No sessions found for {root}. Use init start_new (with the same root) to begin."),
                    )),
                }
            }
            Some("list_sessions") => self.list(&principal, &args).await,
            Some("get_state") => {
                let current = match request_meta.get(meta::NOTEBOOK_SESSION).and_then(Value::as_str) {
                    Some(id) => self.repo.get_session(&principal, id).await.map_err(repo_error)?,
                    None => None,
                };
                Ok(CallToolResult::structured(json!({
                    "boundRoot": str_arg(&args, "root"),
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

    /// The project of a sessionless request: the `root` argument, else the
    /// client's one root (asked through the request); else what to pass.
    async fn project_root(&self, ctx: &RequestCtx, args: &Map<String, Value>) -> Result<Result<String, String>, RpcError> {
        if let Some(root) = str_arg(args, "root") {
            return Ok(Ok(root.to_owned()));
        }
        Ok(match roots::sessionless_roots(ctx).await? {
            None => Err(format!(
                "This client has no MCP session and did not declare the roots capability, so the notebook cannot \
                 tell which project you are in: {PASS_ROOT}, or `sessionId` (see init list_sessions), or declare \
                 the roots capability."
            )),
            Some(mut roots) if roots.len() == 1 => Ok(roots.remove(0).uri),
            Some(roots) if roots.is_empty() => {
                Err(format!("This client reported no roots: {PASS_ROOT}, or `sessionId` (see init list_sessions)."))
            }
            Some(roots) => {
                let known: Vec<String> = roots.into_iter().map(|r| r.uri).collect();
                Err(format!(
                    "This client reported several roots ({}): pass `root` with the one of this project, or `sessionId` \
                     (see init list_sessions).",
                    known.join(", ")
                ))
            }
        })
    }
}
