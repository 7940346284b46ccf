//! What the upstream says of itself, to those who ask outside any session:
//! a sessionless client's `server/discover` (a 2026-07-28 upstream's own
//! description, which also turns on passing sessionless clients through),
//! and a virtual server's start-up look at its members' lists. Both open a
//! connection initialized as a sessionless client's would be; what the
//! upstream sends on its own there is dropped.

use std::sync::Arc;

use serde_json::{Map, Value};
use tether_server::RpcError;

use super::Gateway;
use crate::sessionless;
use crate::upstream::{PeerMessage, PeerSink, Started, Upstream};

impl Gateway {
    /// A connection outside any session (`what` names it in logs),
    /// initialized as a sessionless client's would be; nobody hears what
    /// the upstream sends on its own there (a closed channel drops it).
    async fn look(&self, what: &str) -> Result<Started, RpcError> {
        let nowhere: Arc<dyn PeerSink> = Arc::new(tokio::sync::mpsc::channel::<PeerMessage>(1).0);
        self.connect(what, what, sessionless::initialize_params(), None, None, nowhere).await
    }

    /// A connection for a look at what the upstream offers (the caller
    /// closes it).
    pub(crate) async fn probe(&self) -> Result<Arc<dyn Upstream>, RpcError> {
        let started = self.look("(probe)").await?;
        started.upstream.notify("notifications/initialized", None).await?;
        Ok(started.upstream)
    }

    /// The upstream's own `initialize` result, as a sessionless client's
    /// `server/discover` says it (a connection is opened to ask, then closed;
    /// the engine keeps the answer). `None` while the upstream cannot be
    /// reached, so the next `server/discover` asks again.
    pub(super) async fn described(&self) -> Option<Map<String, Value>> {
        let has_task_tools = !self.config.task_tools.is_empty();
        if let Some((passthrough, described)) = self.connector.passthrough().await {
            let _ = self.sessionless.passthrough.set(passthrough);
            return Some(sessionless::describe(&described, has_task_tools));
        }
        let Started { upstream, initialize_result, .. } = match self.look("(discover)").await {
            Ok(started) => started,
            Err(e) => {
                tracing::warn!(upstream = %self.config.name, error = %e.message, "could not describe the upstream to a sessionless client");
                return None;
            }
        };
        upstream.close(true).await;
        let result: Map<String, Value> = serde_json::from_str(initialize_result.get()).ok()?;
        Some(sessionless::describe(&result, has_task_tools))
    }
}
