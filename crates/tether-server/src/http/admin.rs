//! The admin API (`--admin-token-env VAR`): find and end sessions, see the
//! endpoints, the calls running and the latest policy decisions. The page
//! `/console/admin` (the `tether-console` crate) is built on it.
//!
//! - `GET /admin/sessions?limit=&cursor=&principal=&upstream=&idle=`: one
//!   page of live sessions (every principal), filtered; `next` is the cursor
//!   of the next page. `upstream` is the endpoint's name (`/mcp/NAME`; empty
//!   for `/mcp`), `idle` a duration such as `90s`, `10m`, `2h` (sessions idle
//!   at least that long).
//! - `GET /admin/sessions/ID`: the record, its open streams with their heads,
//!   the requests this process runs for it, and the operations it started
//!   (resumable calls; each is also a task under its ID).
//! - `DELETE /admin/sessions/ID`: ends it as the client's DELETE would.
//! - `POST /admin/notify?principal=&upstream=` with `{"method":
//!   "notifications/…", "params": {…}}`: sends that notification to every
//!   session this process holds in memory (filtered), stored on each one's
//!   standalone stream first; answers `{"notified": N, "failed": M}` once
//!   all are stored. An operator's announcement (`notifications/message`),
//!   or a `notifications/tools/list_changed` after changing what a gateway's
//!   upstream offers. Sessions only in the store (idle long enough to leave
//!   memory) and other replicas' sessions are not included.
//!
//! - `GET /admin/endpoints`: every endpoint (`/mcp`, `/mcp/NAME`) and what
//!   its application says of itself: a virtual server its members, the
//!   members down and the names two members contest (who keeps each).
//!
//! - `GET /admin/calls?principal=&upstream=&session=&limit=` and
//!   `GET /admin/calls/stream`: the calls this process runs now, and the
//!   same pushed as they start and end (SSE; `admin/calls.rs`).
//! - `GET /admin/audit?principal=&decision=&limit=`: the latest policy
//!   decisions, when the audit log is on (`admin/audit.rs`).
//!
//! Every request needs `Authorization: Bearer <the token>`; a missing or
//! wrong one gets 401 (compared in constant time, on digests, so neither
//! the content nor the length leaks). Before that, a request whose
//! `Origin` is neither a localhost origin nor one of `--allowed-origin` is
//! refused (403), as on `/mcp`: a page of another site cannot use the
//! admin API through an operator's browser. The token travels in a header
//! only, never in a cookie or a URL, so a browser never sends it on its own.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tether_store::{SessionRecord, now_ms};

use crate::audit::AuditLog;
use crate::engine::Engine;

mod audit;
mod calls;

/// Sessions per page at most, and by default.
const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;
/// Store pages read for one filtered page at most (bounded work per request).
const MAX_SCANS: usize = 10;

#[derive(Clone)]
struct Admin {
    engine: Engine,
    audit: Option<AuditLog>,
    /// Open `/admin/calls/stream` connections (at most `calls::MAX_WATCHERS`).
    watchers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// The admin token, as its digest, and the origins allowed besides localhost ones.
#[derive(Clone)]
struct Guard {
    token_digest: [u8; 32],
    origins: std::sync::Arc<[String]>,
}

/// The `/admin` routes, answering only to `Bearer token` and, when a
/// request has an `Origin`, only to a localhost origin or one of
/// `origins` (`--allowed-origin`); `audit` is the audit log whose latest
/// decisions `GET /admin/audit` shows.
pub fn admin_router(engine: Engine, token: &str, origins: &[String], audit: Option<AuditLog>) -> Router {
    let admin = Admin { engine, audit, watchers: Default::default() };
    let routes = Router::new()
        .route("/admin/sessions", get(list))
        .route("/admin/sessions/{id}", get(show).delete(end))
        .route("/admin/notify", post(notify))
        .route("/admin/endpoints", get(endpoints))
        .route("/admin/calls", get(calls::list))
        .route("/admin/calls/stream", get(calls::stream))
        .route("/admin/audit", get(audit::recent))
        .with_state(admin);
    admin_guarded(token, origins, routes)
}

/// `routes` (under `/admin/`) answering only to `Bearer token` and to the
/// origins [`admin_router`] allows, as the admin API's own do: for admin
/// routes of what runs the engine (the keeper's, in the `tether` binary).
pub fn admin_guarded(token: &str, origins: &[String], routes: Router) -> Router {
    let guard = Guard { token_digest: Sha256::digest(token.as_bytes()).into(), origins: origins.into() };
    routes.route_layer(axum::middleware::from_fn_with_state(guard, authorize))
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

async fn authorize(State(admin): State<Guard>, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    // The Origin check comes first, as on `/mcp`.
    if let Err(refused) = super::validate::origin(request.headers(), &admin.origins) {
        return error(refused.status, refused.message);
    }
    if !authorized(&admin, request.headers()) {
        crate::metrics::auth_failure();
        let mut response =
            error(StatusCode::UNAUTHORIZED, "the admin API needs `Authorization: Bearer <token>` with the admin token");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    next.run(request).await
}

fn authorized(admin: &Guard, headers: &HeaderMap) -> bool {
    let Some(token) =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(tether_wire::headers::bearer_token)
    else {
        return false;
    };
    let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
    digest.ct_eq(&admin.token_digest).into()
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
    principal: Option<String>,
    upstream: Option<String>,
    idle: Option<String>,
}

/// `90`, `90s`, `10m`, `2h`, `1d` as milliseconds.
fn parse_idle(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: i64 = s[..split].parse().ok()?;
    let unit = match &s[split..] {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// The endpoint a stored session was initialized on (`""`: `/mcp`).
fn endpoint_of(record: &SessionRecord) -> &str {
    record.state.get("endpoint").and_then(Value::as_str).unwrap_or("")
}

/// When the session was last active: exact if this process holds it,
/// else from its stored expiry (which trails activity by up to a tenth of the TTL).
fn last_active(engine: &Engine, record: &SessionRecord) -> i64 {
    engine
        .last_seen(&record.id)
        .unwrap_or_else(|| record.expires_at_ms.saturating_sub(engine.config().session_ttl.as_millis() as i64))
}

/// [`session_summary`] with what this process knows of it now: its
/// requests running here and its SSE connections open here.
fn summary(engine: &Engine, record: &SessionRecord, now: i64) -> Value {
    let mut out = session_summary(record, last_active(engine, record), engine.last_seen(&record.id).is_some(), now);
    out["in_flight"] = json!(engine.in_flight(&record.id).len());
    out["connections"] = json!(engine.open_connections(&record.id));
    out
}

/// One session as the admin API and `tether sessions` show it; `last` is
/// when it was last active, `in_memory` whether a server holds it now.
pub fn session_summary(record: &SessionRecord, last: i64, in_memory: bool, now: i64) -> Value {
    json!({
        "id": record.id,
        "principal": record.principal,
        "upstream": endpoint_of(record),
        "protocol_version": record.state.get("protocol_version"),
        "client": record.state.get("client_info"),
        "created_at_ms": record.created_at_ms,
        "last_active_ms": last,
        "idle_ms": (now - last).max(0),
        "expires_at_ms": record.expires_at_ms,
        "in_memory": in_memory,
    })
}

async fn endpoints(State(admin): State<Admin>) -> Response {
    let endpoints: Vec<Value> = admin
        .engine
        .describe_endpoints()
        .into_iter()
        .map(|(name, described)| {
            let path = if name.is_empty() { "/mcp".to_owned() } else { format!("/mcp/{name}") };
            json!({"endpoint": name, "path": path, "app": described})
        })
        .collect();
    axum::Json(json!({"endpoints": endpoints})).into_response()
}

async fn list(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let idle = match q.idle.as_deref().map(|s| (s, parse_idle(s))) {
        None => None,
        Some((_, Some(ms))) => Some(ms),
        Some((s, None)) => return error(StatusCode::BAD_REQUEST, format!("idle `{s}` is not a duration such as 90s, 10m or 2h")),
    };
    let now = now_ms();
    let engine = &admin.engine;
    let (mut sessions, mut cursor) = (Vec::new(), q.cursor);
    for _ in 0..MAX_SCANS {
        let page = match engine.store().scan_sessions(cursor.as_deref(), limit, now).await {
            Ok(page) => page,
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {e}")),
        };
        cursor = page.next;
        for record in page.sessions {
            let keep = q.principal.as_deref().is_none_or(|p| p == record.principal)
                && q.upstream.as_deref().is_none_or(|u| u == endpoint_of(&record))
                && idle.is_none_or(|ms| now - last_active(engine, &record) >= ms);
            if keep {
                sessions.push(summary(engine, &record, now));
            }
        }
        // A page may hold fewer than `limit` when filters skip many: bounded work, `next` goes on.
        if sessions.len() >= limit || cursor.is_none() {
            break;
        }
    }
    axum::Json(json!({"sessions": sessions, "next": cursor})).into_response()
}

async fn show(State(admin): State<Admin>, Path(id): Path<String>) -> Response {
    let engine = &admin.engine;
    let now = now_ms();
    let record = match engine.store().get_session(&id, now).await {
        Ok(Some(record)) => record,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no live session {id}")),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {e}")),
    };
    let standalone = record.state.get("standalone_stream").and_then(Value::as_str).unwrap_or("").to_owned();
    let mut streams = match engine.store().open_streams(&id).await {
        Ok(streams) => streams,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {e}")),
    };
    if !standalone.is_empty()
        && !streams.iter().any(|s| s.stream == standalone)
        && let Ok(Some(s)) = engine.store().stream(&id, &standalone).await
    {
        streams.push(s);
    }
    let streams: Vec<Value> = streams
        .iter()
        .map(|s| {
            json!({
                "stream": s.stream,
                "kind": if s.stream == standalone { "standalone" } else { "request" },
                "first_seq": s.first_seq,
                "head": s.last_seq,
                "finished": s.finished,
            })
        })
        .collect();
    let in_flight = engine.in_flight(&id);
    let operations = match engine.operations_of(&id).await {
        Ok(operations) => operations,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {e}")),
    };
    let mut out = summary(engine, &record, now);
    if let Some(obj) = out.as_object_mut() {
        obj.insert("revision".into(), json!(record.revision));
        obj.insert("state".into(), record.state.clone());
        obj.insert("streams".into(), json!(streams));
        obj.insert("requests_in_flight".into(), json!(in_flight));
        obj.insert("operations".into(), json!(operations));
        if let Some(upstreams) = engine.describe_session(&record) {
            obj.insert("upstreams".into(), upstreams);
        }
    }
    axum::Json(out).into_response()
}

async fn end(State(admin): State<Admin>, Path(id): Path<String>) -> Response {
    let engine = &admin.engine;
    let session = match engine.session_by_id(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no live session {id}")),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    match engine.delete(session).await {
        Ok(()) => {
            tracing::info!(session = %id, "session ended through the admin API");
            axum::Json(json!({"deleted": id})).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[derive(Deserialize)]
struct NotifyQuery {
    principal: Option<String>,
    upstream: Option<String>,
}

#[derive(Deserialize)]
struct Notification {
    method: String,
    #[serde(default)]
    params: Option<Value>,
}

async fn notify(State(admin): State<Admin>, Query(q): Query<NotifyQuery>, body: axum::body::Bytes) -> Response {
    let n: Notification = match serde_json::from_slice(&body) {
        Ok(n) => n,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"method\": \"notifications/…\", \"params\": {{…}}}}: {e}"),
            );
        }
    };
    // Only notifications: a request would need someone to wait for 10,000 answers.
    if !n.method.starts_with("notifications/") {
        return error(StatusCode::BAD_REQUEST, format!("`{}` is not a notification (notifications/…)", n.method));
    }
    if n.params.as_ref().is_some_and(|p| !p.is_object()) {
        return error(StatusCode::BAD_REQUEST, "params must be an object");
    }
    let keep = |s: &crate::engine::Session| {
        q.principal.as_deref().is_none_or(|p| p == s.principal) && q.upstream.as_deref().is_none_or(|u| u == s.endpoint)
    };
    let (notified, failed) = admin.engine.notify_held(keep, &n.method, n.params.as_ref()).await;
    tracing::info!(method = %n.method, notified, failed, "notification sent through the admin API");
    let status = if failed == 0 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(json!({"notified": notified, "failed": failed}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::parse_idle;

    #[test]
    fn idle_durations() {
        assert_eq!(parse_idle("90"), Some(90_000));
        assert_eq!(parse_idle("10m"), Some(600_000));
        assert_eq!(parse_idle("2h"), Some(7_200_000));
        assert_eq!(parse_idle("x"), None);
        assert_eq!(parse_idle("5y"), None);
        assert_eq!(parse_idle("99999999999999999999d"), None);
    }
}
