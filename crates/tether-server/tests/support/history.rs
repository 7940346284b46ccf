//! The history checker of the fault tests: clients record
//! what they sent and every event they read, in the order they read it; at
//! the end the test replays what it must and [`History::check`] judges the
//! whole record against tether's promises:
//!
//! - **at most once, in order**: one client's reads of one request's stream
//!   (its POST and every `GET` + `Last-Event-ID` after it) see each event ID
//!   once, in rising sequence order, and a replay does the same;
//! - **one version of an event**: an event ID carries the same message
//!   wherever it is read (a message sent before its commit and replaced by
//!   another would show up here);
//! - **seen means stored**: every event a client read is in a replay of its
//!   stream, identical (the test replays each stream from its start);
//! - **acknowledged means replayable**: every response a client got replays
//!   from the priming ID before it;
//! - **exactly one end**: a request a client saw primed ends with exactly one
//!   final message (a response carrying its id), on its own stream only
//!   (a response with another id there is misrouted).
//!
//! It is plain data and plain checks, so it can be fed hand-made histories
//! (`tests/history_checker.rs` breaks each rule and expects it caught).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use parking_lot::Mutex;
use serde_json::Value;

/// One event as a client read it: its SSE ID and its data (empty for a
/// priming event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub id: String,
    pub data: String,
}

impl Seen {
    pub fn new(id: impl Into<String>, data: impl Into<String>) -> Self {
        Self { id: id.into(), data: data.into() }
    }
}

/// A request: its session and its JSON-RPC id (unique within the session).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub session: String,
    pub id: u64,
}

#[derive(Debug, Clone)]
enum Entry {
    Sent(RequestKey),
    /// A read of the request's stream by the client that sent it, with the
    /// history's clock when it was recorded.
    Read(RequestKey, Vec<Seen>, u64),
    /// A replay of `stream` after `after` (a `GET` with `Last-Event-ID`) that
    /// ended normally: what came is all the store holds past `after`.
    Replay {
        session: String,
        after: String,
        events: Vec<Seen>,
    },
}

/// What the clients of one test saw, shared by them (cheap to lock: one
/// push per read).
#[derive(Default)]
pub struct History {
    entries: Mutex<Vec<Entry>>,
    /// Stamps each read (the power-loss tests use the WAL's fsync count).
    clock: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

/// The totals of a check and every broken rule, each in a sentence.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub requests: usize,
    pub acknowledged: usize,
    pub events_checked: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub reordered: usize,
    pub misrouted: usize,
    pub unended: usize,
    /// Events read that the store may lose and did (see [`History::check_with`]).
    pub allowed_losses: usize,
    pub violations: Vec<String>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Panics with every violation (at most 20 of them) if there is one.
    pub fn assert_clean(&self) {
        if !self.is_clean() {
            let shown: Vec<&str> = self.violations.iter().take(20).map(String::as_str).collect();
            panic!("history check failed: {self}\n{}", shown.join("\n"));
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "requests {}, acknowledged {}, events checked {}, lost {}, duplicated {}, reordered {}, misrouted {}, unended {}, allowed losses {}",
            self.requests,
            self.acknowledged,
            self.events_checked,
            self.lost,
            self.duplicated,
            self.reordered,
            self.misrouted,
            self.unended,
            self.allowed_losses
        )
    }
}

/// `<stream>.<seq>` split at its one dot.
pub fn split_id(id: &str) -> Option<(&str, u64)> {
    let (stream, seq) = id.rsplit_once('.')?;
    Some((stream, seq.parse().ok()?))
}

/// The JSON-RPC id of a response (a message with `result` or `error`), if `data` is one.
fn response_id(data: &str) -> Option<Value> {
    let message: Value = serde_json::from_str(data).ok()?;
    let object = message.as_object()?;
    if object.contains_key("method") || !(object.contains_key("result") || object.contains_key("error")) {
        return None;
    }
    object.get("id").cloned()
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// A history whose reads are stamped with `clock()` when recorded
    /// (after the read, so a stamp is never earlier than the read).
    pub fn with_clock(clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self { entries: Mutex::default(), clock: Some(Box::new(clock)) }
    }

    fn push(&self, entry: Entry) {
        self.entries.lock().push(entry);
    }

    /// The client sent request `id` on `session`.
    pub fn sent(&self, session: &str, id: u64) {
        self.push(Entry::Sent(RequestKey { session: session.into(), id }));
    }

    /// The client that sent request `id` read `events` from its stream (the
    /// POST's answer or a resumption), in this order.
    pub fn read(&self, session: &str, id: u64, events: Vec<Seen>) {
        let stamp = self.clock.as_ref().map_or(0, |clock| clock());
        self.push(Entry::Read(RequestKey { session: session.into(), id }, events, stamp));
    }

    /// A replay after `after` ended normally with `events`.
    pub fn replayed(&self, session: &str, after: &str, events: Vec<Seen>) {
        self.push(Entry::Replay { session: session.into(), after: after.into(), events });
    }

    /// Every stream (by session) a client read, with the requests read on it:
    /// what the test must replay from `<stream>.0` before [`History::check`].
    pub fn streams(&self) -> Vec<(String, String)> {
        let entries = self.entries.lock();
        let mut streams = BTreeSet::new();
        for entry in entries.iter() {
            if let Entry::Read(key, events, _) = entry {
                for seen in events {
                    if let Some((stream, _)) = split_id(&seen.id) {
                        streams.insert((key.session.clone(), stream.to_owned()));
                    }
                }
            }
        }
        streams.into_iter().collect()
    }

    /// Judges the history; see the module's documentation for the rules.
    pub fn check(&self) -> Report {
        self.check_with(|_| false)
    }

    /// Judges the history where the store may lose events read with a
    /// stamp for which `may_lose` holds (a power loss under
    /// `--durability normal`): such an event may be missing from its stream
    /// (or replaced by what the restarted server wrote there), but only at
    /// the stream's end: an event after it that survived is a violation, as
    /// is any loss of an event `may_lose` does not allow.
    pub fn check_with(&self, may_lose: impl Fn(u64) -> bool) -> Report {
        let entries = self.entries.lock().clone();
        check(&entries, &may_lose)
    }
}

fn check(entries: &[Entry], may_lose: &dyn Fn(u64) -> bool) -> Report {
    let mut report = Report::default();
    let mut sent = BTreeSet::new();
    // Each request's reads, concatenated in the order they happened.
    let mut reads: BTreeMap<RequestKey, Vec<(Seen, u64)>> = BTreeMap::new();
    // (session, stream) -> seq -> data, from complete replays; and the
    // replays themselves, to look up "replays from P".
    let mut stored: HashMap<(String, String), BTreeMap<u64, String>> = HashMap::new();
    let mut replays: Vec<(String, String, Vec<Seen>)> = Vec::new();
    // Every version of every event ID anywhere: (session, id) -> data.
    let mut versions: HashMap<(String, String), String> = HashMap::new();

    for entry in entries {
        match entry {
            Entry::Sent(key) => {
                if !sent.insert(key.clone()) {
                    report.violations.push(format!("request {key:?} was sent twice with the same id"));
                }
            }
            Entry::Read(key, events, stamp) => {
                reads.entry(key.clone()).or_default().extend(events.iter().map(|e| (e.clone(), *stamp)))
            }
            Entry::Replay { session, after, events } => replays.push((session.clone(), after.clone(), events.clone())),
        }
    }
    report.requests = sent.len();

    let mut record_version = |report: &mut Report, session: &str, seen: &Seen| {
        if seen.data.is_empty() {
            return; // priming events carry nothing to compare
        }
        let key = (session.to_owned(), seen.id.clone());
        match versions.get(&key) {
            Some(data) if *data != seen.data => {
                report.duplicated += 1;
                report
                    .violations
                    .push(format!("event {} of session {session} came in two versions: {data} and {}", seen.id, seen.data));
            }
            Some(_) => {}
            None => {
                versions.insert(key, seen.data.clone());
            }
        }
    };

    // Replays: in order, each once, all of the stream named by `after`;
    // a replay from `<stream>.0` is the stream as stored.
    for (session, after, events) in &replays {
        let Some((stream, from)) = split_id(after) else {
            report.violations.push(format!("replay after {after:?}: not an event ID"));
            continue;
        };
        let mut last = from;
        for seen in events {
            record_version(&mut report, session, seen);
            match split_id(&seen.id) {
                Some((s, seq)) if s == stream && seq > last => last = seq,
                Some((s, _)) if s != stream => {
                    report.misrouted += 1;
                    report.violations.push(format!("replay of {after} in session {session} sent {} of another stream", seen.id));
                }
                _ => {
                    report.reordered += 1;
                    report.violations.push(format!("replay of {after} in session {session}: {} out of order", seen.id));
                }
            }
            if from == 0 && !seen.data.is_empty() {
                let log = stored.entry((session.clone(), stream.to_owned())).or_default();
                if let Some(seq) = split_id(&seen.id).map(|(_, seq)| seq) {
                    log.insert(seq, seen.data.clone());
                }
            }
        }
        if from == 0 {
            stored.entry((session.clone(), stream.to_owned())).or_default();
        }
    }

    for (key, stamped) in &reads {
        let events = allowed_tail(&mut report, key, stamped, &stored, may_lose);
        if !sent.contains(key) {
            report.violations.push(format!("request {key:?} was read but never sent"));
        }
        let mut stream: Option<&str> = None;
        let mut last: Option<u64> = None;
        let mut finals = BTreeSet::new();
        let mut final_seen: Option<&Seen> = None;
        let mut primed: Option<&str> = None;
        let mut previous_id: Option<&str> = None;
        for seen in &events {
            report.events_checked += 1;
            record_version(&mut report, &key.session, seen);
            let Some((s, seq)) = split_id(&seen.id) else {
                report.violations.push(format!("request {key:?} read an event without a valid ID: {seen:?}"));
                continue;
            };
            match stream {
                None => stream = Some(s),
                Some(first) if first != s => {
                    report.misrouted += 1;
                    report.violations.push(format!("request {key:?} read {} of another stream than {first}", seen.id));
                    continue;
                }
                Some(_) => {}
            }
            // A priming event repeats the position it resumes from: it may
            // name the last ID read, never go back further.
            let ok = match last {
                None => true,
                Some(l) if seen.data.is_empty() => seq >= l,
                Some(l) if seq == l => {
                    report.duplicated += 1;
                    report.violations.push(format!("request {key:?} read {} twice", seen.id));
                    continue;
                }
                Some(l) => seq > l,
            };
            if !ok {
                report.reordered += 1;
                report.violations.push(format!("request {key:?} read {} after {}", seen.id, previous_id.unwrap_or("?")));
                continue;
            }
            last = Some(seq);
            previous_id = Some(&seen.id);
            if seen.data.is_empty() {
                primed.get_or_insert(&seen.id);
                continue;
            }
            match response_id(&seen.data) {
                Some(id) if id == key.id => {
                    finals.insert(seen.id.clone());
                    final_seen.get_or_insert(seen);
                }
                Some(other) => {
                    report.misrouted += 1;
                    report.violations.push(format!("request {key:?} read the response to {other} ({})", seen.id));
                }
                None => {}
            }
            // Seen means stored.
            if let Some(log) = stored.get(&(key.session.clone(), s.to_owned())) {
                match log.get(&seq) {
                    Some(data) if *data == seen.data => {}
                    Some(data) => {
                        report.duplicated += 1;
                        report.violations.push(format!("{} was read as {} but is stored as {data}", seen.id, seen.data));
                    }
                    None => {
                        report.lost += 1;
                        report.violations.push(format!("{} (session {}) was read but is not stored", seen.id, key.session));
                    }
                }
            } else {
                report.lost += 1;
                report
                    .violations
                    .push(format!("{} (session {}) was read but its stream was never replayed", seen.id, key.session));
            }
        }
        // The stream as stored: the finals a replay shows count too.
        if let Some(s) = stream
            && let Some(log) = stored.get(&(key.session.clone(), s.to_owned()))
        {
            for (seq, data) in log {
                if response_id(data) == Some(Value::from(key.id)) {
                    finals.insert(format!("{s}.{seq}"));
                }
            }
        }
        if finals.len() > 1 {
            report.duplicated += 1;
            report.violations.push(format!("request {key:?} has {} final messages: {finals:?}", finals.len()));
        }
        if let Some(prime) = primed
            && finals.is_empty()
        {
            report.unended += 1;
            report.violations.push(format!("request {key:?} was primed ({prime}) but never ended"));
        }
        if let Some(response) = final_seen {
            report.acknowledged += 1;
            // Acknowledged means replayable: some replay from a position
            // before the response shows it, identical.
            let replayable = replays.iter().any(|(session, after, events)| {
                session == &key.session
                    && split_id(after).zip(split_id(&response.id)).is_some_and(|((a, from), (r, seq))| a == r && from < seq)
                    && events.iter().any(|e| e == response)
            });
            if !replayable {
                report.lost += 1;
                report.violations.push(format!("request {key:?}: its response {} does not replay", response.id));
            }
        }
    }
    report
}

/// A request's reads without the events the store was allowed to lose and
/// did: those read with a stamp `may_lose` allows that are not stored as
/// read, from the first such one to the end. A stored event after a lost
/// one is a violation (losses are only ever a stream's tail).
fn allowed_tail(
    report: &mut Report,
    key: &RequestKey,
    stamped: &[(Seen, u64)],
    stored: &HashMap<(String, String), BTreeMap<u64, String>>,
    may_lose: &dyn Fn(u64) -> bool,
) -> Vec<Seen> {
    let mut kept = Vec::new();
    let mut lost_from: Option<&str> = None;
    for (seen, stamp) in stamped {
        let log = split_id(&seen.id).and_then(|(s, _)| stored.get(&(key.session.clone(), s.to_owned())));
        let is_stored = match (split_id(&seen.id), log) {
            (Some((_, seq)), Some(log)) if !seen.data.is_empty() => log.get(&seq) == Some(&seen.data),
            // A priming event has no data: it survives if its stream has anything.
            (Some(_), Some(log)) => !log.is_empty(),
            _ => false,
        };
        if is_stored {
            if let Some(first) = lost_from
                && !seen.data.is_empty()
            {
                report.lost += 1;
                report.violations.push(format!("{} survived but {first} before it on its stream did not", seen.id));
            }
            kept.push(seen.clone());
        } else if may_lose(*stamp) {
            if !seen.data.is_empty() {
                report.allowed_losses += 1;
            }
            lost_from.get_or_insert(&seen.id);
        } else {
            kept.push(seen.clone());
        }
    }
    kept
}
