//! A server as a process: spawning it (under `taskset` with
//! `--pin-servers`), draining its stderr (the URL it prints, the last lines,
//! its WARN and ERROR lines; agentgateway's stdout too, where it logs),
//! waiting until it answers its health check, and stopping it (SIGTERM) or
//! killing it (SIGKILL).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::catalog::{Launch, Launched, Programs, Subject};
use super::store::Store;

/// How long a server may take to print its URL and to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Lines of a server's stderr kept for error messages.
const KEPT_LINES: usize = 40;
/// Of those, WARN and ERROR lines kept apart (the rest can push them out).
const KEPT_PROBLEMS: usize = 10;

/// `cmd` run by `taskset -c CPUS` (which execs it: the PID stays the server's).
pub(super) fn pinned(cmd: &Command, cpus: &str) -> Command {
    let std = cmd.as_std();
    let mut pinned = Command::new("taskset");
    pinned.args(["-c", cpus]).arg(std.get_program()).args(std.get_args());
    if let Some(dir) = std.get_current_dir() {
        pinned.current_dir(dir);
    }
    for (key, value) in std.get_envs() {
        match value {
            Some(value) => pinned.env(key, value),
            None => pinned.env_remove(key),
        };
    }
    pinned
}

/// A running server; `stop` or `kill` it when done (dropping it kills the process).
pub struct Server {
    pub subject: Subject,
    child: Child,
    pub(super) pid: u32,
    /// The MCP endpoint, e.g. `http://127.0.0.1:41234/mcp` (known once `ready` returned).
    pub mcp_url: String,
    url_rx: Option<oneshot::Receiver<String>>,
    /// Its health check's URL when it is not on the MCP URL's origin (agentgateway's readiness probe).
    health_url: Option<String>,
    /// The last lines of its stderr.
    log: Arc<Mutex<VecDeque<String>>>,
    /// How many of its stderr lines were at WARN or ERROR level, and the last of them.
    problems: Problems,
}

impl Server {
    /// Its process ID (its CPU time is read from `/proc/PID/stat`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Spawns the process and returns at once (the restart scenario times from here).
    pub fn spawn(launch: &Launch, programs: &Programs, store: Option<&Store>) -> anyhow::Result<Server> {
        let Launched { mut cmd, known_url, health_url } = launch.command(programs, store)?;
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", launch.subject.name()))?;
        let pid = child.id().context("the server exited at once")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (url_tx, url_rx) = oneshot::channel();
        let suffix = launch.endpoint_suffix();
        let url_tx = match known_url {
            Some(url) => {
                let _ = url_tx.send(url);
                None
            }
            None => Some((url_tx, suffix)),
        };
        let problems = Arc::new(Mutex::new((0, VecDeque::new())));
        // Drain stderr (and a piped stdout) for the server's whole life so it never blocks on a full pipe.
        tokio::spawn(drain(stderr, url_tx, log.clone(), problems.clone()));
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(drain(stdout, None, log.clone(), problems.clone()));
        }
        Ok(Server {
            subject: launch.subject,
            child,
            pid,
            mcp_url: String::new(),
            url_rx: Some(url_rx),
            health_url,
            log,
            problems,
        })
    }

    /// Spawns the process and waits until it printed its URL and answers `/healthz`.
    pub async fn start(launch: &Launch, programs: &Programs, store: Option<&Store>) -> anyhow::Result<Server> {
        let mut server = Self::spawn(launch, programs, store)?;
        server.ready().await?;
        Ok(server)
    }

    /// Waits for the URL line and a healthy `/healthz` (mcp-proxy: `/status`).
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        let rx = self.url_rx.take().context("ready() called twice")?;
        self.mcp_url = match tokio::time::timeout(START_TIMEOUT, rx).await {
            Ok(Ok(url)) => url,
            Ok(Err(_)) => bail!("{} exited before printing its URL; its stderr:\n{}", self.subject.name(), self.log_tail()),
            Err(_) => bail!("{} printed no URL within {START_TIMEOUT:?}; its stderr:\n{}", self.subject.name(), self.log_tail()),
        };
        let url = match &self.health_url {
            Some(url) => url.clone(),
            None => format!("{}{}", origin(&self.mcp_url), self.subject.system.health_path()),
        };
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match client.get(&url).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::OK => return Ok(()),
                Ok(r) if Instant::now() > deadline => bail!("{url} answered {}", r.status()),
                Err(e) if Instant::now() > deadline => bail!("{url} did not answer: {e}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The last lines the server wrote to stderr.
    pub fn log_tail(&self) -> String {
        self.log.lock().iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// How many lines it logged at WARN or ERROR level, and the last few of them.
    pub fn problems(&self) -> (u64, Vec<String>) {
        let problems = self.problems.lock();
        (problems.0, problems.1.iter().cloned().collect())
    }

    /// kill(2) to our own child, which we have not reaped yet.
    fn signal(&self, signal: rustix::process::Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw).context("pid out of range")?;
        rustix::process::kill_process(pid, signal).with_context(|| format!("cannot signal {}", self.pid))
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after a timeout).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.signal(rustix::process::Signal::TERM)?;
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                // Python's default for SIGTERM (mcp-proxy) is to die of it: that is a stop too.
                let died_of_term =
                    std::os::unix::process::ExitStatusExt::signal(&status) == Some(rustix::process::Signal::TERM.as_raw());
                if !status.success() && !died_of_term {
                    eprintln!("tether-bench: {} ({}) exited with {status} after SIGTERM", self.subject.name(), self.pid);
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("{} ({}) ignored SIGTERM for {STOP_TIMEOUT:?} and was killed", self.subject.name(), self.pid)
            }
        }
    }

    /// SIGKILL, then reap the process and wait for what ran under it to be
    /// gone too (a keeper's engine dies of its parent's death a moment
    /// later, holding the store's lock until then: a server restarted on
    /// the same store at once would find it in use).
    pub async fn kill(mut self) -> anyhow::Result<()> {
        let under = self.descendants().unwrap_or_default();
        self.signal(rustix::process::Signal::KILL)?;
        let status = tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await.context("a SIGKILLed server did not exit")??;
        anyhow::ensure!(!status.success(), "{} exited cleanly instead of being killed", self.subject.name());
        let gone = async {
            while under.iter().any(|&pid| super::procfs::is_alive(pid)) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(STOP_TIMEOUT, gone).await.context("the processes under a SIGKILLed server did not exit")?;
        Ok(())
    }
}

/// A server's log lines (how many were WARN or ERROR, and the last of them)
type Problems = Arc<Mutex<(u64, VecDeque<String>)>>;

/// Reads a server's output line by line until it closes: the first MCP URL
/// in it goes to `url_tx` (with the endpoint's suffix), the last lines to
/// `log`, its WARN and ERROR lines to `problems`.
async fn drain(
    output: impl AsyncRead + Unpin,
    mut url_tx: Option<(oneshot::Sender<String>, String)>,
    log: Arc<Mutex<VecDeque<String>>>,
    problems: Problems,
) {
    let mut lines = BufReader::new(output).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(url) = mcp_url_in(&line)
            && let Some((tx, suffix)) = url_tx.take()
        {
            let _ = tx.send(url + &suffix);
        }
        if is_problem(&line) {
            let mut problems = problems.lock();
            problems.0 += 1;
            if problems.1.len() == KEPT_PROBLEMS {
                problems.1.pop_front();
            }
            problems.1.push_back(line.clone());
        }
        let mut kept = log.lock();
        if kept.len() == KEPT_LINES {
            kept.pop_front();
        }
        kept.push_back(line);
    }
}

/// A loopback port free right now (for a restart, whose URL is needed before the server prints it).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a probe socket")?;
    Ok(listener.local_addr()?.port())
}

/// A log line at WARN or ERROR level (tracing's format: `… WARN target: …`).
fn is_problem(line: &str) -> bool {
    line.split_whitespace().take(3).any(|word| word == "WARN" || word == "ERROR")
}

/// `http://host:port` of a URL.
pub fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..].find('/').map_or(url, |i| &url[..after_scheme + i])
}

/// The first `http://…/mcp` URL in a log line, if any.
fn mcp_url_in(line: &str) -> Option<String> {
    let start = line.find("http://")?;
    let url: String = line[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || ":/.-_[]%".contains(*c)).collect();
    url.ends_with("/mcp").then_some(url)
}

#[cfg(test)]
mod tests {
    use super::mcp_url_in;

    #[test]
    fn finds_the_url_in_a_log_line() {
        let line = "2026-01-01T00:00:00Z  INFO tether::serve: tether listening on http://127.0.0.1:4567/mcp local=127.0.0.1:4567";
        assert_eq!(mcp_url_in(line).as_deref(), Some("http://127.0.0.1:4567/mcp"));
        assert_eq!(
            mcp_url_in("rmcp reference listening on http://127.0.0.1:80/mcp (channel_capacity 16)").as_deref(),
            Some("http://127.0.0.1:80/mcp")
        );
        assert_eq!(mcp_url_in("INFO authentication is off"), None);
        assert!(super::is_problem("2026-01-01T00:00:00Z  WARN tether_gateway: upstream slow"));
        assert!(!super::is_problem("2026-01-01T00:00:00Z  INFO tether::serve: a WARN in the message"));
    }
}
