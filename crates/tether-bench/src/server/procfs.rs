//! What `/proc` says about a started server: its resident set size (now
//! and peak), its live child processes and theirs.

use std::time::Duration;

use anyhow::Context;

use super::process::Server;

impl Server {
    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        kib_field(&status, field).with_context(|| format!("no {field} line in {path}"))
    }

    /// Peak resident set size of the server so far (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        Ok(self.status_kib("VmHWM:")? as f64 / 1024.0)
    }

    /// Resident set size now (VmRSS), in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmRSS:")? * 1024)
    }

    /// How many live child processes it has (those whose parent it is,
    /// zombies not counted).
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

    /// The PIDs of its live child processes, found by reading every `/proc/PID/stat`.
    fn children(&self) -> anyhow::Result<Vec<u32>> {
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
    use super::{kib_field, state_and_parent};

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
