//! [`Connector`]: how the gateway reaches one upstream, one implementation
//! per transport ([`crate::stdio::StdioConnector`], [`crate::http::UrlConnector`]).
//! The gateway application asks it to start a connection, to carry on a
//! stored upstream session, for its capacity (how many connections may
//! live, when an idle one stops) and for a 2026-07-28 upstream to pass
//! sessionless clients through to; it never matches on the transport.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tether_wire::RpcError;

use crate::config::{Target, UpstreamConfig};
use crate::passthrough::Passthrough;
use crate::processes::{ProcessPermit, Processes};
use crate::upstream::{PeerSink, Started, Upstream};

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
    async fn passthrough(&self) -> Option<(Passthrough, Map<String, Value>)> {
        None
    }
}

/// The connector of an upstream as configured.
pub(crate) fn for_config(config: &UpstreamConfig) -> Arc<dyn Connector> {
    match &config.target {
        Target::Command(spec) => Arc::new(crate::stdio::StdioConnector::new(spec.clone(), &config.name, config.init_timeout)),
        Target::Url(spec) => Arc::new(crate::http::UrlConnector::new(spec.clone(), &config.name, config.init_timeout)),
    }
}
