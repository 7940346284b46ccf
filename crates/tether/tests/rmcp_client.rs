//! rmcp 3.x as a client of the real binary over the sessionless revision
//! (2026-07-28): `ClientLifecycleMode::Auto` probes `server/discover` and
//! goes on without a session; tools/list, `thought`, a roots request answered
//! through MRTR by rmcp's own `call_tool` loop, and the Tasks extension
//! (`call_tool_once` answers `CallToolResponse::Task`, `get_task` polls it to
//! the end). rmcp's high-level `call_tool` does not follow tasks (it returns
//! `UnexpectedResponse` for one), so the task is driven with the two
//! lower-level calls rmcp offers for that. Every HTTP request rmcp makes goes
//! through a recording wrapper of its reqwest client: no `initialize`, no
//! `Mcp-Session-Id` either way, no GET or DELETE.

// Roots are deprecated by SEP-2577 in rmcp, but tether's notebook asks them
// (through MRTR for sessionless clients): the test answers them.
#![allow(deprecated)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use parking_lot::Mutex;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ClientJsonRpcMessage, GetTaskParams,
    Implementation, ListRootsResult, ProtocolVersion, Root, TASKS_EXTENSION_ID, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError, StreamableHttpPostResponse,
};
use rmcp::{ClientHandler, ErrorData};
use serde_json::{Map, Value, json};
use sse_stream::Sse;
use support::start_binary;

const SESSIONLESS: &str = "2026-07-28";
const NOTEBOOK_SESSION: &str = "dev.tether/notebookSession";

/// One HTTP request rmcp's transport made.
#[derive(Debug, Clone)]
struct Sent {
    http: &'static str,
    /// The JSON-RPC method of a POSTed request or notification.
    rpc: Option<String>,
    headers: Vec<(String, String)>,
    session_sent: Option<String>,
    session_answered: Option<String>,
}

/// rmcp's reqwest client, recording what it sends.
#[derive(Clone, Default)]
struct Recording {
    inner: reqwest::Client,
    log: Arc<Mutex<Vec<Sent>>>,
}

impl Recording {
    fn record(
        &self,
        http: &'static str,
        rpc: Option<String>,
        headers: &HashMap<HeaderName, HeaderValue>,
        session: Option<&Arc<str>>,
    ) -> usize {
        let headers = headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("?").to_owned())).collect();
        let mut log = self.log.lock();
        log.push(Sent { http, rpc, headers, session_sent: session.map(|s| s.to_string()), session_answered: None });
        log.len() - 1
    }

    fn sent(&self) -> Vec<Sent> {
        self.log.lock().clone()
    }
}

type Events = BoxStream<'static, Result<Sse, SseError>>;

impl StreamableHttpClient for Recording {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let rpc = serde_json::to_value(&message).ok().and_then(|v| v["method"].as_str().map(str::to_owned));
        let i = self.record("POST", rpc, &custom_headers, session_id.as_ref());
        let answer = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await;
        if let Ok(StreamableHttpPostResponse::Json(_, Some(sid)) | StreamableHttpPostResponse::Sse(_, Some(sid))) = &answer {
            self.log.lock()[i].session_answered = Some(sid.clone());
        }
        answer
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.record("DELETE", None, &custom_headers, Some(&session_id));
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, StreamableHttpError<Self::Error>> {
        self.record("GET", None, &custom_headers, session_id.as_ref());
        self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
    }
}

/// The client: declares the capabilities it is given and answers roots/list with `root`.
struct TestClient {
    capabilities: ClientCapabilities,
    root: Option<&'static str>,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(self.capabilities.clone(), Implementation::new("tether-rmcp-interop", "1.0.0"))
    }

    async fn list_roots(&self, _: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        Ok(ListRootsResult::new(self.root.iter().map(|uri| Root::new(*uri)).collect()))
    }
}

fn auto() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto { preferred_versions: vec![ProtocolVersion::V_2026_07_28], legacy_version: None }
}

fn transport(url: &str) -> (StreamableHttpClientTransport<Recording>, Recording) {
    let http = Recording::default();
    (StreamableHttpClientTransport::with_client(http.clone(), StreamableHttpClientTransportConfig::with_uri(url)), http)
}

fn thought_args(n: u64) -> Map<String, Value> {
    json!({"thought": "x", "thoughtNumber": n, "totalThoughts": 2, "nextThoughtNeeded": true}).as_object().cloned().unwrap()
}

/// What a sessionless client must (not) send: checked on every recorded request.
fn assert_sessionless(sent: &[Sent]) {
    assert!(!sent.is_empty());
    // What went over the wire (shown with --no-capture).
    eprintln!("rmcp sent: {:?}", sent.iter().map(|s| s.rpc.as_deref().unwrap_or(s.http)).collect::<Vec<_>>());
    assert_eq!(sent[0].rpc.as_deref(), Some("server/discover"), "the first request: {sent:#?}");
    for s in sent {
        assert_eq!(s.http, "POST", "2026-07-28 has no GET stream and no DELETE: {sent:#?}");
        assert_ne!(s.rpc.as_deref(), Some("initialize"), "{sent:#?}");
        assert_eq!((&s.session_sent, &s.session_answered), (&None, &None), "no Mcp-Session-Id either way: {s:#?}");
        let header = |name: &str| s.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(header("mcp-protocol-version"), Some(SESSIONLESS), "{s:#?}");
        if let Some(rpc) = &s.rpc {
            assert_eq!(header("mcp-method"), Some(rpc.as_str()), "{s:#?}");
        }
    }
}

#[tokio::test]
async fn rmcp_auto_discovers_lists_calls_and_answers_roots_through_mrtr_without_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);

    // Without roots: discover, list, a thought that starts a notebook session.
    let (t, http) = transport(&url);
    let client = TestClient { capabilities: ClientCapabilities::default(), root: None }
        .serve_with_lifecycle(t, auto())
        .await
        .expect("rmcp connects");
    let info = client.peer_info().expect("the discover result");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2026_07_28);
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("tether-notebook"), "{info:?}");
    assert!(info.capabilities.supports_tasks(), "discover advertises the Tasks extension: {info:?}");
    let tools = client.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "thought") && tools.iter().any(|t| t.name == "session"), "{tools:?}");
    let result = client.call_tool(CallToolRequestParams::new("thought").with_arguments(thought_args(1))).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let sc = result.structured_content.clone().expect("structuredContent");
    assert_eq!(
        (&sc["thoughtNumber"], &sc["totalThoughts"], &sc["nextThoughtNeeded"]),
        (&json!(1), &json!(2), &json!(true)),
        "{sc}"
    );
    assert!(sc["branches"].is_array() && sc["thoughtHistoryLength"].as_u64() >= Some(1), "{sc}");
    let text = result.content.iter().find_map(|c| c.as_text().map(|t| t.text.clone())).expect("text content");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), sc, "the text twin");
    assert!(result.meta.as_ref().and_then(|m| m.get(NOTEBOOK_SESSION)).is_some(), "{result:?}");
    client.cancel().await.unwrap();
    assert_sessionless(&http.sent());

    // With roots: tether asks roots/list in an input_required round; rmcp's
    // call_tool answers it with list_roots and repeats the call. Two clients
    // with the same root go on in the same notebook session.
    let mut sessions = Vec::new();
    for n in 1..=2 {
        let (t, http) = transport(&url);
        let mut caps = ClientCapabilities::default();
        caps.roots = Some(Default::default());
        let client = TestClient { capabilities: caps, root: Some("file:///work/rmcp-project") }
            .serve_with_lifecycle(t, auto())
            .await
            .unwrap();
        let result = client.call_tool(CallToolRequestParams::new("thought").with_arguments(thought_args(n))).await.unwrap();
        assert_eq!(result.structured_content.as_ref().unwrap()["thoughtHistoryLength"], n, "{result:?}");
        sessions.push(result.meta.as_ref().and_then(|m| m.get(NOTEBOOK_SESSION)).cloned().expect("a notebook session"));
        client.cancel().await.unwrap();
        let sent = http.sent();
        assert_sessionless(&sent);
        let calls = sent.iter().filter(|s| s.rpc.as_deref() == Some("tools/call")).count();
        assert_eq!(calls, 2, "an input_required round, then the repeated call: {sent:#?}");
    }
    assert_eq!(sessions[0], sessions[1], "the same root, the same notebook session");
    let _ = server.kill();
}

#[tokio::test]
async fn rmcp_follows_a_task_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &["--resume-wait", "0s"]);
    let (t, http) = transport(&url);
    let mut caps = ClientCapabilities::default();
    caps.extensions = Some([(TASKS_EXTENSION_ID.to_owned(), Default::default())].into());
    let client = TestClient { capabilities: caps, root: None }.serve_with_lifecycle(t, auto()).await.unwrap();

    let params = CallToolRequestParams::new("session").with_arguments(json!({"operation": "list"}).as_object().cloned().unwrap());
    // rmcp's call_tool does not follow tasks: it refuses the CreateTaskResult.
    let refused = client.call_tool(params.clone()).await;
    assert!(matches!(refused, Err(rmcp::ServiceError::UnexpectedResponse)), "{refused:?}");

    let created = match client.call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(created) => created,
        other => panic!("--resume-wait 0s: a task, got {other:?}"),
    };
    // A quick operation may be done by the time its task is answered; the
    // client follows it through tasks/get either way.
    assert!(matches!(created.task.status, TaskStatus::Working | TaskStatus::Completed), "{created:?}");
    assert!(created.task.ttl_ms.is_some() && !created.task.created_at.is_empty(), "{created:?}");
    let poll = Duration::from_millis(created.task.poll_interval_ms.unwrap_or(100).min(1000));
    let mut polls = 0;
    let done = loop {
        let got = client.get_task(GetTaskParams::new(&created.task.task_id)).await.expect("tasks/get");
        polls += 1;
        assert_eq!(got.task.task.task_id, created.task.task_id);
        if got.task.status().is_terminal() {
            break got;
        }
        assert!(polls < 60, "the task never ended: {got:?}");
        tokio::time::sleep(poll).await;
    };
    let TaskPayload::Completed { result } = &done.task.payload else { panic!("not completed: {done:?}") };
    assert!(result["content"].is_array() && result["structuredContent"]["sessions"].is_array(), "{result:?}");
    client.cancel().await.unwrap();

    let sent = http.sent();
    assert_sessionless(&sent);
    for s in sent.iter().filter(|s| s.rpc.as_deref() == Some("tasks/get")) {
        assert!(s.headers.contains(&("mcp-name".into(), created.task.task_id.clone())), "tasks/get names its task: {s:#?}");
    }
    let _ = server.kill();
}
