//! Client notifications of a session: `notifications/cancelled` is the
//! engine's own; `notifications/initialized` is recorded in the session's
//! state; every other one goes to the application, in the order posted, one
//! at a time, through one bounded queue per session. A full queue refuses
//! the POST (429) instead of spawning work without bound.

use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};

use super::ctx::{SessionCtx, request_key};
use super::session::{QueuedNotification, Session};
use super::{EngineError, Inner};

/// Handles one client notification.
pub(crate) async fn receive(
    inner: &Arc<Inner>,
    session: Arc<Session>,
    method: String,
    params: Option<Map<String, Value>>,
) -> Result<(), EngineError> {
    match method.as_str() {
        "notifications/cancelled" => {
            if let Some(id) = params.as_ref().and_then(|p| p.get("requestId")) {
                let key = request_key(id);
                let token = session.inflight.lock().get(&key).cloned();
                if let Some(token) = token {
                    tracing::info!(session = %session.id, request = %key, "request cancelled by client");
                    token.cancel();
                }
            }
            Ok(())
        }
        "notifications/initialized" => {
            let already = session.durable.lock().await.state.initialized;
            if !already {
                SessionCtx::new(inner.clone(), session.clone())
                    .update_state(|s| s.initialized = true)
                    .await
                    .map_err(|e| EngineError::Unavailable(tether_store::StoreError::Backend(e.message)))?;
            }
            enqueue(inner, session, QueuedNotification { method, params })
        }
        _ => enqueue(inner, session, QueuedNotification { method, params }),
    }
}

fn enqueue(inner: &Arc<Inner>, session: Arc<Session>, notification: QueuedNotification) -> Result<(), EngineError> {
    let limit = inner.config.max_queued_notifications;
    let start_drain = {
        let mut queue = session.notifications.lock();
        if queue.waiting.len() >= limit {
            return Err(EngineError::TooMany(format!(
                "{limit} notifications of this session are still waiting to be handled; send this one again later"
            )));
        }
        queue.waiting.push_back(notification);
        !std::mem::replace(&mut queue.draining, true)
    };
    if start_drain {
        let inner2 = inner.clone();
        inner.life.spawn(drain(inner2, session));
    }
    Ok(())
}

/// Hands the queued notifications to the application one by one and ends
/// when the queue is empty.
async fn drain(inner: Arc<Inner>, session: Arc<Session>) {
    loop {
        let next = {
            let mut queue = session.notifications.lock();
            if session.closed.is_cancelled() {
                queue.waiting.clear();
            }
            let next = queue.waiting.pop_front();
            if next.is_none() {
                queue.draining = false;
            }
            next
        };
        let Some(QueuedNotification { method, params }) = next else { return };
        let ctx = SessionCtx::new(inner.clone(), session.clone());
        let handled =
            std::panic::AssertUnwindSafe(inner.app_of(&session).on_notification(ctx, &method, params)).catch_unwind().await;
        if handled.is_err() {
            tracing::error!(session = %session.id, %method, "the application panicked handling a notification; going on with the next");
        }
    }
}
