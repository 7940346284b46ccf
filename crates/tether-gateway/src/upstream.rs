//! One connection to an upstream MCP server, for one tether session: the
//! seam between the gateway application (which knows tether sessions) and
//! the transports (a child process over stdio, or an HTTP session).
//!
//! An upstream is started already initialized (the caller passes the
//! client's `initialize` params and gets the upstream's result). Messages the
//! upstream sends on its own (notifications, its requests such as
//! `sampling/createMessage`) go to the [`PeerSink`] the caller gives the
//! transport, one at a time, in order, each delivered before the transport
//! reads on: what came before an answer reaches the client before it. The
//! gateway answers the upstream's requests with [`Upstream::answer`].

use async_trait::async_trait;
use serde_json::Value;
use serde_json::value::RawValue;
use tether_client::RequestTrack;
use tether_wire::RpcError;
use tokio::sync::mpsc;

/// The error text of a request that was in flight when its upstream died.
const UPSTREAM_RESTARTED: &str = "upstream restarted; the request may or may not have taken effect";
/// The error text of a request whose upstream forgot its session.
const UPSTREAM_FORGOT_SESSION: &str = "the upstream forgot its session (HTTP 404)";

/// Why a request to an upstream did not get a result. The gateway decides
/// on the kind (send again on a new connection, say the child died during
/// `initialize`), never on an error's text; the client sees the
/// [`RpcError`] each kind becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamError {
    /// The upstream answered with this error, or tether ended the request
    /// with it (a timeout, a bound, an unreadable answer): the client sees
    /// it as it is.
    Failed(RpcError),
    /// The connection ended with the request in flight: it may or may not
    /// have taken effect (`-32603`, "upstream restarted; …").
    Restarted,
    /// The upstream answered 404 for its session: it forgot it (a restart,
    /// an expiry). The connection is dead; the gateway makes a new one and,
    /// where it is safe, sends the request again.
    ForgotSession,
    /// The connection was gone before the request went out, so it was not
    /// sent; the text names the upstream and what it last said.
    NotRunning(String),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Failed(error) => &error.message,
            Self::Restarted => UPSTREAM_RESTARTED,
            Self::ForgotSession => UPSTREAM_FORGOT_SESSION,
            Self::NotRunning(message) => message,
        })
    }
}

impl std::error::Error for UpstreamError {}

impl From<RpcError> for UpstreamError {
    fn from(error: RpcError) -> Self {
        Self::Failed(error)
    }
}

impl From<UpstreamError> for RpcError {
    fn from(error: UpstreamError) -> Self {
        match error {
            UpstreamError::Failed(error) => error,
            UpstreamError::Restarted => RpcError::internal(UPSTREAM_RESTARTED),
            UpstreamError::ForgotSession => RpcError::internal(UPSTREAM_FORGOT_SESSION),
            UpstreamError::NotRunning(message) => RpcError::internal(message),
        }
    }
}

/// What a request to an upstream gives back: its result as the upstream
/// wrote it, or why there is none.
pub type UpstreamResult = Result<Box<RawValue>, UpstreamError>;

/// A message the upstream sent that is not an answer to one of ours (a
/// request's `id` is the upstream's own: pass it back to [`Upstream::answer`]),
/// and where a transport hands them.
pub use tether_wire::{PeerMessage, PeerSink};

/// What an upstream start gives back.
pub struct Started {
    pub upstream: std::sync::Arc<dyn Upstream>,
    /// The upstream's `initialize` result, unparsed.
    pub initialize_result: Box<RawValue>,
    /// What another process needs to carry on this connection without a new
    /// `initialize` (an HTTP upstream's session ID and revision), stored with
    /// the tether session; `None` when it cannot be carried on (a child).
    pub carry_on: Option<Value>,
    /// The connection was taken over as it was (a child the keeper kept
    /// from an earlier engine), not initialized now: what a new connection
    /// is told after `initialize` (`notifications/initialized`, the log
    /// level, subscriptions) it has had already. Its `initialize_result` is
    /// then `{}`.
    pub resumed: bool,
}

/// A request an engine that died had sent upstream (see
/// [`Upstream::cut_off_call`]): its ID there and its progress tokens.
#[derive(Debug, Clone)]
pub struct CutOffCall {
    pub id: Value,
    pub progress: Option<crate::progress::Progress>,
}

/// What names a client request across processes: its session and stream.
pub fn request_key(session: &str, stream: &str) -> String {
    format!("{session}/{stream}")
}

/// A live upstream connection.
#[async_trait]
pub trait Upstream: Send + Sync + 'static {
    /// Sends a request under an id of the upstream connection's own and waits
    /// for its answer (the result unparsed). Dropping the future before the
    /// answer sends `notifications/cancelled` upstream for that id. A request
    /// in flight when the upstream dies ends with
    /// [`UpstreamError::Restarted`].
    async fn request(&self, method: &str, params: Option<Value>) -> UpstreamResult;

    /// [`Upstream::request`], noting in `track` where its answer can be
    /// picked up from by another process ([`Upstream::resume`]). A
    /// transport that cannot leaves `track` empty.
    async fn request_tracked(&self, method: &str, params: Option<Value>, _track: &RequestTrack) -> UpstreamResult {
        self.request(method, params).await
    }

    /// Whether [`Upstream::request_tracked`] can name a point of a request's
    /// answer stream that another process picks it up from
    /// ([`Upstream::resume`]): only then can a recovery note help, so only
    /// then does a slow request wait to leave one. Default: no.
    fn resumable(&self) -> bool {
        false
    }

    /// Picks up the answer to a request an earlier connection (maybe of a
    /// process that died since) sent on this upstream session, after the
    /// event `after` of its stream (both from a [`RequestTrack`]). What the
    /// upstream sends before the answer arrives on `messages`, in order.
    async fn resume(&self, _request_id: Value, _after: &str, _messages: mpsc::Sender<PeerMessage>) -> UpstreamResult {
        Err(UpstreamError::Restarted)
    }

    /// Whether requests sent with [`Upstream::request_for`] outlive this
    /// process: a child a keeper holds keeps running them, and the next
    /// engine finds them again ([`Upstream::cut_off_call`]) with no
    /// recovery note. Default: no.
    fn keeps_calls(&self) -> bool {
        false
    }

    /// [`Upstream::request`] for the client request `ctx`, whose progress
    /// goes upstream under `progress`'s issued token: a transport that
    /// [`keeps_calls`](Upstream::keeps_calls) names it so that the next
    /// engine finds it again, and lets go of its answer only once the
    /// client's final response is stored.
    async fn request_for(
        &self,
        _ctx: &tether_server::RequestCtx,
        method: &str,
        params: Option<Value>,
        _progress: Option<&crate::progress::Progress>,
    ) -> UpstreamResult {
        self.request(method, params).await
    }

    /// The request sent for the client request named `key` (its session and
    /// stream: [`request_key`]) by an engine that died since, if this
    /// connection has it still running: pick its answer up with
    /// [`Upstream::resume`].
    fn cut_off_call(&self, _key: &str) -> Option<CutOffCall> {
        None
    }

    /// This process lets go of the connection for good (it stops or hands
    /// over to a new engine): a kept child stays with its keeper; anything
    /// else closes as [`Upstream::close`] without ending its session.
    async fn leave(&self) {
        self.close(false).await;
    }

    /// Sends a notification.
    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError>;

    /// Answers one of the upstream's requests.
    async fn answer(&self, id: Value, outcome: Result<Value, RpcError>) -> Result<(), RpcError>;

    /// The tether session this connection serves, for its logs, when it
    /// turns out to be another than the one it was started for.
    fn tag_session(&self, _session: &str) {}

    /// The caller's `Authorization` on a request about to use this
    /// connection (given only where the connector needs it: a token
    /// exchange trades the newest one when the upstream's token is due).
    fn present(&self, _client_authorization: Option<&str>) {}

    /// False once the connection is gone (the child exited, the HTTP session
    /// was refused with 404): the gateway starts a new one.
    fn is_alive(&self) -> bool;

    /// Ends the connection (kills the child; for HTTP, DELETEs the session
    /// when `end_session`, else just lets go of it).
    async fn close(&self, end_session: bool);
}
