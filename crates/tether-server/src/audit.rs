//! [`AuditLog`]: every policy decision as a JSON line in a file
//! (`--audit-log PATH`): `time`, `principal`, `endpoint`, `method`, `kind`,
//! `name`, `decision` (`allow`, `deny`, or `hidden` for an item left out of
//! a list), `rule` (the expression that decided; `null` when no rule covers
//! the use; for a resource URI that cannot be normalised, a sentence
//! saying why), for a denial naming them, `scopes`, and for a use a virtual
//! server serves from a member, `member` and `member_name` (the member's
//! endpoint and its own name for it; the rule may be the member's).
//!
//! Invariant: recording never blocks a request and never grows without
//! bound. Lines go through a bounded queue (16,384 lines, 64 MiB) to a
//! writer thread of their own, which appends each batch with one write;
//! when the queue is full a line is dropped, never waited for.
//!
//! Nothing is lost silently: every line that does not reach the file (the
//! queue full, a failed write, no file to write to) is counted in
//! `tether_audit_dropped_total`, every failed write in
//! `tether_audit_write_errors_total`, and while the last write failed
//! `tether_audit_failing` is 1 and `/healthz` says `"audit": "failing"`
//! ([`health`]); the first failure is logged as an error, the return as
//! info with the count lost meanwhile. A line cut by a failed write is
//! ended before the next one, so every other line stays whole JSON.
//!
//! The file is created 0600 (its folder 0700 when tether makes it) and only
//! ever appended to. It is opened anew on [`AuditLog::reopen`] (SIGHUP), and
//! when the path no longer names the open file (removed, or renamed by a
//! rotation): the writer compares the path's device and inode with the open
//! file's before a write at most once a second, and after every failed
//! write (then writing what failed into the new file once). So after a
//! removal without SIGHUP, at most a second of lines still goes to the
//! removed file.
//!
//! The latest decisions are also kept in memory for the admin API's
//! `GET /admin/audit` ([`AuditLog::recent`]): a ring of at most
//! [`RECENT_LINES`] lines and [`RECENT_BYTES`] bytes, the oldest going
//! first; a line longer than [`RECENT_LINE_BYTES`] is kept with its `name`
//! cut (it is whole in the file).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::app::Origin;
use crate::policy::{Decision, Target};

/// Lines waiting for the writer at most; beyond, lines are dropped and counted.
const QUEUE: usize = 16_384;
/// Bytes of the lines waiting for the writer at most (a line holds names
/// and URIs a client chose); beyond, lines are dropped and counted.
const QUEUE_BYTES: usize = 64 << 20;
/// Bytes one write gathers (at least one line, whatever its size).
const BATCH_BYTES: usize = 1 << 20;
/// How often, at most, the writer checks that the path still names its file.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Decisions kept in memory for `GET /admin/audit` at most...
pub const RECENT_LINES: usize = 1000;
/// ...and their bytes at most.
pub const RECENT_BYTES: usize = 4 << 20;
/// A line kept in memory longer than this has its `name` cut.
pub const RECENT_LINE_BYTES: usize = 4096;

/// Audit logs whose writer runs in this process, and those of them failing (see [`health`]).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static FAILING: AtomicUsize = AtomicUsize::new(0);

/// What `/healthz` says of the audit log: `None` without one, else `ok`,
/// or `failing` while its last write failed (lines are being lost).
pub fn health() -> Option<&'static str> {
    match (RUNNING.load(Ordering::Relaxed), FAILING.load(Ordering::Relaxed)) {
        (0, _) => None,
        (_, 0) => Some("ok"),
        _ => Some("failing"),
    }
}

enum Message {
    Line(String),
    Reopen,
}

/// Why a line was not queued.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refused {
    Full,
    Gone,
}

/// What the handles and the writer share.
#[derive(Default)]
struct Shared {
    /// Bytes of the lines in the queue.
    queued: AtomicUsize,
    /// Lines that did not reach the file.
    dropped: AtomicU64,
    write_errors: AtomicU64,
    failing: AtomicBool,
}

impl Shared {
    fn lost(&self, lines: u64) -> u64 {
        crate::metrics::audit_dropped(lines);
        self.dropped.fetch_add(lines, Ordering::Relaxed) + lines
    }
}

/// One decision kept in memory.
struct Recent {
    principal: String,
    decision: &'static str,
    line: String,
}

/// The latest decisions, newest last (see the module doc).
#[derive(Default)]
struct RecentRing {
    lines: std::collections::VecDeque<Recent>,
    bytes: usize,
}

impl RecentRing {
    fn push(&mut self, recent: Recent) {
        self.bytes += recent.line.len() + recent.principal.len();
        self.lines.push_back(recent);
        while self.lines.len() > RECENT_LINES || self.bytes > RECENT_BYTES {
            let Some(old) = self.lines.pop_front() else { break };
            self.bytes -= old.line.len() + old.principal.len();
        }
    }
}

/// Where policy decisions are written; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    queue: SyncSender<Message>,
    shared: Arc<Shared>,
    recent: Arc<parking_lot::Mutex<RecentRing>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dropped", &self.dropped())
            .field("write_errors", &self.write_errors())
            .field("failing", &self.is_failing())
            .finish()
    }
}

impl AuditLog {
    /// Opens `path` for appending (creating it 0600, and its folder 0700)
    /// and starts its writer; fails with a message naming the file.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = Opened::open(path).map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))?;
        let (queue, lines) = std::sync::mpsc::sync_channel(QUEUE);
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            path: path.to_path_buf(),
            shown: path.display().to_string(),
            file: Some(file),
            checked: Instant::now(),
            failing: false,
            lost_while_failing: 0,
            shared: shared.clone(),
        };
        RUNNING.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new().name("tether-audit".into()).spawn(move || writer.run(lines)).map_err(|e| {
            RUNNING.fetch_sub(1, Ordering::Relaxed);
            format!("cannot start the audit log's writer: {e}")
        })?;
        Ok(Self { queue, shared, recent: Arc::default() })
    }

    /// Records one decision (see the module doc for the fields).
    pub fn record(
        &self,
        endpoint: &str,
        method: &str,
        target: Target<'_>,
        origin: Option<&Origin>,
        principal: &str,
        decision: &Decision,
    ) {
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
        if let Some(origin) = origin {
            line["member"] = json!(origin.endpoint);
            line["member_name"] = json!(origin.name);
        }
        let text = line.to_string();
        let kept = if text.len() <= RECENT_LINE_BYTES {
            text.clone()
        } else {
            let name: String = target.name().chars().take(200).collect();
            line["name"] = json!(format!("{name}… (cut: the whole name is in the audit file)"));
            if let Some(origin) = origin {
                line["member_name"] = json!(origin.name.chars().take(200).collect::<String>());
            }
            line["principal"] = json!(principal.chars().take(200).collect::<String>());
            line.to_string()
        };
        self.recent.lock().push(Recent { principal: principal.to_owned(), decision: verdict, line: kept });
        self.send(text);
    }

    /// The latest decisions kept in memory, newest first, at most `limit`,
    /// of `principal` and with `decision` (`allow`, `deny`, `hidden`) where given.
    pub fn recent(&self, principal: Option<&str>, decision: Option<&str>, limit: usize) -> Vec<serde_json::Value> {
        let ring = self.recent.lock();
        ring.lines
            .iter()
            .rev()
            .filter(|r| principal.is_none_or(|p| p == r.principal) && decision.is_none_or(|d| d == r.decision))
            .take(limit)
            .filter_map(|r| serde_json::from_str(&r.line).ok())
            .collect()
    }

    /// Queues `line` for the writer, or drops and counts it.
    fn send(&self, line: String) {
        let len = line.len();
        let queued = self.shared.queued.fetch_add(len, Ordering::Relaxed) + len;
        let refused = if queued > QUEUE_BYTES {
            Some(Refused::Full)
        } else {
            match self.queue.try_send(Message::Line(line)) {
                Ok(()) => None,
                Err(TrySendError::Full(_)) => Some(Refused::Full),
                Err(TrySendError::Disconnected(_)) => Some(Refused::Gone),
            }
        };
        let Some(why) = refused else { return };
        self.shared.queued.fetch_sub(len, Ordering::Relaxed);
        let n = self.shared.lost(1);
        if why == Refused::Gone && !self.shared.failing.swap(true, Ordering::Relaxed) {
            // The writer ended, which only a bug does while a handle lives: say so.
            crate::metrics::audit_failing(FAILING.fetch_add(1, Ordering::Relaxed) + 1 > 0);
        }
        if n.is_power_of_two() {
            match why {
                Refused::Full => {
                    tracing::warn!(dropped = n, "the audit log's writer falls behind: decisions dropped from the audit log")
                }
                Refused::Gone => {
                    tracing::error!(dropped = n, "the audit log's writer is gone: decisions dropped from the audit log")
                }
            }
        }
    }

    /// Asks the writer to open the path anew (SIGHUP, after a rotation):
    /// at once if the queue has room, else before its next write.
    pub fn reopen(&self) {
        if let Err(TrySendError::Full(_)) = self.queue.try_send(Message::Reopen) {
            // The writer is busy: it checks the path within a second anyway.
            tracing::debug!("the audit log's queue is full; it is reopened with its next check");
        }
    }

    /// Lines that did not reach the file (see the module doc).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Writes that failed.
    pub fn write_errors(&self) -> u64 {
        self.shared.write_errors.load(Ordering::Relaxed)
    }

    /// Whether the last write failed.
    pub fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::Relaxed)
    }
}

/// The file open for appending, and which file it is.
struct Opened {
    file: std::fs::File,
    /// Its device and inode.
    id: (u64, u64),
    /// A failed write cut a line: the next write starts on a new line.
    torn: bool,
}

impl Opened {
    fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        let meta = file.metadata()?;
        Ok(Self { file, id: (meta.dev(), meta.ino()), torn: false })
    }
}

/// The device and inode `path` names now.
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// The writer thread's state.
struct Writer {
    path: PathBuf,
    shown: String,
    /// `None` while the path cannot be opened.
    file: Option<Opened>,
    /// When the path was last compared with the open file (or an open tried).
    checked: Instant,
    failing: bool,
    lost_while_failing: u64,
    shared: Arc<Shared>,
}

impl Writer {
    /// Writes batches until every [`AuditLog`] is dropped.
    fn run(mut self, queue: Receiver<Message>) {
        let mut batch = Vec::new();
        let mut ends = Vec::new();
        while let Ok(first) = queue.recv() {
            let mut reopen = false;
            let mut next = Some(first);
            while let Some(message) = next {
                match message {
                    Message::Reopen => reopen = true,
                    Message::Line(line) => {
                        self.shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
                        batch.extend_from_slice(line.as_bytes());
                        batch.push(b'\n');
                        ends.push(batch.len());
                    }
                }
                next = if batch.len() < BATCH_BYTES { queue.try_recv().ok() } else { None };
            }
            if reopen || self.checked.elapsed() >= CHECK_EVERY {
                self.check(if reopen { "SIGHUP" } else { "check" });
            }
            if !ends.is_empty() {
                self.write(&batch, &ends);
            }
            batch.clear();
            ends.clear();
            if batch.capacity() > 2 * BATCH_BYTES {
                batch = Vec::new();
            }
        }
        if self.failing {
            self.set_failing(false);
        }
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }

    /// Opens the path anew unless it still names the open file.
    fn check(&mut self, why: &str) {
        self.checked = Instant::now();
        let at_path = identity(&self.path);
        if let (Some(open), Ok(id)) = (&self.file, &at_path)
            && open.id == *id
        {
            return;
        }
        match Opened::open(&self.path) {
            Ok(file) => {
                tracing::info!(file = %self.shown, why, "the audit log is opened anew (removed, rotated, or not open)");
                self.file = Some(file);
            }
            Err(e) => {
                // The open file is written on only while nothing says the path names another.
                let unknown = matches!(&at_path, Err(e) if e.kind() != std::io::ErrorKind::NotFound);
                if !(unknown && self.file.is_some()) {
                    self.file = None;
                }
                if !self.failing {
                    tracing::error!(file = %self.shown, error = %e, "cannot open the audit log anew");
                }
            }
        }
    }

    /// Writes a batch of lines (`ends`: where each ends in `batch`); what
    /// cannot be written is counted.
    fn write(&mut self, batch: &[u8], ends: &[usize]) {
        let mut written = 0;
        let mut retried = false;
        let error = loop {
            let Some(open) = self.file.as_mut() else {
                break std::io::Error::new(std::io::ErrorKind::NotFound, "the audit log could not be opened");
            };
            match write_batch(&mut open.file, &mut open.torn, batch, ends, &mut written) {
                Ok(()) => {
                    if self.failing {
                        self.set_failing(false);
                        tracing::info!(
                            file = %self.shown,
                            lost = self.lost_while_failing,
                            "the audit log is written again; the lines lost meanwhile are counted in tether_audit_dropped_total"
                        );
                    }
                    return;
                }
                Err(e) if retried => break e,
                Err(e) => {
                    // Has the path come to name another file (removed, rotated, replaced)? Then write the rest there.
                    retried = true;
                    let before = open.id;
                    self.check("a failed write");
                    match &self.file {
                        Some(open) if open.id != before => {
                            written = ends.iter().rev().find(|end| **end <= written).copied().unwrap_or(0);
                        }
                        _ => break e,
                    }
                }
            }
        };
        let lost = ends.iter().filter(|end| **end > written).count() as u64;
        self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
        crate::metrics::audit_write_error();
        self.shared.lost(lost);
        let before = self.lost_while_failing;
        self.lost_while_failing += lost;
        if !self.failing {
            self.set_failing(true);
            tracing::error!(
                file = %self.shown,
                error = %error,
                lost,
                "cannot write the audit log: decisions are being lost (counted in tether_audit_dropped_total) until it can be written again"
            );
        } else if before.checked_ilog2() != self.lost_while_failing.checked_ilog2() {
            tracing::warn!(file = %self.shown, error = %error, lost = self.lost_while_failing, "the audit log still cannot be written");
        }
    }

    fn set_failing(&mut self, failing: bool) {
        self.failing = failing;
        self.shared.failing.store(failing, Ordering::Relaxed);
        let now = if failing { FAILING.fetch_add(1, Ordering::Relaxed) + 1 } else { FAILING.fetch_sub(1, Ordering::Relaxed) - 1 };
        crate::metrics::audit_failing(now > 0);
    }
}

/// Writes `batch[*written..]` to `out`, after a newline if a failed write
/// left a line cut (`torn`). On an error, `written` says how far it got, and
/// `torn` whether that cut a line (`ends`: where each line ends).
fn write_batch(out: &mut impl Write, torn: &mut bool, batch: &[u8], ends: &[usize], written: &mut usize) -> std::io::Result<()> {
    if *torn {
        out.write_all(b"\n")?;
        *torn = false;
    }
    while *written < batch.len() {
        match out.write(&batch[*written..]) {
            Ok(0) => {
                *torn = *written > 0 && !ends.contains(written);
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            Ok(n) => *written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                *torn = *written > 0 && !ends.contains(written);
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    /// The `name`s of the JSON lines of `path` (none when it does not exist).
    fn names(path: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .filter_map(|l| l["name"].as_str().map(str::to_owned))
            .collect()
    }

    fn deny(audit: &AuditLog, name: &str) {
        let deny = Decision::Deny { rules: vec!["false".into()], scopes: vec![] };
        audit.record("", "resources/read", Target::Resource(name), None, "bob", &deny);
    }

    /// Waits (polling, within a generous deadline) until `ready` holds.
    fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = deadline();
        while !ready() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn decisions_are_appended_as_json_lines_in_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/audit.jsonl");
        let audit = AuditLog::open(&path).unwrap();
        let deny = Decision::Deny { rules: vec!["\"w\" in jwt.scope".into()], scopes: vec!["w".into()] };
        audit.record("fx", "tools/call", Target::Tool("write"), None, "svc@http://as", &deny);
        audit.record("", "tools/list", Target::Tool("write"), None, "svc@http://as", &deny);
        audit.record("", "resources/read", Target::Resource("file:///a"), None, "bob", &Decision::Allow { rules: vec![] });
        drop(audit);
        // The writer ends once every handle is gone; wait for its last write.
        let deadline = deadline();
        let lines: Vec<serde_json::Value> = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<_> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            if lines.len() == 3 || Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(Duration::from_millis(10));
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

    #[test]
    fn a_removed_file_is_created_again_and_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = AuditLog::open(&path).unwrap();
        deny(&audit, "before");
        wait_until("the first line is written", || names(&path) == ["before"]);
        std::fs::remove_file(&path).unwrap();
        // Decisions go on; within about a second the path is checked and opened anew.
        let mut n = 0;
        wait_until("a line lands in a new file at the path", || {
            n += 1;
            deny(&audit, &format!("after-{n}"));
            std::thread::sleep(Duration::from_millis(10));
            names(&path).iter().any(|name| name.starts_with("after-"))
        });
        assert_eq!((audit.dropped(), audit.write_errors(), audit.is_failing()), (0, 0, false));
    }

    #[test]
    fn reopen_opens_the_path_anew_at_once_after_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let rotated = dir.path().join("audit.jsonl.1");
        let audit = AuditLog::open(&path).unwrap();
        deny(&audit, "before");
        wait_until("the first line is written", || names(&path) == ["before"]);
        std::fs::rename(&path, &rotated).unwrap();
        audit.reopen();
        wait_until("the path is created again", || path.exists());
        deny(&audit, "after");
        wait_until("the next line is in the new file", || names(&path) == ["after"]);
        assert_eq!(names(&rotated), ["before"]);
        // Reopening what is still the file at the path changes nothing.
        audit.reopen();
        deny(&audit, "again");
        wait_until("the line after is in the same file", || names(&path) == ["after", "again"]);
    }

    #[test]
    fn failed_writes_are_counted_with_the_lines_they_lose_until_one_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        // A full disk: every write to /dev/full fails with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let audit = AuditLog::open(&path).unwrap();
        for n in 0..5 {
            deny(&audit, &format!("lost-{n}"));
        }
        wait_until("five lines are counted lost", || audit.dropped() == 5);
        assert!(audit.write_errors() >= 1);
        assert!(audit.is_failing());
        assert_eq!(health(), Some("failing"), "no other test's log fails");

        // Room again: the failed write finds the path names another file, and writes there.
        std::fs::remove_file(&path).unwrap();
        deny(&audit, "kept");
        wait_until("the next line is written", || names(&path) == ["kept"]);
        assert!(!audit.is_failing());
        assert_eq!(audit.dropped(), 5, "{audit:?}");
    }

    /// Accepts `room` bytes, then fails as a full disk does.
    struct Disk {
        written: Vec<u8>,
        room: usize,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room - self.written.len());
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_cut_in_a_line_counts_what_was_written_and_ends_the_cut_line_first() {
        let batch = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n";
        let ends = [8, 16, 24];
        let mut disk = Disk { written: Vec::new(), room: 12 };
        let (mut torn, mut written) = (false, 0);
        assert!(write_batch(&mut disk, &mut torn, batch, &ends, &mut written).is_err());
        assert_eq!((written, torn), (12, true), "one line whole, the second cut");
        assert_eq!(ends.iter().filter(|end| **end > written).count(), 2, "two lines lost");

        disk.room = 100;
        let (mut written, next) = (0, b"{\"d\":4}\n");
        write_batch(&mut disk, &mut torn, next, &[8], &mut written).unwrap();
        assert!(!torn);
        let text = String::from_utf8(disk.written).unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"b\"\n{\"d\":4}\n", "the cut line ended, the next one whole");

        let mut disk = Disk { written: Vec::new(), room: 8 };
        let (mut torn, mut written) = (false, 0);
        assert!(write_batch(&mut disk, &mut torn, batch, &ends, &mut written).is_err());
        assert_eq!((written, torn), (8, false), "cut between lines: nothing to end");
    }

    #[test]
    fn the_latest_decisions_are_kept_in_a_bounded_ring_newest_first_and_filtered() {
        let dir = tempfile::tempdir().unwrap();
        let audit = AuditLog::open(&dir.path().join("audit.jsonl")).unwrap();
        let allow = Decision::Allow { rules: vec![] };
        for i in 0..RECENT_LINES + 5 {
            audit.record("", "tools/call", Target::Tool(&format!("t{i}")), None, "alice", &allow);
        }
        deny(&audit, "file:///secret");
        let latest = audit.recent(None, None, 10);
        assert_eq!(latest.len(), 10);
        assert_eq!(latest[0]["name"], "file:///secret", "newest first");
        assert_eq!(latest[1]["name"], format!("t{}", RECENT_LINES + 4));
        assert_eq!(audit.recent(None, None, usize::MAX).len(), RECENT_LINES, "bounded");
        let denied = audit.recent(Some("bob"), Some("deny"), 10);
        assert_eq!(denied.len(), 1);
        assert!(audit.recent(Some("alice"), Some("deny"), 10).is_empty());
        // A name a client chose, huge: kept cut in memory.
        deny(&audit, &"x".repeat(100_000));
        let cut = &audit.recent(Some("bob"), None, 1)[0];
        assert!(cut["name"].as_str().is_some_and(|n| n.len() < 1000 && n.contains("cut")), "{cut}");
    }
}
