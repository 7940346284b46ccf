//! [`Children`]: the stdio children the keeper holds, and the engine
//! connections that drive them ([`Children::serve_engine`], one per engine,
//! speaking [`crate::proto`]).
//!
//! A child's stdout is read by the keeper, never by an engine: each line
//! (bounded by the child's `max_line`, an over-long one kept as its head and
//! tail) becomes the child's next numbered frame and stays here until the
//! engine acknowledges it. Past `hold_bytes` unacknowledged bytes the
//! keeper stops reading that pipe (the child blocks on write): at most
//! `hold_bytes` plus one line are held per child, and nothing is dropped.
//! Lines for its stdin go through a queue of [`WRITE_QUEUE`] lines, each
//! written whole and once (a `seq` at or below the last taken is skipped).
//! Its stderr goes to its engine line by line ([`STDERR_LINE_MAX`] bytes),
//! or, while no engine holds it, to the keeper's log, at most
//! [`STDERR_PER_WINDOW`] lines per [`STDERR_WINDOW`]; it is never kept.
//!
//! Every child has three tasks (stdout, stdin, stderr) and every engine
//! connection one writer, which sends each held child's frames straight
//! from its buffer (no second queue) and its other answers from a queue of
//! [`OUT_QUEUE`]. A slow child or a slow engine blocks only itself.
//! A sweep every [`SWEEP`] stops orphans (no engine for the child's
//! `orphan_ms`: SIGTERM to its group, SIGKILL [`ORPHAN_KILL_AFTER`] later)
//! and children whose pipes outlive them ([`EXIT_GRACE`] after the exit).
//!
//! Exits are learned from the keeper's reaper ([`Children::reaped`]): no
//! `wait` here. Spawning must happen on a thread that lives as long as the
//! keeper (see [`crate::spawn`]); [`Children::new`] must run inside the
//! tokio runtime that drives it. Nothing an engine or a child sends can
//! make this panic: a frame that cannot be read, or a broken engine, ends
//! that engine's connection with an error, and its children wait for the
//! next one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::process::{Pid, Signal, WaitStatus};
use tether_wire::ndjson::{self, Line, LineDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedWriteHalf, pipe};
use tokio::sync::{Notify, mpsc};
use tokio::task::{AbortHandle, JoinSet};

use crate::proto::{self, Decoder, Kept, SpawnSpec, ToEngine, ToKeeper};

/// Lines queued for one child's stdin at most (the engine keeps fewer
/// unconfirmed; one that sends more is broken and its connection ends).
pub const WRITE_QUEUE: usize = 1024;
/// Open tags kept per child at most (the oldest goes first).
pub const OPEN_TAGS: usize = 4096;
/// Bytes of one stderr line read and passed on at most.
pub const STDERR_LINE_MAX: usize = 2048;
/// Stderr lines of one unheld child logged per window at most.
pub const STDERR_PER_WINDOW: u32 = 100;
pub const STDERR_WINDOW: Duration = Duration::from_secs(10);
/// How long after its exit a child's stdout may stay open (a grandchild
/// holding it) before its group is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How long an `Attach` waits for another engine to let go of the child.
pub const ATTACH_WAIT: Duration = Duration::from_secs(30);
/// From SIGTERM to SIGKILL for an orphan.
pub const ORPHAN_KILL_AFTER: Duration = Duration::from_secs(2);
/// Answers queued for one engine at most (frames are not queued: they are
/// sent from the children's buffers).
pub const OUT_QUEUE: usize = 4096;
/// `Attach`es of one engine waiting for another engine at most.
pub const PENDING_ATTACHES: usize = 4096;
pub const SWEEP: Duration = Duration::from_millis(100);
/// Bytes of frames one child puts in one write to its engine, at most
/// (the others get their turn).
const PUMP_BATCH: usize = 256 * 1024;

/// The keeper's children (cheap to clone: one shared table).
#[derive(Clone)]
pub struct Children {
    inner: Arc<Inner>,
}

struct Inner {
    keeper: u64,
    next_child: AtomicU64,
    next_conn: AtomicU64,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    children: BTreeMap<u64, Arc<Child>>,
    /// Children not reaped yet, by pid.
    by_pid: HashMap<u32, u64>,
    conns: HashMap<u64, Arc<Conn>>,
    /// When the last engine went (for the restart's duration).
    engine_ended: Option<Instant>,
    restarts: u64,
    last_restart_ms: u64,
    /// An engine said it serves ([`ToKeeper::Ready`]).
    ready: bool,
}

struct Child {
    id: u64,
    pid: u32,
    label: String,
    hold_bytes: u64,
    orphan: Duration,
    state: Mutex<State>,
    /// Room was freed (or the child is stopping): the stdout reader goes on.
    room: Notify,
    /// The child was let go: `Attach`es waiting for it try again.
    released: Notify,
    stdin: mpsc::Sender<(u64, Bytes)>,
}

#[derive(Default)]
struct State {
    /// Unacknowledged frames, numbered consecutively.
    frames: VecDeque<(u64, Frame)>,
    held: u64,
    /// The last frame's number (0: none yet).
    last_frame: u64,
    paused: bool,
    holder: Option<Arc<Conn>>,
    unattached_since: Option<Instant>,
    /// The last `seq` taken for its stdin, and the last written.
    queued: u64,
    written: u64,
    open: VecDeque<Bytes>,
    exit: Option<(String, Instant)>,
    eof: bool,
    /// Its holder was told `Exited`.
    told_exit: bool,
    stopped: bool,
    term_sent: Option<Instant>,
    killed: bool,
    forgotten: bool,
    reader: Option<AbortHandle>,
}

enum Frame {
    Line(Bytes),
    TooLong { len: u64, head: Bytes, tail: Bytes },
}

impl Frame {
    fn size(&self) -> u64 {
        match self {
            Frame::Line(line) => line.len() as u64,
            Frame::TooLong { head, tail, .. } => (head.len() + tail.len()) as u64,
        }
    }

    fn to_engine(&self, child: u64, frame: u64) -> ToEngine {
        match self {
            Frame::Line(line) => ToEngine::Line { child, frame, line: line.clone() },
            Frame::TooLong { len, head, tail } => {
                ToEngine::TooLong { child, frame, len: *len, head: head.clone(), tail: tail.clone() }
            }
        }
    }
}

/// One engine connection.
struct Conn {
    id: u64,
    out: mpsc::Sender<Out>,
    /// A held child has something to send.
    pump: Notify,
}

enum Out {
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

/// How a process ended, as a person reads it.
pub fn describe(status: WaitStatus) -> String {
    match (status.exit_status(), status.terminating_signal()) {
        (Some(code), _) => format!("exited (exit status: {code})"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended (wait status {:#x})", status.as_raw()),
    }
}

/// Sends `signal` to the process group `pid` leads.
pub fn signal_group(pid: u32, signal: Signal) {
    if let Some(pgid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

impl Default for Children {
    fn default() -> Self {
        Self::new()
    }
}

impl Children {
    /// An empty table for the keeper process identified by a random number;
    /// starts the sweep on the current tokio runtime.
    pub fn new() -> Self {
        let keeper = RandomState::new().hash_one(std::process::id());
        let inner = Arc::new(Inner {
            keeper,
            next_child: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
            table: Mutex::new(Table::default()),
        });
        tokio::spawn(sweep(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// This keeper's identity (`Welcome::keeper`).
    pub fn keeper_id(&self) -> u64 {
        self.inner.keeper
    }

    /// The reaper saw `pid` end: true if it was one of the children. Reap
    /// on the thread that spawns: std's spawn reaps a child whose exec
    /// failed itself, and a `wait(-1)` racing it from another thread makes
    /// std panic.
    pub fn reaped(&self, pid: u32, status: WaitStatus) -> bool {
        let child = {
            let mut table = self.inner.table.lock();
            let Some(id) = table.by_pid.remove(&pid) else { return false };
            table.children.get(&id).cloned()
        };
        if let Some(child) = child {
            let mut st = child.state.lock();
            st.exit = Some((describe(status), Instant::now()));
            tracing::debug!(child = child.id, label = %child.label, "child {pid} {}", describe(status));
            if let Some(holder) = &st.holder {
                holder.pump.notify_one();
            }
            drop(st);
            self.inner.settle(&child);
        }
        true
    }

    /// The engine process ended (for the next restart's duration).
    pub fn engine_ended(&self) {
        self.inner.table.lock().engine_ended = Some(Instant::now());
    }

    /// Whether an engine ever said it serves ([`ToKeeper::Ready`]).
    pub fn ever_ready(&self) -> bool {
        self.inner.table.lock().ready
    }

    /// Asks every engine connected to hand over (an upgrade); false if none is.
    pub fn handover(&self) -> bool {
        let conns: Vec<_> = self.inner.table.lock().conns.values().cloned().collect();
        conns.iter().filter(|c| c.out.try_send(Out::Msg(ToEngine::Handover)).is_ok()).count() > 0
    }

    /// The children kept now.
    pub fn kept(&self) -> Vec<Kept> {
        let children: Vec<_> = self.inner.table.lock().children.values().cloned().collect();
        children
            .iter()
            .map(|c| Kept { child: c.id, pid: c.pid, label: c.label.clone(), attached: c.state.lock().holder.is_some() })
            .collect()
    }

    /// Stops every child: SIGTERM to each group, SIGKILL to those not
    /// reaped within `grace`, then waits (at most 2 s more) for the reaper.
    pub async fn stop_all(&self, grace: Duration) {
        let children: Vec<_> = self.inner.table.lock().children.values().cloned().collect();
        let signal = if grace.is_zero() { Signal::KILL } else { Signal::TERM };
        for child in &children {
            let mut st = child.state.lock();
            st.stopped = true;
            if st.exit.is_none() {
                signal_group(child.pid, signal);
            }
            child.room.notify_one();
        }
        let alive = |children: &[Arc<Child>]| children.iter().any(|c| c.state.lock().exit.is_none());
        let deadline = Instant::now() + grace;
        while alive(&children) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for child in &children {
            if child.state.lock().exit.is_none() {
                tracing::info!(child = child.id, label = %child.label, "child {} did not stop within {grace:?}: killing its process group", child.pid);
                signal_group(child.pid, Signal::KILL);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(&children) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
            ToKeeper::Done { child, tag } => {
                if let Some(c) = self.inner.held_by(conn, child) {
                    c.state.lock().open.retain(|t| *t != tag);
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

    /// Starts a child held by `conn`.
    /// Starts a child held by `conn` and queues `Spawned` before anything
    /// of the child's can be (its `Stderr`); `Ok(Err)` if the queue is full.
    fn spawn(&self, conn: &Arc<Conn>, req: u64, spec: SpawnSpec) -> Result<Result<(), String>, String> {
        let mut command = Command::new(&spec.program);
        command.args(&spec.args).env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
        if let Some(cwd) = &spec.cwd {
            command.current_dir(cwd);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        crate::spawn::die_with_keeper(&mut command);
        let max_line = usize::try_from(spec.max_line).unwrap_or(usize::MAX).min(proto::MAX_FRAME - 1024);
        // Under the table's lock, so that the reaper knows the pid before it can see it exit.
        let mut table = self.inner.table.lock();
        let mut process = command.spawn().map_err(|e| {
            let dir = match &spec.cwd {
                Some(cwd) => cwd.clone(),
                None => std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "?".into()),
            };
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                "; check the command is installed, on the PATH the child is given, and that the directory exists"
            } else {
                ""
            };
            format!("cannot start `{}` in {dir}: {e}{hint}", spec.program)
        })?;
        let pid = process.id();
        let pipes = (process.stdin.take(), process.stdout.take(), process.stderr.take());
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            signal_group(pid, Signal::KILL);
            return Err(format!("`{}` started without its stdio pipes", spec.program));
        };
        let pipes = (|| {
            Ok::<_, std::io::Error>((
                pipe::Sender::from_owned_fd(OwnedFd::from(stdin))?,
                pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))?,
                pipe::Receiver::from_owned_fd(OwnedFd::from(stderr))?,
            ))
        })();
        let (stdin, stdout, stderr) = pipes.map_err(|e| {
            signal_group(pid, Signal::KILL);
            format!("`{}` started but its pipes cannot be used: {e}", spec.program)
        })?;
        let id = self.inner.next_child.fetch_add(1, Ordering::Relaxed);
        let (stdin_tx, stdin_rx) = mpsc::channel(WRITE_QUEUE);
        let child = Arc::new(Child {
            id,
            pid,
            label: spec.label,
            hold_bytes: spec.hold_bytes,
            orphan: Duration::from_millis(spec.orphan_ms),
            state: Mutex::new(State { holder: Some(conn.clone()), ..State::default() }),
            room: Notify::new(),
            released: Notify::new(),
            stdin: stdin_tx,
        });
        table.children.insert(id, child.clone());
        table.by_pid.insert(pid, id);
        drop(table);
        let spawned = ToEngine::Spawned { req, child: id, pid };
        let queued =
            conn.out.try_send(Out::Hold { child: child.clone(), after: 0, msg: Some(spawned) }).map_err(|_| not_reading());
        let reader = tokio::spawn(read_stdout(self.inner.clone(), child.clone(), stdout, max_line));
        child.state.lock().reader = Some(reader.abort_handle());
        tokio::spawn(write_stdin(child.clone(), stdin, stdin_rx));
        tokio::spawn(read_stderr(child.clone(), stderr));
        tracing::info!(child = id, label = %child.label, "started `{}` (pid {pid})", spec.program);
        Ok(queued)
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

fn not_reading() -> String {
    format!("more than {OUT_QUEUE} answers wait for the engine: it does not read them")
}

impl Inner {
    fn child(&self, id: u64) -> Option<Arc<Child>> {
        self.table.lock().children.get(&id).cloned()
    }

    /// The child, if `conn` holds it (a frame about another is stale: ignored).
    fn held_by(&self, conn: &Conn, id: u64) -> Option<Arc<Child>> {
        let child = self.child(id)?;
        let held = child.state.lock().holder.as_ref().is_some_and(|h| h.id == conn.id);
        if !held {
            tracing::debug!(child = id, "a frame about a child this engine does not hold: ignored");
        }
        held.then_some(child)
    }

    /// Queues a line for the child's stdin unless `seq` was taken already;
    /// then returns the last written, if `seq` was.
    fn write(&self, c: &Child, seq: u64, tag: Bytes, line: Bytes) -> Result<Option<u64>, String> {
        let mut st = c.state.lock();
        if seq <= st.queued {
            return Ok((seq <= st.written).then_some(st.written));
        }
        match c.stdin.try_send((seq, line)) {
            Ok(()) => st.queued = seq,
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(format!("more than {WRITE_QUEUE} lines queued for child {}'s stdin", c.id));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!(child = c.id, "a line for a child whose stdin is closed");
            }
        }
        if !tag.is_empty() && !st.open.contains(&tag) {
            if st.open.len() >= OPEN_TAGS {
                st.open.pop_front();
                tracing::warn!(child = c.id, label = %c.label, "over {OPEN_TAGS} open tags: forgetting the oldest");
            }
            st.open.push_back(tag);
        }
        Ok(None)
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

    /// Forgets the child if nothing more can come of it.
    fn settle(&self, child: &Arc<Child>) {
        let mut table = self.table.lock();
        let mut st = child.state.lock();
        let gone = st.eof && st.exit.is_some();
        let told = st.told_exit && (st.frames.is_empty() || st.stopped);
        if st.forgotten || !(gone && (told || (st.stopped && st.holder.is_none()))) {
            return;
        }
        st.forgotten = true;
        table.children.remove(&child.id);
        tracing::debug!(child = child.id, label = %child.label, "child forgotten");
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

async fn read_stdout(inner: Arc<Inner>, child: Arc<Child>, stdout: pipe::Receiver, max_line: usize) {
    let mut reader = BufReader::new(stdout);
    let mut decoder = LineDecoder::new(max_line);
    loop {
        // Backpressure: no more reading while over the bound.
        loop {
            let room = child.room.notified();
            {
                let mut st = child.state.lock();
                st.paused = st.held > child.hold_bytes && !st.stopped;
                if !st.paused {
                    break;
                }
            }
            room.await;
        }
        if child.state.lock().stopped {
            break;
        }
        let frame = match ndjson::read_line(&mut reader, &mut decoder).await {
            Ok(Some(Line::Text(line))) => Frame::Line(Bytes::from(line)),
            Ok(Some(Line::TooLong { len, head, tail })) => {
                Frame::TooLong { len: len as u64, head: Bytes::from(head), tail: Bytes::from(tail) }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(child = child.id, label = %child.label, "reading the child's stdout failed: {e}");
                break;
            }
        };
        let mut st = child.state.lock();
        st.last_frame += 1;
        st.held += frame.size();
        let n = st.last_frame;
        st.frames.push_back((n, frame));
        if let Some(holder) = &st.holder {
            holder.pump.notify_one();
        }
    }
    let mut st = child.state.lock();
    st.eof = true;
    if let Some(holder) = &st.holder {
        holder.pump.notify_one();
    }
    drop(st);
    inner.settle(&child);
}

async fn write_stdin(child: Arc<Child>, stdin: pipe::Sender, mut lines: mpsc::Receiver<(u64, Bytes)>) {
    let mut out = BufWriter::new(stdin);
    while let Some((mut seq, line)) = lines.recv().await {
        let mut next = Some((seq, line));
        let result = async {
            while let Some((s, line)) = next.take() {
                out.write_all(&line).await?;
                out.write_all(b"\n").await?;
                seq = s;
                next = lines.try_recv().ok();
            }
            out.flush().await
        }
        .await;
        if let Err(e) = result {
            tracing::debug!(child = child.id, label = %child.label, "writing to the child's stdin failed: {e}");
            return;
        }
        let holder = {
            let mut st = child.state.lock();
            st.written = seq;
            st.holder.clone()
        };
        if let Some(holder) = holder {
            let _ = holder.out.send(Out::Msg(ToEngine::Written { child: child.id, seq })).await;
        }
    }
}

async fn read_stderr(child: Arc<Child>, stderr: pipe::Receiver) {
    let mut reader = BufReader::new(stderr);
    let mut decoder = LineDecoder::new(STDERR_LINE_MAX);
    let (mut window, mut logged, mut left_out) = (Instant::now(), 0u32, 0u64);
    while let Ok(Some(line)) = ndjson::read_line(&mut reader, &mut decoder).await {
        let line = match line {
            Line::Text(text) => text,
            Line::TooLong { head, .. } => head,
        };
        let holder = child.state.lock().holder.clone();
        if let Some(holder) = holder {
            let _ = holder.out.send(Out::Msg(ToEngine::Stderr { child: child.id, line: Bytes::from(line) })).await;
            continue;
        }
        if window.elapsed() >= STDERR_WINDOW {
            (window, logged) = (Instant::now(), 0);
        }
        if logged >= STDERR_PER_WINDOW {
            left_out += 1;
            continue;
        }
        logged += 1;
        let text: String = String::from_utf8_lossy(&line).chars().filter(|c| !c.is_control()).collect();
        let also = match std::mem::take(&mut left_out) {
            0 => String::new(),
            n => format!(" (after {n} lines left out: more than {STDERR_PER_WINDOW} in {STDERR_WINDOW:?})"),
        };
        tracing::info!(child = child.id, label = %child.label, "stderr: {text}{also}");
    }
}

/// Stops orphans and children whose pipes outlive them; forgets what is over.
async fn sweep(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let children: Vec<_> = inner.table.lock().children.values().cloned().collect();
        for child in children {
            let mut st = child.state.lock();
            let orphaned = st.unattached_since.filter(|_| st.holder.is_none()).map(|t| t.elapsed());
            if !st.stopped && orphaned.is_some_and(|t| t >= child.orphan) {
                tracing::info!(child = child.id, label = %child.label, "stopping child {} (pid {}): no engine held it for {:?}", child.id, child.pid, child.orphan);
                st.stopped = true;
                if st.exit.is_none() {
                    signal_group(child.pid, Signal::TERM);
                    st.term_sent = Some(Instant::now());
                }
                child.room.notify_one();
            }
            if st.exit.is_none() && !st.killed && st.term_sent.is_some_and(|t| t.elapsed() >= ORPHAN_KILL_AFTER) {
                signal_group(child.pid, Signal::KILL);
                st.killed = true;
            }
            let since_exit = st.exit.as_ref().map(|(_, at)| at.elapsed());
            if !st.eof && since_exit.is_some_and(|t| t >= EXIT_GRACE) && !st.killed {
                // Something it started holds its stdout: its group goes too.
                signal_group(child.pid, Signal::KILL);
                st.killed = true;
            }
            if !st.eof && since_exit.is_some_and(|t| t >= 2 * EXIT_GRACE) && (st.stopped || !st.paused) {
                if let Some(reader) = st.reader.take() {
                    tracing::warn!(child = child.id, label = %child.label, "child {} exited but its stdout stays open: no longer reading it", child.id);
                    reader.abort();
                }
                st.eof = true;
                if let Some(holder) = &st.holder {
                    holder.pump.notify_one();
                }
            }
            drop(st);
            inner.settle(&child);
        }
    }
}
