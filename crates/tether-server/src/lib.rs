//! tether's server: a session engine that runs MCP sessions independent of
//! any connection, and a Streamable HTTP front that maps POST/GET/DELETE onto
//! it.
//!
//! - [`engine`]: sessions, streams, routing of outbound messages, replay,
//!   recovery after a crash. Knows nothing about HTTP.
//! - [`http`]: the axum router at `/mcp` and `/healthz`: header and body
//!   validation, SSE framing, status codes.
//! - [`app`]: the trait an MCP application (the notebook) implements.
//! - [`protocol`]: the JSON-RPC envelope and protocol revisions.

pub mod app;
pub mod config;
pub mod engine;
pub mod http;
pub mod ids;
pub mod protocol;

pub use app::{McpApp, OperationCtx, OperationSpec, RpcError, SessionCtx, ToolCtx};
pub use config::ServerConfig;
pub use engine::Engine;

/// The rmcp model types the [`McpApp`] trait speaks, re-exported so apps
/// need no separate rmcp dependency to match versions.
pub use rmcp::model as rmcp_model;
