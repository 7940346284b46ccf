//! [`UrlConnector`]: a URL upstream's transport. A connection is an
//! upstream session of the session era ([`crate::http`]), or, for an
//! upstream that refuses `initialize`, of the sessionless revision
//! (`sessionless_url.rs`); its `carry_on` lets another process carry it on.
//! Sessionless clients of an upstream that speaks 2026-07-28 are passed
//! through to it (`passthrough.rs`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tether_wire::RpcError;

use crate::config::UrlSpec;
use crate::connector::{Capacity, Connector, DEFAULT_POOL_IDLE, Passthrough, StartRequest};
use crate::credentials::TokenSource;
use crate::http;
use crate::passthrough::UrlPassthrough;
use crate::upstream::{PeerSink, Started, Upstream};

/// A URL upstream's transport: an upstream session per connection, carried
/// on across processes; a 2026-07-28 upstream is passed through.
pub(crate) struct UrlConnector {
    spec: UrlSpec,
    name: String,
    init_timeout: Duration,
    /// tether's own OAuth tokens for the upstream (`[upstreams.NAME.oauth]`).
    tokens: Option<Arc<TokenSource>>,
}

impl UrlConnector {
    pub(crate) fn new(spec: UrlSpec, name: &str, init_timeout: Duration) -> Self {
        let tokens = spec.oauth.clone().and_then(|grant| match TokenSource::new(grant, name, &spec.url) {
            Ok(tokens) => Some(Arc::new(tokens)),
            Err(e) => {
                tracing::error!(upstream = %name, error = %e, "the upstream's OAuth tokens cannot be had; its requests go without");
                None
            }
        });
        Self { spec, name: name.to_owned(), init_timeout, tokens }
    }
}

#[async_trait]
impl Connector for UrlConnector {
    fn capacity(&self) -> Capacity {
        Capacity {
            processes: None,
            idle_timeout: None,
            pool_max: crate::config::DEFAULT_MAX_PROCESSES,
            pool_idle: DEFAULT_POOL_IDLE,
        }
    }

    async fn start(&self, request: StartRequest<'_>) -> Result<Started, RpcError> {
        let StartRequest { session, params, authorization, sink, .. } = request;
        let tokens = self.tokens.as_ref();
        http::start(&self.spec, &self.name, session, params, self.init_timeout, authorization, tokens, sink).await
    }

    async fn attach(
        &self,
        session: &str,
        carry_on: &Value,
        authorization: Option<String>,
        sink: Arc<dyn PeerSink>,
    ) -> Option<Arc<dyn Upstream>> {
        http::attach(&self.spec, &self.name, session, carry_on, authorization, self.tokens.as_ref(), sink).await
    }

    fn needs_client_authorization(&self) -> bool {
        self.spec.forward_auth || self.tokens.as_ref().is_some_and(|t| t.per_caller())
    }

    fn forgets_sessions(&self) -> bool {
        true
    }

    async fn passthrough(&self) -> Option<(Arc<dyn Passthrough>, Map<String, Value>)> {
        let (passthrough, described) =
            UrlPassthrough::discover(&self.spec, &self.name, self.tokens.clone(), self.init_timeout).await?;
        Some((Arc::new(passthrough), described))
    }
}
