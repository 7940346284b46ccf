//! What a child's tasks and its connection share ([`Shared`]): the
//! requests waiting for an answer (by the connection's own ids), those
//! given up lately, and the reading of one line the child wrote on stdout:
//! an answer to the request waiting for it, a message of the child's own to
//! the caller's [`PeerSink`], an unreadable line to the request it names
//! (or counted and logged, bounded).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tether_wire::ndjson;
use tether_wire::{RpcError, envelope};
use tokio::sync::oneshot;

use crate::burst::{Admit, Burst};
use crate::upstream::{PeerMessage, PeerSink, UpstreamError, UpstreamResult};

/// Requests waiting for one child's answer, at most (the engine bounds
/// requests per session far lower, and a pooled child serves one request
/// at a time; this only keeps a broken caller bounded).
const MAX_PENDING: usize = 1024;
/// Recently given-up request ids remembered, so the child's late answer to
/// one is expected rather than warned about.
const RECENTLY_GIVEN_UP: usize = 64;
/// Warnings about unreadable stdout lines per [`UNREADABLE_WINDOW`] at most.
const UNREADABLE_PER_WINDOW: u32 = 5;
const UNREADABLE_WINDOW: Duration = Duration::from_secs(60);

/// What the tasks and the upstream share (never the upstream itself: its
/// drop is what stops the child).
pub(crate) struct Shared {
    pub(crate) upstream: String,
    pub(crate) session: SessionTag,
    /// The command as typed, for messages.
    pub(crate) command: String,
    pub(crate) alive: AtomicBool,
    pending: Mutex<Pending>,
    pub(super) last_stderr: Mutex<Option<String>>,
    /// Warnings about unreadable lines (bounded per window).
    unreadable: Mutex<Burst>,
    /// A kept child's frames: an answer's frame is held until the client's
    /// final response is stored.
    pub(crate) frames: Option<Arc<crate::stdio::kept::Frames>>,
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

pub(crate) type Answer = UpstreamResult;

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    given_up: VecDeque<u64>,
    /// The connection is gone: nothing new waits.
    ended: bool,
}

impl Shared {
    /// The state of a child's connection, for `upstream` (named `command`)
    /// serving `session`; `frames` for a kept child.
    pub(crate) fn new(upstream: &str, session: &str, command: String, frames: Option<Arc<crate::stdio::kept::Frames>>) -> Self {
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

    pub(super) fn register(&self, id: u64, tx: oneshot::Sender<Answer>) -> Result<(), UpstreamError> {
        let mut pending = self.pending.lock();
        if pending.ended {
            return Err(self.gone());
        }
        if pending.waiting.len() >= MAX_PENDING {
            return Err(RpcError::internal(format!(
                "upstream {} has {MAX_PENDING} requests in flight already; try again when some have finished",
                self.upstream
            ))
            .into());
        }
        pending.waiting.insert(id, tx);
        Ok(())
    }

    /// Removes a request nobody waits for any more; true if it was still waiting.
    pub(super) fn give_up(&self, id: u64) -> bool {
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
                let _ = tx.send(Err(RpcError::internal(format!("upstream {} answered with {why}", self.upstream)).into()));
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
            let _ = tx.send(Err(UpstreamError::Restarted));
        }
    }

    /// The error of a request that found the connection gone (not sent).
    pub(crate) fn gone(&self) -> UpstreamError {
        UpstreamError::NotRunning(format!(
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

    /// If `line` is an answer with a result to one of our requests, hands
    /// it over (after `before`) and says `true`; else `false`, nothing done.
    /// Never waits: the keeper socket's reader calls it.
    pub(crate) fn try_answer(&self, line: &[u8], before: impl FnOnce()) -> bool {
        let Ok(Some(parts)) = envelope::Parts::read(line) else { return false };
        let Some((id, result)) = result_for_us(&parts) else { return false };
        before();
        self.answered(&json!(id), Ok(result.to_owned()));
        true
    }

    /// One line the child wrote on stdout, read once. A message of the
    /// child's own is delivered before the next line is read (a slow
    /// delivery back-pressures the child: it blocks on a full stdout pipe).
    pub(crate) async fn dispatch(&self, line: &[u8], sink: &dyn PeerSink) {
        let message = match envelope::Parts::read(line) {
            Ok(Some(parts)) => {
                // The common case, an answer to one of our requests: its
                // result kept as the child wrote it (no field reordered).
                if let Some((id, result)) = result_for_us(&parts) {
                    self.answered(&json!(id), Ok(result.to_owned()));
                    return;
                }
                parts.into_message()
            }
            // Not an object: the strict reading says what it is instead.
            Ok(None) => envelope::parse_message(line),
            Err(e) => Err(e),
        };
        match message.map(PeerMessage::from_inbound) {
            Ok(Ok(own)) => sink.deliver(own).await,
            Ok(Err((id, Ok(result)))) => {
                let raw = serde_json::value::to_raw_value(&result)
                    .map_err(|e| RpcError::internal(format!("upstream {}: unreadable result: {e}", self.upstream)).into());
                self.answered(&id, raw);
            }
            Ok(Err((id, Err(error)))) => self.answered(&id, Err(RpcError::from_object(&error).into())),
            Err(e) => self.unreadable(line, line, &format!("a line on stdout that is not a JSON-RPC message ({})", e.message)),
        }
    }
}

/// An answer with a result to one of our (numbered) requests, its result
/// left unparsed; `None` for anything else, which is read the strict way.
fn result_for_us<'a>(parts: &envelope::Parts<'a>) -> Option<(u64, &'a RawValue)> {
    let result = parts.result.filter(|_| parts.method.is_none() && parts.error.is_none() && parts.is_2_0())?;
    let id = serde_json::from_str::<u64>(parts.id?.get()).ok()?;
    Some((id, result))
}

/// Our ids are numbers; a child that echoes them as strings is forgiven.
pub(crate) fn our_id(id: &Value) -> Option<u64> {
    id.as_u64().or_else(|| id.as_str().and_then(|s| s.parse().ok()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_without_parsing_their_result() {
        let read = |line: &'static [u8]| envelope::Parts::read(line).unwrap().unwrap();
        let parts = read(br#"{"jsonrpc":"2.0","id":7,"result":{"z":1,"a":[1,2]}}"#);
        assert_eq!(result_for_us(&parts).map(|(id, r)| (id, r.get())), Some((7, r#"{"z":1,"a":[1,2]}"#)));
        // Anything else goes the strict way.
        assert!(result_for_us(&read(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#)).is_none());
        assert!(result_for_us(&read(br#"{"jsonrpc":"2.0","id":7,"method":"x","result":{}}"#)).is_none());
        assert!(result_for_us(&read(br#"{"jsonrpc":"1.0","id":7,"result":{}}"#)).is_none());
        assert!(result_for_us(&read(br#"{"jsonrpc":"2.0","id":7,"result":{},"error":{}}"#)).is_none());
    }

    #[test]
    fn previews_are_bounded_and_printable() {
        assert_eq!(preview(b"ab\x1bc", 10), "abc");
        assert_eq!(preview(b"abcdef", 3), "abc…");
    }
}
