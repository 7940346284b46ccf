//! The gateway: any MCP server (a stdio command or a URL) served with
//! tether's durable, resumable sessions at `/mcp/NAME`.
//!
//! The gateway is an application of the engine ([`tether_server::McpApp`]);
//! the engine knows nothing of upstreams. Each tether session holds its own
//! upstream connection in its in-memory local state and can rebuild it from
//! the store at any time by replaying the stored `initialize`.
//!
//! - `app`: [`Gateway`], the application: forwarding both ways, rebuilding
//!   a connection from the stored `initialize`, backoff, idle children.
//! - `link`: one session's link to its upstream and the sink of what the
//!   upstream sends on its own.
//! - `sessionless`: sessionless (2026-07-28) clients of a session-era upstream:
//!   a pool of upstream connections per principal, asks as MRTR rounds,
//!   `task_tools` as durable tasks.
//! - `sessionless_url`: the reverse, a URL upstream that speaks only the
//!   sessionless revision, for session-era clients.
//! - `passthrough`: a sessionless client of a URL upstream that speaks
//!   2026-07-28 too: its requests forwarded as sent, rounds and tasks the
//!   upstream's.
//! - [`processes`]: the hard cap on a command upstream's live children.
//! - [`config`]: what an upstream is (flags and TOML).
//! - [`credentials`]: tether's own OAuth tokens for a URL upstream (client
//!   credentials, token exchange), so the client's token never goes upstream.
//! - `connector`: the seam to a transport, one per upstream: starting and
//!   carrying on connections, capacity, passthrough; [`stdio`] (a child
//!   process per session) and [`http`] (an upstream HTTP session per
//!   session) implement it and [`upstream`], one live connection.
//! - [`kept`]: a command's child held by the keeper (under `tether serve`),
//!   whose calls outlive the engine.

mod app;
mod backoff;
mod burst;
mod catalog;
pub mod config;
mod connector;
pub mod credentials;
mod describe;
pub mod http;
pub mod kept;
mod link;
mod links;
mod member_lists;
mod passthrough;
pub mod processes;
mod sessionless;
mod sessionless_url;
mod slot;
pub mod stdio;
pub mod upstream;
mod virtual_server;

pub use app::Gateway;
pub use virtual_server::VirtualServer;
