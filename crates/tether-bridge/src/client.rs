//! The real remote: the client runtime (`tether_client::Session`: Streamable
//! HTTP, session ID and protocol version headers, the standalone GET stream)
//! behind the bridge's [`Connector`] / [`UpstreamSession`] seam.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tether_client::{ClientError, ClientOptions, Session};
use tokio::sync::mpsc;

use crate::upstream::{Connector, ServerMessage, UpstreamError, UpstreamSession};

/// Server-initiated messages buffered between the client runtime and the bridge.
const INCOMING_BUFFER: usize = 64;

/// A connector to the Streamable HTTP MCP endpoint at `url`.
pub fn connector(url: &str, bearer_token: Option<String>, request_timeout: Duration) -> Arc<dyn Connector> {
    Arc::new(ClientConnector { url: url.to_owned(), bearer_token, request_timeout })
}

struct ClientConnector {
    url: String,
    bearer_token: Option<String>,
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
        let options = ClientOptions {
            bearer_token: self.bearer_token.clone(),
            request_timeout: self.request_timeout,
            ..ClientOptions::default()
        };
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

    fn take_incoming(&self) -> Option<mpsc::Receiver<ServerMessage>> {
        let mut from_client = self.session.take_incoming()?;
        let (tx, rx) = mpsc::channel(INCOMING_BUFFER);
        // Relays until either side is gone (the client's stream ended, or the
        // bridge moved on to another session and dropped its receiver).
        tokio::spawn(async move {
            while let Some(message) = from_client.recv().await {
                let message = match message {
                    tether_client::ServerMessage::Request { id, method, params } => ServerMessage::Request { id, method, params },
                    tether_client::ServerMessage::Notification { method, params } => {
                        ServerMessage::Notification { method, params }
                    }
                };
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        Some(rx)
    }
}
