//! Response bodies: SSE streams read with the wire decoder
//! (`tether_wire::sse`, which bounds each event and keeps the last event ID
//! and the server's `retry`), and whole bodies read with a bound.

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tether_wire::sse::{Decoder, EventStream};

/// The events of one SSE response.
pub(crate) type Events = EventStream<BoxStream<'static, reqwest::Result<Bytes>>>;

/// The events of `response`, decoded by `decoder` (fresh, or carrying on
/// from the stream this one resumes).
pub(crate) fn events(response: reqwest::Response, decoder: Decoder) -> Events {
    EventStream::with_decoder(response.bytes_stream().boxed(), decoder)
}

/// A stream with nothing in it that remembers `decoder`'s last ID and
/// `retry` (to retry a resume from the same event).
pub(crate) fn no_events(decoder: Decoder) -> Events {
    EventStream::with_decoder(futures::stream::empty().boxed(), decoder)
}

/// Reads a whole body, refusing more than `limit` bytes.
pub(crate) async fn read_body(response: reqwest::Response, limit: usize) -> Result<Bytes, String> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(format!("the server sent a body larger than {} MiB; refusing it", limit / (1024 * 1024)));
    }
    let mut out = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("reading the response body failed: {e}"))?;
        if out.len() + chunk.len() > limit {
            return Err(format!("the server sent a body larger than {} MiB; refusing it", limit / (1024 * 1024)));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}
