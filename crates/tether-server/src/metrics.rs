//! Prometheus metrics: one registry for the process, and cheap functions the
//! engine, the HTTP front, the store (through [`tether_store::observe`]) and
//! the gateway call where something happens. Every function is an atomic
//! increment or a histogram observation; with metrics off (`--no-metrics`,
//! [`set_enabled`]) each is one relaxed load and nothing else (no clock read).
//!
//! The names are a contract: `tether_sessions_live`,
//! `tether_sessions_stored`, `tether_sse_connections`,
//! `tether_http_requests_total{method,status}`,
//! `tether_request_duration_seconds{method}`, `tether_events_appended_total`,
//! `tether_events_replayed_total`, `tether_store_commit_seconds`,
//! `tether_store_commit_batch_size`, `tether_store_errors_total`,
//! `tether_auth_failures_total`, `tether_audit_dropped_total`,
//! `tether_audit_write_errors_total`, `tether_audit_failing`,
//! `tether_upstream_processes{upstream}`,
//! `tether_upstream_restarts_total{upstream}`,
//! `tether_upstream_request_duration_seconds{upstream}`,
//! `tether_upstream_dropped_messages_total{upstream,reason}` (`unreadable`:
//! a line that could not be read or matched to a request; `foreign`: a
//! message on a resumed stream that does not belong to the call),
//! `tether_upstream_process_refusals_total{upstream}`; under a keeper
//! (`tether serve` runs the engine as its child): `tether_keeper_engine_restarts_total`,
//! `tether_keeper_last_restart_seconds`, `tether_keeper_children`,
//! `tether_keeper_children_taken_over` (children this engine found kept
//! when it started), `tether_keeper_held_bytes` (children's output the
//! keeper holds for the engine).
//! Every label value comes from a closed set (HTTP methods and statuses, the
//! MCP method names, configured upstream names), never from a peer's text.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    server: String,
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    upstream: String,
    reason: &'static str,
}

/// Why a message of an upstream was dropped (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// A line that is not a readable message (`reason="unreadable"`).
    Unreadable,
    /// A message that belongs to no call or session of its connection (`reason="foreign"`).
    Foreign,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~105 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

struct Metrics {
    registry: Registry,
    sessions_live: Gauge,
    sessions_stored: Gauge,
    sse_connections: Gauge,
    http_requests: Family<HttpLabels, Counter>,
    request_duration: Family<MethodLabel, Histogram, fn() -> Histogram>,
    events_appended: Counter,
    events_replayed: Counter,
    store_commit_seconds: Histogram,
    store_commit_batch_size: Histogram,
    store_errors: Counter,
    auth_failures: Counter,
    audit_dropped: Counter,
    audit_write_errors: Counter,
    audit_failing: Gauge,
    upstream_processes: Family<UpstreamLabel, Gauge>,
    upstream_restarts: Family<UpstreamLabel, Counter>,
    upstream_request_duration: Family<UpstreamLabel, Histogram, fn() -> Histogram>,
    upstream_dropped: Family<DroppedLabels, Counter>,
    upstream_process_refusals: Family<UpstreamLabel, Counter>,
    member_lists_cut: Family<MemberLabels, Counter>,
    keeper_restarts: Counter,
    keeper_restarts_seen: std::sync::atomic::AtomicU64,
    keeper_last_restart: Gauge<f64, std::sync::atomic::AtomicU64>,
    keeper_children: Gauge,
    keeper_taken_over: Gauge,
    keeper_held_bytes: Gauge,
}

static ENABLED: AtomicBool = AtomicBool::new(true);

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::default();
    let m = Metrics {
        registry: Registry::default(),
        sessions_live: Gauge::default(),
        sessions_stored: Gauge::default(),
        sse_connections: Gauge::default(),
        http_requests: Family::default(),
        request_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        events_appended: Counter::default(),
        events_replayed: Counter::default(),
        store_commit_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 18)),
        store_commit_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
        store_errors: Counter::default(),
        auth_failures: Counter::default(),
        audit_dropped: Counter::default(),
        audit_write_errors: Counter::default(),
        audit_failing: Gauge::default(),
        upstream_processes: Family::default(),
        upstream_restarts: Family::default(),
        upstream_request_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        upstream_dropped: Family::default(),
        upstream_process_refusals: Family::default(),
        member_lists_cut: Family::default(),
        keeper_restarts: Counter::default(),
        keeper_restarts_seen: std::sync::atomic::AtomicU64::new(0),
        keeper_last_restart: Gauge::default(),
        keeper_children: Gauge::default(),
        keeper_taken_over: Gauge::default(),
        keeper_held_bytes: Gauge::default(),
    };
    // Counters get their `_total` suffix from the encoder.
    registry.register("tether_sessions_live", "Sessions held in this process's memory", m.sessions_live.clone());
    registry.register(
        "tether_sessions_stored",
        "Live sessions in the store (every principal; refreshed at most every 10 s)",
        m.sessions_stored.clone(),
    );
    registry.register("tether_sse_connections", "Open SSE response streams", m.sse_connections.clone());
    registry.register("tether_http_requests", "HTTP requests answered, by method and status", m.http_requests.clone());
    registry.register(
        "tether_request_duration_seconds",
        "JSON-RPC requests from start to stored final response, by method",
        m.request_duration.clone(),
    );
    registry.register("tether_events_appended", "Events committed to the store's stream logs", m.events_appended.clone());
    registry.register(
        "tether_events_replayed",
        "Events sent from the store rather than live (catch-up, Last-Event-ID)",
        m.events_replayed.clone(),
    );
    registry.register("tether_store_commit_seconds", "SQLite group commits: duration", m.store_commit_seconds.clone());
    registry.register(
        "tether_store_commit_batch_size",
        "SQLite group commits: jobs per commit",
        m.store_commit_batch_size.clone(),
    );
    registry.register("tether_store_errors", "Failed store commits and backend calls", m.store_errors.clone());
    registry.register("tether_auth_failures", "Requests refused for a missing or wrong bearer token", m.auth_failures.clone());
    registry.register(
        "tether_audit_dropped",
        "Policy decisions lost from the audit log: its writer fell behind, or writing them failed",
        m.audit_dropped.clone(),
    );
    registry.register("tether_audit_write_errors", "Writes to the audit log that failed", m.audit_write_errors.clone());
    registry.register(
        "tether_audit_failing",
        "1 while the audit log's last write failed (decisions are being lost), else 0",
        m.audit_failing.clone(),
    );
    registry.register("tether_upstream_processes", "Running stdio upstream processes", m.upstream_processes.clone());
    registry.register(
        "tether_keeper_engine_restarts",
        "Engines the keeper started again after one died (as the keeper counts them)",
        m.keeper_restarts.clone(),
    );
    registry.register(
        "tether_keeper_last_restart_seconds",
        "The last engine restart: from the old engine's exit to the new one's greeting",
        m.keeper_last_restart.clone(),
    );
    registry.register("tether_keeper_children", "Stdio upstream processes the keeper holds", m.keeper_children.clone());
    registry.register(
        "tether_keeper_children_taken_over",
        "Stdio upstream processes the keeper had kept when this engine started",
        m.keeper_taken_over.clone(),
    );
    registry.register(
        "tether_keeper_held_bytes",
        "Output of stdio upstream processes the keeper holds until the engine has stored it",
        m.keeper_held_bytes.clone(),
    );
    registry.register(
        "tether_upstream_restarts",
        "Upstream connections started again after one died",
        m.upstream_restarts.clone(),
    );
    registry.register(
        "tether_upstream_request_duration_seconds",
        "Requests forwarded to an upstream, until its answer",
        m.upstream_request_duration.clone(),
    );
    registry.register(
        "tether_upstream_dropped_messages",
        "Messages of an upstream dropped: unreadable or unmatched lines, foreign messages on a resumed stream",
        m.upstream_dropped.clone(),
    );
    registry.register(
        "tether_upstream_process_refusals",
        "Requests refused because the upstream was at max_processes (or a principal at its share)",
        m.upstream_process_refusals.clone(),
    );
    registry.register(
        "tether_virtual_member_lists_cut",
        "Reads of a virtual server member's lists cut at max_list_bytes",
        m.member_lists_cut.clone(),
    );
    Metrics { registry, ..m }
});

#[inline]
fn on() -> Option<&'static Metrics> {
    if ENABLED.load(Ordering::Relaxed) { Some(&METRICS) } else { None }
}

/// Turns every hook on or off (`--no-metrics`); on by default. Installs the
/// store's observer when turned on.
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
    if enabled {
        tether_store::observe::install(Box::new(StoreHook));
    }
}

/// Whether metrics are kept (not `--no-metrics`).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

struct StoreHook;

impl tether_store::observe::StoreObserver for StoreHook {
    fn commit(&self, took: Duration, batch: usize) {
        if let Some(m) = on() {
            m.store_commit_seconds.observe(took.as_secs_f64());
            m.store_commit_batch_size.observe(batch as f64);
        }
    }

    fn error(&self) {
        store_error();
    }
}

/// The text exposition of every metric, after `refresh` set the gauges read at scrape time.
pub fn render(sessions_live: usize) -> String {
    let m = &*METRICS;
    m.sessions_live.set(sessions_live as i64);
    let mut out = String::with_capacity(8 * 1024);
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &m.registry) {
        tracing::error!(error = %e, "could not encode the metrics");
    }
    out
}

/// Milliseconds (since the epoch) of the last `tether_sessions_stored` refresh.
static STORED_AT: AtomicI64 = AtomicI64::new(0);

/// Whether `tether_sessions_stored` is due for a refresh (at most every 10 s);
/// claims the refresh when it is.
pub fn stored_sessions_due(now_ms: i64) -> bool {
    let last = STORED_AT.load(Ordering::Relaxed);
    now_ms - last >= 10_000 && STORED_AT.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// Sets `tether_sessions_stored`.
pub fn set_stored_sessions(n: u64) {
    METRICS.sessions_stored.set(n.min(i64::MAX as u64) as i64);
}

/// The series the hot path hits, resolved once each (a family lookup hashes
/// the labels under a lock; a resolved handle is one atomic add). Families
/// never drop a series, so a handle stays the one the registry encodes.
const FAST_METHODS: [&str; 3] = ["GET", "POST", "DELETE"];
const FAST_STATUSES: [u16; 3] = [200, 202, 404];
static FAST_HTTP: [[OnceLock<Counter>; FAST_STATUSES.len()]; FAST_METHODS.len()] = [const { [const { OnceLock::new() }; 3] }; 3];

/// Counts an HTTP answer in `tether_http_requests`.
pub fn http_request(method: &axum::http::Method, status: u16) {
    if let Some(m) = on() {
        let method = match *method {
            axum::http::Method::GET => "GET",
            axum::http::Method::POST => "POST",
            axum::http::Method::DELETE => "DELETE",
            axum::http::Method::HEAD => "HEAD",
            axum::http::Method::OPTIONS => "OPTIONS",
            axum::http::Method::PUT => "PUT",
            _ => "other",
        };
        let fast = FAST_METHODS.iter().position(|f| *f == method).zip(FAST_STATUSES.iter().position(|s| *s == status));
        match fast {
            Some((mi, si)) => {
                FAST_HTTP[mi][si].get_or_init(|| m.http_requests.get_or_create(&HttpLabels { method, status }).clone()).inc()
            }
            None => m.http_requests.get_or_create(&HttpLabels { method, status }).inc(),
        };
    }
}

/// The JSON-RPC method names used as labels; anything else is `other`.
const KNOWN: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/update",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
];

/// One resolved histogram per known method, and one for `other`.
static DURATIONS: [OnceLock<Histogram>; KNOWN.len() + 1] = [const { OnceLock::new() }; KNOWN.len() + 1];

/// Started when a request starts; [`RequestTimer::done`] observes its duration.
pub struct RequestTimer(Option<(usize, Instant)>);

/// Starts timing a JSON-RPC request of `method` (`tether_request_duration_seconds`).
pub fn request_started(method: &str) -> RequestTimer {
    RequestTimer(on().map(|_| (KNOWN.iter().position(|m| *m == method).unwrap_or(KNOWN.len()), Instant::now())))
}

impl RequestTimer {
    /// The request ended: its duration is observed.
    pub fn done(self) {
        if let (Some((index, started)), Some(m)) = (self.0, on()) {
            let method = KNOWN.get(index).copied().unwrap_or("other");
            DURATIONS[index]
                .get_or_init(|| m.request_duration.get_or_create(&MethodLabel { method }).clone())
                .observe(started.elapsed().as_secs_f64());
        }
    }
}

/// Counts `n` events committed (`tether_events_appended`).
pub fn events_appended(n: usize) {
    if let Some(m) = on() {
        m.events_appended.inc_by(n as u64);
    }
}

/// Counts `n` events replayed (`tether_events_replayed`).
pub fn events_replayed(n: usize) {
    if let Some(m) = on() {
        m.events_replayed.inc_by(n as u64);
    }
}

/// Counts a failed store call (`tether_store_errors`).
pub fn store_error() {
    if let Some(m) = on() {
        m.store_errors.inc();
    }
}

/// Counts a request refused for its token (`tether_auth_failures`).
pub fn auth_failure() {
    if let Some(m) = on() {
        m.auth_failures.inc();
    }
}

/// `lines` policy decisions that did not reach the audit log.
pub fn audit_dropped(lines: u64) {
    if let Some(m) = on() {
        m.audit_dropped.inc_by(lines);
    }
}

/// Counts a failed write of the audit log (`tether_audit_write_errors`).
pub fn audit_write_error() {
    if let Some(m) = on() {
        m.audit_write_errors.inc();
    }
}

/// Whether an audit log's last write failed.
pub fn audit_failing(failing: bool) {
    if let Some(m) = on() {
        m.audit_failing.set(i64::from(failing));
    }
}

/// Counts an open SSE stream while it lives.
pub struct SseConnection(bool);

/// Counts an SSE stream in `tether_sse_connections` while the returned guard lives.
pub fn sse_connection() -> SseConnection {
    match on() {
        Some(m) => {
            m.sse_connections.inc();
            SseConnection(true)
        }
        None => SseConnection(false),
    }
}

impl Drop for SseConnection {
    fn drop(&mut self) {
        if self.0 {
            METRICS.sse_connections.dec();
        }
    }
}

/// What the keeper says of itself (polled by the engine it runs).
pub fn keeper_status(restarts: u64, last_restart: Duration, children: usize, held_bytes: u64) {
    if let Some(m) = on() {
        let seen = m.keeper_restarts_seen.swap(restarts, Ordering::Relaxed);
        m.keeper_restarts.inc_by(restarts.saturating_sub(seen));
        m.keeper_last_restart.set(last_restart.as_secs_f64());
        m.keeper_children.set(i64::try_from(children).unwrap_or(i64::MAX));
        m.keeper_held_bytes.set(i64::try_from(held_bytes).unwrap_or(i64::MAX));
    }
}

/// How many children the keeper had kept when this engine started.
pub fn keeper_taken_over(children: usize) {
    if let Some(m) = on() {
        m.keeper_taken_over.set(i64::try_from(children).unwrap_or(i64::MAX));
    }
}

/// A stdio upstream process of `upstream` started (`+1`) or ended (`-1`).
pub fn upstream_processes(upstream: &str, delta: i64) {
    if let Some(m) = on() {
        m.upstream_processes.get_or_create(&UpstreamLabel { upstream: upstream.to_owned() }).inc_by(delta);
    }
}

/// Counts a dropped upstream message (`tether_upstream_dropped_messages`).
pub fn upstream_dropped(upstream: &str, why: Dropped) {
    if let Some(m) = on() {
        let reason = match why {
            Dropped::Unreadable => "unreadable",
            Dropped::Foreign => "foreign",
        };
        m.upstream_dropped.get_or_create(&DroppedLabels { upstream: upstream.to_owned(), reason }).inc();
    }
}

/// Counts a child refused under `max_processes` (`tether_upstream_process_refusals`).
pub fn upstream_process_refused(upstream: &str) {
    if let Some(m) = on() {
        m.upstream_process_refusals.get_or_create(&UpstreamLabel { upstream: upstream.to_owned() }).inc();
    }
}

/// A virtual server's member listed more than `max_list_bytes`: the rest was cut.
pub fn virtual_member_lists_cut(server: &str, member: &str) {
    if let Some(m) = on() {
        m.member_lists_cut.get_or_create(&MemberLabels { server: server.to_owned(), member: member.to_owned() }).inc();
    }
}

/// Counts a new connection to `upstream` after one ended (`tether_upstream_restarts`).
pub fn upstream_restart(upstream: &str) {
    if let Some(m) = on() {
        m.upstream_restarts.get_or_create(&UpstreamLabel { upstream: upstream.to_owned() }).inc();
    }
}

/// Started when a request goes to an upstream; [`UpstreamTimer::done`] observes it.
pub struct UpstreamTimer(Option<Instant>);

/// Starts timing a request to an upstream (`tether_upstream_request_duration_seconds`).
pub fn upstream_request_started() -> UpstreamTimer {
    UpstreamTimer(on().map(|_| Instant::now()))
}

impl UpstreamTimer {
    /// The request ended: its duration is observed under `upstream`.
    pub fn done(self, upstream: &str) {
        if let (Some(started), Some(m)) = (self.0, on()) {
            m.upstream_request_duration
                .get_or_create(&UpstreamLabel { upstream: upstream.to_owned() })
                .observe(started.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_name_of_the_contract() {
        events_appended(1);
        auth_failure();
        http_request(&axum::http::Method::POST, 200);
        request_started("tools/call").done();
        request_started("made/up").done();
        upstream_restart("echo");
        upstream_processes("echo", 1);
        upstream_request_started().done("echo");
        let text = render(3);
        for name in [
            "tether_sessions_live 3",
            "tether_sessions_stored",
            "tether_sse_connections",
            "tether_http_requests_total{method=\"POST\",status=\"200\"}",
            "tether_request_duration_seconds_bucket{le=",
            "tether_request_duration_seconds_count{method=\"tools/call\"}",
            "tether_request_duration_seconds_count{method=\"other\"}",
            "tether_events_appended_total",
            "tether_events_replayed_total",
            "tether_store_commit_seconds_bucket",
            "tether_store_commit_batch_size_bucket",
            "tether_store_errors_total",
            "tether_auth_failures_total",
            "tether_audit_dropped_total",
            "tether_audit_write_errors_total",
            "tether_audit_failing",
            "tether_upstream_processes{upstream=\"echo\"} 1",
            "tether_upstream_restarts_total{upstream=\"echo\"} 1",
            "tether_upstream_request_duration_seconds_count{upstream=\"echo\"}",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
