//! The keeper's side of an engine's control connection
//! ([`Children::serve_engine`], one per engine, speaking [`crate::proto`];
//! the engine's side is [`crate::client`]). It owns the connection: the
//! handshake, the writer that serves the held children's frames, the
//! handling of each [`ToKeeper`] message, and the `Attach`es that wait for
//! another engine to let go of a child. The children themselves, their
//! frames, stdin queues and exits, are [`crate::children`]'s.
//!
//! The engine says `Hello`; one of another protocol version is `Refused`
//! ([`EngineGone::Refused`]); the others get `Welcome`, with the listening
//! sockets attached (SCM_RIGHTS, in order), the keeper's identity, the
//! engine's epoch and the children kept. Then its frames are handled in
//! order, each about a child it holds (a frame about another is stale and
//! ignored).
//!
//! Bounds: one writer per connection, which sends each held child's frames
//! straight from the child's buffer (no second queue), at most
//! [`PUMP_BATCH`] bytes of one child per write, starting with a different
//! child each round (a flooding child cannot starve the rest), and the
//! other answers from a queue of [`OUT_QUEUE`]. A slow engine blocks only
//! itself. At most [`PENDING_ATTACHES`] `Attach`es wait for another engine,
//! each for [`ATTACH_WAIT`] at most. Nothing an engine sends can make this
//! panic: a frame that cannot be read or makes no sense, or an engine that
//! leaves [`OUT_QUEUE`] answers unread, ends that connection
//! ([`EngineGone::Broken`]). However a connection ends (or is dropped), its
//! writer stops and every child it held waits, unattached, for the next
//! engine.

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::process::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Notify, mpsc};
use tokio::task::{AbortHandle, JoinSet};

use crate::children::{Child, Children, Inner, signal_group};
use crate::proto::{self, Decoder, ToEngine, ToKeeper};

/// How long an `Attach` waits for another engine to let go of the child.
pub const ATTACH_WAIT: Duration = Duration::from_secs(30);
/// Answers queued for one engine at most (frames are not queued: they are
/// sent from the children's buffers).
pub const OUT_QUEUE: usize = 4096;
/// `Attach`es of one engine waiting for another engine at most.
pub const PENDING_ATTACHES: usize = 4096;
/// Bytes of frames one child puts in one write to its engine, at most
/// (the others get their turn).
const PUMP_BATCH: usize = 256 * 1024;

/// One engine connection.
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) out: mpsc::Sender<Out>,
    /// A held child has something to send.
    pub(crate) pump: Notify,
}

pub(crate) enum Out {
    Msg(ToEngine),
    /// Send `msg`, then the child's frames after `after`, then `Exited`.
    Hold {
        child: Arc<Child>,
        after: u64,
        msg: Option<ToEngine>,
    },
}

/// How an engine connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineGone {
    /// The engine closed it (it exited).
    Closed,
    /// It spoke another protocol version and was refused.
    Refused(String),
    /// It sent what cannot be read or makes no sense.
    Broken(String),
}

impl std::fmt::Display for EngineGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineGone::Closed => f.write_str("the engine closed its control socket"),
            EngineGone::Refused(why) => write!(f, "the engine was refused: {why}"),
            EngineGone::Broken(why) => write!(f, "the engine's control connection broke: {why}"),
        }
    }
}

impl Children {
    /// Asks every engine connected to hand over (an upgrade); false if none is.
    pub fn handover(&self) -> bool {
        let conns: Vec<_> = self.inner.table.lock().conns.values().cloned().collect();
        conns.iter().filter(|c| c.out.try_send(Out::Msg(ToEngine::Handover)).is_ok()).count() > 0
    }

    /// Serves one engine connection until it ends: reads its `Hello`,
    /// refuses another protocol version, answers `Welcome` with `listeners`
    /// attached (SCM_RIGHTS, in order), then carries frames both ways.
    /// `epoch` counts the engines started, this one included. When it ends,
    /// every child it held waits, unattached, for the next engine.
    pub async fn serve_engine(&self, mut stream: UnixStream, listeners: &[BorrowedFd<'_>], epoch: u64) -> EngineGone {
        let mut decoder = Decoder::new();
        let hello = loop {
            match decoder.next::<ToKeeper>() {
                Ok(Some(message)) => break message,
                Ok(None) => {}
                Err(e) => return EngineGone::Broken(e.to_string()),
            }
            decoder.buffer().reserve(64 * 1024);
            match stream.read_buf(decoder.buffer()).await {
                Ok(0) => return EngineGone::Closed,
                Ok(_) => {}
                Err(e) => return EngineGone::Broken(format!("reading it failed: {e}")),
            }
        };
        let ToKeeper::Hello { version, pid } = hello else {
            return EngineGone::Broken(format!("its first frame was {hello:?}, not Hello"));
        };
        if version != proto::VERSION {
            let reason = format!(
                "engine speaks keeper protocol {version}, this keeper speaks {}: the tether binary was replaced by \
                 another version; put back the one that matches, or restart `tether serve` to run the new one",
                proto::VERSION
            );
            let _ = stream.write_all(&proto::frame(&ToEngine::Refused { reason: reason.clone() })).await;
            return EngineGone::Refused(reason);
        }
        {
            let mut table = self.inner.table.lock();
            table.restarts = epoch.saturating_sub(1);
            if let Some(ended) = table.engine_ended.take() {
                table.last_restart_ms = u64::try_from(ended.elapsed().as_millis()).unwrap_or(u64::MAX);
            }
        }
        let welcome = ToEngine::Welcome { version, keeper: self.inner.keeper, epoch, children: self.kept() };
        if let Err(e) = send_with_fds(&mut stream, &proto::frame(&welcome), listeners).await {
            return EngineGone::Broken(format!("sending Welcome failed: {e}"));
        }
        tracing::info!("engine {pid} connected (engine #{epoch}, {} children kept)", self.kept().len());
        let (out, queue) = mpsc::channel(OUT_QUEUE);
        let conn = Arc::new(Conn { id: self.inner.next_conn.fetch_add(1, Ordering::Relaxed), out, pump: Notify::new() });
        self.inner.table.lock().conns.insert(conn.id, conn.clone());
        let (mut read, write) = stream.into_split();
        let writer = tokio::spawn(write_engine(self.inner.clone(), conn.clone(), write, queue));
        // Whether this ends or is dropped (aborted), the engine's children are let go.
        let _leave = Leave { inner: self.inner.clone(), conn: conn.clone(), writer: writer.abort_handle() };
        let mut attaches = JoinSet::new();
        loop {
            match decoder.next::<ToKeeper>() {
                Ok(Some(message)) => match self.handle(&conn, message, &mut attaches).await {
                    Ok(()) => continue,
                    Err(why) => return EngineGone::Broken(why),
                },
                Ok(None) => {}
                Err(e) => return EngineGone::Broken(e.to_string()),
            }
            while attaches.try_join_next().is_some() {}
            decoder.buffer().reserve(64 * 1024);
            match read.read_buf(decoder.buffer()).await {
                Ok(0) => return EngineGone::Closed,
                Ok(_) => {}
                Err(e) => return EngineGone::Broken(format!("reading it failed: {e}")),
            }
        }
    }

    async fn handle(&self, conn: &Arc<Conn>, message: ToKeeper, attaches: &mut JoinSet<()>) -> Result<(), String> {
        let send = |out: Out| async move { conn.out.send(out).await.map_err(|_| "its writer is gone".to_owned()) };
        match message {
            ToKeeper::Hello { .. } => return Err("a second Hello".into()),
            ToKeeper::Spawn { req, spec } => match self.spawn(conn, req, spec) {
                Ok(queued) => queued?,
                Err(error) => send(Out::Msg(ToEngine::SpawnFailed { req, error })).await?,
            },
            ToKeeper::Attach { child, after } => match self.inner.try_attach(conn, child, after) {
                Attach::Failed(out) => send(out).await?,
                Attach::Done => {}
                Attach::Full => return Err(not_reading()),
                Attach::Busy => {
                    if attaches.len() >= PENDING_ATTACHES {
                        return Err(format!("more than {PENDING_ATTACHES} attaches waiting"));
                    }
                    attaches.spawn(attach_later(self.inner.clone(), conn.clone(), child, after));
                }
            },
            ToKeeper::Write { child, seq, tag, line } => {
                let Some(c) = self.inner.held_by(conn, child) else { return Ok(()) };
                // A line resent by a new engine: skipped, and confirmed again if written.
                if let Some(written) = self.inner.write(&c, seq, tag, line)? {
                    send(Out::Msg(ToEngine::Written { child, seq: written })).await?;
                }
            }
            ToKeeper::Ack { child, upto } => {
                let Some(c) = self.inner.held_by(conn, child) else { return Ok(()) };
                let mut st = c.state.lock();
                while st.frames.front().is_some_and(|(n, _)| *n <= upto) {
                    if let Some((_, frame)) = st.frames.pop_front() {
                        st.held -= frame.size();
                    }
                }
                drop(st);
                c.room.notify_one();
                self.inner.settle(&c);
            }
            ToKeeper::Done { child, tags } => {
                if let Some(c) = self.inner.held_by(conn, child) {
                    c.state.lock().open.retain(|t| !tags.contains(t));
                }
            }
            ToKeeper::Release { child } => {
                if let Some(c) = self.inner.held_by(conn, child) {
                    let mut st = c.state.lock();
                    st.holder = None;
                    st.unattached_since = Some(Instant::now());
                    drop(st);
                    c.released.notify_waiters();
                }
            }
            ToKeeper::Stop { child } => {
                let c = self.inner.table.lock().children.get(&child).cloned();
                let Some(c) = c else {
                    let status = "is not kept by this keeper".to_owned();
                    return send(Out::Msg(ToEngine::Exited { child, status })).await;
                };
                // An unheld child becomes this engine's, so that it hears `Exited`.
                let watch = {
                    let mut st = c.state.lock();
                    if st.holder.as_ref().is_some_and(|h| h.id != conn.id) {
                        tracing::warn!(child, "an engine stopping a child another engine holds: ignored");
                        return Ok(());
                    }
                    st.stopped = true;
                    if st.exit.is_none() {
                        signal_group(c.pid, Signal::KILL);
                    }
                    let watch = st.holder.is_none().then_some(st.last_frame);
                    if watch.is_some() {
                        (st.holder, st.unattached_since, st.told_exit) = (Some(conn.clone()), None, false);
                    }
                    watch
                };
                c.room.notify_one();
                if let Some(after) = watch {
                    send(Out::Hold { child: c, after, msg: None }).await?;
                }
            }
            ToKeeper::Ready => self.inner.table.lock().ready = true,
            ToKeeper::Status { req } => {
                let children = self.kept();
                let held = self.inner.table.lock().children.values().map(|c| c.state.lock().held).sum();
                let (restarts, last_restart_ms) = {
                    let table = self.inner.table.lock();
                    (table.restarts, table.last_restart_ms)
                };
                send(Out::Msg(ToEngine::Status { req, restarts, last_restart_ms, held_bytes: held, children })).await?;
            }
        }
        Ok(())
    }
}

/// An engine connection's end: its writer stops, its children wait unattached.
struct Leave {
    inner: Arc<Inner>,
    conn: Arc<Conn>,
    writer: AbortHandle,
}

impl Drop for Leave {
    fn drop(&mut self) {
        self.writer.abort();
        self.inner.table.lock().conns.remove(&self.conn.id);
        let children: Vec<_> = self.inner.table.lock().children.values().cloned().collect();
        for child in children {
            let mut st = child.state.lock();
            if st.holder.as_ref().is_some_and(|h| h.id == self.conn.id) {
                st.holder = None;
                st.unattached_since = Some(Instant::now());
                drop(st);
                child.released.notify_waiters();
            }
        }
    }
}

enum Attach {
    /// Refused: the answer to send.
    Failed(Out),
    /// Held now; `Attached` is queued.
    Done,
    /// Another engine holds it.
    Busy,
    /// The engine's queue is full.
    Full,
}

pub(crate) fn not_reading() -> String {
    format!("more than {OUT_QUEUE} answers wait for the engine: it does not read them")
}

impl Inner {
    /// The child, if `conn` holds it (a frame about another is stale: ignored).
    fn held_by(&self, conn: &Conn, id: u64) -> Option<Arc<Child>> {
        let child = self.child(id)?;
        let held = child.state.lock().holder.as_ref().is_some_and(|h| h.id == conn.id);
        if !held {
            tracing::debug!(child = id, "a frame about a child this engine does not hold: ignored");
        }
        held.then_some(child)
    }

    fn try_attach(&self, conn: &Arc<Conn>, id: u64, after: u64) -> Attach {
        let failed = |reason: &str| Attach::Failed(Out::Msg(ToEngine::AttachFailed { child: id, reason: reason.into() }));
        let Some(child) = self.child(id) else {
            return failed("no such child: the keeper that ran it is gone or it exited");
        };
        let mut st = child.state.lock();
        if st.stopped || st.forgotten {
            return failed("the child is being stopped");
        }
        if st.holder.as_ref().is_some_and(|h| h.id != conn.id) {
            return Attach::Busy;
        }
        // Queued under the child's lock: nothing of the child's (`Written`,
        // `Stderr`) reaches this engine before `Attached`.
        let msg = ToEngine::Attached { child: id, written: st.written, open: st.open.iter().cloned().collect() };
        if conn.out.try_send(Out::Hold { child: child.clone(), after, msg: Some(msg) }).is_err() {
            return Attach::Full;
        }
        st.holder = Some(conn.clone());
        st.unattached_since = None;
        st.told_exit = false;
        while st.frames.front().is_some_and(|(n, _)| *n <= after) {
            if let Some((_, frame)) = st.frames.pop_front() {
                st.held -= frame.size();
            }
        }
        drop(st);
        child.room.notify_one();
        Attach::Done
    }
}

/// An `Attach` of a child another engine holds: waits for it to be let go.
async fn attach_later(inner: Arc<Inner>, conn: Arc<Conn>, id: u64, after: u64) {
    let deadline = tokio::time::Instant::now() + ATTACH_WAIT;
    loop {
        let Some(child) = inner.child(id) else { break };
        let released = child.released.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        match inner.try_attach(&conn, id, after) {
            Attach::Failed(out) => {
                let _ = conn.out.send(out).await;
                return;
            }
            Attach::Done | Attach::Full => return,
            Attach::Busy if tokio::time::timeout_at(deadline, released).await.is_ok() => {}
            Attach::Busy => {
                let reason = format!("another engine holds child {id} and did not let go of it within {ATTACH_WAIT:?}");
                let _ = conn.out.send(Out::Msg(ToEngine::AttachFailed { child: id, reason })).await;
                return;
            }
        }
    }
    if let Attach::Failed(out) = inner.try_attach(&conn, id, after) {
        let _ = conn.out.send(out).await;
    }
}

/// Sends `frame` with `fds` attached to its first byte.
async fn send_with_fds(stream: &mut UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let sent = loop {
        stream.writable().await?;
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other("the listening sockets do not fit one message"));
        }
        let attempt = stream.try_io(Interest::WRITABLE, || {
            Ok(rustix::net::sendmsg(stream.as_fd(), &[IoSlice::new(frame)], &mut control, SendFlags::NOSIGNAL)?)
        });
        match attempt {
            Ok(sent) => break sent,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    stream.write_all(&frame[sent..]).await
}

/// One engine's writer: its queued answers, and every held child's frames
/// from the child's buffer, then `Exited` after the last.
async fn write_engine(inner: Arc<Inner>, conn: Arc<Conn>, mut write: OwnedWriteHalf, mut queue: mpsc::Receiver<Out>) {
    let mut held: BTreeMap<u64, (Arc<Child>, u64)> = BTreeMap::new();
    let mut buf = BytesMut::new();
    let mut round = 0usize;
    let take = |out: Out, buf: &mut BytesMut, held: &mut BTreeMap<u64, (Arc<Child>, u64)>| match out {
        Out::Msg(msg) => proto::encode(&msg, buf),
        Out::Hold { child, after, msg } => {
            if let Some(msg) = msg {
                proto::encode(&msg, buf);
            }
            held.insert(child.id, (child, after));
        }
    };
    loop {
        while buf.len() < PUMP_BATCH {
            match queue.try_recv() {
                Ok(out) => take(out, &mut buf, &mut held),
                Err(_) => break,
            }
        }
        // Every held child in turn, from a different one each round, until
        // one write's worth is ready (a flooding child cannot starve the rest).
        let ids: Vec<u64> = held.keys().copied().collect();
        round = round.wrapping_add(1);
        for i in 0..ids.len() {
            if buf.len() >= PUMP_BATCH {
                conn.pump.notify_one();
                break;
            }
            let id = ids[(round + i) % ids.len()];
            let Some((child, cursor)) = held.get_mut(&id) else { continue };
            match pump(child, cursor, conn.id, &mut buf) {
                Pumped::More => conn.pump.notify_one(),
                Pumped::Now => {}
                Pumped::Over { told } => {
                    if let Some((child, _)) = held.remove(&id)
                        && told
                    {
                        inner.settle(&child);
                    }
                }
            }
        }
        if !buf.is_empty() {
            if let Err(e) = write.write_all(&buf).await {
                tracing::debug!("writing to the engine failed: {e}");
                return;
            }
            // No capacity kept after a huge line.
            buf.clear();
            if buf.capacity() > 2 * PUMP_BATCH {
                buf = BytesMut::new();
            }
            continue;
        }
        tokio::select! {
            out = queue.recv() => match out {
                Some(out) => take(out, &mut buf, &mut held),
                None => return,
            },
            () = conn.pump.notified() => {}
        }
    }
}

enum Pumped {
    /// More frames wait than one batch.
    More,
    /// Every frame read so far is sent.
    Now,
    /// The engine no longer holds it, or was told it exited.
    Over { told: bool },
}

/// Puts the child's frames after `cursor` (one batch at most) in `buf`,
/// then `Exited` if that was the last.
fn pump(child: &Child, cursor: &mut u64, conn: u64, buf: &mut BytesMut) -> Pumped {
    let mut st = child.state.lock();
    if st.forgotten || st.holder.as_ref().is_none_or(|h| h.id != conn) {
        return Pumped::Over { told: false };
    }
    let first = st.frames.front().map_or(st.last_frame + 1, |(n, _)| *n);
    let skip = usize::try_from((*cursor + 1).saturating_sub(first)).unwrap_or(usize::MAX);
    let mut batch = 0;
    for (n, frame) in st.frames.iter().skip(skip) {
        proto::encode(&frame.to_engine(child.id, *n), buf);
        *cursor = *n;
        batch += frame.size() as usize;
        if batch >= PUMP_BATCH && *n < st.last_frame {
            return Pumped::More;
        }
    }
    if st.eof
        && !st.told_exit
        && let Some((status, _)) = &st.exit
    {
        proto::encode(&ToEngine::Exited { child: child.id, status: status.clone() }, buf);
        st.told_exit = true;
        return Pumped::Over { told: true };
    }
    Pumped::Now
}
