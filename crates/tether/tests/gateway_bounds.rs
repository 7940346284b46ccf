//! The bounds of a command (stdio) upstream over real HTTP against the real
//! binary and the Python fixture of crates/tether-gateway: a call the child
//! never answers ends after the upstream's `request_timeout` (and the child
//! is told), one principal holding calls leaves children for others under
//! the default `max_processes_per_principal`, and `max_stdio_processes`
//! bounds the children of every upstream together. The fixture appends
//! what it reads to a file (`FIXTURE_RECORD`), which the tests wait on.
//! Time limits here only stop a hung test; they assert nothing about speed.

mod support;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

/// `[upstreams.NAME]` for the fixture, recording what it reads in `record`.
fn fixture_table(name: &str, record: &Path, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\ncommand = [\"python3\", {:?}]\nenv = {{ FIXTURE_RECORD = {:?} }}\n{extra}\n",
        fixture(),
        record.display().to_string()
    )
}

/// `tether serve --config` with `toml`, and `args`.
fn start(dir: &tempfile::TempDir, toml: &str, args: &[&str]) -> (Tether, String) {
    let config = dir.path().join("tether.toml");
    std::fs::write(&config, toml).unwrap();
    let mut all = vec!["--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    Tether::start(&dir.path().join("t.db"), &all)
}

/// The messages the fixture children recorded so far.
fn recorded(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Waits (generously) until the children have recorded `n` messages `matching`.
async fn recorded_until(path: &Path, what: &str, n: usize, matching: impl Fn(&Value) -> bool) -> Vec<Value> {
    within(what, async {
        loop {
            let found: Vec<Value> = recorded(path).into_iter().filter(|m| matching(m)).collect();
            if found.len() >= n {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

fn is_call_of(message: &Value, tool: &str) -> bool {
    message["method"] == "tools/call" && message["params"]["name"] == tool
}

/// `initialize` as it goes over the wire: the session ID, or the refusal's status and body.
async fn try_initialize(c: &Client) -> Result<String, (u16, Value)> {
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bounds", "version": "0"}});
    let resp = c.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})).send().await.unwrap();
    let status = resp.status().as_u16();
    let sid = resp.headers().get(tether_wire::headers::SESSION_ID).map(|v| v.to_str().unwrap().to_owned());
    match sid {
        Some(sid) if status == 200 => {
            SseReader::new(resp).all_events().await;
            let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
            assert_eq!(r.status(), 202);
            Ok(sid)
        }
        _ => {
            let body = resp.text().await.unwrap_or_default();
            Err((status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
        }
    }
}

/// Starts a `never_answer` call on `sid` and keeps its stream open (the
/// response, dropped with the returned task at the test's end).
fn hold_a_call(c: &Client, sid: &str, id: u64) -> tokio::task::JoinHandle<Vec<SseEvent>> {
    let (c, sid) = (c.clone(), sid.to_owned());
    tokio::spawn(async move { c.request(&sid, id, "tools/call", json!({"name": "never_answer", "arguments": {}})).await })
}

#[tokio::test]
async fn a_call_the_child_never_answers_ends_after_request_timeout_the_child_gets_cancelled_and_its_child_can_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("received.jsonl");
    // One child at most: the session after the timed-out call gets in only
    // if that call no longer holds its child.
    let table = fixture_table(
        "slowpoke",
        &record,
        "request_timeout = \"2s\"\nmax_processes = 1\nprocess_queue_timeout = \"1s\"\nidle_timeout = \"10m\"",
    );
    let (_tether, url) = start(&dir, &table, &[]);
    let c = Client::new(&format!("{url}/slowpoke"));
    let first = try_initialize(&c).await.expect("a session");

    let response = within("the call that is never answered", c.call(&first, 7, "never_answer", json!({}))).await;
    assert_eq!(response["id"], 7, "{response}");
    let error = &response["error"];
    assert_eq!(error["code"], -32603, "{response}");
    let message = error["message"].as_str().unwrap_or_default();
    for part in [
        "upstream slowpoke did not answer tools/call within 2s (its request_timeout)",
        "may or may not have taken effect",
        "raise request_timeout in [upstreams.slowpoke]",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert_eq!(error["data"]["timeout"], "request_timeout", "{response}");

    // The child got notifications/cancelled for the id tether gave the call.
    let held = recorded_until(&record, "the call", 1, |m| is_call_of(m, "never_answer")).await;
    let cancelled = recorded_until(&record, "notifications/cancelled", 1, |m| m["method"] == "notifications/cancelled").await;
    assert_eq!(cancelled[0]["params"]["requestId"], held[0]["id"], "{cancelled:?}");
    assert!(cancelled[0]["params"]["reason"].as_str().is_some_and(|r| r.contains("request_timeout")), "{cancelled:?}");

    // Nothing is in flight on the first session now: its idle child makes
    // room for another session under max_processes = 1.
    let second = try_initialize(&c).await.expect("the timed-out call's child no longer holds the only place");
    let echoed = c.call(&second, 1, "echo", json!({"after": "timeout"})).await;
    assert_eq!(structured(&echoed), &json!({"after": "timeout"}), "{echoed}");
}

#[tokio::test]
async fn one_principal_holding_calls_cannot_take_every_child_and_another_principal_still_gets_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice-token-0123456789abcdef alice\nbob-token-0123456789abcdefgh bob\n").unwrap();
    let record = dir.path().join("received.jsonl");
    // No max_processes_per_principal: the default share (half of 4).
    let table = fixture_table("echo", &record, "max_processes = 4\nprocess_queue_timeout = \"1s\"\nidle_timeout = \"10m\"");
    let (_tether, url) = start(&dir, &table, &["--auth-tokens", tokens.to_str().unwrap()]);
    let alice = Client::with_token(&format!("{url}/echo"), "alice-token-0123456789abcdef");
    let bob = Client::with_token(&format!("{url}/echo"), "bob-token-0123456789abcdefgh");

    // Alice opens sessions, each holding a call its child never answers,
    // until she is refused (at most one more than there are children).
    let mut calls = Vec::new();
    let refusal = loop {
        assert!(calls.len() <= 4, "alice was never refused");
        match try_initialize(&alice).await {
            Ok(sid) => {
                calls.push(hold_a_call(&alice, &sid, 1));
                recorded_until(&record, "alice's call", calls.len(), |m| is_call_of(m, "never_answer")).await;
            }
            Err(refused) => break refused,
        }
    };
    let (status, body) = refusal;
    assert_eq!(calls.len(), 2, "alice holds her share, half of max_processes: {body}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["data"]["limit"], "max_processes_per_principal", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("upstream echo is at its max_processes_per_principal limit (2 children held by this principal"),
        "{message}"
    );

    // Bob still gets a child.
    let sid = try_initialize(&bob).await.unwrap_or_else(|(status, body)| panic!("bob was refused ({status}): {body}"));
    let echoed = bob.call(&sid, 1, "echo", json!({"who": "bob"})).await;
    assert_eq!(structured(&echoed), &json!({"who": "bob"}), "{echoed}");
    for call in calls {
        call.abort();
    }
}

#[tokio::test]
async fn max_stdio_processes_bounds_the_children_of_every_upstream_together() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("received.jsonl");
    let limits = "max_processes = 4\nprocess_queue_timeout = \"1s\"\nidle_timeout = \"10m\"";
    let toml = format!(
        "max_stdio_processes = 1\n{}{}",
        fixture_table("first", &record, limits),
        fixture_table("second", &record, limits)
    );
    let (_tether, url) = start(&dir, &toml, &[]);
    let first = Client::new(&format!("{url}/first"));
    let second = Client::new(&format!("{url}/second"));

    let sid = try_initialize(&first).await.expect("a session on the first upstream");
    let call = hold_a_call(&first, &sid, 1);
    recorded_until(&record, "the held call", 1, |m| is_call_of(m, "never_answer")).await;

    // The second upstream has room of its own, the process has none.
    let (status, body) = try_initialize(&second).await.expect_err("no room under max_stdio_processes");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["data"]["limit"], "max_stdio_processes", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for part in ["upstream second cannot start a child", "max_stdio_processes limit (1 live children", "--max-stdio-processes"] {
        assert!(message.contains(part), "{part:?} in {message}");
    }

    // Once the first upstream's child is gone, the second gets its place.
    call.abort();
    let deleted = first
        .http
        .delete(&first.url)
        .header(tether_wire::headers::SESSION_ID, &sid)
        .header(tether_wire::headers::PROTOCOL_VERSION, tether_wire::revision::LATEST)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let sid = within("a place for the second upstream", async {
        loop {
            match try_initialize(&second).await {
                Ok(sid) => return sid,
                // The first child is being reaped: asked again, it is gone.
                Err((_, body)) => assert_eq!(body["error"]["data"]["limit"], "max_stdio_processes", "{body}"),
            }
        }
    })
    .await;
    let echoed = second.call(&sid, 1, "echo", json!({"on": "second"})).await;
    assert_eq!(structured(&echoed), &json!({"on": "second"}), "{echoed}");
}

#[tokio::test]
async fn max_sessionless_bounds_the_sessionless_requests_of_the_whole_server() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("received.jsonl");
    let (_tether, url) = start(&dir, &fixture_table("echo", &record, ""), &["--max-sessionless", "1"]);
    let c = Client::new(&format!("{url}/echo"));
    let call = |id: u64, tool: &str| sessionless_request(id, "tools/call", json!({"name": tool, "arguments": {}}));

    let held = {
        let (c, body) = (c.clone(), call(1, "never_answer"));
        tokio::spawn(async move { send_sessionless(&c, &body, Some("never_answer"), &[]).await })
    };
    recorded_until(&record, "the held sessionless call", 1, |m| is_call_of(m, "never_answer")).await;

    let (status, body) = send_sessionless(&c, &call(2, "echo"), Some("echo"), &[]).await;
    // (429 today, as for one principal's share; the status is the engine's.)
    assert!(status == 429 || status == 503, "refused: {status} {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("this server already runs 1 sessionless requests (max_sessionless_requests)"), "{body}");
    held.abort();
}
