//! A request in flight: where it stands on its server ([`RequestTrack`]:
//! its ID and the first event ID of its answer stream, so another process
//! can resume it), and telling the server when it is given up
//! ([`CancelOnDrop`]).
//!
//! Invariant: a [`CancelOnDrop`] tells the server (`notifications/cancelled`)
//! only while it still holds a reason: its request is cleared of it once
//! the answer came, and `initialize` never has one. A track holds the
//! first event ID of the request it last began, never a later one.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::Session;

/// Where a request in flight stands on its server: its JSON-RPC ID and the
/// first event ID of its answer stream (the point to resume it from), for
/// [`Session::resume_request`] by another process. Filled by
/// [`Session::request_json_tracked`].
#[derive(Clone, Default)]
pub struct RequestTrack(Arc<Mutex<TrackPoint>>);

#[derive(Default)]
struct TrackPoint {
    request_id: Option<Value>,
    first_event_id: Option<String>,
}

impl RequestTrack {
    /// An empty track, to give a request.
    pub fn new() -> Self {
        Self::default()
    }

    /// The request's ID and the first event ID of its answer stream, once
    /// the server sent one (a JSON answer, or a stream without IDs, has none).
    pub fn point(&self) -> Option<(Value, String)> {
        let point = self.0.lock();
        Some((point.request_id.clone()?, point.first_event_id.clone()?))
    }

    pub(super) fn begin(&self, id: &Value) {
        *self.0.lock() = TrackPoint { request_id: Some(id.clone()), first_event_id: None };
    }

    /// Notes the stream's first event ID (a later call changes nothing).
    pub(super) fn saw_event_id(&self, event_id: &str) {
        let mut point = self.0.lock();
        if point.first_event_id.is_none() {
            point.first_event_id = Some(event_id.to_owned());
        }
    }
}

/// Sends `notifications/cancelled` for a request when dropped with a
/// reason (the request was given up before its answer). `initialize` has
/// none: the protocol forbids cancelling it.
pub(super) struct CancelOnDrop<'a> {
    pub(super) session: &'a Session,
    pub(super) id: Value,
    pub(super) reason: Option<&'static str>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(reason) = self.reason else { return };
        // Without a runtime nothing can be sent; the server's own timeout ends the work.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let session = self.session.clone();
        let params = json!({"requestId": self.id.take(), "reason": reason});
        runtime.spawn(async move {
            if let Err(e) = session.notify("notifications/cancelled", Some(params)).await {
                tracing::debug!("could not tell the server a request was cancelled: {e}");
            }
        });
    }
}
