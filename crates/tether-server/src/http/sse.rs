//! SSE framing of engine [`Frame`]s.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::{BufMut, BytesMut};

use crate::engine::{Frame, Frames};

/// Appends one frame as SSE text. JSON payloads are compact, so one `data:` line each.
fn append(out: &mut BytesMut, frame: &Frame, retry_ms: u64) {
    use std::fmt::Write;
    // Writing into a BytesMut cannot fail.
    let _ = match frame {
        Frame::Prime { id } => write!(out, "id: {id}\nretry: {retry_ms}\ndata: \n\n"),
        Frame::Event { id, data } => {
            let _ = write!(out, "event: message\nid: {id}\ndata: ");
            out.put_slice(data);
            out.put_slice(b"\n\n");
            Ok(())
        }
        Frame::KeepAlive => {
            out.put_slice(b": keepalive\n\n");
            Ok(())
        }
        Frame::Reconnect => write!(out, "retry: {retry_ms}\n\n"),
    };
}

/// Frames rendered into one body chunk at most: enough to fill a socket
/// write during a replay, small enough to keep memory per connection bounded.
const COALESCE_BYTES: usize = 64 * 1024;

/// A `text/event-stream` response streaming `frames` until the engine ends
/// them. Frames that are ready together go out as one chunk (one write), so a
/// replay costs a write per 64 KiB, not one per event.
pub fn response(mut frames: Frames, retry_ms: u64, session_id: Option<&str>) -> Response {
    let open = crate::metrics::sse_connection();
    // Polling the frames runs the stream's pump (engine/pump.rs).
    let body = futures::stream::poll_fn(move |cx| {
        let _open = &open;
        let Some(first) = std::task::ready!(frames.poll_recv(cx)) else { return std::task::Poll::Ready(None) };
        let mut chunk = BytesMut::new();
        append(&mut chunk, &first, retry_ms);
        while chunk.len() < COALESCE_BYTES {
            match frames.poll_recv(cx) {
                std::task::Poll::Ready(Some(frame)) => append(&mut chunk, &frame, retry_ms),
                // The end comes at the next poll; a pending pump has its wakers.
                _ => break,
            }
        }
        std::task::Poll::Ready(Some(Ok::<_, Infallible>(chunk.freeze())))
    });
    event_stream(Body::from_stream(body), session_id)
}

/// A whole SSE stream known up front (a quick request's priming event and
/// response): one body with a length, written at once.
pub fn complete(frames: &[Frame], retry_ms: u64, session_id: &str) -> Response {
    let mut body = BytesMut::new();
    for frame in frames {
        append(&mut body, frame, retry_ms);
    }
    event_stream(Body::from(body.freeze()), Some(session_id))
}

fn event_stream(body: Body, session_id: Option<&str>) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Some(id) = session_id.and_then(|s| HeaderValue::from_str(s).ok()) {
        headers.insert(tether_wire::headers::SESSION_ID, id);
    }
    response
}

/// A sessionless request's SSE response: `first`, then the reply's
/// messages until its answer, without event IDs (nothing is resumable in
/// that revision). Dropping the body (the client went away) drops the reply,
/// which cancels the request.
pub fn unnumbered(first: bytes::Bytes, reply: crate::engine::SessionlessReply) -> Response {
    use crate::engine::Outbound;
    use futures::StreamExt;
    fn message(out: &mut BytesMut, data: &[u8]) {
        out.put_slice(b"event: message\ndata: ");
        out.put_slice(data);
        out.put_slice(b"\n\n");
    }
    let mut head = BytesMut::new();
    message(&mut head, &first);
    let rest = futures::stream::unfold(Some(reply), |reply| async move {
        let mut reply = reply?;
        let mut chunk = BytesMut::new();
        let mut next = reply.messages.recv().await;
        loop {
            match next {
                Some(Outbound::Notification(data)) => message(&mut chunk, &data),
                Some(Outbound::KeepAlive) => chunk.put_slice(b": keepalive\n\n"),
                Some(Outbound::Answer { body, .. }) => {
                    message(&mut chunk, &body);
                    return Some((Ok::<_, Infallible>(chunk.freeze()), None));
                }
                None => return (!chunk.is_empty()).then(|| (Ok(chunk.freeze()), None)),
            }
            if chunk.len() >= COALESCE_BYTES {
                break;
            }
            match reply.messages.try_recv() {
                Ok(more) => next = Some(more),
                Err(_) => break,
            }
        }
        Some((Ok(chunk.freeze()), Some(reply)))
    });
    let body = futures::stream::once(async move { Ok::<_, Infallible>(head.freeze()) }).chain(rest);
    event_stream(Body::from_stream(body), None)
}
