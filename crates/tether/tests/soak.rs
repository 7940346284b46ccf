//! The soak of the test command: 200 clients, each on its
//! own session, call the notebook's `thought` tool on the real `tether`
//! binary over loopback HTTP for about a minute, drop streams at random and
//! resume them with `GET` + `Last-Event-ID`, and live through one `kill -9`
//! of the server and its restart on the same SQLite file in the middle.
//!
//! What it guards:
//!
//! - **every response and every event exactly once**: the clients record
//!   every request they send and every event they read; at the end every
//!   stream they touched is replayed from its start and the history checker
//!   of the fault tests (`tether-server/tests/support/history.rs`) judges it
//!   (nothing lost, duplicated, reordered or misrouted; every request seen
//!   primed ends with exactly one final message, which for a request cut
//!   off by the kill is the stored "interrupted" `-32603`). The kill comes
//!   while clients hold primed, unanswered calls: a few sessions call `init`
//!   `list_roots` just before it, which the notebook answers only after
//!   asking `roots/list` on the call's own stream and waiting 3 s for an
//!   answer these clients never give, so the interrupted path is taken, not
//!   only hoped for (quick calls are rarely primed at all). A
//!   quarter of the clients also hold the standalone `GET` stream (resumed
//!   from its last event ID after every break) and now and then say their
//!   roots changed, so the notebook asks them `roots/list` there: each of
//!   those events comes once, in order, with no gap, as stored.
//! - **sessions outlive the process**: after the restart every client goes
//!   on with its session (no new `initialize`) and completes calls.
//! - **memory returns**: the server's RSS after the soak is at most 10 %
//!   above its RSS before. Both are `VmRSS` of the restarted process, read
//!   with the load stopped (every client between two calls, every stream
//!   closed) for two seconds. *Before* is read after the warm-up: every
//!   client's reconnection after the kill and the load until a sixteenth of
//!   the soak after it, one thought of 128 KiB per client, 64 replays 16 at
//!   a time, then the load again until a quarter of the soak after the kill
//!   (15 s by default). The long thoughts and the replays bring SQLite's
//!   bounded caches to their bounds, which the restart emptied: the writer's
//!   page cache (16 MiB, filled by what the writer writes; 200 × 128 KiB is
//!   more) and the reader pool (up to 8 connections, opened as concurrent
//!   reads need them); the load after them lets the allocator reuse what
//!   their buffers left free, so both readings follow the same steady load.
//!   Without them the comparison measures those caches filling (a third of
//!   a debug build's RSS when first measured), not memory kept. *After* is
//!   read after the rest of the load (the last quarter of the soak), before
//!   the final replay, which is not load. Both readings print the anonymous
//!   part, the threads and the SQLite connections. The allocator gives
//!   freed memory back late (mimalloc purges as a thread allocates again),
//!   so *before* is often the higher reading, by up to a sixth: the check
//!   catches memory kept by the thousands of calls of the last quarter on
//!   the order of 10 MB, not a slow drip.
//!
//! The load is paced (a pause of 500–1200 ms between one client's calls)
//! so that 200 clients run on a loaded 2-core machine and the final replay
//! of every stream stays short; timeouts only catch hangs.
//! `TETHER_SOAK_SEED=N` replays the random choices of a run (printed at its
//! start; a real server's timing still varies), `TETHER_SOAK_SECS` changes
//! the length of the load (60 s).
//!
//! Uses the binary in `TETHER_BIN` (scripts/test points it at the release
//! build) or the one cargo built for this test.

mod support;

#[path = "../../tether-server/tests/support/history.rs"]
mod history;

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use history::{History, Seen, split_id};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use support::{Client, start_binary, thought_args};
use tether_wire::sse;

const CLIENTS: usize = 200;
/// Every fourth client also holds its session's standalone stream.
const STANDALONE_EVERY: usize = 4;
/// Milliseconds one client pauses between two calls: about 200 calls a
/// second in all, which a loaded 2-core machine sustains and replays in
/// well under half a minute.
const PAUSE_MS: Range<u64> = 500..1200;
/// Length of a thought's text: a model's thinking step, short or long.
const THOUGHT_CHARS: Range<usize> = 100..3000;
/// One thought of this length per client fills the writer's page cache
/// (16 MiB) before the RSS is read the first time.
const CACHE_FILLER_CHARS: usize = 128 * 1024;
/// Replays at once before the first reading: twice the reader pool's 8
/// connections, so that it opens as many as a burst of reads makes it open.
const READ_BURST: usize = 16;
/// Calls held open (primed, unanswered) when the kill comes, from sessions
/// of their own; see [`Work::UnansweredRoots`].
const HELD_CALLS: usize = 4;
/// How long the kill waits for a client to hold a primed call.
const PRIMED_WAIT: Duration = Duration::from_secs(5);
/// Longer than any wait of a working server: reaching it means a hang.
const HANG: Duration = Duration::from_secs(30);
/// A standalone stream may be quiet until its next keep-alive (15 s).
const STANDALONE_SILENCE: Duration = Duration::from_secs(45);
/// How long a client waits before trying again after a connection error.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long the server stays dead, so that the clients do meet a dead port.
const DEAD_FOR: Duration = Duration::from_millis(500);
/// Quiet time before reading the server's RSS, for freed memory to go back.
const SETTLE: Duration = Duration::from_secs(2);
/// Replays at once at the end.
const REPLAYS_AT_ONCE: usize = 16;
const INTERRUPTED: i64 = -32603;

/// Which server the clients talk to: its `/mcp` URL and which start of the
/// binary it is (0 until the kill, 1 after the restart).
#[derive(Clone)]
struct Target {
    url: String,
    start: u64,
}

/// Counts of what the clients did, for the report and the floor asserts.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    completed: AtomicU64,
    interrupted: AtomicU64,
    /// Calls answered through the pump (priming event stored on its own)
    /// rather than as one quick body.
    streamed: AtomicU64,
    /// Calls whose client holds a stored priming event and not yet the
    /// final message: what the kill waits for.
    primed_open: AtomicU64,
    /// POST streams the client dropped on purpose (after the priming event
    /// or after the response, before the body's end).
    dropped: AtomicU64,
    /// `GET` + `Last-Event-ID` on a request stream.
    resumes: AtomicU64,
    /// Connection errors and bodies cut by the kill.
    faults: AtomicU64,
    standalone_connects: AtomicU64,
    standalone_events: AtomicU64,
    roots_answers: AtomicU64,
    /// What a working server must never do, each in a sentence.
    problems: Mutex<Vec<String>>,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Counts a call in [`Tally::primed_open`] from the moment its client reads
/// its stored priming event until dropped (however the call ends).
struct PrimedOpen<'a>(&'a AtomicU64);

impl<'a> PrimedOpen<'a> {
    fn new(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for PrimedOpen<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What every client shares.
struct Soak {
    http: reqwest::Client,
    target: Mutex<Target>,
    /// Starts below this one have been killed (set before the kill, so a
    /// client whose connection breaks sees it already).
    killed_below: AtomicU64,
    history: History,
    tally: Tally,
}

impl Soak {
    fn target(&self) -> Target {
        self.target.lock().clone()
    }

    fn client(&self, target: &Target) -> Client {
        Client { http: self.http.clone(), url: target.url.clone() }
    }

    fn problem(&self, text: String) {
        eprintln!("soak problem: {text}");
        self.tally.problems.lock().push(text);
    }

    fn is_killed(&self, target: &Target) -> bool {
        target.start < self.killed_below.load(Ordering::SeqCst)
    }

    /// A connection to `target` failed or broke: expected of a killed
    /// server, a problem otherwise.
    fn fault(&self, target: &Target, what: String) {
        add(&self.tally.faults);
        if !self.is_killed(target) {
            self.problem(format!("{what} (server start {} was not killed)", target.start));
        }
    }
}

/// The next thing an SSE body gives.
enum Next {
    Event(Seen),
    Ended,
    /// The connection broke (the server died).
    Broken(String),
    /// Bytes that are not SSE.
    Malformed(String),
    /// Nothing at all for the given time.
    Silent,
}

/// Reads the events of one SSE body with the decoder every tether client
/// uses; keep-alive comments are skipped, events that carry neither an ID
/// nor data (a bare `retry`) too.
struct EventReader {
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    decoder: sse::Decoder,
    ready: VecDeque<Seen>,
}

impl EventReader {
    fn new(response: reqwest::Response) -> Self {
        Self { body: response.bytes_stream().boxed(), decoder: sse::Decoder::new(), ready: VecDeque::new() }
    }

    async fn next(&mut self, silence: Duration) -> Next {
        loop {
            if let Some(seen) = self.ready.pop_front() {
                return Next::Event(seen);
            }
            match tokio::time::timeout(silence, self.body.next()).await {
                Err(_) => return Next::Silent,
                Ok(None) => return Next::Ended,
                Ok(Some(Err(e))) => return Next::Broken(e.to_string()),
                Ok(Some(Ok(chunk))) => match self.decoder.push(chunk) {
                    Ok(events) => self.ready.extend(
                        events
                            .into_iter()
                            .filter(|e| e.id.is_some() || e.has_data())
                            .map(|e| Seen::new(e.id.unwrap_or_default(), e.data)),
                    ),
                    Err(e) => return Next::Malformed(e.to_string()),
                },
            }
        }
    }
}

/// How a client leaves a call's POST stream.
#[derive(Clone, Copy, PartialEq)]
enum Leave {
    /// Reads it to its end.
    AtTheEnd,
    /// Drops it right after the priming event, then resumes from it.
    AfterPriming,
    /// Drops it right after the response, then resumes from the response:
    /// the server must send nothing more (no second final message).
    AfterResponse,
}

/// Whether `seen` is the final message of request `id` (a response with its id).
fn is_final_of(seen: &Seen, id: u64) -> bool {
    serde_json::from_str::<Value>(&seen.data).is_ok_and(|m| {
        m.get("id") == Some(&json!(id)) && m.get("method").is_none() && (m.get("result").is_some() || m.get("error").is_some())
    })
}

/// Whether `seen`, a POST's first event, is a priming event stored on its
/// own (`<stream>.N`, N ≥ 1); a quick answer's is `<stream>.0` and has no row.
fn is_stored_priming(seen: &Seen) -> bool {
    seen.data.is_empty() && split_id(&seen.id).is_some_and(|(_, seq)| seq > 0)
}

/// How one read of a request stream went.
struct Read {
    events: Vec<Seen>,
    /// Why it ended early, if it did (a broken connection).
    broken: Option<String>,
}

/// Reads a request stream until its end, or until `leave_after` says to
/// drop it. A POST's read passes `primed`: a stored priming event sets it.
/// (A resumption's priming event names where it resumes, `<stream>.N`
/// however the stream began, so it says nothing of that.)
async fn read_request_stream<'a>(
    soak: &'a Soak,
    what: &str,
    response: reqwest::Response,
    leave_after: impl Fn(&Seen) -> bool,
    mut primed: Option<&mut Option<PrimedOpen<'a>>>,
) -> Read {
    let mut reader = EventReader::new(response);
    let mut read = Read { events: Vec::new(), broken: None };
    loop {
        match reader.next(HANG).await {
            Next::Event(seen) => {
                if let Some(primed) = primed.as_deref_mut()
                    && primed.is_none()
                    && is_stored_priming(&seen)
                {
                    *primed = Some(PrimedOpen::new(&soak.tally.primed_open));
                }
                let leave = leave_after(&seen);
                read.events.push(seen);
                if leave {
                    add(&soak.tally.dropped);
                    return read;
                }
            }
            Next::Ended => return read,
            Next::Broken(e) => {
                read.broken = Some(e);
                return read;
            }
            Next::Malformed(e) => {
                soak.problem(format!("{what}: not SSE: {e}"));
                return read;
            }
            Next::Silent => {
                soak.problem(format!("HANG: {what}: nothing for {HANG:?}"));
                return read;
            }
        }
    }
}

/// One client: its session, its next JSON-RPC id and its own random choices.
struct SoakClient {
    index: usize,
    session: String,
    next_id: u64,
    rng: StdRng,
    /// Calls POSTed to the restarted server that completed with a result.
    completed_after_restart: u64,
    /// The standalone stream as this client read it (if it holds one).
    standalone: Option<Arc<Mutex<StandaloneLog>>>,
}

impl SoakClient {
    /// Calls until `until`, then returns between two calls with every stream
    /// closed. It starts with a pause, as if it had been running all along:
    /// 200 clients starting at once would be a burst no steady load has.
    async fn run(mut self, soak: Arc<Soak>, until: Instant) -> Self {
        let holder = self.standalone.clone().map(|log| tokio::spawn(hold_standalone(soak.clone(), self.session.clone(), log)));
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(PAUSE_MS))).await;
        while Instant::now() < until {
            let chars = self.rng.random_range(THOUGHT_CHARS);
            self.call(&soak, Work::Thought(chars)).await;
            if holder.is_some() && self.rng.random_range(0..10) == 0 {
                self.say_roots_changed(&soak).await;
            }
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(PAUSE_MS))).await;
        }
        if let Some(holder) = holder {
            holder.abort();
            let _ = holder.await;
        }
        self
    }

    /// One call, read (and resumed) until its final message.
    async fn call(&mut self, soak: &Soak, work: Work) {
        self.next_id += 1;
        let id = self.next_id;
        let session = self.session.clone();
        let what = format!("call {id} of client {}", self.index);
        let leave = match self.rng.random_range(0..100) {
            0..20 => Leave::AfterPriming,
            20..30 => Leave::AfterResponse,
            _ => Leave::AtTheEnd,
        };
        let params = match work {
            Work::Thought(chars) => {
                let mut arguments = thought_args(id);
                arguments["thought"] = json!(thought_text(id, chars));
                json!({"name": "thought", "arguments": arguments})
            }
            Work::UnansweredRoots => json!({"name": "init", "arguments": {"operation": "list_roots"}}),
        };
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let target = soak.target();
        soak.history.sent(&session, id);
        add(&soak.tally.calls);
        let response = match tokio::time::timeout(HANG, soak.client(&target).post(Some(&session), &body).send()).await {
            Err(_) => return soak.problem(format!("HANG: {what}: no response head within {HANG:?}")),
            Ok(Err(e)) => {
                // Nothing came back, nothing was primed: nothing is owed.
                soak.fault(&target, format!("{what}: POST failed: {e}"));
                return tokio::time::sleep(RETRY_PAUSE).await;
            }
            Ok(Ok(response)) => response,
        };
        if response.status() != 200 {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return soak.problem(format!("{what}: status {status}: {text}"));
        }
        let mut primed = None;
        let leave_after = |seen: &Seen| match leave {
            Leave::AtTheEnd => false,
            Leave::AfterPriming => seen.data.is_empty(),
            Leave::AfterResponse => is_final_of(seen, id),
        };
        let read = read_request_stream(soak, &what, response, leave_after, Some(&mut primed)).await;
        if primed.is_some() {
            add(&soak.tally.streamed);
        }
        let mut final_message = read.events.iter().find(|e| is_final_of(e, id)).cloned();
        if let Some(e) = &read.broken {
            soak.fault(&target, format!("{what}: POST stream broke: {e}"));
        }
        let mut last = read.events.last().map(|e| e.id.clone());
        soak.history.read(&session, id, read.events);

        // Primed but not ended: resume where the reading stopped until the final message comes.
        let started = Instant::now();
        while final_message.is_none() {
            let Some(from) = last.clone() else {
                // The server died before its first event: nothing was primed.
                if !soak.is_killed(&target) {
                    soak.problem(format!("{what}: a 200 stream without any event"));
                }
                return;
            };
            if started.elapsed() > HANG * 2 {
                return soak.problem(format!("HANG: {what}: no final message within {:?} of resuming", HANG * 2));
            }
            let target = soak.target();
            add(&soak.tally.resumes);
            let Some(read) = self.resume(soak, &what, &target, &from).await else { return };
            if let Some(e) = &read.broken {
                soak.fault(&target, format!("{what}: resumed stream broke: {e}"));
            }
            if let Some(e) = read.events.last() {
                last = Some(e.id.clone());
            }
            final_message = read.events.iter().find(|e| is_final_of(e, id)).cloned();
            soak.history.read(&session, id, read.events);
        }
        let Some(final_message) = final_message else { return };
        if leave == Leave::AfterResponse {
            // Resuming after the final message: at most a priming event, never the response again.
            let target = soak.target();
            add(&soak.tally.resumes);
            if let Some(read) = self.resume(soak, &what, &target, &final_message.id).await {
                if let Some(e) = &read.broken {
                    soak.fault(&target, format!("{what}: resumed stream broke: {e}"));
                }
                soak.history.read(&session, id, read.events);
            }
        }
        let message: Value = serde_json::from_str(&final_message.data).unwrap();
        if message["result"].is_object() {
            add(&soak.tally.completed);
            if target.start >= 1 {
                self.completed_after_restart += 1;
            }
        } else if message["error"]["code"] == INTERRUPTED
            && message["error"]["message"].as_str().is_some_and(|m| m.contains("interrupted"))
        {
            add(&soak.tally.interrupted);
            if target.start >= 1 {
                soak.problem(format!("{what}: interrupted, but it was sent after the last restart: {message}"));
            }
        } else {
            soak.problem(format!("{what}: answered {message}"));
        }
    }

    /// `GET` + `Last-Event-ID: from` on `target`, read to its end (nothing
    /// read if the connection failed); `None` if the server refused (a
    /// problem, recorded) or hung.
    async fn resume(&self, soak: &Soak, what: &str, target: &Target, from: &str) -> Option<Read> {
        match tokio::time::timeout(HANG, soak.client(target).get(&self.session, Some(from)).send()).await {
            Err(_) => {
                soak.problem(format!("HANG: {what}: no head for the resumption from {from} within {HANG:?}"));
                None
            }
            Ok(Err(e)) => {
                soak.fault(target, format!("{what}: resumption failed: {e}"));
                tokio::time::sleep(RETRY_PAUSE).await;
                Some(Read { events: Vec::new(), broken: None })
            }
            Ok(Ok(response)) if response.status() != 200 => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                soak.problem(format!("{what}: resumption from {from}: status {status}: {text}"));
                None
            }
            Ok(Ok(response)) => Some(read_request_stream(soak, what, response, |_| false, None).await),
        }
    }

    /// `notifications/roots/list_changed`: the notebook asks `roots/list`
    /// again, on the standalone stream.
    async fn say_roots_changed(&self, soak: &Soak) {
        let target = soak.target();
        let body = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
        match tokio::time::timeout(HANG, soak.client(&target).post(Some(&self.session), &body).send()).await {
            Err(_) => soak.problem(format!("HANG: client {}: list_changed not answered within {HANG:?}", self.index)),
            Ok(Err(e)) => soak.fault(&target, format!("client {}: list_changed failed: {e}", self.index)),
            Ok(Ok(response)) if response.status() != 202 => {
                soak.problem(format!("client {}: list_changed answered {}", self.index, response.status()))
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// What a call asks of the notebook.
#[derive(Clone, Copy)]
enum Work {
    /// Records a thought of this many characters.
    Thought(usize),
    /// `init` `list_roots` from a session that declared roots and never
    /// answered `roots/list`: the notebook asks on the call's own stream
    /// (which stores its priming event) and waits 3 s for the answer.
    UnansweredRoots,
}

/// A thought's text of `chars` characters.
fn thought_text(id: u64, chars: usize) -> String {
    let mut text = format!("thought {id}: ");
    while text.len() < chars {
        text.push_str("weighing the next step against what the last one showed; ");
    }
    text.truncate(chars.max(1));
    text
}

/// One client's reading of its standalone stream across every connection.
#[derive(Default)]
struct StandaloneLog {
    /// The ID to resume from: the last one read (a priming ID included).
    resume_from: Option<String>,
    stream: Option<String>,
    last_seq: Option<u64>,
    /// Every message read, with its sequence number.
    messages: Vec<(u64, String)>,
}

/// Holds the session's standalone stream until aborted: reconnects (on the
/// current target, from the last event ID read) whenever it breaks, checks
/// each event comes once and in order, answers every `roots/list`.
async fn hold_standalone(soak: Arc<Soak>, session: String, log: Arc<Mutex<StandaloneLog>>) {
    let what = format!("standalone stream of {session}");
    loop {
        let target = soak.target();
        let from = log.lock().resume_from.clone();
        add(&soak.tally.standalone_connects);
        let response = match tokio::time::timeout(HANG, soak.client(&target).get(&session, from.as_deref()).send()).await {
            Err(_) => return soak.problem(format!("HANG: {what}: no head within {HANG:?}")),
            Ok(Err(e)) => {
                soak.fault(&target, format!("{what}: GET failed: {e}"));
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Ok(Ok(response)) => response,
        };
        if response.status() != 200 {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return soak.problem(format!("{what}: GET from {from:?}: status {status}: {text}"));
        }
        let mut reader = EventReader::new(response);
        loop {
            let seen = match reader.next(STANDALONE_SILENCE).await {
                Next::Event(seen) => seen,
                Next::Ended => break,
                Next::Broken(e) => {
                    soak.fault(&target, format!("{what}: broke: {e}"));
                    break;
                }
                Next::Malformed(e) => return soak.problem(format!("{what}: not SSE: {e}")),
                Next::Silent => return soak.problem(format!("{what}: no event or keep-alive for {STANDALONE_SILENCE:?}")),
            };
            if !standalone_event_in_order(&soak, &what, &log, &seen) || seen.data.is_empty() {
                continue;
            }
            add(&soak.tally.standalone_events);
            let message: Value = serde_json::from_str(&seen.data).unwrap_or(Value::Null);
            if message["method"] == "roots/list" {
                answer_roots(&soak, &target, &session, &message).await;
            } else {
                soak.problem(format!("{what}: unexpected message {}", seen.data));
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Records `seen` in `log`; false (and a problem) if it repeats or goes
/// back. A priming event names the position resumed from: it may repeat the
/// last ID read, never go back.
fn standalone_event_in_order(soak: &Soak, what: &str, log: &Mutex<StandaloneLog>, seen: &Seen) -> bool {
    let mut log = log.lock();
    let Some((stream, seq)) = split_id(&seen.id) else {
        soak.problem(format!("{what}: an event without a valid ID: {seen:?}"));
        return false;
    };
    if log.stream.get_or_insert_with(|| stream.to_owned()) != stream {
        soak.problem(format!("{what}: {} is of another stream", seen.id));
        return false;
    }
    let in_order = match log.last_seq {
        None => true,
        Some(last) if seen.data.is_empty() => seq >= last,
        Some(last) => seq > last,
    };
    if !in_order {
        soak.problem(format!("{what}: {} after {}.{}", seen.id, stream, log.last_seq.unwrap_or(0)));
        return false;
    }
    log.last_seq = Some(seq);
    log.resume_from = Some(seen.id.clone());
    if !seen.data.is_empty() {
        log.messages.push((seq, seen.data.clone()));
    }
    true
}

async fn answer_roots(soak: &Soak, target: &Target, session: &str, request: &Value) {
    let answer = json!({"jsonrpc": "2.0", "id": request["id"],
        "result": {"roots": [{"uri": "file:///soak/project", "name": "soak"}]}});
    match tokio::time::timeout(HANG, soak.client(target).post(Some(session), &answer).send()).await {
        Err(_) => soak.problem(format!("HANG: the roots answer of {session} got no head within {HANG:?}")),
        Ok(Err(e)) => soak.fault(target, format!("the roots answer of {session} failed: {e}")),
        Ok(Ok(response)) if response.status() != 202 => {
            soak.problem(format!("the roots answer of {session} got status {}", response.status()))
        }
        Ok(Ok(_)) => add(&soak.tally.roots_answers),
    }
}

/// Runs every client until `until`; returns them between two calls.
async fn run_load(clients: Vec<SoakClient>, soak: &Arc<Soak>, until: Instant) -> Vec<SoakClient> {
    let running: Vec<_> = clients.into_iter().map(|c| tokio::spawn(c.run(soak.clone(), until))).collect();
    let mut clients = Vec::with_capacity(running.len());
    for client in running {
        clients.push(client.await.unwrap());
    }
    clients
}

/// Sends each client's one call with a long thought (a few at a time):
/// together they write more than the SQLite writer's page cache holds.
async fn fill_writer_cache(clients: Vec<SoakClient>, soak: &Arc<Soak>) -> Vec<SoakClient> {
    futures::stream::iter(clients)
        .map(|mut client| {
            let soak = soak.clone();
            async move {
                client.call(&soak, Work::Thought(CACHE_FILLER_CHARS)).await;
                client
            }
        })
        .buffered(16)
        .collect()
        .await
}

/// The server process; killed when dropped, so a failing test leaves none behind.
struct Server(std::process::Child);

impl Server {
    fn start(db: &Path) -> (Self, String) {
        let (child, url) = start_binary(db, &[]);
        (Self(child), url)
    }

    /// `kill -9`, and waits for the process to be gone.
    fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }

    /// The process's memory and what holds it, from `/proc/<pid>`.
    fn memory(&self, db: &Path) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap();
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        // One open descriptor of the database file per SQLite connection.
        let descriptors = std::fs::read_dir(format!("/proc/{}/fd", self.0.id())).unwrap();
        let sqlite_connections = descriptors
            .filter_map(Result::ok)
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == db))
            .count();
        Memory { rss_kib: field("VmRSS:"), anon_kib: field("RssAnon:"), threads: field("Threads:"), sqlite_connections }
    }
}

/// One reading of the server's memory: resident in all, of it anonymous
/// (heap, stacks; the rest is mostly the binary's mapped code), and the
/// threads and SQLite connections that hold some of it.
struct Memory {
    rss_kib: u64,
    anon_kib: u64,
    threads: u64,
    sqlite_connections: usize,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {} KiB (anonymous {} KiB, {} threads, {} SQLite connections)",
            self.rss_kib, self.anon_kib, self.threads, self.sqlite_connections
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Replays `stream` of `session` from its start and records the replay
/// for the checker; a replay that does not end normally is a problem.
async fn replay_request_stream(soak: &Soak, target: &Target, session: &str, stream: &str) {
    let from = format!("{stream}.0");
    let what = format!("replay of {from} ({session})");
    let response = match tokio::time::timeout(HANG, soak.client(target).get(session, Some(&from)).send()).await {
        Ok(Ok(response)) if response.status() == 200 => response,
        other => {
            soak.problem(format!("{what}: {:?}", other.map(|r| r.map(|r| r.status()))));
            // Nothing replays: the checker counts what was read there as lost.
            return soak.history.replayed(session, &from, Vec::new());
        }
    };
    let mut reader = EventReader::new(response);
    let mut events = Vec::new();
    loop {
        match reader.next(HANG).await {
            Next::Event(seen) if seen.data.is_empty() && seen.id == from => {}
            Next::Event(seen) => events.push(seen),
            Next::Ended => return soak.history.replayed(session, &from, events),
            Next::Broken(e) | Next::Malformed(e) => return soak.problem(format!("{what}: {e}")),
            Next::Silent => return soak.problem(format!("HANG: {what}: nothing for {HANG:?}")),
        }
    }
}

/// Replays the first `limit` streams the clients touched, `at_once` at a time.
async fn replay_request_streams(soak: &Soak, target: &Target, limit: usize, at_once: usize) {
    let streams = soak.history.streams();
    futures::stream::iter(streams.iter().take(limit))
        .for_each_concurrent(at_once, |(session, stream)| replay_request_stream(soak, target, session, stream))
        .await;
}

/// Replays each standalone stream from its start as far as its client read
/// it: every message the client read is stored as read, and the client read
/// every stored message up to its last one (no gap). Returns the messages checked.
async fn check_standalone_streams(soak: &Soak, target: &Target, clients: &[SoakClient]) -> u64 {
    let mut checked = 0;
    for client in clients {
        let Some(log) = &client.standalone else { continue };
        let (stream, read) = {
            let log = log.lock();
            (log.stream.clone(), log.messages.clone())
        };
        let (Some(stream), Some(&(last_read, _))) = (stream, read.last()) else { continue };
        let what = format!("standalone replay of client {}", client.index);
        let from = format!("{stream}.0");
        let response =
            tokio::time::timeout(HANG, soak.client(target).get(&client.session, Some(&from)).send()).await.unwrap().unwrap();
        assert_eq!(response.status(), 200, "{what}");
        let mut reader = EventReader::new(response);
        let mut stored = Vec::new();
        // The stream stays open (it is the session's live stream): read up to the client's last message.
        while stored.last().is_none_or(|&(seq, _)| seq < last_read) {
            match reader.next(HANG).await {
                Next::Event(seen) if seen.data.is_empty() => {}
                Next::Event(seen) => stored.push((split_id(&seen.id).unwrap().1, seen.data)),
                _ => panic!("{what}: ended before {stream}.{last_read}, the last message the client read; stored: {stored:?}"),
            }
        }
        stored.retain(|&(seq, _)| seq <= last_read);
        assert_eq!(read, stored, "{what}: what the client read is not what is stored");
        checked += read.len() as u64;
    }
    checked
}

/// Sends the held calls, waits (at most [`PRIMED_WAIT`]) until as many
/// primed, unanswered calls are open as calls were held, kills the server, restarts it on the same file after
/// [`DEAD_FOR`] and points the clients at it. Returns the new server and
/// the held calls' clients once their calls have ended.
async fn kill_and_restart(soak: Arc<Soak>, mut server: Server, db: &Path, held: Vec<SoakClient>) -> (Server, Vec<SoakClient>) {
    let held_calls: Vec<_> = held
        .into_iter()
        .map(|mut client| {
            let soak = soak.clone();
            tokio::spawn(async move {
                client.call(&soak, Work::UnansweredRoots).await;
                client
            })
        })
        .collect();
    // Every held call primed (or, rarely, some of them and quick calls that happened to be primed).
    let waiting = Instant::now();
    while get(&soak.tally.primed_open) < HELD_CALLS as u64 && waiting.elapsed() < PRIMED_WAIT {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let primed_at_kill = get(&soak.tally.primed_open);
    soak.killed_below.store(1, Ordering::SeqCst);
    server.kill();
    eprintln!("soak: SIGKILL with {primed_at_kill} primed calls open, {:?} after the held calls were sent", waiting.elapsed());
    tokio::time::sleep(DEAD_FOR).await;
    let db = db.to_owned();
    let (server, url) = tokio::task::spawn_blocking(move || Server::start(&db)).await.unwrap();
    *soak.target.lock() = Target { url, start: 1 };
    let mut held = Vec::new();
    for call in held_calls {
        held.push(call.await.unwrap());
    }
    (server, held)
}

fn soak_seed() -> u64 {
    let seed = std::env::var("TETHER_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("soak: TETHER_SOAK_SEED={seed}");
    seed
}

fn soak_length() -> Duration {
    let secs = std::env::var("TETHER_SOAK_SECS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(60.0);
    Duration::from_secs_f64(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_clients_through_a_sigkill_get_every_response_and_event_exactly_once_and_memory_returns() {
    let test_started = Instant::now();
    let seed = soak_seed();
    let length = soak_length();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tether.db");
    let (server, url) = Server::start(&db);
    let soak = Arc::new(Soak {
        http: reqwest::Client::new(),
        target: Mutex::new(Target { url, start: 0 }),
        killed_below: AtomicU64::new(0),
        history: History::new(),
        tally: Tally::default(),
    });

    // Sessions first, a few at a time: the 200 clients, then the sessions of
    // the held calls. The holders of a standalone stream declare roots, so
    // the notebook asks them `roots/list` there; so do the held calls'
    // sessions, which never answer.
    let first = soak.target();
    let mut clients: Vec<SoakClient> = futures::stream::iter(0..CLIENTS + HELD_CALLS)
        .map(|index| {
            let client = soak.client(&first);
            async move {
                let holds_standalone = index < CLIENTS && index % STANDALONE_EVERY == 0;
                let declares_roots = holds_standalone || index >= CLIENTS;
                let capabilities = if declares_roots { json!({"roots": {"listChanged": true}}) } else { json!({}) };
                SoakClient {
                    index,
                    session: client.initialize_with(capabilities).await,
                    next_id: 0,
                    rng: StdRng::seed_from_u64(seed.wrapping_add(index as u64)),
                    completed_after_restart: 0,
                    standalone: holds_standalone.then(Default::default),
                }
            }
        })
        .buffered(16)
        .collect()
        .await;
    let held = clients.split_off(CLIENTS);

    // The load, with the kill in its middle, until a quarter of the soak after it.
    let load_started = Instant::now();
    let kill_at = load_started + length / 2;
    let warm_up_ends = kill_at + length / 4;
    let killer = {
        let (soak, db) = (soak.clone(), db.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(kill_at.into()).await;
            kill_and_restart(soak, server, &db, held).await
        })
    };
    let clients = run_load(clients, &soak, kill_at + length / 16).await;
    let (server, _held) = killer.await.unwrap();
    // The caches filled, then the load again: it reuses what the long
    // thoughts' and the replays' buffers left free, as the load before the
    // second reading does.
    let clients = fill_writer_cache(clients, &soak).await;
    replay_request_streams(&soak, &soak.target(), READ_BURST * 4, READ_BURST).await;
    let clients = run_load(clients, &soak, warm_up_ends).await;
    tokio::time::sleep(SETTLE).await;
    let before = server.memory(&db);
    let calls_before = get(&soak.tally.calls);

    // The rest of the load, then the same quiet.
    let clients = run_load(clients, &soak, Instant::now() + length / 4).await;
    tokio::time::sleep(SETTLE).await;
    let after = server.memory(&db);
    let load_time = load_started.elapsed();

    let target = soak.target();
    replay_request_streams(&soak, &target, usize::MAX, REPLAYS_AT_ONCE).await;
    let report = soak.history.check();
    let standalone_checked = check_standalone_streams(&soak, &target, &clients).await;

    let tally = &soak.tally;
    eprintln!(
        "soak: {CLIENTS} clients for {load_time:.1?} (seed {seed}): calls {}, completed {}, interrupted by the kill {}, \
         streamed {}, dropped by clients {}, resumes {}, faults {}; standalone: connections {}, events {}, \
         roots answered {}, events checked against the store {standalone_checked}",
        get(&tally.calls),
        get(&tally.completed),
        get(&tally.interrupted),
        get(&tally.streamed),
        get(&tally.dropped),
        get(&tally.resumes),
        get(&tally.faults),
        get(&tally.standalone_connects),
        get(&tally.standalone_events),
        get(&tally.roots_answers),
    );
    eprintln!("soak: history check: {report}");
    eprintln!(
        "soak: server memory before (after {calls_before} calls): {before}; after: {after}; RSS {:+.1} %; whole test {:.1?}",
        (after.rss_kib as f64 / before.rss_kib as f64 - 1.0) * 100.0,
        test_started.elapsed()
    );

    let problems = tally.problems.lock().clone();
    assert!(
        problems.is_empty(),
        "{} problems, the first ones:\n{}",
        problems.len(),
        problems[..problems.len().min(20)].join("\n")
    );
    report.assert_clean();
    let idle: Vec<usize> = clients.iter().filter(|c| c.completed_after_restart == 0).map(|c| c.index).collect();
    assert!(idle.is_empty(), "clients with no call completed after the restart: {idle:?}");
    // A soak that soaked nothing fails: the floors are a fraction of what a loaded machine does.
    let secs = length.as_secs_f64();
    assert!(get(&tally.calls) as f64 >= 40.0 * secs, "calls {}", get(&tally.calls));
    assert!(get(&tally.resumes) as f64 >= 10.0 * secs, "resumes {}", get(&tally.resumes));
    assert!(get(&tally.interrupted) > 0, "the kill cut off no primed call");
    assert!(standalone_checked > 0, "no standalone event was checked");
    assert!(
        after.rss_kib as f64 <= before.rss_kib as f64 * 1.10,
        "the server's RSS grew by more than 10 % over the last part of the soak: before {before}, after {after}"
    );
}
