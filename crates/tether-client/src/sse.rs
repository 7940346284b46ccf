//! Reading SSE responses: the `sse-stream` parser over the HTTP body, with
//! a bound on the size of one event, keeping the last event ID and the
//! server's `retry` from every block (priming events carry an ID and no
//! data: they are skipped but their ID is remembered for `Last-Event-ID`).

use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use sse_stream::SseByteStream;

/// Largest SSE event (or JSON body) accepted from a server.
pub(crate) const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// The events of one SSE response.
pub(crate) struct Events {
    inner: SseByteStream<BoxStream<'static, Result<Bytes, std::io::Error>>>,
    /// ID of the last block that carried one (priming events included).
    pub last_id: Option<String>,
    /// The server's last `retry` value.
    pub retry: Option<Duration>,
    /// Some block (an event, a priming event) arrived.
    pub received_any: bool,
}

/// One event that carries data.
pub(crate) struct Event {
    /// `message` unless the block named another type (`endpoint` in HTTP+SSE).
    pub kind: String,
    pub data: String,
}

impl Events {
    pub fn new(response: reqwest::Response) -> Self {
        Self::with_limit(response.bytes_stream().map(|r| r.map_err(std::io::Error::other)).boxed(), MAX_MESSAGE_BYTES)
    }

    pub fn with_limit(bytes: BoxStream<'static, Result<Bytes, std::io::Error>>, limit: usize) -> Self {
        let mut gauge = BlockGauge::default();
        let limited = bytes
            .map(move |chunk| {
                let chunk = chunk?;
                gauge.feed(&chunk, limit)?;
                Ok(chunk)
            })
            .boxed();
        Self { inner: SseByteStream::new(limited), last_id: None, retry: None, received_any: false }
    }

    /// The next event with data; `None` when the stream ended, `Some(Err)`
    /// when it broke (the caller may resume from `last_id`).
    pub async fn next(&mut self) -> Option<Result<Event, String>> {
        loop {
            let block = match self.inner.next().await? {
                Ok(block) => block,
                Err(e) => return Some(Err(e.to_string())),
            };
            self.received_any = true;
            if let Some(id) = block.id {
                self.last_id = if id.is_empty() { None } else { Some(id) };
            }
            if let Some(ms) = block.retry {
                self.retry = Some(Duration::from_millis(ms));
            }
            match block.data {
                Some(data) if !data.trim().is_empty() => {
                    return Some(Ok(Event { kind: block.event.unwrap_or_else(|| "message".to_owned()), data }));
                }
                _ => continue,
            }
        }
    }
}

/// Counts the bytes of the SSE block being received; refuses a block
/// (lines up to the next blank line) larger than the limit.
#[derive(Default)]
struct BlockGauge {
    block: usize,
    line: usize,
    after_cr: bool,
}

impl BlockGauge {
    fn feed(&mut self, chunk: &[u8], limit: usize) -> Result<(), std::io::Error> {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    if self.line == 0 {
                        self.block = 0;
                    }
                    self.line = 0;
                }
                _ => {
                    self.after_cr = false;
                    self.line += 1;
                    self.block += 1;
                    if self.block > limit {
                        return Err(std::io::Error::other(format!(
                            "the server sent an SSE event larger than {} MiB; refusing it",
                            limit / (1024 * 1024)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn events_of(parts: Vec<&'static str>, limit: usize) -> Events {
        let stream = futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from_static(p.as_bytes())))).boxed();
        Events::with_limit(stream, limit)
    }

    #[tokio::test]
    async fn priming_events_are_skipped_but_their_id_and_retry_are_kept() {
        let mut ev = events_of(vec!["id: r1.0\nretry: 1500\ndata:\n\n", "id: r1.1\nda", "ta: {\"a\":1}\n\n"], 1024);
        let e = ev.next().await.unwrap().unwrap();
        assert_eq!(e.data, "{\"a\":1}");
        assert_eq!(e.kind, "message");
        assert_eq!(ev.last_id.as_deref(), Some("r1.1"));
        assert_eq!(ev.retry, Some(Duration::from_millis(1500)));
        assert!(ev.next().await.is_none());

        let mut only_priming = events_of(vec![": keepalive\n\nid: g1.7\ndata:\n\n"], 1024);
        assert!(only_priming.next().await.is_none());
        assert_eq!(only_priming.last_id.as_deref(), Some("g1.7"), "a stream cut after priming can still be resumed");
    }

    #[tokio::test]
    async fn an_oversized_event_is_refused_but_many_small_ones_are_fine() {
        let big = Box::leak(format!("data: {}\n\n", "x".repeat(200)).into_boxed_str());
        let mut ev = events_of(vec![big], 100);
        assert!(ev.next().await.unwrap().is_err());

        let many: Vec<&'static str> = (0..50).map(|_| "data: {\"x\":\"0123456789\"}\r\n\r\n").collect();
        let mut ev = events_of(many, 100);
        let mut n = 0;
        while let Some(e) = ev.next().await {
            e.unwrap();
            n += 1;
        }
        assert_eq!(n, 50);
    }
}
