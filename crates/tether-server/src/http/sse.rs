//! SSE framing of engine [`Frame`]s.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::engine::Frame;

/// One frame as SSE text. JSON payloads are compact, so one `data:` line each.
pub fn render(frame: &Frame, retry_ms: u64) -> Bytes {
    match frame {
        Frame::Prime { id } => Bytes::from(format!("id: {id}\nretry: {retry_ms}\ndata: \n\n")),
        Frame::Event { id, data } => {
            let id = id.to_string();
            let mut out = BytesMut::with_capacity(data.len() + id.len() + 32);
            out.put_slice(b"event: message\nid: ");
            out.put_slice(id.as_bytes());
            out.put_slice(b"\ndata: ");
            out.put_slice(data);
            out.put_slice(b"\n\n");
            out.freeze()
        }
        Frame::KeepAlive => Bytes::from_static(b": keepalive\n\n"),
        Frame::Reconnect => Bytes::from(format!("retry: {retry_ms}\n\n")),
    }
}

/// A `text/event-stream` response streaming `frames` until the engine ends them.
pub fn response(frames: mpsc::Receiver<Frame>, retry_ms: u64, session_id: Option<&str>) -> Response {
    let body = ReceiverStream::new(frames).map(move |f| Ok::<_, Infallible>(render(&f, retry_ms)));
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Some(id) = session_id.and_then(|s| HeaderValue::from_str(s).ok()) {
        headers.insert(super::SESSION_HEADER, id);
    }
    response
}
