//! The Streamable HTTP transport (protocol 2025-03-26 and later): every
//! message is a POST (`Accept: application/json, text/event-stream`); a
//! request is answered with JSON or with an SSE stream that may carry server
//! requests and notifications before the response. A response stream that
//! drops before the response is resumed with `GET` + `Last-Event-ID` after
//! the server's `retry` (priming IDs count). A background task keeps the
//! standalone GET stream open (reconnecting with `Last-Event-ID`, capped
//! backoff). Closing sends DELETE.
//!
//! A resumed stream (`GET` + `Last-Event-ID`) that stays silent is asked
//! again from its last event after [`RESUMED_SILENCE`] (doubling, capped):
//! a server may store a response just after it replayed what it had and
//! before it follows the request live (the official Python SDK has such a
//! window), and then never sends it on that GET. Asking again replays it,
//! from the last event that carried a message: a GET's own priming event
//! may be numbered after a response the server stored meanwhile, and
//! resuming after it would skip that response.

use std::sync::{Arc, Weak};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch};

use tether_wire::headers;
use tether_wire::sse::{Decoder, SseError};

use super::{
    Incoming, Inner, PeerMessage, RequestTrack, Session, content_type, error_message, outcome_to_result, read_event,
    read_response, read_value, same_id, transport_error,
};
use crate::error::{ClientError, ReqError};
use crate::sse::{self, Events, read_body};

/// Reconnect delay when the server named none.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Attempts to resume one response stream before giving up.
const MAX_RESUME_ATTEMPTS: u32 = 8;
/// The first wait for an event on a resumed stream before asking again
/// from its last event (doubled after each silent one, up to
/// [`MAX_RESUMED_SILENCE`]); silence does not count as a failure.
const RESUMED_SILENCE: Duration = Duration::from_secs(2);
const MAX_RESUMED_SILENCE: Duration = Duration::from_secs(60);
/// How long `connect` waits for the standalone stream to open.
const STANDALONE_READY_WAIT: Duration = Duration::from_secs(1);

/// The wait before the next attempt after `failures` in a row: the
/// server's `retry`, doubled per failure, capped.
fn backoff(retry: Option<Duration>, failures: u32) -> Duration {
    let base = retry.unwrap_or(DEFAULT_RETRY).min(MAX_BACKOFF);
    let factor = 1u32 << failures.saturating_sub(1).min(5);
    (base * factor).min(MAX_BACKOFF)
}

/// How to read one request's answer stream.
struct Reading<'a> {
    /// For messages: what the request was.
    method: &'a str,
    id: &'a Value,
    track: Option<&'a RequestTrack>,
    /// Where the server's messages on the stream go (default: the session's
    /// incoming channel).
    sink: Option<&'a mpsc::Sender<PeerMessage>>,
    /// The first (empty) attempt is a resume: no pause before it.
    resume_at_once: bool,
}

impl Session {
    /// `initialize` and `notifications/initialized`, then the standalone
    /// stream (if the server gave a session ID).
    pub(super) async fn initialize_streamable(&self, params: Value) -> Result<Value, ReqError> {
        let result = self.request_raw("initialize", Some(params), None).await?;
        self.finish_initialize(&result)?;
        self.notify("notifications/initialized", None).await?;
        self.open_standalone().await;
        Ok(result)
    }

    /// Opens the standalone GET stream in the background (for a session
    /// with an ID) and gives it a moment to open.
    pub(super) async fn open_standalone(&self) {
        if self.inner.session_id.get().is_some() {
            let weak = Arc::downgrade(&self.inner);
            let closed = self.inner.closed.subscribe();
            let (ready_tx, ready_rx) = oneshot::channel();
            let task = tokio::spawn(standalone_stream(weak, closed, ready_tx));
            self.inner.tasks.lock().push(task);
            // Servers drop session-level messages (e.g. a `roots/list` asked
            // by the first tool call) while no standalone stream is open:
            // give it a moment to open before the caller's first request.
            let _ = tokio::time::timeout(STANDALONE_READY_WAIT, ready_rx).await;
        }
    }
}

impl Inner {
    /// An SSE decoder bounded by `max_message_bytes`.
    fn decoder(&self) -> Decoder {
        Decoder::with_limit(self.options.max_message_bytes)
    }

    pub(super) async fn streamable_request(
        &self,
        message: &Value,
        id: &Value,
        accepted: Option<Box<dyn FnOnce() + Send>>,
        track: Option<&RequestTrack>,
        sink: Option<&mpsc::Sender<PeerMessage>>,
        headers: &[(String, String)],
    ) -> Result<Box<RawValue>, ReqError> {
        let initializing = message.get("method").and_then(Value::as_str) == Some("initialize");
        let response = self.post_with(&self.url, message, headers).await?;
        if let Some(sid) = response.headers().get(headers::SESSION_ID).filter(|_| initializing) {
            let sid =
                sid.to_str().ok().filter(|s| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b))).ok_or_else(
                    || ClientError::Transport("the server sent an Mcp-Session-Id that is not visible ASCII".into()),
                )?;
            let _ = self.session_id.set(sid.to_owned());
        }
        if let Some(f) = accepted {
            f();
        }
        if response.status() == StatusCode::ACCEPTED {
            return Err(ClientError::Transport(format!(
                "the server at {} accepted a request without answering it (HTTP 202)",
                self.url
            ))
            .into());
        }
        let ct = content_type(&response);
        if ct.starts_with(headers::EVENT_STREAM) {
            let method = message.get("method").and_then(Value::as_str).unwrap_or("request");
            let reading = Reading { method, id, track, sink, resume_at_once: false };
            self.read_response_stream(sse::events(response, self.decoder()), reading).await
        } else if ct.starts_with("application/json") {
            let body = read_body(response, self.options.max_message_bytes).await.map_err(ClientError::Transport)?;
            if let Some(Incoming::Response { id: rid, outcome }) = read_response(&body)
                && same_id(&rid, id)
            {
                return outcome_to_result(outcome);
            }
            // One message, a batch, or (as some servers write a streamed
            // answer into a JSON body) several messages one after another.
            let mut messages = Vec::new();
            for parsed in serde_json::Deserializer::from_slice(&body).into_iter::<Value>() {
                match parsed.map_err(|e| ClientError::Transport(format!("the server at {} sent invalid JSON: {e}", self.url)))? {
                    Value::Array(items) => messages.extend(items),
                    single => messages.push(single),
                }
            }
            let mut answer = None;
            for m in messages {
                match read_value(&self.url, m) {
                    Some(Incoming::Response { id: rid, outcome }) if same_id(&rid, id) => answer = Some(outcome),
                    Some(Incoming::Server(msg)) => self.deliver(msg).await,
                    _ => {}
                }
            }
            match answer {
                Some(outcome) => outcome_to_result(outcome),
                None => {
                    Err(ClientError::Transport(format!("the server at {} answered without a response to request {id}", self.url))
                        .into())
                }
            }
        } else {
            Err(ClientError::Transport(format!(
                "the server at {} answered with content type {ct:?}; expected application/json or text/event-stream",
                self.url
            ))
            .into())
        }
    }

    /// Picks up a request's answer stream after `after_event_id` (see
    /// [`Session::resume_request`](super::Session::resume_request)).
    pub(super) async fn resume_response_stream(
        &self,
        id: &Value,
        after_event_id: &str,
        sink: &mpsc::Sender<PeerMessage>,
    ) -> Result<Box<RawValue>, ReqError> {
        let events = sse::no_events(self.decoder().resuming(Some(after_event_id.to_owned()), None));
        let reading = Reading { method: "the resumed request", id, track: None, sink: Some(sink), resume_at_once: true };
        self.read_response_stream(events, reading).await
    }

    /// Reads a request's SSE stream up to its response, resuming it with
    /// `GET` + `Last-Event-ID` when it drops first.
    async fn read_response_stream(&self, mut events: Events, reading: Reading<'_>) -> Result<Box<RawValue>, ReqError> {
        let Reading { method, id, mut track, sink, resume_at_once } = reading;
        let mut failures = 0u32;
        // A resumed reading goes on from the last event with a message.
        let mut message_cursor = resume_at_once.then(|| events.decoder().last_id().map(str::to_owned)).flatten();
        // Only a stream this reading resumed is watched for silence.
        let mut silence = resume_at_once.then_some(RESUMED_SILENCE);
        let mut resumed = false;
        loop {
            let (mut broke, mut silent, mut got_message) = (None, false, false);
            loop {
                let item = match silence.filter(|_| resumed) {
                    Some(limit) => match tokio::time::timeout(limit, events.next()).await {
                        Ok(item) => item,
                        Err(_) => {
                            silent = true;
                            break;
                        }
                    },
                    None => events.next().await,
                };
                let Some(item) = item else { break };
                let event = match item {
                    Ok(e) => e,
                    // Reading it again would meet the same bytes: the request ends here.
                    Err(e @ (SseError::TooLarge { .. } | SseError::Malformed(_))) => {
                        return Err(ClientError::Transport(format!("the stream of {method} from {}: {e}", self.url)).into());
                    }
                    Err(e) => {
                        broke = Some(e);
                        break;
                    }
                };
                // Only the first event ID counts: noted once, then no more locking.
                if let Some(noting) = track
                    && let Some(event_id) = events.decoder().last_id()
                {
                    noting.saw_event_id(event_id);
                    track = None;
                }
                if event.kind() != "message" || event.data.is_empty() {
                    continue;
                }
                got_message = true;
                if let Some(cursor) = message_cursor.as_mut()
                    && let Some(event_id) = events.decoder().last_id()
                {
                    event_id.clone_into(cursor);
                }
                match read_event(&self.url, &event.data) {
                    Some(Incoming::Response { id: rid, outcome }) if same_id(&rid, id) => return outcome_to_result(outcome),
                    Some(Incoming::Server(msg)) => match sink {
                        Some(sink) => {
                            if sink.send(msg).await.is_err() {
                                return Err(ClientError::Transport("the reader of the resumed request went away".into()).into());
                            }
                        }
                        None => self.deliver(msg).await,
                    },
                    _ => {}
                }
            }
            if events.decoder().received_any() {
                failures = 0;
            }
            if got_message {
                silence = silence.map(|_| RESUMED_SILENCE);
            }
            let why = broke.map(|e| format!(" ({e})")).unwrap_or_default();
            let Some(last) = message_cursor.clone().or_else(|| events.decoder().last_id().map(str::to_owned)) else {
                return Err(ClientError::Transport(format!(
                    "the server at {} closed the stream of {method} before answering{why}, and gave no event ID to resume from",
                    self.url
                ))
                .into());
            };
            if silent {
                // Not a failure: the answer may be stored and not sent live.
                silence = silence.map(|s| (s * 2).min(MAX_RESUMED_SILENCE));
                failures = failures.saturating_sub(1);
            }
            failures += 1;
            if failures > MAX_RESUME_ATTEMPTS {
                return Err(ClientError::Transport(format!(
                    "the stream of {method} from {} dropped {MAX_RESUME_ATTEMPTS} times before its answer{why}",
                    self.url
                ))
                .into());
            }
            let retry = events.decoder().retry();
            let delay = if (resume_at_once && failures == 1) || silent { Duration::ZERO } else { backoff(retry, failures) };
            resumed = true;
            tracing::debug!(url = %self.url, "the stream of {method} dropped{why}; resuming after event {last} in {delay:?}");
            tokio::time::sleep(delay).await;
            let request = self.http.get(&self.url).headers(self.headers(false)).header(headers::LAST_EVENT_ID, last.as_str());
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(url = %self.url, "resuming: {}", transport_error(&self.url, e));
                    // Try again from the same event.
                    events = sse::no_events(self.decoder().resuming(Some(last), retry));
                    continue;
                }
            };
            let status = response.status();
            if !status.is_success() {
                let detail = error_message(response).await;
                return Err(ClientError::Transport(format!(
                    "the stream of {method} dropped before its answer and the server at {} refused to resume it (HTTP {status}: {detail})",
                    self.url
                ))
                .into());
            }
            events = sse::events(response, self.decoder().resuming(Some(last), retry));
        }
    }

    /// DELETE: the server may forget the session now (errors logged, not returned).
    pub(super) async fn terminate(&self) {
        let Some(sid) = self.session_id.get() else { return };
        let request = self.http.delete(&self.url).headers(self.headers(false));
        match tokio::time::timeout(Duration::from_secs(10), request.send()).await {
            Ok(Ok(r)) if r.status().is_success() || r.status() == StatusCode::NOT_FOUND => {
                tracing::debug!(url = %self.url, "session {sid} terminated");
            }
            Ok(Ok(r)) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                tracing::debug!(url = %self.url, "the server does not allow DELETE; session left to expire");
            }
            Ok(Ok(r)) => {
                let status = r.status();
                let message = error_message(r).await;
                tracing::warn!(url = %self.url, "terminating the session: HTTP {status}: {message}");
            }
            Ok(Err(e)) => tracing::warn!(url = %self.url, "terminating the session: {}", transport_error(&self.url, e)),
            Err(_) => tracing::warn!(url = %self.url, "terminating the session: no answer to DELETE within 10s"),
        }
    }
}

/// The standalone GET stream of a Streamable HTTP session: open, deliver,
/// reconnect with `Last-Event-ID` after `retry` (capped backoff); ends when
/// the session closes or the server offers none (405) or forgot it (404).
async fn standalone_stream(weak: Weak<Inner>, mut closed: watch::Receiver<bool>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut last_id: Option<String> = None;
    let mut retry: Option<Duration> = None;
    let mut failures = 0u32;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let url = inner.url.clone();
        let decoder = inner.decoder();
        let mut request = inner.http.get(&inner.url).headers(inner.headers(false));
        if let Some(id) = &last_id {
            request = request.header(headers::LAST_EVENT_ID, id.as_str());
        }
        drop(inner);
        let response = tokio::select! {
            r = request.send() => r,
            _ = closed.changed() => return,
        };
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        match response {
            Ok(r) if r.status().is_success() && content_type(&r).starts_with(headers::EVENT_STREAM) => {
                let mut events = sse::events(r, decoder.resuming(last_id.clone(), None));
                loop {
                    let item = tokio::select! {
                        item = events.next() => item,
                        _ = closed.changed() => return,
                    };
                    match item {
                        Some(Ok(event)) if event.kind() == "message" => {
                            if let Some(Incoming::Server(msg)) = read_event(&url, &event.data) {
                                let Some(inner) = weak.upgrade() else { return };
                                inner.deliver(msg).await;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::debug!(%url, "standalone stream broke: {e}");
                            break;
                        }
                        None => break,
                    }
                }
                let decoder = events.into_decoder();
                last_id = decoder.last_id().map(str::to_owned);
                retry = decoder.retry().or(retry);
                failures = if decoder.received_any() { 1 } else { failures + 1 };
            }
            Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                tracing::debug!(%url, "the server offers no standalone stream");
                return;
            }
            Ok(r) if r.status() == StatusCode::NOT_FOUND => {
                tracing::debug!(%url, "standalone stream: the server forgot the session");
                return;
            }
            Ok(r) => {
                failures += 1;
                tracing::debug!(%url, "standalone stream: HTTP {}", r.status());
            }
            Err(e) => {
                failures += 1;
                tracing::debug!(%url, "standalone stream: {e}");
            }
        }
        let delay = backoff(retry, failures);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closed.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_the_servers_retry_and_is_capped() {
        assert_eq!(backoff(Some(Duration::from_millis(200)), 1), Duration::from_millis(200));
        assert_eq!(backoff(Some(Duration::from_millis(200)), 3), Duration::from_millis(800));
        assert_eq!(backoff(None, 50), MAX_BACKOFF);
    }
}
