//! The Redis of tether-redis-replica and tether-redis-strict: a primary and
//! one replica of the bench's own, two `redis-server` processes on free
//! loopback ports in a temp dir, both with `--save "" --appendonly yes
//! --appendfsync always` (what `--durability strict` asks of a Redis), the
//! replica started with `--replicaof` the primary. [`RedisPair::start`]
//! returns once the primary lists the replica `state=online`; dropping the
//! pair kills both (SIGKILL, reaped) and removes their directory.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a server may take to answer `PING`, and the replica to be online.
const UP: Duration = Duration::from_secs(60);

/// The Redis program (from `PATH`).
pub const REDIS_SERVER: &str = "redis-server";

/// Persistence of both servers: no snapshots, an append-only file synced on every write.
const PERSISTENCE: [&str; 6] = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"];

/// A primary with one online replica; both are killed when it is dropped.
pub struct RedisPair {
    // Fields drop in order: the replica, the primary, then their directory.
    replica: Process,
    primary: Process,
    _dir: tempfile::TempDir,
}

impl RedisPair {
    /// Starts the primary, then its replica, and waits until the primary
    /// reports the replica `state=online` in `INFO replication`.
    pub fn start() -> anyhow::Result<RedisPair> {
        let dir = tempfile::Builder::new().prefix("tether-bench-redis-").tempdir().context("cannot create a temp dir")?;
        // The first full sync is diskless; without the delay's 0 it waits 5 s for more replicas.
        let primary = Process::start(&dir.path().join("primary"), &["--repl-diskless-sync-delay", "0"])?;
        let port = primary.port.to_string();
        let replica = Process::start(&dir.path().join("replica"), &["--replicaof", "127.0.0.1", &port])?;
        let mut pair = RedisPair { replica, primary, _dir: dir };
        pair.wait_online()?;
        Ok(pair)
    }

    /// `redis://127.0.0.1:PORT/` of the primary.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.primary.port)
    }

    fn wait_online(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + UP;
        loop {
            let info = self.primary.cli(&["INFO", "replication"]).unwrap_or_default();
            if replica_online(&info, self.replica.port) {
                return Ok(());
            }
            self.primary.check_alive()?;
            self.replica.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "the replica on port {} was not online at the primary on port {} within {UP:?}: {}\nthe replica's log:\n{}",
                    self.replica.port,
                    self.primary.port,
                    info.trim(),
                    self.replica.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `INFO replication` of a primary lists a replica on `port` with `state=online`.
fn replica_online(info: &str, port: u16) -> bool {
    let port = format!("port={port}");
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains(":ip="))
        .any(|l| l.trim().split(',').any(|kv| kv == port) && l.contains("state=online"))
}

/// One `redis-server` child, killed and reaped when dropped.
struct Process {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Process {
    /// `redis-server` on a free loopback port with its directory `dir`
    /// (created) and log file there, the persistence flags and `extra`;
    /// returns once it answers `PING`.
    fn start(dir: &Path, extra: &[&str]) -> anyhow::Result<Process> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let port = crate::server::free_port()?;
        let log = dir.join("redis.log");
        let child = Command::new(REDIS_SERVER)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(PERSISTENCE)
            .args(extra)
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {REDIS_SERVER}"))?;
        let mut process = Process { child, port, log };
        let deadline = Instant::now() + UP;
        while process.cli(&["PING"]).ok().as_deref().map(str::trim) != Some("PONG") {
            process.check_alive()?;
            if Instant::now() > deadline {
                bail!("{REDIS_SERVER} on port {port} did not answer PING within {UP:?}; its log:\n{}", process.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(process)
    }

    /// An error (with its log) if the process has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait().context("cannot wait for redis-server")? {
            bail!("{REDIS_SERVER} on port {} exited ({status}); its log:\n{}", self.port, self.log_tail());
        }
        Ok(())
    }

    /// `redis-cli -h 127.0.0.1 -p PORT ARGS…`'s stdout.
    fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .context("cannot run redis-cli")?;
        anyhow::ensure!(out.status.success(), "redis-cli {args:?} on port {} failed", self.port);
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The last lines of its log file.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::replica_online;

    #[test]
    fn a_replica_is_online_only_on_its_own_port_and_state() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                    slave0:ip=127.0.0.1,port=40001,state=online,offset=42,lag=0\r\nmaster_repl_offset:42\r\n";
        assert!(replica_online(info, 40001));
        assert!(!replica_online(info, 4000), "port 4000 is not port 40001");
        assert!(!replica_online(&info.replace("state=online", "state=wait_bgsave"), 40001));
        assert!(!replica_online("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n", 40001));
    }
}
