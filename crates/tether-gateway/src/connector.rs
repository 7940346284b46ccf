//! [`Connector`]: how the gateway reaches one upstream, one implementation
//! per transport (`stdio::StdioConnector`, `url::UrlConnector`, picked in
//! `connect.rs`).
//! The gateway application asks it to start a connection, to carry on a
//! stored upstream session, for its capacity (how many connections may
//! live, when an idle one stops) and for a 2026-07-28 upstream to pass
//! sessionless clients through to ([`Passthrough`]); it never matches on
//! the transport. The transports depend on this module, never the other
//! way round.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tether_server::{RawResult, RequestCtx};
use tether_wire::RpcError;

use crate::processes::{ProcessPermit, Processes};
use crate::upstream::{PeerSink, Started, Upstream};

/// How long a pooled connection may sit unused before it is closed.
pub(crate) const DEFAULT_POOL_IDLE: Duration = Duration::from_secs(300);

/// How many connections of an upstream may live, and for how long idle.
#[derive(Clone)]
pub(crate) struct Capacity {
    /// The hard cap on live connections, when they are processes: a new one
    /// starts only with a permit from it.
    pub processes: Option<Arc<Processes>>,
    /// A session's connection with nothing in flight is stopped after this.
    pub idle_timeout: Option<Duration>,
    /// Pooled connections of sessionless clients, and how long one may idle.
    pub pool_max: usize,
    pub pool_idle: Duration,
}

/// What a new connection is for.
pub(crate) struct StartRequest<'a> {
    /// The tether session it serves (for logs), or what it is for.
    pub session: &'a str,
    /// The client's `initialize` params, as the upstream gets them.
    pub params: Value,
    /// The client's `Authorization` header value, if the connector needs it.
    pub authorization: Option<String>,
    /// Its place under [`Capacity::processes`], if the upstream has a cap.
    pub permit: Option<ProcessPermit>,
    /// Where the upstream's own messages go, in order.
    pub sink: Arc<dyn PeerSink>,
}

/// One upstream's transport.
#[async_trait]
pub(crate) trait Connector: Send + Sync + 'static {
    fn capacity(&self) -> Capacity;

    /// Starts a connection and initializes it with `request.params`.
    async fn start(&self, request: StartRequest<'_>) -> Result<Started, RpcError>;

    /// Carries on the upstream session an earlier connection stored
    /// ([`Started::carry_on`]), maybe of another process; `None` when the
    /// transport cannot or the upstream forgot it (a new one is started).
    async fn attach(
        &self,
        _session: &str,
        _carry_on: &Value,
        _authorization: Option<String>,
        _sink: Arc<dyn PeerSink>,
    ) -> Option<Arc<dyn Upstream>> {
        None
    }

    /// Whether the upstream may forget a session it gave (an HTTP server
    /// restarted): then a request refused for it is sent again on a new one.
    fn forgets_sessions(&self) -> bool {
        false
    }

    /// Whether the connector needs the client's `Authorization`: to send it
    /// upstream (`forward_auth`), or to trade it for tether's own token (an
    /// `oauth` token exchange).
    fn needs_client_authorization(&self) -> bool {
        false
    }

    /// The upstream as a 2026-07-28 server, with what it says of itself
    /// (as an `initialize` result), if it speaks that revision.
    async fn passthrough(&self) -> Option<(Arc<dyn Passthrough>, Map<String, Value>)> {
        None
    }
}

/// A 2026-07-28 upstream's own sessionless service: a sessionless client's
/// requests are passed through to it as the client sent them.
#[async_trait]
pub(crate) trait Passthrough: Send + Sync + 'static {
    /// Forwards one request of a sessionless client as it sent it.
    async fn request(&self, ctx: &RequestCtx, method: &str, params: Map<String, Value>) -> Result<RawResult, RpcError>;
}
