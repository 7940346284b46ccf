//! A command upstream: one child process per tether session, speaking MCP's
//! stdio transport (newline-delimited JSON-RPC on its stdin and stdout).
//!
//! [`start`] spawns the command (no shell; only the configured environment
//! plus `PATH` and `HOME`; in a process group of its own, so stopping it
//! also stops what it started, such as `npx`'s `node`), sends `initialize`
//! and returns the connection as an [`Upstream`]. Four tasks serve it:
//!
//! - the writer owns the child's stdin and writes queued lines (a bounded
//!   queue, so a child that stops reading back-pressures its callers);
//! - the reader reads stdout with a bound per line (`max_message_bytes`),
//!   hands answers to the request waiting for them (by the connection's own
//!   ids, a counter) and everything else to the caller's [`PeerSink`],
//!   reading on only once it was delivered (so what the child wrote before
//!   an answer reaches the client before the answer). A line
//!   too long or unreadable that still names a request waiting (its `id`,
//!   read from what can be read; or, for an answer without a readable `id`,
//!   the only request waiting) ends that request with a `-32603` naming the
//!   upstream and the reason: no call waits forever on an answer that came.
//!   Anything else unreadable, and answers nobody waits for, are counted
//!   and logged (a bounded number per minute);
//! - the stderr reader logs each line (truncated, at most
//!   [`STDERR_LINES_PER_WINDOW`] per 10 s, then a summary of what was left
//!   out), tagged with the upstream and the session, and keeps the last one
//!   for error messages;
//! - the supervisor owns the child: it waits for its exit (or kills it when
//!   asked: `close`, the upstream dropped, stdout closed), lets the readers
//!   finish what the child wrote before it exited (bounded), then ends every
//!   request in flight with [`UPSTREAM_RESTARTED`].
//!
//! A request (but `initialize`, bounded by `upstream_init_timeout`) the
//! child has not answered within the upstream's `request_timeout` ends
//! with a `-32603` naming the upstream, the time and the key to raise; its
//! waiting entry goes and the child gets `notifications/cancelled` for it
//! (as when the caller stops waiting). The session's child is then idle,
//! so the idle sweep or a request that needs room may stop it. An answer
//! the child sends later is dropped (logged at debug): ids are never
//! reused, so it cannot reach another request.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tether_wire::ndjson::{self, Line, LineDecoder};
use tether_wire::{Inbound as Message, RpcError, envelope};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::burst::{Admit, Burst};
use crate::config::CommandSpec;
use crate::connector::{Capacity, Connector, StartRequest};
use crate::processes::{ProcessPermit, Processes};
use crate::upstream::{PeerMessage, PeerSink, Started, UPSTREAM_RESTARTED, Upstream};

/// Lines queued for the child's stdin.
pub(crate) const WRITE_QUEUE: usize = 256;
/// Lines written before one flush, at most.
const WRITE_BATCH: usize = 64;
/// Requests waiting for one child's answer, at most (the engine bounds
/// requests per session far lower, and a pooled child serves one request
/// at a time; this only keeps a broken caller bounded).
const MAX_PENDING: usize = 1024;
/// Recently given-up request ids remembered, so the child's late answer to
/// one is expected rather than warned about.
const RECENTLY_GIVEN_UP: usize = 64;
/// Bytes of one stderr line logged (and read) at most.
const STDERR_LINE_MAX: usize = 2048;
/// Stderr lines logged per [`LOG_WINDOW`] at most.
const STDERR_LINES_PER_WINDOW: u32 = 100;
/// Warnings about unreadable stdout lines per [`UNREADABLE_WINDOW`] at most.
const UNREADABLE_PER_WINDOW: u32 = 5;
const LOG_WINDOW: Duration = Duration::from_secs(10);
const UNREADABLE_WINDOW: Duration = Duration::from_secs(60);
/// Characters of the last stderr line quoted in error messages.
const LAST_STDERR_MAX: usize = 300;
/// How long the readers may go on after the child exited (what it wrote
/// just before exiting is still in the pipes; a grandchild may hold them
/// open forever).
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How long `close` (and a failed start) waits for the child to be gone.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A command upstream's transport: a child per connection, under the
/// upstream's `max_processes`.
pub(crate) struct StdioConnector {
    spec: CommandSpec,
    name: String,
    init_timeout: Duration,
    processes: Arc<Processes>,
}

impl StdioConnector {
    pub(crate) fn new(spec: CommandSpec, name: &str, init_timeout: Duration) -> Self {
        let processes = Processes::new(name, spec.max_processes, spec.max_processes_per_principal, spec.process_queue_timeout);
        Self { spec, name: name.to_owned(), init_timeout, processes }
    }
}

#[async_trait]
impl Connector for StdioConnector {
    fn capacity(&self) -> Capacity {
        Capacity {
            processes: Some(self.processes.clone()),
            idle_timeout: Some(self.spec.idle_timeout),
            pool_max: self.spec.max_processes,
            pool_idle: self.spec.idle_timeout.min(crate::sessionless::DEFAULT_POOL_IDLE),
        }
    }

    async fn start(&self, request: StartRequest<'_>) -> Result<Started, RpcError> {
        // The gateway takes the place (it knows whose, and what to stop for it).
        let Some(permit) = request.permit else {
            return Err(RpcError::internal(format!(
                "upstream {}: a child starts only with a place under max_processes",
                self.name
            )));
        };
        if crate::kept::keeper().is_some() {
            let (spec, name) = (&self.spec, &self.name);
            return crate::kept::start(spec, name, request.session, request.params, self.init_timeout, permit, request.sink)
                .await;
        }
        start(&self.spec, &self.name, request.session, request.params, self.init_timeout, permit, request.sink).await
    }

    /// A child the keeper kept for the session (after an engine restart).
    async fn attach(
        &self,
        session: &str,
        carry_on: &Value,
        _authorization: Option<String>,
        sink: Arc<dyn PeerSink>,
    ) -> Option<Arc<dyn Upstream>> {
        crate::kept::attach(&self.spec, &self.name, session, carry_on, sink).await
    }
}

/// Starts the command, sends `initialize` with `initialize_params` as given
/// and waits at most `init_timeout` for its answer. Does not send
/// `notifications/initialized`: the gateway forwards the client's (or sends
/// it when it replays a stored `initialize`). The child holds `permit` (its
/// place under `max_processes`) until it has been reaped; its own messages
/// go to `sink`.
pub async fn start(
    spec: &CommandSpec,
    upstream_name: &str,
    session: &str,
    initialize_params: Value,
    init_timeout: Duration,
    permit: ProcessPermit,
    sink: Arc<dyn PeerSink>,
) -> Result<Started, RpcError> {
    let command = spec.display();
    let Some((program, args)) = spec.command.split_first() else {
        return Err(RpcError::internal(format!("upstream {upstream_name} has an empty command")));
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(spec.environment());
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).process_group(0);
    let mut child = cmd.spawn().map_err(|e| {
        let place = spec.cwd.as_ref().map(|cwd| format!(" in {}", cwd.display())).unwrap_or_default();
        RpcError::internal(format!("cannot start upstream {upstream_name} (`{command}`{place}): {e}"))
    })?;
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take()) else {
        // Not reachable with piped stdio; the child is killed on drop.
        return Err(RpcError::internal(format!("upstream {upstream_name} (`{command}`): its stdio pipes are missing")));
    };

    let shared = Arc::new(Shared::new(upstream_name, session, command, None));
    let kill = Arc::new(Notify::new());
    let (writer, write_rx) = mpsc::channel(WRITE_QUEUE);
    let (exited_tx, exited) = watch::channel(None);
    let tasks = Tasks {
        writer: tokio::spawn(write_stdin(stdin, write_rx, shared.clone())),
        reader: tokio::spawn(read_stdout(stdout, spec.max_message_bytes, sink, shared.clone())),
        stderr: tokio::spawn(read_stderr(stderr, shared.clone())),
    };
    tether_server::metrics::upstream_processes(upstream_name, 1);
    tokio::spawn(supervise(child, tasks, shared.clone(), kill.clone(), exited_tx, permit));
    let request_timeout = spec.request_timeout;
    let upstream =
        Arc::new(StdioUpstream { shared, writer, next_id: AtomicU64::new(0), kill, exited, request_timeout, kept: None });
    let (upstream, initialize_result) = initialize(upstream, initialize_params, init_timeout).await?;
    Ok(Started { upstream, initialize_result, carry_on: None, resumed: false })
}

/// Sends `initialize` on a started child and waits at most `init_timeout`
/// for its answer; a child that does not answer is stopped.
pub(crate) async fn initialize(
    upstream: Arc<StdioUpstream>,
    initialize_params: Value,
    init_timeout: Duration,
) -> Result<(Arc<StdioUpstream>, Box<RawValue>), RpcError> {
    let upstream_name = upstream.shared.upstream.clone();
    let who = format!("upstream {upstream_name} (`{}`)", upstream.shared.command);
    match tokio::time::timeout(init_timeout, upstream.request("initialize", Some(initialize_params))).await {
        Ok(Ok(initialize_result)) => Ok((upstream, initialize_result)),
        Ok(Err(e)) if !upstream.is_alive() => {
            let exit = upstream.wait_exit(CLOSE_WAIT).await;
            // Ours (the connection ended) or the child's own refusal, which it exited after.
            let ours = e.message == UPSTREAM_RESTARTED || e.message.contains(" is not running");
            let refusal = if ours { String::new() } else { format!(" after refusing it ({})", e.message) };
            Err(RpcError::internal(format!("{who} {exit} during initialize{refusal}{}", upstream.shared.stderr_hint())))
        }
        Ok(Err(refused)) => {
            upstream.close(true).await;
            Err(RpcError { message: format!("{who} refused initialize: {}", refused.message), ..refused })
        }
        Err(_) => {
            upstream.close(true).await;
            Err(RpcError::internal(format!(
                "{who} did not answer initialize within {}{}",
                humantime::format_duration(init_timeout),
                upstream.shared.stderr_hint()
            )))
        }
    }
}

/// A running child, as an [`Upstream`]. Dropping it stops the child.
pub struct StdioUpstream {
    pub(crate) shared: Arc<Shared>,
    pub(crate) writer: mpsc::Sender<Outgoing>,
    pub(crate) next_id: AtomicU64,
    pub(crate) kill: Arc<Notify>,
    /// How the child ended, once it has (`"exited (exit status: 3)"`).
    pub(crate) exited: watch::Receiver<Option<String>>,
    /// How long a request (but `initialize`) may wait for its answer.
    pub(crate) request_timeout: Duration,
    /// The keeper's part, for a child the keeper holds.
    pub(crate) kept: Option<Arc<crate::kept::KeptChild>>,
}

/// A line for the child's stdin, and what it is for (a kept child's
/// requests name their client request: see [`crate::kept`]; else empty).
pub(crate) struct Outgoing {
    pub line: Bytes,
    pub tag: Bytes,
}

impl From<Bytes> for Outgoing {
    fn from(line: Bytes) -> Self {
        Self { line, tag: Bytes::new() }
    }
}

/// What the tasks and the upstream share (never the upstream itself: its
/// drop is what stops the child).
pub(crate) struct Shared {
    pub(crate) upstream: String,
    pub(crate) session: SessionTag,
    /// The command as typed, for messages.
    pub(crate) command: String,
    pub(crate) alive: AtomicBool,
    pending: Mutex<Pending>,
    last_stderr: Mutex<Option<String>>,
    /// Warnings about unreadable lines (bounded per window).
    unreadable: Mutex<Burst>,
    /// A kept child's frames: an answer's frame is held until the client's
    /// final response is stored.
    pub(crate) frames: Option<Arc<crate::kept::Frames>>,
}

/// The tether session a child serves, as its log lines name it: the one it
/// started for, renamed if that turns out to be another (a client that
/// resumed an existing session in its `initialize`).
pub(crate) struct SessionTag(pub(crate) parking_lot::RwLock<String>);

impl std::fmt::Display for SessionTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.read())
    }
}

pub(crate) type Answer = Result<Box<RawValue>, RpcError>;

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    given_up: VecDeque<u64>,
    /// The connection is gone: nothing new waits.
    ended: bool,
}

struct Tasks {
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
    stderr: JoinHandle<()>,
}

impl Shared {
    /// The state of a child's connection, for `upstream` (named `command`)
    /// serving `session`; `frames` for a kept child.
    pub(crate) fn new(upstream: &str, session: &str, command: String, frames: Option<Arc<crate::kept::Frames>>) -> Self {
        Self {
            upstream: upstream.to_owned(),
            session: SessionTag(parking_lot::RwLock::new(session.to_owned())),
            command,
            alive: AtomicBool::new(true),
            pending: Mutex::new(Pending::default()),
            last_stderr: Mutex::new(None),
            unreadable: Mutex::new(Burst::new(UNREADABLE_PER_WINDOW, UNREADABLE_WINDOW)),
            frames,
        }
    }

    fn register(&self, id: u64, tx: oneshot::Sender<Answer>) -> Result<(), RpcError> {
        let mut pending = self.pending.lock();
        if pending.ended {
            return Err(self.gone());
        }
        if pending.waiting.len() >= MAX_PENDING {
            return Err(RpcError::internal(format!(
                "upstream {} has {MAX_PENDING} requests in flight already; try again when some have finished",
                self.upstream
            )));
        }
        pending.waiting.insert(id, tx);
        Ok(())
    }

    /// Removes a request nobody waits for any more; true if it was still waiting.
    fn give_up(&self, id: u64) -> bool {
        let mut pending = self.pending.lock();
        let was_waiting = pending.waiting.remove(&id).is_some();
        if was_waiting {
            if pending.given_up.len() >= RECENTLY_GIVEN_UP {
                pending.given_up.pop_front();
            }
            pending.given_up.push_back(id);
        }
        was_waiting
    }

    fn answered(&self, id: &Value, answer: Answer) {
        let n = our_id(id);
        let (waiter, given_up) = {
            let mut pending = self.pending.lock();
            let waiter = n.and_then(|n| pending.waiting.remove(&n));
            (waiter, n.is_some_and(|n| pending.given_up.contains(&n)))
        };
        match waiter {
            // The caller may have just gone; its answer has no one to go to.
            Some(tx) => {
                if let (Some(frames), Some(n)) = (&self.frames, n) {
                    frames.hold_answer(n);
                }
                drop(tx.send(answer));
            }
            // A call this engine left to the next one: its answer's frame
            // stays unacknowledged, so the keeper gives it to that engine.
            None if n.zip(self.frames.as_ref()).is_some_and(|(n, frames)| frames.is_left(n)) => {
                if let (Some(frames), Some(n)) = (&self.frames, n) {
                    frames.hold_answer(n);
                }
            }
            None if given_up => {
                tracing::debug!(upstream = %self.upstream, session = %self.session, "late answer to cancelled request {id}")
            }
            None => self.skipped(format_args!("an answer to id {id}, which no request of ours is waiting for")),
        }
    }

    /// A line that cannot be read as a message (`why`), of which `head` and
    /// `tail` are the start and the end. If it names a request waiting, or
    /// is an answer while only one request waits, that request ends with an
    /// error saying so; otherwise it is counted and skipped.
    pub(crate) fn unreadable(&self, head: &[u8], tail: &[u8], why: &str) {
        let salvaged = ndjson::salvage_id(head, tail);
        let waiter = {
            let mut pending = self.pending.lock();
            let id = match salvaged.id.as_ref().and_then(our_id) {
                Some(id) => Some(id),
                None if salvaged.is_answer && !salvaged.has_method && pending.waiting.len() == 1 => {
                    pending.waiting.keys().next().copied()
                }
                None => None,
            };
            id.and_then(|id| pending.waiting.remove(&id).map(|tx| (id, tx)))
        };
        match waiter {
            Some((id, tx)) => {
                tracing::warn!(upstream = %self.upstream, session = %self.session, "ending request {id}: the upstream answered it with {why}");
                let _ = tx.send(Err(RpcError::internal(format!("upstream {} answered with {why}", self.upstream))));
            }
            None => self.skipped(format_args!("{why}: {}", preview(head, 120))),
        }
    }

    /// Counts and (boundedly) logs a line that reached no request.
    fn skipped(&self, what: std::fmt::Arguments<'_>) {
        tether_server::metrics::upstream_dropped(&self.upstream, tether_server::metrics::Dropped::Unreadable);
        if let Admit::Log { left_out } = self.unreadable.lock().admit() {
            let also =
                if left_out > 0 { format!(" ({left_out} more such lines were skipped without a word)") } else { String::new() };
            tracing::warn!(upstream = %self.upstream, session = %self.session, "skipping {what}{also}");
        }
    }

    /// The connection is gone: every request in flight ends, nothing new starts.
    pub(crate) fn end(&self) {
        self.alive.store(false, Ordering::Release);
        let waiting = {
            let mut pending = self.pending.lock();
            pending.ended = true;
            std::mem::take(&mut pending.waiting)
        };
        for (_, tx) in waiting {
            let _ = tx.send(Err(RpcError::internal(UPSTREAM_RESTARTED)));
        }
    }

    pub(crate) fn gone(&self) -> RpcError {
        RpcError::internal(format!(
            "upstream {} (`{}`) is not running{}; a new request starts it again",
            self.upstream,
            self.command,
            self.stderr_hint()
        ))
    }

    /// "; its last stderr line: …" for error messages.
    pub(crate) fn stderr_hint(&self) -> String {
        match self.last_stderr.lock().as_deref() {
            Some(line) => format!("; its last stderr line: {line}"),
            None => "; it wrote nothing on stderr".to_owned(),
        }
    }

    /// One line the child wrote on stdout. A message of the child's own is
    /// delivered before the next line is read (a slow delivery
    /// back-pressures the child: it blocks on a full stdout pipe).
    pub(crate) async fn dispatch(&self, line: &[u8], sink: &dyn PeerSink) {
        // The common case, an answer to one of our requests, is read once
        // and its result kept as the child wrote it (no field reordered).
        if let Ok(response) = serde_json::from_slice::<ResponseLine<'_>>(line)
            && response.jsonrpc == "2.0"
            && response.method.is_none()
            && response.error.is_none()
        {
            self.answered(&json!(response.id), Ok(response.result.to_owned()));
            return;
        }
        match envelope::parse_message(line) {
            Ok(Message::Response { id, outcome: Ok(result) }) => {
                let raw = serde_json::value::to_raw_value(&result)
                    .map_err(|e| RpcError::internal(format!("upstream {}: unreadable result: {e}", self.upstream)));
                self.answered(&id, raw);
            }
            Ok(Message::Response { id, outcome: Err(error) }) => self.answered(&id, Err(RpcError::from_object(&error))),
            Ok(Message::Notification { method, params }) => {
                sink.deliver(PeerMessage::Notification { method, params: params.map(Value::Object) }).await;
            }
            Ok(Message::Request { id, method, params }) => {
                sink.deliver(PeerMessage::Request { id, method, params: params.map(Value::Object) }).await;
            }
            Err(e) => self.unreadable(line, line, &format!("a line on stdout that is not a JSON-RPC message ({})", e.message)),
        }
    }
}

/// Our ids are numbers; a child that echoes them as strings is forgiven.
pub(crate) fn our_id(id: &Value) -> Option<u64> {
    id.as_u64().or_else(|| id.as_str().and_then(|s| s.parse().ok()))
}

/// An answer with a result, read without parsing the result.
#[derive(Deserialize)]
struct ResponseLine<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: u64,
    #[serde(borrow)]
    result: &'a RawValue,
    method: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
}

/// The start of a line as text, for logs.
pub(crate) fn preview(line: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(max)]);
    let mut text: String = text.chars().filter(|c| !c.is_control()).collect();
    if line.len() > max {
        text.push('…');
    }
    text
}

impl StdioUpstream {
    /// Sends request `id` (its line tagged `tag`) and waits for its answer,
    /// bounded by `request_timeout` (but `initialize`); with the hold on
    /// the answer's frame, for a kept child.
    /// `cancelled`: the client request's cancellation; with it, dropping the
    /// exchange tells the child only if the client cancelled (else the
    /// process is leaving the call to the next engine).
    async fn exchange(
        &self,
        id: u64,
        tag: Bytes,
        method: &str,
        mut params: Option<Value>,
        cancelled: Option<tokio_util::sync::CancellationToken>,
    ) -> Result<(Box<RawValue>, Option<crate::kept::FrameHold>), RpcError> {
        // The W3C trace context of this request's span (`--otlp-endpoint`):
        // a child has no headers, so it goes in `params._meta`.
        tether_server::trace::inject_meta(&mut params);
        let (tx, rx) = oneshot::channel();
        self.shared.register(id, tx)?;
        // `initialize` is bounded by the caller (`upstream_init_timeout`).
        let initialize = method == "initialize";
        let mut in_flight = InFlight {
            upstream: self,
            id,
            sent: false,
            done: false,
            cancellable: !initialize,
            reason: Cow::Borrowed("the gateway's client is no longer waiting for this request"),
            unless_left: cancelled,
        };
        let line = envelope::outbound_message(Some(&json!(id)), method, params.as_ref());
        // Queuing the line counts too: a child that stops reading its stdin
        // holds a request no longer than one that never answers.
        let exchange = async {
            self.writer.send(Outgoing { line, tag }).await.map_err(|_| self.shared.gone())?;
            in_flight.sent = true;
            let answer = rx.await;
            in_flight.done = true;
            // A dropped sender means the connection ended without a word.
            let answer = answer.unwrap_or_else(|_| Err(RpcError::internal(UPSTREAM_RESTARTED)));
            let hold = self.shared.frames.as_ref().and_then(|frames| frames.take_hold(id));
            answer.map(|a| (a, hold))
        };
        if initialize {
            return exchange.await;
        }
        match tokio::time::timeout(self.request_timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => {
                let waited = humantime::format_duration(self.request_timeout);
                let shared = &self.shared;
                tracing::warn!(upstream = %shared.upstream, session = %shared.session, "request {id} ({method:?}) got no answer within {waited} (request_timeout); ending it and cancelling it upstream");
                in_flight.reason =
                    format!("no answer within {waited}, the request_timeout of tether's upstream {}", shared.upstream).into();
                in_flight.unless_left = None;
                // Dropping it removes the waiting entry and sends the cancellation.
                drop(in_flight);
                Err(self.timed_out(method))
            }
        }
    }

    /// The error of a request that got no answer within `request_timeout`.
    fn timed_out(&self, method: &str) -> RpcError {
        let (name, waited) = (&self.shared.upstream, humantime::format_duration(self.request_timeout));
        let message = format!(
            "upstream {name} did not answer {method} within {waited} (its request_timeout), so tether ended the request and cancelled it upstream; it may or may not have taken effect. If its calls take this long, raise request_timeout in [upstreams.{name}]"
        );
        let timeout_ms = u64::try_from(self.request_timeout.as_millis()).unwrap_or(u64::MAX);
        RpcError::internal(message).with_data(json!({"upstream": name, "timeout": "request_timeout", "timeout_ms": timeout_ms}))
    }

    async fn send_line(&self, line: Bytes) -> Result<(), RpcError> {
        if !self.is_alive() {
            return Err(self.shared.gone());
        }
        self.writer.send(line.into()).await.map_err(|_| self.shared.gone())
    }

    /// How the child ended ("exited (exit status: 3)"), waiting at most `limit`.
    async fn wait_exit(&self, limit: Duration) -> String {
        let mut exited = self.exited.clone();
        match tokio::time::timeout(limit, exited.wait_for(Option::is_some)).await {
            Ok(Ok(description)) => description.clone().unwrap_or_default(),
            _ => "ended".to_owned(),
        }
    }
}

impl Drop for StdioUpstream {
    fn drop(&mut self) {
        // The supervisor holds the child; this is what tells it to stop.
        self.kill.notify_one();
    }
}

/// A request in flight: if its future is dropped before the answer, the
/// waiting entry goes and the child is told with `notifications/cancelled`.
struct InFlight<'a> {
    upstream: &'a StdioUpstream,
    id: u64,
    /// The request line was queued for the child.
    sent: bool,
    /// Answered (or the connection ended): nothing to cancel.
    done: bool,
    /// The protocol forbids cancelling `initialize`.
    cancellable: bool,
    /// Why it is given up, as the child's `notifications/cancelled` says.
    reason: Cow<'static, str>,
    /// A kept child's call: cancelled upstream only when this token (the
    /// client's cancellation) was, or its time ran out.
    unless_left: Option<tokio_util::sync::CancellationToken>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped by a process that leaves a kept child's call to the next
        // engine (not by its client): the answer, when it comes, must stay
        // unacknowledged for that engine; noted before the request stops
        // waiting, so it cannot come in between.
        let left = self.unless_left.as_ref().is_some_and(|client| !client.is_cancelled());
        if left && let Some(frames) = &self.upstream.shared.frames {
            frames.leave_answer(self.id);
        }
        if !self.upstream.shared.give_up(self.id) || left {
            return;
        }
        if !self.sent || !self.cancellable || !self.upstream.is_alive() {
            return;
        }
        let params = json!({"requestId": self.id, "reason": self.reason});
        let line = envelope::outbound_message(None, "notifications/cancelled", Some(&params));
        // No await in drop: if the queue is full the child is far behind and
        // the answer, when it comes, is dropped as a late one.
        if self.upstream.writer.try_send(line.into()).is_err() {
            let shared = &self.upstream.shared;
            tracing::debug!(upstream = %shared.upstream, session = %shared.session, "could not queue notifications/cancelled for request {}", self.id);
        }
    }
}

#[async_trait]
impl Upstream for StdioUpstream {
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Box<RawValue>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // A kept child's answer is let go of at once: nobody stores it.
        self.exchange(id, Bytes::new(), method, params, None).await.map(|(answer, _)| answer)
    }

    fn keeps_calls(&self) -> bool {
        self.kept.is_some()
    }

    async fn request_for(
        &self,
        ctx: &tether_server::RequestCtx,
        method: &str,
        params: Option<Value>,
        progress: Option<&crate::link::Progress>,
    ) -> Result<Box<RawValue>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let Some(kept) = &self.kept else {
            return self.exchange(id, Bytes::new(), method, params, None).await.map(|(a, _)| a);
        };
        let tag = kept.tag_for(ctx, id, progress);
        // The call outlives this process: a drain that runs out leaves it
        // to the next engine, and the child is not told to cancel it then.
        ctx.outlives_process();
        let outcome = self.exchange(id, tag.clone(), method, params, Some(ctx.cancelled().clone())).await;
        let (answer, hold) = match outcome {
            Ok(answered) => answered,
            Err(e) => {
                kept.done(tag);
                return Err(e);
            }
        };
        kept.settle_after_final(ctx, hold, tag);
        Ok(answer)
    }

    fn cut_off_call(&self, key: &str) -> Option<crate::upstream::CutOffCall> {
        self.kept.as_ref()?.cut_off_call(key)
    }

    async fn resume(
        &self,
        request_id: Value,
        _after: &str,
        messages: mpsc::Sender<PeerMessage>,
    ) -> Result<Box<RawValue>, RpcError> {
        let Some(kept) = &self.kept else { return Err(RpcError::internal(UPSTREAM_RESTARTED)) };
        kept.resume(&request_id, messages, self.request_timeout, &self.shared).await
    }

    async fn leave(&self) {
        if let Some(kept) = &self.kept {
            kept.leave();
        }
        self.close(false).await;
    }

    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        self.send_line(envelope::outbound_message(None, method, params.as_ref())).await
    }

    async fn answer(&self, id: Value, outcome: Result<Value, RpcError>) -> Result<(), RpcError> {
        let line = match outcome {
            Ok(result) => envelope::result_message(&id, &result),
            Err(error) => envelope::error_message(Some(&id), &error),
        };
        self.send_line(line).await
    }

    fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    fn tag_session(&self, session: &str) {
        let mut tag = self.shared.session.0.write();
        if *tag != session {
            session.clone_into(&mut tag);
        }
    }

    /// Kills the child (and its process group) and waits for it, bounded.
    async fn close(&self, _end_session: bool) {
        self.kill.notify_one();
        let _ = self.wait_exit(CLOSE_WAIT).await;
    }
}

/// Owns the child until it is gone; then ends the connection.
async fn supervise(
    mut child: Child,
    tasks: Tasks,
    shared: Arc<Shared>,
    kill: Arc<Notify>,
    exited: watch::Sender<Option<String>>,
    permit: ProcessPermit,
) {
    let pid = child.id();
    let Tasks { writer, mut reader, mut stderr } = tasks;
    let mut reader_done = false;
    let description = tokio::select! {
        status = child.wait() => exited_with(status),
        () = kill.notified() => stop(&mut child, pid).await,
        _ = &mut reader => {
            reader_done = true;
            // Stdout closed: most often the child is exiting; give it a
            // moment before calling it stopped. Without stdout the
            // connection is over either way.
            match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                Ok(status) => exited_with(status),
                Err(_) => stop(&mut child, pid).await,
            }
        }
    };
    // What the child wrote before it exited may still be in the pipes: its
    // last answers and its last stderr line (for the error message).
    let drained = tokio::time::timeout(EXIT_GRACE, async {
        if !reader_done {
            let _ = (&mut reader).await;
        }
        let _ = (&mut stderr).await;
    })
    .await;
    if drained.is_err() {
        // Most likely something the child started still holds its pipes
        // open (so its group still has members and the group ID is not
        // reused): stop it too.
        kill_group(pid);
        reader.abort();
        stderr.abort();
    }
    writer.abort();
    gone(&shared, Some(permit), &exited, description);
}

/// The child is gone (`description`: how): its place under `max_processes`
/// is free, then every request in flight ends and nothing new starts.
pub(crate) fn gone(shared: &Shared, permit: Option<ProcessPermit>, exited: &watch::Sender<Option<String>>, description: String) {
    tracing::info!(upstream = %shared.upstream, session = %shared.session, "upstream `{}` {description}", shared.command);
    // Reaped: its place is free before anyone hears it has gone.
    drop(permit);
    exited.send_replace(Some(description));
    tether_server::metrics::upstream_processes(&shared.upstream, -1);
    shared.end();
}

fn exited_with(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(status) => format!("exited ({status})"),
        Err(e) => format!("could not be waited for ({e})"),
    }
}

/// Kills the child and its process group and reaps it (bounded).
async fn stop(child: &mut Child, pid: Option<u32>) -> String {
    // The group first, while the child is not yet reaped (its ID cannot
    // have been reused), so what it started goes too.
    kill_group(pid);
    let _ = child.start_kill();
    match tokio::time::timeout(CLOSE_WAIT, child.wait()).await {
        Ok(Ok(status)) => format!("was stopped ({status})"),
        Ok(Err(e)) => format!("was stopped and could not be waited for ({e})"),
        Err(_) => "was stopped but did not go away".to_owned(),
    }
}

/// SIGKILL to the child's process group (its ID is the child's PID).
fn kill_group(pid: Option<u32>) {
    if let Some(pgid) = pid.and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

async fn write_stdin(stdin: ChildStdin, mut lines: mpsc::Receiver<Outgoing>, shared: Arc<Shared>) {
    let mut out = BufWriter::new(stdin);
    while let Some(first) = lines.recv().await {
        let mut next = Some(first);
        let mut written = 0;
        let result = async {
            // Whatever is queued goes out with one flush.
            while let Some(Outgoing { line, .. }) = next.take() {
                out.write_all(&line).await?;
                out.write_all(b"\n").await?;
                written += 1;
                if written < WRITE_BATCH {
                    next = lines.try_recv().ok();
                }
            }
            out.flush().await
        }
        .await;
        if let Err(e) = result {
            // The child is gone or closed its stdin; the supervisor ends the connection.
            tracing::debug!(upstream = %shared.upstream, session = %shared.session, "writing to the child's stdin failed: {e}");
            return;
        }
    }
}

async fn read_stdout(stdout: ChildStdout, max: usize, sink: Arc<dyn PeerSink>, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stdout);
    let mut decoder = LineDecoder::new(max);
    loop {
        match ndjson::read_line(&mut reader, &mut decoder).await {
            Ok(Some(Line::Text(line))) => shared.dispatch(&line, sink.as_ref()).await,
            Ok(Some(Line::TooLong { len, head, tail })) => {
                let why = format!(
                    "a message of {len} bytes on stdout, over its max_message_bytes ({max}); raise max_message_bytes in [upstreams.{}] if its messages are this large",
                    shared.upstream
                );
                shared.unreadable(&head, &tail, &why);
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(upstream = %shared.upstream, session = %shared.session, "reading the child's stdout failed: {e}");
                break;
            }
        }
    }
    // The supervisor sees this task end: without stdout the connection is over.
}

async fn read_stderr(stderr: ChildStderr, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stderr);
    let mut decoder = LineDecoder::new(STDERR_LINE_MAX);
    let mut log = StderrLog::new();
    while let Ok(Some(line)) = ndjson::read_line(&mut reader, &mut decoder).await {
        let text = match line {
            Line::Text(text) => preview(&text, STDERR_LINE_MAX),
            Line::TooLong { len, head, .. } => format!("{} ({len} bytes)", preview(&head, STDERR_LINE_MAX)),
        };
        log.line(&shared, text);
    }
}

/// A child's stderr lines in tether's log: at most
/// [`STDERR_LINES_PER_WINDOW`] per [`LOG_WINDOW`], then a count of what was
/// left out; the last one kept for error messages.
pub(crate) struct StderrLog {
    burst: Burst,
}

impl StderrLog {
    pub(crate) fn new() -> Self {
        Self { burst: Burst::new(STDERR_LINES_PER_WINDOW, LOG_WINDOW) }
    }

    pub(crate) fn bytes(&mut self, shared: &Shared, line: &[u8]) {
        self.line(shared, preview(line, STDERR_LINE_MAX));
    }

    fn line(&mut self, shared: &Shared, text: String) {
        let burst = &mut self.burst;
        match burst.admit() {
            Admit::Log { left_out: 0 } => {
                tracing::info!(upstream = %shared.upstream, session = %shared.session, "stderr: {text}");
            }
            Admit::Log { left_out } => tracing::info!(
                upstream = %shared.upstream,
                session = %shared.session,
                "stderr: {text} (after {left_out} lines left out of this log: more than {STDERR_LINES_PER_WINDOW} in {} s)",
                LOG_WINDOW.as_secs()
            ),
            Admit::Drop => {}
        }
        let last: String = text.chars().take(LAST_STDERR_MAX).collect();
        *shared.last_stderr.lock() = Some(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_without_parsing_their_result() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"z":1,"a":[1,2]}}"#;
        let response: ResponseLine<'_> = serde_json::from_slice(line).unwrap();
        assert_eq!((response.id, response.result.get()), (7, r#"{"z":1,"a":[1,2]}"#));
        // Anything else goes the strict way.
        assert!(serde_json::from_slice::<ResponseLine<'_>>(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#).is_err());
        assert!(serde_json::from_slice::<ResponseLine<'_>>(br#"{"jsonrpc":"2.0","id":7,"method":"x"}"#).is_err());
    }

    #[test]
    fn previews_are_bounded_and_printable() {
        assert_eq!(preview(b"ab\x1bc", 10), "abc");
        assert_eq!(preview(b"abcdef", 3), "abc…");
    }
}
