//! Load for the fault tests: clients on their own sessions calling the
//! support app's tools over raw loopback HTTP, reading every answer's SSE
//! events with `tether_wire::sse`, resuming a stream that ended without its
//! final message with `GET` + `Last-Event-ID`, and recording all of it in a
//! [`History`]. [`replay_all`] then reads every stream the clients touched
//! back from its start, which the checker needs to judge "seen means
//! stored" and "acknowledged means replayable".
//!
//! A client is written to survive a failing store: a 503 is a refusal (the
//! request is over and nothing was primed), a stream that ends early is
//! resumed, and only a hang (nothing for [`HANG`]) or an answer the
//! protocol does not allow fails the test.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tether_wire::sse::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::history::{History, Seen, split_id};
use super::{HANG, call_body, post, read_head, replay_request};

/// An answer as a client read it: status, a JSON body's message or the SSE events.
#[derive(Debug, Default)]
pub struct Answer {
    pub status: u16,
    pub events: Vec<Seen>,
    /// A JSON body (a refusal), parsed.
    pub json: Value,
}

/// Counts of what the clients did, for the test's report.
#[derive(Default, Debug)]
pub struct Tally {
    pub requests: AtomicU64,
    pub acknowledged: AtomicU64,
    pub refused: AtomicU64,
    pub resumed: AtomicU64,
    /// Requests whose final message never came (only counted where the
    /// test allows it: `lenient`; otherwise the client panics).
    pub unended: AtomicU64,
    /// A store that may lose what it showed (a Redis failover under normal
    /// durability): a request whose final never comes is counted, not a panic.
    pub lenient: std::sync::atomic::AtomicBool,
    /// How long a primed request may take to end once resumed, in seconds
    /// (0: `HANG` × 3). A failover stalls writes for a while.
    pub patience_secs: AtomicU64,
    /// Answers that break the protocol (a status other than 200/503, a 503
    /// without its reason): each one is also a message in `problems`.
    pub problems: parking_lot::Mutex<Vec<String>>,
    /// Each request counted in `unended`, described: its tool, what its
    /// client read and the last answers to its resumptions (bounded).
    pub unended_requests: parking_lot::Mutex<Vec<String>>,
}

impl Tally {
    fn problem(&self, text: String) {
        self.problems.lock().push(text);
    }

    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().clone()
    }

    pub fn unended_requests(&self) -> Vec<String> {
        self.unended_requests.lock().clone()
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The complete chunks of a chunked body (a cut body gives what came whole).
fn dechunk_lenient(raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut at = 0;
    while let Some(line) = raw[at..].windows(2).position(|w| w == b"\r\n") {
        let Some(size) = std::str::from_utf8(&raw[at..at + line]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
        else {
            break;
        };
        let start = at + line + 2;
        if size == 0 || raw.len() < start + size {
            break;
        }
        body.extend_from_slice(&raw[start..start + size]);
        at = start + size + 2;
        if at > raw.len() {
            break;
        }
    }
    body
}

/// Sends `text` (with `Connection: close`) and reads the answer to its end;
/// `Err` if the connection failed before a head came.
pub async fn send(addr: SocketAddr, text: &str) -> Result<Answer, String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    tcp.write_all(text.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
    let mut buffered = Vec::new();
    let first_line = text.lines().next().unwrap_or_default().to_owned();
    // Shorter than `read_head`'s own bound, which panics.
    let head = tokio::time::timeout(HANG - Duration::from_secs(1), read_head(&mut tcp, &mut buffered)).await;
    let Ok(Some((status, headers))) = head else {
        return Err(match head {
            Err(_) => format!("HANG: no response head to {first_line} within {HANG:?}"),
            Ok(_) => "the connection closed before a response head".into(),
        });
    };
    let mut chunk = [0u8; 8192];
    // A stream kept open by keep-alives but never ended (its end lost with
    // a Redis under normal durability) is cut too, as a client would.
    let cut_at = tokio::time::Instant::now() + HANG * 3;
    loop {
        match tokio::time::timeout_at(cut_at.min(tokio::time::Instant::now() + HANG), tcp.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => buffered.extend_from_slice(&chunk[..n]),
            // A stream that goes quiet this long is cut, as a client
            // would, and resumed by the caller: what came so far counts.
            Err(_) => break,
        }
    }
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk_lenient(&buffered) } else { buffered };
    let sse = headers.iter().any(|(n, v)| n == "content-type" && v.starts_with("text/event-stream"));
    let mut answer = Answer { status, ..Answer::default() };
    if sse {
        let mut decoder = Decoder::new();
        let events = decoder.push(body).map_err(|e| format!("SSE: {e}"))?;
        answer.events = events
            .into_iter()
            .filter(|e| e.id.is_some() || e.has_data())
            .map(|e| Seen::new(e.id.unwrap_or_default(), e.data))
            .collect();
    } else {
        answer.json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    }
    Ok(answer)
}

/// Whether `events` hold the response to request `id`.
fn has_final(events: &[Seen], id: u64) -> bool {
    events.iter().any(|e| {
        serde_json::from_str::<Value>(&e.data)
            .is_ok_and(|m| m.get("id") == Some(&json!(id)) && (m.get("result").is_some() || m.get("error").is_some()))
    })
}

/// Whether a 503's JSON-RPC error says what happened (and carries the
/// request's id when the refusal came after the request was read: a store
/// that failed to take it; a store that could not even load the session
/// refuses before, with no id).
fn refusal_is_clear(json: &Value, id: u64) -> bool {
    let message = json["error"]["message"].as_str().unwrap_or_default();
    let id_ok = json["id"] == json!(id) || (json["id"].is_null() && message.contains("unavailable"));
    id_ok && (message.contains("could not store") || message.contains("unavailable"))
}

/// One client: a session of its own, calls until `until`, every read in
/// `history`. Each request and each resumption goes to one of `addrs`
/// (drawn; replicas serve any session), re-read every time, so a test can
/// move the clients to a restarted server.
pub async fn client(
    addrs: Arc<parking_lot::Mutex<Vec<SocketAddr>>>,
    session: String,
    seed: u64,
    until: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    history: Arc<History>,
    tally: Arc<Tally>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut id = 0u64;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        id += 1;
        let (tool, args) = match rng.random_range(0..4) {
            0 | 1 => ("echo", json!({"n": id})),
            2 => ("sleep", json!({"ms": rng.random_range(5..60u64), "n": id})),
            _ => ("chatty", json!({"n": rng.random_range(1..4u64)})),
        };
        let target = pick(&addrs, &mut rng);
        history.sent(&session, id);
        tally.requests.fetch_add(1, Ordering::Relaxed);
        let text = post(&call_body(id, tool, args), Some(&session), &[("Connection", "close")]);
        let answer = match send(target, &text).await {
            Ok(answer) => answer,
            Err(e) => {
                // Nothing came back: nothing was primed, nothing is owed;
                // but the server must answer unless it was stopped.
                if !stop.load(Ordering::Relaxed) {
                    tally.problem(format!("request {id} of {session}: {e}"));
                }
                continue;
            }
        };
        match answer.status {
            200 => {}
            503 if stop.load(Ordering::Relaxed) => continue,
            503 => {
                if !refusal_is_clear(&answer.json, id) {
                    tally.problem(format!("a 503 without its id or reason: {}", answer.json));
                }
                tally.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            other => {
                tally.problem(format!("request {id} of {session}: status {other}: {}", answer.json));
                continue;
            }
        }
        let mut last = answer.events.last().map(|e| e.id.clone());
        let mut done = has_final(&answer.events, id);
        // What this request's client read and heard, for the report of a
        // request that never ends (the first reads, the last answers).
        let mut trail = vec![format!("POST {tool} to {target}: {}", describe(&answer))];
        history.read(&session, id, answer.events);
        // Primed but not ended: resume until the final message comes.
        let started = Instant::now();
        while !done && !stop.load(Ordering::Relaxed) {
            let Some(from) = last.clone() else {
                tally.problem(format!("request {id} of {session}: a 200 stream without any event"));
                break;
            };
            // A primed request's final may wait for the store to take it
            // (retried with backoff while faults come and go), never forever.
            let patience = match Tally::get(&tally.patience_secs) {
                0 => HANG * 3,
                secs => Duration::from_secs(secs),
            };
            if started.elapsed() >= patience && tally.lenient.load(Ordering::Relaxed) {
                tally.unended.fetch_add(1, Ordering::Relaxed);
                tally.unended_requests.lock().push(format!("request {id} of {session}: {}", trail.join(" | ")));
                break;
            }
            assert!(started.elapsed() < patience, "request {id} of {session}: no final message within {patience:?} of resuming");
            tally.resumed.fetch_add(1, Ordering::Relaxed);
            let target = pick(&addrs, &mut rng);
            let resumed = send(target, &replay_request(&session, &from)).await;
            let told = match &resumed {
                Ok(answer) => describe(answer),
                Err(e) => e.clone(),
            };
            if trail.len() >= 12 {
                trail.remove(4);
            }
            trail.push(format!("GET after {from} to {target}: {told}"));
            match resumed {
                Ok(resumed) if resumed.status == 200 => {
                    if let Some(e) = resumed.events.last() {
                        last = Some(e.id.clone());
                    }
                    done = has_final(&resumed.events, id);
                    history.read(&session, id, resumed.events);
                }
                // The store fails right now: try again shortly.
                Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if done {
            tally.acknowledged.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An answer in a line: its status and its events' IDs (data abridged) or its JSON body.
fn describe(answer: &Answer) -> String {
    if answer.status != 200 {
        return format!("{} {}", answer.status, answer.json);
    }
    let events: Vec<String> =
        answer
            .events
            .iter()
            .map(|e| {
                if e.data.is_empty() { e.id.clone() } else { format!("{}={}", e.id, e.data.chars().take(60).collect::<String>()) }
            })
            .collect();
    format!("200 [{}]", events.join(", "))
}

fn pick(addrs: &parking_lot::Mutex<Vec<SocketAddr>>, rng: &mut StdRng) -> SocketAddr {
    let addrs = addrs.lock();
    addrs[rng.random_range(0..addrs.len())]
}

/// Streams [`replay_all`] replays at once: a stream a Redis failover took
/// back altogether is refused only after the server asked its replicas for
/// a while (seconds), and thousands of them one by one would take an hour.
const REPLAYS_AT_ONCE: usize = 32;

/// Replays every stream the clients read from its start, recording each
/// replay; a stream the server does not know replays as empty. Retries a
/// 503 (the store may still be failing its last writes) for a while.
pub async fn replay_all(addr: SocketAddr, history: &History) {
    use futures::StreamExt;
    let replays = history.streams().into_iter().map(|(session, stream)| async move {
        let from = format!("{stream}.0");
        let started = Instant::now();
        loop {
            let answer = send(addr, &replay_request(&session, &from)).await.unwrap_or_default();
            if answer.status == 200 {
                let events = answer.events.into_iter().filter(|e| !(e.data.is_empty() && e.id == from)).collect();
                history.replayed(&session, &from, events);
                break;
            }
            if answer.status != 503 || started.elapsed() > HANG {
                // Unknown here: stored nothing (the checker decides whether that is allowed).
                history.replayed(&session, &from, Vec::new());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    futures::stream::iter(replays).buffer_unordered(REPLAYS_AT_ONCE).collect::<Vec<()>>().await;
}

/// Which events of `history`'s reads a replay must have: the seq of
/// `id` on its stream (helper for tests that judge losses themselves).
pub fn seq_of(id: &str) -> u64 {
    split_id(id).map_or(0, |(_, seq)| seq)
}
