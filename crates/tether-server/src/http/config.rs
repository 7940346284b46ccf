//! The HTTP front's settings: what a request and a connection may be
//! (bodies, origins, hosts, timeouts, how many at once) and how answers are
//! framed, with the defaults `tether serve` documents. The engine's own
//! settings are [`crate::EngineConfig`]; the front never reads these back
//! through the engine.

use std::time::Duration;

use super::AllowedHosts;

/// Limits and behaviour of one HTTP front. Every limit has a documented default.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Largest accepted POST body (`--max-body`).
    pub max_body: usize,
    /// Origins allowed besides localhost ones (`--allowed-origin`).
    pub allowed_origins: Vec<String>,
    /// The names a request's `Host` may carry on every route (none: any;
    /// `tether serve` sets the loopback names when bound to loopback).
    pub allowed_hosts: Option<AllowedHosts>,
    /// Answer POSTed requests with plain JSON instead of SSE (`--json-response`).
    pub json_response: bool,
    /// The `retry` (ms) announced on every stream.
    pub sse_retry_ms: u64,
    /// A connection must deliver a request's complete head (request line
    /// and headers) within this long after it opened or after its first
    /// byte arrived (`--header-timeout`); else it is closed.
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in progress is closed after
    /// this long (`--idle-timeout`). Streams are requests in progress.
    pub idle_timeout: Duration,
    /// A request's body must arrive within this long after its head
    /// (`--body-timeout`); else 408 and the connection is closed.
    pub body_timeout: Duration,
    /// Open connections at once (`--max-connections`); beyond it new ones
    /// wait in the listen backlog until one closes.
    pub max_connections: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            allowed_hosts: None,
            json_response: false,
            sse_retry_ms: 1000,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            body_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}
