//! [`PeerMessage`]: a message a peer sends on its own, not an answer to one
//! of ours (a server's notifications and requests to its client, or an
//! upstream's to the gateway). The one type every tether crate hands such
//! messages on with.

use serde_json::Value;

use crate::envelope::Inbound;

/// A request or notification of the peer; `params` as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerMessage {
    /// `id` is the peer's own; the answer goes back under it.
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
}

impl PeerMessage {
    pub fn method(&self) -> &str {
        match self {
            Self::Request { method, .. } | Self::Notification { method, .. } => method,
        }
    }

    pub fn params(&self) -> Option<&Value> {
        match self {
            Self::Request { params, .. } | Self::Notification { params, .. } => params.as_ref(),
        }
    }

    /// The `progressToken` the message carries in its params, if any.
    pub fn progress_token(&self) -> Option<&Value> {
        self.params().and_then(|p| p.get("progressToken"))
    }

    /// The message from a parsed inbound one; `None` for an answer.
    pub fn from_inbound(message: Inbound) -> Option<Self> {
        match message {
            Inbound::Request { id, method, params } => Some(Self::Request { id, method, params: params.map(Value::Object) }),
            Inbound::Notification { method, params } => Some(Self::Notification { method, params: params.map(Value::Object) }),
            Inbound::Response { .. } => None,
        }
    }
}
