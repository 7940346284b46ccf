//! OpenTelemetry traces (`--otlp-endpoint`) against the real binary: an
//! OTLP/HTTP receiver on loopback keeps what two tethers export, a gateway
//! (its config file names the endpoint) in front of an upstream tether (the
//! flag) and a stdio child. One trace runs from the client's `traceparent`
//! header through the gateway's HTTP and JSON-RPC spans to the upstream
//! tether's; the stdio child gets it in `params._meta.traceparent`; a
//! 2026-07-28 request's `_meta.traceparent` parents its JSON-RPC span.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use support::*;

/// A running `tether serve`, killed (SIGKILL) when dropped, also when a test fails.
struct Tether(std::process::Child);

impl Tether {
    fn start(db: &std::path::Path, args: &[&str]) -> (Self, String) {
        let (child, url) = start_binary(db, args);
        (Self(child), url)
    }

    /// SIGTERM and wait for the exit: the drain, then the flush of the spans.
    fn stop(mut self) {
        let status = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                assert!(status.success(), "tether exited with {status}");
                return;
            }
            assert!(std::time::Instant::now() < deadline, "tether did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tether {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tiny OTLP/HTTP receiver: `POST /v1/traces` bodies (JSON), kept in order.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: bytes::Bytes| {
            let kept = kept.clone();
            async move {
                let parsed = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("an OTLP/JSON body: {e}"));
                kept.lock().push(parsed);
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // No path: tether adds /v1/traces.
    (format!("http://{addr}"), bodies)
}

/// One exported span, its attributes as plain JSON values.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: HashMap<String, Value>,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }
}

/// An OTLP `AnyValue` as JSON (`{"stringValue": "x"}` → `"x"`; integers come as strings or numbers).
fn any_value(v: &Value) -> Value {
    if let Some(s) = v.get("stringValue") {
        return s.clone();
    }
    if let Some(i) = v.get("intValue") {
        return match i {
            Value::String(s) => s.parse::<i64>().map(Value::from).unwrap_or_else(|_| i.clone()),
            other => other.clone(),
        };
    }
    v.as_object().and_then(|o| o.values().next()).cloned().unwrap_or(Value::Null)
}

fn spans(bodies: &[Value]) -> Vec<Span> {
    let mut out = Vec::new();
    for body in bodies {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .map(|a| any_value(&a["value"]))
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let attributes = span["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| Some((a["key"].as_str()?.to_owned(), any_value(&a["value"]))))
                        .collect();
                    let id = |k: &str| span[k].as_str().unwrap_or("").to_ascii_lowercase();
                    out.push(Span {
                        service: service.clone(),
                        trace_id: id("traceId"),
                        span_id: id("spanId"),
                        parent_span_id: id("parentSpanId"),
                        name: span["name"].as_str().unwrap_or("").to_owned(),
                        attributes,
                    });
                }
            }
        }
    }
    out
}

const TRACE_A: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN_A: &str = "00f067aa0ba902b7";
const TRACE_B: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
const TRACE_C: &str = "6df92f3577b34da6a3ce929d0e0e4738";
const CLIENT_SPAN_C: &str = "11f067aa0ba902b8";

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// The fixture stdio server of the gateway tests.
fn fixture() -> String {
    format!("{}/../tether-gateway/tests/fixtures/stdio_server.py", env!("CARGO_MANIFEST_DIR"))
}

/// POSTs a JSON-RPC message with a `traceparent` header; returns the HTTP
/// response's session header and its last SSE message (or JSON body).
async fn post_traced(c: &Client, session: Option<&str>, body: Value, parent: &str) -> (Option<String>, Value) {
    let resp = c.post(session, &body).header("traceparent", parent).send().await.unwrap();
    assert!(resp.status().is_success(), "{body}: HTTP {}", resp.status());
    let sid = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    if resp.status() == 202 {
        return (sid, Value::Null);
    }
    let text = resp.text().await.unwrap();
    let last = serde_json::from_str(&text).unwrap_or_else(|_| {
        let data = text.lines().filter_map(|l| l.strip_prefix("data: ")).rfind(|d| !d.is_empty());
        serde_json::from_str(data.unwrap_or("null")).unwrap_or(Value::Null)
    });
    (sid, last)
}

async fn initialized(c: &Client, parent: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "otel-test", "version": "0"}}});
    let (sid, answer) = post_traced(c, None, init, parent).await;
    assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
    let sid = sid.expect("a session");
    post_traced(c, Some(&sid), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), parent).await;
    sid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_client_through_the_gateway_to_its_upstreams() {
    let (endpoint, bodies) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    // The upstream tether exports too (the flag)...
    let (upstream, upstream_url) = Tether::start(&dir.path().join("u.db"), &["--otlp-endpoint", &endpoint]);
    // ...and the gateway takes the endpoint from its config file.
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "otlp_endpoint = {endpoint:?}\n[upstreams.nb]\nurl = {upstream_url:?}\n[upstreams.echo]\ncommand = [\"python3\", {:?}]\n",
            fixture()
        ),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let (gateway, gateway_url) = Tether::start(&dir.path().join("g.db"), &["--config", &config_arg]);

    // Trace A: a session through the gateway to the upstream tether.
    let nb = Client::new(&format!("{gateway_url}/nb"));
    let parent_a = traceparent(TRACE_A, CLIENT_SPAN_A);
    let sid = initialized(&nb, &parent_a).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "thought", "arguments": {"thought": "a secret plan", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": false}}});
    let (_, answer) = post_traced(&nb, Some(&sid), call, &parent_a).await;
    assert_eq!(answer["result"]["structuredContent"]["thoughtNumber"], 1, "{answer}");

    // Trace B: a stdio child, which sees the trace context in `_meta`.
    let echo = Client::new(&format!("{gateway_url}/echo"));
    let parent_b = traceparent(TRACE_B, "22f067aa0ba902b9");
    let echo_sid = initialized(&echo, &parent_b).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}});
    post_traced(&echo, Some(&echo_sid), call, &parent_b).await;
    let (_, seen) =
        post_traced(&echo, Some(&echo_sid), json!({"jsonrpc": "2.0", "id": 2, "method": "debug/seen"}), &parent_b).await;
    let child_saw = seen["result"]["seen"]
        .as_array()
        .unwrap_or_else(|| panic!("debug/seen: {seen}"))
        .iter()
        .find(|m| m["method"] == "tools/call")
        .map(|m| m["params"]["_meta"]["traceparent"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default();

    // Trace C: a 2026-07-28 request to the gateway's own notebook, its
    // context in `_meta` only (no header).
    let root = Client::new(&gateway_url);
    let sessionless = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "traceparent": traceparent(TRACE_C, CLIENT_SPAN_C)}}});
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    let resp = root.post_raw(&headers, sessionless.to_string()).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await.unwrap();

    // The drain, then the flush: everything is exported by the exit.
    tokio::task::spawn_blocking(move || {
        gateway.stop();
        upstream.stop();
    })
    .await
    .unwrap();
    let bodies = bodies.lock().clone();
    let all = spans(&bodies);
    assert!(!all.is_empty(), "no spans arrived");
    assert!(all.iter().all(|s| s.service == "tether"), "service.name is tether");
    let everything = serde_json::to_string(&bodies).unwrap();
    assert!(!everything.contains("a secret plan"), "a tool's arguments are never exported");
    let a: Vec<&Span> = all.iter().filter(|s| s.trace_id == TRACE_A).collect();
    let dump = || format!("{:#?}", all);

    // The gateway's HTTP span of the call is the client's span's child...
    let gateway_http = a
        .iter()
        .find(|s| {
            s.attr("url.path") == Some(&json!("/mcp/nb"))
                && s.parent_span_id == CLIENT_SPAN_A
                && a.iter().any(|r| r.parent_span_id == s.span_id && r.attr("rpc.method") == Some(&json!("tools/call")))
        })
        .unwrap_or_else(|| panic!("the gateway's HTTP span of tools/call in trace A: {}", dump()));
    assert_eq!(gateway_http.attr("http.request.method"), Some(&json!("POST")));
    assert_eq!(gateway_http.attr("http.response.status_code"), Some(&json!(200)));
    // ...its JSON-RPC span names the method, the session and the upstream...
    let gateway_rpc = a
        .iter()
        .find(|s| s.parent_span_id == gateway_http.span_id && s.attr("rpc.method") == Some(&json!("tools/call")))
        .unwrap();
    assert_eq!(gateway_rpc.attr("mcp.upstream"), Some(&json!("nb")), "{gateway_rpc:?}");
    assert_eq!(gateway_rpc.attr("mcp.session"), Some(&json!(sid)), "{gateway_rpc:?}");
    assert_eq!(gateway_rpc.name, "tools/call");
    // ...and the upstream tether's HTTP span is the child of that JSON-RPC
    // span: the gateway sent its `traceparent` on.
    let upstream_http = a
        .iter()
        .find(|s| s.attr("url.path") == Some(&json!("/mcp")) && s.parent_span_id == gateway_rpc.span_id)
        .unwrap_or_else(|| panic!("the upstream's HTTP span under the gateway's tools/call: {}", dump()));
    let upstream_rpc = a
        .iter()
        .find(|s| s.parent_span_id == upstream_http.span_id && s.attr("rpc.method") == Some(&json!("tools/call")))
        .unwrap_or_else(|| panic!("the upstream's JSON-RPC span: {}", dump()));
    assert!(upstream_rpc.attr("mcp.upstream").is_none(), "the upstream serves its own notebook");
    assert!(upstream_rpc.attr("mcp.session").is_some_and(|s| s != &json!(sid)), "the upstream's own session");
    // initialize is traced through to the upstream too.
    assert!(
        a.iter().any(|s| s.attr("rpc.method") == Some(&json!("initialize")) && s.attr("mcp.upstream") == Some(&json!("nb"))),
        "{}",
        dump()
    );

    // Trace B: the stdio child got the gateway's JSON-RPC span as its parent.
    let echo_rpc = all
        .iter()
        .find(|s| {
            s.trace_id == TRACE_B
                && s.attr("rpc.method") == Some(&json!("tools/call"))
                && s.attr("mcp.upstream") == Some(&json!("echo"))
        })
        .unwrap_or_else(|| panic!("the gateway's tools/call span in trace B: {}", dump()));
    assert_eq!(child_saw, traceparent(TRACE_B, &echo_rpc.span_id), "the child's _meta.traceparent");

    // Trace C: `_meta.traceparent` parents a 2026-07-28 request's span.
    let sessionless_rpc = all
        .iter()
        .find(|s| s.trace_id == TRACE_C && s.attr("rpc.method") == Some(&json!("tools/list")))
        .unwrap_or_else(|| panic!("the 2026-07-28 tools/list span in trace C: {}", dump()));
    assert_eq!(sessionless_rpc.parent_span_id, CLIENT_SPAN_C);
    assert!(sessionless_rpc.attr("mcp.session").is_none() && sessionless_rpc.attr("mcp.upstream").is_none());
}

#[tokio::test]
async fn without_the_flag_nothing_is_exported_and_nothing_is_passed_on() {
    let (endpoint, bodies) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = format!("echo=stdio:python3 {}", fixture());
    let (gateway, url) = Tether::start(&dir.path().join("g.db"), &["--upstream", &flag]);
    let echo = Client::new(&format!("{url}/echo"));
    let parent = traceparent(TRACE_B, "33f067aa0ba902ba");
    let sid = initialized(&echo, &parent).await;
    let (_, seen) = post_traced(&echo, Some(&sid), json!({"jsonrpc": "2.0", "id": 2, "method": "debug/seen"}), &parent).await;
    let text = seen.to_string();
    assert!(seen["result"]["seen"].is_array(), "{seen}");
    assert!(!text.contains("traceparent"), "no trace context goes upstream without --otlp-endpoint: {text}");
    tokio::task::spawn_blocking(move || gateway.stop()).await.unwrap();
    assert!(bodies.lock().is_empty(), "{endpoint} got spans");
}
