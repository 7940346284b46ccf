//! The engine's settings (sessions, requests, streams, tasks, replicas),
//! with the defaults `tether serve` documents. The HTTP front's own
//! settings (bodies, origins, hosts, connections) are
//! [`crate::http::HttpConfig`].

use std::time::Duration;

/// Limits and behaviour of one engine. Every limit has a documented default.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// A session lives this long after its last activity (`--session-ttl`).
    pub session_ttl: Duration,
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
    /// Largest chunk of a paged result (`--result-chunk-bytes`), for a
    /// client that asked for pages.
    pub result_chunk_bytes: usize,
    /// Largest result of an operation answered whole, to a client that did
    /// not ask for pages (`--max-result-bytes`); past it the result ends
    /// with a note of what was left out and how to get it.
    pub max_result_bytes: usize,
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(30 * 60),
            prime_delay: Duration::from_millis(20),
            keepalive: Duration::from_secs(15),
            max_inflight_per_session: 64,
            max_sessions_per_principal: 100_000,
            session_cache: 4_096,
            reap_interval: Duration::from_secs(30),
            resume_wait: Duration::from_secs(2),
            result_chunk_bytes: 64 * 1024,
            max_result_bytes: 16 * 1024 * 1024,
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
        }
    }
}
