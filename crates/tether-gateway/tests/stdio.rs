//! The stdio transport against a real child process: a small MCP server in
//! Python (`fixtures/stdio_server.py`) that records what it saw, has tools
//! that talk back (progress, sampling) and switches to misbehave. Time
//! limits here only stop a hung test; they assert nothing about speed.

use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_gateway::config::CommandSpec;
use tether_gateway::processes::{ProcessPermit, Processes};
use tether_gateway::stdio;
use tether_gateway::upstream::{PeerMessage, PeerSink, Started, Upstream, UpstreamError};
use tether_wire::code;
use tokio::sync::mpsc;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stdio_server.py");
const INIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

fn spec(mode: Option<&str>) -> CommandSpec {
    let mut command = vec!["python3".to_owned(), "-u".to_owned(), FIXTURE.to_owned()];
    command.extend(mode.map(str::to_owned));
    CommandSpec::new(command)
}

/// A place under a roomy process cap of its own.
fn permit() -> ProcessPermit {
    Processes::new("fix", 64, 64, Duration::from_secs(5)).try_take("tester").expect("room")
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "the-original-client", "version": "1.2.3"}
    })
}

/// A started child, with what it sent on its own (its sink is a channel).
struct Child {
    upstream: Arc<dyn Upstream>,
    inbound: mpsc::Receiver<PeerMessage>,
    initialize_result: Box<serde_json::value::RawValue>,
}

/// A sink that keeps what it gets for the test to read.
fn channel() -> (Arc<dyn PeerSink>, mpsc::Receiver<PeerMessage>) {
    let (tx, rx) = mpsc::channel(256);
    (Arc::new(tx), rx)
}

/// A launch of `spec` as the test's session `s-1` of upstream `fix`.
fn launch(spec: &CommandSpec, init_timeout: Duration, permit: ProcessPermit, sink: Arc<dyn PeerSink>) -> stdio::Launch<'_> {
    stdio::Launch { spec, upstream: "fix", session: "s-1", initialize_params: initialize_params(), init_timeout, permit, sink }
}

async fn start(spec: &CommandSpec) -> Child {
    let (sink, inbound) = channel();
    let Started { upstream, initialize_result, .. } =
        within("start", stdio::start(launch(spec, INIT_TIMEOUT, permit(), sink))).await.expect("the fixture starts");
    Child { upstream, inbound, initialize_result }
}

async fn call(upstream: &Arc<dyn Upstream>, tool: &str, arguments: Value) -> Result<Value, tether_wire::RpcError> {
    let params = json!({"name": tool, "arguments": arguments});
    let raw = within(tool, upstream.request("tools/call", Some(params))).await?;
    Ok(serde_json::from_str(raw.get()).expect("a JSON result"))
}

/// What the child has read so far (its `debug/seen`).
async fn seen(upstream: &Arc<dyn Upstream>) -> Vec<Value> {
    let raw = within("debug/seen", upstream.request("debug/seen", None)).await.expect("debug/seen");
    let seen: Value = serde_json::from_str(raw.get()).expect("JSON");
    seen["seen"].as_array().cloned().unwrap_or_default()
}

async fn pid(upstream: &Arc<dyn Upstream>) -> u32 {
    let result = call(upstream, "pid", json!({})).await.expect("pid");
    result["structuredContent"]["pid"].as_u64().expect("a pid") as u32
}

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Log lines written while the guard lives (the test's runtime is
/// current-thread, so the tasks it spawns log on this thread too).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

#[tokio::test]
async fn initialize_and_a_call_go_through_and_the_child_gets_only_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(None);
    spec.env.insert("FIXTURE_FLAVOUR".into(), "salty".into());
    spec.cwd = Some(dir.path().to_path_buf());
    let Child { upstream, initialize_result, .. } = start(&spec).await;

    // The raw result is the child's, and the child saw the client's params as given.
    let result: Value = serde_json::from_str(initialize_result.get()).unwrap();
    assert_eq!(result["serverInfo"]["name"], "fixture");
    let instructions: Value = serde_json::from_str(result["instructions"].as_str().unwrap()).unwrap();
    assert_eq!(instructions["clientInfo"], json!({"name": "the-original-client", "version": "1.2.3"}));
    assert_eq!(instructions["capabilities"], json!({"sampling": {}}));

    let echoed = call(&upstream, "echo", json!({"text": "hello", "n": [1, 2]})).await.unwrap();
    assert_eq!(echoed["structuredContent"], json!({"text": "hello", "n": [1, 2]}));

    let env = call(&upstream, "env", json!({})).await.unwrap();
    let vars = env["structuredContent"]["env"].as_object().unwrap();
    assert_eq!(vars.get("FIXTURE_FLAVOUR"), Some(&json!("salty")));
    assert!(vars.contains_key("PATH"), "PATH is passed: {vars:?}");
    assert!(!vars.keys().any(|k| k.starts_with("CARGO")), "nothing else of tether's environment: {vars:?}");
    let cwd = std::path::PathBuf::from(env["structuredContent"]["cwd"].as_str().unwrap());
    assert_eq!(cwd.canonicalize().unwrap(), dir.path().canonicalize().unwrap());

    // An error answer comes back as the child's JSON-RPC error.
    let refused = call(&upstream, "no-such-tool", json!({})).await.unwrap_err();
    assert_eq!(refused.code, code::INVALID_PARAMS);

    // `start` sent no `notifications/initialized`: that is the gateway's to forward.
    let methods: Vec<Value> = seen(&upstream).await.iter().map(|m| m["method"].clone()).collect();
    assert_eq!(methods[0], "initialize");
    assert!(!methods.contains(&json!("notifications/initialized")), "{methods:?}");
    upstream.notify("notifications/initialized", None).await.unwrap();
    let methods: Vec<Value> = seen(&upstream).await.iter().map(|m| m["method"].clone()).collect();
    assert!(methods.contains(&json!("notifications/initialized")), "{methods:?}");
    upstream.close(true).await;
}

#[tokio::test]
async fn progress_notifications_arrive_on_inbound_and_the_call_still_answers() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let params = json!({"name": "slow", "arguments": {"ms": 200}, "_meta": {"progressToken": "p-1"}});
    let up = upstream.clone();
    let call = tokio::spawn(async move { up.request("tools/call", Some(params)).await });
    let progress = within("progress", inbound.recv()).await.expect("a notification");
    let PeerMessage::Notification { method, params } = progress else { panic!("a notification: {progress:?}") };
    assert_eq!(method, "notifications/progress");
    assert_eq!(params.unwrap()["progressToken"], "p-1");
    let result = within("slow call", call).await.unwrap().expect("the slow call answers");
    let result: Value = serde_json::from_str(result.get()).unwrap();
    assert_eq!(result["structuredContent"]["slept"], 200);
}

#[tokio::test]
async fn a_request_of_the_child_arrives_on_inbound_and_the_answer_gets_back_to_it() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let up = upstream.clone();
    let sampled = tokio::spawn(async move { call(&up, "sample", json!({"prompt": "say hi"})).await });
    let asked = within("sampling request", inbound.recv()).await.expect("a request");
    let PeerMessage::Request { id, method, params } = asked else { panic!("a request: {asked:?}") };
    assert_eq!(method, "sampling/createMessage");
    assert_eq!(params.unwrap()["messages"][0]["content"]["text"], "say hi");
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "test"});
    upstream.answer(id, Ok(answer.clone())).await.unwrap();
    let result = within("sample call", sampled).await.unwrap().expect("the call answers");
    assert_eq!(result["structuredContent"]["sampled"], answer);

    // A refusal goes back as an error object.
    let up = upstream.clone();
    let refused_call = tokio::spawn(async move { call(&up, "sample", json!({})).await });
    let Some(PeerMessage::Request { id, .. }) = within("second sampling request", inbound.recv()).await else {
        panic!("a request")
    };
    upstream.answer(id, Err(tether_wire::RpcError::invalid_request("the user declined"))).await.unwrap();
    let refused = within("refused sample call", refused_call).await.unwrap().unwrap_err();
    assert!(refused.message.contains("the user declined"), "{refused:?}");
}

#[tokio::test]
async fn a_request_dropped_before_its_answer_is_cancelled_at_the_child() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let params = json!({"name": "slow", "arguments": {"ms": 30_000}, "_meta": {"progressToken": "p-drop"}});
    {
        let call = upstream.request("tools/call", Some(params));
        tokio::pin!(call);
        // The child has the request once it reports progress on it.
        tokio::select! {
            answered = &mut call => panic!("the slow call answered early: {answered:?}"),
            progress = within("progress", inbound.recv()) => assert!(progress.is_some()),
        }
    }
    // Dropped. The cancellation was queued before this request, so the
    // child read it first.
    let seen = seen(&upstream).await;
    let slow_id = seen.iter().find(|m| m["method"] == "tools/call").expect("the slow call")["id"].clone();
    let cancelled = seen.iter().find(|m| m["method"] == "notifications/cancelled").expect("notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], slow_id);
    assert!(cancelled["params"]["reason"].is_string());
    assert!(upstream.is_alive());
}

#[tokio::test]
async fn kill_9_of_the_child_mid_call_ends_the_call_with_upstream_restarted() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let pid = pid(&upstream).await;
    let up = upstream.clone();
    let params = json!({"name": "slow", "arguments": {"ms": 30_000}, "_meta": {"progressToken": 1}});
    let call = tokio::spawn(async move { up.request("tools/call", Some(params)).await });
    assert!(within("progress", inbound.recv()).await.is_some());

    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let error = within("the call in flight", call).await.unwrap().unwrap_err();
    assert_eq!(error, UpstreamError::Restarted);
    let error = tether_wire::RpcError::from(error);
    assert_eq!(error.code, code::INTERNAL_ERROR);
    assert!(error.message.starts_with("upstream restarted; the request may or may not have taken effect"), "{error:?}");
    assert!(!upstream.is_alive());
    assert!(within("inbound closes", inbound.recv()).await.is_none());

    // Later requests fail at once, saying so.
    let after = within("a request after the death", upstream.request("ping", None)).await.unwrap_err();
    assert!(matches!(&after, UpstreamError::NotRunning(m) if m.contains("is not running")), "{after:?}");
    assert!(upstream.notify("notifications/progress", None).await.is_err());
}

#[tokio::test]
async fn lines_that_are_not_json_too_long_or_answers_nobody_waits_for_are_skipped_with_a_warning() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let mut spec = spec(None);
    spec.max_message_bytes = 1024 * 1024;
    let Child { upstream, .. } = start(&spec).await;
    // None of these lines is an answer: the call they come before still answers.
    for (tool, arguments) in
        [("non_json", json!({})), ("huge_line", json!({"bytes": 3 * 1024 * 1024})), ("unknown_id", json!({}))]
    {
        let result = call(&upstream, tool, arguments).await.unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert_eq!(result["structuredContent"]["after"], tool);
        assert!(upstream.is_alive(), "{tool}");
    }
    let logs = logs.text();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 3, "{logs}");
    assert!(warnings.iter().all(|l| l.contains("upstream=fix") && l.contains("session=s-1")), "{warnings:?}");
    assert!(warnings[0].contains("not a JSON-RPC message") && warnings[0].contains("this line is not JSON"), "{warnings:?}");
    assert!(
        warnings[1].contains("a message of 3145728 bytes") && warnings[1].contains("max_message_bytes (1048576)"),
        "{warnings:?}"
    );
    assert!(warnings[2].contains("987654321"), "{warnings:?}");
    // stderr goes to the log, tagged.
    assert!(logs.lines().any(|l| l.contains("INFO") && l.contains("fixture pid") && l.contains("upstream=fix")), "{logs}");
}

#[tokio::test]
async fn a_large_result_under_the_limit_arrives_whole() {
    // The default limit takes a 5 MB tool result.
    let Child { upstream, .. } = start(&spec(None)).await;
    let result = call(&upstream, "big_result", json!({"bytes": 5_000_000})).await.expect("a 5 MB result");
    assert_eq!(result["content"][0]["text"].as_str().map(str::len), Some(5_000_000));
    upstream.close(true).await;
}

#[tokio::test]
async fn an_answer_over_the_limit_or_unreadable_ends_its_call_with_a_clear_error() {
    let mut spec = spec(None);
    spec.max_message_bytes = 1024 * 1024;
    let Child { upstream, .. } = start(&spec).await;
    // A slow call of another request waits meanwhile, untouched.
    let up = upstream.clone();
    let slow = tokio::spawn(async move { call(&up, "slow", json!({"ms": 1500})).await });

    let over = call(&upstream, "big_result", json!({"bytes": 2_000_000})).await.unwrap_err();
    assert_eq!(over.code, code::INTERNAL_ERROR);
    for part in ["upstream fix answered with a message of", "over its max_message_bytes (1048576)", "[upstreams.fix]"] {
        assert!(over.message.contains(part), "{part:?} in {over:?}");
    }
    for how in ["truncated", "utf8"] {
        let broken = call(&upstream, "broken_answer", json!({"how": how})).await.unwrap_err();
        assert_eq!(broken.code, code::INTERNAL_ERROR, "{how}");
        assert!(
            broken.message.contains("upstream fix answered with a line on stdout that is not a JSON-RPC message"),
            "{how}: {broken:?}"
        );
    }
    // The connection lives on: the slow call answers, new calls work.
    let slept = within("the slow call", slow).await.unwrap().expect("the slow call answers");
    assert_eq!(slept["structuredContent"]["slept"], 1500);
    assert_eq!(call(&upstream, "echo", json!({"ok": 1})).await.unwrap()["structuredContent"]["ok"], 1);
    assert!(upstream.is_alive());
    upstream.close(true).await;
}

#[tokio::test]
async fn a_flood_on_stderr_is_logged_in_part_with_a_summary() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let Child { upstream, .. } = start(&spec(None)).await;
    call(&upstream, "many_stderr", json!({"n": 1000})).await.expect("answers");
    let logged = || logs.text().lines().filter(|l| l.contains("stderr: noise line")).count();
    within("the start of the flood is logged", async {
        while logged() < 50 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The child's last words are still kept for error messages.
    call(&upstream, "stderr", json!({"text": "after the flood"})).await.expect("answers");
    upstream.close(true).await;
    // 100 lines per 10 s: the rest of the 1,000 never reach the log.
    assert!(logged() <= 200, "at most a window's budget of the flood is logged: {}", logged());
}

#[tokio::test]
async fn a_child_that_exits_at_once_fails_start_with_its_status_and_last_stderr_line() {
    let error = within("start", stdio::start(launch(&spec(Some("--exit-at-once")), INIT_TIMEOUT, permit(), channel().0)))
        .await
        .err()
        .expect("start fails");
    assert_eq!(error.code, code::INTERNAL_ERROR);
    for part in ["upstream fix", "stdio_server.py", "exited (exit status: 3) during initialize", "fixture exits at once as asked"]
    {
        assert!(error.message.contains(part), "{part:?} in {error:?}");
    }
}

#[tokio::test]
async fn a_child_that_never_answers_initialize_is_stopped_after_the_init_timeout() {
    let limit = Duration::from_millis(500);
    let error = within("start", stdio::start(launch(&spec(Some("--never-initialize")), limit, permit(), channel().0)))
        .await
        .err()
        .expect("start fails");
    assert!(error.message.contains("did not answer initialize within 500ms"), "{error:?}");
    assert!(error.message.contains("is ignoring initialize"), "the last stderr line: {error:?}");
    let pid: u32 = error.message.split("fixture pid ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(!process_exists(pid), "the child was killed and reaped");
}

#[tokio::test]
async fn a_command_that_cannot_start_is_named_in_the_error() {
    let spec = CommandSpec::new(vec!["/nonexistent/tether-test-server".into(), "--flag".into()]);
    let error = stdio::start(launch(&spec, INIT_TIMEOUT, permit(), channel().0)).await.err().expect("spawn fails");
    assert_eq!(error.code, code::INTERNAL_ERROR);
    assert!(error.message.contains("/nonexistent/tether-test-server --flag"), "{error:?}");
    assert!(error.message.contains("No such file or directory"), "{error:?}");
}

#[tokio::test]
async fn a_childs_place_under_the_cap_is_freed_once_it_has_been_reaped() {
    let processes = Processes::new("fix", 1, 1, Duration::from_secs(5));
    let permit = processes.try_take("tester").expect("room");
    let Started { upstream, .. } =
        within("start", stdio::start(launch(&spec(None), INIT_TIMEOUT, permit, channel().0))).await.unwrap();
    let pid = pid(&upstream).await;
    assert_eq!(processes.live(), 1);
    assert!(processes.try_take("tester").is_err(), "no second child while the first lives");
    within("close", upstream.close(true)).await;
    assert!(!process_exists(pid));
    assert_eq!(processes.live(), 0, "freed once the child is gone");
}

#[tokio::test]
async fn close_stops_the_child_and_later_requests_fail_clearly() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let first = pid(&upstream).await;
    within("close", upstream.close(true)).await;
    assert!(!upstream.is_alive());
    assert!(!process_exists(first));
    assert!(within("inbound closes", inbound.recv()).await.is_none());
    let error = within("request", upstream.request("ping", None)).await.unwrap_err();
    assert!(matches!(&error, UpstreamError::NotRunning(m) if m.contains("is not running")), "{error:?}");

    // Dropping the last handle stops a child as well.
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    let second = pid(&upstream).await;
    drop(upstream);
    assert!(within("inbound closes on drop", inbound.recv()).await.is_none());
    within("the dropped child goes", async {
        while process_exists(second) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn stopping_a_child_stops_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grandchild");
    // A launcher such as `npx` leaves a process of its own behind the server.
    let script = format!("sleep 1000 & echo $! > '{}'; exec python3 -u '{FIXTURE}'", file.display());
    let Child { upstream, .. } = start(&CommandSpec::new(vec!["sh".into(), "-c".into(), script])).await;
    let grandchild: u32 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
    assert!(process_exists(grandchild));
    within("close", upstream.close(true)).await;
    within("the grandchild goes", async {
        // Gone, or a zombie waiting for init to reap it.
        let running = || {
            std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
        };
        while running() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn what_the_child_wrote_before_an_answer_is_delivered_before_the_answer_returns() {
    let Child { upstream, mut inbound, .. } = start(&spec(None)).await;
    for n in 0..20 {
        let params = json!({"name": "progress_then_answer", "arguments": {}, "_meta": {"progressToken": n}});
        within("call", upstream.request("tools/call", Some(params))).await.expect("answers");
        // Not waited for: it was delivered before the answer came back.
        let progress = inbound.try_recv().expect("the progress written before the answer is already delivered");
        assert_eq!(progress.progress_token(), Some(&json!(n)));
    }
}

/// The messages the fixture appended to its `FIXTURE_RECORD` file so far.
fn recorded(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Waits (generously) until the fixture has recorded a message `found` accepts.
async fn recorded_until(path: &std::path::Path, what: &str, found: impl Fn(&Value) -> bool) -> Value {
    let wait = async {
        loop {
            if let Some(message) = recorded(path).into_iter().find(|m| found(m)) {
                return message;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait).await.unwrap_or_else(|_| panic!("the child never received {what}"))
}

#[tokio::test]
async fn a_call_the_child_never_answers_ends_after_request_timeout_the_child_is_told_and_its_late_answer_reaches_nobody() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("received.jsonl");
    let mut spec = spec(None);
    spec.request_timeout = Duration::from_secs(1);
    spec.env.insert("FIXTURE_RECORD".into(), record.display().to_string());
    let Child { upstream, .. } = start(&spec).await;

    let error = call(&upstream, "never_answer", json!({})).await.unwrap_err();
    assert_eq!(error.code, code::INTERNAL_ERROR);
    for part in [
        "upstream fix did not answer tools/call within 1s (its request_timeout)",
        "cancelled it upstream",
        "raise request_timeout in [upstreams.fix]",
    ] {
        assert!(error.message.contains(part), "{part:?} in {error:?}");
    }
    let data = error.data.clone().expect("data");
    assert_eq!(
        (&data["upstream"], &data["timeout"], &data["timeout_ms"]),
        (&json!("fix"), &json!("request_timeout"), &json!(1000))
    );

    // The child is told, with the id it was given and a reason.
    let held = recorded_until(&record, "the call", |m| m["params"]["name"] == "never_answer").await;
    let cancelled = recorded_until(&record, "notifications/cancelled", |m| m["method"] == "notifications/cancelled").await;
    assert_eq!(cancelled["params"]["requestId"], held["id"], "{cancelled}");
    let reason = cancelled["params"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("request_timeout") && reason.contains("1s"), "{reason}");

    // Its late answer comes right before the answer to the next call: that
    // call gets its own, the late one is dropped with a debug line.
    let released = call(&upstream, "release_held", json!({})).await.expect("release_held answers");
    assert_eq!(released["structuredContent"]["released"], json!([held["id"]]), "the call's own answer: {released}");
    assert!(logs.text().contains(&format!("late answer to cancelled request {}", held["id"])), "{}", logs.text());
    // The connection lives on.
    assert!(upstream.is_alive());
    assert_eq!(call(&upstream, "echo", json!({"after": "timeout"})).await.unwrap()["structuredContent"]["after"], "timeout");
    upstream.close(true).await;
}

/// A child that answers `initialize`, then never reads its stdin again.
const DEAF: &str = r#"
import json, sys, time
request = json.loads(sys.stdin.readline())
result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "deaf", "version": "1"}}
print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}), flush=True)
time.sleep(3600)
"#;

#[tokio::test]
async fn a_child_that_stops_reading_its_stdin_holds_its_calls_only_until_request_timeout() {
    // What waits for its stdin is bounded (the pipe, then the line writer's
    // bound): a call whose line cannot go in waits for room, and every call
    // ends at the request_timeout with the usual error; closing still works.
    let mut spec = CommandSpec::new(vec!["python3".into(), "-c".into(), DEAF.into()]);
    spec.request_timeout = Duration::from_secs(1);
    let Child { upstream, .. } = start(&spec).await;
    // More than the pipe and the writer's bound hold together.
    let big = "x".repeat(3 << 20);
    let calls = (0..3).map(|n| {
        let upstream = upstream.clone();
        let text = if n == 0 { big.clone() } else { format!("small {n}") };
        async move { call(&upstream, "echo", json!({"text": text})).await }
    });
    for outcome in futures::future::join_all(calls).await {
        let error = outcome.expect_err("no answer can come");
        assert_eq!(error.code, code::INTERNAL_ERROR);
        assert!(error.message.contains("did not answer tools/call within 1s (its request_timeout)"), "{error:?}");
    }
    assert!(upstream.is_alive(), "a deaf child is not a dead one");
    within("close", upstream.close(true)).await;
    assert!(!upstream.is_alive());
}
