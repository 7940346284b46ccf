//! Server settings, with the defaults `tether serve` documents.

use std::time::Duration;

/// Limits and behaviour of one server. Every limit has a documented default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// A session lives this long after its last activity (`--session-ttl`).
    pub session_ttl: Duration,
    /// Largest accepted POST body (`--max-body`).
    pub max_body: usize,
    /// Origins allowed besides localhost ones (`--allowed-origin`).
    pub allowed_origins: Vec<String>,
    /// The names a request's `Host` may carry on every route (none: any;
    /// `tether serve` sets the loopback names when bound to loopback).
    pub allowed_hosts: Option<crate::http::AllowedHosts>,
    /// Answer POSTed requests with plain JSON instead of SSE (`--json-response`).
    pub json_response: bool,
    /// The `retry` (ms) announced on every stream.
    pub sse_retry_ms: u64,
    /// A request still running after this long gets its priming event
    /// stored and sent on its own; quicker ones store it with the response
    /// in one commit.
    pub prime_delay: Duration,
    /// Interval of keep-alive comments on idle streams.
    pub keepalive: Duration,
    /// Requests running at once in one session; more get 429.
    pub max_inflight_per_session: usize,
    /// Live sessions one principal may hold; initialize beyond it gets 429.
    pub max_sessions_per_principal: usize,
    /// Sessions kept in memory (`--session-cache`); beyond it the least
    /// recently used idle ones are dropped from memory (the store keeps them).
    pub session_cache: usize,
    /// How often the reaper deletes expired sessions.
    pub reap_interval: Duration,
    /// How long a resumable call waits for its result before answering with
    /// a `nextResumeToken` (`--resume-wait`).
    pub resume_wait: Duration,
    /// Largest chunk of a paged result (`--result-chunk-bytes`).
    pub result_chunk_bytes: usize,
    /// Operations and their stored chunks are forgotten after this long.
    pub operation_ttl: Duration,
    /// With a shared store: a replica that has not renewed its lease for
    /// this long is presumed dead, and its unfinished requests are closed as
    /// interrupted.
    pub replica_lease: Duration,
    /// On shutdown, requests in flight get this long to finish; then they
    /// end as interrupted.
    pub drain_timeout: Duration,
    /// Client notifications of one session waiting for the application;
    /// more get 429.
    pub max_queued_notifications: usize,
    /// Server-to-client requests (e.g. `roots/list`) of one session waiting
    /// for the client's answer; more fail at once.
    pub max_pending_client_requests: usize,
    /// Sessionless (2026-07-28) requests running at once, over all clients;
    /// beyond it a request is refused with 429.
    pub max_sessionless_requests: usize,
    /// Sessionless requests one principal may run at once (under the ceiling above).
    pub max_sessionless_requests_per_principal: usize,
    /// `subscriptions/listen` streams one principal may hold open.
    pub max_listen_streams_per_principal: usize,
    /// Tasks (resumable operations) whose work runs in this process at
    /// once, over all clients; beyond it a new one is refused (503).
    pub max_tasks: usize,
    /// Tasks one principal may have running here at once (under the
    /// ceiling above); beyond it a new one is refused (429).
    pub max_tasks_per_principal: usize,
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

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(30 * 60),
            max_body: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            allowed_hosts: None,
            json_response: false,
            sse_retry_ms: 1000,
            prime_delay: Duration::from_millis(20),
            keepalive: Duration::from_secs(15),
            max_inflight_per_session: 64,
            max_sessions_per_principal: 100_000,
            session_cache: 4_096,
            reap_interval: Duration::from_secs(30),
            resume_wait: Duration::from_secs(2),
            result_chunk_bytes: 64 * 1024,
            operation_ttl: Duration::from_secs(3600),
            replica_lease: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            max_queued_notifications: 64,
            max_pending_client_requests: 16,
            max_sessionless_requests: 1024,
            max_sessionless_requests_per_principal: 256,
            max_listen_streams_per_principal: 64,
            max_tasks: 1024,
            max_tasks_per_principal: 64,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            body_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}
