//! The remote side as the bridge sees it: something that opens an MCP session
//! from `initialize` params, and a session that sends requests,
//! notifications and responses and yields what the server sends on its own.
//!
//! The real implementation is the client runtime (`tether_client::Session`,
//! adapted in [`crate::client`]); tests plug in fakes. Keeping this seam
//! small is what lets the forwarding logic be tested without HTTP.

use serde_json::Value;
use tether_wire::RpcError;
use tokio::sync::mpsc;

/// Why the remote did not answer a message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    /// The remote does not know the session (HTTP 404): initialize again.
    #[error("the remote server does not know this session")]
    SessionNotFound,
    /// A JSON-RPC error from the remote, passed to the host unchanged.
    #[error("{0}")]
    Rpc(RpcError),
    /// Anything else (transport, authentication, configuration).
    #[error("{0}")]
    Other(String),
}

impl UpstreamError {
    /// The JSON-RPC error to give the host.
    pub fn to_rpc_error(&self) -> RpcError {
        match self {
            UpstreamError::Rpc(error) => error.clone(),
            UpstreamError::SessionNotFound => {
                RpcError::internal("tether bridge: the remote server lost the session and it could not be re-established")
            }
            UpstreamError::Other(detail) => RpcError::internal(format!("tether bridge: remote MCP server: {detail}")),
        }
    }
}

/// A message the remote sent on its own (not a response).
pub use tether_wire::PeerMessage;

/// One live remote session.
#[async_trait::async_trait]
pub trait UpstreamSession: Send + Sync + 'static {
    /// A request; its result, or why there is none.
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, UpstreamError>;
    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError>;
    /// Answers a request the remote sent (`Err` carries a JSON-RPC error object).
    async fn respond(&self, id: Value, result: Result<Value, Value>) -> Result<(), UpstreamError>;
    /// Server-initiated messages; `Some` once.
    fn take_incoming(&self) -> Option<mpsc::Receiver<PeerMessage>>;
}

/// Opens remote sessions.
#[async_trait::async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Sends `initialize` with these params, then `notifications/initialized`;
    /// the session and the initialize result (including `_meta`).
    async fn connect(&self, initialize_params: Value) -> Result<(Box<dyn UpstreamSession>, Value), UpstreamError>;
}
