//! What `/proc` says about a started server: its resident set size (now
//! and peak), its CPU time, its live child processes and theirs.
//!
//! A tether started with its keeper (`tether serve`) is two processes: the
//! keeper, the bench's child, and the engine, the keeper's child whose
//! argv[1] is `engine`. The server's RSS and CPU are both of theirs summed
//! (what `--no-keeper`'s one process holds or spends), and its children
//! are the keeper's others (the stdio upstreams), the engine not counted.

use std::time::Duration;

use anyhow::Context;

use super::process::Server;

impl Server {
    fn status_kib_of(pid: u32, field: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        kib_field(&status, field).with_context(|| format!("no {field} line in {path}"))
    }

    /// `field` of every process of the server ([`Self::processes`]) summed, in KiB.
    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        self.processes()?.into_iter().map(|pid| Self::status_kib_of(pid, field)).sum()
    }

    /// Peak resident set size of the server so far (VmHWM; with a keeper,
    /// the keeper's and the current engine's summed), in MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        Ok(self.status_kib("VmHWM:")? as f64 / 1024.0)
    }

    /// Resident set size now (VmRSS; with a keeper, the keeper's and the engine's summed), in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmRSS:")? * 1024)
    }

    /// The resident set size of the process the bench started alone (with
    /// a keeper: the keeper's, not its engine's), in bytes, and its peak.
    pub fn own_rss_bytes(&self) -> anyhow::Result<(u64, u64)> {
        Ok((Self::status_kib_of(self.pid, "VmRSS:")? * 1024, Self::status_kib_of(self.pid, "VmHWM:")? * 1024))
    }

    /// The server's processes: the one the bench started and, when that is
    /// tether's keeper, its engine.
    pub fn processes(&self) -> anyhow::Result<Vec<u32>> {
        let mut pids = vec![self.pid];
        pids.extend(self.engine_pid()?);
        Ok(pids)
    }

    /// The engine the server's keeper runs now (its child whose argv[1] is
    /// `engine`); `None` without a keeper (`--no-keeper`, a server that is
    /// not tether) or while none runs.
    pub fn engine_pid(&self) -> anyhow::Result<Option<u32>> {
        Ok(self.own_children()?.into_iter().find(|&pid| is_engine(pid)))
    }

    /// The server's CPU time so far (user + system; with a keeper, the
    /// keeper's and the current engine's summed).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let mut total = Duration::ZERO;
        for pid in self.processes()? {
            total += crate::load::cpu_time(&pid.to_string()).with_context(|| format!("cannot read /proc/{pid}/stat"))?;
        }
        Ok(total)
    }

    /// How many live child processes it has (those whose parent it is,
    /// zombies and a keeper's engine not counted).
    pub fn live_children(&self) -> anyhow::Result<usize> {
        Ok(self.children()?.len())
    }

    /// Its live children's resident set sizes (VmRSS) summed, in bytes: a
    /// child that exits between the listing and the read counts nothing.
    pub fn children_rss_bytes(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for pid in self.children()? {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                total += kib_field(&status, "VmRSS:").unwrap_or(0) * 1024;
            }
        }
        Ok(total)
    }

    /// The PIDs of its live child processes but a keeper's engine: with a
    /// keeper, the stdio upstreams it holds.
    pub fn children(&self) -> anyhow::Result<Vec<u32>> {
        Ok(self.own_children()?.into_iter().filter(|&pid| !is_engine(pid)).collect())
    }

    /// The PIDs of every live process under it (its children, theirs, …),
    /// zombies not counted: with a keeper, the engine too.
    pub fn descendants(&self) -> anyhow::Result<Vec<u32>> {
        let parents = live_parents()?;
        let mut found = Vec::new();
        let mut frontier = vec![self.pid];
        while let Some(parent) = frontier.pop() {
            for &(pid, ppid) in &parents {
                if ppid == parent && !found.contains(&pid) {
                    found.push(pid);
                    frontier.push(pid);
                }
            }
        }
        Ok(found)
    }

    /// The PIDs of every live child process, found by reading every `/proc/PID/stat`.
    fn own_children(&self) -> anyhow::Result<Vec<u32>> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
            let entry = entry?;
            if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            // A process may exit between the listing and the read.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some((state, ppid)) = state_and_parent(&stat)
                && ppid == self.pid
                && state != "Z"
                && let Ok(pid) = entry.file_name().to_string_lossy().parse()
            {
                pids.push(pid);
            }
        }
        Ok(pids)
    }
}

/// Every live process (not a zombie) with its parent, from every `/proc/PID/stat`.
fn live_parents() -> anyhow::Result<Vec<(u32, u32)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        // A process may exit between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some((state, ppid)) = state_and_parent(&stat)
            && state != "Z"
        {
            found.push((pid, ppid));
        }
    }
    Ok(found)
}

/// Whether process `pid` is still alive (a zombie, or gone, is not).
pub(super) fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| state_and_parent(&stat).map(|(state, _)| state != "Z"))
        .unwrap_or(false)
}

/// Whether process `pid` is a tether engine (its argv[1] is `engine`); a
/// process that is gone is not.
fn is_engine(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| second_argument_is_engine(&cmdline))
}

/// Whether a `/proc/PID/cmdline` (arguments ended by NUL) has `engine` as argv[1].
fn second_argument_is_engine(cmdline: &[u8]) -> bool {
    cmdline.split(|&b| b == 0).nth(1) == Some(b"engine".as_slice())
}

/// A `FIELD:  1234 kB` line of a `/proc/PID/status` text, in KiB.
fn kib_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

/// The state and parent PID in a `/proc/PID/stat` line (after the command
/// name, which sits in parentheses and may hold spaces).
fn state_and_parent(stat: &str) -> Option<(&str, u32)> {
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let state = fields.next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Resident bytes after letting the server settle.
pub(crate) async fn settled_rss(server: &Server) -> anyhow::Result<u64> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.rss_bytes()
}

#[cfg(test)]
mod tests {
    use super::{kib_field, second_argument_is_engine, state_and_parent};

    #[test]
    fn an_engine_has_engine_as_its_first_argument() {
        assert!(second_argument_is_engine(b"/usr/bin/tether\0engine\0--listen\x00127.0.0.1:0\0"));
        assert!(!second_argument_is_engine(b"/usr/bin/tether\0serve\0engine\0"));
        assert!(!second_argument_is_engine(b"/t/stdio_echo\0"));
        assert!(!second_argument_is_engine(b""));
    }

    #[test]
    fn reads_the_state_and_parent_of_a_proc_stat_line() {
        assert_eq!(state_and_parent("4242 (stdio echo) S 17 4242 17 0 -1"), Some(("S", 17)));
        assert_eq!(state_and_parent("4243 (a) b) Z 17 1"), Some(("Z", 17)));
        assert_eq!(state_and_parent("garbage"), None);
    }

    #[test]
    fn reads_a_kib_field_of_proc_status() {
        let status = "Name:\tstdio_echo\nVmHWM:\t    2100 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(kib_field(status, "VmRSS:"), Some(2048));
        assert_eq!(kib_field(status, "VmSwap:"), None);
    }
}
