//! A command upstream: one child process per tether session, speaking MCP's
//! stdio transport (newline-delimited JSON-RPC on its stdin and stdout).
//!
//! [`start`] spawns the command (no shell; only the configured environment
//! plus `PATH` and `HOME`; in a process group of its own, so stopping it
//! also stops what it started, such as `npx`'s `node`), sends `initialize`
//! and returns the connection as an [`Upstream`]. A request's task writes
//! its line to the child's stdin itself, through a shared writer (bounded, so a
//! child that stops reading back-pressures its callers; its flusher task
//! runs only when the pipe is full), and three tasks serve the child:
//!
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
//!   `STDERR_LINES_PER_WINDOW` per 10 s, then a summary of what was left
//!   out), tagged with the upstream and the session, and keeps the last one
//!   for error messages;
//! - the supervisor owns the child: it waits for its exit (or kills it when
//!   asked: `close`, the upstream dropped, stdout closed), lets the readers
//!   finish what the child wrote before it exited (bounded), then ends every
//!   request in flight with [`UpstreamError::Restarted`].
//!
//! A request (but `initialize`, bounded by `upstream_init_timeout`) the
//! child has not answered within the upstream's `request_timeout` ends
//! with a `-32603` naming the upstream, the time and the key to raise; its
//! waiting entry goes and the child gets `notifications/cancelled` for it
//! (as when the caller stops waiting). The session's child is then idle,
//! so the idle sweep or a request that needs room may stop it. An answer
//! the child sends later is dropped (logged at debug): ids are never
//! reused, so it cannot reach another request.
//!
//! The parts: [`kept`] (the same child held by the keeper, when this
//! process is an engine a keeper started), `shared` (what the tasks and the connection share: the
//! requests waiting, reading what the child writes), `upstream`
//! ([`StdioUpstream`]: a request's exchange, from its line to its answer or
//! its cancellation) and `stderr` (the child's stderr in the log, bounded).

pub mod kept;
mod shared;
mod stderr;
mod upstream;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use serde_json::value::RawValue;
use tether_wire::RpcError;
use tether_wire::ndjson::{self, Line, LineDecoder};
use tether_wire::shared_writer::SharedWriter;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub(crate) use self::shared::{Answer, Shared, our_id};
pub(crate) use self::stderr::StderrLog;
use self::stderr::read_stderr;
pub(crate) use self::upstream::Stdin;
pub use self::upstream::StdioUpstream;
use crate::config::CommandSpec;
use crate::connector::{Capacity, Connector, DEFAULT_POOL_IDLE, StartRequest};
use crate::processes::{ProcessPermit, Processes};
use crate::upstream::{PeerSink, Started, Upstream, UpstreamError};

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
            pool_idle: self.spec.idle_timeout.min(DEFAULT_POOL_IDLE),
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
        let launch = Launch {
            spec: &self.spec,
            upstream: &self.name,
            session: request.session,
            initialize_params: request.params,
            init_timeout: self.init_timeout,
            permit,
            sink: request.sink,
        };
        if kept::keeper().is_some() {
            return kept::start(launch).await;
        }
        start(launch).await
    }

    /// A child the keeper kept for the session (after an engine restart).
    async fn attach(
        &self,
        session: &str,
        carry_on: &Value,
        _authorization: Option<String>,
        sink: Arc<dyn PeerSink>,
    ) -> Option<Arc<dyn Upstream>> {
        kept::attach(&self.spec, &self.name, session, carry_on, sink).await
    }
}

/// One child to start, and what it is for.
pub struct Launch<'a> {
    /// The command, its environment and bounds.
    pub spec: &'a CommandSpec,
    /// The upstream's name (in its logs, metrics and errors).
    pub upstream: &'a str,
    /// The tether session it serves, or what it is for (its logs).
    pub session: &'a str,
    /// The `initialize` params it is sent, as given.
    pub initialize_params: Value,
    /// How long it may take to answer `initialize`.
    pub init_timeout: Duration,
    /// Its place under `max_processes`, held until it has been reaped.
    pub permit: ProcessPermit,
    /// Where its own messages go, in order.
    pub sink: Arc<dyn PeerSink>,
}

/// Starts the command, sends `initialize` with the launch's params as given
/// and waits at most `init_timeout` for its answer. Does not send
/// `notifications/initialized`: the gateway forwards the client's (or sends
/// it when it replays a stored `initialize`). The child holds the permit
/// until it has been reaped; its own messages go to the sink.
pub async fn start(launch: Launch<'_>) -> Result<Started, RpcError> {
    let Launch { spec, upstream: upstream_name, session, initialize_params, init_timeout, permit, sink } = launch;
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

    let stdin = stdin
        .into_owned_fd()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
        .map_err(|e| RpcError::internal(format!("upstream {upstream_name} (`{command}`): cannot use its stdin pipe: {e}")))?;
    let stdin = Stdin::Pipe(SharedWriter::new(stdin, upstream::STDIN_BYTES));
    let shared = Arc::new(Shared::new(upstream_name, session, command, None));
    let kill = Arc::new(Notify::new());
    let (exited_tx, exited) = watch::channel(None);
    let tasks = Tasks {
        reader: tokio::spawn(read_stdout(stdout, spec.max_message_bytes, sink, shared.clone())),
        stderr: tokio::spawn(read_stderr(stderr, shared.clone())),
    };
    tether_server::metrics::upstream_processes(upstream_name, 1);
    tokio::spawn(supervise(child, tasks, shared.clone(), kill.clone(), exited_tx, permit));
    let request_timeout = spec.request_timeout;
    let upstream = Arc::new(StdioUpstream { shared, stdin, next_id: AtomicU64::new(0), kill, exited, request_timeout });
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
            let refusal = match e {
                UpstreamError::Restarted | UpstreamError::NotRunning(_) | UpstreamError::ForgotSession => String::new(),
                UpstreamError::Failed(refused) => format!(" after refusing it ({})", refused.message),
            };
            Err(RpcError::internal(format!("{who} {exit} during initialize{refusal}{}", upstream.shared.stderr_hint())))
        }
        Ok(Err(refused)) => {
            upstream.close(true).await;
            let refused = RpcError::from(refused);
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

struct Tasks {
    reader: JoinHandle<()>,
    stderr: JoinHandle<()>,
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
    let Tasks { mut reader, mut stderr } = tasks;
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
