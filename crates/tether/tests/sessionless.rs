//! The sessionless revision (2026-07-28) on the same endpoint as the session
//! era, over real HTTP against the real binary: `server/discover`, requests
//! that carry their caller in `_meta`, the validation order and its error
//! codes, 405 for GET and DELETE, and session-era sessions going on beside them.

mod support;

use serde_json::{Value, json};
use support::*;
use support::{send_sessionless as send, sessionless_request as request};
use tether_wire::meta;

fn thought(n: u64, pin: Option<&str>) -> Value {
    let mut params = json!({"name": "thought", "arguments": thought_args(n)});
    if let Some(id) = pin {
        let mut m = sessionless_meta();
        m[meta::NOTEBOOK_SESSION] = json!(id);
        params["_meta"] = m;
    }
    params
}

#[tokio::test]
async fn discover_list_and_call_without_a_session_and_session_era_sessions_go_on_beside() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);
    let c = Client::new(&url);

    let (status, discovered) = send(&c, &request(1, "server/discover", json!({})), None, &[]).await;
    assert_eq!(status, 200, "{discovered}");
    let result = &discovered["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["supportedVersions"], json!([SESSIONLESS]));
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    assert_eq!(result["_meta"][meta::SERVER_INFO]["name"], "tether-notebook");
    assert!(result["ttlMs"].is_u64() && result["cacheScope"].is_string(), "{result}");

    let (status, listed) = send(&c, &request(2, "tools/list", json!({})), None, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(listed["result"]["resultType"], "complete");
    assert!(listed["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "thought"), "{listed}");
    let metrics = reqwest::get(url.replace("/mcp", "/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("tether_request_duration_seconds_count{method=\"tools/list\"} 1"),
        "a sessionless request is timed like any other:\n{metrics}"
    );

    // The first thought starts a notebook session and names it; the next
    // one, naming it, goes on in it.
    let (status, first) = send(&c, &request(3, "tools/call", thought(1, None)), Some("thought"), &[]).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["result"]["structuredContent"]["thoughtHistoryLength"], 1, "{first}");
    assert_eq!(first["result"]["_meta"][meta::SERVER_INFO]["name"], "tether-notebook");
    let pinned = first["result"]["_meta"][meta::NOTEBOOK_SESSION].as_str().expect("the notebook session is named").to_owned();
    let (_, second) = send(&c, &request(4, "tools/call", thought(2, Some(&pinned))), Some("thought"), &[]).await;
    assert_eq!(second["result"]["structuredContent"]["thoughtHistoryLength"], 2, "{second}");

    // A session-era session on the same endpoint, unchanged.
    let sid = c.initialize().await;
    let legacy = c.call(&sid, 5, "thought", thought_args(1)).await;
    assert_eq!(legacy["result"]["structuredContent"]["thoughtNumber"], 1, "{legacy}");
    assert!(legacy["result"].get("resultType").is_none(), "the session era has no resultType: {legacy}");

    let _ = server.kill();
}

#[tokio::test]
async fn a_bad_sessionless_request_gets_the_error_of_the_first_check_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);
    let c = Client::new(&url);
    let call = request(1, "tools/call", thought(1, None));

    // 1. required _meta keys
    let no_caps = request(1, "tools/list", json!({"_meta": {(meta::PROTOCOL_VERSION): SESSIONLESS}}));
    let (status, r) = send(&c, &no_caps, None, &[]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32602)), "{r}");
    // 2. the version header against _meta
    let (status, r) = send(&c, &call, Some("thought"), &[("mcp-protocol-version", "2026-07-29")]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32020)), "{r}");
    // 3. a version not served, with the ones that are
    let old = json!({(meta::PROTOCOL_VERSION): "2099-01-01", (meta::CLIENT_CAPABILITIES): {}});
    let future = request(1, "tools/list", json!({"_meta": old}));
    let (status, r) = send(&c, &future, None, &[("mcp-protocol-version", "2099-01-01")]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32022)), "{r}");
    assert_eq!(r["error"]["data"]["supported"], json!([SESSIONLESS]), "{r}");
    assert_eq!(r["error"]["data"]["requested"], "2099-01-01");
    // 4. Mcp-Method and Mcp-Name against the body (Mcp-Name may be base64)
    let (status, r) = send(&c, &call, Some("thought"), &[("mcp-method", "tools/list")]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32020)), "{r}");
    let (status, r) = send(&c, &call, None, &[]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32020)), "a missing Mcp-Name: {r}");
    let (status, r) = send(&c, &call, Some("other"), &[]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32020)), "{r}");
    let (status, r) = send(&c, &call, Some("=?base64?dGhvdWdodA==?="), &[]).await;
    assert_eq!(status, 200, "a base64 Mcp-Name is decoded: {r}");
    // 5. methods the revision removed, and unknown ones
    for method in ["ping", "initialize", "logging/setLevel", "no/such"] {
        let (status, r) = send(&c, &request(1, method, json!({})), None, &[]).await;
        assert_eq!((status, r["error"]["code"].as_i64()), (404, Some(-32601)), "{method}: {r}");
    }
    // No GET stream and no DELETE in this revision.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = c
            .http
            .request(method.clone(), &url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", SESSIONLESS)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method}");
    }
    let _ = server.kill();
}

#[tokio::test]
async fn an_endpoint_that_cannot_describe_itself_names_the_session_revisions_it_speaks() {
    // A gateway whose upstream cannot start has nothing to say to a
    // sessionless client; a client that falls back to `initialize` learns why.
    let dir = tempfile::tempdir().unwrap();
    let flag = format!(
        "py=stdio:python3 {}/../tether-gateway/tests/fixtures/stdio_server.py --exit-at-once",
        env!("CARGO_MANIFEST_DIR")
    );
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &["--upstream", &flag]);
    let c = Client::new(&format!("{url}/py"));
    let (status, r) = send(&c, &request(1, "server/discover", json!({})), None, &[]).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32022)), "{r}");
    assert_eq!(r["error"]["data"]["supported"], json!(tether_wire::revision::SUPPORTED), "{r}");
    let _ = server.kill();
}

fn with_tasks() -> Value {
    json!({
        (meta::PROTOCOL_VERSION): SESSIONLESS,
        (meta::CLIENT_CAPABILITIES): {"extensions": {(meta::TASKS_EXTENSION): {}}},
    })
}

/// `session` (a resumable tool) as a task: `--resume-wait 0s` makes every call one.
async fn start_task(c: &Client) -> String {
    let params = json!({"name": "session", "arguments": {"operation": "export", "format": "json"}, "_meta": with_tasks()});
    let (status, created) = send(c, &request(1, "tools/call", params), Some("session"), &[]).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"].as_str().expect("a task ID").to_owned()
}

async fn task_status(c: &Client, task: &str) -> Value {
    let (status, got) = send(c, &request(2, "tasks/get", json!({"taskId": task, "_meta": with_tasks()})), Some(task), &[]).await;
    assert_eq!(status, 200, "{got}");
    got["result"].clone()
}

async fn until_terminal(c: &Client, task: &str) -> Value {
    for _ in 0..100 {
        let task = task_status(c, task).await;
        if task["status"] != "working" {
            return task;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the task never ended");
}

#[tokio::test]
async fn a_task_over_http_is_followed_to_its_end_also_after_a_kill_9_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (mut server, url) = start_binary(&db, &["--resume-wait", "0s"]);
    let c = Client::new(&url);
    let (_, discovered) = send(&c, &request(1, "server/discover", json!({})), None, &[]).await;
    assert!(discovered["result"]["capabilities"]["extensions"][meta::TASKS_EXTENSION].is_object(), "{discovered}");

    let task = start_task(&c).await;
    let done = until_terminal(&c, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["resultType"], "complete");
    assert!(done["result"]["content"].is_array(), "{done}");
    let (status, removed) = send(&c, &request(3, "tasks/result", json!({"taskId": task})), Some(&task), &[]).await;
    assert_eq!((status, removed["error"]["code"].as_i64()), (404, Some(-32601)), "{removed}");
    let (status, nameless) = send(&c, &request(4, "tasks/get", json!({"taskId": task, "_meta": with_tasks()})), None, &[]).await;
    assert_eq!((status, nameless["error"]["code"].as_i64()), (400, Some(-32020)), "tasks/get needs Mcp-Name: {nameless}");

    // A second task, then kill -9: after the restart the same ID answers
    // and reaches a terminal status.
    let second = start_task(&c).await;
    let _ = server.kill();
    let _ = server.wait();
    let (mut restarted, url) = start_binary(&db, &["--resume-wait", "0s"]);
    let c = Client::new(&url);
    let after = until_terminal(&c, &second).await;
    assert!(["completed", "failed"].contains(&after["status"].as_str().unwrap_or("")), "{after}");
    assert_eq!(until_terminal(&c, &task).await["status"], "completed", "the first one is still there");
    let _ = restarted.kill();
}

#[tokio::test]
async fn a_task_created_on_one_replica_is_answered_at_once_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = redis_url();
    let prefix = fresh_prefix();
    let args = ["--store", store.as_str(), "--store-prefix", prefix.as_str(), "--resume-wait", "0s"];
    let (mut a, url_a) = start_binary(&dir.path().join("a.db"), &args);
    let (mut b, url_b) = start_binary(&dir.path().join("b.db"), &args);
    let task = start_task(&Client::new(&url_a)).await;
    let on_b = task_status(&Client::new(&url_b), &task).await;
    assert_eq!(on_b["taskId"], task.as_str(), "{on_b}");
    assert_eq!(until_terminal(&Client::new(&url_b), &task).await["status"], "completed");
    let _ = a.kill();
    let _ = b.kill();
}

/// A thought of a client that declared roots, with `extra` params (the
/// repeated round's `inputResponses` and `requestState`).
fn rooted_thought(n: u64, extra: Value) -> Value {
    let mut params = json!({
        "name": "thought",
        "arguments": thought_args(n),
        "_meta": {(meta::PROTOCOL_VERSION): SESSIONLESS, (meta::CLIENT_CAPABILITIES): {"roots": {}}},
    });
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    params
}

/// The two rounds of a rooted thought: `input_required` asking `roots/list`,
/// then the answer with `root`; returns the final result.
async fn thought_in_root(c: &Client, n: u64, root: &str) -> Value {
    let (status, first) = send(c, &request(1, "tools/call", rooted_thought(n, json!({}))), Some("thought"), &[]).await;
    assert_eq!(status, 200, "{first}");
    let round = &first["result"];
    assert_eq!(round["resultType"], "input_required", "{first}");
    let (key, asked) = round["inputRequests"].as_object().and_then(|m| m.iter().next()).expect("one input request");
    assert_eq!(asked["method"], "roots/list", "{first}");
    let state = round["requestState"].as_str().expect("a request state");
    let answer =
        json!({"inputResponses": {(key.as_str()): {"roots": [{"uri": root, "name": "project"}]}}, "requestState": state});
    let (status, second) = send(c, &request(2, "tools/call", rooted_thought(n, answer)), Some("thought"), &[]).await;
    assert_eq!(status, 200, "{second}");
    second["result"].clone()
}

#[tokio::test]
async fn a_sessionless_client_is_asked_its_roots_through_mrtr_and_finds_its_notebook_session_again_by_root() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);
    let c = Client::new(&url);
    let first = thought_in_root(&c, 1, "file:///work/project").await;
    assert_eq!(first["resultType"], "complete", "{first}");
    assert_eq!(first["structuredContent"]["thoughtHistoryLength"], 1, "{first}");
    let pinned = first["_meta"][meta::NOTEBOOK_SESSION].clone();
    // Another client of the same principal and root: the same notebook session.
    let again = thought_in_root(&Client::new(&url), 2, "file:///work/project").await;
    assert_eq!(again["_meta"][meta::NOTEBOOK_SESSION], pinned, "{again}");
    assert_eq!(again["structuredContent"]["thoughtHistoryLength"], 2, "{again}");
    let elsewhere = thought_in_root(&c, 1, "file:///work/other").await;
    assert_ne!(elsewhere["_meta"][meta::NOTEBOOK_SESSION], pinned, "another root, another session");

    // A changed or missing requestState is refused, and nothing is recorded.
    let (_, round) = send(&c, &request(1, "tools/call", rooted_thought(3, json!({}))), Some("thought"), &[]).await;
    let state = round["result"]["requestState"].as_str().expect("a state").to_owned();
    let forged = format!("x{state}");
    let answers = json!({"roots/list#0": {"roots": [{"uri": "file:///work/project"}]}});
    for bad in [json!({"inputResponses": answers, "requestState": forged}), json!({"inputResponses": answers})] {
        let (_, refused) = send(&c, &request(2, "tools/call", rooted_thought(3, bad)), Some("thought"), &[]).await;
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
    }
    // A client that did not declare roots is not asked.
    let (_, plain) = send(&c, &request(4, "tools/call", thought(1, None)), Some("thought"), &[]).await;
    assert_eq!(plain["result"]["resultType"], "complete", "{plain}");
    let _ = server.kill();
}

#[tokio::test]
async fn subscriptions_listen_acknowledges_what_it_honours_and_follows_a_task_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &["--resume-wait", "0s"]);
    let c = Client::new(&url);
    let task = start_task(&c).await;

    let listen = |filter: Value, caps: Value| {
        let params =
            json!({"notifications": filter, "_meta": {(meta::PROTOCOL_VERSION): SESSIONLESS, (meta::CLIENT_CAPABILITIES): caps}});
        let body = request(7, "subscriptions/listen", params);
        c.post_raw(
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-protocol-version", SESSIONLESS),
                ("mcp-method", "subscriptions/listen"),
            ],
            body.to_string(),
        )
        .send()
    };
    let tasks_caps = json!({"extensions": {(meta::TASKS_EXTENSION): {}}});
    let resp = listen(json!({"toolsListChanged": true, "taskIds": [task, "not-a-task"]}), tasks_caps).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = SseReader::new(resp);
    let ack = events.next_message().await.expect("the acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["_meta"][meta::SUBSCRIPTION_ID], 7);
    // The notebook's tools never change; only the caller's own, known task is followed.
    assert_eq!(ack["params"]["notifications"], json!({"taskIds": [task]}), "{ack}");
    let mut last = Value::Null;
    for _ in 0..20 {
        let note = events.next_message().await.expect("a task notification");
        assert_eq!(note["method"], "notifications/tasks", "{note}");
        assert_eq!(note["params"]["taskId"], task.as_str());
        assert_eq!(note["params"]["_meta"][meta::SUBSCRIPTION_ID], 7);
        last = note;
        if last["params"]["status"] != "working" {
            break;
        }
    }
    assert_eq!(last["params"]["status"], "completed", "{last}");
    assert!(last["params"]["result"]["content"].is_array(), "a notification carries the whole task: {last}");

    let refused = listen(json!({"taskIds": [task]}), json!({})).await.unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
    let _ = server.kill();
}

/// A `tools/call` of a sessionless client that declared no capability and no
/// extension; the answer's `result` (or the whole answer if it has none).
async fn plain_call(c: &Client, id: u64, tool: &str, arguments: Value, extra_meta: Value) -> Value {
    let mut m = sessionless_meta();
    if let (Some(m), Some(extra)) = (m.as_object_mut(), extra_meta.as_object()) {
        m.extend(extra.clone());
    }
    let params = json!({"name": tool, "arguments": arguments, "_meta": m});
    let (status, answer) = send(c, &request(id, "tools/call", params), Some(tool), &[]).await;
    assert_eq!(status, 200, "{tool}: {answer}");
    if answer.get("result").is_some() { answer["result"].clone() } else { answer }
}

#[tokio::test]
async fn a_sessionless_client_without_extensions_uses_every_notebook_tool_and_gets_a_100_kb_export_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);
    let c = Client::new(&url);
    let root = "file:///home/me/project";

    // tools/list says which tools may answer with a task: only `session`.
    let (_, listed) = send(&c, &request(1, "tools/list", json!({})), None, &[]).await;
    let tools = listed["result"]["tools"].as_array().expect("tools").clone();
    let by_name = |name: &str| tools.iter().find(|t| t["name"] == name).cloned().unwrap_or(Value::Null);
    assert_eq!(by_name("session")["execution"]["taskSupport"], "optional", "{listed}");
    assert!(by_name("thought")["execution"].is_null() && by_name("init")["execution"].is_null(), "{listed}");

    // init without a way to know the project says what to pass.
    let lost = plain_call(&c, 2, "init", json!({"operation": "load_context"}), json!({})).await;
    assert_eq!(lost["isError"], true, "{lost}");
    let message = lost["structuredContent"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("pass `root`") && message.contains("roots capability"), "{message}");
    let roots = plain_call(&c, 3, "init", json!({"operation": "list_roots"}), json!({})).await;
    assert_eq!(roots["structuredContent"]["rootsSupported"], false, "{roots}");
    assert!(roots["structuredContent"]["message"].as_str().unwrap_or_default().contains("pass `root`"), "{roots}");

    // start_new with the root, then thoughts in the session it names.
    let started = plain_call(&c, 4, "init", json!({"operation": "start_new", "title": "plain", "root": root}), json!({})).await;
    assert_eq!(started["structuredContent"]["success"], true, "{started}");
    assert_eq!(started["structuredContent"]["mcpRootUri"], root, "{started}");
    let notebook = started["_meta"][meta::NOTEBOOK_SESSION].as_str().expect("start_new names its session").to_owned();
    let pin = json!({(meta::NOTEBOOK_SESSION): notebook});
    let mut expected = Vec::new();
    for n in 1..=100u64 {
        let text = format!("{n:04} ") + &"é∑x".repeat(165) + "yyyyy";
        let args = json!({"thought": text, "thoughtNumber": n, "totalThoughts": 100, "nextThoughtNeeded": n < 100});
        let r = plain_call(&c, 100 + n, "thought", args, pin.clone()).await;
        assert_eq!(r["structuredContent"]["thoughtHistoryLength"], n, "{r}");
        expected.push(text);
    }

    // load_context by root finds it again; list_sessions and get_state work.
    let found = plain_call(&c, 5, "init", json!({"operation": "load_context", "root": root}), json!({})).await;
    assert_eq!(found["structuredContent"]["sessionId"], notebook.as_str(), "{found}");
    assert_eq!(found["_meta"][meta::NOTEBOOK_SESSION], notebook.as_str(), "{found}");
    assert!(found["structuredContent"]["message"].as_str().unwrap_or_default().starts_with("Auto-recovered"), "{found}");
    let listed = plain_call(&c, 6, "init", json!({"operation": "list_sessions"}), json!({})).await;
    assert!(listed["structuredContent"]["sessions"].to_string().contains(&notebook), "{listed}");
    let state = plain_call(&c, 7, "init", json!({"operation": "get_state"}), pin.clone()).await;
    assert_eq!(state["structuredContent"]["thoughtCount"], 100, "{state}");

    // `session`: list, get, search and a ~100 KB export, each answered inline and whole.
    let list = plain_call(&c, 8, "session", json!({"operation": "list"}), json!({})).await;
    assert_eq!(list["resultType"], "complete", "{list}");
    assert!(list["structuredContent"]["sessions"].to_string().contains(&notebook), "{list}");
    let got = plain_call(&c, 9, "session", json!({"operation": "get", "sessionId": notebook}), json!({})).await;
    assert_eq!(got["structuredContent"]["thoughts"].as_array().map(Vec::len), Some(100), "get: all 100 thoughts");
    let search = plain_call(&c, 10, "session", json!({"operation": "search", "query": "0042 "}), json!({})).await;
    assert!(search["structuredContent"]["hits"].as_array().is_some_and(|h| !h.is_empty()), "{search}");
    // The current session is the one the request names in its `_meta`.
    let export = plain_call(&c, 11, "session", json!({"operation": "export", "format": "markdown"}), pin).await;
    assert_eq!(export["resultType"], "complete", "{}", export.to_string().chars().take(300).collect::<String>());
    assert!(export["_meta"][meta::NEXT_RESUME_TOKEN].is_null(), "no pages for a client that did not ask");
    let content = export["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "one text block");
    let document = content[0]["text"].as_str().expect("the export");
    assert!(document.len() > 100_000, "the whole export: {} bytes", document.len());
    let mut at = 0;
    for t in &expected {
        at += document[at..].find(t.as_str()).expect("every thought, in order") + t.len();
    }

    // A client that declared roots is asked them (an input_required round) and finds the same session.
    let with_roots = json!({(meta::PROTOCOL_VERSION): SESSIONLESS, (meta::CLIENT_CAPABILITIES): {"roots": {}}});
    let load = json!({"name": "init", "arguments": {"operation": "load_context"}, "_meta": with_roots});
    let (_, round) = send(&c, &request(12, "tools/call", load.clone()), Some("init"), &[]).await;
    assert_eq!(round["result"]["resultType"], "input_required", "{round}");
    let (key, asked) = round["result"]["inputRequests"].as_object().and_then(|m| m.iter().next()).expect("one ask");
    assert_eq!(asked["method"], "roots/list");
    let mut answered = load;
    answered["inputResponses"] = json!({(key.as_str()): {"roots": [{"uri": root}]}});
    answered["requestState"] = round["result"]["requestState"].clone();
    let (_, loaded) = send(&c, &request(13, "tools/call", answered), Some("init"), &[]).await;
    assert_eq!(loaded["result"]["structuredContent"]["sessionId"], notebook.as_str(), "{loaded}");
    let _ = server.kill();
}
