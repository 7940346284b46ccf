//! The 2024-11-05 HTTP+SSE transport, the fallback for servers that do not
//! speak Streamable HTTP: a GET opens the event stream, whose `endpoint`
//! event names the URL (same origin only) to POST messages to; every answer
//! arrives on that one event stream, matched to its request by id. Closing
//! the event stream ends the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use reqwest::StatusCode;
use reqwest::header::HeaderValue;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use tether_wire::headers::EVENT_STREAM;
use tether_wire::sse::Decoder;

use super::{
    ClientOptions, Incoming, Inner, Kind, Session, build_base_headers, check_url, content_type, error_message, outcome_to_result,
    read_event, transport_error,
};
use crate::error::{ClientError, ReqError};
use crate::sse::{self, Events};

impl Session {
    pub(super) async fn connect_legacy(
        http: reqwest::Client,
        url: &str,
        options: ClientOptions,
        initialize_params: Value,
    ) -> Result<(Session, Value), ClientError> {
        let base = build_base_headers(&options)?;
        let mut headers = base.clone();
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static(EVENT_STREAM));
        let response = tokio::time::timeout(options.request_timeout, http.get(url).headers(headers).send())
            .await
            .map_err(|_| ClientError::Transport(format!("no answer to GET {url}")))?
            .map_err(|e| transport_error(url, e))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ClientError::Auth { status: status.as_u16(), message: error_message(response).await });
        }
        if !status.is_success() || !content_type(&response).starts_with(EVENT_STREAM) {
            return Err(ClientError::Transport(format!("GET {url} answered HTTP {status} without an event stream")));
        }
        let mut events = sse::events(response, Decoder::with_limit(options.max_message_bytes));
        let endpoint = tokio::time::timeout(options.request_timeout, async {
            while let Some(event) = events.next().await {
                match event {
                    Ok(e) if e.kind() == "endpoint" => return Ok(e.data.trim().to_owned()),
                    Ok(_) => continue,
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err("the event stream ended before an `endpoint` event".to_owned())
        })
        .await
        .map_err(|_| ClientError::Transport(format!("GET {url}: no `endpoint` event")))?
        .map_err(|e| ClientError::Transport(format!("GET {url}: {e}")))?;
        let base_url = check_url(url)?;
        let post_url = base_url
            .join(&endpoint)
            .map_err(|e| ClientError::Transport(format!("the server's endpoint {endpoint:?} is not a URL: {e}")))?;
        if post_url.origin() != base_url.origin() {
            return Err(ClientError::Transport(format!(
                "the server's endpoint {post_url} is on another origin than {url}; refusing to send messages there"
            )));
        }
        let channel = Arc::new(LegacyChannel {
            endpoint: post_url.to_string(),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
        });
        let session = Session::build(http, url, options, Kind::Legacy(channel.clone()))?;
        let reader = tokio::spawn(legacy_reader(url.to_owned(), Arc::downgrade(&session.inner), channel, events));
        session.inner.tasks.lock().push(reader);
        let result = session.request_raw("initialize", Some(initialize_params), None).await.map_err(ReqError::into_client)?;
        session.finish_initialize(&result)?;
        session.notify("notifications/initialized", None).await?;
        Ok((session, result))
    }
}

impl Inner {
    pub(super) async fn legacy_request(
        &self,
        channel: &LegacyChannel,
        message: &Value,
        id: &Value,
        accepted: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Box<RawValue>, ReqError> {
        if !channel.alive.load(Ordering::Acquire) {
            return Err(ClientError::SessionNotFound.into());
        }
        let (tx, rx) = oneshot::channel();
        let key = id.to_string();
        channel.pending.lock().insert(key.clone(), tx);
        let posted = self.post(&channel.endpoint, message).await;
        if let Err(e) = posted {
            channel.pending.lock().remove(&key);
            return Err(e);
        }
        if let Some(f) = accepted {
            f();
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => {
                Err(ClientError::Transport(format!("the server at {} closed its event stream before answering", self.url)).into())
            }
        }
    }
}

/// The answer to one request, as the reader of the event stream hands it over.
type Answer = Result<Box<RawValue>, ReqError>;

/// The state of an HTTP+SSE (2024-11-05) session.
pub(super) struct LegacyChannel {
    /// Where messages are POSTed (from the `endpoint` event).
    pub(super) endpoint: String,
    /// Requests waiting for their answer on the event stream.
    pending: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    /// The event stream is open.
    pub(super) alive: AtomicBool,
}

async fn legacy_reader(url: String, weak: Weak<Inner>, channel: Arc<LegacyChannel>, mut events: Events) {
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("HTTP+SSE event stream broke: {e}");
                break;
            }
        };
        if event.kind() != "message" {
            continue;
        }
        match read_event(&url, &event.data) {
            Some(Incoming::Response { id, outcome }) => {
                let waiting = channel.pending.lock().remove(&id.to_string());
                if let Some(tx) = waiting {
                    let _ = tx.send(outcome_to_result(outcome));
                }
            }
            Some(Incoming::Server(msg)) => {
                let Some(inner) = weak.upgrade() else { break };
                inner.deliver(msg).await;
            }
            None => {}
        }
    }
    channel.alive.store(false, Ordering::Release);
    channel.pending.lock().clear();
}
