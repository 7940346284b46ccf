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
//! During the fill (steps 2 and 3) the client answers every `roots/list` it
//! reads on the live GET at once (`{"roots": []}`, POSTed, 202 expected), and
//! a `list_changed` refused with 429 is sent again after a short pause
//! (`Retry-After` honoured); the retries are counted and reported. A server
//! may bound the client notifications a session has waiting and the
//! server-to-client requests waiting for the client's answer (tether
//! does: its notebook handles one `list_changed` at a time and
//! waits for the answer to its `roots/list`), so a client that never
//! answered would fill those bounds and be refused. Every request read on
//! the live GET has been answered before step 4 starts, so the client sends
//! nothing while the replay is timed; what is stored and replayed is the
//! same either way.
//!
//! One deviation is recognised rather than failed: a server that sends the
//! `Last-Event-ID` event itself again before the missed ones (rmcp 3.9's
//! `LocalSessionManager` does). It is reported in the outcome and in the
//! row; anything else that differs from the expected events is an error.
//!
//! [`replay_10k`] runs the scenario on one fresh server and makes its row.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_wire::sse::Decoder;
use tether_wire::{Inbound, headers, parse_message};

use crate::Args;
use crate::load::{self, PROTOCOL_VERSION};
use crate::report::{Row, round};
use crate::running::start;
use crate::scenario::Scenario;
use crate::server::{Launch, Programs, Subject, System};

/// Parallel connections that POST the notifications.
const SENDERS: usize = 8;
/// How long the fill may take: the notifications (retries included), their
/// `roots/list` requests on the live stream and the client's answers.
const FILL_TIMEOUT: Duration = Duration::from_secs(180);
/// The pause before a notification refused with 429 is sent again (without
/// `Retry-After`); it grows by `RETRY_STEP` per refusal up to `RETRY_MAX`.
const RETRY_FIRST: Duration = Duration::from_millis(2);
const RETRY_STEP: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(20);
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
fn roots_request_id(data: &str) -> Result<Value, String> {
    match parse_message(data.as_bytes()) {
        Ok(Inbound::Request { id, method, .. }) if method == "roots/list" => Ok(id),
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
    /// `list_changed` POSTs of the fill sent again after a 429.
    pub fill_retries: u64,
}

/// How long to wait before sending again a POST refused with 429: the
/// server's `Retry-After` (in seconds) if it gave one, else `pause`.
fn retry_pause(headers: &reqwest::header::HeaderMap, pause: Duration) -> Duration {
    let retry_after =
        headers.get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    retry_after.map_or(pause, Duration::from_secs)
}

/// One `notifications/roots/list_changed`, sent again after a pause while
/// the server refuses it with 429 (until `deadline`); answered 202, or an
/// error. Returns how many times it was sent again.
async fn notify_list_changed(http: &reqwest::Client, url: &str, session: &str, deadline: Instant) -> Result<u64, String> {
    let note = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
    let mut retries = 0u64;
    let mut pause = RETRY_FIRST;
    loop {
        let resp = load::post(http, url, Some(session), &note)
            .send()
            .await
            .map_err(|e| format!("notifications/roots/list_changed: {e}"))?;
        if resp.status() != reqwest::StatusCode::TOO_MANY_REQUESTS {
            load::accepted(resp).await.map_err(|e| format!("notifications/roots/list_changed: {e}"))?;
            return Ok(retries);
        }
        let wait = retry_pause(resp.headers(), pause);
        let body = resp.text().await.unwrap_or_default();
        if Instant::now() + wait > deadline {
            return Err(format!(
                "notifications/roots/list_changed: still answered 429 after {retries} retries within {FILL_TIMEOUT:?}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        tokio::time::sleep(wait).await;
        retries += 1;
        pause = (pause + RETRY_STEP).min(RETRY_MAX);
    }
}

/// Answers each `roots/list` whose id comes through `ids` with an empty
/// list, POSTed to the session (202 expected), until the channel closes;
/// returns how many it answered.
async fn answer_roots(
    url: String,
    session: String,
    mut ids: tokio::sync::mpsc::UnboundedReceiver<Value>,
) -> Result<usize, String> {
    let http = load::http_client()?;
    let mut answered = 0;
    while let Some(id) = ids.recv().await {
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}});
        let resp = load::post(&http, &url, Some(&session), &answer)
            .send()
            .await
            .map_err(|e| format!("answer to roots/list {id}: {e}"))?;
        load::accepted(resp).await.map_err(|e| format!("answer to roots/list {id}: {e}"))?;
        answered += 1;
    }
    Ok(answered)
}

/// Runs the scenario against `url`; the timed replay is repeated `runs`
/// times (same missed events, a new connection each time).
pub async fn run(url: &str, events: usize, runs: usize) -> anyhow::Result<Outcome> {
    anyhow::ensure!(events > 0, "--events must be 1 or more");
    let http = load::http_client().map_err(anyhow::Error::msg)?;
    let session = load::open_session(&http, url, true).await.map_err(anyhow::Error::msg).context("session set-up")?;

    // 1. The live standalone stream, read in the background; every roots/list
    //    read there is answered at once by another task.
    let live_http = stream_client()?;
    let mut live = open_stream(get(&live_http, url, &session, None), "standalone stream").await?;
    let seen: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let (count_tx, mut count_rx) = tokio::sync::watch::channel(0usize);
    let (answer_tx, answer_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut answerer = tokio::spawn(answer_roots(url.to_string(), session.clone(), answer_rx));
    let mut reader = {
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
                    let id = roots_request_id(&event.data)?;
                    let request_id = id.to_string();
                    let event_id =
                        event.id.filter(|id| !id.is_empty()).ok_or_else(|| format!("event without an id: {}", event.data))?;
                    if !event_ids.insert(event_id.clone()) {
                        return Err(format!("event id {event_id} delivered twice on the live stream"));
                    }
                    if !request_ids.insert(request_id.clone()) {
                        return Err(format!("roots/list id {request_id} delivered twice on the live stream"));
                    }
                    let n = {
                        let mut seen = seen.lock();
                        seen.push(Delivered { event_id, request_id });
                        seen.len()
                    };
                    let _ = answer_tx.send(id);
                    let _ = count_tx.send(n);
                }
            }
        })
    };

    // 2. N+1 notifications, each answered 202 (sent again while answered 429).
    let wanted = events + 1;
    let deadline = Instant::now() + FILL_TIMEOUT;
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..SENDERS {
        let (url, session, next) = (url.to_string(), session.clone(), next.clone());
        senders.spawn(async move {
            let http = load::http_client()?;
            let mut retries = 0;
            while next.fetch_add(1, Ordering::Relaxed) < wanted {
                retries += notify_list_changed(&http, &url, &session, deadline).await?;
            }
            Ok::<u64, String>(retries)
        });
    }

    // 3. Wait until all of them came through the live stream, then close it.
    let fill = async {
        let mut retries = 0;
        while let Some(sent) = senders.join_next().await {
            retries += sent.map_err(|e| format!("sender: {e}"))??;
        }
        count_rx.wait_for(|&n| n >= wanted).await.map_err(|_| "live stream reader stopped".to_string())?;
        Ok::<u64, String>(retries)
    };
    let filled = tokio::select! {
        biased;
        filled = tokio::time::timeout_at(deadline.into(), fill) => filled,
        ended = &mut reader => match ended {
            Ok(Err(e)) => bail!("live stream: {e}"),
            Ok(Ok(())) => bail!("live stream reader ended"),
            Err(e) => bail!("live stream reader: {e}"),
        },
        ended = &mut answerer => match ended {
            Ok(Err(e)) => bail!("{e}"),
            Ok(Ok(n)) => bail!("the answers to roots/list stopped after {n}"),
            Err(e) => bail!("roots/list answerer: {e}"),
        },
    };
    drop(senders);
    let fill_retries = match filled {
        Ok(Ok(retries)) => retries,
        Ok(Err(e)) => bail!("{e}"),
        Err(_) => bail!("only {} of {wanted} roots/list requests arrived within {FILL_TIMEOUT:?}", *count_rx.borrow()),
    };
    // The reader's end closes the answers' channel: the answerer sends what is left, then ends.
    reader.abort();
    let _ = reader.await;
    drop(live_http);
    match tokio::time::timeout_at(deadline.into(), answerer).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => bail!("{e}"),
        Ok(Err(e)) => bail!("roots/list answerer: {e}"),
        Err(_) => bail!("the answers to roots/list were not all sent within {FILL_TIMEOUT:?}"),
    }
    tokio::time::sleep(CLOSE_SETTLE).await;
    let seen = seen.lock().clone();
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
    Ok(Outcome {
        ms: sorted[sorted.len() / 2],
        min_ms: sorted[0],
        max_ms: sorted[sorted.len() - 1],
        runs: times.len(),
        resent_last_event,
        fill_retries,
    })
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
                let request_id = roots_request_id(&event.data).map_err(anyhow::Error::msg)?.to_string();
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

/// replay_10k on one fresh server.
pub(crate) async fn replay_10k(args: &Args, programs: &Programs, subject: Subject) -> Row {
    eprintln!("== {}: replay_10k ({} events)", subject.name(), args.events);
    let mut row = Row::new(subject, Scenario::Replay10k, 1, args.quick);
    row.count = Some(args.events as u64);
    let mut launch = Launch::new(subject);
    if subject.system == System::Rmcp {
        // rmcp keeps `channel_capacity` events per stream for replay (16 by default).
        let capacity = args.events + 16;
        launch.channel_capacity = Some(capacity);
        row.note = Some(format!("SessionConfig.channel_capacity = {capacity} (default 16 keeps 16 events)"));
    }
    let outcome = async {
        let (server, _store) = start(programs, &launch).await?;
        let result = run(&server.mcp_url, args.events, args.replay_runs).await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", server.log_tail());
        }
        let rss = server.peak_rss_mib();
        server.stop().await?;
        Ok::<_, anyhow::Error>((result?, rss?))
    }
    .await;
    match outcome {
        Ok((outcome, rss)) => {
            let ms = outcome.ms;
            eprintln!("   median {ms:.1} ms of {} runs ({:.1} to {:.1} ms)", outcome.runs, outcome.min_ms, outcome.max_ms);
            row.ms = Some(round(ms, 1));
            row.spread = Some(format!("median of {} runs, {:.1} to {:.1} ms", outcome.runs, outcome.min_ms, outcome.max_ms));
            let retries = format!("fill: {} retries after 429", outcome.fill_retries);
            eprintln!("   {retries}");
            row.note = Some(match row.note.take() {
                Some(note) => format!("{note}; {retries}"),
                None => retries,
            });
            if outcome.resent_last_event {
                eprintln!("   note: the server re-sent the Last-Event-ID event before the missed ones");
                row.deviation =
                    Some(format!("re-sent the Last-Event-ID event first (a duplicate), then the {} missed ones", args.events));
            }
            row.rss_mib = Some(round(rss, 1));
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_is_honoured_else_the_own_pause() {
        let pause = Duration::from_millis(3);
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_pause(&headers, pause), pause);
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_pause(&headers, pause), Duration::from_secs(2));
        headers.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_pause(&headers, pause), pause);
    }

    #[test]
    fn a_roots_list_request_gives_its_id_as_sent() {
        assert_eq!(roots_request_id(r#"{"jsonrpc":"2.0","id":7,"method":"roots/list"}"#), Ok(json!(7)));
        assert_eq!(roots_request_id(r#"{"jsonrpc":"2.0","id":"r-1","method":"roots/list"}"#), Ok(json!("r-1")));
        assert!(roots_request_id(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).is_err());
        assert!(roots_request_id(r#"{"jsonrpc":"2.0","method":"notifications/message"}"#).is_err());
    }
}
