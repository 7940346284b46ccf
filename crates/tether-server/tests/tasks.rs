//! The Tasks extension through the engine's own API: a long `tools/call` of
//! a sessionless client becomes a task committed before it is answered,
//! `tasks/get` follows it to its end (also from another engine on the same
//! store after the first one stopped: restartable work continues, the rest
//! fails "interrupted"), `tasks/cancel`, principals, the undeclared
//! extension (the call answered inline), and a session-era call followed as a task.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_server::engine::{Outbound, PostOutcome, Reply, SessionlessRequest};
use tether_server::rmcp_model::{CallToolResult, ContentBlock, Implementation, Tool};
use tether_server::{
    Caller, ClientDeclaration, Engine, EngineConfig, OperationCtx, OperationSpec, RequestCtx, RpcError, ToolApp, ToolRouter,
};
use tether_store::memory::MemoryStore;
use tether_store::{Store, StoreConfig};
use tether_wire::{Inbound, meta};

/// Two operations: `count` (restartable: three chunks, 200 ms apart) and
/// `once` (not restartable, the same work).
struct Counting(Arc<AtomicUsize>);

/// The principals whose work ran to its end (any test's, so each test
/// looks for a principal of its own).
static ENDED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

#[async_trait::async_trait]
impl ToolApp for Counting {
    fn server_info(&self) -> Implementation {
        Implementation::new("tasks-test", "0")
    }

    fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(Map::new());
        ["count", "once"].into_iter().map(|n| Tool::new(n, n, schema.clone())).collect()
    }

    fn operation_spec(&self, tool: &str) -> Option<OperationSpec> {
        Some(OperationSpec { restartable: tool == "count", expected_duration_ms: 600 })
    }

    async fn run_operation(&self, ctx: OperationCtx, _tool: &str, _args: Map<String, Value>) -> Result<(), RpcError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        for i in ctx.resume_from()..3 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            ctx.push(CallToolResult::success(vec![ContentBlock::text(format!("{i}"))])).await?;
        }
        ENDED.lock().unwrap_or_else(|e| e.into_inner()).push(ctx.principal().to_owned());
        Ok(())
    }

    async fn call_tool(&self, _ctx: RequestCtx, name: &str, _args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        Err(RpcError::invalid_params(format!("unknown tool {name}")))
    }
}

fn config() -> EngineConfig {
    EngineConfig { resume_wait: Duration::from_millis(50), drain_timeout: Duration::from_millis(50), ..EngineConfig::default() }
}

fn engine_on(store: Arc<dyn Store>, starts: Arc<AtomicUsize>) -> Engine {
    Engine::new(store, Arc::new(ToolRouter::new(Counting(starts))), config())
}

fn caller(principal: &str, with_tasks: bool) -> Caller {
    let capabilities = if with_tasks { json!({"extensions": {(meta::TASKS_EXTENSION): {}}}) } else { json!({}) };
    Caller {
        principal: principal.to_owned(),
        client: Arc::new(ClientDeclaration {
            protocol_version: "2026-07-28".into(),
            client_info: json!({"name": "tasks-test"}),
            client_capabilities: capabilities,
        }),
    }
}

/// One sessionless request; its answer (`result` or `error`).
async fn ask(engine: &Engine, caller: Caller, method: &str, params: Value) -> Value {
    let request = SessionlessRequest {
        endpoint: String::new(),
        caller,
        id: json!(1),
        method: method.to_owned(),
        params: params.as_object().cloned(),
        authorized: None,
        log_level: None,
        param_headers: Vec::new(),
    };
    let mut reply = engine.call_sessionless(request).await.expect("taken");
    loop {
        match tokio::time::timeout(Duration::from_secs(10), reply.messages.recv()).await.expect("answered in time") {
            Some(Outbound::Answer { body, .. }) => return serde_json::from_slice(&body).expect("JSON"),
            Some(Outbound::Notification(_) | Outbound::KeepAlive) => continue,
            None => panic!("no answer"),
        }
    }
}

async fn get(engine: &Engine, caller: Caller, task: &str) -> Value {
    ask(engine, caller, "tasks/get", json!({"taskId": task})).await
}

/// Polls `tasks/get` until the task is no longer working.
async fn until_done(engine: &Engine, caller: &Caller, task: &str) -> Value {
    for _ in 0..100 {
        let answer = get(engine, caller.clone(), task).await;
        if answer["result"]["status"] != "working" {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {task} never ended");
}

fn texts(result: &Value) -> Vec<String> {
    result["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str().map(str::to_owned)).collect()
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(StoreConfig::default()))
}

#[tokio::test]
async fn a_long_call_becomes_a_task_that_tasks_get_follows_to_its_result() {
    let engine = engine_on(memory(), Arc::default());
    let alice = caller("alice", true);
    let created = ask(&engine, alice.clone(), "tools/call", json!({"name": "count", "arguments": {}})).await;
    let task = &created["result"];
    assert_eq!(task["resultType"], "task", "{created}");
    assert_eq!(task["status"], "working");
    assert!(task["createdAt"].as_str().is_some_and(|t| t.ends_with('Z')) && task["pollIntervalMs"].is_u64(), "{task}");
    let id = task["taskId"].as_str().expect("a task ID").to_owned();
    // Committed before the answer: found at once.
    let first = get(&engine, alice.clone(), &id).await;
    assert_eq!(first["result"]["resultType"], "complete", "{first}");
    assert_eq!(first["result"]["taskId"], id.as_str());
    let done = until_done(&engine, &alice, &id).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(texts(&done["result"]["result"]), ["0", "1", "2"], "{done}");
    // tasks/get keeps answering a finished task (until its TTL).
    assert_eq!(get(&engine, alice, &id).await["result"]["status"], "completed");
}

#[tokio::test]
async fn tasks_are_bound_to_their_principal_and_need_the_extension() {
    let engine = engine_on(memory(), Arc::default());
    let created = ask(&engine, caller("alice", true), "tools/call", json!({"name": "count"})).await;
    let id = created["result"]["taskId"].as_str().expect("a task").to_owned();
    let foreign = get(&engine, caller("mallory", true), &id).await;
    assert_eq!(foreign["error"]["code"], -32602, "another principal's task is unknown to them: {foreign}");
    let unknown = get(&engine, caller("alice", true), "00ff").await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    let undeclared = get(&engine, caller("alice", false), &id).await;
    assert_eq!(undeclared["error"]["code"], -32021, "{undeclared}");
    assert!(undeclared["error"]["data"]["requiredCapabilities"]["extensions"][meta::TASKS_EXTENSION].is_object());
    // A client without the extension is never given a task: the call waits for the whole result.
    let call = ask(&engine, caller("alice", false), "tools/call", json!({"name": "count"})).await;
    assert_eq!(call["result"]["resultType"], "complete", "{call}");
    assert_eq!(texts(&call["result"]), ["0", "1", "2"], "a task tool for a client without the extension, inline: {call}");
    for removed in ["tasks/result", "tasks/list"] {
        let r = ask(&engine, caller("alice", true), removed, json!({"taskId": id})).await;
        assert_eq!(r["error"]["code"], -32601, "{removed}: {r}");
    }
}

#[tokio::test]
async fn tasks_cancel_ends_a_working_task_cancelled() {
    let starts = Arc::new(AtomicUsize::new(0));
    let engine = engine_on(memory(), starts);
    let alice = caller("alice", true);
    let created = ask(&engine, alice.clone(), "tools/call", json!({"name": "count"})).await;
    let id = created["result"]["taskId"].as_str().expect("a task").to_owned();
    let ack = ask(&engine, alice.clone(), "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let after = get(&engine, alice.clone(), &id).await;
    assert_eq!(after["result"]["status"], "cancelled", "{after}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(get(&engine, alice, &id).await["result"]["status"], "cancelled", "the stopped work does not complete it");
}

#[tokio::test]
async fn after_its_process_stopped_a_task_is_answered_restartable_work_finishes_and_the_rest_fails_interrupted() {
    let store = memory();
    let starts = Arc::new(AtomicUsize::new(0));
    let first = engine_on(store.clone(), starts.clone());
    let alice = caller("alice", true);
    let count = ask(&first, alice.clone(), "tools/call", json!({"name": "count"})).await["result"]["taskId"].clone();
    let once = ask(&first, alice.clone(), "tools/call", json!({"name": "once"})).await["result"]["taskId"].clone();
    // The process goes away before the work ends (the drain gives up at once).
    first.shutdown().await;
    let second = engine_on(store, starts.clone());
    let count = count.as_str().expect("a task");
    let restarted = get(&second, alice.clone(), count).await;
    assert_eq!(restarted["result"]["status"], "working", "{restarted}");
    let done = until_done(&second, &alice, count).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(texts(&done["result"]["result"]), ["0", "1", "2"], "every chunk once: {done}");
    let interrupted = get(&second, alice, once.as_str().expect("a task")).await;
    assert_eq!(interrupted["result"]["status"], "failed", "{interrupted}");
    assert_eq!(interrupted["result"]["error"]["code"], -32603);
    assert!(interrupted["result"]["error"]["message"].as_str().unwrap_or("").contains("interrupted"), "{interrupted}");
    assert_eq!(starts.load(Ordering::SeqCst), 3, "count twice (started, restarted), once once");
}

#[tokio::test]
async fn a_call_of_a_session_can_be_followed_as_a_task() {
    let engine = engine_on(memory(), Arc::default());
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "0"}});
    let outcome =
        engine.initialize("", "alice", json!(0), init.as_object().cloned(), Reply::Stream, None).await.expect("initialized");
    let session_id = match outcome {
        PostOutcome::Complete { session_id, .. } | PostOutcome::Stream { session_id, .. } => session_id,
        _ => panic!("no session"),
    };
    let session = engine.session("", &session_id, "alice").await.expect("the session");
    let call = Inbound::Request {
        id: json!(1),
        method: "tools/call".into(),
        // A client that pages gets a first page naming the task.
        params: json!({"name": "count", "arguments": {}, "_meta": {(meta::PAGING): true}}).as_object().cloned(),
    };
    let frames = match engine.post(session, call, Reply::Stream, None).await.expect("taken") {
        PostOutcome::Complete { frames, .. } => frames,
        PostOutcome::Stream { mut frames, .. } => {
            let mut all = Vec::new();
            while let Some(f) = frames.recv().await {
                all.push(f);
            }
            all
        }
        _ => panic!("unexpected outcome"),
    };
    let partial: Value = frames
        .iter()
        .find_map(|f| match f {
            tether_server::engine::Frame::Event { data, .. } => serde_json::from_slice(data).ok(),
            _ => None,
        })
        .expect("an answer");
    let id = partial["result"]["_meta"][meta::TASK_ID].as_str().expect("the partial result names its task").to_owned();
    assert!(partial["result"]["_meta"][meta::NEXT_RESUME_TOKEN].is_string(), "{partial}");
    let done = until_done(&engine, &caller("alice", true), &id).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(get(&engine, caller("bob", true), &id).await["error"]["code"], -32602, "still bound to its principal");
}

#[tokio::test]
async fn a_call_answered_whole_whose_client_goes_away_stops_its_work() {
    let engine = engine_on(memory(), Arc::default());
    let ended = |who: &str| ENDED.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|p| *p == who).count();
    // Waited for to its end: the work ran whole.
    let whole = ask(&engine, caller("carol", false), "tools/call", json!({"name": "count"})).await;
    assert_eq!(texts(&whole["result"]), ["0", "1", "2"], "{whole}");
    assert_eq!(ended("carol"), 1);
    // The client closes its stream while the work runs: nobody else can
    // reach the result, so the work stops.
    let request = SessionlessRequest {
        endpoint: String::new(),
        caller: caller("dave", false),
        id: json!(1),
        method: "tools/call".into(),
        params: json!({"name": "count"}).as_object().cloned(),
        authorized: None,
        log_level: None,
        param_headers: Vec::new(),
    };
    let reply = engine.call_sessionless(request).await.expect("taken");
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(reply);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(ended("dave"), 0, "the work of a call nobody waits for was stopped");
}
