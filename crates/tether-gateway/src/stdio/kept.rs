//! A command upstream's child held by the keeper (`tether serve`'s
//! supervisor, `tether_keeper`), when this process is an engine a keeper
//! started: the child outlives the engine, and so do the calls it runs.
//!
//! The connection is a [`StdioUpstream`] like any child's; only its bytes
//! go another way: lines for its stdin go to the keeper as numbered frames
//! (written once, whatever an engine resends), its stdout comes from the
//! keeper as numbered frames, each kept by the keeper until this engine
//! acknowledges it ([`Frames`]). A frame is acknowledged once what it
//! carried is stored: a notification once delivered (the engine stores it
//! before it returns), an answer once the client's final response is stored
//! ([`tether_server::RequestCtx::after_final_stored`]). The line of a
//! client's request carries a tag naming the request (its session and
//! stream, the upstream ID, the progress tokens) until its final response
//! is stored.
//!
//! After an engine crash the next engine attaches the child again (the
//! session's stored `carryOn` names the keeper and the child): the keeper
//! sends every frame not acknowledged and the tags still open. A tagged
//! request is a call cut off by the crash: its answer and its progress are
//! parked here (frames unacknowledged, so a second crash loses nothing)
//! until the engine's recovery claims it ([`KeptChild::resume`]), at most
//! [`CLAIM_WAIT`]; no new `initialize`, no second run.
//!
//! Bounds: the keeper holds at most [`hold_bytes`] of a child's stdout
//! unacknowledged (then the child blocks on write); at most
//! [`PARKED_PER_CALL`] messages wait per cut-off call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_keeper::client::{ChildEvent, ChildPort, Keeper};
use tether_keeper::proto::SpawnSpec;
use tether_wire::RpcError;
use tokio::sync::{Notify, mpsc, watch};

use crate::config::CommandSpec;
use crate::processes::ProcessPermit;
use crate::progress::Progress;
use crate::stdio::{self, Launch, Shared, StderrLog, Stdin, StdioUpstream};
use crate::upstream::{PeerSink, Started, Upstream, request_key};

mod cut_off;
mod frames;

pub use cut_off::{CLAIM_WAIT, PARKED_PER_CALL};
use cut_off::{CutOffs, Tag};
pub(crate) use frames::{FrameHold, Frames};

static KEEPER: OnceLock<Arc<Keeper>> = OnceLock::new();

/// This engine's keeper: from now on command upstreams' children are its.
pub fn install(keeper: Arc<Keeper>) {
    let _ = KEEPER.set(keeper);
}

/// The keeper, if this engine has one.
pub(crate) fn keeper() -> Option<&'static Arc<Keeper>> {
    KEEPER.get()
}

/// Bytes of a child's stdout the keeper holds unacknowledged, at most: a
/// few of its largest messages.
pub fn hold_bytes(spec: &CommandSpec) -> u64 {
    let largest = u64::try_from(spec.max_message_bytes).unwrap_or(u64::MAX);
    largest.saturating_mul(2).max(4 << 20)
}

/// Starts the command through the keeper and initializes it (as
/// [`stdio::start`] does a child of this process).
pub(crate) async fn start(launch: Launch<'_>) -> Result<Started, RpcError> {
    let Launch { spec, upstream: upstream_name, session, initialize_params, init_timeout, permit, sink } = launch;
    let Some(keeper) = keeper() else { return Err(RpcError::internal("no keeper")) };
    let label = format!("{upstream_name}/{session}");
    let permit = match adopt(keeper, spec, upstream_name, session, &label, permit, &sink).await {
        Ok(started) => return Ok(started),
        Err(permit) => permit,
    };
    let command = spec.display();
    let Some((program, args)) = spec.command.split_first() else {
        return Err(RpcError::internal(format!("upstream {upstream_name} has an empty command")));
    };
    let spawn = SpawnSpec {
        program: program.clone(),
        args: args.to_vec(),
        env: spec.environment(),
        cwd: spec.cwd.as_ref().map(|cwd| cwd.display().to_string()),
        max_line: u64::try_from(spec.max_message_bytes).unwrap_or(u64::MAX),
        hold_bytes: hold_bytes(spec),
        orphan_ms: u64::try_from(spec.idle_timeout.as_millis()).unwrap_or(u64::MAX),
        label,
    };
    let port = keeper.spawn(spawn).await.map_err(|e| {
        let place = spec.cwd.as_ref().map(|cwd| format!(" in {}", cwd.display())).unwrap_or_default();
        RpcError::internal(format!("cannot start upstream {upstream_name} (`{command}`{place}): {e}"))
    })?;
    let child = port.child;
    let upstream = connect(keeper, spec, upstream_name, session, command, port, 0, &[], Some(permit), sink);
    let (upstream, initialize_result) = stdio::initialize(upstream, initialize_params, init_timeout).await?;
    let carry_on = json!({"keeper": format!("{:016x}", keeper.id()), "child": child});
    Ok(Started { upstream, initialize_result, carry_on: Some(carry_on), resumed: false })
}

/// Children the keeper had kept when this engine started that a start took
/// over already (each is taken once).
static ADOPTED: OnceLock<Mutex<std::collections::HashSet<u64>>> = OnceLock::new();

/// A child an earlier engine started for the same purpose (`label`: a
/// session's, or a principal's pooled connection), kept by the keeper and
/// held by no engine: taken over as it is (its state, no new
/// `initialize`) instead of starting another.
async fn adopt(
    keeper: &Arc<Keeper>,
    spec: &CommandSpec,
    upstream_name: &str,
    session: &str,
    label: &str,
    permit: ProcessPermit,
    sink: &Arc<dyn PeerSink>,
) -> Result<Started, ProcessPermit> {
    let adopted = ADOPTED.get_or_init(Mutex::default);
    let child = {
        let mut taken = adopted.lock();
        let found = keeper.kept_at_start().iter().find(|k| k.label == label && !k.attached && !taken.contains(&k.child));
        let Some(child) = found.map(|k| k.child) else { return Err(permit) };
        taken.insert(child);
        child
    };
    let attached = match keeper.attach(child, 0).await {
        Ok(attached) => attached,
        Err(reason) => {
            tracing::info!(upstream = %upstream_name, %session, child, %reason, "could not take over a kept child; starting a new one");
            return Err(permit);
        }
    };
    let (port, written, open) = (attached.port, attached.written, attached.open);
    let pid = port.pid;
    let upstream =
        connect(keeper, spec, upstream_name, session, spec.display(), port, written, &open, Some(permit), sink.clone());
    tracing::info!(upstream = %upstream_name, %session, pid, "took over the child the keeper kept (no new initialize)");
    let carry_on = json!({"keeper": format!("{:016x}", keeper.id()), "child": child});
    let initialize_result = serde_json::value::to_raw_value(&json!({})).unwrap_or_default();
    Ok(Started { upstream, initialize_result, carry_on: Some(carry_on), resumed: true })
}

/// The child the keeper kept for `session` (`carry_on` as [`start`] gave
/// it), attached to this engine; `None` if this keeper does not have it.
pub(crate) async fn attach(
    spec: &CommandSpec,
    upstream_name: &str,
    session: &str,
    carry_on: &Value,
    sink: Arc<dyn PeerSink>,
) -> Option<Arc<dyn Upstream>> {
    let keeper = keeper()?;
    if carry_on.get("keeper").and_then(Value::as_str) != Some(format!("{:016x}", keeper.id()).as_str()) {
        return None;
    }
    let child = carry_on.get("child").and_then(Value::as_u64)?;
    match keeper.attach(child, 0).await {
        Ok(attached) => {
            let pid = attached.port.pid;
            let cut_off = attached.open.len();
            let upstream = connect(
                keeper,
                spec,
                upstream_name,
                session,
                spec.display(),
                attached.port,
                attached.written,
                &attached.open,
                None,
                sink,
            );
            tracing::info!(upstream = %upstream_name, %session, pid, cut_off, "took over the child the keeper kept (no new initialize)");
            Some(upstream)
        }
        Err(reason) => {
            tracing::info!(upstream = %upstream_name, %session, child, %reason, "the keeper does not have the session's child; starting a new one");
            None
        }
    }
}

/// A connection over `port`: its tasks and its upstream.
#[allow(clippy::too_many_arguments)]
fn connect(
    keeper: &Arc<Keeper>,
    spec: &CommandSpec,
    upstream_name: &str,
    session: &str,
    command: String,
    port: ChildPort,
    written: u64,
    open: &[Bytes],
    permit: Option<ProcessPermit>,
    sink: Arc<dyn PeerSink>,
) -> Arc<StdioUpstream> {
    let ChildPort { child, events, stderr, .. } = port;
    let (acks, acked) = watch::channel(0);
    let frames = Arc::new(Frames::new(acks));
    let shared = Arc::new(Shared::new(upstream_name, session, command, Some(frames.clone())));
    let kept = Arc::new(KeptChild {
        keeper: keeper.clone(),
        child,
        frames,
        cut_off: Mutex::new(CutOffs::from_tags(open)),
        next_seq: AtomicU64::new(written + 1),
        left: AtomicBool::new(false),
        done: Mutex::default(),
        flush: Notify::new(),
        closed: AtomicBool::new(false),
    });
    let kill = Arc::new(Notify::new());
    let (exited_tx, exited) = watch::channel(None);
    tether_server::metrics::upstream_processes(upstream_name, 1);
    keeper.answer_inline(child, answer_inline(Arc::downgrade(&kept), shared.clone()));
    tokio::spawn(send_acks(kept.clone(), acked));
    tokio::spawn(log_stderr(stderr, shared.clone()));
    let reader = tokio::spawn(read_frames(events, sink, shared.clone(), kept.clone()));
    tokio::spawn(supervise(reader, kept.clone(), shared.clone(), kill.clone(), exited_tx, permit));
    // Request IDs of this engine never meet an earlier engine's.
    let first_id = keeper.epoch() << 32;
    Arc::new(StdioUpstream {
        shared,
        stdin: Stdin::Kept(kept),
        next_id: AtomicU64::new(first_id),
        kill,
        exited,
        request_timeout: spec.request_timeout,
    })
}

/// The keeper's reader hands a frame here first, while nothing of the
/// child's waits in its queue: an answer to a request of ours goes to it at
/// once, without waking [`read_frames`] (a quick call crosses the request's
/// task and the keeper socket's reader only). Anything else, and anything
/// while calls cut off by a crash wait to be claimed, takes the queue.
fn answer_inline(kept: std::sync::Weak<KeptChild>, shared: Arc<Shared>) -> tether_keeper::client::Inline {
    Arc::new(move |frame, line| {
        let Some(kept) = kept.upgrade() else { return false };
        if kept.has_cut_offs() {
            return false;
        }
        let answered = shared.try_answer(line, || kept.frames.seen(frame));
        if answered {
            kept.frames.release(frame);
        }
        answered
    })
}

/// The keeper's side of one connection.
pub(crate) struct KeptChild {
    keeper: Arc<Keeper>,
    child: u64,
    frames: Arc<Frames>,
    cut_off: Mutex<CutOffs>,
    /// The next line's number for the child's stdin.
    next_seq: AtomicU64,
    /// This engine let go of it for good (it stops or hands over): the
    /// child stays with the keeper.
    left: AtomicBool,
    /// Tags of requests that ended, for the next `Done`.
    done: Mutex<Vec<Bytes>>,
    /// Wakes [`send_acks`] for them, or to end.
    flush: Notify,
    /// The connection is over: [`send_acks`] ends.
    closed: AtomicBool,
}

impl KeptChild {
    /// The tag of request `id` sent for the client request `ctx`.
    pub(crate) fn tag_for(&self, ctx: &tether_server::RequestCtx, id: u64, progress: Option<&Progress>) -> Bytes {
        let (Some(session), Some(stream)) = (ctx.session(), ctx.stream_name()) else { return Bytes::new() };
        let tag = Tag {
            key: request_key(session.session_id(), stream),
            id,
            issued: progress.map(|p| p.issued.clone()),
            client: progress.map(|p| p.client.clone()),
        };
        Bytes::from(tag.to_json().to_string())
    }

    /// The request `tag` named has ended: the keeper hears it with the
    /// next acknowledgement ([`send_acks`]).
    pub(crate) fn done(&self, tag: Bytes) {
        if tag.is_empty() {
            return;
        }
        let mut done = self.done.lock();
        done.push(tag);
        let wake = done.len() == 1 || done.len() >= DONE_AT_ONCE;
        drop(done);
        if wake {
            self.flush.notify_one();
        }
    }

    /// Lets go of the answer's frame and the tag once the client's final
    /// response is stored (at once if nothing stores it).
    pub(crate) fn settle_after_final(self: &Arc<Self>, ctx: &tether_server::RequestCtx, hold: Option<FrameHold>, tag: Bytes) {
        let kept = self.clone();
        let settle = move || {
            drop(hold);
            kept.done(tag);
        };
        let _ = ctx.after_final_stored(settle);
    }

    /// Sends a line for the child's stdin, numbered as it goes out.
    pub(crate) async fn write(&self, tag: Bytes, line: Bytes) -> Result<(), String> {
        self.keeper.write(self.child, &self.next_seq, tag, line).await.map(drop)
    }

    /// [`Self::write`] if there is room now.
    pub(crate) fn try_write(&self, line: Bytes) -> Result<(), String> {
        self.keeper.try_write(self.child, &self.next_seq, Bytes::new(), line).map(drop)
    }

    /// This engine lets go of the child for good (see [`Upstream::leave`]).
    pub(crate) fn leave(&self) {
        self.left.store(true, Ordering::Release);
    }
}

/// How long acknowledgements and ended requests' tags gather before they
/// go to the keeper in one frame each: many calls' worth, not one a call.
/// (An acknowledgement frees the keeper's memory only; a tag's end only
/// spares it a look after a crash.)
const GATHER: Duration = Duration::from_millis(10);
/// Ended requests' tags that go at once, without gathering longer.
const DONE_AT_ONCE: usize = 1024;

/// Acknowledges frames as they stop being needed and tells the keeper the
/// requests that ended, gathered for [`GATHER`].
async fn send_acks(kept: Arc<KeptChild>, mut acked: watch::Receiver<u64>) {
    let mut sent = 0;
    loop {
        tokio::select! {
            changed = acked.changed() => if changed.is_err() { return },
            () = kept.flush.notified() => {}
        }
        if kept.closed.load(Ordering::Acquire) {
            return;
        }
        if kept.done.lock().len() < DONE_AT_ONCE {
            tokio::time::sleep(GATHER).await;
        }
        let upto = *acked.borrow_and_update();
        if upto > sent {
            sent = upto;
            if kept.keeper.ack(kept.child, upto).await.is_err() {
                return;
            }
        }
        let tags = std::mem::take(&mut *kept.done.lock());
        if !tags.is_empty() && kept.keeper.done(kept.child, tags).await.is_err() {
            return;
        }
    }
}

async fn log_stderr(mut stderr: mpsc::Receiver<Bytes>, shared: Arc<Shared>) {
    let mut log = StderrLog::new();
    while let Some(line) = stderr.recv().await {
        log.bytes(&shared, &line);
    }
}

/// Dispatches the child's frames; ends with how the child ended (`None`:
/// the keeper is gone).
async fn read_frames(
    mut events: tether_keeper::client::ChildEvents,
    sink: Arc<dyn PeerSink>,
    shared: Arc<Shared>,
    kept: Arc<KeptChild>,
) -> Option<String> {
    while let Some(event) = events.recv().await {
        match event {
            ChildEvent::Line { frame, line } => {
                kept.frames.seen(frame);
                if !kept.route_cut_off(frame, &line).await {
                    shared.dispatch(&line, sink.as_ref()).await;
                }
                kept.frames.release(frame);
            }
            ChildEvent::TooLong { frame, len, head, tail } => {
                kept.frames.seen(frame);
                let why = format!(
                    "a message of {len} bytes on stdout, over its max_message_bytes; raise max_message_bytes in [upstreams.{}] if its messages are this large",
                    shared.upstream
                );
                shared.unreadable(&head, &tail, &why);
                kept.frames.release(frame);
            }
            ChildEvent::Exited { status } => return Some(status),
            ChildEvent::KeeperGone => return None,
        }
    }
    None
}

/// Ends the connection when the child exits, or stops (or, once this
/// engine left it, releases) the child when the upstream is dropped or closed.
async fn supervise(
    mut reader: tokio::task::JoinHandle<Option<String>>,
    kept: Arc<KeptChild>,
    shared: Arc<Shared>,
    kill: Arc<Notify>,
    exited: watch::Sender<Option<String>>,
    permit: Option<ProcessPermit>,
) {
    let description = tokio::select! {
        ended = &mut reader => match ended {
            Ok(Some(status)) => status,
            // The keeper died: this engine is being killed with it
            // (`PR_SET_PDEATHSIG`). Its calls must not end here with an
            // error that could be stored first: nothing more happens.
            _ => return std::future::pending().await,
        },
        () = kill.notified() => {
            if kept.left.load(Ordering::Acquire) {
                let _ = kept.keeper.release(kept.child).await;
                reader.abort();
                "was left to the keeper for the next engine".to_owned()
            } else {
                let _ = kept.keeper.stop(kept.child).await;
                match tokio::time::timeout(stdio::CLOSE_WAIT, &mut reader).await {
                    Ok(Ok(Some(status))) => format!("was stopped ({status})"),
                    _ => "was stopped".to_owned(),
                }
            }
        }
    };
    stdio::gone(&shared, permit, &exited, description);
    kept.closed.store(true, Ordering::Release);
    kept.flush.notify_one();
}
