//! Virtual servers over real HTTP against the real binary: `[servers.NAME]`
//! in front of stdio fixtures (crates/tether-gateway's, one per member,
//! told apart by `FIXTURE_NAME`) and a Python SDK server over HTTP: merged
//! lists, routing, collisions, server-to-client requests and cancellation
//! reaching the right member, `list_changed` relayed once, a member down and
//! back, and the members' sessions carried across a `kill -9` of tether.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A stdio member `name`: the fixture, named `name`, with `args`.
fn stdio_member(name: &str, args: &[&str]) -> String {
    stdio_member_with(name, args, &[])
}

/// [`stdio_member`] with more of the fixture's environment (`FIXTURE_RECORD`, `FIXTURE_MANY_TOOLS`).
fn stdio_member_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let command: Vec<String> = ["python3".to_owned(), fixture()].into_iter().chain(args.iter().map(|a| a.to_string())).collect();
    let env: String = env.iter().map(|(k, v)| format!(", {k} = {:?}", v)).collect();
    format!("[upstreams.{name}]\ncommand = {command:?}\nenv = {{ FIXTURE_NAME = \"{name}\"{env} }}\n")
}

/// The messages of `method` a fixture with `FIXTURE_RECORD = path` has read.
fn recorded(path: &Path, method: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|m| m["method"] == method).collect()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("tether.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn start(dir: &tempfile::TempDir, config: &str) -> (Tether, Client) {
    let path = write_config(dir.path(), config);
    let (tether, url) = Tether::start(&dir.path().join("t.db"), &["--config", path.to_str().unwrap()]);
    (tether, Client::new(&format!("{url}/team")))
}

fn init_params() -> Value {
    json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "team-client", "version": "1"}})
}

async fn initialized(c: &Client) -> (String, Value) {
    let (sid, result) = c.initialize_params(init_params()).await;
    let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    assert_eq!(r.status(), 202);
    (sid, result)
}

/// The last message of a request's stream (its answer).
async fn ask(c: &Client, sid: &str, id: u64, method: &str, params: Value) -> Value {
    c.request(sid, id, method, params).await.last().expect("an answer").json()
}

/// Every name of a merged list, following `nextCursor` to the end.
async fn all_names(c: &Client, sid: &str, method: &str, key: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for id in 100.. {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let answer = ask(c, sid, id, method, params).await;
        let items = answer["result"][key].as_array().unwrap_or_else(|| panic!("{method}: {answer}"));
        names.extend(items.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match answer["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    names
}

fn text_of(answer: &Value) -> String {
    answer["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_virtual_server_merges_its_members_and_routes_calls_prompts_resources_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let (_py, py_url) = start_py_server("stateful");
    let config = format!(
        "{}{}[upstreams.web]\nurl = \"{py_url}\"\n[servers.team]\nupstreams = [\"a\", \"b\", \"web\"]\npage_size = 5\n",
        stdio_member("a", &[]),
        stdio_member("b", &[])
    );
    let (_tether, c) = start(&dir, &config);
    let (sid, result) = initialized(&c).await;
    assert_eq!(result["serverInfo"]["name"], "team", "{result}");
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true, "{result}");

    // Tools of every member, prefixed, over pages of 5.
    let tools = all_names(&c, &sid, "tools/list", "tools").await;
    for name in ["a__echo", "a__whoami", "b__whoami", "web__echo", "web__add"] {
        assert!(tools.contains(&name.to_owned()), "{name} in {tools:?}");
    }
    let mut unique = tools.clone();
    unique.dedup();
    assert_eq!(unique.len(), tools.len(), "no page repeats an entry");

    // Calls go to the member that owns the tool, under its own name.
    assert_eq!(structured(&c.call(&sid, 1, "a__whoami", json!({})).await)["name"], "a");
    assert_eq!(structured(&c.call(&sid, 2, "b__whoami", json!({})).await)["name"], "b");
    let added = c.call(&sid, 3, "web__add", json!({"a": 2, "b": 3})).await;
    assert!(text_of(&added).contains("\"sum\": 5"), "{added}");
    let unknown = c.call(&sid, 4, "nobody__echo", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"].as_str().unwrap().contains("offers no tool `nobody__echo`"), "{unknown}");

    // Prompts, resources, templates and completions.
    let prompts = all_names(&c, &sid, "prompts/list", "prompts").await;
    assert!(prompts.contains(&"a__greet".to_owned()) && prompts.contains(&"b__greet".to_owned()), "{prompts:?}");
    let got = ask(&c, &sid, 5, "prompts/get", json!({"name": "b__greet", "arguments": {"who": "ann"}})).await;
    assert_eq!(got["result"]["messages"][0]["content"]["text"], "hello ann from b (greet)", "{got}");
    let read = ask(&c, &sid, 6, "resources/read", json!({"uri": "fixture://b/info"})).await;
    assert_eq!(read["result"]["contents"][0]["text"], "fixture://b/info read by b", "{read}");
    let templated = ask(&c, &sid, 7, "resources/read", json!({"uri": "fixture://a/items/7"})).await;
    assert_eq!(templated["result"]["contents"][0]["text"], "fixture://a/items/7 read by a", "{templated}");
    let completed = ask(
        &c,
        &sid,
        8,
        "completion/complete",
        json!({"ref": {"type": "ref/prompt", "name": "a__greet"}, "argument": {"name": "who", "value": "a"}}),
    )
    .await;
    assert_eq!(completed["result"]["completion"]["values"], json!(["alpha", "beta"]), "{completed}");
    assert_eq!(completed["result"]["completion"]["ref"]["name"], "greet", "the member saw its own name: {completed}");
    let level = ask(&c, &sid, 9, "logging/setLevel", json!({"level": "debug"})).await;
    assert_eq!(level["result"], json!({}), "{level}");
}

#[tokio::test]
async fn names_follow_priority_rename_allow_and_describe() {
    let dir = tempfile::tempdir().unwrap();
    let members = format!("{}{}", stdio_member("a", &[]), stdio_member("b", &[]));
    let config = format!("{members}[servers.team]\nupstreams = [\"b\", \"a\"]\nnames = \"priority\"\n");
    let (tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    let tools = all_names(&c, &sid, "tools/list", "tools").await;
    assert!(tools.contains(&"whoami".to_owned()) && !tools.iter().any(|t| t.contains("__")), "{tools:?}");
    assert_eq!(tools.iter().filter(|t| *t == "whoami").count(), 1, "{tools:?}");
    assert_eq!(structured(&c.call(&sid, 1, "whoami", json!({})).await)["name"], "b", "the member listed first wins");
    drop(tether);

    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{members}[servers.team]\nupstreams = [\"a\", \"b\"]\n[servers.team.tools]\nallow = [\"a__*\", \"b__whoami\"]\nrename = {{ \"b__whoami\" = \"who_is_b\" }}\ndescribe = {{ \"who_is_b\" = \"Says which member it is\" }}\n"
    );
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    let answer = ask(&c, &sid, 1, "tools/list", json!({})).await;
    let tools = answer["result"]["tools"].as_array().unwrap();
    let shown: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(shown.contains(&"who_is_b") && shown.contains(&"a__echo"), "{shown:?}");
    assert!(!shown.iter().any(|t| t.starts_with("b__")), "only b's allowed tool, renamed: {shown:?}");
    let renamed = tools.iter().find(|t| t["name"] == "who_is_b").unwrap();
    assert_eq!(renamed["description"], "Says which member it is");
    assert_eq!(structured(&c.call(&sid, 2, "who_is_b", json!({})).await)["name"], "b");
    let hidden = c.call(&sid, 3, "b__echo", json!({})).await;
    assert_eq!(hidden["error"]["code"], -32602, "{hidden}");
}

/// `tether serve` with `config` must refuse to start; returns its stderr.
fn refused_start(dir: &tempfile::TempDir, config: &str) -> String {
    let path = write_config(dir.path(), config);
    let mut child = std::process::Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite:{}", dir.path().join("t.db").display()))
        .args(["--config", path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "tether did not refuse to start within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    stderr
}

#[test]
fn a_collision_under_names_none_refuses_the_start_naming_both_members() {
    let dir = tempfile::tempdir().unwrap();
    let members = format!("{}{}", stdio_member("a", &[]), stdio_member("b", &[]));
    let stderr = refused_start(&dir, &format!("{members}[servers.team]\nupstreams = [\"a\", \"b\"]\nnames = \"none\"\n"));
    assert!(stderr.contains("tool `echo` is offered by both a and b"), "{stderr}");
    // A member that is not an upstream is named too.
    let stderr = refused_start(&dir, &format!("{members}[servers.team]\nupstreams = [\"a\", \"c\"]\n"));
    assert!(stderr.contains("`c` is not an upstream"), "{stderr}");
}

#[tokio::test]
async fn a_members_sampling_request_reaches_the_client_and_a_cancel_reaches_only_the_member_running_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n", stdio_member("a", &[]), stdio_member("b", &[]));
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;

    // b asks the client to sample; the answer goes back to b.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "b__sample", "arguments": {"prompt": "hi"}}});
    let mut stream = SseReader::new(c.post(Some(&sid), &call).send().await.unwrap());
    let asked = stream.next_message().await.expect("the sampling request");
    assert_eq!(asked["method"], "sampling/createMessage", "{asked}");
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "sampled!"}, "model": "m"}});
    assert_eq!(c.post(Some(&sid), &answer).send().await.unwrap().status(), 202);
    let done = stream.next_message().await.expect("the call's answer");
    assert_eq!(structured(&done)["sampled"]["content"]["text"], "sampled!", "{done}");

    // a runs a long call; its cancel reaches a, and b sees none.
    let slow = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "a__slow", "arguments": {"ms": 600_000}, "_meta": {"progressToken": "p"}}});
    let mut stream = SseReader::new(c.post(Some(&sid), &slow).send().await.unwrap());
    let progress = stream.next_message().await.expect("progress");
    assert_eq!(progress["params"]["progressToken"], "p", "the client's own token: {progress}");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
    assert_eq!(c.post(Some(&sid), &cancel).send().await.unwrap().status(), 202);
    let seen_by = async |tool: &str, id: u64| -> Vec<Value> {
        let seen = structured(&c.call(&sid, id, tool, json!({})).await)["seen"].as_array().cloned().unwrap_or_default();
        seen.into_iter().filter(|m| m["method"] == "notifications/cancelled").collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut id = 10;
    let cancelled = loop {
        id += 1;
        let cancelled = seen_by("a__seen", id).await;
        if !cancelled.is_empty() || std::time::Instant::now() > deadline {
            break cancelled;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(cancelled.len(), 1, "a saw the cancel of its call");
    assert!(seen_by("b__seen", 99).await.is_empty(), "b saw no cancel");
}

#[tokio::test]
async fn a_members_list_change_reaches_the_client_once_and_the_next_list_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n", stdio_member("a", &[]), stdio_member("b", &[]));
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    assert!(!all_names(&c, &sid, "tools/list", "tools").await.contains(&"b__fresh".to_owned()));
    let standalone = c.get(&sid, None).send().await.unwrap();
    assert_eq!(standalone.status(), 200);
    let mut standalone = SseReader::new(standalone);
    // A 2026-07-28 client listens on the same endpoint.
    let params = json!({"notifications": {"toolsListChanged": true}, "_meta": {
        (tether_wire::meta::PROTOCOL_VERSION): SESSIONLESS, (tether_wire::meta::CLIENT_CAPABILITIES): {}}});
    let listen = c
        .post_raw(
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-protocol-version", SESSIONLESS),
                ("mcp-method", "subscriptions/listen"),
            ],
            sessionless_request(7, "subscriptions/listen", params).to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(listen.status(), 200);
    let mut listen = SseReader::new(listen);
    let ack = listen.next_message().await.expect("the acknowledgement");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}), "honoured: {ack}");

    let added = c.call(&sid, 1, "b__add_tool", json!({"name": "fresh"})).await;
    assert_eq!(structured(&added)["added"], "fresh", "{added}");
    let told = standalone.next_message().await.expect("list_changed");
    assert_eq!(told["method"], "notifications/tools/list_changed", "{told}");
    let heard = listen.next_message().await.expect("list_changed on the listen stream");
    assert_eq!(heard["method"], "notifications/tools/list_changed", "{heard}");
    assert!(all_names(&c, &sid, "tools/list", "tools").await.contains(&"b__fresh".to_owned()));
    // Nothing else came on either: one notification for one change.
    let more = tokio::time::timeout(Duration::from_millis(1500), standalone.next_message()).await;
    assert!(more.is_err(), "one list_changed only: {more:?}");
    let more = tokio::time::timeout(Duration::from_millis(500), listen.next_message()).await;
    assert!(more.is_err(), "one list_changed only on the listen stream: {more:?}");
}

/// The lists a member going or coming changes, as the client is told.
const LISTS: [&str; 3] =
    ["notifications/prompts/list_changed", "notifications/resources/list_changed", "notifications/tools/list_changed"];

/// The next three notifications of the stream, sorted.
async fn told_lists(stream: &mut SseReader) -> Vec<String> {
    let mut told = Vec::new();
    for _ in 0..3 {
        let message = stream.next_message().await.expect("list_changed");
        told.push(message["method"].as_str().unwrap_or_default().to_owned());
    }
    told.sort();
    told
}

#[tokio::test]
async fn a_member_that_stays_down_is_hidden_and_comes_back_with_list_changed() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("a-is-down");
    let config = format!(
        "{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n",
        stdio_member("a", &["--exit-if-exists", flag.to_str().unwrap()]),
        stdio_member("b", &[])
    );
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    let mut standalone = SseReader::new(c.get(&sid, None).send().await.unwrap());
    assert!(all_names(&c, &sid, "tools/list", "tools").await.contains(&"a__echo".to_owned()));
    // a's child dies and cannot start again.
    std::fs::write(&flag, "down").unwrap();
    let exited = c.call(&sid, 1, "a__exit", json!({"code": 1})).await;
    assert!(exited.get("error").is_some(), "{exited}");
    let tools = all_names(&c, &sid, "tools/list", "tools").await;
    assert!(!tools.iter().any(|t| t.starts_with("a__")), "a's tools are hidden: {tools:?}");
    assert!(tools.contains(&"b__echo".to_owned()));
    assert_eq!(told_lists(&mut standalone).await, LISTS, "each list told once");
    let refused = c.call(&sid, 2, "a__echo", json!({})).await;
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("member `a` of virtual server `team` cannot be reached"),
        "{refused}"
    );
    assert_eq!(structured(&c.call(&sid, 3, "b__whoami", json!({})).await)["name"], "b", "b goes on");
    // a can start again: it comes back, with list_changed.
    std::fs::remove_file(&flag).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if all_names(&c, &sid, "tools/list", "tools").await.contains(&"a__echo".to_owned()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(told_lists(&mut standalone).await, LISTS, "each list told once");
    assert_eq!(structured(&c.call(&sid, 4, "a__whoami", json!({})).await)["name"], "a");
}

#[tokio::test]
async fn after_a_kill_9_the_same_session_calls_every_member_and_a_long_url_call_gets_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let (_py, py_url) = start_py_server("shared-store");
    let config = format!(
        "{}{}[upstreams.web]\nurl = \"{py_url}\"\n[servers.team]\nupstreams = [\"a\", \"b\", \"web\"]\n",
        stdio_member("a", &[]),
        stdio_member("b", &[])
    );
    let path = write_config(dir.path(), &config);
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--config", path.to_str().unwrap()]);
    let c = Client::new(&format!("{url}/team"));
    let (sid, _) = initialized(&c).await;
    assert_eq!(structured(&c.call(&sid, 1, "a__whoami", json!({})).await)["name"], "a");

    // A long call through the URL member, cut off by a kill -9.
    let slow = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "web__slow", "arguments": {"ms": 3000}, "_meta": {"progressToken": "p"}}});
    let resp = c.post(Some(&sid), &slow).send().await.unwrap();
    let mut stream = SseReader::new(resp);
    // The call runs upstream once its second progress arrived (its
    // recovery note was left long before).
    let mut last_id = None;
    let mut progress = 0;
    while progress < 2 {
        let event = stream.next_event().await.expect("events before the crash");
        last_id = event.id.clone().or(last_id);
        if event.json()["method"] == "notifications/progress" {
            progress += 1;
        }
    }
    tether.crash();

    let (_tether, url2) = Tether::start(&db, &["--config", path.to_str().unwrap()]);
    let c = Client::new(&format!("{url2}/team"));
    // The call is carried on to its real result on the replayed stream.
    let resumed = c.get(&sid, last_id.as_deref()).send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    let mut resumed = SseReader::new(resumed);
    let answer = loop {
        let message = resumed.next_message().await.expect("the call's answer after the restart");
        if message["id"] == 2 {
            break message;
        }
    };
    assert!(text_of(&answer).contains("3000"), "the real result: {answer}");
    // Every member answers the same session, without initialize.
    assert_eq!(structured(&c.call(&sid, 3, "a__whoami", json!({})).await)["name"], "a");
    assert_eq!(structured(&c.call(&sid, 4, "b__whoami", json!({})).await)["name"], "b");
    let echoed = c.call(&sid, 5, "web__echo", json!({"text": "after"})).await;
    assert_eq!(text_of(&echoed), "after", "{echoed}");
}

#[tokio::test]
async fn a_member_that_forgot_its_session_is_initialized_again_and_the_call_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let (py, py_url) = start_py_server("stateful");
    let config =
        format!("{}[upstreams.web]\nurl = \"{py_url}\"\n[servers.team]\nupstreams = [\"a\", \"web\"]\n", stdio_member("a", &[]));
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    assert_eq!(text_of(&c.call(&sid, 1, "web__echo", json!({"text": "before"})).await), "before");
    // The upstream restarts and forgets every session (its next answer is a 404).
    let port: u16 = py_url.trim_end_matches("/mcp").rsplit(':').next().unwrap().parse().unwrap();
    drop(py);
    let (_py, _) = start_py_server_on("stateful", port);
    let echoed = c.call(&sid, 2, "web__echo", json!({"text": "after"})).await;
    assert_eq!(text_of(&echoed), "after", "the call succeeds on a new upstream session: {echoed}");
    let stats: Value = reqwest::get(format!("http://127.0.0.1:{port}/stats")).await.unwrap().json().await.unwrap();
    assert_eq!(stats["initialize"], 1, "initialized again once: {stats}");
    assert_eq!(structured(&c.call(&sid, 3, "a__whoami", json!({})).await)["name"], "a", "the other member went on");
}

#[tokio::test]
async fn a_reload_adds_and_removes_members_and_sessions_keep_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let members = format!("{}{}{}", stdio_member("a", &[]), stdio_member("b", &[]), stdio_member("c", &[]));
    let path = write_config(dir.path(), &format!("{members}[servers.team]\nupstreams = [\"a\", \"b\"]\n"));
    let (tether, url) = Tether::start(&dir.path().join("t.db"), &["--config", path.to_str().unwrap()]);
    let c = Client::new(&format!("{url}/team"));
    let (sid, _) = initialized(&c).await;
    let pid_of_a = structured(&c.call(&sid, 1, "a__pid", json!({})).await)["pid"].clone();
    assert_eq!(structured(&c.call(&sid, 2, "b__whoami", json!({})).await)["name"], "b");

    write_config(dir.path(), &format!("{members}[servers.team]\nupstreams = [\"a\", \"c\"]\n"));
    let status = std::process::Command::new("kill").args(["-HUP", &tether.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    // The reload is seen once the session's lists name c.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tools = all_names(&c, &sid, "tools/list", "tools").await;
        if tools.contains(&"c__whoami".to_owned()) {
            assert!(!tools.iter().any(|t| t.starts_with("b__")), "b left: {tools:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the reload did not come: {tools:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The added member answers the same session, initialized as the client
    // initialized it; the member that stayed kept its child.
    let who = c.call(&sid, 100, "c__env", json!({})).await;
    assert!(structured(&who)["env"]["FIXTURE_NAME"] == "c", "{who}");
    assert_eq!(structured(&c.call(&sid, 101, "a__pid", json!({})).await)["pid"], pid_of_a, "a kept its child");
    let gone = c.call(&sid, 102, "b__whoami", json!({})).await;
    assert_eq!(gone["error"]["code"], -32602, "{gone}");
}

#[tokio::test]
async fn with_on_member_down_fail_a_member_down_makes_the_whole_endpoint_answer_503_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("a-is-down");
    let config = format!(
        "{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\non_member_down = \"fail\"\n",
        stdio_member("a", &["--exit-if-exists", flag.to_str().unwrap()]),
        stdio_member("b", &[])
    );
    let (_tether, c) = start(&dir, &config);
    let (sid, _) = initialized(&c).await;
    // a's child dies and cannot start again: the next look at the members sees it.
    std::fs::write(&flag, "down").unwrap();
    let exited = c.call(&sid, 1, "a__exit", json!({"code": 1})).await;
    assert!(exited.get("error").is_some(), "{exited}");
    let looked = ask(&c, &sid, 2, "tools/list", json!({})).await;
    assert_eq!(looked["error"]["data"]["unavailable"], "a", "{looked}");
    // Now every request of the endpoint is 503 naming the member, a session's and an initialize.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "b__whoami", "arguments": {}}});
    let refused = c.post(Some(&sid), &call).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["id"], 3);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("member `a` of virtual server `team` cannot be reached"),
        "{body}"
    );
    let init =
        c.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init_params()})).send().await.unwrap();
    assert_eq!(init.status(), 503);
    let body: Value = init.json().await.unwrap();
    assert_eq!(body["error"]["data"]["unavailable"], "a", "{body}");
    // Once a can start, the endpoint serves again (its looks go on every 2 s).
    std::fs::remove_file(&flag).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = c
            .post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init_params()}))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(structured(&c.call(&sid, 4, "b__whoami", json!({})).await)["name"], "b", "the old session serves again");
}

#[tokio::test]
async fn three_replicas_on_redis_initialize_on_one_call_a_member_on_another_replay_on_a_third() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!("{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n", stdio_member("a", &[]), stdio_member("b", &[])),
    );
    let prefix = fresh_prefix();
    let replica = |n: &str| {
        let (child, url) = start_binary_on(
            &redis_url(),
            &dir.path().join(format!("{n}.log")),
            &["--store-prefix", &prefix, "--config", path.to_str().unwrap()],
        );
        (Tether(child), Client::new(&format!("{url}/team")))
    };
    let ((_a, ca), (_b, cb), (_c, cc)) = (replica("a"), replica("b"), replica("c"));
    let (sid, _) = initialized(&ca).await;
    // B carries the session on: its member b is started there as the client initialized it.
    let events = cb.request(&sid, 1, "tools/call", json!({"name": "b__whoami", "arguments": {}})).await;
    let answer = events.last().unwrap().json();
    assert_eq!(structured(&answer)["name"], "b", "{answer}");
    // C replays B's stream.
    let mut replay = SseReader::new(cc.get(&sid, events[0].id.as_deref()).send().await.unwrap());
    let replayed: Vec<_> = replay.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(replayed, events[1..].to_vec(), "a stream written on B replays on C");
    // And C calls the other member of the same session.
    assert_eq!(structured(&cc.call(&sid, 2, "a__whoami", json!({})).await)["name"], "a");
}

/// A sessionless (2026-07-28) `tools/call` whose client declares `capabilities`.
fn sessionless_call(id: u64, tool: &str, arguments: Value, capabilities: Value) -> Value {
    let mut meta = sessionless_meta();
    meta[tether_wire::meta::CLIENT_CAPABILITIES] = capabilities;
    sessionless_request(id, "tools/call", json!({"name": tool, "arguments": arguments, "_meta": meta}))
}

#[tokio::test]
async fn a_sessionless_client_discovers_lists_and_calls_the_members_with_their_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n", stdio_member("a", &[]), stdio_member("b", &[]));
    let (_tether, c) = start(&dir, &config);

    let (status, discovered) = send_sessionless(&c, &sessionless_request(1, "server/discover", json!({})), None, &[]).await;
    assert_eq!(status, 200, "{discovered}");
    let result = &discovered["result"];
    assert_eq!(result["_meta"][tether_wire::meta::SERVER_INFO]["name"], "team", "one description: {result}");
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true, "{result}");
    assert_eq!(result["supportedVersions"], json!([SESSIONLESS]));

    let (_, listed) = send_sessionless(&c, &sessionless_request(2, "tools/list", json!({})), None, &[]).await;
    let names: Vec<&str> = listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"a__whoami") && names.contains(&"b__whoami"), "{names:?}");

    let (_, who) = send_sessionless(&c, &sessionless_call(3, "b__whoami", json!({}), json!({})), Some("b__whoami"), &[]).await;
    assert_eq!(who["result"]["structuredContent"]["name"], "b", "{who}");

    // b asks the client to sample: a round ends input_required, the repeated
    // request carries the answer back to b.
    let sampling = json!({"sampling": {}});
    let ask = sessionless_call(4, "b__sample", json!({"prompt": "hi"}), sampling.clone());
    let (_, round) = send_sessionless(&c, &ask, Some("b__sample"), &[]).await;
    let round = &round["result"];
    assert_eq!(round["resultType"], "input_required", "{round}");
    let key = "sampling/createMessage#0";
    assert_eq!(round["inputRequests"][key]["method"], "sampling/createMessage", "{round}");
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "sampled!"}, "model": "m"});
    let mut again = sessionless_call(5, "b__sample", json!({"prompt": "hi"}), sampling);
    again["params"]["inputResponses"] = json!({(key): answer});
    again["params"]["requestState"] = round["requestState"].clone();
    let (_, done) = send_sessionless(&c, &again, Some("b__sample"), &[]).await;
    assert_eq!(done["result"]["structuredContent"]["sampled"]["content"]["text"], "sampled!", "{done}");
}

#[tokio::test]
async fn the_admin_api_shows_a_sessions_member_sessions_with_their_state() {
    let dir = tempfile::tempdir().unwrap();
    let (_py, py_url) = start_py_server("stateful");
    let path = write_config(
        dir.path(),
        &format!("{}[upstreams.web]\nurl = \"{py_url}\"\n[servers.team]\nupstreams = [\"a\", \"web\"]\n", stdio_member("a", &[])),
    );
    let db = dir.path().join("t.db");
    let token = "admin-token-of-this-test-0123456789";
    let (child, url) = start_binary_with_env(
        &format!("sqlite:{}", db.display()),
        &db.with_extension("log"),
        &["--config", path.to_str().unwrap(), "--admin-token-env", "TETHER_TEST_ADMIN"],
        &[("TETHER_TEST_ADMIN", token)],
    );
    let _tether = Tether(child);
    let c = Client::new(&format!("{url}/team"));
    let (sid, _) = initialized(&c).await;
    assert_eq!(structured(&c.call(&sid, 1, "a__whoami", json!({})).await)["name"], "a");
    let base = url.trim_end_matches("/mcp");
    let shown: Value = reqwest::Client::new()
        .get(format!("{base}/admin/sessions/{sid}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let members = shown["upstreams"].as_array().unwrap_or_else(|| panic!("{shown}"));
    let member = |name: &str| members.iter().find(|m| m["member"] == name).cloned().unwrap_or_else(|| panic!("{name}: {shown}"));
    assert_eq!(member("a")["state"], "connected", "{shown}");
    assert_eq!(member("a")["down"], false);
    let web = member("web");
    assert_eq!(web["upstream"], "web");
    assert!(web["upstream_session"].as_str().is_some_and(|s| !s.is_empty()), "the URL member's upstream session: {web}");
}

#[tokio::test]
async fn a_members_task_tool_runs_as_a_durable_task_for_a_sessionless_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "resume_wait = \"0s\"\n{}{}task_tools = [\"slow\"]\n[servers.team]\nupstreams = [\"a\", \"b\"]\n",
        stdio_member("a", &[]),
        stdio_member("b", &[])
    );
    let (_tether, c) = start(&dir, &config);
    let tasks = json!({"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}});
    let (_, discovered) = send_sessionless(&c, &sessionless_request(1, "server/discover", json!({})), None, &[]).await;
    assert!(discovered["result"]["capabilities"]["extensions"][tether_wire::meta::TASKS_EXTENSION].is_object(), "{discovered}");
    let (_, created) =
        send_sessionless(&c, &sessionless_call(2, "b__slow", json!({"ms": 200}), tasks.clone()), Some("b__slow"), &[]).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().expect("a task id").to_owned();
    let mut meta = sessionless_meta();
    meta[tether_wire::meta::CLIENT_CAPABILITIES] = tasks;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let get = sessionless_request(3, "tasks/get", json!({"taskId": id, "_meta": meta}));
        let (_, got) = send_sessionless(&c, &get, Some(&id), &[]).await;
        if got["result"]["status"] != "working" {
            break got;
        }
        assert!(std::time::Instant::now() < deadline, "the task did not end: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["result"]["structuredContent"]["slept"], 200, "b's result is the task's: {done}");
}

/// The JSON lines of `path` once one satisfies `wanted` (the audit writer
/// is a thread of its own), within a generous deadline.
fn wait_for_line(path: &Path, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        if lines.iter().any(&wanted) {
            return lines;
        }
        assert!(std::time::Instant::now() < deadline, "no such line in {}: {text}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A rule written for `/mcp/a` holds for `a`'s tools wherever they are
/// served: a virtual server over `a` hides them from a principal the rule
/// refuses and refuses their calls, in sessions and sessionless, and the
/// audit log names the member and the rule.
#[tokio::test]
async fn a_members_policy_holds_through_the_virtual_server_in_both_eras_and_the_audit_names_the_member() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice-token-0123456789 alice\nbob-token-0123456789ab bob\n").unwrap();
    let audit = dir.path().join("audit.jsonl");
    let rule = r#"principal == "alice""#;
    let config = format!(
        "{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n[[policies]]\nendpoint = \"a\"\ntools = [\"whoami\"]\nallow = '{rule}'\n",
        stdio_member("a", &[]),
        stdio_member("b", &[])
    );
    let path = write_config(dir.path(), &config);
    let args =
        ["--config", path.to_str().unwrap(), "--auth-tokens", tokens.to_str().unwrap(), "--audit-log", audit.to_str().unwrap()];
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &args);
    let bob = Client::with_token(&format!("{url}/team"), "bob-token-0123456789ab");
    let alice = Client::with_token(&format!("{url}/team"), "alice-token-0123456789");

    // Sessions: hidden from bob, refused to bob; alice has it.
    let (sid, _) = initialized(&bob).await;
    let tools = all_names(&bob, &sid, "tools/list", "tools").await;
    assert!(!tools.contains(&"a__whoami".to_owned()), "hidden: {tools:?}");
    assert!(tools.contains(&"b__whoami".to_owned()) && tools.contains(&"a__echo".to_owned()), "{tools:?}");
    let refused = bob.call(&sid, 1, "a__whoami", json!({})).await;
    let message = refused["error"]["message"].as_str().unwrap_or_else(|| panic!("refused: {refused}"));
    assert!(message.contains("`whoami` of `/mcp/a`"), "{message}");
    assert_eq!(structured(&bob.call(&sid, 2, "b__whoami", json!({})).await)["name"], "b");
    let (asid, _) = initialized(&alice).await;
    assert!(all_names(&alice, &asid, "tools/list", "tools").await.contains(&"a__whoami".to_owned()));
    assert_eq!(structured(&alice.call(&asid, 1, "a__whoami", json!({})).await)["name"], "a");

    // Sessionless: the same.
    let (_, listed) = send_sessionless(&bob, &sessionless_request(3, "tools/list", json!({})), None, &[]).await;
    let names: Vec<&str> = listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"a__whoami") && names.contains(&"b__whoami"), "{names:?}");
    let (_, refused) =
        send_sessionless(&bob, &sessionless_call(4, "a__whoami", json!({}), json!({})), Some("a__whoami"), &[]).await;
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("`whoami` of `/mcp/a`")), "{refused}");

    // The audit names the member, its own name for the tool and the rule.
    let lines = wait_for_line(&audit, |l| l["decision"] == "deny" && l["principal"] == "bob");
    let denied = lines.iter().find(|l| l["decision"] == "deny" && l["principal"] == "bob").unwrap();
    assert_eq!(
        (&denied["endpoint"], &denied["name"], &denied["member"], &denied["member_name"], &denied["rule"]),
        (&json!("/mcp/team"), &json!("a__whoami"), &json!("a"), &json!("whoami"), &json!(rule)),
        "{denied}"
    );
    let lines = wait_for_line(&audit, |l| l["decision"] == "hidden" && l["principal"] == "bob");
    assert!(lines.iter().any(|l| l["decision"] == "hidden" && l["name"] == "a__whoami" && l["member"] == "a"), "{lines:?}");
    assert!(!lines.iter().any(|l| l["principal"] == "bob" && l["name"] == "a__whoami" && l["decision"] == "allow"), "{lines:?}");
}

/// A call whose tool name is not a string is refused before any policy or
/// upstream sees it (a policy could not decide on it).
#[tokio::test]
async fn a_call_whose_name_is_not_a_string_is_refused_with_invalid_params_and_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("a-record.jsonl");
    let config = format!(
        "{}[servers.team]\nupstreams = [\"a\"]\n[[policies]]\nendpoint = \"a\"\ntools = [\"whoami\"]\nallow = 'false'\n",
        stdio_member_with("a", &[], &[("FIXTURE_RECORD", record.to_str().unwrap())])
    );
    let path = write_config(dir.path(), &config);
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &["--config", path.to_str().unwrap()]);
    for endpoint in ["a", "team"] {
        let c = Client::new(&format!("{url}/{endpoint}"));
        let (sid, _) = initialized(&c).await;
        // A request ID of its own each (one used before may still be
        // settling in the session when the next request comes).
        for (id, name) in [json!(["whoami"]), json!({"name": "whoami"}), Value::Null].into_iter().enumerate() {
            let answer = ask(&c, &sid, 10 + id as u64, "tools/call", json!({"name": name, "arguments": {}})).await;
            assert_eq!(answer["error"]["code"], -32602, "{endpoint}: {answer}");
        }
        // The child answers what it gets: this one it does.
        assert_eq!(structured(&c.call(&sid, 2, if endpoint == "a" { "echo" } else { "a__echo" }, json!({"x": 1})).await)["x"], 1);
    }
    let calls = recorded(&record, "tools/call");
    assert_eq!(calls.len(), 2, "only the echo calls reached the child: {calls:?}");
}

/// Every session shares one read of each member's lists (not one per
/// session), a member's lists are kept up to `max_list_bytes` (the rest is
/// cut, logged and counted), and the lists are read again after the member
/// says they changed.
#[tokio::test]
async fn members_lists_are_read_once_for_every_session_and_cut_at_max_list_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("a-record.jsonl");
    let a = stdio_member_with("a", &[], &[("FIXTURE_MANY_TOOLS", "3000"), ("FIXTURE_RECORD", record.to_str().unwrap())]);
    let config = format!("{a}{}[servers.team]\nupstreams = [\"a\", \"b\"]\nmax_list_bytes = 262144\n", stdio_member("b", &[]));
    let (_tether, c) = start(&dir, &config);
    let tools_lists = || recorded(&record, "tools/list").len();
    let (first, _) = initialized(&c).await;
    let tools = all_names(&c, &first, "tools/list", "tools").await;
    let many = tools.iter().filter(|t| t.starts_with("a__many_")).count();
    assert!(many > 100 && many < 3000, "cut at max_list_bytes, kept in order: {many}");
    assert!(tools.contains(&"b__whoami".to_owned()), "the other member whole");
    let after_one = tools_lists();
    for _ in 0..4 {
        let (sid, _) = initialized(&c).await;
        assert_eq!(all_names(&c, &sid, "tools/list", "tools").await, tools, "the same lists");
    }
    assert_eq!(tools_lists(), after_one, "four more sessions read no list of a");

    let log = log_of(&dir.path().join("t.db"));
    assert!(log.contains("longer than max_list_bytes"), "{log}");
    let base = c.url.trim_end_matches("/mcp/team").to_owned();
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"tether_virtual_member_lists_cut_total{server="team",member="a"} "#), "{metrics}");

    // a says its list changed (in one session): read again, for everyone.
    let added = c.call(&first, 7, "a__add_tool", json!({"name": "fresh"})).await;
    assert!(added.get("result").is_some(), "{added}");
    let (sid, _) = initialized(&c).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let names = all_names(&c, &sid, "tools/list", "tools").await;
        if tools_lists() > after_one {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a's lists were not read again: {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A member that starts offering a name another member holds does not take
/// it (whatever the priority), and the admin API shows the contest.
#[tokio::test]
async fn a_member_never_takes_a_name_another_holds_and_the_admin_api_shows_the_contest() {
    let dir = tempfile::tempdir().unwrap();
    // b alone offers `many_00000` at first; a, listed first, adds it later.
    let b = stdio_member_with("b", &[], &[("FIXTURE_MANY_TOOLS", "1")]);
    let config = format!("{}{b}[servers.team]\nupstreams = [\"a\", \"b\"]\nnames = \"priority\"\n", stdio_member("a", &[]));
    let path = write_config(dir.path(), &config);
    let (child, url) = start_binary_with_env(
        &format!("sqlite:{}", dir.path().join("t.db").display()),
        &dir.path().join("t.log"),
        &["--config", path.to_str().unwrap(), "--admin-token-env", "TETHER_TEST_ADMIN"],
        &[("TETHER_TEST_ADMIN", "admin-token-0123456789")],
    );
    let _tether = Tether(child);
    let c = Client::new(&format!("{url}/team"));
    let owner = |answer: &Value| -> Vec<String> {
        let tools = answer["result"]["tools"].as_array().cloned().unwrap_or_default();
        tools
            .iter()
            .filter(|t| t["name"] == "many_00000")
            .map(|t| t["_meta"][tether_wire::meta::MEMBER].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let (sid, _) = initialized(&c).await;
    assert_eq!(owner(&ask(&c, &sid, 1, "tools/list", json!({})).await), ["b"]);
    // `add_tool` is a's (listed first): a starts offering `many_00000` too.
    let added = c.call(&sid, 2, "add_tool", json!({"name": "many_00000"})).await;
    assert!(added.get("result").is_some(), "{added}");
    let admin = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let contested = loop {
        // Listing makes the server read a's changed list.
        assert_eq!(owner(&ask(&c, &sid, 3, "tools/list", json!({})).await), ["b"], "b keeps the name it holds");
        let endpoints: Value = admin
            .get(format!("{}/admin/endpoints", url.trim_end_matches("/mcp")))
            .bearer_auth("admin-token-0123456789")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let team = endpoints["endpoints"].as_array().unwrap().iter().find(|e| e["endpoint"] == "team").cloned().unwrap();
        let contested = team["app"]["contested"].as_array().cloned().unwrap_or_default();
        if !contested.is_empty() {
            break contested;
        }
        assert!(std::time::Instant::now() < deadline, "no contest shown: {endpoints}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(contested, [json!({"kind": "tool", "name": "many_00000", "kept_by": "b", "also_offered_by": "a"})]);
    // A call goes to b.
    let called = c.call(&sid, 4, "many_00000", json!({"from": "client"})).await;
    assert_eq!(called["result"]["structuredContent"], json!({"from": "client"}), "{called}");
    let log = std::fs::read_to_string(dir.path().join("t.log")).unwrap_or_default();
    assert_eq!(log.matches("tool `many_00000` is offered by both").count(), 1, "logged once: {log}");
}
