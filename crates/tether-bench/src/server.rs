//! The systems under test: starting one as a child process on a free
//! loopback port, waiting until it answers `/healthz`, reading its peak RSS
//! from `/proc`, and stopping it with SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to print its URL and to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A system the bench knows how to start (`--systems` takes these names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    /// `tether serve --store memory`.
    TetherMemory,
    /// `tether serve --store sqlite:FILE` with FILE in a fresh temp dir.
    TetherSqlite,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::TetherMemory => "tether-memory",
            System::TetherSqlite => "tether-sqlite",
        }
    }
}

/// A running server; `stop` it when done (dropping it kills the process).
pub struct Server {
    child: Child,
    pid: u32,
    /// The MCP endpoint, e.g. `http://127.0.0.1:41234/mcp`.
    pub mcp_url: String,
    /// Holds the sqlite file; removed on drop.
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts `system` from the `tether` binary at `bin` and waits until it is healthy.
    pub async fn start(system: System, bin: &Path) -> anyhow::Result<Server> {
        if !bin.is_file() {
            bail!("{} does not exist: build it with `cargo build --release -p tether` or pass --tether", bin.display());
        }
        let mut dir = None;
        let store = match system {
            System::TetherMemory => "memory".to_string(),
            System::TetherSqlite => {
                let d = tempfile::Builder::new().prefix("tether-bench-").tempdir().context("cannot create a temp dir")?;
                let file: PathBuf = d.path().join("bench.db");
                dir = Some(d);
                format!("sqlite:{}", file.display())
            }
        };
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--store", &store])
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let mut lines = BufReader::new(stderr).lines();

        // The URL comes in a log line such as `... tether listening on http://127.0.0.1:PORT/mcp ...`.
        let mut seen = Vec::new();
        let found = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = mcp_url_in(&line) {
                    return Ok::<_, std::io::Error>(Some(url));
                }
                seen.push(line);
            }
            Ok(None)
        })
        .await;
        let mcp_url = match found {
            Ok(Ok(Some(url))) => url,
            Ok(Ok(None)) => bail!("{} exited before printing its URL; its stderr:\n{}", system.name(), seen.join("\n")),
            Ok(Err(e)) => bail!("reading the stderr of {}: {e}", system.name()),
            Err(_) => bail!("{} printed no URL within {START_TIMEOUT:?}; its stderr:\n{}", system.name(), seen.join("\n")),
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let server = Server { child, pid, mcp_url, _dir: dir };
        server.wait_healthy().await?;
        Ok(server)
    }

    async fn wait_healthy(&self) -> anyhow::Result<()> {
        let base = self.mcp_url.strip_suffix("/mcp").unwrap_or(&self.mcp_url);
        let url = format!("{base}/healthz");
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match client.get(&url).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::OK => return Ok(()),
                Ok(r) if Instant::now() > deadline => bail!("{url} answered {}", r.status()),
                Err(e) if Instant::now() > deadline => bail!("{url} did not answer: {e}"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Peak resident set size of the server so far (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no VmHWM line in {path}"))?;
        Ok(kib / 1024.0)
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after a timeout).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).context("pid out of range")?;
        // SAFETY: kill(2) with a pid of our own child, which we have not reaped yet.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("cannot send SIGTERM to {}: {}", self.pid, std::io::Error::last_os_error());
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("tether-bench: server {} exited with {status} after SIGTERM", self.pid);
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("server {} ignored SIGTERM for {STOP_TIMEOUT:?} and was killed", self.pid)
            }
        }
    }
}

/// The first `http://…/mcp` URL in a log line, if any.
fn mcp_url_in(line: &str) -> Option<String> {
    let start = line.find("http://")?;
    let url: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || ":/.-_[]%".contains(*c))
        .collect();
    url.ends_with("/mcp").then_some(url)
}

#[cfg(test)]
mod tests {
    use super::mcp_url_in;

    #[test]
    fn finds_the_url_in_a_log_line() {
        let line = "2026-01-01T00:00:00Z  INFO tether::serve: tether listening on http://127.0.0.1:4567/mcp local=127.0.0.1:4567";
        assert_eq!(mcp_url_in(line).as_deref(), Some("http://127.0.0.1:4567/mcp"));
        assert_eq!(mcp_url_in("INFO authentication is off"), None);
    }
}
