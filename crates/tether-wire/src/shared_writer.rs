//! A shared writer: one pipe or socket that many tasks write messages to, each
//! message whole and in the order it was put in, with no task between the
//! sender and the kernel on the fast path.
//!
//! [`SharedWriter::send_with`] puts a message in under a lock. When nothing is
//! waiting before it, the sender writes it at once with a non-blocking
//! `try_write`, from its own task: a call's line reaches the child (or the
//! keeper) without waking another task. What the kernel does not take stays
//! in the writer, and its flusher task, woken only then, writes it
//! as the pipe becomes writable; later messages queue behind it. A sender's
//! future can be dropped at any point without cutting a message: a message
//! is in the writer whole or not at all, and the flusher finishes what was
//! started. The message is built under the lock ([`SharedWriter::send_with`]), so
//! a number it carries (a frame's sequence number) is in the same order as
//! the bytes.
//!
//! Bound: at most `limit` bytes wait, plus one message: a sender that finds
//! the writer over its limit waits for room ([`SharedWriter::send_with`]) or is
//! refused ([`SharedWriter::try_send`]). Once the writer is dropped, the flusher
//! writes what the pipe takes at once and ends; the rest is dropped.

use std::io::{self, IoSlice};
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A pipe or socket that can be written without blocking.
pub trait NonBlocking: Send + Sync + 'static {
    /// Writes what the kernel takes now (`WouldBlock` if nothing).
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Resolves when a write may succeed.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

impl NonBlocking for tokio::net::unix::OwnedWriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Self::try_write_vectored(self, bufs)
    }
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
        Self::writable(self)
    }
}

impl NonBlocking for tokio::net::unix::pipe::Sender {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Self::try_write_vectored(self, bufs)
    }
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
        Self::writable(self)
    }
}

/// Why a message was not put in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Writing failed earlier (the peer closed its end, say): nothing more goes.
    Closed(String),
    /// Over the limit ([`SharedWriter::try_send`] only).
    Full,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed(why) => write!(f, "writing failed: {why}"),
            Self::Full => f.write_str("too much is waiting to be written"),
        }
    }
}

impl std::error::Error for SendError {}

/// Messages for one pipe or socket (see the module's doc). Dropping it ends
/// its flusher.
pub struct SharedWriter<W: NonBlocking> {
    shared: Arc<Shared<W>>,
}

struct Shared<W> {
    io: W,
    state: Mutex<State>,
    limit: usize,
    /// Wakes the flusher: bytes wait, or the writer was dropped.
    flush: Notify,
    /// Wakes senders waiting for room.
    room: Notify,
}

#[derive(Default)]
struct State {
    /// Bytes put in and not yet taken by the kernel, in order.
    pending: BytesMut,
    /// Set once a write failed: every later send fails with it.
    failed: Option<String>,
    dropped: bool,
}

impl<W: NonBlocking> SharedWriter<W> {
    /// A writer over `io` holding at most `limit` bytes waiting (plus one
    /// message). Starts its flusher: needs a Tokio runtime.
    pub fn new(io: W, limit: usize) -> Self {
        let shared =
            Arc::new(Shared { io, state: Mutex::new(State::default()), limit, flush: Notify::new(), room: Notify::new() });
        tokio::spawn(flusher(shared.clone()));
        Self { shared }
    }

    /// Puts in the message `build` makes (called under the writer's lock,
    /// once there is room), written at once if the kernel takes it. Waits
    /// while the writer is over its limit. Returns once the message is in
    /// the writer, not once it is written.
    pub async fn send_with<R>(&self, build: impl FnOnce() -> (R, Message)) -> Result<R, SendError> {
        let mut build = Some(build);
        loop {
            let room = self.shared.room.notified();
            if let Some(sent) = self.put(&mut build, false)? {
                return Ok(sent);
            }
            room.await;
        }
    }

    /// Puts in `message` (see [`Self::send_with`]).
    pub async fn send(&self, message: Message) -> Result<(), SendError> {
        self.send_with(|| ((), message)).await
    }

    /// Puts in `message` without waiting: refused when over the limit.
    pub fn try_send(&self, message: Message) -> Result<(), SendError> {
        self.try_send_with(|| ((), message))
    }

    /// [`Self::send_with`] without waiting: refused when over the limit
    /// (`build` is not called then).
    pub fn try_send_with<R>(&self, build: impl FnOnce() -> (R, Message)) -> Result<R, SendError> {
        self.put(&mut Some(build), true)?.ok_or(SendError::Full)
    }

    /// Bytes waiting now.
    pub fn waiting(&self) -> usize {
        self.shared.state.lock().pending.len()
    }

    /// `Ok(None)`: no room (and `!refuse`).
    fn put<R, F: FnOnce() -> (R, Message)>(&self, build: &mut Option<F>, refuse: bool) -> Result<Option<R>, SendError> {
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        if let Some(why) = &state.failed {
            return Err(SendError::Closed(why.clone()));
        }
        if state.pending.len() >= shared.limit {
            return if refuse { Err(SendError::Full) } else { Ok(None) };
        }
        let Some(build) = build.take() else { return Ok(None) };
        let (sent, message) = build();
        let parts = message.parts();
        if !state.pending.is_empty() {
            // Behind what waits: the flusher, already woken, writes it.
            for part in parts {
                state.pending.extend_from_slice(part);
            }
            return Ok(Some(sent));
        }
        let slices = parts.map(IoSlice::new);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let taken = match shared.io.try_write_vectored(&slices) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                let why = e.to_string();
                state.failed = Some(why.clone());
                drop(state);
                shared.room.notify_waiters();
                return Err(SendError::Closed(why));
            }
        };
        if taken < total {
            let mut skip = taken;
            for part in parts {
                let from = skip.min(part.len());
                skip -= from;
                state.pending.extend_from_slice(&part[from..]);
            }
            drop(state);
            shared.flush.notify_one();
        }
        Ok(Some(sent))
    }
}

impl<W: NonBlocking> Drop for SharedWriter<W> {
    fn drop(&mut self) {
        self.shared.state.lock().dropped = true;
        self.shared.flush.notify_one();
    }
}

/// One message: up to two parts written back to back (a line and its `\n`).
pub struct Message {
    head: bytes::Bytes,
    tail: &'static [u8],
}

impl Message {
    /// A message of these bytes.
    pub fn new(bytes: bytes::Bytes) -> Self {
        Self { head: bytes, tail: b"" }
    }

    /// A line: these bytes, then `\n`.
    pub fn line(bytes: bytes::Bytes) -> Self {
        Self { head: bytes, tail: b"\n" }
    }

    fn parts(&self) -> [&[u8]; 2] {
        [&self.head, self.tail]
    }
}

/// Writes what waits whenever the pipe takes it; ends when the writer is
/// dropped (after one last try) or a write fails.
async fn flusher<W: NonBlocking>(shared: Arc<Shared<W>>) {
    loop {
        shared.flush.notified().await;
        loop {
            let (empty, dropped) = {
                let state = shared.state.lock();
                (state.pending.is_empty(), state.dropped)
            };
            if dropped {
                write_some(&shared);
                return;
            }
            if empty {
                break;
            }
            if let Err(e) = shared.io.writable().await {
                fail(&shared, e.to_string());
                return;
            }
            if !write_some(&shared) {
                return;
            }
        }
    }
}

/// One non-blocking write of what waits; `false` once writing failed.
fn write_some<W: NonBlocking>(shared: &Shared<W>) -> bool {
    let mut state = shared.state.lock();
    if state.pending.is_empty() {
        return true;
    }
    match shared.io.try_write_vectored(&[IoSlice::new(&state.pending)]) {
        Ok(n) => {
            let was_full = state.pending.len() >= shared.limit;
            state.pending.advance(n);
            drop(state);
            if was_full {
                shared.room.notify_waiters();
            }
            true
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
        Err(e) => {
            drop(state);
            fail(shared, e.to_string());
            false
        }
    }
}

fn fail<W>(shared: &Shared<W>, why: String) {
    let mut state = shared.state.lock();
    state.failed = Some(why);
    state.pending.clear();
    drop(state);
    shared.room.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// A pipe the reactor knows is writable: until it does, `try_write`
    /// says `WouldBlock` without trying (and the flusher writes).
    async fn pipe() -> (tokio::net::unix::pipe::Sender, tokio::net::unix::pipe::Receiver) {
        let (tx, rx) = tokio::net::unix::pipe::pipe().expect("a pipe");
        tokio::time::timeout(Duration::from_secs(30), tx.writable()).await.expect("in time").expect("writable");
        (tx, rx)
    }

    async fn read_exactly(rx: &mut tokio::net::unix::pipe::Receiver, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        tokio::time::timeout(Duration::from_secs(30), rx.read_exact(&mut got)).await.expect("in time").expect("read");
        got
    }

    #[tokio::test]
    async fn a_message_the_kernel_takes_is_written_at_once() {
        let (tx, mut rx) = pipe().await;
        let writer = SharedWriter::new(tx, 1 << 20);
        writer.send(Message::line(Bytes::from_static(b"{\"id\":1}"))).await.expect("sent");
        assert_eq!(writer.waiting(), 0, "written by the sender itself");
        assert_eq!(read_exactly(&mut rx, 9).await, b"{\"id\":1}\n");
    }

    #[tokio::test]
    async fn what_the_pipe_cannot_take_is_flushed_whole_and_in_order() {
        let (tx, mut rx) = pipe().await;
        let writer = Arc::new(SharedWriter::new(tx, 1 << 20));
        // More than a pipe holds (64 KiB on Linux): most of it waits.
        let big = Bytes::from(vec![b'x'; 200_000]);
        writer.send(Message::line(big.clone())).await.expect("sent");
        let mut numbers = Vec::new();
        for n in 0..100u32 {
            let sent = writer.send_with(|| (n, Message::line(Bytes::from(n.to_string())))).await.expect("sent");
            numbers.push(sent);
        }
        assert!(writer.waiting() > 0);
        let got = read_exactly(&mut rx, 200_001).await;
        assert!(got[..200_000].iter().all(|&b| b == b'x') && got[200_000] == b'\n');
        let rest: String = (0..100).map(|n| format!("{n}\n")).collect();
        assert_eq!(String::from_utf8(read_exactly(&mut rx, rest.len()).await).expect("utf-8"), rest);
        assert_eq!(numbers, (0..100).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_full_writer_refuses_try_send_and_makes_send_wait_for_room() {
        let (tx, mut rx) = pipe().await;
        let writer = Arc::new(SharedWriter::new(tx, 1024));
        // Fill the pipe, then the writer past its limit.
        writer.send(Message::new(Bytes::from(vec![b'a'; 300_000]))).await.expect("sent");
        assert_eq!(writer.try_send(Message::new(Bytes::from_static(b"b"))), Err(SendError::Full));
        let waiting = tokio::spawn({
            let writer = writer.clone();
            async move { writer.send(Message::new(Bytes::from_static(b"b"))).await }
        });
        let got = read_exactly(&mut rx, 300_000).await;
        assert!(got.iter().all(|&b| b == b'a'));
        tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("room came").expect("task").expect("sent");
        assert_eq!(read_exactly(&mut rx, 1).await, b"b");
    }

    #[tokio::test]
    async fn a_closed_reader_fails_every_later_send() {
        let (tx, rx) = pipe().await;
        let writer = SharedWriter::new(tx, 1024);
        drop(rx);
        let first = writer.send(Message::line(Bytes::from_static(b"x"))).await;
        assert!(matches!(first, Err(SendError::Closed(_))), "{first:?}");
        assert!(matches!(writer.try_send(Message::line(Bytes::from_static(b"y"))), Err(SendError::Closed(_))));
    }

    #[tokio::test]
    async fn a_dropped_sender_never_cuts_a_message() {
        let (tx, mut rx) = pipe().await;
        let writer = Arc::new(SharedWriter::new(tx, 1 << 20));
        writer.send(Message::new(Bytes::from(vec![b'a'; 100_000]))).await.expect("sent");
        // Put in behind the waiting bytes, then the sender's task is gone.
        let sender = tokio::spawn({
            let writer = writer.clone();
            async move { writer.send(Message::line(Bytes::from_static(b"whole"))).await }
        });
        sender.await.expect("task").expect("sent");
        assert_eq!(read_exactly(&mut rx, 100_000).await.len(), 100_000);
        assert_eq!(read_exactly(&mut rx, 6).await, b"whole\n");
    }
}
