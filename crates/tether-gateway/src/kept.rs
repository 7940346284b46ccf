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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_keeper::client::{ChildEvent, ChildPort, Keeper};
use tether_keeper::proto::SpawnSpec;
use tether_wire::{Inbound as Message, RpcError, envelope};
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::config::CommandSpec;
use crate::link::Progress;
use crate::processes::ProcessPermit;
use crate::stdio::{self, Answer, Outgoing, Shared, StderrLog, StdioUpstream};
use crate::upstream::{CutOffCall, PeerMessage, PeerSink, Started, UPSTREAM_RESTARTED, Upstream, request_key};

static KEEPER: OnceLock<Arc<Keeper>> = OnceLock::new();

/// This engine's keeper: from now on command upstreams' children are its.
pub fn install(keeper: Arc<Keeper>) {
    let _ = KEEPER.set(keeper);
}

/// The keeper, if this engine has one.
pub(crate) fn keeper() -> Option<&'static Arc<Keeper>> {
    KEEPER.get()
}

/// How long a call cut off by a crash waits for the new engine to claim it.
pub const CLAIM_WAIT: Duration = Duration::from_secs(60);
/// Messages of one cut-off call parked until it is claimed, at most.
pub const PARKED_PER_CALL: usize = 256;

/// Bytes of a child's stdout the keeper holds unacknowledged, at most: a
/// few of its largest messages.
pub fn hold_bytes(spec: &CommandSpec) -> u64 {
    let largest = u64::try_from(spec.max_message_bytes).unwrap_or(u64::MAX);
    largest.saturating_mul(2).max(4 << 20)
}

/// Starts the command through the keeper and initializes it (as
/// [`stdio::start`] does a child of this process).
pub(crate) async fn start(
    spec: &CommandSpec,
    upstream_name: &str,
    session: &str,
    initialize_params: Value,
    init_timeout: Duration,
    permit: ProcessPermit,
    sink: Arc<dyn PeerSink>,
) -> Result<Started, RpcError> {
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
    let mut env: Vec<(String, String)> =
        ["PATH", "HOME"].into_iter().filter_map(|key| std::env::var(key).ok().map(|value| (key.to_owned(), value))).collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let spawn = SpawnSpec {
        program: program.clone(),
        args: args.to_vec(),
        env,
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
    let frames = Arc::new(Frames { state: Mutex::new(Book::default()), holds: Mutex::default(), acks });
    let shared = Arc::new(Shared::new(upstream_name, session, command, Some(frames.clone())));
    let kept = Arc::new(KeptChild {
        keeper: keeper.clone(),
        child,
        frames,
        cut_off: Mutex::new(CutOffs::from_tags(open)),
        next_seq: AtomicU64::new(written + 1),
        left: AtomicBool::new(false),
    });
    let kill = Arc::new(Notify::new());
    let (writer, write_rx) = mpsc::channel(stdio::WRITE_QUEUE);
    let (exited_tx, exited) = watch::channel(None);
    tether_server::metrics::upstream_processes(upstream_name, 1);
    tokio::spawn(send_acks(keeper.clone(), child, acked));
    tokio::spawn(write_lines(kept.clone(), write_rx));
    tokio::spawn(log_stderr(stderr, shared.clone()));
    let reader = tokio::spawn(read_frames(events, sink, shared.clone(), kept.clone()));
    tokio::spawn(supervise(reader, kept.clone(), shared.clone(), kill.clone(), exited_tx, permit));
    // Request IDs of this engine never meet an earlier engine's.
    let first_id = keeper.epoch() << 32;
    Arc::new(StdioUpstream {
        shared,
        writer,
        next_id: AtomicU64::new(first_id),
        kill,
        exited,
        request_timeout: spec.request_timeout,
        kept: Some(kept),
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

    /// The request `tag` named has ended.
    pub(crate) fn done(&self, tag: Bytes) {
        if !tag.is_empty() {
            self.keeper.done_soon(self.child, tag);
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

    pub(crate) fn cut_off_call(&self, key: &str) -> Option<CutOffCall> {
        let cut_off = self.cut_off.lock();
        let call = cut_off.calls.values().find(|c| c.tag.key == key)?;
        let progress = match (&call.tag.issued, &call.tag.client) {
            (Some(issued), Some(client)) => Some(Progress { issued: issued.clone(), client: client.clone() }),
            _ => None,
        };
        Some(CutOffCall { id: json!(call.tag.id), progress })
    }

    /// Picks up the answer of a call cut off by a crash (see the module
    /// doc); its messages go to `messages`, in order, first those parked.
    pub(crate) async fn resume(
        &self,
        request_id: &Value,
        messages: mpsc::Sender<PeerMessage>,
        wait: Duration,
        shared: &Shared,
    ) -> Result<Box<serde_json::value::RawValue>, RpcError> {
        let Some(id) = stdio::our_id(request_id) else { return Err(RpcError::internal(UPSTREAM_RESTARTED)) };
        let (tx, rx) = oneshot::channel();
        let mut tx = Some(tx);
        loop {
            let (parked, answer) = {
                let mut cut_off = self.cut_off.lock();
                let Some(call) = cut_off.calls.get_mut(&id) else {
                    return Err(RpcError::internal(UPSTREAM_RESTARTED));
                };
                if call.parked.is_empty() {
                    match call.answer.take() {
                        Some(answer) => (Vec::new(), Some(answer)),
                        None => {
                            call.claim = Some(Claim { messages: messages.clone(), answer: tx.take() });
                            (Vec::new(), None)
                        }
                    }
                } else {
                    (call.parked.drain(..).collect(), None)
                }
            };
            for (message, hold) in parked {
                let _ = messages.send(message).await;
                drop(hold);
            }
            if let Some((answer, hold)) = answer {
                self.forget_call(id);
                drop(hold);
                return answer;
            }
            if tx.is_none() {
                break;
            }
        }
        let answer = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(RpcError::internal(UPSTREAM_RESTARTED)),
            Err(_) => Err(RpcError::internal(format!(
                "upstream {} did not answer a call cut off by an engine restart within {} (its request_timeout)",
                shared.upstream,
                humantime::format_duration(wait)
            ))),
        };
        self.forget_call(id);
        answer
    }

    fn forget_call(&self, id: u64) {
        let call = self.cut_off.lock().calls.remove(&id);
        if let Some(call) = call {
            self.done(Bytes::from(call.tag.to_json().to_string()));
        }
    }

    /// This engine lets go of the child for good (see [`Upstream::leave`]).
    pub(crate) fn leave(&self) {
        self.left.store(true, Ordering::Release);
    }

    /// Takes a frame that belongs to a cut-off call (true), else leaves it
    /// to the usual dispatch (false).
    async fn route_cut_off(&self, frame: u64, line: &[u8]) -> bool {
        if self.cut_off.lock().calls.is_empty() {
            return false;
        }
        self.expire_unclaimed();
        let Ok(message) = envelope::parse_message(line) else { return false };
        let (id, delivery) = {
            let mut cut_off = self.cut_off.lock();
            match message {
                Message::Response { id, outcome } => {
                    let Some(n) = stdio::our_id(&id) else { return false };
                    let Some(call) = cut_off.calls.get_mut(&n) else { return false };
                    let answer: Answer = match outcome {
                        Ok(result) => serde_json::value::to_raw_value(&result).map_err(|e| RpcError::internal(e.to_string())),
                        Err(error) => Err(RpcError::from_object(&error)),
                    };
                    let hold = self.frames.hold(frame);
                    match call.claim.as_mut().and_then(|c| c.answer.take()) {
                        Some(tx) => {
                            let _ = tx.send(answer);
                            drop(hold);
                        }
                        None => call.answer = Some((answer, hold)),
                    }
                    return true;
                }
                Message::Notification { method, params } => {
                    let message = PeerMessage::Notification { method, params: params.map(Value::Object) };
                    let Some(id) = cut_off.owner(&message) else { return false };
                    (id, message)
                }
                Message::Request { id, method, params } => {
                    let message = PeerMessage::Request { id, method, params: params.map(Value::Object) };
                    let Some(id) = cut_off.owner(&message) else { return false };
                    (id, message)
                }
            }
        };
        let hold = self.frames.hold(frame);
        let claimed = {
            let mut cut_off = self.cut_off.lock();
            let Some(call) = cut_off.calls.get_mut(&id) else { return false };
            match &call.claim {
                Some(claim) => Some(claim.messages.clone()),
                None => {
                    if call.parked.len() >= PARKED_PER_CALL {
                        tracing::warn!(
                            child = self.child,
                            "too many messages of a cut-off call before it was claimed; dropping the oldest"
                        );
                        call.parked.pop_front();
                    }
                    call.parked.push_back((delivery.clone(), hold.clone()));
                    None
                }
            }
        };
        if let Some(messages) = claimed {
            let _ = messages.send(delivery).await;
        }
        drop(hold);
        true
    }

    /// Calls nobody claimed within [`CLAIM_WAIT`] of the attach are let go.
    fn expire_unclaimed(&self) {
        let expired: Vec<CutOffCallState> = {
            let mut cut_off = self.cut_off.lock();
            if cut_off.since.elapsed() < CLAIM_WAIT {
                return;
            }
            let ids: Vec<u64> = cut_off.calls.iter().filter(|(_, c)| c.claim.is_none()).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| cut_off.calls.remove(&id)).collect()
        };
        for call in expired {
            tracing::info!(child = self.child, "no request claimed a call cut off by the engine restart; letting it go");
            self.done(Bytes::from(call.tag.to_json().to_string()));
        }
    }
}

/// What a request's line says of it (see the module doc).
struct Tag {
    key: String,
    id: u64,
    issued: Option<Value>,
    client: Option<Value>,
}

impl Tag {
    fn to_json(&self) -> Value {
        json!({"key": self.key, "id": self.id, "issued": self.issued, "client": self.client})
    }

    fn parse(tag: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(tag).ok()?;
        Some(Self {
            key: v.get("key")?.as_str()?.to_owned(),
            id: v.get("id")?.as_u64()?,
            issued: v.get("issued").filter(|t| !t.is_null()).cloned(),
            client: v.get("client").filter(|t| !t.is_null()).cloned(),
        })
    }
}

/// The calls an earlier engine left running on the child.
struct CutOffs {
    since: Instant,
    calls: HashMap<u64, CutOffCallState>,
}

struct CutOffCallState {
    tag: Tag,
    answer: Option<(Answer, FrameHold)>,
    parked: VecDeque<(PeerMessage, FrameHold)>,
    claim: Option<Claim>,
}

struct Claim {
    messages: mpsc::Sender<PeerMessage>,
    answer: Option<oneshot::Sender<Answer>>,
}

impl CutOffs {
    fn from_tags(open: &[Bytes]) -> Self {
        let calls = open
            .iter()
            .filter_map(|t| Tag::parse(t))
            .map(|tag| (tag.id, CutOffCallState { tag, answer: None, parked: VecDeque::new(), claim: None }))
            .collect();
        Self { since: Instant::now(), calls }
    }

    /// The cut-off call a message is about: by the progress token it was
    /// issued.
    fn owner(&self, message: &PeerMessage) -> Option<u64> {
        let params = match message {
            PeerMessage::Notification { params, .. } | PeerMessage::Request { params, .. } => params.as_ref()?,
        };
        let token = params.get("progressToken")?;
        self.calls.iter().find(|(_, c)| c.tag.issued.as_ref() == Some(token)).map(|(id, _)| *id)
    }
}

/// Which of a child's stdout frames are still needed (see the module doc).
pub(crate) struct Frames {
    state: Mutex<Book>,
    /// Answers' frames held for their requests (by upstream request ID).
    holds: Mutex<HashMap<u64, FrameHold>>,
    acks: watch::Sender<u64>,
}

#[derive(Default)]
struct Book {
    /// The highest frame read.
    read: u64,
    /// Frames still needed, and by how many holders.
    needed: BTreeMap<u64, u32>,
}

impl Frames {
    fn seen(&self, frame: u64) {
        let mut book = self.state.lock();
        book.read = book.read.max(frame);
        *book.needed.entry(frame).or_default() += 1;
    }

    /// One more holder of `frame`.
    fn hold(self: &Arc<Self>, frame: u64) -> FrameHold {
        *self.state.lock().needed.entry(frame).or_default() += 1;
        FrameHold { _held: Arc::new(HoldInner { frames: self.clone(), frame }) }
    }

    fn release(&self, frame: u64) {
        let upto = {
            let mut book = self.state.lock();
            if let Some(count) = book.needed.get_mut(&frame) {
                *count -= 1;
                if *count == 0 {
                    book.needed.remove(&frame);
                }
            }
            match book.needed.keys().next() {
                Some(first) => first - 1,
                None => book.read,
            }
        };
        self.acks.send_if_modified(|acked| {
            let advanced = upto > *acked;
            if advanced {
                *acked = upto;
            }
            advanced
        });
    }

    /// The frame being dispatched holds the answer of request `id`.
    pub(crate) fn hold_answer(self: &Arc<Self>, id: u64) {
        // Only the reader dispatches, one frame at a time: the frame is the last seen.
        let frame = self.state.lock().read;
        let hold = self.hold(frame);
        self.holds.lock().insert(id, hold);
    }

    /// The hold on request `id`'s answer, for its request to let go of.
    pub(crate) fn take_hold(&self, id: u64) -> Option<FrameHold> {
        self.holds.lock().remove(&id)
    }
}

/// Keeps a frame from being acknowledged while alive.
#[derive(Clone)]
pub(crate) struct FrameHold {
    _held: Arc<HoldInner>,
}

struct HoldInner {
    frames: Arc<Frames>,
    frame: u64,
}

impl Drop for HoldInner {
    fn drop(&mut self) {
        self.frames.release(self.frame);
    }
}

/// Acknowledges frames as they stop being needed.
async fn send_acks(keeper: Arc<Keeper>, child: u64, mut acked: watch::Receiver<u64>) {
    while acked.changed().await.is_ok() {
        let upto = *acked.borrow_and_update();
        if keeper.ack(child, upto).await.is_err() {
            return;
        }
    }
}

/// Sends queued lines to the keeper, numbered.
async fn write_lines(kept: Arc<KeptChild>, mut lines: mpsc::Receiver<Outgoing>) {
    while let Some(Outgoing { line, tag }) = lines.recv().await {
        let seq = kept.next_seq.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = kept.keeper.write(kept.child, seq, tag, line).await {
            tracing::debug!(child = kept.child, error = %e, "cannot write to a kept child");
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
    mut events: mpsc::UnboundedReceiver<ChildEvent>,
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
            _ => "was lost with the keeper".to_owned(),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> (Arc<Frames>, watch::Receiver<u64>) {
        let (acks, acked) = watch::channel(0);
        (Arc::new(Frames { state: Mutex::new(Book::default()), holds: Mutex::default(), acks }), acked)
    }

    #[test]
    fn a_frame_is_acknowledged_only_once_nothing_before_it_is_still_held() {
        let (frames, acked) = frames();
        // Frame 1: a notification, delivered (stored) at once.
        frames.seen(1);
        frames.release(1);
        assert_eq!(*acked.borrow(), 1);
        // Frame 2: an answer whose final response is not stored yet.
        frames.seen(2);
        frames.hold_answer(7);
        frames.release(2);
        assert_eq!(*acked.borrow(), 1, "the answer's frame waits for its request");
        // Frames 3 and 4 are done, but 2 is not: nothing past 1 is acknowledged.
        for f in [3, 4] {
            frames.seen(f);
            frames.release(f);
        }
        assert_eq!(*acked.borrow(), 1);
        // The request's final response is stored: everything up to 4 goes.
        drop(frames.take_hold(7));
        assert_eq!(*acked.borrow(), 4);
        assert!(frames.take_hold(7).is_none(), "a hold is taken once");
    }

    #[test]
    fn a_hold_shared_by_clones_goes_with_the_last_one() {
        let (frames, acked) = frames();
        frames.seen(1);
        let hold = frames.hold(1);
        let parked = hold.clone();
        frames.release(1);
        drop(hold);
        assert_eq!(*acked.borrow(), 0, "a parked copy still holds it");
        drop(parked);
        assert_eq!(*acked.borrow(), 1);
    }

    #[test]
    fn a_tag_names_its_request_and_reads_back() {
        let tag = Tag { key: "s/r1".into(), id: 4_294_967_301, issued: Some(json!("tether-ab")), client: Some(json!(7)) };
        let read = Tag::parse(tag.to_json().to_string().as_bytes()).expect("a tag reads back");
        assert_eq!(
            (read.key.as_str(), read.id, read.issued, read.client),
            ("s/r1", 4_294_967_301, Some(json!("tether-ab")), Some(json!(7)))
        );
        assert!(Tag::parse(b"not json").is_none());
        let cut = CutOffs::from_tags(&[Bytes::from(tag.to_json().to_string()), Bytes::from_static(b"{}")]);
        assert_eq!(cut.calls.len(), 1, "an unreadable tag is skipped");
        let progress = PeerMessage::Notification {
            method: "notifications/progress".into(),
            params: Some(json!({"progressToken": "tether-ab", "progress": 1})),
        };
        assert_eq!(cut.owner(&progress), Some(4_294_967_301));
        let other = PeerMessage::Notification { method: "notifications/message".into(), params: Some(json!({"data": 1})) };
        assert_eq!(cut.owner(&other), None);
    }
}
