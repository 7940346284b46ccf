//! The `tools_call` load generator and the MCP client calls every scenario
//! shares: N clients, each with its own MCP session and its own keep-alive
//! HTTP/1 connection, call the `thought` tool back to back (or, for the
//! axum floor, POST the same JSON-RPC body to be echoed; through a virtual
//! server, each member's `thought` in turn); every response is checked, and
//! latencies inside the measure window go into an HDR histogram.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tether_wire::sse::Decoder;
use tether_wire::{Inbound, headers, meta, parse_message, revision};

use crate::server::{FEDERATED_SEPARATOR, Protocol};

/// The revision the bench asks every server for.
pub const PROTOCOL_VERSION: &str = tether_wire::revision::LATEST;
/// A call taking longer than this is an error, not a latency sample.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Error messages kept (and printed) per run; the rest are only counted.
const KEPT_ERRORS: usize = 5;
/// gateway_federated: the virtual server's members, each client calling
/// their `thought` tools in this order, over and over (two stdio, one URL).
pub const FEDERATED_MEMBERS: [&str; 3] = ["s1", "s2", "web"];

/// When a run's calls start counting and when they stop.
#[derive(Debug, Clone, Copy)]
struct Window {
    measure_from: Instant,
    end: Instant,
}

/// What one run (one system, one client count, one slice) produced.
pub struct Outcome {
    /// Calls checked as correct that completed inside the measure window.
    pub ok_in_window: u64,
    /// Every failed call, lead-in included.
    pub errors: u64,
    /// A few error messages, for the log.
    pub first_errors: Vec<String>,
    /// Latency in microseconds of the calls counted in `ok_in_window`.
    pub latency_us: Histogram<u64>,
    pub measured: Duration,
    /// CPU time this load generator used inside the measure window (Linux).
    pub client_cpu: Option<Duration>,
    /// CPU time the server's processes (tether with its keeper: the keeper
    /// and the engine; not its upstream or stdio children) used inside the
    /// measure window (Linux).
    pub server_cpu: Option<Duration>,
    /// CPU time what the server fronts used inside the measure window (the
    /// gateway scenarios: its `rmcp_ref`, its stdio servers), summed over
    /// those of its processes alive at both ends of the window (Linux).
    pub upstream_cpu: Option<Duration>,
}

impl Outcome {
    pub fn rps(&self) -> f64 {
        self.ok_in_window as f64 / self.measured.as_secs_f64()
    }
    /// The load generator's own CPU per counted call. Its work per call is
    /// the same against every system, so this moves with the host's speed (by
    /// tens of percent within seconds on a shared VM) and with how much the
    /// server's work slows the machine both run on.
    pub fn client_us_per_call(&self) -> Option<f64> {
        let cpu = self.client_cpu?;
        (self.ok_in_window > 0).then(|| cpu.as_secs_f64() * 1e6 / self.ok_in_window as f64)
    }
    /// The server's own CPU per counted call: what a change to the server
    /// moves, read beside the throughput it buys.
    pub fn server_us_per_call(&self) -> Option<f64> {
        let cpu = self.server_cpu?;
        (self.ok_in_window > 0).then(|| cpu.as_secs_f64() * 1e6 / self.ok_in_window as f64)
    }
    /// The CPU per counted call of what the server fronts: beside the
    /// server's, where a gateway's difference goes when it makes its upstream
    /// work more (or less) per call.
    pub fn upstream_us_per_call(&self) -> Option<f64> {
        let cpu = self.upstream_cpu?;
        (self.ok_in_window > 0).then(|| cpu.as_secs_f64() * 1e6 / self.ok_in_window as f64)
    }
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

struct ClientResult {
    ok_in_window: u64,
    errors: u64,
    first_errors: Vec<String>,
    latency_us: Histogram<u64>,
}

impl ClientResult {
    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.first_errors.len() < KEPT_ERRORS {
            self.first_errors.push(msg);
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; the bounds are valid constants.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// One client: its connection, its session (none for the axum floor) and
/// how many calls it has made on it (each `thought` answer is checked
/// against that count, across runs).
struct Client {
    http: reqwest::Client,
    session: String,
    calls: u64,
}

/// The clients of one system, kept from one run to the next: each with its
/// own MCP session and its own keep-alive HTTP/1 connection.
pub struct Load {
    protocol: Protocol,
    url: Arc<str>,
    clients: Vec<Client>,
}

impl Load {
    /// Opens `clients` sessions on `mcp_url` at once (connections for the
    /// axum floor); fails if any cannot be opened.
    /// With `tokens`, client `i` sends `tokens[i % tokens.len()]` as its
    /// bearer token on every request.
    pub async fn open(protocol: Protocol, mcp_url: &str, clients: usize, tokens: &[String]) -> anyhow::Result<Self> {
        let url: Arc<str> = mcp_url.into();
        let opening: Vec<_> = (0..clients)
            .map(|i| {
                let url = url.clone();
                let token = (!tokens.is_empty()).then(|| tokens[i % tokens.len()].clone());
                tokio::spawn(async move {
                    let http = match token {
                        Some(token) => http_client_with_bearer(&token)?,
                        None => http_client()?,
                    };
                    let session = match protocol {
                        Protocol::Mcp | Protocol::Federated => {
                            open_session(&http, &url, false).await.map_err(|e| format!("session set-up: {e}"))?
                        }
                        // The notebook session comes with the first result.
                        Protocol::Echo | Protocol::Modern => String::new(),
                    };
                    Ok::<_, String>(Client { http, session, calls: 0 })
                })
            })
            .collect();
        let mut opened = Vec::with_capacity(clients);
        let mut failures = Vec::new();
        for task in opening {
            match task.await {
                Ok(Ok(client)) => opened.push(client),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("client task failed: {e}")),
            }
        }
        if let Some(first) = failures.first() {
            anyhow::bail!("{} of {clients} clients could not start: {first}", failures.len());
        }
        Ok(Self { protocol, url, clients: opened })
    }

    /// Every client calls back to back for `lead_in` (not recorded), then
    /// for `duration` (recorded); `server` holds the server's process IDs
    /// (none: not measured), whose CPU time in the window is taken too, and
    /// `upstream` those of what it fronts (none: not measured).
    pub async fn run(
        &mut self,
        lead_in: Duration,
        duration: Duration,
        server: &[u32],
        upstream: &[u32],
    ) -> anyhow::Result<Outcome> {
        let measure_from = Instant::now() + lead_in;
        let window = Window { measure_from, end: measure_from + duration };
        let (server, upstream) = (server.to_vec(), upstream.to_vec());
        let cpu_in_window = tokio::spawn(async move {
            let of_server = || -> Option<Duration> {
                if server.is_empty() {
                    return None;
                }
                server.iter().map(|pid| cpu_time(&pid.to_string())).sum()
            };
            let of_upstream = || -> Vec<Option<Duration>> { upstream.iter().map(|&pid| cpu_time_exact(pid)).collect() };
            tokio::time::sleep_until(measure_from.into()).await;
            let from = (cpu_time("self"), of_server(), of_upstream());
            tokio::time::sleep_until(window.end.into()).await;
            let to = (cpu_time("self"), of_server(), of_upstream());
            let spent = |from: Option<Duration>, to: Option<Duration>| Some(to?.saturating_sub(from?));
            // An upstream process that exits (or starts) inside the window counts nothing.
            let upstream = (!from.2.is_empty())
                .then(|| from.2.iter().zip(&to.2).filter_map(|(&from, &to)| spent(from, to)).sum::<Duration>());
            (spent(from.0, to.0), spent(from.1, to.1), upstream)
        });
        let tasks: Vec<_> = std::mem::take(&mut self.clients)
            .into_iter()
            .map(|client| tokio::spawn(calls(self.protocol, self.url.clone(), client, window)))
            .collect();

        let mut out = Outcome {
            ok_in_window: 0,
            errors: 0,
            first_errors: Vec::new(),
            latency_us: histogram(),
            measured: duration,
            client_cpu: None,
            server_cpu: None,
            upstream_cpu: None,
        };
        for task in tasks {
            let (client, r) = task.await?;
            self.clients.push(client);
            out.ok_in_window += r.ok_in_window;
            out.errors += r.errors;
            for e in r.first_errors {
                if out.first_errors.len() < KEPT_ERRORS {
                    out.first_errors.push(e);
                }
            }
            out.latency_us.add(&r.latency_us)?;
        }
        (out.client_cpu, out.server_cpu, out.upstream_cpu) = cpu_in_window.await.unwrap_or_default();
        Ok(out)
    }
}

/// A process's user + system CPU time so far, from `/proc/PROC/stat`
/// (`self` or a PID; `None` elsewhere). Clock ticks are taken as 1/100 s,
/// Linux's `USER_HZ`.
pub fn cpu_time(proc: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat")).ok()?;
    // The fields after the command name, which sits in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// A process's CPU time so far to the nanosecond: its threads' time on a
/// CPU (the first field of each `/proc/PID/task/TID/schedstat`; a thread that
/// exited no longer counts), else [`cpu_time`]. For many small processes (64
/// stdio servers), `/proc/PID/stat`'s whole ticks (10 ms each) would lose
/// most of a slice's time.
pub fn cpu_time_exact(pid: u32) -> Option<Duration> {
    let exact = std::fs::read_dir(format!("/proc/{pid}/task")).ok().map(|tasks| {
        // A thread may exit between the listing and the read.
        let on_cpu = |task: std::fs::DirEntry| -> Option<u64> {
            std::fs::read_to_string(task.path().join("schedstat")).ok()?.split_whitespace().next()?.parse().ok()
        };
        Duration::from_nanos(tasks.filter_map(Result::ok).filter_map(on_cpu).sum())
    });
    exact.or_else(|| cpu_time(&pid.to_string()))
}

/// A keep-alive connection idle this long is dropped by the client, and the
/// next call opens a new one. Below the 5 s after which Node's HTTP server
/// (supergateway) and uvicorn (mcp-proxy) close an idle connection: with six
/// systems in a round a client's connection waits about 5.5 s between its
/// slices, and a server's close could cross the next slice's first request
/// (a reset, seen with supergateway on a loaded host). The new connection is
/// opened in the slice's lead-in, which is not counted.
const IDLE_CONNECTION: Duration = Duration::from_secs(4);

/// One HTTP client with one pooled keep-alive HTTP/1 connection (TCP_NODELAY on).
pub fn http_client() -> Result<reqwest::Client, String> {
    client_builder().build().map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// [`http_client`] sending `Authorization: Bearer TOKEN` on every request.
fn http_client_with_bearer(token: &str) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| format!("a bad token: {e}"))?;
    headers.insert(reqwest::header::AUTHORIZATION, value);
    client_builder().default_headers(headers).build().map_err(|e| format!("cannot build an HTTP client: {e}"))
}

fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(IDLE_CONNECTION)
        .timeout(REQUEST_TIMEOUT)
}

/// One client's calls until the window ends.
async fn calls(protocol: Protocol, url: Arc<str>, mut client: Client, window: Window) -> (Client, ClientResult) {
    let mut r = ClientResult { ok_in_window: 0, errors: 0, first_errors: Vec::new(), latency_us: histogram() };
    while Instant::now() < window.end {
        client.calls += 1;
        let n = client.calls;
        let started = Instant::now();
        let result = match protocol {
            Protocol::Mcp => call_thought(&client.http, &url, &client.session, n).await,
            Protocol::Echo => call_echo(&client.http, &url, n).await,
            Protocol::Modern => call_thought_modern(&client.http, &url, &mut client.session, n).await,
            Protocol::Federated => {
                let (member, k) = federated_turn(n);
                call_member_thought(&client.http, &url, &client.session, n, member, k).await
            }
        };
        let done = Instant::now();
        match result {
            Ok(()) if done >= window.measure_from && done <= window.end => {
                r.ok_in_window += 1;
                let us = done.duration_since(started).as_micros();
                r.latency_us.saturating_record(u64::try_from(us).unwrap_or(u64::MAX));
            }
            Ok(()) => {}
            Err(e) => r.error(format!("call #{n}: {e}")),
        }
    }
    (client, r)
}

pub fn post(http: &reqwest::Client, url: &str, session: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
    let mut req =
        http.post(url).header("content-type", "application/json").header("accept", headers::ACCEPT_POST).body(body.to_string());
    if let Some(id) = session {
        req = req.header(headers::SESSION_ID, id).header(headers::PROTOCOL_VERSION, PROTOCOL_VERSION);
    }
    req
}

/// `initialize` + `notifications/initialized`; returns the session id.
/// With `roots`, the client declares the `roots` capability.
pub async fn open_session(http: &reqwest::Client, url: &str, roots: bool) -> Result<String, String> {
    let capabilities = if roots { json!({"roots": {"listChanged": true}}) } else { json!({}) };
    let init = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": capabilities,
            "clientInfo": {"name": "tether-bench", "version": env!("CARGO_PKG_VERSION")}
        }
    });
    let resp = post(http, url, None, &init).send().await.map_err(|e| format!("initialize: {e}"))?;
    let session = resp
        .headers()
        .get(headers::SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("initialize: no Mcp-Session-Id header (status {})", resp.status()))?;
    let result = response_result(resp, 0).await.map_err(|e| format!("initialize: {e}"))?;
    if result.get("protocolVersion").and_then(Value::as_str) != Some(PROTOCOL_VERSION) {
        return Err(format!("initialize: result.protocolVersion is not {PROTOCOL_VERSION} in {result}"));
    }
    if !result.pointer("/capabilities/tools").is_some_and(Value::is_object) {
        return Err(format!("initialize: no result.capabilities.tools in {result}"));
    }

    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let resp = post(http, url, Some(&session), &note).send().await.map_err(|e| format!("initialized: {e}"))?;
    accepted(resp).await.map_err(|e| format!("notifications/initialized: {e}"))?;
    Ok(session)
}

/// DELETE of a session (which ends it, and for a command upstream stops its child); any 2xx is success.
pub async fn delete_session(http: &reqwest::Client, url: &str, session: &str) -> Result<(), String> {
    let resp = http
        .delete(url)
        .header(headers::SESSION_ID, session)
        .header(headers::PROTOCOL_VERSION, PROTOCOL_VERSION)
        .send()
        .await
        .map_err(|e| format!("DELETE: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("DELETE: reading the body: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "DELETE answered {status}: {}",
            String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
        ));
    }
    Ok(())
}

/// A notification's answer: 202 Accepted (the body is read so the connection goes back to the pool).
pub async fn accepted(resp: reqwest::Response) -> Result<(), String> {
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("reading the body: {e}"))?;
    if status != reqwest::StatusCode::ACCEPTED {
        return Err(format!(
            "answered {status}, want 202: {}",
            String::from_utf8_lossy(&body).chars().take(200).collect::<String>()
        ));
    }
    Ok(())
}

fn thought_call(n: u64) -> Value {
    tool_call(n, "thought", n)
}

/// A `tools/call` with JSON-RPC id `id` of the tool `name` (a `thought`
/// tool), as thought number `n`.
fn tool_call(id: u64, name: &str, n: u64) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": {
            "thought": format!("bench thought {n}: weighing the next step"),
            "thoughtNumber": n,
            "totalThoughts": n,
            "nextThoughtNeeded": true
        }}
    })
}

/// One `tools/call` of `thought` number `n` (the `n`th call of this session), checked:
/// the structuredContent must be exactly what the notebook answers.
pub async fn call_thought(http: &reqwest::Client, url: &str, session: &str, n: u64) -> Result<(), String> {
    let resp = post(http, url, Some(session), &thought_call(n)).send().await.map_err(|e| with_causes(&e))?;
    let result = response_result(resp, n).await?;
    check_thought(&result, n)
}

/// `tools/list` on a session (request id 0), as a client does before its
/// calls; the answer must hold a list of tools.
pub async fn list_tools(http: &reqwest::Client, url: &str, session: &str) -> Result<(), String> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "tools/list"});
    let resp = post(http, url, Some(session), &body).send().await.map_err(|e| with_causes(&e))?;
    let result = response_result(resp, 0).await?;
    match result.get("tools") {
        Some(Value::Array(_)) => Ok(()),
        _ => Err(format!("tools/list answered without tools: {result}")),
    }
}

/// An error with its causes (reqwest's own text leaves out why a request
/// could not be sent: a reset, a closed connection).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// The `n`th call of a gateway_federated client: the member it goes to, and
/// which call of that member's it is (each member's upstream session counts
/// only its own calls: `rmcp_ref` answers the length of its history).
pub fn federated_turn(n: u64) -> (&'static str, u64) {
    let members = FEDERATED_MEMBERS.len() as u64;
    (FEDERATED_MEMBERS[((n - 1) % members) as usize], (n - 1) / members + 1)
}

/// The `thought` tool of `member` through a virtual server (`MEMBER__thought`),
/// as that member's call number `k`, JSON-RPC id `id`; checked as [`call_thought`].
pub async fn call_member_thought(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    id: u64,
    member: &str,
    k: u64,
) -> Result<(), String> {
    let body = tool_call(id, &format!("{member}{FEDERATED_SEPARATOR}thought"), k);
    let resp = post(http, url, Some(session), &body).send().await.map_err(|e| with_causes(&e))?;
    let result = response_result(resp, id).await.map_err(|e| format!("{member}: {e}"))?;
    check_thought(&result, k).map_err(|e| format!("{member}: {e}"))
}

/// [`call_thought`] over the 2026-07-28 wire: no session, the caller in
/// `_meta`, the notebook session named there (`pin`, set from the first result).
pub async fn call_thought_modern(http: &reqwest::Client, url: &str, pin: &mut String, n: u64) -> Result<(), String> {
    let mut body = thought_call(n);
    let mut request_meta = json!({
        (meta::PROTOCOL_VERSION): revision::FIRST_SESSIONLESS,
        (meta::CLIENT_CAPABILITIES): {},
        (meta::CLIENT_INFO): {"name": "tether-bench", "version": env!("CARGO_PKG_VERSION")},
    });
    if !pin.is_empty() {
        request_meta[meta::NOTEBOOK_SESSION] = json!(pin);
    }
    body["params"]["_meta"] = request_meta;
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", headers::ACCEPT_POST)
        .header(headers::PROTOCOL_VERSION, revision::FIRST_SESSIONLESS)
        .header(headers::MCP_METHOD, "tools/call")
        .header(headers::MCP_NAME, "thought")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let result = response_result(resp, n).await?;
    if pin.is_empty() {
        let named = result.get("_meta").and_then(|m| m.get(meta::NOTEBOOK_SESSION)).and_then(Value::as_str);
        *pin = named.ok_or_else(|| format!("the first result names no notebook session: {result}"))?.to_owned();
    }
    check_thought(&result, n)
}

/// The checks of a `thought` result (JSON-RPC envelope already checked).
pub fn check_thought(result: &Value, n: u64) -> Result<(), String> {
    if result.get("isError") == Some(&Value::Bool(true)) {
        return Err(format!("tool error: {result}"));
    }
    let want = json!({
        "thoughtNumber": n,
        "totalThoughts": n,
        "nextThoughtNeeded": true,
        "branches": [],
        "thoughtHistoryLength": n,
    });
    match result.get("structuredContent") {
        Some(got) if *got == want => Ok(()),
        Some(got) => Err(format!("structuredContent is {got}, want {want}")),
        None => Err(format!("no result.structuredContent in {result}")),
    }
}

/// The axum floor: POST the `n`th call's JSON-RPC body, get the same JSON back.
async fn call_echo(http: &reqwest::Client, url: &str, n: u64) -> Result<(), String> {
    let body = thought_call(n);
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let json_type = has_content_type(&resp, "application/json");
    let bytes = resp.bytes().await.map_err(|e| format!("reading the body: {e}"))?;
    if status != reqwest::StatusCode::OK || !json_type {
        return Err(format!(
            "status {status} (JSON: {json_type}): {}",
            String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>()
        ));
    }
    let echoed: Value = serde_json::from_slice(&bytes).map_err(|e| format!("bad JSON ({e})"))?;
    if echoed != body {
        return Err(format!("echoed {echoed}, sent {body}"));
    }
    Ok(())
}

/// Whether the response's `Content-Type` starts with `prefix` (parameters may follow).
pub fn has_content_type(resp: &reqwest::Response, prefix: &str) -> bool {
    resp.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|ct| ct.starts_with(prefix))
}

/// Reads the whole body (SSE or plain JSON) and returns the result of the
/// JSON-RPC response, checked for status 200, the expected id and no `error`.
pub async fn response_result(resp: reqwest::Response, id: u64) -> Result<Value, String> {
    let status = resp.status();
    let sse = has_content_type(&resp, headers::EVENT_STREAM);
    let json_type = has_content_type(&resp, "application/json");
    let body = resp.bytes().await.map_err(|e| format!("reading the body: {e}"))?;
    let text = || String::from_utf8_lossy(&body).chars().take(200).collect::<String>();
    if status != reqwest::StatusCode::OK {
        return Err(format!("status {status}: {}", text()));
    }
    if !sse && !json_type {
        return Err(format!("content-type is neither text/event-stream nor application/json: {}", text()));
    }
    result_in(&body, sse, id)
}

/// The result of the response to `id` in a whole body (of an SSE body, the
/// last event with data).
fn result_in(body: &bytes::Bytes, sse: bool, id: u64) -> Result<Value, String> {
    let message = if sse {
        let events = Decoder::new().push(body.clone()).map_err(|e| e.to_string())?;
        match events.into_iter().rev().find(|e| e.has_data()) {
            Some(e) => bytes::Bytes::from(e.data),
            None => return Err(format!("no data event in the SSE body: {:?}", String::from_utf8_lossy(body))),
        }
    } else {
        body.clone()
    };
    let shown = || String::from_utf8_lossy(&message).chars().take(300).collect::<String>();
    match parse_message(&message) {
        Ok(Inbound::Response { id: got, outcome: Ok(result) }) if got.as_u64() == Some(id) => Ok(result),
        Ok(Inbound::Response { id: got, outcome: Err(error) }) if got.as_u64() == Some(id) => {
            Err(format!("JSON-RPC error: {error}"))
        }
        Ok(_) => Err(format!("not the JSON-RPC response to id {id}: {}", shown())),
        Err(e) => Err(format!("{} ({}): {}", e.message, e.code, shown())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_shows_its_causes() {
        #[derive(Debug)]
        struct Sending(std::io::Error);
        impl std::fmt::Display for Sending {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Sending {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
        assert_eq!(with_causes(&Sending(reset)), "error sending request: connection reset by peer");
    }

    #[test]
    fn a_federated_client_calls_each_member_in_turn_counting_each_members_calls() {
        let turns: Vec<(&str, u64)> = (1..=7).map(federated_turn).collect();
        assert_eq!(turns, [("s1", 1), ("s2", 1), ("web", 1), ("s1", 2), ("s2", 2), ("web", 2), ("s1", 3)]);
        let call = tool_call(5, "s2__thought", 2);
        assert_eq!((call["id"].as_u64(), call["params"]["name"].as_str()), (Some(5), Some("s2__thought")));
        assert_eq!(call["params"]["arguments"]["thoughtNumber"], 2);
    }

    #[test]
    fn the_result_of_a_quick_sse_answer_or_a_json_body_is_checked() {
        let sse = bytes::Bytes::from_static(b"id: r1.0\nretry: 3000\ndata:\n\nevent: message\nid: r1.1\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\n\n");
        assert_eq!(result_in(&sse, true, 7), Ok(json!({"ok": true})));
        assert!(result_in(&sse, true, 8).unwrap_err().contains("not the JSON-RPC response to id 8"));
        let error = bytes::Bytes::from_static(br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no"}}"#);
        assert!(result_in(&error, false, 7).unwrap_err().starts_with("JSON-RPC error"));
        let priming_only = bytes::Bytes::from_static(b"id: r1.0\ndata:\n\n");
        assert!(result_in(&priming_only, true, 7).unwrap_err().contains("no data event"));
    }
}
