//! The real remote: the client runtime (`tether_client::Session`: Streamable
//! HTTP, session ID and protocol version headers, the standalone GET stream)
//! behind the bridge's [`Connector`] / [`UpstreamSession`] seam.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tether_client::oauth::{OAuthClient, TokenCache, authorize};
use tether_client::{ClientError, ClientOptions, Session};
use tokio::sync::mpsc;

use crate::upstream::{Connector, PeerMessage, UpstreamError, UpstreamSession};

/// A connector to the Streamable HTTP MCP endpoint at `url`. Without a
/// `bearer_token`, `oauth` (client credentials) follows the server's 401
/// challenge for one at each connection (a cached token while it is good).
pub fn connector(
    url: &str,
    bearer_token: Option<String>,
    oauth: Option<OAuthClient>,
    request_timeout: Duration,
) -> Arc<dyn Connector> {
    let cache = TokenCache::default_location(&|name| std::env::var(name).ok());
    Arc::new(ClientConnector { url: url.to_owned(), bearer_token, oauth, cache, request_timeout })
}

struct ClientConnector {
    url: String,
    bearer_token: Option<String>,
    oauth: Option<OAuthClient>,
    cache: Option<TokenCache>,
    request_timeout: Duration,
}

fn convert(e: ClientError) -> UpstreamError {
    match e {
        ClientError::SessionNotFound => UpstreamError::SessionNotFound,
        ClientError::Rpc(error) => UpstreamError::Rpc(error),
        ClientError::Auth { status, message } => {
            UpstreamError::Other(format!("authentication refused (HTTP {status}): {message}"))
        }
        other => UpstreamError::Other(other.to_string()),
    }
}

#[async_trait::async_trait]
impl Connector for ClientConnector {
    async fn connect(&self, initialize_params: Value) -> Result<(Box<dyn UpstreamSession>, Value), UpstreamError> {
        let bearer_token = match (&self.bearer_token, &self.oauth) {
            (None, Some(client)) => authorize(&self.url, client, self.cache.as_ref()).await.map_err(convert)?,
            (token, _) => token.clone(),
        };
        let options = ClientOptions { bearer_token, request_timeout: self.request_timeout, ..ClientOptions::default() };
        let (session, result) = Session::connect(&self.url, options, initialize_params).await.map_err(convert)?;
        Ok((Box::new(ClientSession { session }), result))
    }
}

struct ClientSession {
    session: Session,
}

#[async_trait::async_trait]
impl UpstreamSession for ClientSession {
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, UpstreamError> {
        self.session.request(method, params).await.map_err(convert)
    }

    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError> {
        self.session.notify(method, params).await.map_err(convert)
    }

    async fn respond(&self, id: Value, result: Result<Value, Value>) -> Result<(), UpstreamError> {
        self.session.respond(id, result).await.map_err(convert)
    }

    fn take_incoming(&self) -> Option<mpsc::Receiver<PeerMessage>> {
        self.session.take_incoming()
    }
}
