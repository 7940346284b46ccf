//! Recovery notes: a session's request that runs long leaves a note in the
//! engine's store (the upstream's ID of the request, the first event ID of
//! its answer stream there, its progress token, the member that runs it),
//! so that a tether crash does not end it: the next process picks its
//! answer up from the upstream where the note says ([`Gateway::recover`]).
//! A kept child's calls need no note: the keeper holds the child and the
//! call is found again by its client request.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tether_server::{CutOff, RawResult, RequestCtx, RpcError};

use super::Gateway;
use crate::link::{self, Connection};
use crate::progress::Progress;
use crate::slot::Slot;
use crate::upstream::UpstreamError;

/// Whether a forwarded request leaves a recovery note once it runs long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notes {
    /// The request is the client's own: a tether crash must not end it.
    Leave,
    /// One of several requests made for one client request (a virtual
    /// server's merged list): it is made again rather than picked up.
    None,
}

/// How long a request runs before it leaves a recovery note (quick ones,
/// most of them, never write one).
const NOTE_AFTER: Duration = Duration::from_millis(100);

/// A recovery note, as the engine stores it with the request:
/// `{"upstreamRequestId", "after", "progressToken"?, "member"?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Note {
    /// The upstream's ID of the request.
    upstream_request_id: Value,
    /// The first event ID of its answer stream there.
    after: String,
    /// The progress token the upstream was given for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress_token: Option<Value>,
    /// The member of a virtual server that runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) member: Option<String>,
}

impl Note {
    /// The note a cut-off request left, if it is one (none for a kept
    /// child's call, or what this build cannot read).
    pub(crate) fn of(cut_off: &CutOff) -> Option<Self> {
        Self::deserialize(&cut_off.note).ok()
    }
}

/// Sends a request upstream; once it has run for [`NOTE_AFTER`] and the
/// upstream named a point of its answer stream, leaves a recovery note
/// (see [`Gateway::recover_request`]) so that a tether crash does not end it.
pub(super) async fn request_with_note(
    ctx: &RequestCtx,
    connection: &Connection,
    slot: &Slot,
    method: &str,
    params: Option<Value>,
    issued_progress_token: Option<Value>,
    track: &tether_client::RequestTrack,
) -> crate::upstream::UpstreamResult {
    let request = connection.upstream.request_tracked(method, params, track);
    let mut request = std::pin::pin!(request);
    // A `Sleep` on the stack, re-armed: no allocation for the quick requests.
    let mut check = std::pin::pin!(tokio::time::sleep(NOTE_AFTER));
    let mut noted = false;
    loop {
        tokio::select! {
            biased;
            result = &mut request => return result,
            () = &mut check, if !noted => {
                if let Some((upstream_request_id, after)) = track.point() {
                    noted = true;
                    let member = match slot {
                        Slot::Member(member) => Some(member.clone()),
                        Slot::Alone => None,
                    };
                    let note = Note { upstream_request_id, after, progress_token: issued_progress_token.clone(), member };
                    let note = serde_json::to_value(note).unwrap_or(Value::Null);
                    if let Err(e) = ctx.leave_recovery_note(note).await {
                        tracing::warn!(error = %e.message, "could not store a request's recovery note; a crash now ends it as interrupted");
                    }
                } else {
                    check.as_mut().reset(tokio::time::Instant::now() + NOTE_AFTER);
                }
            }
        }
    }
}

impl Gateway {
    /// A request cut off by a tether crash while its upstream ran it: its
    /// answer is picked up from the upstream's stream where the note says
    /// (an HTTP upstream that keeps its streams: `Last-Event-ID`), and what
    /// the upstream sent meanwhile is delivered, less what the client had
    /// already. An upstream that cannot resume it ends it with
    /// [`UpstreamError::Restarted`].
    pub(super) async fn recover(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let session = ctx.require_session()?;
        let (request_id, after, connection, progress) = if cut_off.note.is_null() {
            // No note: a kept child's call, found by its client request.
            let Some(stream) = ctx.stream_name() else { return Err(UpstreamError::Restarted.into()) };
            let key = crate::upstream::request_key(session.session_id(), stream);
            let connection = self.upstream(&session, None).await?;
            let Some(call) = connection.upstream.cut_off_call(&key) else {
                return Err(RpcError::internal(tether_server::engine::INTERRUPTED_MESSAGE));
            };
            (call.id, String::new(), connection, call.progress)
        } else {
            let Some(note) = Note::of(&cut_off) else { return Err(UpstreamError::Restarted.into()) };
            let connection = self.upstream(&session, None).await?;
            // Only what carries the token the upstream was given for this
            // very request (or none) is this request's.
            let progress = match (note.progress_token, ctx.progress_token()) {
                (Some(issued), Some(client)) => Some(Progress { issued, client: client.clone() }),
                _ => None,
            };
            (note.upstream_request_id, note.after, connection, progress)
        };
        let link = self.slot.link(&session);
        let _in_flight = link.enter(&ctx, progress.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(link::RESUMED_BUFFER);
        let resumed = connection.upstream.resume(request_id, &after, tx);
        let mut resumed = std::pin::pin!(resumed);
        let mut already = link::AlreadySent::new(cut_off.sent);
        tracing::info!(upstream = %self.config.name, session = session.session_id(), "picking up a request cut off by a restart from its upstream");
        let deliver = async |message, already: &mut link::AlreadySent| match Progress::translate(progress.as_ref(), message) {
            Ok(message) if !already.contains(&message) => {
                link::deliver_to_request(&ctx, Some(&connection.upstream), message).await
            }
            Ok(_) => {}
            Err(foreign) => link::drop_foreign(&self.config.name, session.session_id(), &foreign),
        };
        loop {
            tokio::select! {
                biased;
                Some(message) = rx.recv() => deliver(message, &mut already).await,
                result = &mut resumed => {
                    while let Ok(message) = rx.try_recv() {
                        deliver(message, &mut already).await;
                    }
                    return result.map_err(Into::into);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The note as gateways before it was typed wrote it, and read it.
    #[test]
    fn a_note_keeps_its_stored_shape() {
        let stored = json!({"upstreamRequestId": "t1-7", "after": "r1.3", "progressToken": "tether-ab", "member": "tickets"});
        let note = Note::deserialize(&stored).unwrap();
        assert_eq!(note.member.as_deref(), Some("tickets"));
        assert_eq!(serde_json::to_value(&note).unwrap(), stored);
        let plain = json!({"upstreamRequestId": 7, "after": "r1.0"});
        assert_eq!(serde_json::to_value(Note::deserialize(&plain).unwrap()).unwrap(), plain);
        // Not a note this build can pick up from: the request ends as restarted.
        for unreadable in [json!({"after": "r1.0"}), json!({"upstreamRequestId": 7, "after": 3}), json!(null)] {
            assert!(Note::deserialize(&unreadable).is_err(), "{unreadable}");
        }
    }
}
