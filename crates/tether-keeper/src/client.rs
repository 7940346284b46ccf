//! The engine's side of the control protocol: the engine's connection to
//! the keeper that started it.
//!
//! [`handshake`] runs before the engine's runtime starts serving: under a
//! keeper (the environment says so) the engine's standard input is its
//! control socket; it says `Hello`, and the `Welcome` brings the listening
//! sockets (as `SCM_RIGHTS`), the keeper's identity, this engine's epoch and
//! the children kept. [`Welcomed::start`] then serves the socket: one task
//! reads frames and routes each to the child it is about (a channel per
//! child, or the child's inline handler: [`Keeper::answer_inline`]) or to
//! the request waiting for it. Frames to the keeper are written by the
//! task that sends them, through a [`SharedWriter`]: a call's line reaches the
//! keeper without waking another task.
//!
//! Bounds: frames to the keeper wait in a shared writer of [`OUT_BYTES`]; a child's
//! stdin has at most [`WRITE_WINDOW`] lines the keeper has not confirmed
//! (`Written`); a child's stdout frames reach its channel only as the
//! keeper reads them, which it does only while it holds fewer than the
//! child's `hold_bytes` unacknowledged: the channel holds no more than
//! that. Stderr lines beyond [`STDERR_QUEUE`] waiting are dropped.
//!
//! The engine also asks the kernel to kill it when the keeper dies
//! (`PR_SET_PDEATHSIG`), so that no engine outlives its keeper.

use std::collections::HashMap;
use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use tether_wire::shared_writer::{Message, SharedWriter};
use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use crate::proto::{self, Decoder, Kept, SpawnSpec, ToEngine, ToKeeper};

/// Names the listening sockets, comma-separated, in the order the keeper
/// sends them; set only for an engine a keeper started.
pub const LISTENERS_ENV: &str = "TETHER_KEEPER_LISTENERS";
/// The keeper's process ID, for the engine to check its parent.
pub const PID_ENV: &str = "TETHER_KEEPER_PID";

/// Bytes of frames to the keeper waiting to be written, at most (plus one frame).
pub const OUT_BYTES: usize = 4 << 20;
/// Lines written to one child's stdin the keeper has not confirmed, at most
/// (the keeper confirms every [`crate::children::WRITTEN_EVERY`] lines, fewer
/// than this, so the window always reopens).
pub const WRITE_WINDOW: usize = 256;
/// Stderr lines of one child waiting to be logged, at most.
pub const STDERR_QUEUE: usize = 256;
/// Children this engine remembers having seen exit, at most.
const EXITED_KEPT: usize = 4096;
/// Listening sockets a keeper may hand over, at most.
const MAX_LISTENERS: usize = 8;

/// Listening sockets by name.
pub type Listeners = Vec<(String, std::net::TcpListener)>;

/// The handshake's outcome, before the engine serves.
pub struct Welcomed {
    stream: StdUnixStream,
    decoder: Decoder,
    keeper: u64,
    epoch: u64,
    children: Vec<Kept>,
    /// The listening sockets, by the names the keeper gave them.
    pub listeners: Listeners,
}

/// Runs the handshake if this process is an engine a keeper started
/// (`None` if it is not). Blocking: call it before serving.
pub fn handshake() -> Result<Option<Welcomed>, String> {
    let Ok(names) = std::env::var(LISTENERS_ENV) else { return Ok(None) };
    die_with_keeper()?;
    let names: Vec<String> = names.split(',').filter(|n| !n.is_empty()).map(str::to_owned).collect();
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("the keeper's control socket (standard input) cannot be used: {e}"))?;
    let mut stream = StdUnixStream::from(fd);
    let hello = proto::frame(&ToKeeper::Hello { version: proto::VERSION, pid: std::process::id() });
    stream.write_all(&hello).map_err(|e| format!("cannot greet the keeper: {e}"))?;
    let mut decoder = Decoder::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    let welcome = loop {
        if let Some(message) = decoder.next::<ToEngine>().map_err(|e| e.to_string())? {
            break message;
        }
        let mut chunk = [0u8; 64 * 1024];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_LISTENERS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut chunk)];
        let got = rustix::net::recvmsg(&stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
            .map_err(|e| format!("cannot read the keeper's welcome: {e}"))?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if got.bytes == 0 {
            return Err("the keeper closed its control socket before welcoming this engine".into());
        }
        decoder.push(&chunk[..got.bytes]);
    };
    let (keeper, epoch, children) = match welcome {
        ToEngine::Welcome { version, keeper, epoch, children } if version == proto::VERSION => (keeper, epoch, children),
        ToEngine::Welcome { version, .. } => {
            return Err(format!("the keeper speaks protocol {version}, this engine {}", proto::VERSION));
        }
        ToEngine::Refused { reason } => return Err(format!("the keeper refused this engine: {reason}")),
        other => return Err(format!("the keeper answered hello with {other:?}")),
    };
    if fds.len() != names.len() {
        return Err(format!("the keeper handed over {} listening sockets for {} names ({names:?})", fds.len(), names.len()));
    }
    let listeners = names.into_iter().zip(fds).map(|(name, fd)| (name, std::net::TcpListener::from(fd))).collect();
    // Whatever followed the welcome in the same read stays in the decoder.
    Ok(Some(Welcomed { stream, decoder, keeper, epoch, children, listeners }))
}

/// `PR_SET_PDEATHSIG`: the kernel kills this process when the keeper (its
/// parent) dies; and if it died already, this process goes now.
#[cfg(not(target_os = "linux"))]
fn die_with_keeper() -> Result<(), String> {
    Err("the keeper runs on Linux only: run tether serve --no-keeper".into())
}

#[cfg(target_os = "linux")]
fn die_with_keeper() -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("cannot ask to die with the keeper: {e}"))?;
    let expected = std::env::var(PID_ENV).ok().and_then(|p| p.parse::<i32>().ok());
    let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if expected.is_some() && parent != expected {
        return Err("the keeper that started this engine is gone".into());
    }
    Ok(())
}

impl Welcomed {
    /// Serves the control socket from now on (in tasks of the current runtime).
    pub fn start(self) -> Result<(Arc<Keeper>, Listeners), String> {
        self.stream.set_nonblocking(true).map_err(|e| format!("the keeper's control socket: {e}"))?;
        let stream = tokio::net::UnixStream::from_std(self.stream).map_err(|e| format!("the keeper's control socket: {e}"))?;
        let (read, write) = stream.into_split();
        let keeper = Arc::new(Keeper {
            id: self.keeper,
            epoch: self.epoch,
            kept: self.children,
            out: SharedWriter::new(write, OUT_BYTES),
            routes: parking_lot::Mutex::new(Routes::default()),
            next_req: AtomicU64::new(1),
            handover: Notify::new(),
            handover_asked: AtomicBool::new(false),
            gone: Notify::new(),
            is_gone: AtomicBool::new(false),
        });
        tokio::spawn(read_frames(read, self.decoder, keeper.clone()));
        Ok((keeper, self.listeners))
    }
}

/// What a child's stdout and the keeper say of it, in order.
#[derive(Debug)]
pub enum ChildEvent {
    /// Frame `frame`: one line of its stdout.
    Line { frame: u64, line: Bytes },
    /// Frame `frame`: a line over its `max_line`.
    TooLong { frame: u64, len: u64, head: Bytes, tail: Bytes },
    /// The child is gone; no frame follows.
    Exited { status: String },
    /// The keeper's connection ended (the keeper died): so will this engine.
    KeeperGone,
}

/// A child this engine holds: its events and stderr lines.
pub struct ChildPort {
    pub child: u64,
    pub pid: u32,
    pub events: ChildEvents,
    pub stderr: mpsc::Receiver<Bytes>,
}

/// One child's events, in order (see [`ChildEvent`]).
pub struct ChildEvents {
    rx: mpsc::UnboundedReceiver<ChildEvent>,
    /// Events sent and not yet handled: the one [`Self::recv`] returned
    /// last counts until the next call.
    busy: Arc<AtomicUsize>,
    holding: bool,
}

impl ChildEvents {
    /// The next event, once the last one is handled (this call says so).
    pub async fn recv(&mut self) -> Option<ChildEvent> {
        if std::mem::take(&mut self.holding) {
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
        let event = self.rx.recv().await;
        self.holding = event.is_some();
        event
    }
}

/// Handles a child's stdout line at once, in the socket's reader (`frame`,
/// `line`): `true` if it did, `false` to have it queued as a
/// [`ChildEvent::Line`]. It must not block.
pub type Inline = Arc<dyn Fn(u64, &Bytes) -> bool + Send + Sync>;

/// A kept child as `attach` finds it.
pub struct Attached {
    pub port: ChildPort,
    /// The last line its stdin got (the next one is `written + 1`).
    pub written: u64,
    /// Tags of lines whose requests had not ended.
    pub open: Vec<Bytes>,
}

/// The keeper's counts (see [`ToEngine::Status`]).
#[derive(Debug, Clone)]
pub struct Status {
    pub restarts: u64,
    pub last_restart_ms: u64,
    pub held_bytes: u64,
    pub children: Vec<Kept>,
}

/// Where one child's events go.
struct Route {
    queue: Queue,
    inline: Option<Inline>,
    stderr: mpsc::Sender<Bytes>,
    /// Stdin lines the keeper may still take before confirming some.
    window: Arc<Semaphore>,
    confirmed: u64,
}

#[derive(Default)]
struct Routes {
    children: HashMap<u64, Route>,
    /// Children this engine saw exit (the latest [`EXITED_KEPT`]): never
    /// attached again, though the keeper may keep their record a moment
    /// longer (until their last frames are acknowledged).
    exited: std::collections::VecDeque<u64>,
    spawns: HashMap<u64, oneshot::Sender<Result<ChildPort, String>>>,
    attaches: HashMap<u64, oneshot::Sender<Result<Attached, String>>>,
    statuses: HashMap<u64, oneshot::Sender<Status>>,
}

/// The engine's connection to its keeper.
pub struct Keeper {
    id: u64,
    epoch: u64,
    kept: Vec<Kept>,
    out: SharedWriter<OwnedWriteHalf>,
    routes: parking_lot::Mutex<Routes>,
    next_req: AtomicU64,
    handover: Notify,
    handover_asked: AtomicBool,
    gone: Notify,
    is_gone: AtomicBool,
}

/// The keeper is gone (its control socket closed).
pub const KEEPER_GONE: &str = "the keeper's control socket is closed (the keeper died; this engine stops with it)";

impl Keeper {
    /// This keeper process's identity: a child ID means something only to it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How many engines the keeper started, this one included.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The children the keeper kept when this engine started.
    pub fn kept_at_start(&self) -> &[Kept] {
        &self.kept
    }

    async fn send(&self, message: &ToKeeper) -> Result<(), String> {
        self.out.send(Message::new(proto::frame(message))).await.map_err(|_| KEEPER_GONE.to_owned())
    }

    /// Starts a child, held by this engine.
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<ChildPort, String> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.routes.lock().spawns.insert(req, tx);
        self.send(&ToKeeper::Spawn { req, spec }).await?;
        rx.await.map_err(|_| KEEPER_GONE.to_owned())?
    }

    /// Takes a kept child over; its stdout frames after `after` follow.
    pub async fn attach(&self, child: u64, after: u64) -> Result<Attached, String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut routes = self.routes.lock();
            if routes.exited.contains(&child) {
                return Err(format!("child {child} exited"));
            }
            if routes.attaches.insert(child, tx).is_some() {
                return Err(format!("child {child} is being attached already"));
            }
        }
        self.send(&ToKeeper::Attach { child, after }).await?;
        rx.await.map_err(|_| KEEPER_GONE.to_owned())?
    }

    /// Writes one line to a child's stdin (once: see [`ToKeeper::Write`]),
    /// waiting while [`WRITE_WINDOW`] lines are unconfirmed. Its number is
    /// taken from `next_seq` as the frame goes into the shared writer, so the
    /// keeper gets the lines in the order of their numbers, whichever tasks
    /// write them. Cancel-safe: a line is sent whole, numbered, or not at all.
    pub async fn write(&self, child: u64, next_seq: &AtomicU64, tag: Bytes, line: Bytes) -> Result<u64, String> {
        let window = self.window(child)?;
        let permit = window.acquire().await.map_err(|_| KEEPER_GONE.to_owned())?;
        let seq = self.out.send_with(numbered(child, next_seq, tag, line)).await.map_err(|_| KEEPER_GONE.to_owned())?;
        // Given back by the keeper's `Written`.
        permit.forget();
        Ok(seq)
    }

    /// [`Self::write`] without waiting: refused when the window or the
    /// shared writer is full.
    pub fn try_write(&self, child: u64, next_seq: &AtomicU64, tag: Bytes, line: Bytes) -> Result<u64, String> {
        let window = self.window(child)?;
        let permit = window.try_acquire().map_err(|_| format!("{WRITE_WINDOW} lines to child {child} are unconfirmed"))?;
        let seq = self.out.try_send_with(numbered(child, next_seq, tag, line)).map_err(|e| e.to_string())?;
        permit.forget();
        Ok(seq)
    }

    /// The window of a child this engine holds.
    fn window(&self, child: u64) -> Result<Arc<Semaphore>, String> {
        let window = self.routes.lock().children.get(&child).map(|r| r.window.clone());
        window.ok_or_else(|| format!("child {child} is not held by this engine"))
    }

    /// Has `inline` handle the child's stdout lines in the socket's reader
    /// while nothing of the child's is queued (so the order holds): a
    /// call's answer then reaches its request without waking the child's
    /// own task.
    pub fn answer_inline(&self, child: u64, inline: Inline) {
        if let Some(route) = self.routes.lock().children.get_mut(&child) {
            route.inline = Some(inline);
        }
    }

    /// Every frame of the child up to `upto` is stored.
    pub async fn ack(&self, child: u64, upto: u64) -> Result<(), String> {
        self.send(&ToKeeper::Ack { child, upto }).await
    }

    /// The requests these tags named have ended.
    pub async fn done(&self, child: u64, tags: Vec<Bytes>) -> Result<(), String> {
        self.send(&ToKeeper::Done { child, tags }).await
    }

    /// Lets go of a child: it lives on for the next engine.
    pub async fn release(&self, child: u64) -> Result<(), String> {
        self.routes.lock().children.remove(&child);
        self.send(&ToKeeper::Release { child }).await
    }

    /// Stops a child; its `Exited` follows.
    pub async fn stop(&self, child: u64) -> Result<(), String> {
        self.send(&ToKeeper::Stop { child }).await
    }

    /// The keeper's counts.
    pub async fn status(&self) -> Result<Status, String> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.routes.lock().statuses.insert(req, tx);
        self.send(&ToKeeper::Status { req }).await?;
        rx.await.map_err(|_| KEEPER_GONE.to_owned())
    }

    /// Tells the keeper this engine serves (see [`ToKeeper::Ready`]).
    pub async fn ready(&self) -> Result<(), String> {
        self.send(&ToKeeper::Ready).await
    }

    /// Resolves once the keeper asked this engine to hand over (an upgrade).
    pub async fn handover_asked(&self) {
        let notified = self.handover.notified();
        if self.handover_asked.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Resolves once the keeper's connection is gone.
    pub async fn gone(&self) {
        let notified = self.gone.notified();
        if self.is_gone.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// A route for a child that is this engine's from now on.
    fn open_route(routes: &mut Routes, child: u64, pid: u32) -> ChildPort {
        let (events_tx, rx) = mpsc::unbounded_channel();
        let (stderr_tx, stderr) = mpsc::channel(STDERR_QUEUE);
        let window = Arc::new(Semaphore::new(WRITE_WINDOW));
        let busy = Arc::new(AtomicUsize::new(0));
        let queue = Queue { events: events_tx, busy: busy.clone() };
        let route = Route { queue, inline: None, stderr: stderr_tx, window, confirmed: 0 };
        routes.children.insert(child, route);
        ChildPort { child, pid, events: ChildEvents { rx, busy, holding: false }, stderr }
    }

    fn received(&self, message: ToEngine) {
        if let ToEngine::Line { child, frame, line } = message {
            return self.line(child, frame, line);
        }
        let mut routes = self.routes.lock();
        match message {
            ToEngine::Spawned { req, child, pid } => {
                let port = Self::open_route(&mut routes, child, pid);
                if let Some(tx) = routes.spawns.remove(&req) {
                    let _ = tx.send(Ok(port));
                }
            }
            ToEngine::SpawnFailed { req, error } => {
                if let Some(tx) = routes.spawns.remove(&req) {
                    let _ = tx.send(Err(error));
                }
            }
            ToEngine::Attached { child, written, open } => {
                let pid = self.kept.iter().find(|k| k.child == child).map_or(0, |k| k.pid);
                let mut port = Self::open_route(&mut routes, child, pid);
                if let Some(route) = routes.children.get_mut(&child) {
                    route.confirmed = written;
                }
                port.pid = pid;
                if let Some(tx) = routes.attaches.remove(&child) {
                    let _ = tx.send(Ok(Attached { port, written, open }));
                }
            }
            ToEngine::AttachFailed { child, reason } => {
                if let Some(tx) = routes.attaches.remove(&child) {
                    let _ = tx.send(Err(reason));
                }
            }
            // Taken by `line` above.
            ToEngine::Line { .. } => {}
            ToEngine::TooLong { child, frame, len, head, tail } => {
                route_event(&routes, child, ChildEvent::TooLong { frame, len, head, tail });
            }
            ToEngine::Written { child, seq } => {
                if let Some(route) = routes.children.get_mut(&child)
                    && seq > route.confirmed
                {
                    let more = usize::try_from(seq - route.confirmed).unwrap_or(WRITE_WINDOW).min(WRITE_WINDOW);
                    route.confirmed = seq;
                    route.window.add_permits(more);
                }
            }
            ToEngine::Stderr { child, line } => {
                if let Some(route) = routes.children.get(&child) {
                    // A child that floods stderr loses lines from the log, nothing else.
                    let _ = route.stderr.try_send(line);
                }
            }
            ToEngine::Exited { child, status } => {
                if routes.exited.len() >= EXITED_KEPT {
                    routes.exited.pop_front();
                }
                routes.exited.push_back(child);
                if let Some(route) = routes.children.remove(&child) {
                    route.queue.push(ChildEvent::Exited { status });
                }
            }
            ToEngine::Status { req, restarts, last_restart_ms, held_bytes, children } => {
                if let Some(tx) = routes.statuses.remove(&req) {
                    let _ = tx.send(Status { restarts, last_restart_ms, held_bytes, children });
                }
            }
            ToEngine::Handover => {
                self.handover_asked.store(true, Ordering::Release);
                self.handover.notify_waiters();
            }
            ToEngine::Welcome { .. } | ToEngine::Refused { .. } => {
                tracing::warn!("the keeper greeted this engine a second time; ignored");
            }
        }
    }

    /// A line of a child's stdout: handled inline when the child's handler
    /// takes it and nothing of the child's waits before it, else queued.
    fn line(&self, child: u64, frame: u64, line: Bytes) {
        let route = self.routes.lock().children.get(&child).map(|r| (r.inline.clone(), r.queue.clone()));
        let Some((inline, queue)) = route else {
            return tracing::debug!(child, "a frame of a child this engine does not hold; dropped");
        };
        // Only this task queues a child's events: once they are all handled
        // nothing can come before this line.
        if let Some(inline) = inline
            && queue.idle()
            && inline(frame, &line)
        {
            return;
        }
        queue.push(ChildEvent::Line { frame, line });
    }

    /// The connection ended: every child's owner hears it, every waiter fails.
    fn ended(&self) {
        let routes = std::mem::take(&mut *self.routes.lock());
        for (_, route) in routes.children {
            route.queue.push(ChildEvent::KeeperGone);
            route.window.close();
        }
        self.is_gone.store(true, Ordering::Release);
        self.gone.notify_waiters();
    }
}

/// The `Write` of a line to `child`, numbered from `next_seq` when built
/// (under the shared writer's lock, so numbers follow the bytes).
fn numbered(child: u64, next_seq: &AtomicU64, tag: Bytes, line: Bytes) -> impl FnOnce() -> (u64, Message) + '_ {
    move || {
        let seq = next_seq.fetch_add(1, Ordering::Relaxed);
        (seq, Message::new(proto::frame(&ToKeeper::Write { child, seq, tag, line })))
    }
}

/// The sending side of a child's [`ChildEvents`].
#[derive(Clone)]
struct Queue {
    events: mpsc::UnboundedSender<ChildEvent>,
    /// Shared with its [`ChildEvents`]: 0 when every event sent is handled.
    busy: Arc<AtomicUsize>,
}

impl Queue {
    fn push(&self, event: ChildEvent) {
        self.busy.fetch_add(1, Ordering::AcqRel);
        if self.events.send(event).is_err() {
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Nothing sent waits to be handled.
    fn idle(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }
}

fn route_event(routes: &Routes, child: u64, event: ChildEvent) {
    match routes.children.get(&child) {
        Some(route) => route.queue.push(event),
        None => tracing::debug!(child, "a frame of a child this engine does not hold; dropped"),
    }
}

async fn read_frames(mut read: tokio::net::unix::OwnedReadHalf, mut decoder: Decoder, keeper: Arc<Keeper>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        loop {
            match decoder.next::<ToEngine>() {
                Ok(Some(message)) => keeper.received(message),
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(error = %e, "the keeper sent a frame this engine cannot read; leaving its control socket");
                    return keeper.ended();
                }
            }
        }
        buf.clear();
        match read.read_buf(&mut buf).await {
            Ok(0) => {
                tracing::error!("{KEEPER_GONE}");
                return keeper.ended();
            }
            Ok(_) => decoder.push(&buf),
            Err(e) => {
                tracing::error!(error = %e, "reading the keeper's control socket failed");
                return keeper.ended();
            }
        }
    }
}
