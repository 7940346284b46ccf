#![warn(missing_docs)]
//! tether's MCP client runtime.
//!
//! - [`Session`]: one MCP session over Streamable HTTP (or the 2024-11-05
//!   HTTP+SSE transport as a fallback): requests, notifications, answers to
//!   server requests, the standalone stream, resumption of dropped streams.
//! - [`Pool`]: sessions keyed by (server, principal), created on first use,
//!   shared by concurrent callers, recovered when a server forgets them,
//!   terminated when idle; `requires_session = auto | true | false`.
//! - [`resume`]: the resume-token loop for long or large `tools/call` results.
//! - [`rounds`]: a sessionless request carried through its `input_required`
//!   rounds and tasks to its end.
//! - [`config`]: the TOML config file and the generic environment
//!   (`MCP_SERVER_URL`, `MCP_AUTH_TOKEN`, per-server `auth_env`).

pub mod config;
mod error;
pub mod oauth;
pub mod pool;
pub mod resume;
pub mod rounds;
mod session;
mod sse;

pub use config::{Config, Protocol, RequiresSession, Resolved, ServerSpec};
pub use error::ClientError;
pub use pool::{CallProgress, Pool, PoolOptions, ProgressHandler, RootsProvider};
pub use session::{Bearer, ClientOptions, PeerMessage, PeerSink, RequestTrack, Session};

/// The protocol revision this client asks for: the newest tether serves.
pub const DEFAULT_PROTOCOL_VERSION: &str = tether_wire::revision::LATEST;

#[cfg(test)]
mod tests {
    fn shareable<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn sessions_and_pools_can_be_shared_across_tasks() {
        shareable::<crate::Session>();
        shareable::<crate::Pool>();
        shareable::<crate::ClientOptions>();
    }
}
