//! [`Children`]: the table of the stdio children the keeper holds. The
//! engine connections that drive them ([`Children::serve_engine`], one per
//! engine) are in `engine_conn`.
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
//! Every child has three tasks (stdout, stdin, stderr); its frames are sent
//! to its engine straight from its buffer by that engine's writer (no second
//! queue). A slow child blocks only itself.
//! A sweep every [`SWEEP`] stops orphans (no engine for the child's
//! `orphan_ms`: SIGTERM to its group, SIGKILL [`ORPHAN_KILL_AFTER`] later)
//! and children whose pipes outlive them ([`EXIT_GRACE`] after the exit).
//!
//! Exits are learned from the keeper's reaper ([`Children::reaped`]): no
//! `wait` here. Spawning must happen on a thread that lives as long as the
//! keeper (see [`crate::spawn`]); [`Children::new`] must run inside the
//! tokio runtime that drives it. Nothing a child or an engine sends can
//! make this panic (how a broken engine's connection ends is `engine_conn`'s).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use rustix::process::{Pid, Signal, WaitStatus};
use tether_wire::ndjson::{self, Line, LineDecoder};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::unix::pipe;
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

pub use crate::engine_conn::{ATTACH_WAIT, EngineGone, OUT_QUEUE, PENDING_ATTACHES};
use crate::engine_conn::{Conn, Out, not_reading};
use crate::proto::{self, Kept, SpawnSpec, ToEngine};

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
/// From SIGTERM to SIGKILL for an orphan.
pub const ORPHAN_KILL_AFTER: Duration = Duration::from_secs(2);
pub const SWEEP: Duration = Duration::from_millis(100);

/// The keeper's children (cheap to clone: one shared table).
#[derive(Clone)]
pub struct Children {
    pub(crate) inner: Arc<Inner>,
}

/// The fields marked `pub(crate)` here and in [`Table`], [`Child`] and
/// [`State`] are also `engine_conn`'s to read and change, under the same locks.
pub(crate) struct Inner {
    pub(crate) keeper: u64,
    next_child: AtomicU64,
    pub(crate) next_conn: AtomicU64,
    pub(crate) table: Mutex<Table>,
}

#[derive(Default)]
pub(crate) struct Table {
    pub(crate) children: BTreeMap<u64, Arc<Child>>,
    /// Children not reaped yet, by pid.
    by_pid: HashMap<u32, u64>,
    pub(crate) conns: HashMap<u64, Arc<Conn>>,
    /// When the last engine went (for the restart's duration).
    pub(crate) engine_ended: Option<Instant>,
    pub(crate) restarts: u64,
    pub(crate) last_restart_ms: u64,
    /// An engine said it serves ([`proto::ToKeeper::Ready`]).
    pub(crate) ready: bool,
}

pub(crate) struct Child {
    pub(crate) id: u64,
    pub(crate) pid: u32,
    label: String,
    hold_bytes: u64,
    orphan: Duration,
    pub(crate) state: Mutex<State>,
    /// Room was freed (or the child is stopping): the stdout reader goes on.
    pub(crate) room: Notify,
    /// The child was let go: `Attach`es waiting for it try again.
    pub(crate) released: Notify,
    stdin: mpsc::Sender<(u64, Bytes)>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Unacknowledged frames, numbered consecutively.
    pub(crate) frames: VecDeque<(u64, Frame)>,
    pub(crate) held: u64,
    /// The last frame's number (0: none yet).
    pub(crate) last_frame: u64,
    paused: bool,
    pub(crate) holder: Option<Arc<Conn>>,
    pub(crate) unattached_since: Option<Instant>,
    /// The last `seq` taken for its stdin, and the last written.
    queued: u64,
    pub(crate) written: u64,
    pub(crate) open: VecDeque<Bytes>,
    pub(crate) exit: Option<(String, Instant)>,
    pub(crate) eof: bool,
    /// Its holder was told `Exited`.
    pub(crate) told_exit: bool,
    pub(crate) stopped: bool,
    term_sent: Option<Instant>,
    killed: bool,
    pub(crate) forgotten: bool,
    reader: Option<AbortHandle>,
}

pub(crate) enum Frame {
    Line(Bytes),
    TooLong { len: u64, head: Bytes, tail: Bytes },
}

impl Frame {
    pub(crate) fn size(&self) -> u64 {
        match self {
            Frame::Line(line) => line.len() as u64,
            Frame::TooLong { head, tail, .. } => (head.len() + tail.len()) as u64,
        }
    }

    pub(crate) fn to_engine(&self, child: u64, frame: u64) -> ToEngine {
        match self {
            Frame::Line(line) => ToEngine::Line { child, frame, line: line.clone() },
            Frame::TooLong { len, head, tail } => {
                ToEngine::TooLong { child, frame, len: *len, head: head.clone(), tail: tail.clone() }
            }
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

    /// Whether an engine ever said it serves ([`proto::ToKeeper::Ready`]).
    pub fn ever_ready(&self) -> bool {
        self.inner.table.lock().ready
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

    /// Starts a child held by `conn`.
    /// Starts a child held by `conn` and queues `Spawned` before anything
    /// of the child's can be (its `Stderr`); `Ok(Err)` if the queue is full.
    pub(crate) fn spawn(&self, conn: &Arc<Conn>, req: u64, spec: SpawnSpec) -> Result<Result<(), String>, String> {
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

impl Inner {
    pub(crate) fn child(&self, id: u64) -> Option<Arc<Child>> {
        self.table.lock().children.get(&id).cloned()
    }

    /// Queues a line for the child's stdin unless `seq` was taken already;
    /// then returns the last written, if `seq` was.
    pub(crate) fn write(&self, c: &Child, seq: u64, tag: Bytes, line: Bytes) -> Result<Option<u64>, String> {
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

    /// Forgets the child if nothing more can come of it.
    pub(crate) fn settle(&self, child: &Arc<Child>) {
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

/// Lines written before the engine hears of them (`Written`), at most: one
/// frame for many lines, and far below the engine's window
/// ([`crate::client::WRITE_WINDOW`]), which therefore always reopens.
pub const WRITTEN_EVERY: u64 = 64;

async fn write_stdin(child: Arc<Child>, stdin: pipe::Sender, mut lines: mpsc::Receiver<(u64, Bytes)>) {
    let mut out = BufWriter::new(stdin);
    let mut reported = 0u64;
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
        if let Some(holder) = holder.filter(|_| seq >= reported + WRITTEN_EVERY) {
            reported = seq;
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
