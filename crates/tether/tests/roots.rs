//! The notebook finds reasoning again by project root (seed
//! "session-recovery-via-mcp-root"), over real HTTP.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tether_server::http::Auth;

const ROOT_X: &str = "file:///work/project-x";
const ROOT_Y: &str = "file:///work/project-y";

fn roots(uris: &[&str]) -> Value {
    json!(uris.iter().map(|u| json!({"uri": u, "name": u.rsplit('/').next()})).collect::<Vec<_>>())
}

struct Agent {
    c: Client,
    sid: String,
    roots: Value,
    next: u64,
}

impl Agent {
    /// A new MCP session of a client that declares roots (or not, with `None`).
    async fn connect(c: &Client, roots_list: Option<Value>) -> Self {
        let caps = if roots_list.is_some() { json!({"roots": {"listChanged": true}}) } else { json!({}) };
        let sid = c.initialize_with(caps).await;
        Self { c: c.clone(), sid, roots: roots_list.unwrap_or(json!([])), next: 100 }
    }

    async fn tool(&mut self, name: &str, args: Value) -> Value {
        self.next += 1;
        self.c.call_with_roots(&self.sid, self.next, name, args, &self.roots).await
    }

    async fn init(&mut self, args: Value) -> Value {
        self.tool("init", args).await
    }

    async fn think(&mut self, n: u64) -> Value {
        self.tool("thought", thought_args(n)).await
    }
}

#[tokio::test]
async fn auto_recovery_after_the_mcp_session_changed() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let mut first = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        let started = first.init(json!({"operation": "start_new", "title": "design"})).await;
        assert_eq!(structured(&started)["mcpRootUri"], ROOT_X, "start_new stores the bound root");
        let id = structured(&started)["sessionId"].as_str().unwrap().to_owned();
        for n in 1..=3 {
            first.think(n).await;
        }
        // The MCP session is replaced and the agent remembers nothing.
        let mut second = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        let loaded = second.init(json!({"operation": "load_context"})).await;
        let s = structured(&loaded);
        assert_eq!(s["success"], true, "{loaded}");
        assert_eq!(s["sessionId"], id.as_str());
        assert_eq!(s["thoughtCount"], 3);
        assert_eq!(s["mcpRootUri"], ROOT_X);
        assert_eq!(s["message"], format!("Auto-recovered session {id} (3 thoughts, last updated just now)"));
        let next = second.think(4).await;
        assert_eq!(structured(&next)["thoughtHistoryLength"], 4, "thoughts continue in the recovered session");
    }
}

#[tokio::test]
async fn most_recent_session_of_the_root_wins_and_an_explicit_id_wins_over_it() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let mut agent = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        let a = agent.init(json!({"operation": "start_new", "title": "A"})).await;
        agent.think(1).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = agent.init(json!({"operation": "start_new", "title": "B"})).await;
        agent.think(1).await;
        let (a, b) = (structured(&a)["sessionId"].clone(), structured(&b)["sessionId"].clone());

        let mut fresh = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        let loaded = fresh.init(json!({"operation": "load_context"})).await;
        assert_eq!(structured(&loaded)["sessionId"], b, "most recent wins");
        let explicit = fresh.init(json!({"operation": "load_context", "sessionId": a})).await;
        assert_eq!(structured(&explicit)["sessionId"], a, "explicit sessionId wins");
        let state = fresh.init(json!({"operation": "get_state"})).await;
        assert_eq!(structured(&state)["sessionId"], a);
        assert_eq!(structured(&state)["boundRoot"], ROOT_X);
        // A session of another root, by explicit id, is allowed.
        let mut other = Agent::connect(&c, Some(roots(&[ROOT_Y]))).await;
        let cross = other.init(json!({"operation": "load_context", "sessionId": a})).await;
        assert_eq!(structured(&cross)["success"], true);
    }
}

#[tokio::test]
async fn no_session_for_the_root_suggests_start_new_and_no_roots_support_needs_an_id() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let mut agent = Agent::connect(&c, Some(roots(&[ROOT_Y]))).await;
        let none = agent.init(json!({"operation": "load_context"})).await;
        assert_eq!(structured(&none)["success"], false);
        assert_eq!(none["result"]["isError"], true);
        assert!(structured(&none)["message"].as_str().unwrap().contains("start_new"), "{none}");

        let mut rootless = Agent::connect(&c, None).await;
        let r = rootless.init(json!({"operation": "load_context"})).await;
        assert_eq!(structured(&r)["success"], false);
        assert!(structured(&r)["message"].as_str().unwrap().contains("sessionId"), "{r}");
        // Thoughts still work without roots; the session simply has no root.
        let t = rootless.think(1).await;
        assert_eq!(structured(&t)["thoughtHistoryLength"], 1);
        let state = rootless.init(json!({"operation": "get_state"})).await;
        assert_eq!(structured(&state)["boundRoot"], Value::Null);
        assert!(structured(&state)["sessionId"].is_string());
    }
}

#[tokio::test]
async fn several_roots_need_bind_root_which_only_accepts_listed_roots() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let mut agent = Agent::connect(&c, Some(roots(&[ROOT_X, ROOT_Y]))).await;
        let listed = agent.init(json!({"operation": "list_roots"})).await;
        assert_eq!(structured(&listed)["roots"].as_array().unwrap().len(), 2);
        assert_eq!(structured(&listed)["boundRoot"], Value::Null, "several roots: nothing bound automatically");
        let unbound = agent.init(json!({"operation": "load_context"})).await;
        assert!(structured(&unbound)["message"].as_str().unwrap().contains("bind_root"));
        let wrong = agent.init(json!({"operation": "bind_root", "rootUri": "file:///elsewhere"})).await;
        assert_eq!(wrong["result"]["isError"], true);
        let bound = agent.init(json!({"operation": "bind_root", "rootUri": ROOT_Y})).await;
        assert_eq!(structured(&bound)["boundRoot"], ROOT_Y);
        let started = agent.init(json!({"operation": "start_new"})).await;
        assert_eq!(structured(&started)["mcpRootUri"], ROOT_Y);
        // Thought auto-creation binds to the current root too.
        let mut other = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        other.think(1).await;
        let list = other.init(json!({"operation": "list_sessions", "rootUri": ROOT_X})).await;
        assert_eq!(structured(&list)["sessions"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn roots_list_changed_rebinds_through_the_standalone_stream() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize_with(json!({"roots": {"listChanged": true}})).await;
    let mut standalone = SseReader::new(c.get(&sid, None).send().await.unwrap());
    let _prime = standalone.next_event().await.unwrap();
    // After initialized the server asks on the standalone stream.
    let ask = standalone.next_event().await.unwrap().json();
    assert_eq!(ask["method"], "roots/list");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": roots(&[ROOT_X])}});
    assert_eq!(c.post(Some(&sid), &answer).send().await.unwrap().status(), 202);
    // The roots changed on the client.
    let changed = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
    assert_eq!(c.post(Some(&sid), &changed).send().await.unwrap().status(), 202);
    let ask = standalone.next_event().await.unwrap().json();
    assert_eq!(ask["method"], "roots/list");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": roots(&[ROOT_Y])}});
    assert_eq!(c.post(Some(&sid), &answer).send().await.unwrap().status(), 202);
    let mut bound = Value::Null;
    for n in 0..50 {
        let state = c.call(&sid, 10 + n, "init", json!({"operation": "get_state"})).await;
        bound = structured(&state)["boundRoot"].clone();
        if bound == ROOT_Y {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(bound, ROOT_Y, "the new single root is bound");
}

#[tokio::test]
async fn bound_root_and_current_session_survive_a_kill_and_restart() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let mut agent = Agent::connect(&c, Some(roots(&[ROOT_X, ROOT_Y]))).await;
    agent.init(json!({"operation": "bind_root", "rootUri": ROOT_Y})).await;
    let started = agent.init(json!({"operation": "start_new", "title": "survives"})).await;
    agent.think(1).await;
    let dir = server.crash();
    let server = TestServer::start_in(dir, Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    agent.c = Client::new(&server.url);
    let state = agent.init(json!({"operation": "get_state"})).await;
    assert_eq!(structured(&state)["boundRoot"], ROOT_Y);
    assert_eq!(structured(&state)["sessionId"], structured(&started)["sessionId"]);
    assert_eq!(structured(&state)["thoughtCount"], 1);
    assert_eq!(structured(&agent.think(2).await)["thoughtHistoryLength"], 2);
}

#[tokio::test]
async fn notebook_data_belongs_to_its_principal() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let path = dir.path().join("tokens");
    std::fs::write(&path, "alice-token-0123456789abcdef alice\nbob-token-0123456789abcdef00 bob\n").unwrap();
    let server =
        TestServer::start_with_auth(dir, Backend::Sqlite, AppKind::Notebook, quick_config(), Auth::from_file(&path).unwrap())
            .await;
    let alice = Client::with_token(&server.url, "alice-token-0123456789abcdef");
    let bob = Client::with_token(&server.url, "bob-token-0123456789abcdef00");
    let mut a = Agent::connect(&alice, Some(roots(&[ROOT_X]))).await;
    let started = a.init(json!({"operation": "start_new", "title": "secret plans"})).await;
    a.think(1).await;
    let id = structured(&started)["sessionId"].clone();

    let mut b = Agent::connect(&bob, Some(roots(&[ROOT_X]))).await;
    let listed = b.init(json!({"operation": "list_sessions"})).await;
    assert_eq!(structured(&listed)["sessions"], json!([]), "bob lists none of alice's sessions");
    let auto = b.init(json!({"operation": "load_context"})).await;
    assert_eq!(structured(&auto)["success"], false, "same root, other principal: nothing to recover");
    let explicit = b.init(json!({"operation": "load_context", "sessionId": id})).await;
    assert_eq!(structured(&explicit)["success"], false);
    let export = b.tool("session", json!({"operation": "export", "sessionId": id})).await;
    assert_eq!(export["result"]["isError"], true);
    let search = b.tool("session", json!({"operation": "search", "query": "thought"})).await;
    assert_eq!(structured(&search)["hits"], json!([]));
}

#[tokio::test]
async fn session_tool_lists_gets_searches_and_exports() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let mut agent = Agent::connect(&c, Some(roots(&[ROOT_X]))).await;
        agent.init(json!({"operation": "start_new", "title": "Export me", "tags": ["alpha"]})).await;
        agent
            .tool(
                "thought",
                json!({"thought": "The cache needs a TTL", "thoughtNumber": 1, "totalThoughts": 2, "nextThoughtNeeded": true}),
            )
            .await;
        agent
            .tool(
                "thought",
                json!({"thought": "Use 100% of 50_ms", "thoughtNumber": 2, "totalThoughts": 2, "nextThoughtNeeded": false}),
            )
            .await;
        let got = agent.tool("session", json!({"operation": "get"})).await;
        assert_eq!(structured(&got)["thoughts"].as_array().unwrap().len(), 2);
        let hits = agent.tool("session", json!({"operation": "search", "query": "cache"})).await;
        assert_eq!(structured(&hits)["hits"][0]["thought"], "The cache needs a TTL");
        let literal = agent.tool("session", json!({"operation": "search", "query": "100%"})).await;
        assert_eq!(structured(&literal)["hits"].as_array().unwrap().len(), 1, "% is matched literally");
        let tagged = agent.tool("session", json!({"operation": "list", "tag": "alpha"})).await;
        assert_eq!(structured(&tagged)["sessions"].as_array().unwrap().len(), 1);
        let md = agent.tool("session", json!({"operation": "export", "format": "markdown"})).await;
        let text = md["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("# Export me") && text.contains("The cache needs a TTL") && text.contains("Use 100% of 50_ms"));
        let js = agent.tool("session", json!({"operation": "export", "format": "json"})).await;
        let parsed: Value = serde_json::from_str(js["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(parsed["thoughts"][1]["thought"], "Use 100% of 50_ms");
    }
}

#[tokio::test]
async fn a_client_that_declares_roots_but_lists_none_is_told_what_to_do() {
    let server = TestServer::start(Backend::Memory, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let mut agent = Agent::connect(&c, Some(roots(&[]))).await;
    let loaded = agent.init(json!({"operation": "load_context"})).await;
    let s = structured(&loaded);
    assert_eq!(s["success"], false, "{loaded}");
    let message = s["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lists no roots") && message.contains("sessionId") && !message.contains("[]"),
        "an empty roots list gets advice, not `one of []`: {message}"
    );
}
