//! Reading Server-Sent Events: the one SSE decoder of the client, the bench
//! and the tests, built on the `sse-stream` crate (which does the parsing:
//! fields, line endings, UTF-8).
//!
//! What this adds on top: a bound on the size of one event (a server cannot
//! make a reader buffer without limit), the state a resuming reader needs
//! (the last event ID, priming events included, and the server's `retry`),
//! and two ways in: [`Decoder::push`] for bytes the caller reads itself
//! (the bench's load generator, the tests' raw reader) and [`EventStream`]
//! over any stream of byte chunks (an HTTP body).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{Stream, StreamExt};
use parking_lot::Mutex;
use sse_stream::SseByteStream;

/// Largest SSE event accepted unless a reader sets another limit.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 32 * 1024 * 1024;

/// One event block as it came over the wire (fields are not inherited from
/// earlier blocks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// The block's own `id` field (a priming event has one and no data).
    pub id: Option<String>,
    /// The `event` field, if the block named a type.
    pub event: Option<String>,
    /// The `data` lines joined with `\n` (empty if none).
    pub data: String,
    /// The `retry` field, in milliseconds.
    pub retry: Option<u64>,
}

impl Event {
    /// The event type: `message` unless the block named another (HTTP+SSE's `endpoint`).
    pub fn kind(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }

    /// Whether the block carries a message (priming events and the like do not).
    pub fn has_data(&self) -> bool {
        !self.data.trim().is_empty()
    }
}

/// Why an event stream cannot be read on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// One event was longer than the reader's limit.
    TooLarge {
        /// The reader's limit on one event, in bytes.
        limit: usize,
    },
    /// The bytes are not SSE (e.g. a field value that is not UTF-8).
    Malformed(String),
    /// The byte stream under the events failed (a connection that broke).
    Body(String),
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::TooLarge { limit } if limit % (1024 * 1024) == 0 => {
                write!(f, "the server sent an SSE event larger than {} MiB; refusing it", limit / (1024 * 1024))
            }
            SseError::TooLarge { limit } => write!(f, "the server sent an SSE event larger than {limit} bytes; refusing it"),
            SseError::Malformed(detail) => write!(f, "the server sent a malformed SSE stream: {detail}"),
            SseError::Body(detail) => write!(f, "{detail}"),
        }
    }
}

impl std::error::Error for SseError {}

/// The bytes handed to `sse-stream`, one chunk at a time: its decoder reads
/// a stream, and this stream is "not ready" whenever the caller has nothing
/// more to push, so the decoder's state waits for the next chunk.
#[derive(Clone, Default)]
struct Feed(Arc<Mutex<Option<Bytes>>>);

impl Feed {
    fn put(&self, chunk: Bytes) {
        *self.0.lock() = Some(chunk);
    }
}

impl Stream for Feed {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.0.lock().take() {
            Some(chunk) => Poll::Ready(Some(Ok(chunk))),
            None => Poll::Pending,
        }
    }
}

/// An incremental SSE decoder: bytes go in as they arrive, complete events
/// come out once their blank line has arrived (an unterminated last event is
/// never returned, as the SSE specification says).
pub struct Decoder {
    parser: SseByteStream<Feed>,
    feed: Feed,
    gauge: BlockGauge,
    limit: usize,
    last_id: Option<String>,
    retry: Option<Duration>,
    received_any: bool,
    failed: Option<SseError>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("limit", &self.limit)
            .field("last_id", &self.last_id)
            .field("retry", &self.retry)
            .field("received_any", &self.received_any)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder with the default event size limit.
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A decoder that refuses events longer than `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        let feed = Feed::default();
        Self {
            parser: SseByteStream::new(feed.clone()),
            feed,
            gauge: BlockGauge::default(),
            limit,
            last_id: None,
            retry: None,
            received_any: false,
            failed: None,
        }
    }

    /// Feeds bytes; returns the event blocks they completed, priming events
    /// included. After an error every push fails the same way.
    pub fn push(&mut self, chunk: impl Into<Bytes>) -> Result<Vec<Event>, SseError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let chunk = chunk.into();
        if let Err(e) = self.gauge.feed(&chunk, self.limit) {
            return Err(self.fail(e));
        }
        self.feed.put(chunk);
        let mut out = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match Pin::new(&mut self.parser).poll_next(&mut cx) {
                Poll::Ready(Some(Ok(block))) => {
                    self.received_any = true;
                    if let Some(id) = &block.id {
                        // An empty `id` resets the last event ID (SSE specification).
                        self.last_id = Some(id.clone()).filter(|id| !id.is_empty());
                    }
                    if let Some(ms) = block.retry {
                        self.retry = Some(Duration::from_millis(ms));
                    }
                    out.push(Event {
                        id: block.id,
                        event: block.event,
                        data: block.data.unwrap_or_default(),
                        retry: block.retry,
                    });
                }
                Poll::Ready(Some(Err(e))) => return Err(self.fail(SseError::Malformed(e.to_string()))),
                // The feed never ends; `sse-stream` ends only after an error it reported.
                Poll::Ready(None) => return Err(self.fail(SseError::Malformed("the decoder stopped".into()))),
                Poll::Pending => return Ok(out),
            }
        }
    }

    fn fail(&mut self, e: SseError) -> SseError {
        self.failed = Some(e.clone());
        e
    }

    /// The ID of the last block that carried one (priming events included):
    /// what `Last-Event-ID` resumes from.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// The server's last `retry`.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Whether any block (an event, a priming event) arrived.
    pub fn received_any(&self) -> bool {
        self.received_any
    }

    /// Blocks that held nothing but comments (keep-alives) so far.
    pub fn comments(&self) -> u64 {
        self.gauge.comment_blocks
    }

    /// Carries on from an earlier stream (a resumed one): its last ID and `retry`.
    pub fn resuming(mut self, last_id: Option<String>, retry: Option<Duration>) -> Self {
        self.last_id = last_id;
        self.retry = retry;
        self
    }
}

/// Counts the bytes of the block being received (lines up to the next blank
/// line) to refuse one larger than the limit, and the blocks that were only
/// comments. It never reads fields: `sse-stream` does.
#[derive(Default)]
struct BlockGauge {
    block: usize,
    line: usize,
    after_cr: bool,
    comment_lines: bool,
    field_lines: bool,
    comment_blocks: u64,
}

impl BlockGauge {
    fn feed(&mut self, chunk: &[u8], limit: usize) -> Result<(), SseError> {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    if self.line == 0 {
                        if self.comment_lines && !self.field_lines {
                            self.comment_blocks += 1;
                        }
                        (self.block, self.comment_lines, self.field_lines) = (0, false, false);
                    }
                    self.line = 0;
                }
                _ => {
                    self.after_cr = false;
                    if self.line == 0 {
                        if b == b':' {
                            self.comment_lines = true;
                        } else {
                            self.field_lines = true;
                        }
                    }
                    self.line += 1;
                    self.block += 1;
                    if self.block > limit {
                        return Err(SseError::TooLarge { limit });
                    }
                }
            }
        }
        Ok(())
    }
}

/// The events of one byte stream (an HTTP body).
pub struct EventStream<S> {
    bytes: S,
    decoder: Decoder,
    ready: VecDeque<Event>,
    ended: bool,
}

impl<S, E> EventStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: fmt::Display,
{
    /// The events of `bytes`, with a [`Decoder`] of the default bound.
    pub fn new(bytes: S) -> Self {
        Self::with_decoder(bytes, Decoder::new())
    }

    /// Events decoded by `decoder` (its limit, or the state of a stream this one resumes).
    pub fn with_decoder(bytes: S, decoder: Decoder) -> Self {
        Self { bytes, decoder, ready: VecDeque::new(), ended: false }
    }

    /// The next block, priming events included; `None` when the stream
    /// ended, `Some(Err)` once when it broke (the reader may resume from
    /// [`Decoder::last_id`]).
    pub async fn next_block(&mut self) -> Option<Result<Event, SseError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            if self.ended {
                return None;
            }
            let pushed = match self.bytes.next().await {
                Some(Ok(chunk)) => self.decoder.push(chunk),
                Some(Err(e)) => Err(SseError::Body(e.to_string())),
                None => {
                    self.ended = true;
                    return None;
                }
            };
            match pushed {
                Ok(events) => self.ready.extend(events),
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The next event that carries data (priming events skipped, their ID kept).
    pub async fn next(&mut self) -> Option<Result<Event, SseError>> {
        loop {
            match self.next_block().await? {
                Ok(event) if !event.has_data() => continue,
                other => return Some(other),
            }
        }
    }

    /// The decoder: the last event ID, `retry`, keep-alives seen.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The decoder, with what it still holds (for a stream that resumes this one).
    pub fn into_decoder(self) -> Decoder {
        self.decoder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(parts: Vec<&'static str>, limit: usize) -> EventStream<impl Stream<Item = Result<Bytes, Infallible>> + Unpin> {
        let bytes = futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from_static(p.as_bytes()))));
        EventStream::with_decoder(bytes, Decoder::with_limit(limit))
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn priming_events_are_skipped_but_their_id_and_retry_are_kept() {
        block_on(async {
            let mut ev = stream_of(vec!["id: r1.0\nretry: 1500\ndata:\n\n", "id: r1.1\nda", "ta: {\"a\":1}\n\n"], 1024);
            let e = ev.next().await.unwrap().unwrap();
            assert_eq!(e.data, "{\"a\":1}");
            assert_eq!(e.kind(), "message");
            assert_eq!(ev.decoder().last_id(), Some("r1.1"));
            assert_eq!(ev.decoder().retry(), Some(Duration::from_millis(1500)));
            assert!(ev.next().await.is_none());

            let mut only_priming = stream_of(vec![": keepalive\n\nid: g1.7\ndata:\n\n"], 1024);
            assert!(only_priming.next().await.is_none());
            assert_eq!(only_priming.decoder().last_id(), Some("g1.7"), "a stream cut after priming can still be resumed");
            assert!(only_priming.decoder().received_any());
        });
    }

    #[test]
    fn an_oversized_event_is_refused_but_many_small_ones_are_fine() {
        block_on(async {
            let big = Box::leak(format!("data: {}\n\n", "x".repeat(200)).into_boxed_str());
            let mut ev = stream_of(vec![big], 100);
            assert_eq!(ev.next().await, Some(Err(SseError::TooLarge { limit: 100 })));
            assert!(ev.next().await.is_none(), "a refused stream ends");

            let many: Vec<&'static str> = (0..50).map(|_| "data: {\"x\":\"0123456789\"}\r\n\r\n").collect();
            let mut ev = stream_of(many, 100);
            let mut n = 0;
            while let Some(e) = ev.next().await {
                assert_eq!(e.unwrap().data, "{\"x\":\"0123456789\"}");
                n += 1;
            }
            assert_eq!(n, 50);
        });
        assert_eq!(
            SseError::TooLarge { limit: DEFAULT_MAX_EVENT_BYTES }.to_string(),
            "the server sent an SSE event larger than 32 MiB; refusing it"
        );
    }

    #[test]
    fn pushed_events_split_across_chunks_come_out_whole_and_in_order() {
        let mut d = Decoder::new();
        let first = d.push(&b"id: g1.0\nretry: 1000\ndata: \n\n: keep-alive\n\nevent: message\nid: g1"[..]).unwrap();
        assert_eq!(first, vec![Event { id: Some("g1.0".into()), retry: Some(1000), ..Event::default() }]);
        assert!(!first[0].has_data());
        assert_eq!(d.comments(), 1);
        let events = d.push(&b".1\ndata: {\"id\":1}\r\n\r\nid: 2\ndata: a\ndata: b\n\nid: 3\ndata: never ended"[..]).unwrap();
        let got: Vec<(Option<&str>, &str)> = events.iter().map(|e| (e.id.as_deref(), e.data.as_str())).collect();
        assert_eq!(got, vec![(Some("g1.1"), "{\"id\":1}"), (Some("2"), "a\nb")]);
        assert_eq!(d.last_id(), Some("2"), "an unterminated event counts for nothing");
        assert_eq!(d.retry(), Some(Duration::from_millis(1000)));
        assert_eq!(d.comments(), 1);
    }

    #[test]
    fn a_field_that_is_not_utf8_breaks_the_stream_for_good() {
        let mut d = Decoder::new();
        assert!(matches!(d.push(&b"id: \xff\xfe\n\n"[..]), Err(SseError::Malformed(_))));
        assert!(matches!(d.push(&b"data: fine\n\n"[..]), Err(SseError::Malformed(_))));
    }

    #[test]
    fn an_empty_id_resets_the_last_event_id_and_a_resumed_decoder_carries_on() {
        let mut d = Decoder::new().resuming(Some("s.4".into()), Some(Duration::from_millis(200)));
        assert_eq!((d.last_id(), d.received_any()), (Some("s.4"), false));
        d.push(&b"data: x\n\n"[..]).unwrap();
        assert_eq!(d.last_id(), Some("s.4"), "a block without an id keeps the last one");
        d.push(&b"id:\ndata: y\n\n"[..]).unwrap();
        assert_eq!(d.last_id(), None);
    }
}
