//! The forwarding core against a fake remote: id mapping both ways, the
//! resume handshake and token rotation, `_meta` hiding, re-initialization
//! after the remote forgot the session, and bad host input.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_bridge::bridge::{self, BridgeOptions};
use tether_bridge::stdio::Outgoing;
use tether_bridge::upstream::{Connector, PeerMessage, UpstreamError, UpstreamSession};
use tether_bridge::{ResumeOptions, ResumeTokenStore};
use tether_wire::meta::{RESUME_REFUSED as REFUSED_META, RESUMED as RESUMED_META, SESSION_RESUME_TOKEN as TOKEN_META};
use tether_wire::ndjson::Line;
use tether_wire::{RpcError, code};
use tokio::sync::{mpsc, oneshot};

/// What the fake remote saw, and its sessions.
#[derive(Default)]
struct RemoteState {
    next: u64,
    /// token -> session
    tokens: HashMap<String, u64>,
    /// session -> forgotten (404)
    forgotten: HashMap<u64, bool>,
    initializes: Vec<Value>,
    calls: Vec<(u64, String, Option<Value>)>,
    answers: Vec<(Value, Result<Value, Value>)>,
    waiting: HashMap<String, oneshot::Sender<Result<Value, Value>>>,
    incoming: HashMap<u64, mpsc::Sender<PeerMessage>>,
}

#[derive(Clone, Default)]
struct FakeRemote(Arc<Mutex<RemoteState>>);

impl FakeRemote {
    fn state(&self) -> parking_lot::MutexGuard<'_, RemoteState> {
        self.0.lock()
    }

    fn issue(&self, state: &mut RemoteState, session: u64) -> String {
        state.next += 1;
        let token = format!("tt1_{:064x}", state.next * 1_000_003);
        state.tokens.insert(token.clone(), session);
        token
    }

    fn forget_all(&self) {
        let mut s = self.state();
        for v in s.forgotten.values_mut() {
            *v = true;
        }
        s.tokens.clear();
    }

    async fn push(&self, session: u64, message: PeerMessage) {
        let tx = self.state().incoming.get(&session).cloned().unwrap();
        tx.send(message).await.unwrap();
    }
}

struct FakeSession {
    id: u64,
    remote: FakeRemote,
    incoming: Mutex<Option<mpsc::Receiver<PeerMessage>>>,
}

#[async_trait::async_trait]
impl UpstreamSession for FakeSession {
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, UpstreamError> {
        let wait = {
            let mut s = self.remote.state();
            if s.forgotten.get(&self.id) == Some(&true) {
                return Err(UpstreamError::SessionNotFound);
            }
            s.calls.push((self.id, method.to_owned(), params.clone()));
            match method {
                "fail" => return Err(UpstreamError::Rpc(RpcError::invalid_params("bad").with_data(json!({"x": 1})))),
                "wait" => {
                    let (tx, rx) = oneshot::channel();
                    let key = params.as_ref().map(|p| p["key"].to_string()).unwrap_or_default();
                    s.waiting.insert(key, tx);
                    Some(rx)
                }
                _ => None,
            }
        };
        if let Some(rx) = wait {
            return rx.await.map_err(|_| UpstreamError::Other("gone".into()))?.map_err(|e| UpstreamError::Other(e.to_string()));
        }
        Ok(json!({"session": self.id, "method": method, "params": params}))
    }

    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError> {
        let mut s = self.remote.state();
        if s.forgotten.get(&self.id) == Some(&true) {
            return Err(UpstreamError::SessionNotFound);
        }
        s.calls.push((self.id, method.to_owned(), params));
        Ok(())
    }

    async fn respond(&self, id: Value, result: Result<Value, Value>) -> Result<(), UpstreamError> {
        let mut s = self.remote.state();
        if s.forgotten.get(&self.id) == Some(&true) {
            return Err(UpstreamError::SessionNotFound);
        }
        s.answers.push((id, result));
        Ok(())
    }

    fn take_incoming(&self) -> Option<mpsc::Receiver<PeerMessage>> {
        self.incoming.lock().take()
    }
}

#[async_trait::async_trait]
impl Connector for FakeRemote {
    async fn connect(&self, params: Value) -> Result<(Box<dyn UpstreamSession>, Value), UpstreamError> {
        let mut s = self.state();
        s.initializes.push(params.clone());
        let presented = params["_meta"][TOKEN_META].as_str().map(str::to_owned);
        let (session, resumed, refused) = match presented.as_ref().and_then(|t| s.tokens.remove(t)) {
            Some(session) => {
                s.forgotten.insert(session, false);
                (session, true, None)
            }
            None => {
                s.next += 1;
                let session = s.next;
                s.forgotten.insert(session, false);
                (session, false, presented.map(|_| "unknown"))
            }
        };
        let token = self.issue(&mut s, session);
        s.calls.push((session, "notifications/initialized".into(), None));
        let (tx, rx) = mpsc::channel(8);
        s.incoming.insert(session, tx);
        let mut meta = json!({TOKEN_META: token, RESUMED_META: resumed, "other/key": 1});
        if let Some(r) = refused {
            meta[REFUSED_META] = json!(r);
        }
        let result = json!({"protocolVersion": "2025-11-25", "serverInfo": {"name": "fake", "version": "0"}, "_meta": meta});
        let fake = FakeSession { id: session, remote: self.clone(), incoming: Mutex::new(Some(rx)) };
        Ok((Box::new(fake), result))
    }
}

/// One bridge run: a host's stdin and stdout as channels.
struct Host {
    input: Option<mpsc::Sender<Line>>,
    output: mpsc::Receiver<Outgoing>,
    done: tokio::task::JoinHandle<()>,
}

impl Host {
    fn start(remote: &FakeRemote, token_dir: &Path) -> Host {
        let options = ResumeOptions { token_dir: Some(token_dir.to_owned()), host_pid: Some(std::process::id()) };
        let tokens = ResumeTokenStore::init(&options);
        let (in_tx, in_rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(64);
        let connector: Arc<dyn Connector> = Arc::new(remote.clone());
        let options = BridgeOptions { drain_timeout: Duration::from_millis(300), ..BridgeOptions::default() };
        let done = tokio::spawn(bridge::run(connector, tokens, in_rx, out_tx, options));
        Host { input: Some(in_tx), output: out_rx, done }
    }

    async fn send(&self, message: Value) {
        self.send_raw(message.to_string().as_bytes()).await;
    }

    async fn send_raw(&self, bytes: &[u8]) {
        self.input.as_ref().unwrap().send(Line::Text(bytes.to_vec())).await.unwrap();
    }

    async fn recv(&mut self) -> Value {
        match tokio::time::timeout(Duration::from_secs(5), self.output.recv()).await {
            Ok(Some(Outgoing::Message(m))) => m,
            other => panic!("expected a message for the host, got {other:?}"),
        }
    }

    async fn initialize(&mut self) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {}}, "clientInfo": {"name": "host", "version": "1"}}}))
            .await;
        let response = self.recv().await;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        response
    }

    /// Closes the host's stdin; the messages written before the bridge ended.
    async fn close(mut self) -> Vec<Value> {
        drop(self.input.take());
        let mut last = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.output.recv()).await {
                Ok(Some(Outgoing::Close)) => break,
                Ok(Some(Outgoing::Message(m))) => last.push(m),
                other => panic!("expected Close, got {other:?}"),
            }
        }
        tokio::time::timeout(Duration::from_secs(5), self.done).await.unwrap().unwrap();
        last
    }
}

fn private_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn token_file(dir: &Path) -> Option<String> {
    let entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    let path = entries.iter().find(|p| !p.to_string_lossy().ends_with(".lock"))?;
    Some(std::fs::read_to_string(path).unwrap().trim_end().to_owned())
}

#[tokio::test]
async fn initialize_hides_tether_meta_keeps_the_token_and_a_restart_resumes() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    let response = host.initialize().await;
    assert_eq!(response["id"], 0);
    assert_eq!(response["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(response["result"]["_meta"], json!({"other/key": 1}), "only tether's keys are removed");
    assert!(!response.to_string().contains("tt1_"), "the host never sees a token");
    let first_token = token_file(dir.path()).expect("token stored");
    assert!(remote.state().initializes[0].get("_meta").is_none(), "first run presents no token");
    host.send(json!({"jsonrpc": "2.0", "id": "a", "method": "tools/list"})).await;
    assert_eq!(host.recv().await["result"]["session"], 1);
    host.close().await;

    // The restarted bridge presents the kept token and gets the same session.
    let mut host = Host::start(&remote, dir.path());
    let response = host.initialize().await;
    assert!(response["result"].get("_meta").is_some_and(|m| m.get(RESUMED_META).is_none()));
    assert_eq!(remote.state().initializes[1]["_meta"][TOKEN_META], first_token);
    assert_eq!(remote.state().initializes[1]["capabilities"], json!({"roots": {}}), "host params forwarded");
    let second_token = token_file(dir.path()).unwrap();
    assert_ne!(second_token, first_token, "rotated");
    host.send(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})).await;
    assert_eq!(host.recv().await["result"]["session"], 1, "same remote session");
    host.close().await;

    // A refused token (the remote forgot it): deleted, fresh session, new token kept.
    remote.forget_all();
    let mut host = Host::start(&remote, dir.path());
    host.initialize().await;
    host.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    assert_eq!(host.recv().await["result"]["session"], 4, "fresh session");
    let third_token = token_file(dir.path()).unwrap();
    assert!(third_token != second_token && remote.state().tokens.contains_key(&third_token));
    host.close().await;
}

#[tokio::test]
async fn requests_keep_the_hosts_ids_and_remote_requests_get_bridge_ids() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    host.initialize().await;
    // Two overlapping requests with odd ids; the first waits for the second.
    host.send(json!({"jsonrpc": "2.0", "id": "x-1", "method": "wait", "params": {"key": 1}})).await;
    host.send(
        json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "t", "_meta": {"progressToken": 5}}}),
    )
    .await;
    let second = host.recv().await;
    assert_eq!(second["id"], 77);
    assert_eq!(second["result"]["params"]["_meta"]["progressToken"], 5, "params pass through untouched");
    remote.state().waiting.remove("1").unwrap().send(Ok(json!({"done": true}))).unwrap();
    let first = host.recv().await;
    assert_eq!(first["id"], "x-1");
    assert_eq!(first["result"], json!({"done": true}));

    // An error from the remote reaches the host unchanged.
    host.send(json!({"jsonrpc": "2.0", "id": 5, "method": "fail"})).await;
    assert_eq!(
        host.recv().await,
        json!({"jsonrpc": "2.0", "id": 5, "error": {"code": code::INVALID_PARAMS, "message": "bad", "data": {"x": 1}}})
    );

    // The remote asks the host; the answer goes back under the remote's id.
    remote.push(1, PeerMessage::Request { id: json!("srv-9"), method: "roots/list".into(), params: None }).await;
    let ask = host.recv().await;
    assert_eq!(ask["method"], "roots/list");
    assert!(ask["id"].is_u64());
    host.send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [{"uri": "file:///p"}]}})).await;
    remote
        .push(1, PeerMessage::Request { id: json!(12), method: "sampling/createMessage".into(), params: Some(json!({"a": 1})) })
        .await;
    let ask2 = host.recv().await;
    assert_ne!(ask2["id"], ask["id"]);
    assert_eq!(ask2["params"], json!({"a": 1}));
    host.send(json!({"jsonrpc": "2.0", "id": ask2["id"], "error": {"code": -1, "message": "no"}})).await;
    // Notifications both ways.
    remote
        .push(1, PeerMessage::Notification { method: "notifications/message".into(), params: Some(json!({"level": "info"})) })
        .await;
    assert_eq!(host.recv().await, json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}}));
    host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})).await;
    // A response to an id the bridge never used is dropped.
    host.send(json!({"jsonrpc": "2.0", "id": 4242, "result": {}})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 6, "method": "ping"})).await;
    assert_eq!(host.recv().await["id"], 6);
    let answers = remote.state().answers.clone();
    assert_eq!(answers[0], (json!("srv-9"), Ok(json!({"roots": [{"uri": "file:///p"}]}))));
    assert_eq!(answers[1], (json!(12), Err(json!({"code": -1, "message": "no"}))));
    assert_eq!(answers.len(), 2);
    let calls: Vec<String> = remote.state().calls.iter().map(|c| c.1.clone()).collect();
    assert!(calls.contains(&"notifications/initialized".to_owned()));
    assert!(calls.contains(&"notifications/roots/list_changed".to_owned()));
    host.close().await;
}

#[tokio::test]
async fn a_forgotten_session_is_initialized_again_and_the_request_retried_once() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    host.initialize().await;
    let token = token_file(dir.path()).unwrap();
    remote.state().forgotten.insert(1, true);
    host.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
    let response = host.recv().await;
    assert_eq!(response["id"], 3);
    assert_eq!(response["result"]["session"], 1, "resumed the same session with the kept token");
    {
        let state = remote.state();
        assert_eq!(state.initializes.len(), 2);
        assert_eq!(state.initializes[1]["_meta"][TOKEN_META], token);
        assert_eq!(state.initializes[1]["clientInfo"]["name"], "host", "the host's params again");
        let initialized = state.calls.iter().filter(|c| c.1 == "notifications/initialized").count();
        assert_eq!(initialized, 2, "one per connect: the host's own is not forwarded again");
    }
    // Forgotten and the token refused: a fresh session, and the bridge carries on.
    remote.forget_all();
    host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})).await;
    assert_eq!(host.recv().await["result"]["session"], 4);
    assert_eq!(remote.state().initializes.len(), 3, "one re-initialize for both messages");
    host.close().await;
}

#[tokio::test]
async fn bad_host_input_gets_json_rpc_errors_and_the_bridge_goes_on() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    host.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    assert_eq!(host.recv().await["error"]["code"], code::INVALID_REQUEST, "not initialized yet");
    host.send(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await;
    assert_eq!(host.recv().await, json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
    host.send_raw(b"{not json").await;
    assert_eq!(host.recv().await["error"]["code"], code::PARSE_ERROR);
    host.send(json!([{"jsonrpc": "2.0", "id": 3, "method": "ping"}])).await;
    assert_eq!(host.recv().await["error"]["code"], code::INVALID_REQUEST);
    host.send(json!({"jsonrpc": "2.0", "id": 4})).await;
    let neither = host.recv().await;
    assert_eq!((&neither["id"], &neither["error"]["code"]), (&Value::Null, &json!(code::INVALID_REQUEST)), "{neither}");
    assert!(neither["error"]["message"].as_str().unwrap().contains("exactly one of `result` or an `error`"), "{neither}");
    host.send(json!({"jsonrpc": "2.0", "id": 8, "method": "ping", "params": [1]})).await;
    assert_eq!(
        host.recv().await,
        json!({"jsonrpc": "2.0", "id": 8, "error": {"code": code::INVALID_PARAMS, "message": "`params` must be an object"}})
    );
    // An over-long request is answered under its id, read from its head.
    let head = br#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"x","arguments":{"text":"aaaa"#.to_vec();
    let too_long = Line::TooLong { len: 9_000_000, head, tail: b"aaaa\"}}}".to_vec() };
    host.input.as_ref().unwrap().send(too_long).await.unwrap();
    let refused = host.recv().await;
    assert_eq!(refused["id"], 41, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("message of 9000000 bytes, longer than"), "{refused}");
    host.initialize().await;
    host.send(json!({"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {}})).await;
    assert_eq!(host.recv().await["error"]["message"], "already initialized");
    // A request the host cancels gets no response.
    host.send(json!({"jsonrpc": "2.0", "id": 6, "method": "wait", "params": {"key": 6}})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    host.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 6}})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 7, "method": "ping"})).await;
    assert_eq!(host.recv().await["id"], 7);
    host.close().await;
}

#[tokio::test]
async fn closing_stdin_still_answers_requests_in_flight_for_a_bounded_time() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    host.initialize().await;
    host.send(json!({"jsonrpc": "2.0", "id": 1, "method": "wait", "params": {"key": 1}})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 2, "method": "wait", "params": {"key": 2}})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
    let answer = remote.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waiter = answer.state().waiting.remove("1").unwrap();
        waiter.send(Ok(json!({"late": true}))).unwrap();
    });
    let last = host.close().await;
    let ids: Vec<&Value> = last.iter().map(|m| &m["id"]).collect();
    assert!(ids.contains(&&json!(3)) && ids.contains(&&json!(1)), "answered after stdin closed: {last:?}");
    assert!(!ids.contains(&&json!(2)), "a request still running after the drain time is abandoned");
    assert!(remote.state().forgotten.values().all(|f| !f), "the remote session is not ended");
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_are_refused_without_blocking_answers() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let options = ResumeOptions { token_dir: Some(dir.path().to_owned()), host_pid: Some(std::process::id()) };
    let (in_tx, in_rx) = mpsc::channel(16);
    let (out_tx, mut out_rx) = mpsc::channel(64);
    let bridge_options =
        BridgeOptions { max_in_flight: 2, drain_timeout: Duration::from_millis(100), ..BridgeOptions::default() };
    let connector: Arc<dyn Connector> = Arc::new(remote.clone());
    let done = tokio::spawn(bridge::run(connector, ResumeTokenStore::init(&options), in_rx, out_tx, bridge_options));
    let send = |v: Value| {
        let in_tx = in_tx.clone();
        async move { in_tx.send(Line::Text(v.to_string().into_bytes())).await.unwrap() }
    };
    let mut recv = async || match tokio::time::timeout(Duration::from_secs(5), out_rx.recv()).await {
        Ok(Some(Outgoing::Message(m))) => m,
        other => panic!("{other:?}"),
    };
    send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})).await;
    recv().await;
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "wait", "params": {"key": 1}})).await;
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "wait", "params": {"key": 2}})).await;
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
    let refused = recv().await;
    assert_eq!(refused["id"], 3);
    assert!(refused["error"]["message"].as_str().unwrap().contains("too many requests in flight"));
    // The host can still answer the remote while both slots are taken.
    remote.push(1, PeerMessage::Request { id: json!("r"), method: "roots/list".into(), params: None }).await;
    let ask = recv().await;
    send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": []}})).await;
    for _ in 0..100 {
        if !remote.state().answers.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(remote.state().answers.len(), 1);
    remote.state().waiting.remove("1").unwrap().send(Ok(json!({}))).unwrap();
    assert_eq!(recv().await["id"], 1);
    send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})).await;
    assert_eq!(recv().await["id"], 4, "a freed slot is used again");
    drop(in_tx);
    tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
}

/// Waits until the remote has `n` answers from the host (or 5 s), then a
/// little longer so that an answer that should not come has time to.
async fn answers_after(remote: &FakeRemote, n: usize) -> Vec<(Value, Result<Value, Value>)> {
    for _ in 0..500 {
        if remote.state().answers.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    remote.state().answers.clone()
}

#[tokio::test]
async fn a_hosts_answer_to_a_request_of_an_earlier_remote_session_is_dropped() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let mut host = Host::start(&remote, dir.path());
    host.initialize().await;

    // Session 1 asks the host; before the host answers, the remote forgets
    // the session and the bridge moves to a fresh one.
    remote.push(1, PeerMessage::Request { id: json!("old-1"), method: "roots/list".into(), params: None }).await;
    let stale = host.recv().await;
    assert_eq!(stale["method"], "roots/list");
    remote.forget_all();
    host.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let second = host.recv().await["result"]["session"].as_u64().unwrap();
    assert_ne!(second, 1, "re-initialized without a usable token");
    host.send(json!({"jsonrpc": "2.0", "id": stale["id"], "result": {"roots": []}})).await;

    // The new session asks too; only its own request gets an answer.
    remote.push(second, PeerMessage::Request { id: json!("new-1"), method: "roots/list".into(), params: None }).await;
    let fresh = host.recv().await;
    host.send(json!({"jsonrpc": "2.0", "id": fresh["id"], "result": {"roots": [{"uri": "file:///new"}]}})).await;
    let answers = answers_after(&remote, 1).await;
    assert_eq!(
        answers,
        vec![(json!("new-1"), Ok(json!({"roots": [{"uri": "file:///new"}]})))],
        "the stale answer never reaches the new session"
    );

    // The bridge has not noticed yet that the second session is gone when the host
    // answers: that answer is not re-sent to the session opened next.
    remote.push(second, PeerMessage::Request { id: json!("new-2"), method: "roots/list".into(), params: None }).await;
    let lost = host.recv().await;
    remote.forget_all();
    host.send(json!({"jsonrpc": "2.0", "id": lost["id"], "result": {"roots": []}})).await;
    host.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
    let next_session = host.recv().await["result"]["session"].as_u64().unwrap();
    assert!(next_session != second && next_session != 1, "a new remote session for the next request");
    assert_eq!(answers_after(&remote, 2).await.len(), 1, "no answer under an id the new session never sent");
    host.close().await;
}

#[tokio::test]
async fn requests_of_an_earlier_remote_session_do_not_count_against_the_pending_limit() {
    let remote = FakeRemote::default();
    let dir = private_dir();
    let options = ResumeOptions { token_dir: Some(dir.path().to_owned()), host_pid: Some(std::process::id()) };
    let (in_tx, in_rx) = mpsc::channel(16);
    let (out_tx, mut out_rx) = mpsc::channel(64);
    let bridge_options =
        BridgeOptions { max_pending_server_requests: 1, drain_timeout: Duration::from_millis(100), ..BridgeOptions::default() };
    let connector: Arc<dyn Connector> = Arc::new(remote.clone());
    let done = tokio::spawn(bridge::run(connector, ResumeTokenStore::init(&options), in_rx, out_tx, bridge_options));
    let send = |v: Value| {
        let in_tx = in_tx.clone();
        async move { in_tx.send(Line::Text(v.to_string().into_bytes())).await.unwrap() }
    };
    let mut recv = async || match tokio::time::timeout(Duration::from_secs(5), out_rx.recv()).await {
        Ok(Some(Outgoing::Message(m))) => m,
        other => panic!("{other:?}"),
    };
    send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})).await;
    recv().await;
    // Session 1 asks and the host never answers; then session 1 is lost.
    remote.push(1, PeerMessage::Request { id: json!("old"), method: "roots/list".into(), params: None }).await;
    assert_eq!(recv().await["method"], "roots/list");
    remote.forget_all();
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    let second = recv().await["result"]["session"].as_u64().unwrap();
    // The new session's request reaches the host: the unanswerable one is not in the way.
    remote.push(second, PeerMessage::Request { id: json!("new"), method: "roots/list".into(), params: None }).await;
    let ask = recv().await;
    assert_eq!(ask["method"], "roots/list", "{ask}");
    assert!(remote.state().answers.is_empty(), "nothing refused: {:?}", remote.state().answers);
    drop(in_tx);
    tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
}
