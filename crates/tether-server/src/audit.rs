//! [`AuditLog`]: every policy decision as a JSON line in a file
//! (`--audit-log PATH`): `time`, `principal`, `endpoint`, `method`, `kind`,
//! `name`, `decision` (`allow`, `deny`, or `hidden` for an item left out of
//! a list), `rule` (the expression that decided; `null` when no rule covers
//! the use) and, for a denial naming them, `scopes`.
//!
//! Invariant: recording never blocks a request and never grows without
//! bound. Lines go through a bounded queue to a writer thread of their own,
//! which appends and flushes them; when the queue is full a line is dropped
//! and counted (`tether_audit_dropped_total`, and a warning), never waited
//! for. The file is created 0600 (its folder 0700 when tether makes it) and
//! only ever appended to.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::SystemTime;

use serde_json::json;

use crate::policy::{Decision, Target};

/// Lines waiting for the writer at most; beyond, lines are dropped and counted.
const QUEUE: usize = 16_384;

/// Where policy decisions are written; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    lines: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("dropped", &self.dropped.load(Ordering::Relaxed)).finish()
    }
}

impl AuditLog {
    /// Opens `path` for appending (creating it 0600, and its folder 0700)
    /// and starts its writer; fails with a message naming the file.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = open_append(path).map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))?;
        let (lines, queue) = std::sync::mpsc::sync_channel(QUEUE);
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("tether-audit".into())
            .spawn(move || write_lines(file, queue, &shown))
            .map_err(|e| format!("cannot start the audit log's writer: {e}"))?;
        Ok(Self { lines, dropped: Arc::new(AtomicU64::new(0)) })
    }

    /// Records one decision (see the module doc for the fields).
    pub fn record(&self, endpoint: &str, method: &str, target: Target<'_>, principal: &str, decision: &Decision) {
        let (verdict, rule, scopes) = match decision {
            Decision::Allow { rules } => ("allow", rules.first(), None),
            Decision::Deny { rules, scopes } if method.ends_with("/list") => ("hidden", rules.first(), Some(scopes)),
            Decision::Deny { rules, scopes } => ("deny", rules.first(), Some(scopes)),
        };
        let mut line = json!({
            "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "principal": principal,
            "endpoint": if endpoint.is_empty() { "/mcp".to_owned() } else { format!("/mcp/{endpoint}") },
            "method": method,
            "kind": target.kind(),
            "name": target.name(),
            "decision": verdict,
            "rule": rule,
        });
        if let Some(scopes) = scopes.filter(|s| !s.is_empty()) {
            line["scopes"] = json!(scopes);
        }
        match self.lines.try_send(line.to_string()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                crate::metrics::audit_dropped();
                if n.is_power_of_two() {
                    tracing::warn!(dropped = n, "the audit log's writer falls behind: decisions dropped from the audit log");
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                crate::metrics::audit_dropped();
            }
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// The writer thread: appends every line, flushing whenever the queue is
/// empty; ends when every [`AuditLog`] is dropped.
fn write_lines(file: std::fs::File, queue: Receiver<String>, shown: &str) {
    let mut out = std::io::BufWriter::new(file);
    let mut failing = false;
    while let Ok(line) = queue.recv() {
        let mut result = writeln!(out, "{line}");
        while let Ok(line) = queue.try_recv() {
            result = result.and_then(|()| writeln!(out, "{line}"));
        }
        result = result.and_then(|()| out.flush());
        match result {
            Err(e) if !failing => {
                tracing::error!(file = %shown, error = %e, "cannot write the audit log; decisions are being lost");
                failing = true;
            }
            Ok(()) if failing => {
                tracing::info!(file = %shown, "the audit log is written again");
                failing = false;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_appended_as_json_lines_in_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/audit.jsonl");
        let audit = AuditLog::open(&path).unwrap();
        let deny = Decision::Deny { rules: vec!["\"w\" in jwt.scope".into()], scopes: vec!["w".into()] };
        audit.record("fx", "tools/call", Target::Tool("write"), "svc@http://as", &deny);
        audit.record("", "tools/list", Target::Tool("write"), "svc@http://as", &deny);
        audit.record("", "resources/read", Target::Resource("file:///a"), "bob", &Decision::Allow { rules: vec![] });
        drop(audit);
        // The writer ends once every handle is gone; wait for its last flush.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let lines: Vec<serde_json::Value> = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<_> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            if lines.len() == 3 || std::time::Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0]["endpoint"], "/mcp/fx");
        assert_eq!(lines[0]["decision"], "deny");
        assert_eq!(lines[0]["rule"], "\"w\" in jwt.scope");
        assert_eq!(lines[0]["scopes"], json!(["w"]));
        assert_eq!(lines[0]["principal"], "svc@http://as");
        assert_eq!(lines[1]["decision"], "hidden");
        assert_eq!(lines[1]["endpoint"], "/mcp");
        assert_eq!(lines[2]["kind"], "resource");
        assert_eq!(lines[2]["name"], "file:///a");
        assert_eq!(lines[2]["rule"], serde_json::Value::Null);
        assert!(lines[2]["time"].as_str().unwrap().ends_with('Z'));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }
}
