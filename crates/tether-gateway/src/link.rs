//! One tether session's link to its upstream: the live connection (if any),
//! the client requests in flight through it (so the upstream's progress,
//! log messages and requests reach the client on the right stream), and the
//! sink that delivers what the upstream sends on its own.
//!
//! Progress tokens are tether's own upstream ([`Progress`]).
//!
//! A link lives in the session's in-memory local state; the durable part
//! (the client's `initialize`, its log level and subscriptions) lives in the
//! session's app state, so a new connection can be initialized the same way
//! at any time: after a tether restart, on another replica, after the child
//! died.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use tether_server::{Authorized, RequestCtx, SessionCtx};

use futures::future::BoxFuture;

use crate::progress::Progress;
use crate::upstream::{PeerMessage, PeerSink, Upstream};

/// How long the client may take to answer a request of the upstream
/// (sampling, elicitation: a person may be answering).
pub(crate) const CLIENT_ANSWER_WAIT: Duration = Duration::from_secs(600);

/// A live connection, and the sink its upstream's own messages go to.
#[derive(Clone)]
pub(crate) struct Connection {
    pub upstream: Arc<dyn Upstream>,
    pub sink: Arc<LinkSink>,
}

impl Connection {
    /// `upstream`, started with `sink` as the place for its own messages.
    pub fn new(upstream: Arc<dyn Upstream>, sink: Arc<LinkSink>) -> Self {
        sink.answers_through(&upstream);
        Self { upstream, sink }
    }
}

/// Whether an upstream notification is about the server as a whole (its
/// lists, a subscribed resource) rather than about a request in flight.
pub(crate) fn is_session_level(method: &str) -> bool {
    method.ends_with("/list_changed") || method == "notifications/resources/updated"
}

/// A session's link (in `SessionCtx::local`).
#[derive(Default)]
pub struct Link {
    /// The live connection; a new one is made under this lock.
    pub(crate) live: tokio::sync::Mutex<Option<Connection>>,
    in_flight: Mutex<BTreeMap<u64, InFlight>>,
    next: AtomicU64,
    last_used: Mutex<Option<Instant>>,
    /// The client's latest `Authorization` (for `forward_auth`; in memory only).
    /// The latest bearer token a client request of the session presented.
    authorization: Mutex<Option<Arc<str>>>,
    /// Whose session this is (known once it connected).
    principal: Mutex<Option<String>>,
}

/// A client request being served through the link.
struct InFlight {
    ctx: RequestCtx,
    progress: Option<Progress>,
}

/// Removes an in-flight entry however the request ends.
pub(crate) struct InFlightGuard<'a> {
    link: &'a Link,
    key: u64,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.link.in_flight.lock().remove(&self.key);
        self.link.touch();
    }
}

impl Link {
    /// The client's `Authorization` to send upstream now (`Bearer` and the
    /// token): this request's token, remembered for later, or (for a
    /// request or notification without one) the latest remembered.
    pub(crate) fn authorization(&self, presented: Option<&Authorized>) -> Option<String> {
        let mut latest = self.authorization.lock();
        if let Some(token) = presented.and_then(Authorized::bearer_token)
            && latest.as_deref() != Some(token)
        {
            *latest = Some(Arc::from(token));
        }
        latest.as_deref().map(bearer_header)
    }

    /// Notes a client request going through the link (until the guard drops).
    pub(crate) fn enter(&self, ctx: &RequestCtx, progress: Option<Progress>) -> InFlightGuard<'_> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.in_flight.lock().insert(key, InFlight { ctx: ctx.clone(), progress });
        self.touch();
        InFlightGuard { link: self, key }
    }

    pub(crate) fn set_principal(&self, principal: &str) {
        let mut p = self.principal.lock();
        if p.as_deref() != Some(principal) {
            *p = Some(principal.to_owned());
        }
    }

    pub(crate) fn principal(&self) -> Option<String> {
        self.principal.lock().clone()
    }

    /// Whether a connection is live now (false while one is being made).
    pub(crate) fn has_live(&self) -> bool {
        self.live.try_lock().is_ok_and(|connection| connection.is_some())
    }

    pub(crate) fn touch(&self) {
        *self.last_used.lock() = Some(Instant::now());
    }

    /// Nothing in flight since this long (None: never used or busy).
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        let busy = !self.in_flight.lock().is_empty();
        if busy {
            return None;
        }
        self.last_used.lock().map(|at| at.elapsed())
    }

    /// Where a message of the upstream goes: to the request whose issued
    /// progress token it carries (translated back to the client's), else,
    /// without a token, to the only request in flight (stdio has no other
    /// way to say) or the session's standalone stream (`None` context). A
    /// message under a token no request here was issued is foreign: `Err`.
    fn route(&self, message: PeerMessage) -> Result<(Option<RequestCtx>, PeerMessage), PeerMessage> {
        let map = self.in_flight.lock();
        let token = match &message {
            PeerMessage::Notification { params, .. } | PeerMessage::Request { params, .. } => {
                params.as_ref().and_then(|p| p.get("progressToken")).cloned()
            }
        };
        if let Some(token) = token {
            let owner = map.values().find(|f| f.progress.as_ref().is_some_and(|p| p.issued == token));
            let Some(owner) = owner else { return Err(message) };
            let translated = Progress::translate(owner.progress.as_ref(), message)?;
            return Ok((Some(owner.ctx.clone()), translated));
        }
        let only = if map.len() == 1 { map.values().next().map(|f| f.ctx.clone()) } else { None };
        Ok((only, message))
    }
}

/// Messages of a resumed request waiting for the gateway.
pub(crate) const RESUMED_BUFFER: usize = 64;

/// The messages a cut-off request had stored before the crash, to tell the
/// ones an upstream sends again (a resumed stream starts at its beginning)
/// from new ones. The upstream's messages on the stream are a subsequence
/// of the stored ones, in order; a message matches the next stored one
/// equal to it in method and params.
pub(crate) struct AlreadySent {
    sent: Vec<Value>,
    next: usize,
}

impl AlreadySent {
    pub fn new(sent: Vec<Value>) -> Self {
        Self { sent, next: 0 }
    }

    /// Whether `message` is the next one (or a later one) of those stored;
    /// if so it counts as delivered.
    pub fn contains(&mut self, message: &PeerMessage) -> bool {
        let (method, params) = match message {
            PeerMessage::Notification { method, params } | PeerMessage::Request { method, params, .. } => (method, params),
        };
        let found = self.sent[self.next..].iter().position(|stored| {
            stored.get("method").and_then(Value::as_str) == Some(method.as_str()) && stored.get("params") == params.as_ref()
        });
        match found {
            Some(at) => {
                self.next += at + 1;
                true
            }
            None => false,
        }
    }
}

/// Delivers one message the upstream sent on a request's own stream to
/// that request's client stream; its requests (sampling, elicitation) are
/// answered concurrently.
pub(crate) async fn deliver_to_request(ctx: &RequestCtx, upstream: Option<&Arc<dyn Upstream>>, message: PeerMessage) {
    match message {
        PeerMessage::Notification { method, params } => {
            if let Err(e) = ctx.notify(&method, params).await {
                tracing::warn!(%method, error = %e.message, "could not deliver an upstream notification");
            }
        }
        PeerMessage::Request { id, method, params } => {
            let (Some(session), Some(upstream)) = (ctx.session(), upstream) else { return unanswerable(&method) };
            let (ctx, upstream) = (ctx.clone(), upstream.clone());
            session.spawn(async move {
                let answer = ctx.request_client(&method, params, CLIENT_ANSWER_WAIT).await;
                if let Err(e) = upstream.answer(id, answer).await {
                    tracing::warn!(%method, error = %e.message, "could not return the client's answer upstream");
                }
            });
        }
    }
}

/// Delivers one message the upstream sent on its own, not about any one
/// request, to the session's standalone stream; its requests are answered
/// concurrently.
async fn deliver_to_session(session: &SessionCtx, upstream: Option<&Arc<dyn Upstream>>, message: PeerMessage) {
    match message {
        PeerMessage::Notification { method, params } => {
            if let Err(e) = session.notify(&method, params).await {
                tracing::warn!(session = session.session_id(), %method, error = %e.message, "could not deliver an upstream notification");
            }
        }
        PeerMessage::Request { id, method, params } => {
            let Some(upstream) = upstream else { return unanswerable(&method) };
            let (task_session, upstream) = (session.clone(), upstream.clone());
            session.spawn(async move {
                let answer = task_session.request_client(&method, params, CLIENT_ANSWER_WAIT).await;
                if let Err(e) = upstream.answer(id, answer).await {
                    tracing::warn!(session = task_session.session_id(), %method, error = %e.message, "could not return the client's answer upstream");
                }
            });
        }
    }
}

/// A request of the upstream made while its connection was still being
/// started: there is nothing to answer it through yet.
fn unanswerable(method: &str) {
    tracing::debug!(%method, "dropping a request of the upstream made before its connection was up");
}

/// Counts and logs a message of the upstream that belongs to no request of
/// this session (see the module doc); it is not relayed.
pub(crate) fn drop_foreign(upstream: &str, session: &str, message: &PeerMessage) {
    tether_server::metrics::upstream_dropped(upstream, tether_server::metrics::Dropped::Foreign);
    let method = match message {
        PeerMessage::Notification { method, .. } | PeerMessage::Request { method, .. } => method,
    };
    tracing::debug!(upstream, session, %method, "dropping a message of the upstream under a progress token no request of this session was given");
}

/// Where a member's `notifications/…/list_changed` go instead of straight
/// to the client: its virtual server, which merges its members' into one.
pub(crate) trait ListChanges: Send + Sync {
    fn changed<'a>(&'a self, session: &'a SessionCtx, method: &'a str) -> BoxFuture<'a, ()>;
}

/// Messages a connection made before its session existed may park.
const PARKED_MAX: usize = 256;

/// Where one connection of a session's link hands what the upstream sends
/// on its own, in order, each delivered before the transport reads on: to
/// the request it belongs to, else to the session's standalone stream (see
/// [`Link::route`]); its requests are answered concurrently (a sampling
/// request may wait on a person), bounded by the engine's limit on requests
/// waiting for the client. A connection made before its session exists (in
/// `initialize`) parks what comes meanwhile, at most [`PARKED_MAX`], until
/// the session's first request attaches it.
pub(crate) struct LinkSink {
    link: Weak<Link>,
    upstream_name: String,
    /// A member's list changes go here (see [`ListChanges`]).
    changes: Option<Arc<dyn ListChanges>>,
    session: OnceLock<SessionCtx>,
    /// The connection the upstream's requests are answered through.
    upstream: OnceLock<Weak<dyn Upstream>>,
    parked: Mutex<VecDeque<PeerMessage>>,
    /// One delivery at a time, so parked messages keep their place.
    order: tokio::sync::Mutex<()>,
}

impl LinkSink {
    pub(crate) fn new(link: &Arc<Link>, upstream_name: &str, changes: Option<Arc<dyn ListChanges>>) -> Arc<Self> {
        Arc::new(Self {
            link: Arc::downgrade(link),
            upstream_name: upstream_name.to_owned(),
            changes,
            session: OnceLock::new(),
            upstream: OnceLock::new(),
            parked: Mutex::default(),
            order: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn answers_through(&self, upstream: &Arc<dyn Upstream>) {
        let _ = self.upstream.set(Arc::downgrade(upstream));
    }

    /// The session is known: what was parked is delivered now, the rest as
    /// it comes. True the first time.
    pub(crate) async fn attach(&self, session: &SessionCtx) -> bool {
        if self.session.get().is_some() {
            return false;
        }
        let _order = self.order.lock().await;
        if self.session.set(session.clone()).is_err() {
            return false;
        }
        let parked = std::mem::take(&mut *self.parked.lock());
        for message in parked {
            self.dispatch(session, message).await;
        }
        true
    }

    async fn dispatch(&self, session: &SessionCtx, message: PeerMessage) {
        let upstream = self.upstream.get().and_then(Weak::upgrade);
        let upstream = upstream.as_ref();
        if let (PeerMessage::Notification { method, .. }, Some(changes)) = (&message, &self.changes)
            && method.ends_with("/list_changed")
        {
            return changes.changed(session, method).await;
        }
        let session_level = matches!(&message, PeerMessage::Notification { method, .. } if is_session_level(method));
        let Some(link) = self.link.upgrade().filter(|_| !session_level) else {
            return deliver_to_session(session, upstream, message).await;
        };
        match link.route(message) {
            Ok((Some(ctx), message)) => deliver_to_request(&ctx, upstream, message).await,
            Ok((None, message)) => deliver_to_session(session, upstream, message).await,
            Err(foreign) => drop_foreign(&self.upstream_name, session.session_id(), &foreign),
        }
    }
}

impl PeerSink for LinkSink {
    fn deliver(&self, message: PeerMessage) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _order = self.order.lock().await;
            match self.session.get() {
                Some(session) => self.dispatch(session, message).await,
                None => {
                    let mut parked = self.parked.lock();
                    if parked.len() >= PARKED_MAX {
                        tracing::debug!(upstream = %self.upstream_name, "too many messages before the session's first request; dropping the oldest");
                        parked.pop_front();
                    }
                    parked.push_back(message);
                }
            }
        })
    }
}

/// The `Authorization` header value that presents `token` upstream.
pub(crate) fn bearer_header(token: &str) -> String {
    format!("Bearer {token}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn progress(n: u64) -> PeerMessage {
        PeerMessage::Notification {
            method: "notifications/progress".into(),
            params: Some(json!({"progressToken": "p", "progress": n})),
        }
    }

    fn stored(message: &PeerMessage) -> Value {
        match message {
            PeerMessage::Notification { method, params } => json!({"jsonrpc": "2.0", "method": method, "params": params}),
            PeerMessage::Request { method, params, .. } => {
                json!({"jsonrpc": "2.0", "id": "tether-7", "method": method, "params": params})
            }
        }
    }

    #[test]
    fn a_resumed_stream_sends_on_only_what_the_client_did_not_have() {
        let log = PeerMessage::Notification {
            method: "notifications/message".into(),
            params: Some(json!({"level": "info", "data": "from the standalone stream"})),
        };
        // Stored before the crash: progress 1 and 2, with a message from
        // elsewhere between them.
        let mut already = AlreadySent::new(vec![stored(&progress(1)), stored(&log), stored(&progress(2))]);
        // The upstream sends its stream again from the start, then more.
        let resent: Vec<bool> =
            [progress(1), progress(2), progress(3), progress(4)].iter().map(|m| already.contains(m)).collect();
        assert_eq!(resent, [true, true, false, false], "1 and 2 were had, 3 and 4 are new");
        // Once past them, an equal message is new.
        assert!(!already.contains(&progress(1)));
        // A request matches by method and params, whatever its ID.
        let ask = PeerMessage::Request { id: json!(5), method: "elicitation/create".into(), params: Some(json!({"m": 1})) };
        assert!(AlreadySent::new(vec![stored(&ask)]).contains(&ask));
    }
}
