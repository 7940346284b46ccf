//! The gateway over real HTTP against the real binary: a stdio MCP server
//! (the Python fixture of crates/tether-gateway, run by `python3`) served at
//! `/mcp/NAME` with tether's durable sessions: calls forwarded, the session
//! surviving a `kill -9` of tether with the child re-initialized as the
//! client initialized it, a child killed mid-call, progress replayed.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A gateway with one stdio fixture upstream `name` (started with `extra` args).
fn start_gateway(dir: &tempfile::TempDir, name: &str, extra: &str) -> (Tether, String) {
    let flag = upstream_flag(name, extra);
    Tether::start(&dir.path().join("t.db"), &["--upstream", &flag])
}

fn upstream_flag(name: &str, extra: &str) -> String {
    format!("{name}=stdio:python3 {} {extra}", fixture())
}

fn init_params(client: &str) -> Value {
    json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": client, "version": "1.2.3"}})
}

async fn initialized(c: &Client, client: &str) -> (String, Value) {
    let (sid, result) = c.initialize_params(init_params(client)).await;
    let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    assert_eq!(r.status(), 202);
    (sid, result)
}

fn structured(response: &Value) -> &Value {
    &response["result"]["structuredContent"]
}

/// An `initialize` (clientInfo "x") as it goes over the wire, for the answers a refusal gets.
async fn post_initialize(c: &Client) -> reqwest::Response {
    c.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init_params("x")})).send().await.unwrap()
}

/// What the child was initialized with (the fixture puts it in `instructions`).
fn initialized_with(result: &Value) -> Value {
    serde_json::from_str(result["instructions"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_stdio_server_keeps_its_session_across_a_tether_crash_and_its_new_child_is_initialized_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let flag = upstream_flag("echo", "");
    let (tether, url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/echo"));
    let (sid, result) = initialized(&c, "gateway-test").await;
    assert_eq!(result["serverInfo"]["name"], "fixture", "the initialize result is the upstream's: {result}");
    assert!(result["_meta"]["dev.tether/sessionResumeToken"].is_string(), "plus tether's resume token");
    assert_eq!(initialized_with(&result)["clientInfo"]["name"], "gateway-test");
    let echoed = c.call(&sid, 1, "echo", json!({"x": 1})).await;
    assert_eq!(structured(&echoed), &json!({"x": 1}), "{echoed}");
    let first_pid = structured(&c.call(&sid, 2, "pid", json!({})).await)["pid"].clone();

    tether.crash();
    let (_tether, url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/echo"));
    let echoed = c.call(&sid, 3, "echo", json!({"y": 2})).await;
    assert_eq!(structured(&echoed), &json!({"y": 2}), "the same session works without initialize: {echoed}");
    let second_pid = structured(&c.call(&sid, 4, "pid", json!({})).await)["pid"].clone();
    assert_ne!(first_pid, second_pid, "a new child");
    // The new child saw the original client's initialize, then initialized.
    let seen = c.request(&sid, 5, "debug/seen", json!({})).await;
    let seen = seen.last().unwrap().json()["result"]["seen"].clone();
    let methods: Vec<&str> = seen.as_array().unwrap().iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(&methods[..2], ["initialize", "notifications/initialized"], "{seen}");
    assert_eq!(seen[0]["params"]["clientInfo"], json!({"name": "gateway-test", "version": "1.2.3"}));
    assert_eq!(seen[0]["params"]["capabilities"], json!({"sampling": {}}));
    assert!(seen[0]["params"]["_meta"].get("dev.tether/sessionResumeToken").is_none(), "tether's own keys stay tether's");
}

#[tokio::test]
async fn a_child_killed_mid_call_ends_that_call_once_and_the_next_call_gets_a_new_child() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "gateway-test").await;
    let pid = structured(&c.call(&sid, 1, "pid", json!({})).await)["pid"].as_i64().unwrap();
    let slow = {
        let (c, sid) = (c.clone(), sid.clone());
        tokio::spawn(async move { c.request(&sid, 2, "tools/call", json!({"name": "slow", "arguments": {"ms": 20000}})).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let events = tokio::time::timeout(Duration::from_secs(20), slow).await.expect("the call ends").unwrap();
    let answers: Vec<Value> = events.iter().map(|e| e.json()).filter(|m| m.get("id") == Some(&json!(2))).collect();
    assert_eq!(answers.len(), 1, "exactly one answer: {answers:?}");
    assert_eq!(answers[0]["error"]["code"], -32603);
    assert_eq!(answers[0]["error"]["message"], "upstream restarted; the request may or may not have taken effect");
    let next = c.call(&sid, 3, "pid", json!({})).await;
    assert_ne!(structured(&next)["pid"].as_i64(), Some(pid), "the next call runs on a new child: {next}");
}

#[tokio::test]
async fn progress_of_an_upstream_call_and_its_result_replay_after_the_client_dropped_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "gateway-test").await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 1500}, "_meta": {"progressToken": "p1"}}});
    let resp = c.post(Some(&sid), &call).send().await.unwrap();
    let mut stream = SseReader::new(resp);
    let prime = stream.next_event().await.unwrap();
    assert!(prime.data.is_empty(), "a priming event first");
    drop(stream); // the client goes away mid-call
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let replay = c.get(&sid, prime.id.as_deref()).send().await.unwrap();
    let events = SseReader::new(replay).all_events().await;
    let messages: Vec<Value> = events.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()).collect();
    let progress: Vec<&Value> = messages.iter().filter(|m| m["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 1, "the upstream's progress, once: {messages:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "p1");
    let results: Vec<&Value> = messages.iter().filter(|m| m["id"] == 7).collect();
    assert_eq!(results.len(), 1, "the result, once: {messages:?}");
    assert_eq!(structured(results[0]), &json!({"slept": 1500}));
}

#[tokio::test]
async fn unknown_endpoints_are_404_and_sessions_do_not_cross_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let nowhere = Client::new(&format!("{url}/nowhere"));
    let resp = post_initialize(&nowhere).await;
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("/mcp/nowhere"), "{body}");
    let gateway = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&gateway, "x").await;
    let notebook = Client::new(&url);
    let resp = notebook.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).send().await.unwrap();
    assert_eq!(resp.status(), 404, "a gateway session is not a session of /mcp");
}

#[tokio::test]
async fn a_child_that_exits_at_once_gets_the_client_a_clear_error_and_the_server_stays_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "broken", "--exit-at-once");
    let c = Client::new(&format!("{url}/broken"));
    let resp = post_initialize(&c).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("mcp-session-id").is_none(), "a refused initialize leaves no session");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32603, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("stdio_server.py"), "the message names the command: {message}");
    let health = reqwest::get(format!("{}/healthz", url.trim_end_matches("/mcp"))).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn a_config_file_bounds_an_upstream_that_never_answers_initialize() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    let toml = format!(
        "session_ttl = \"10m\"\n\n[upstreams.mute]\ncommand = [\"python3\", {:?}, \"--never-initialize\"]\nupstream_init_timeout = \"1s\"\n",
        fixture()
    );
    std::fs::write(&config, toml).unwrap();
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &["--config", config.to_str().unwrap()]);
    let c = Client::new(&format!("{url}/mute"));
    let started = std::time::Instant::now();
    let resp = post_initialize(&c).await;
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32603, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("initialize"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(20), "bounded by upstream_init_timeout, not hung");
}

#[tokio::test]
async fn an_upstream_that_misbehaves_mid_session_gets_clear_answers_and_other_sessions_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "bad").await;
    let (other, _) = initialized(&c, "good").await;
    for (n, tool) in ["non_json", "unknown_id", "huge_line"].into_iter().enumerate() {
        let answer = c.call(&sid, 10 + n as u64, tool, json!({})).await;
        assert_eq!(structured(&answer)["after"], tool, "the line is skipped and the call still answers: {answer}");
    }
    let down = Client::new(&format!("{url}/echo"));
    let echoed = down.call(&other, 1, "echo", json!({"still": "fine"})).await;
    assert_eq!(structured(&echoed), &json!({"still": "fine"}));
}

#[tokio::test]
async fn a_url_upstream_that_is_down_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let flag = format!("down=http://127.0.0.1:{port}/mcp");
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/down"));
    let resp = post_initialize(&c).await;
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32603, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&port.to_string()), "names the upstream: {body}");
}

#[tokio::test]
async fn three_replicas_on_redis_serve_one_gateway_session_initialize_on_a_call_on_b_replay_on_c() {
    // The URL upstream: another tether's notebook.
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, upstream_url) = Tether::start(&dir.path().join("u.db"), &[]);
    let store = redis_url();
    let prefix = fresh_prefix();
    let flag = format!("nb={upstream_url}");
    let replica = |n: &str| {
        Tether::start(&dir.path().join(format!("{n}.db")), &["--store", &store, "--store-prefix", &prefix, "--upstream", &flag])
    };
    let (_a, url_a) = replica("a");
    let (_b, url_b) = replica("b");
    let (_c, url_c) = replica("c");
    let ca = Client::new(&format!("{url_a}/nb"));
    let (sid, result) = initialized(&ca, "replicas").await;
    assert_eq!(result["serverInfo"]["name"], "tether-notebook", "{result}");
    let cb = Client::new(&format!("{url_b}/nb"));
    let call =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "thought", "arguments": thought_args(1)}});
    let resp = cb.post(Some(&sid), &call).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let events = SseReader::new(resp).all_events().await;
    let answer = events.last().unwrap().json();
    assert_eq!(answer["result"]["structuredContent"]["thoughtNumber"], 1, "{answer}");
    let prime = events.first().unwrap().id.clone().expect("a priming ID");
    let cc = Client::new(&format!("{url_c}/nb"));
    let replay = SseReader::new(cc.get(&sid, Some(&prime)).send().await.unwrap()).all_events().await;
    let replayed: Vec<Value> = replay.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()).collect();
    assert_eq!(replayed, vec![answer], "C replays what B answered");
    // C carries on the same upstream session (the notebook's history goes on)
    // instead of initializing a new one.
    let next = cc.call(&sid, 2, "thought", thought_args(2)).await;
    assert_eq!(next["result"]["structuredContent"]["thoughtHistoryLength"], 2, "{next}");
}

#[tokio::test]
async fn what_the_upstream_sends_before_its_answer_reaches_the_client_before_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "order").await;
    for n in 0..20u64 {
        let call = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "progress_then_answer", "arguments": {}, "_meta": {"progressToken": format!("t{n}")}}});
        let events = SseReader::new(c.post(Some(&sid), &call).send().await.unwrap()).all_events().await;
        let messages: Vec<Value> = events.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()).collect();
        assert_eq!(messages.len(), 2, "the progress and then the answer, on the call's own stream: {messages:?}");
        assert_eq!(messages[0]["method"], "notifications/progress");
        assert_eq!(messages[0]["params"]["progressToken"], format!("t{n}"));
        assert_eq!(messages[1]["id"], n);
    }
}

/// A config file with one fixture upstream `name` and `extra` keys for its table.
fn start_configured(dir: &tempfile::TempDir, name: &str, args: &[&str], extra: &str) -> (Tether, String) {
    let config = dir.path().join("tether.toml");
    let args: Vec<String> = std::iter::once(fixture()).chain(args.iter().map(|a| a.to_string())).collect();
    let toml = format!(
        "[upstreams.{name}]\ncommand = [\"python3\", {}]\n{extra}\n",
        args.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")
    );
    std::fs::write(&config, toml).unwrap();
    Tether::start(&dir.path().join("t.db"), &["--config", config.to_str().unwrap()])
}

async fn initialize_error(c: &Client) -> String {
    let resp = post_initialize(c).await;
    let body: Value = resp.json().await.unwrap();
    body["error"]["message"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_command_that_keeps_failing_is_backed_off_with_a_message_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "broken", "--exit-at-once");
    let c = Client::new(&format!("{url}/broken"));
    for _ in 0..3 {
        let message = initialize_error(&c).await;
        assert!(message.contains("stdio_server.py"), "each failure names the command: {message}");
    }
    let message = initialize_error(&c).await;
    assert!(message.contains("keeps failing") && message.contains("trying again in"), "then it is backed off: {message}");
    assert!(message.contains("exits at once"), "with its last error (the child's last stderr line): {message}");
}

#[tokio::test]
async fn an_idle_child_is_stopped_and_its_session_gets_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_configured(&dir, "echo", &[], "idle_timeout = \"1s\"");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "idle").await;
    let pid = structured(&c.call(&sid, 1, "pid", json!({})).await)["pid"].as_i64().unwrap();
    let gone = |pid: i64| !std::path::Path::new(&format!("/proc/{pid}")).exists();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !gone(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone(pid), "the idle child was stopped");
    let next = structured(&c.call(&sid, 2, "pid", json!({})).await)["pid"].as_i64().unwrap();
    assert_ne!(next, pid, "the session lives on with a new child");
}

#[tokio::test]
async fn beyond_max_processes_the_least_recently_used_idle_child_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_configured(&dir, "echo", &[], "max_processes = 1");
    let c = Client::new(&format!("{url}/echo"));
    let (first, _) = initialized(&c, "first").await;
    let first_pid = structured(&c.call(&first, 1, "pid", json!({})).await)["pid"].as_i64().unwrap();
    let (second, _) = initialized(&c, "second").await;
    let _ = c.call(&second, 1, "pid", json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{first_pid}")).exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!std::path::Path::new(&format!("/proc/{first_pid}")).exists(), "the first session's idle child made room");
    let again = structured(&c.call(&first, 2, "pid", json!({})).await)["pid"].as_i64().unwrap();
    assert_ne!(again, first_pid, "the first session carries on with a new child");
}

#[tokio::test]
async fn a_call_cut_off_by_a_tether_crash_replays_its_progress_and_ends_once_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let flag = upstream_flag("echo", "");
    let (tether, url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "crash").await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 60000}, "_meta": {"progressToken": "p9"}}});
    let mut stream = SseReader::new(c.post(Some(&sid), &call).send().await.unwrap());
    let prime = stream.next_event().await.unwrap();
    let progress = stream.next_message().await.unwrap();
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    drop(stream);
    tether.crash();
    let (_tether, url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/echo"));
    let replay = SseReader::new(c.get(&sid, prime.id.as_deref()).send().await.unwrap()).all_events().await;
    let messages: Vec<Value> = replay.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()).collect();
    assert_eq!(messages.len(), 2, "the progress and one final answer: {messages:?}");
    assert_eq!(messages[0], progress, "the progress the client saw, replayed identically");
    assert_eq!(messages[1]["id"], 9);
    assert_eq!(messages[1]["error"]["code"], -32603, "the call was cut off by the crash: {}", messages[1]);
    let echoed = c.call(&sid, 10, "echo", json!({"after": "crash"})).await;
    assert_eq!(structured(&echoed), &json!({"after": "crash"}), "and the session goes on with a new child");
}

#[tokio::test]
async fn a_call_through_a_url_upstream_is_carried_on_across_a_tether_crash_and_ends_with_its_real_result() {
    // The URL upstream: another tether in front of the stdio fixture; it
    // keeps its streams, so an answer can be picked up with Last-Event-ID.
    let dir = tempfile::tempdir().unwrap();
    let flag = upstream_flag("fixture", "");
    let (_upstream, upstream_url) = Tether::start(&dir.path().join("u.db"), &["--upstream", &flag]);
    let remote = format!("remote={upstream_url}/fixture");
    let db = dir.path().join("g.db");
    let (gateway, url) = Tether::start(&db, &["--upstream", &remote]);
    let c = Client::new(&format!("{url}/remote"));
    let (sid, _) = initialized(&c, "carry-on").await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 3000}, "_meta": {"progressToken": "p9"}}});
    let mut stream = SseReader::new(c.post(Some(&sid), &call).send().await.unwrap());
    let prime = stream.next_event().await.unwrap();
    let progress = stream.next_message().await.unwrap();
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    // Past the moment the gateway leaves its recovery note (100 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stream);
    gateway.crash();

    let (_gateway, url) = Tether::start(&db, &["--upstream", &remote]);
    let c = Client::new(&format!("{url}/remote"));
    let replay = SseReader::new(c.get(&sid, prime.id.as_deref()).send().await.unwrap()).all_events().await;
    let messages: Vec<Value> = replay.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()).collect();
    assert_eq!(messages.len(), 2, "the progress once (not again from the upstream) and one final answer: {messages:?}");
    assert_eq!(messages[0], progress, "the progress the client saw, replayed identically");
    assert_eq!(messages[1]["id"], 9);
    assert_eq!(structured(&messages[1]), &json!({"slept": 3000}), "the call's real result: {}", messages[1]);

    // The upstream ran it once: the fixture saw one `slow` call.
    let seen = c.request(&sid, 10, "debug/seen", json!({})).await;
    let seen = seen.last().unwrap().json()["result"]["seen"].clone();
    let slow_calls = seen.as_array().unwrap().iter().filter(|m| m["params"]["name"] == "slow").count();
    assert_eq!(slow_calls, 1, "{seen}");
}

#[tokio::test]
async fn forward_auth_sends_the_clients_token_upstream_also_after_a_tether_crash_and_only_where_asked() {
    // The URL upstream: another tether, which wants the client's own token.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "client-token-0123456789abcdef alice\n").unwrap();
    let tokens = tokens.to_str().unwrap();
    let (_upstream, upstream_url) = Tether::start(&dir.path().join("u.db"), &["--auth-tokens", tokens]);
    let config = dir.path().join("tether.toml");
    std::fs::write(
        &config,
        format!("[upstreams.fwd]\nurl = {upstream_url:?}\nforward_auth = true\n\n[upstreams.plain]\nurl = {upstream_url:?}\n"),
    )
    .unwrap();
    let args = ["--auth-tokens", tokens, "--config", config.to_str().unwrap()];
    let (gateway, url) = Tether::start(&dir.path().join("g.db"), &args);

    let plain = Client::with_token(&format!("{url}/plain"), "client-token-0123456789abcdef");
    let refused: Value = post_initialize(&plain).await.json().await.unwrap();
    assert!(refused["error"]["message"].as_str().unwrap_or("").contains("HTTP 401"), "not forwarded by default: {refused}");

    let fwd = Client::with_token(&format!("{url}/fwd"), "client-token-0123456789abcdef");
    let (sid, result) = initialized(&fwd, "forwarding").await;
    assert_eq!(result["serverInfo"]["name"], "tether-notebook", "{result}");
    let first = fwd.call(&sid, 1, "thought", thought_args(1)).await;
    assert_eq!(first["result"]["structuredContent"]["thoughtNumber"], 1, "{first}");

    // After a crash the stored upstream session is carried on with the
    // token of the request that needs it.
    gateway.crash();
    let (_gateway, url) = Tether::start(&dir.path().join("g.db"), &args);
    let fwd = Client::with_token(&format!("{url}/fwd"), "client-token-0123456789abcdef");
    let next = fwd.call(&sid, 2, "thought", thought_args(2)).await;
    assert_eq!(next["result"]["structuredContent"]["thoughtHistoryLength"], 2, "the same upstream session: {next}");
}

// Sessionless (2026-07-28) clients of a session-era upstream.

/// `_meta` of a sessionless request whose client declares `capabilities`.
fn declaring(capabilities: Value) -> Value {
    let mut m = sessionless_meta();
    m[tether_wire::meta::CLIENT_CAPABILITIES] = capabilities;
    m
}

fn sessionless_call(id: u64, tool: &str, arguments: Value, meta: Value) -> Value {
    sessionless_request(id, "tools/call", json!({"name": tool, "arguments": arguments, "_meta": meta}))
}

/// Every JSON-RPC message of a sessionless request's response, in order.
async fn sessionless_messages(c: &Client, body: &Value) -> Vec<Value> {
    let method = body["method"].as_str().unwrap_or_default();
    let name = body["params"]["name"].as_str().unwrap_or_default();
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", SESSIONLESS),
        ("mcp-method", method),
        ("mcp-name", name),
    ];
    let headers: Vec<_> = headers.into_iter().filter(|(_, v)| !v.is_empty()).collect();
    let text = c.post_raw(&headers, body.to_string()).send().await.unwrap().text().await.unwrap();
    match serde_json::from_str::<Value>(&text) {
        Ok(one) => vec![one],
        Err(_) => text.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str(d).ok()).collect(),
    }
}

#[tokio::test]
async fn a_sessionless_client_uses_a_stdio_server_discover_call_progress_and_sampling_as_mrtr_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_gateway(&dir, "echo", "");
    let c = Client::new(&format!("{url}/echo"));

    let (status, discovered) = send_sessionless(&c, &sessionless_request(1, "server/discover", json!({})), None, &[]).await;
    assert_eq!(status, 200, "{discovered}");
    let result = &discovered["result"];
    assert_eq!(result["_meta"][tether_wire::meta::SERVER_INFO]["name"], "fixture", "the upstream describes itself: {result}");
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    assert_eq!(result["supportedVersions"], json!([SESSIONLESS]));

    let (_, echoed) =
        send_sessionless(&c, &sessionless_call(2, "echo", json!({"x": 1}), sessionless_meta()), Some("echo"), &[]).await;
    assert_eq!(echoed["result"]["structuredContent"], json!({"x": 1}), "{echoed}");
    assert_eq!(echoed["result"]["resultType"], "complete");
    assert_eq!(echoed["result"]["_meta"][tether_wire::meta::SERVER_INFO]["name"], "fixture");

    // Progress of the upstream reaches the request's own response, before its answer.
    let mut meta = sessionless_meta();
    meta["progressToken"] = json!("p-1");
    let messages = sessionless_messages(&c, &sessionless_call(3, "slow", json!({"ms": 50}), meta)).await;
    let methods: Vec<&str> = messages.iter().map(|m| m["method"].as_str().unwrap_or("answer")).collect();
    assert_eq!(methods, ["notifications/progress", "answer"], "{messages:?}");
    assert_eq!(messages[0]["params"]["progressToken"], "p-1");
    assert_eq!(messages[1]["result"]["structuredContent"]["slept"], 50);

    // The upstream asks the client to sample: one round ends input_required,
    // the repeated request carries the answer, the upstream gets it.
    let sampling = declaring(json!({"sampling": {}}));
    let (_, round) =
        send_sessionless(&c, &sessionless_call(4, "sample", json!({"prompt": "hi"}), sampling.clone()), Some("sample"), &[])
            .await;
    let round = &round["result"];
    assert_eq!(round["resultType"], "input_required", "{round}");
    let key = "sampling/createMessage#0";
    assert_eq!(round["inputRequests"][key]["method"], "sampling/createMessage", "{round}");
    assert_eq!(round["inputRequests"][key]["params"]["messages"][0]["content"]["text"], "hi");
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "sampled!"}, "model": "m"});
    let mut again = sessionless_call(5, "sample", json!({"prompt": "hi"}), sampling);
    again["params"]["inputResponses"] = json!({(key): answer});
    again["params"]["requestState"] = round["requestState"].clone();
    let (_, done) = send_sessionless(&c, &again, Some("sample"), &[]).await;
    assert_eq!(done["result"]["structuredContent"]["sampled"]["content"]["text"], "sampled!", "{done}");

    // A client that cannot sample: the upstream hears -32021 and says so.
    let (_, refused) =
        send_sessionless(&c, &sessionless_call(6, "sample", json!({}), sessionless_meta()), Some("sample"), &[]).await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("-32021"), "the upstream was told the client lacks sampling: {refused}");

    // The upstream saw requests of the revision it speaks: its initialize
    // declared what sessionless clients may bring, and no request carried
    // the 2026-07-28 declarations.
    // The cancellation of the round that asked goes upstream as the round
    // ends, beside its answer: read until it has arrived (bounded).
    let mut seen = Vec::new();
    for n in 0..50 {
        let (_, got) = send_sessionless(&c, &sessionless_request(100 + n, "debug/seen", json!({})), None, &[]).await;
        seen = got["result"]["seen"].as_array().cloned().unwrap_or_default();
        if seen.iter().any(|m| m["method"] == "notifications/cancelled") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let initialize = seen.iter().find(|m| m["method"] == "initialize").expect("the pooled connection was initialized");
    assert_eq!(initialize["params"]["protocolVersion"], "2025-11-25");
    assert!(initialize["params"]["capabilities"]["sampling"].is_object(), "{initialize}");
    let calls: Vec<&Value> = seen.iter().filter(|m| m["method"] == "tools/call").collect();
    assert!(calls.len() >= 5, "one connection served the calls in turn: {seen:?}");
    for call in calls {
        let meta = call["params"]["_meta"].as_object().cloned().unwrap_or_default();
        assert!(meta.keys().all(|k| !k.starts_with("io.modelcontextprotocol/")), "no sessionless _meta upstream: {call}");
    }
    assert!(seen.iter().any(|m| m["method"] == "notifications/cancelled"), "the round that asked was cancelled upstream");

    // A session-era session goes on beside, on its own child.
    let (sid, _) = initialized(&c, "legacy").await;
    assert_eq!(structured(&c.call(&sid, 1, "echo", json!({"y": 2})).await), &json!({"y": 2}));
}

#[tokio::test]
async fn a_task_tool_of_an_upstream_runs_as_a_durable_task_and_one_cut_off_by_a_crash_fails_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let config = dir.path().join("tether.toml");
    let toml =
        format!("resume_wait = \"0s\"\n[upstreams.echo]\ncommand = [\"python3\", {:?}]\ntask_tools = [\"slow\"]\n", fixture());
    std::fs::write(&config, toml).unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let (tether, url) = Tether::start(&db, &args);
    let c = Client::new(&format!("{url}/echo"));
    let tasks = declaring(json!({"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}}));

    let (_, discovered) = send_sessionless(&c, &sessionless_request(1, "server/discover", json!({})), None, &[]).await;
    assert!(discovered["result"]["capabilities"]["extensions"][tether_wire::meta::TASKS_EXTENSION].is_object(), "{discovered}");
    // A client without the extension is never given a task: it waits for the result.
    let (_, undeclared) =
        send_sessionless(&c, &sessionless_call(2, "slow", json!({"ms": 10}), sessionless_meta()), Some("slow"), &[]).await;
    assert_eq!(undeclared["result"]["resultType"], "complete", "{undeclared}");
    assert_eq!(undeclared["result"]["structuredContent"]["slept"], 10, "the upstream's result, inline: {undeclared}");
    // Other tools are plain calls.
    let (_, echoed) = send_sessionless(&c, &sessionless_call(3, "echo", json!({"z": 3}), tasks.clone()), Some("echo"), &[]).await;
    assert_eq!(echoed["result"]["structuredContent"], json!({"z": 3}), "{echoed}");

    let (_, created) =
        send_sessionless(&c, &sessionless_call(4, "slow", json!({"ms": 300}), tasks.clone()), Some("slow"), &[]).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().expect("a task id").to_owned();
    let get = |n: u64, id: String| sessionless_request(n, "tasks/get", json!({"taskId": id, "_meta": tasks.clone()}));
    let mut done = Value::Null;
    for n in 0..100 {
        let (_, got) = send_sessionless(&c, &get(10 + n, id.clone()), Some(&id), &[]).await;
        if got["result"]["status"] != "working" {
            done = got;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["result"]["structuredContent"]["slept"], 300, "the upstream's result is the task's: {done}");

    // A task cut off by kill -9: answered after the restart, failed "interrupted".
    let (_, created) =
        send_sessionless(&c, &sessionless_call(5, "slow", json!({"ms": 60000}), tasks.clone()), Some("slow"), &[]).await;
    let id = created["result"]["taskId"].as_str().expect("a task id").to_owned();
    tether.crash();
    let (_tether, url) = Tether::start(&db, &args);
    let c = Client::new(&format!("{url}/echo"));
    let (_, after) = send_sessionless(&c, &get(200, id.clone()), Some(&id), &[]).await;
    assert_eq!(after["result"]["status"], "failed", "{after}");
    assert!(after["result"]["error"]["message"].as_str().unwrap_or_default().contains("interrupted"), "{after}");
}

// Session-era clients of an upstream that speaks only the sessionless revision.

/// The sessionless-only fixture of crates/tether-gateway on a free port: (child, its base URL).
fn start_sessionless_fixture() -> (Tether, String) {
    use std::io::BufRead;
    let script = format!("{}/../tether-gateway/tests/fixtures/sessionless_server.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the sessionless fixture");
    let stdout = child.stdout.take().expect("its stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).expect("the fixture prints its port");
    let port = line.trim().strip_prefix("PORT ").expect("PORT n").to_owned();
    (Tether(child), format!("http://127.0.0.1:{port}"))
}

#[tokio::test]
async fn a_session_era_client_uses_a_sessionless_only_upstream_its_asks_and_tasks_bridged() {
    let dir = tempfile::tempdir().unwrap();
    let (_fixture, upstream) = start_sessionless_fixture();
    let flag = format!("bridge={upstream}/mcp");
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/bridge"));

    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}}, "clientInfo": {"name": "old-client", "version": "9"}});
    let (sid, result) = c.initialize_params(params).await;
    assert_eq!(result["serverInfo"]["name"], "sessionless-fixture", "initialize is answered from server/discover: {result}");
    assert_eq!(result["protocolVersion"], "2025-11-25");
    let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    assert_eq!(r.status(), 202);

    // The upstream's input_required round is a roots/list to this session's client.
    let roots = json!([{"uri": "file:///old/project", "name": "project"}]);
    let asked = c.call_with_roots(&sid, 1, "ask_roots", json!({}), &roots).await;
    assert_eq!(asked["result"]["content"][0]["text"], "[\"file:///old/project\"]", "{asked}");
    assert!(asked["result"].get("resultType").is_none(), "a session-era result has no resultType: {asked}");

    // A task of the upstream is followed to its end: the client gets the result.
    let events = c.request(&sid, 2, "logging/setLevel", json!({"level": "debug"})).await;
    assert!(events.last().unwrap().json()["result"].is_object());
    let long = c.call(&sid, 3, "long", json!({})).await;
    assert_eq!(long["result"]["content"][0]["text"], "long done", "{long}");

    let seen: Vec<Value> = reqwest::get(format!("{upstream}/seen")).await.unwrap().json().await.unwrap();
    let methods: Vec<&str> = seen.iter().filter_map(|m| m["method"].as_str()).collect();
    assert!(methods.contains(&"server/discover") && methods.contains(&"tasks/get"), "{methods:?}");
    assert_eq!(methods.iter().filter(|m| **m == "logging/setLevel").count(), 0, "the level travels in _meta: {methods:?}");
    let calls: Vec<&Value> = seen.iter().filter(|m| m["method"] == "tools/call").collect();
    assert_eq!(calls.len(), 3, "ask_roots twice (one round), long once: {methods:?}");
    for call in &calls {
        let m = &call["params"]["_meta"];
        assert_eq!(m[tether_wire::meta::CLIENT_INFO]["name"], "old-client", "each request declares the session's client: {call}");
        assert!(m[tether_wire::meta::CLIENT_CAPABILITIES]["roots"].is_object(), "{call}");
    }
    assert_eq!(calls[2]["params"]["_meta"][tether_wire::meta::LOG_LEVEL], "debug", "{}", calls[2]);
}

/// The fixture children of process `parent` alive now, from `/proc`.
fn fixture_children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "pid (comm) state ppid …": the fields after the last ')'.
            let mut after = stat.rsplit(')').next().unwrap_or_default().split_whitespace();
            let (state, ppid) = (after.next(), after.next().and_then(|p| p.parse::<u32>().ok()));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // The keeper's engine names the fixture in its arguments too.
            let engine = cmdline.split(|b| *b == 0).nth(1) == Some(b"engine".as_slice());
            ppid == Some(parent) && state != Some("Z") && !engine && String::from_utf8_lossy(&cmdline).contains("stdio_server.py")
        })
        .collect()
}

#[tokio::test]
async fn max_processes_is_a_hard_cap_and_a_request_beyond_it_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // Every session here is one principal's: its share is the whole cap.
    let limits = "max_processes = 3\nmax_processes_per_principal = 3\nprocess_queue_timeout = \"1s\"\nidle_timeout = \"10m\"";
    let (tether, url) = start_configured(&dir, "echo", &[], limits);
    let pid = tether.0.id();
    let c = Client::new(&format!("{url}/echo"));
    let mut sessions = Vec::new();
    for n in 0..12 {
        sessions.push(initialized(&c, &format!("client-{n}")).await.0);
    }
    // Children are counted from /proc the whole time the calls run.
    let counting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let counting = counting.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while counting.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(fixture_children(pid).len());
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    let calls: Vec<_> = sessions
        .iter()
        .map(|sid| {
            let (c, sid) = (c.clone(), sid.clone());
            tokio::spawn(
                async move { c.request(&sid, 1, "tools/call", json!({"name": "slow", "arguments": {"ms": 3000}})).await },
            )
        })
        .collect();
    let (mut ran, mut refused) = (0, 0);
    for call in calls {
        let events = call.await.unwrap();
        let answers: Vec<Value> = events.iter().map(|e| e.json()).filter(|m| m.get("id") == Some(&json!(1))).collect();
        assert_eq!(answers.len(), 1, "every call ends once: {answers:?}");
        if structured(&answers[0])["slept"] == 3000 {
            ran += 1;
        } else {
            let error = &answers[0]["error"];
            assert_eq!(error["code"], -32000, "{error}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains("upstream echo is at its max_processes limit (3 live children"), "{message}");
            assert_eq!(error["data"]["limit"], "max_processes");
            refused += 1;
        }
    }
    counting.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.join().unwrap();
    println!("max_processes = 3, 12 sessions: {ran} calls ran, {refused} refused, at most {most} live children");
    assert!(most <= 3, "never more than max_processes live children: saw {most}");
    assert!(ran >= 3 && refused >= 1, "ran {ran}, refused {refused}");
    // Refused sessions are not broken: with room again, they call on.
    let echoed = c.call(&sessions[11], 2, "echo", json!({"after": "refusal"})).await;
    assert_eq!(structured(&echoed), &json!({"after": "refusal"}), "{echoed}");
    assert!(fixture_children(pid).len() <= 3);
}

#[tokio::test]
async fn an_initialize_refused_at_max_processes_is_a_503_naming_the_limit_and_a_retry_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) =
        start_configured(&dir, "echo", &[], "max_processes = 1\nprocess_queue_timeout = \"500ms\"\nidle_timeout = \"10m\"");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "busy").await;
    let slow = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 600_000}, "_meta": {"progressToken": "p"}}});
    let mut call = c.post(Some(&sid), &slow).send().await.unwrap();
    // The only child is busy once its progress arrives.
    let mut seen = String::new();
    while !seen.contains("notifications/progress") {
        let chunk = tokio::time::timeout(Duration::from_secs(30), call.chunk()).await.expect("progress in time").unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("the call's stream is open")));
    }
    let refused = post_initialize(&c).await;
    assert_eq!(refused.status(), 503, "a reached bound is a 503");
    assert_eq!(refused.headers()["retry-after"], "1");
    assert!(refused.headers().get("mcp-session-id").is_none(), "no session was made");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["id"], 0);
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert_eq!(body["error"]["data"]["limit"], "max_processes", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream echo is at its max_processes limit (1 live children"), "{message}");
    // With the call cancelled its child is idle, and the retry makes room.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    assert_eq!(c.post(Some(&sid), &cancel).send().await.unwrap().status(), 202);
    while tokio::time::timeout(Duration::from_secs(30), call.chunk()).await.expect("the stream ends in time").unwrap().is_some() {
    }
    let (retried, _) = initialized(&c, "retry").await;
    let echoed = c.call(&retried, 2, "echo", json!({"after": "retry"})).await;
    assert_eq!(structured(&echoed), &json!({"after": "retry"}), "{echoed}");
}

#[tokio::test]
async fn an_upstream_answer_over_the_limit_or_unreadable_ends_its_call_and_other_sessions_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = start_configured(&dir, "echo", &[], "max_message_bytes = 1048576");
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "bad").await;
    let (other, _) = initialized(&c, "good").await;
    let slow = {
        let (c, other) = (c.clone(), other.clone());
        tokio::spawn(async move { c.call(&other, 1, "slow", json!({"ms": 2000})).await })
    };
    let cases = [
        ("big_result", json!({"bytes": 2_000_000}), "answered with a message of"),
        ("broken_answer", json!({"how": "truncated"}), "answered with a line on stdout that is not a JSON-RPC message"),
        ("broken_answer", json!({"how": "utf8"}), "answered with a line on stdout that is not a JSON-RPC message"),
    ];
    for (n, (tool, arguments, expected)) in cases.into_iter().enumerate() {
        let started = std::time::Instant::now();
        let answer = c.call(&sid, 10 + n as u64, tool, arguments).await;
        // Not a speed check: before, such a call never ended at all.
        println!("{tool}: ended after {:?}", started.elapsed());
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("upstream echo") && message.contains(expected), "{message}");
    }
    // The session goes on, and so does the other one's call.
    let echoed = c.call(&sid, 20, "echo", json!({"still": "here"})).await;
    assert_eq!(structured(&echoed), &json!({"still": "here"}), "{echoed}");
    assert_eq!(structured(&slow.await.unwrap())["slept"], 2000);
    // A large result under the limit goes through whole.
    let big = c.call(&other, 2, "big_result", json!({"bytes": 900_000})).await;
    assert_eq!(big["result"]["content"][0]["text"].as_str().map(str::len), Some(900_000));
}

/// One client's call in a round of the crash test: what it must end with.
struct CrashCall {
    sid: String,
    token: String,
    ms: u64,
    last_event: Option<String>,
    seen: Vec<Value>,
}

#[tokio::test]
async fn calls_through_an_upstream_that_keys_its_streams_by_request_id_each_end_once_with_their_own_result_across_crashes() {
    // The official Python SDK with one event store for every session, keyed
    // by request ID: an upstream request ID that two sessions share mixes
    // their streams up when they are resumed.
    let (_upstream, upstream_url) = start_py_server("shared-store");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("g.db");
    let flag = format!("shared={upstream_url}");
    let (mut tether, mut url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/shared"));
    let mut sessions = Vec::new();
    for n in 0..12 {
        sessions.push(initialized(&c, &format!("client-{n}")).await.0);
    }
    let (mut calls, mut foreign) = (0, 0);
    for round in 0..5u64 {
        let c = Client::new(&format!("{url}/shared"));
        // Every client starts a slow call (its own duration, so its own result).
        let mut started = Vec::new();
        for (n, sid) in sessions.iter().enumerate() {
            let ms = 2400 + 20 * n as u64 + round;
            let token = format!("c{n}-r{round}");
            let body = json!({"jsonrpc": "2.0", "id": round, "method": "tools/call",
                "params": {"name": "slow", "arguments": {"ms": ms}, "_meta": {"progressToken": token}}});
            let response = c.post(Some(sid), &body).send().await.unwrap();
            assert_eq!(response.status(), 200);
            started
                .push((CrashCall { sid: sid.clone(), token, ms, last_event: None, seen: Vec::new() }, SseReader::new(response)));
        }
        // Each call is running upstream once its second progress arrived
        // (the gateway left its recovery note long before).
        for (call, stream) in started.iter_mut() {
            let mut progress = 0;
            while progress < 2 {
                let event = stream.next_event().await.expect("the call's stream goes on until its second progress");
                if event.id.is_some() {
                    call.last_event = event.id.clone();
                }
                if event.data.is_empty() {
                    continue;
                }
                let message = event.json();
                if message["method"] == "notifications/progress" {
                    progress += 1;
                }
                call.seen.push(message);
            }
        }
        let mut cut: Vec<CrashCall> = started.into_iter().map(|(call, _)| call).collect();
        tether.crash();
        (tether, url) = Tether::start(&db, &["--upstream", &flag]);
        let c = Client::new(&format!("{url}/shared"));
        for call in cut.iter_mut() {
            let replay = SseReader::new(c.get(&call.sid, call.last_event.as_deref()).send().await.unwrap()).all_events().await;
            call.seen.extend(replay.iter().filter(|e| !e.data.is_empty()).map(|e| e.json()));
            let answers: Vec<&Value> = call.seen.iter().filter(|m| m.get("id") == Some(&json!(round))).collect();
            assert_eq!(answers.len(), 1, "round {round}: the call ends exactly once: {:?}", call.seen);
            let text = answers[0]["result"]["content"][0]["text"].as_str().unwrap_or_default();
            assert_eq!(text, format!("slept {} ms", call.ms), "round {round}: its own result: {}", answers[0]);
            for message in call.seen.iter().filter(|m| m["method"] == "notifications/progress") {
                if message["params"]["progressToken"] != json!(call.token) {
                    foreign += 1;
                }
            }
            calls += 1;
        }
    }
    println!("{calls} calls across 5 kill -9s: each ended once with its own result; {foreign} foreign progress notifications");
    assert_eq!(foreign, 0, "no progress of another call reached any call");
}

#[tokio::test]
async fn shutdown_stops_every_child_within_the_drain_timeout_and_the_sessions_carry_on_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    // Each child leaves a process of its own behind, as `npx` does.
    let left_behind = dir.path().join("grandchildren");
    let flag = format!("echo=stdio:sh -c 'sleep 1000 & echo $! >> {}; exec python3 {}'", left_behind.display(), fixture());
    let (tether, url) = Tether::start(&db, &["--upstream", &flag, "--drain-timeout", "5s"]);
    let pid = tether.0.id();
    let c = Client::new(&format!("{url}/echo"));
    let mut sessions = Vec::new();
    for n in 0..3 {
        let (sid, _) = initialized(&c, &format!("client-{n}")).await;
        sessions.push(sid);
    }
    // A sessionless client's pooled child too.
    let answers = sessionless_messages(&c, &sessionless_call(1, "echo", json!({"x": 1}), sessionless_meta())).await;
    assert_eq!(structured(answers.last().unwrap()), &json!({"x": 1}), "{answers:?}");
    let children = fixture_children(pid);
    assert_eq!(children.len(), 4, "three sessions' children and one pooled: {children:?}");

    let started = std::time::Instant::now();
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    let mut tether = tether;
    let status = tokio::task::spawn_blocking(move || {
        let status = tether.0.wait();
        (tether, status)
    })
    .await
    .unwrap()
    .1
    .unwrap();
    println!("SIGTERM with 4 live children: exited {status} after {:?}", started.elapsed());
    assert!(status.success(), "a clean exit: {status}");
    let grandchildren: Vec<u32> =
        std::fs::read_to_string(&left_behind).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(grandchildren.len(), 5, "four live children and the one server/discover started and stopped");
    let running: Vec<u32> = children.iter().chain(&grandchildren).copied().filter(|p| process_running(*p)).collect();
    assert!(running.is_empty(), "no child (nor what it started) left running: {running:?}");

    // The sessions were left, not ended: they carry on with new children.
    let (_tether, url) = Tether::start(&db, &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/echo"));
    let echoed = c.call(&sessions[0], 5, "echo", json!({"after": "shutdown"})).await;
    assert_eq!(structured(&echoed), &json!({"after": "shutdown"}), "{echoed}");
}

/// Whether `pid` runs (a zombie waiting to be reaped does not count).
fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

#[tokio::test]
async fn a_url_upstreams_answer_over_the_limit_ends_its_call_at_once_with_a_clear_error() {
    // The URL upstream: another tether in front of the stdio fixture.
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, upstream_url) = Tether::start(&dir.path().join("u.db"), &["--upstream", &upstream_flag("fixture", "")]);
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, format!("[upstreams.remote]\nurl = \"{upstream_url}/fixture\"\nmax_message_bytes = 65536\n"))
        .unwrap();
    let (_gateway, url) = Tether::start(&dir.path().join("g.db"), &["--config", config.to_str().unwrap()]);
    let c = Client::new(&format!("{url}/remote"));
    let (sid, _) = initialized(&c, "limits").await;
    let answer = c.call(&sid, 1, "big_result", json!({"bytes": 200_000})).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream remote at") && message.contains("larger than 65536 bytes"), "{message}");
    // Under the limit, and afterwards, calls go through.
    let small = c.call(&sid, 2, "big_result", json!({"bytes": 30_000})).await;
    assert_eq!(small["result"]["content"][0]["text"].as_str().map(str::len), Some(30_000), "{small}");
}

#[tokio::test]
async fn a_childs_log_lines_name_its_session_from_the_first_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (_tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("echo", "")]);
    let c = Client::new(&format!("{url}/echo"));
    let (sid, _) = initialized(&c, "tagged").await;
    // The fixture's first stderr line is written as it starts, during `initialize`.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Some(line) = log_of(&db).lines().find(|l| l.contains("stderr: fixture pid")) {
            break line.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "the child's first stderr line was logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(first.contains(&format!("session={sid}")), "tagged with the session it serves: {first}");
}
