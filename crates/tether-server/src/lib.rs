#![warn(missing_docs)]
//! tether's server: a session engine that runs MCP sessions independent of
//! any connection, and a Streamable HTTP front that maps POST/GET/DELETE onto
//! it.
//!
//! - [`engine`]: sessions, streams, routing of outbound messages, replay,
//!   recovery after a crash. Knows nothing about HTTP.
//! - [`http`]: the axum router at `/mcp` and `/healthz`: header and body
//!   validation, SSE framing, status codes.
//! - [`app`]: the seam an MCP application implements ([`McpApp`]).
//! - [`tools`]: the provided tool router, for applications made of tools.
//! - [`server`]: the engine and the front put together for a program that
//!   embeds tether ([`Server::builder`]).
//! - [`trace`]: OpenTelemetry spans of HTTP and JSON-RPC requests (`--otlp-endpoint`).
//!
//! The wire format (envelope, error codes, header names, `_meta` keys) is
//! the `tether-wire` crate's.

pub mod app;
pub mod audit;
pub mod authorized;
pub mod config;
pub mod engine;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod tools;
pub mod trace;

pub use app::{
    Authorized, Caller, ClientDeclaration, CutOff, EndReason, Endpoints, Initialize, McpApp, OperationCtx, OperationRunner,
    OperationSpec, Origin, Origins, ROOT_ENDPOINT, RawResult, RequestCtx, RpcError, SessionCtx, SessionEnd, raw_result,
};
pub use config::EngineConfig;
pub use engine::Engine;
pub use server::{Server, ServerBuilder, ServerError};
pub use tools::{ToolApp, ToolRouter};

/// The rmcp model types the [`McpApp`] trait speaks, re-exported so apps
/// need no separate rmcp dependency to match versions.
pub use rmcp::model as rmcp_model;
pub use tether_wire;
