//! Recovery notes: a session's request that runs long leaves a note in the
//! engine's store (the upstream's ID of the request, the first event ID of
//! its answer stream there, its progress token, the member that runs it),
//! so that a tether crash does not end it: the next process picks its
//! answer up from the upstream where the note says ([`Gateway::recover`]).
//! A kept child's calls need no note: the keeper holds the child and the
//! call is found again by its client request.

use std::time::Duration;

use serde_json::{Value, json};
use tether_server::{CutOff, RawResult, RequestCtx, RpcError};

use super::Gateway;
use crate::link::{self, Connection};
use crate::progress::Progress;
use crate::slot::Slot;

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
/// The recovery note's fields: the upstream's ID of the request, the
/// first event ID of its answer stream there, and the progress token the
/// upstream was given for it (if any).
const NOTE_REQUEST_ID: &str = "upstreamRequestId";
const NOTE_AFTER_EVENT: &str = "after";
const NOTE_PROGRESS_TOKEN: &str = "progressToken";
/// The member of a virtual server that runs the request.
pub(crate) const NOTE_MEMBER: &str = "member";

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
) -> Result<tether_server::RawResult, RpcError> {
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
                if let Some((request_id, after)) = track.point() {
                    noted = true;
                    let mut note = json!({NOTE_REQUEST_ID: request_id, NOTE_AFTER_EVENT: after});
                    if let Some(token) = &issued_progress_token {
                        note[NOTE_PROGRESS_TOKEN] = token.clone();
                    }
                    if let Slot::Member(member) = slot {
                        note[NOTE_MEMBER] = json!(member);
                    }
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
    /// [`crate::upstream::UPSTREAM_RESTARTED`].
    pub(super) async fn recover(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        tether_server::trace::record_upstream(&self.config.name);
        let session = ctx.require_session()?;
        let note = &cut_off.note;
        let (request_id, after, connection, progress) = if note.is_null() {
            // No note: a kept child's call, found by its client request.
            let Some(stream) = ctx.stream_name() else { return Err(RpcError::internal(crate::upstream::UPSTREAM_RESTARTED)) };
            let key = crate::upstream::request_key(session.session_id(), stream);
            let connection = self.upstream(&session, None).await?;
            let Some(call) = connection.upstream.cut_off_call(&key) else {
                return Err(RpcError::internal(tether_server::engine::INTERRUPTED_MESSAGE));
            };
            (call.id, String::new(), connection, call.progress)
        } else {
            let (Some(request_id), Some(after)) = (note.get(NOTE_REQUEST_ID), note.get(NOTE_AFTER_EVENT).and_then(Value::as_str))
            else {
                return Err(RpcError::internal(crate::upstream::UPSTREAM_RESTARTED));
            };
            let connection = self.upstream(&session, None).await?;
            // Only what carries the token the upstream was given for this
            // very request (or none) is this request's.
            let progress = match (note.get(NOTE_PROGRESS_TOKEN), ctx.progress_token()) {
                (Some(issued), Some(client)) => Some(Progress { issued: issued.clone(), client: client.clone() }),
                _ => None,
            };
            (request_id.clone(), after.to_owned(), connection, progress)
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
                    return result;
                }
            }
        }
    }
}
