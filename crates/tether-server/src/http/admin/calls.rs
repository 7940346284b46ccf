//! The calls this process runs now (`engine/calls.rs`), for operators:
//!
//! - `GET /admin/calls?principal=&upstream=&session=&limit=`: at most
//!   `limit` (default 200, at most 1,000) of them, the longest running
//!   first, and how many match in all (`total`).
//! - `GET /admin/calls/stream`: the same, pushed (`text/event-stream`): a
//!   `snapshot` event (`{"calls": [...], "total": N, "now_ms": T}`, at most
//!   1,000 calls), then a `start` event (one call) and an `end` event
//!   (`{"id": N, "ended_ms": T}`) as each starts and ends, and a comment
//!   every 15 s when nothing happens. A watcher further behind than the
//!   engine's event buffer gets a fresh `snapshot` instead of what it
//!   missed, so its connection holds at most that buffer and one event;
//!   at most [`MAX_WATCHERS`] streams are open at once (beyond, 503). The
//!   stream ends when the server shuts down.
//!
//! Every name here (principal, tool, URI) is the client's: a page shows it
//! as text.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::{Admin, error};
use crate::engine::Engine;
use crate::engine::calls::{Call, CallEvent};

/// Calls in one answer or snapshot at most, and by default.
pub(super) const MAX_CALLS: usize = 1000;
const DEFAULT_CALLS: usize = 200;
/// `/admin/calls/stream` connections open at once at most.
pub const MAX_WATCHERS: usize = 16;
/// A comment this often on a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
pub(super) struct CallsQuery {
    limit: Option<usize>,
    principal: Option<String>,
    upstream: Option<String>,
    session: Option<String>,
}

/// One call as the admin API shows it.
fn call_json(call: &Call, now: i64) -> Value {
    json!({
        "id": call.id,
        "session": call.session,
        "principal": call.principal,
        "upstream": call.endpoint,
        "method": call.method,
        "name": call.name,
        "request_id": call.request_id,
        "started_ms": call.started_ms,
        "running_ms": (now - call.started_ms).max(0),
    })
}

/// The calls running now that `keep` selects, at most `limit`, and how many match.
fn matching(engine: &Engine, limit: usize, keep: impl Fn(&Call) -> bool) -> (Vec<Value>, usize) {
    let now = tether_store::now_ms();
    let (all, _) = engine.calls().snapshot(usize::MAX);
    let mut total = 0;
    let mut out = Vec::new();
    for call in all.iter().filter(|c| keep(c)) {
        total += 1;
        if out.len() < limit {
            out.push(call_json(call, now));
        }
    }
    (out, total)
}

pub(super) async fn list(State(admin): State<Admin>, Query(q): Query<CallsQuery>) -> Response {
    let limit = q.limit.unwrap_or(DEFAULT_CALLS).clamp(1, MAX_CALLS);
    let (calls, total) = matching(&admin.engine, limit, |c| {
        q.principal.as_deref().is_none_or(|p| p == c.principal)
            && q.upstream.as_deref().is_none_or(|u| u == c.endpoint)
            && q.session.as_deref().is_none_or(|s| Some(s) == c.session.as_deref())
    });
    axum::Json(json!({"calls": calls, "total": total, "now_ms": tether_store::now_ms()})).into_response()
}

/// One SSE event; JSON is compact, so one `data:` line.
fn frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

fn snapshot(engine: &Engine) -> Bytes {
    let (calls, total) = matching(engine, MAX_CALLS, |_| true);
    frame("snapshot", &json!({"calls": calls, "total": total, "now_ms": tether_store::now_ms()}))
}

/// A place among the open streams, given back when the stream ends.
struct Watcher(Arc<AtomicUsize>);

impl Watcher {
    fn take(open: &Arc<AtomicUsize>) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_WATCHERS).then_some(n + 1)).ok()?;
        Some(Self(open.clone()))
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Watch {
    engine: Engine,
    events: tokio::sync::broadcast::Receiver<CallEvent>,
    first: Option<Bytes>,
    _watcher: Watcher,
}

pub(super) async fn stream(State(admin): State<Admin>) -> Response {
    let Some(watcher) = Watcher::take(&admin.watchers) else {
        let mut refused = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{MAX_WATCHERS} streams of the calls are open already; close one (another tab of the admin page) first"),
        );
        refused.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return refused;
    };
    let engine = admin.engine.clone();
    // Subscribed before the snapshot is taken: nothing falls between the two
    // (a call in both is the same call, by its id).
    let events = engine.calls().subscribe();
    let first = Some(snapshot(&engine));
    let watch = Watch { engine, events, first, _watcher: watcher };
    let body = futures::stream::unfold(watch, |mut w| async move {
        if let Some(first) = w.first.take() {
            return Some((Ok::<_, Infallible>(first), w));
        }
        let shutdown = w.engine.shutdown_token();
        let chunk = tokio::select! {
            event = w.events.recv() => match event {
                Ok(CallEvent::Start(call)) => frame("start", &call_json(&call, tether_store::now_ms())),
                Ok(CallEvent::End { id, ended_ms }) => frame("end", &json!({"id": id, "ended_ms": ended_ms})),
                Err(RecvError::Lagged(_)) => {
                    w.events = w.events.resubscribe();
                    snapshot(&w.engine)
                }
                Err(RecvError::Closed) => return None,
            },
            () = tokio::time::sleep(KEEP_ALIVE) => Bytes::from_static(b": keepalive\n\n"),
            () = shutdown.cancelled() => return None,
        };
        Some((Ok(chunk), w))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
