//! The `replay_10k` scenario: a client reconnects with `Last-Event-ID` and
//! receives N (10,000) events it missed, all on ONE stream; the figure is the
//! time from sending that GET to the arrival of the Nth event.
//!
//! The same method works on every MCP system here without a special tool:
//! 1. a session is opened by a client that declares the `roots` capability,
//!    and the standalone stream is opened (GET);
//! 2. the client POSTs N+1 `notifications/roots/list_changed`; each makes the
//!    server ask `roots/list` on the standalone stream (tether's notebook
//!    does that; the references are written to do the same);
//! 3. once the GET has delivered at least N+1 `roots/list` requests (so all
//!    of them are stored), it is closed;
//! 4. timed: a GET with `Last-Event-ID` set to the event just before the last
//!    N must deliver exactly those N events, in order, with the same IDs and
//!    the same messages. This is repeated (`--replay-runs`, each time on a
//!    new connection after the previous one was closed); the median counts.
//!
//! The client never answers the `roots/list` requests (a server gives up on
//! them after its own timeout; nothing else is sent meanwhile).
//!
//! One deviation is recognised rather than failed: a server that sends the
//! `Last-Event-ID` event itself again before the missed ones (rmcp 3.9's
//! `LocalSessionManager` does). It is reported in the outcome and in the
//! row; anything else that differs from the expected events is an error.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tether_wire::sse::Decoder;
use tether_wire::{Inbound, headers, parse_message};

use crate::load::{self, PROTOCOL_VERSION};

/// Parallel connections that POST the notifications.
const SENDERS: usize = 8;
/// How long the stored events may take to show up on the live stream.
const FILL_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the timed replay may take before it counts as failed.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(60);
/// Time for the server to notice that the first GET was closed.
const CLOSE_SETTLE: Duration = Duration::from_millis(300);

/// One delivered `roots/list` request: its SSE event ID and its JSON-RPC id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Delivered {
    event_id: String,
    request_id: String,
}

/// The JSON-RPC id of a `roots/list` request in an event's data, checked.
fn roots_request_id(data: &str) -> Result<String, String> {
    match parse_message(data.as_bytes()) {
        Ok(Inbound::Request { id, method, .. }) if method == "roots/list" => Ok(id.to_string()),
        Ok(_) => Err(format!("event is not a roots/list request: {data}")),
        Err(e) => Err(format!("event data is not a JSON-RPC message ({}): {data}", e.message)),
    }
}

fn get(http: &reqwest::Client, url: &str, session: &str, last_event_id: Option<&str>) -> reqwest::RequestBuilder {
    let mut req = http
        .get(url)
        .header("accept", headers::EVENT_STREAM)
        .header(headers::SESSION_ID, session)
        .header(headers::PROTOCOL_VERSION, PROTOCOL_VERSION);
    if let Some(id) = last_event_id {
        req = req.header(headers::LAST_EVENT_ID, id);
    }
    req
}

async fn open_stream(req: reqwest::RequestBuilder, what: &str) -> anyhow::Result<reqwest::Response> {
    let resp = req.send().await.with_context(|| format!("{what}: GET failed"))?;
    let status = resp.status();
    let sse = load::has_content_type(&resp, headers::EVENT_STREAM);
    if status != reqwest::StatusCode::OK || !sse {
        let body = resp.text().await.unwrap_or_default();
        bail!("{what}: GET answered {status} (SSE: {sse}): {}", body.chars().take(300).collect::<String>());
    }
    Ok(resp)
}

/// A GET client: no timeout on the whole request (streams stay open).
fn stream_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().no_proxy().http1_only().tcp_nodelay(true).build()?)
}

/// What the timed replays measured.
pub struct Outcome {
    /// Median over the runs of the milliseconds from sending the resuming
    /// GET to the arrival of the last missed event.
    pub ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub runs: usize,
    /// The server first re-sent the `Last-Event-ID` event itself (a duplicate).
    pub resent_last_event: bool,
}

/// Runs the scenario against `url`.
/// Runs the scenario against `url`; the timed replay is repeated `runs`
/// times (same missed events, a new connection each time).
pub async fn run(url: &str, events: usize, runs: usize) -> anyhow::Result<Outcome> {
    anyhow::ensure!(events > 0, "--events must be 1 or more");
    let http = load::http_client().map_err(anyhow::Error::msg)?;
    let session = load::open_session(&http, url, true).await.map_err(anyhow::Error::msg).context("session set-up")?;

    // 1. The live standalone stream, read in the background.
    let live_http = stream_client()?;
    let mut live = open_stream(get(&live_http, url, &session, None), "standalone stream").await?;
    let seen: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let (count_tx, mut count_rx) = tokio::sync::watch::channel(0usize);
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut decoder = Decoder::new();
            let mut event_ids = HashSet::new();
            let mut request_ids = HashSet::new();
            loop {
                let chunk = match live.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => return Err("the standalone stream ended".to_string()),
                    Err(e) => return Err(format!("reading the standalone stream: {e}")),
                };
                for event in decoder.push(chunk).map_err(|e| e.to_string())? {
                    if !event.has_data() {
                        continue;
                    }
                    let request_id = roots_request_id(&event.data)?;
                    let event_id = event.id.filter(|id| !id.is_empty()).ok_or_else(|| format!("event without an id: {}", event.data))?;
                    if !event_ids.insert(event_id.clone()) {
                        return Err(format!("event id {event_id} delivered twice on the live stream"));
                    }
                    if !request_ids.insert(request_id.clone()) {
                        return Err(format!("roots/list id {request_id} delivered twice on the live stream"));
                    }
                    let n = {
                        let mut seen = seen.lock().map_err(|_| "lock poisoned".to_string())?;
                        seen.push(Delivered { event_id, request_id });
                        seen.len()
                    };
                    let _ = count_tx.send(n);
                }
            }
        })
    };

    // 2. N+1 notifications, each answered 202.
    let wanted = events + 1;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (url, session, next) = (url.to_string(), session.clone(), next.clone());
        senders.push(tokio::spawn(async move {
            let http = load::http_client()?;
            let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < wanted {
                let resp = load::post(&http, &url, Some(&session), &note).send().await.map_err(|e| e.to_string())?;
                load::accepted(resp).await.map_err(|e| format!("notifications/roots/list_changed: {e}"))?;
            }
            Ok::<(), String>(())
        }));
    }
    for s in senders {
        s.await?.map_err(anyhow::Error::msg)?;
    }

    // 3. Wait until all of them came through the live stream, then close it.
    let filled = tokio::time::timeout(FILL_TIMEOUT, count_rx.wait_for(|&n| n >= wanted)).await.map(|r| r.map(|_| ()));
    if reader.is_finished() {
        match reader.await {
            Ok(Err(e)) => bail!("live stream: {e}"),
            Ok(Ok(())) => bail!("live stream reader ended"),
            Err(e) => bail!("live stream reader: {e}"),
        }
    }
    match filled {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => bail!("live stream reader stopped"),
        Err(_) => bail!("only {} of {wanted} roots/list requests arrived within {FILL_TIMEOUT:?}", *count_rx.borrow()),
    }
    reader.abort();
    let _ = reader.await;
    drop(live_http);
    tokio::time::sleep(CLOSE_SETTLE).await;
    let seen = seen.lock().map_err(|_| anyhow::anyhow!("lock poisoned"))?.clone();
    let resume_from = seen.len() - events - 1;
    let resume_event = seen[resume_from].clone();
    let expected = &seen[resume_from + 1..];

    // 4. The timed replays, each on a new connection (the previous one closed and settled).
    let mut times = Vec::with_capacity(runs);
    let mut resent_last_event = false;
    for run in 0..runs.max(1) {
        if run > 0 {
            tokio::time::sleep(CLOSE_SETTLE).await;
        }
        let replay_http = stream_client()?;
        let (elapsed, resent) = timed_replay(&replay_http, url, &session, &resume_event, expected).await?;
        resent_last_event |= resent;
        times.push(elapsed.as_secs_f64() * 1000.0);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Outcome { ms: sorted[sorted.len() / 2], min_ms: sorted[0], max_ms: sorted[sorted.len() - 1], runs: times.len(), resent_last_event })
}

/// One GET with `Last-Event-ID`, checked event by event; the time from
/// sending it until the last expected event arrived.
async fn timed_replay(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    resume_event: &Delivered,
    expected: &[Delivered],
) -> anyhow::Result<(Duration, bool)> {
    let events = expected.len();
    let resume_id = &resume_event.event_id;
    let started = Instant::now();
    let outcome = tokio::time::timeout(REPLAY_TIMEOUT, async {
        let mut resp = open_stream(get(http, url, session, Some(resume_id)), "resume").await?;
        let mut decoder = Decoder::new();
        let mut got = 0usize;
        let mut resent_last_event = false;
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => bail!("the replay ended after {got} of {events} events"),
                Err(e) => bail!("reading the replay after {got} events: {e}"),
            };
            for event in decoder.push(chunk)? {
                if !event.has_data() {
                    continue;
                }
                let want = &expected[got];
                let request_id = roots_request_id(&event.data).map_err(anyhow::Error::msg)?;
                let event_id = event.id.unwrap_or_default();
                let again = Delivered { event_id: event_id.clone(), request_id: request_id.clone() };
                if got == 0 && !resent_last_event && again == *resume_event {
                    resent_last_event = true;
                    continue;
                }
                if event_id != want.event_id || request_id != want.request_id {
                    bail!(
                        "replayed event {} is id {event_id:?} (roots/list {request_id}), want id {:?} (roots/list {}); resumed after {resume_id:?}",
                        got + 1,
                        want.event_id,
                        want.request_id
                    );
                }
                got += 1;
                if got == events {
                    return Ok((started.elapsed(), resent_last_event));
                }
            }
        }
    })
    .await;
    match outcome {
        Ok(result) => result,
        Err(_) => bail!("the replay of {events} events took longer than {REPLAY_TIMEOUT:?}"),
    }
}
