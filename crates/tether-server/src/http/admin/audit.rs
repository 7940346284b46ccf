//! `GET /admin/audit?principal=&decision=&limit=`: the latest policy
//! decisions the audit log keeps in memory (`crate::audit`), newest first,
//! at most `limit` (default 100, at most 1,000), of one principal and one
//! decision (`allow`, `deny`, `hidden`) where given. Without an audit log
//! (`--audit-log`), `{"enabled": false}` and no decisions.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{Admin, error};

const MAX_DECISIONS: usize = crate::audit::RECENT_LINES;
const DEFAULT_DECISIONS: usize = 100;

#[derive(Deserialize)]
pub(super) struct AuditQuery {
    limit: Option<usize>,
    principal: Option<String>,
    decision: Option<String>,
}

pub(super) async fn recent(State(admin): State<Admin>, Query(q): Query<AuditQuery>) -> Response {
    let limit = q.limit.unwrap_or(DEFAULT_DECISIONS).clamp(1, MAX_DECISIONS);
    let decision = q.decision.as_deref().filter(|d| !d.is_empty());
    if decision.is_some_and(|d| !["allow", "deny", "hidden"].contains(&d)) {
        return error(StatusCode::BAD_REQUEST, "decision must be allow, deny or hidden");
    }
    let principal = q.principal.as_deref().filter(|p| !p.is_empty());
    let Some(audit) = &admin.audit else {
        return axum::Json(json!({"enabled": false, "decisions": []})).into_response();
    };
    let decisions = audit.recent(principal, decision, limit);
    axum::Json(json!({
        "enabled": true,
        "decisions": decisions,
        "kept_at_most": crate::audit::RECENT_LINES,
        "dropped": audit.dropped(),
        "failing": audit.is_failing(),
    }))
    .into_response()
}
