//! [`PeerMessage`]: a message a peer sends on its own, not an answer to one
//! of ours (a server's notifications and requests to its client, or an
//! upstream's to the gateway). The one type every tether crate hands such
//! messages on with.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::envelope::Inbound;

/// A request or notification of the peer; `params` as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerMessage {
    /// `id` is the peer's own; the answer goes back under it.
    Request {
        /// The peer's id.
        id: Value,
        /// The method, as sent.
        method: String,
        /// The params, as sent.
        params: Option<Value>,
    },
    /// A notification: nothing goes back.
    Notification {
        /// The method, as sent.
        method: String,
        /// The params, as sent.
        params: Option<Value>,
    },
}

impl PeerMessage {
    /// Its method.
    pub fn method(&self) -> &str {
        match self {
            Self::Request { method, .. } | Self::Notification { method, .. } => method,
        }
    }

    /// Its params, if any.
    pub fn params(&self) -> Option<&Value> {
        match self {
            Self::Request { params, .. } | Self::Notification { params, .. } => params.as_ref(),
        }
    }

    /// The `progressToken` the message carries in its params, if any.
    pub fn progress_token(&self) -> Option<&Value> {
        self.params().and_then(|p| p.get("progressToken"))
    }

    /// The message from a parsed inbound one; an answer is given back as
    /// its id and outcome (`Err`: the error object as sent).
    pub fn from_inbound(message: Inbound) -> Result<Self, (Value, Result<Value, Value>)> {
        match message {
            Inbound::Request { id, method, params } => Ok(Self::Request { id, method, params: params.map(Value::Object) }),
            Inbound::Notification { method, params } => Ok(Self::Notification { method, params: params.map(Value::Object) }),
            Inbound::Response { id, outcome } => Err((id, outcome)),
        }
    }
}

/// Where a transport hands the peer's messages, one at a time, in the
/// order the peer wrote them: the transport reads on (and so completes a
/// later answer) only once `deliver` returned. What a peer sent before an
/// answer is therefore delivered before the answer, by construction.
pub trait PeerSink: Send + Sync + 'static {
    /// Hands over one message; the transport reads on once this returns.
    fn deliver(&self, message: PeerMessage) -> BoxFuture<'_, ()>;
}

/// A channel is a sink: `deliver` waits for room (back-pressure); a message
/// for a receiver that is gone is dropped.
impl PeerSink for tokio::sync::mpsc::Sender<PeerMessage> {
    fn deliver(&self, message: PeerMessage) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.send(message).await;
        })
    }
}
