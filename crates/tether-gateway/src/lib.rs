//! The gateway: any MCP server (a stdio command or a URL) served with
//! tether's durable, resumable sessions at `/mcp/NAME`.
//!
//! The gateway is an application of the engine ([`tether_server::McpApp`]);
//! the engine knows nothing of upstreams. Each tether session holds its own
//! upstream connection in its in-memory local state and can rebuild it from
//! the store at any time by replaying the stored `initialize`.
//!
//! The application side (what knows tether sessions):
//!
//! - `app`: [`Gateway`], the application of one upstream, one room per job:
//!   `app/rebuild` (the session's connection, opened and rebuilt from the
//!   stored state), `app/forward` (forwarding both ways), `app/notes`
//!   (recovery notes), `app/sessionless` (sessionless clients and the task
//!   runner), `app/discover` (`server/discover`).
//! - `state`: what the gateway stores of a session (`SessionState`: one
//!   versioned struct under one app-state key; the layout before versions
//!   read and converted, a newer one refused).
//! - `slot`: where a gateway keeps its part of a session, alone or as a
//!   virtual server's member.
//! - `link`: one session's link to its upstream and the sink of what the
//!   upstream sends on its own; `progress`: tether's own progress tokens
//!   upstream; `links`: every session's link to one upstream, the idle
//!   sweep; `backoff`: an upstream that keeps failing.
//! - `sessionless`: sessionless (2026-07-28) clients of a session-era upstream:
//!   a pool of upstream connections per principal, asks as MRTR rounds.
//! - `virtual_server`: [`VirtualServer`], several upstreams behind one
//!   endpoint; `catalog` (merge rules, routes back) and `member_lists`
//!   (each member's lists, read once for every session).
//! - `describe`: what operators see of an upstream.
//! - [`processes`]: the hard cap on a command upstream's live children.
//! - [`config`]: what an upstream is (flags and TOML).
//! - [`credentials`]: tether's own OAuth tokens for a URL upstream (client
//!   credentials, token exchange), so the client's token never goes upstream.
//!
//! The transports, below the seam (they import `connector` and
//! [`upstream`], never the application side; `connector` imports none of
//! them):
//!
//! - `connector`: the seam to a transport, one per upstream: starting and
//!   carrying on connections, capacity, `Passthrough`; `connect` is the one
//!   place that picks the transport of an upstream as configured.
//! - [`upstream`]: one live connection.
//! - [`stdio`]: a child process per session (`stdio/shared`,
//!   `stdio/upstream`, `stdio/stderr`), or the same child held by the
//!   keeper (under `tether serve`), whose calls outlive the engine
//!   ([`stdio::kept`]).
//! - `url`: a URL upstream's connector over [`http`] (an upstream HTTP
//!   session per session), `sessionless_url` (an upstream that speaks only
//!   the sessionless revision, for session-era clients) and `passthrough`
//!   (a sessionless client of a 2026-07-28 upstream: its requests forwarded
//!   as sent).

mod app;
mod backoff;
mod burst;
mod catalog;
pub mod config;
mod connect;
mod connector;
pub mod credentials;
mod describe;
pub mod http;
mod link;
mod links;
mod member_lists;
mod passthrough;
pub mod processes;
mod progress;
mod sessionless;
mod sessionless_url;
mod slot;
mod state;
pub mod stdio;
pub mod upstream;
mod url;
mod virtual_server;

pub use app::Gateway;
pub use virtual_server::VirtualServer;
