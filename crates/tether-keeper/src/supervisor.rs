//! The keeper process: what `tether serve` becomes. It binds every
//! listening socket first (backlog [`BACKLOG`], so clients that arrive while
//! no engine runs wait instead of being refused), starts the engine
//! (`PROGRAM engine …`, its stdin a socketpair that is its control
//! connection, served by [`Children::serve_engine`]), restarts it when it
//! dies (backoff [`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`], reset after
//! [`STEADY`] up), and hands every new engine the same sockets and children.
//!
//! It reaps every process that ends (SIGCHLD, `waitpid(-1)`), its own and
//! those reparented to it as PID 1, so nothing here uses `wait` per child.
//! Signals: SIGTERM/SIGINT drain (SIGTERM to the engine, wait for it, then
//! stop every child within [`CHILD_GRACE`]); a second one kills everything
//! at once; SIGHUP goes to the engine (it reloads); SIGUSR2 upgrades: the
//! binary now at the program's path must say it speaks this keeper's
//! protocol (`PROGRAM keeper-protocol`), then the running engine is asked to
//! hand over and the new one starts the moment it exits.
//!
//! It holds: the sockets, one engine, the children ([`Children`]'s bounds),
//! one upgrade check at a time. No store, no HTTP, no JSON.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};

use crate::children::{Children, EngineGone, describe};
use crate::proto;

/// Connections each listening socket queues while no engine accepts.
pub const BACKLOG: i32 = 4096;
pub const BACKOFF_FIRST: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// An engine up this long was healthy: it is restarted at once, and the
/// wait for one that dies earlier starts from [`BACKOFF_FIRST`] again.
pub const STEADY: Duration = Duration::from_secs(30);
/// How long children get between SIGTERM and SIGKILL when the keeper stops.
pub const CHILD_GRACE: Duration = Duration::from_secs(5);
/// How long `PROGRAM keeper-protocol` may take.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an engine asked to hand over may take to exit before it gets
/// SIGTERM (its drain).
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(120);

/// What the keeper runs.
pub struct KeeperConfig {
    /// Every socket to listen on, by the name of the option that asked for
    /// it (`listen`, `metrics-listen`); the engine gets them in this order.
    pub listeners: Vec<(String, SocketAddr)>,
    /// The tether binary as found when the keeper started: the path, so a
    /// restart or an upgrade runs the binary now on disk.
    pub program: PathBuf,
    /// Passed after the word `engine`.
    pub engine_args: Vec<OsString>,
}

/// Runs the keeper until it is told to stop; its exit code.
pub fn run(config: KeeperConfig) -> i32 {
    let mut listeners = Vec::new();
    for (name, addr) in &config.listeners {
        match bind_when_free(*addr) {
            Ok(fd) => {
                let listener = std::net::TcpListener::from(fd);
                match listener.local_addr() {
                    Ok(bound) => tracing::info!("listening on {bound} ({name})"),
                    Err(_) => tracing::info!("listening on {addr} ({name})"),
                }
                listeners.push(listener);
            }
            Err(e) => {
                tracing::error!("cannot listen on {addr}: {e}; is another server using it? pick another with --{name}");
                return 1;
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("cannot start the keeper's runtime: {e}");
            return 1;
        }
    };
    // Inside the runtime: the children's sweep starts on it.
    runtime.block_on(async move { Keeper::new(config, listeners).run().await })
}

/// How long a port in use is tried again: the processes of a server
/// killed just before (its engine, which dies with its keeper a moment
/// later) may still hold it.
pub const BIND_RETRY: Duration = Duration::from_secs(3);

/// [`bind`], trying a port in use again for [`BIND_RETRY`].
fn bind_when_free(addr: SocketAddr) -> std::io::Result<OwnedFd> {
    let started = Instant::now();
    let mut said = false;
    loop {
        match bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < BIND_RETRY => {
                if !said {
                    said = true;
                    tracing::info!(
                        "{addr} is in use; trying again for {BIND_RETRY:?} (a server stopped just now may still be exiting)"
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<OwnedFd> {
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, BACKLOG)?;
    Ok(fd)
}

/// Exits the reaper has seen, for the processes that are not children.
type Waiters = Arc<Mutex<HashMap<u32, oneshot::Sender<WaitStatus>>>>;

struct Keeper {
    config: KeeperConfig,
    listeners: Arc<Vec<std::net::TcpListener>>,
    children: Children,
    waiters: Waiters,
}

struct Engine {
    pid: u32,
    started: Instant,
    exit: oneshot::Receiver<WaitStatus>,
    /// Its control connection, served.
    serving: tokio::task::JoinHandle<()>,
}

/// How long an exited engine's connection may still be read (what it sent
/// last), before it is closed: something the engine started may hold its
/// end open.
pub const LAST_WORDS: Duration = Duration::from_secs(1);

fn send_signal(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

impl Keeper {
    fn new(config: KeeperConfig, listeners: Vec<std::net::TcpListener>) -> Self {
        Self { config, listeners: Arc::new(listeners), children: Children::new(), waiters: Arc::default() }
    }

    async fn run(self) -> i32 {
        let signals = (|| {
            Ok::<_, std::io::Error>((
                signal(SignalKind::child())?,
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined2())?,
            ))
        })();
        let (sigchld, mut sigterm, mut sigint, mut sighup, mut sigusr2) = match signals {
            Ok(signals) => signals,
            Err(e) => {
                tracing::error!("cannot handle signals: {e}");
                return 1;
            }
        };
        tokio::spawn(reap(sigchld, self.children.clone(), self.waiters.clone()));
        let (preflight_tx, mut preflight_rx) = mpsc::channel::<Result<(), String>>(1);
        let mut engine: Option<Engine> = None;
        let mut epoch = 0u64;
        let mut backoff = BACKOFF_FIRST;
        let mut next_start = Some(tokio::time::Instant::now());
        let (mut stopping, mut hard, mut preflighting, mut upgrading) = (false, false, false, false);
        let mut handover_deadline: Option<tokio::time::Instant> = None;
        let mut code = 0;
        loop {
            if engine.is_none() {
                if stopping {
                    break;
                }
                if next_start.is_some_and(|at| at <= tokio::time::Instant::now()) {
                    next_start = None;
                    match self.start_engine(epoch + 1) {
                        Ok(started) => {
                            epoch += 1;
                            engine = Some(started);
                        }
                        Err(e) => {
                            tracing::error!("{e}; trying again in {backoff:?}");
                            next_start = Some(tokio::time::Instant::now() + backoff);
                            backoff = (backoff * 2).min(BACKOFF_MAX);
                        }
                    }
                }
            }
            tokio::select! {
                status = engine_exit(&mut engine) => {
                    let Some(ended) = engine.take() else { continue };
                    self.children.engine_ended();
                    let mut serving = ended.serving;
                    tokio::spawn(async move {
                        if tokio::time::timeout(LAST_WORDS, &mut serving).await.is_err() {
                            serving.abort();
                        }
                    });
                    let how = describe(status);
                    let up = ended.started.elapsed();
                    if stopping {
                        tracing::info!("the engine (pid {}) {how}", ended.pid);
                        code = match (status.exit_status(), status.terminating_signal()) {
                            (Some(code), _) => code,
                            (None, Some(signal)) if signal == Signal::TERM.as_raw() => 0,
                            (None, Some(signal)) => 128 + signal,
                            _ => 1,
                        };
                    } else if !upgrading && !self.children.ever_ready() {
                        // It never served: a bad flag, config or store, which a
                        // restart would only repeat. Its error is in the log.
                        tracing::error!("the engine (pid {}) {how} before it served: the keeper stops", ended.pid);
                        code = match status.exit_status() {
                            Some(0) | None => 1,
                            Some(code) => code,
                        };
                        stopping = true;
                    } else if upgrading {
                        (upgrading, handover_deadline) = (false, None);
                        tracing::info!("the engine (pid {}) handed over and {how}: starting the new one", ended.pid);
                        next_start = Some(tokio::time::Instant::now());
                    } else {
                        // An engine that ran steadily is restarted at once;
                        // one that keeps dying early, after a doubling wait.
                        let wait = if up >= STEADY {
                            backoff = BACKOFF_FIRST;
                            Duration::ZERO
                        } else {
                            let wait = backoff;
                            backoff = (backoff * 2).min(BACKOFF_MAX);
                            wait
                        };
                        tracing::warn!(
                            "the engine (pid {}) {how} after {:.1} s up; restarting it in {wait:?} (restart {epoch}); its sockets and children are kept",
                            ended.pid,
                            up.as_secs_f64()
                        );
                        next_start = Some(tokio::time::Instant::now() + wait);
                    }
                }
                () = sleep_until(next_start), if engine.is_none() => {}
                () = sleep_until(handover_deadline), if engine.is_some() => {
                    handover_deadline = None;
                    if let Some(engine) = &engine {
                        tracing::warn!("the engine (pid {}) did not hand over within {HANDOVER_TIMEOUT:?}: sending it SIGTERM", engine.pid);
                        send_signal(engine.pid, Signal::TERM);
                    }
                }
                _ = sigterm.recv() => (stopping, hard) = self.stop(&engine, stopping),
                _ = sigint.recv() => (stopping, hard) = self.stop(&engine, stopping),
                _ = sighup.recv() => {
                    if let Some(engine) = &engine {
                        tracing::info!("SIGHUP: passing it to the engine (pid {}) to reload", engine.pid);
                        send_signal(engine.pid, Signal::HUP);
                    }
                }
                _ = sigusr2.recv() => {
                    if preflighting || upgrading || stopping {
                        tracing::warn!("SIGUSR2: an upgrade or a stop is under way already; ignored");
                    } else {
                        tracing::info!("SIGUSR2: upgrading to the binary now at {}", self.config.program.display());
                        preflighting = true;
                        let (program, waiters, tx) = (self.config.program.clone(), self.waiters.clone(), preflight_tx.clone());
                        tokio::spawn(async move { let _ = tx.send(preflight(program, waiters).await).await; });
                    }
                }
                Some(checked) = preflight_rx.recv() => {
                    preflighting = false;
                    match (checked, &engine) {
                        (Err(e), _) => tracing::error!("{e}"),
                        _ if stopping => {}
                        (Ok(()), Some(running)) => {
                            upgrading = true;
                            handover_deadline = Some(tokio::time::Instant::now() + HANDOVER_TIMEOUT);
                            if self.children.handover() {
                                tracing::info!("asked the engine (pid {}) to hand over", running.pid);
                            } else {
                                tracing::warn!("the engine (pid {}) is not connected to the keeper: stopping it (SIGTERM) to start the new one", running.pid);
                                send_signal(running.pid, Signal::TERM);
                            }
                        }
                        (Ok(()), None) => next_start = Some(tokio::time::Instant::now()),
                    }
                }
            }
        }
        let grace = if hard { Duration::ZERO } else { CHILD_GRACE };
        self.children.stop_all(grace).await;
        tracing::info!("the keeper stops (exit code {code})");
        code
    }

    /// SIGTERM or SIGINT: the first drains, the second kills.
    fn stop(&self, engine: &Option<Engine>, stopping: bool) -> (bool, bool) {
        if stopping {
            tracing::warn!("told to stop again: killing the engine and every child now");
            if let Some(engine) = engine {
                send_signal(engine.pid, Signal::KILL);
            }
            let children = self.children.clone();
            tokio::spawn(async move { children.stop_all(Duration::ZERO).await });
            return (true, true);
        }
        if let Some(engine) = engine {
            tracing::info!("stopping: the engine (pid {}) drains, then every child stops", engine.pid);
            send_signal(engine.pid, Signal::TERM);
        }
        (true, false)
    }

    /// Starts `PROGRAM engine ARGS` with its control socket as its stdin.
    fn start_engine(&self, epoch: u64) -> Result<Engine, String> {
        let program = &self.config.program;
        let failed = |e: std::io::Error| format!("cannot start the engine `{} engine`: {e}", program.display());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(failed)?;
        ours.set_nonblocking(true).map_err(failed)?;
        let ours = tokio::net::UnixStream::from_std(ours).map_err(failed)?;
        let names: Vec<&str> = self.config.listeners.iter().map(|(name, _)| name.as_str()).collect();
        let mut command = Command::new(program);
        command
            .arg("engine")
            .args(&self.config.engine_args)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .env("TETHER_KEEPER_LISTENERS", names.join(","))
            .env("TETHER_KEEPER_PID", std::process::id().to_string());
        crate::spawn::die_with_keeper(&mut command);
        let (process, exit) = spawn_watched(&mut command, &self.waiters).map_err(failed)?;
        let pid = process.id();
        // Our copy of the engine's end closes here: its exit ends the connection.
        drop(command);
        tracing::info!("started the engine (pid {pid}, engine #{epoch}): {}", program.display());
        let (children, listeners) = (self.children.clone(), self.listeners.clone());
        let serving = tokio::spawn(async move {
            let fds: Vec<BorrowedFd<'_>> = listeners.iter().map(|fd| fd.as_fd()).collect();
            match children.serve_engine(ours, &fds, epoch).await {
                EngineGone::Closed => tracing::debug!("engine {pid}: {}", EngineGone::Closed),
                gone => tracing::error!("engine {pid}: {gone}"),
            }
        });
        Ok(Engine { pid, started: Instant::now(), exit, serving })
    }
}

/// Spawns `command` and registers its pid with the reaper in one step.
/// (The std handle is never waited on: dropping it leaves the process be.)
fn spawn_watched(
    command: &mut Command,
    waiters: &Waiters,
) -> std::io::Result<(std::process::Child, oneshot::Receiver<WaitStatus>)> {
    let mut waiting = waiters.lock();
    let process = command.spawn()?;
    let (tx, rx) = oneshot::channel();
    waiting.insert(process.id(), tx);
    Ok((process, rx))
}

async fn engine_exit(engine: &mut Option<Engine>) -> WaitStatus {
    match engine {
        Some(engine) => match (&mut engine.exit).await {
            Ok(status) => status,
            // Not reachable: the reaper keeps every sender until it reports.
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Reaps every process that ends and tells whoever waits for it.
async fn reap(mut sigchld: tokio::signal::unix::Signal, children: Children, waiters: Waiters) {
    loop {
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            let pid = pid.as_raw_nonzero().get().unsigned_abs();
            let waiter = waiters.lock().remove(&pid);
            match waiter {
                Some(tx) => drop(tx.send(status)),
                None if children.reaped(pid, status) => {}
                // A grandchild reparented to us (we are PID 1): reaped, nothing to say.
                None => tracing::trace!("reaped {pid}: {}", describe(status)),
            }
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

/// Whether the binary now at `program` speaks this keeper's protocol.
async fn preflight(program: PathBuf, waiters: Waiters) -> Result<(), String> {
    let shown = program.display().to_string();
    let verdict = |what: String| format!("{what}: not upgrading; the engine serving now goes on");
    let mut command = Command::new(&program);
    command.arg("keeper-protocol").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    crate::spawn::die_with_keeper(&mut command);
    let (mut process, exit) =
        spawn_watched(&mut command, &waiters).map_err(|e| verdict(format!("cannot run `{shown} keeper-protocol` ({e})")))?;
    let pid = process.id();
    let stdout = process.stdout.take().map(|out| tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(out)));
    let run = async {
        let mut printed = Vec::new();
        if let Some(Ok(stdout)) = stdout {
            let _ = stdout.take(64).read_to_end(&mut printed).await;
        }
        (String::from_utf8_lossy(&printed).trim().to_owned(), exit.await)
    };
    let Ok((printed, status)) = tokio::time::timeout(PREFLIGHT_TIMEOUT, run).await else {
        send_signal(pid, Signal::KILL);
        return Err(verdict(format!("`{shown} keeper-protocol` did not answer within {PREFLIGHT_TIMEOUT:?}")));
    };
    match status {
        Ok(status) if status.exit_status() == Some(0) => match printed.parse::<u32>() {
            Ok(version) if version == proto::VERSION => Ok(()),
            Ok(version) => {
                Err(verdict(format!("the binary at {shown} speaks keeper protocol {version}, this keeper {}", proto::VERSION)))
            }
            Err(_) => Err(verdict(format!("`{shown} keeper-protocol` printed {printed:?}, not a protocol version"))),
        },
        Ok(status) => Err(verdict(format!(
            "`{shown} keeper-protocol` {} (is the binary there a tether that knows the keeper?)",
            describe(status)
        ))),
        Err(_) => Err(verdict(format!("`{shown} keeper-protocol` could not be waited for"))),
    }
}
