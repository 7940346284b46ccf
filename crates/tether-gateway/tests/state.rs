//! The gateway's durable state through the engine and a real child
//! (`fixtures/stdio_server.py`): a session stored in the layout before
//! versions is served by this build after a restart (its connection rebuilt
//! with the stored `initialize`, log level and subscriptions), and one
//! stored by a newer tether ends its request with an error saying so.
//! Time limits here only stop a hung test.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tether_client::{ClientError, ClientOptions, Session};
use tether_gateway::Gateway;
use tether_gateway::config::{CommandSpec, Target, UpstreamConfig};
use tether_server::http::{Auth, HttpConfig};
use tether_server::{Engine, EngineConfig};
use tether_store::memory::MemoryStore;
use tether_store::{Store, StoreConfig};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stdio_server.py");
const PROTOCOL: &str = "2025-06-18";

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

/// A tether process: the gateway of the fixture at `/mcp`, on `store`.
async fn serve(store: Arc<dyn Store>) -> (String, Engine) {
    let command = vec!["python3".to_owned(), "-u".to_owned(), FIXTURE.to_owned()];
    let gateway = Gateway::new(UpstreamConfig::new("fix".to_owned(), Target::Command(CommandSpec::new(command))));
    let engine = Engine::new(store, gateway, EngineConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
    let url = format!("http://{}/mcp", listener.local_addr().expect("its address"));
    let serving = engine.clone();
    tokio::spawn(async move {
        let _ =
            tether_server::http::serve(listener, serving, Auth::disabled(), HttpConfig::default(), std::future::pending()).await;
    });
    (url, engine)
}

/// Puts `app` in place of the app state the session stored.
async fn store_app_state(store: &Arc<dyn Store>, session: &str, app: Value) {
    let record = store.get_session(session, tether_store::now_ms()).await.expect("read").expect("the session");
    let mut state = record.state;
    state["app"] = app;
    let written = store.update_session_state(session, record.revision, &state).await.expect("write");
    assert!(written.is_some(), "nobody else writes the session meanwhile");
}

/// What the session's child read, by method.
async fn seen(client: &Session) -> Result<Vec<Value>, ClientError> {
    let result = client.request("tools/call", Some(json!({"name": "seen", "arguments": {}}))).await?;
    Ok(result["structuredContent"]["seen"].as_array().cloned().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stored_before_versions_is_rebuilt_and_one_of_a_newer_tether_is_refused_clearly() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreConfig::default()));
    let (url, first) = serve(store.clone()).await;
    let params = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "state-test", "version": "1"}});
    let (client, _) = within("initialize", Session::connect(&url, ClientOptions::default(), params)).await.expect("initialize");
    let session = client.session_id().expect("a session");
    within("a call", seen(&client)).await.expect("the first child answers");
    drop(client);
    within("shutdown", first.shutdown()).await;

    // What an earlier tether wrote for this session: the part of an
    // upstream alone as the object under `gateway`, no version.
    let stored_params = json!({"protocolVersion": PROTOCOL, "capabilities": {"roots": {}},
        "clientInfo": {"name": "the-stored-client", "version": "0.9"}});
    let previous = json!({"gateway": {"initialize": stored_params, "carryOn": null, "capabilities": {"tools": {}},
        "logLevel": "warning", "subscriptions": ["fixture://fix/info"]}});
    store_app_state(&store, &session, previous).await;

    // Another process: the next request rebuilds the connection from it.
    let (url, second) = serve(store.clone()).await;
    let client = within("attach", Session::attach(&url, ClientOptions::default(), &session, PROTOCOL)).await.expect("attach");
    let messages = within("a call after the restart", seen(&client)).await.expect("a new child, set up as stored");
    let methods: Vec<&str> = messages.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(
        methods[..5],
        ["initialize", "notifications/initialized", "logging/setLevel", "resources/subscribe", "tools/call"],
        "{messages:?}"
    );
    assert_eq!(messages[0]["params"]["clientInfo"]["name"], "the-stored-client");
    assert_eq!(messages[2]["params"], json!({"level": "warning"}));
    assert_eq!(messages[3]["params"], json!({"uri": "fixture://fix/info"}));
    // It is stored in this build's layout from the first change on.
    within("set the level", client.request("logging/setLevel", Some(json!({"level": "error"})))).await.expect("taken");
    let record = store.get_session(&session, tether_store::now_ms()).await.expect("read").expect("the session");
    let gateway = &record.state["app"]["gateway"];
    assert_eq!(gateway["version"], 2, "{gateway}");
    assert_eq!(gateway["upstream"]["logLevel"], "error");
    assert_eq!(gateway["upstream"]["initialize"]["clientInfo"]["name"], "the-stored-client");
    drop(client);
    within("shutdown", second.shutdown()).await;

    // A newer tether's state: refused, saying so; the session is left as it is.
    let newer = json!({"gateway": {"version": 99, "upstream": {"somethingNew": {}}}});
    store_app_state(&store, &session, newer.clone()).await;
    let (url, third) = serve(store.clone()).await;
    let client = within("attach", Session::attach(&url, ClientOptions::default(), &session, PROTOCOL)).await.expect("attach");
    let refused = within("a call on a newer state", seen(&client)).await.expect_err("refused");
    let ClientError::Rpc(error) = refused else { panic!("a JSON-RPC error, not {refused:?}") };
    assert!(
        error.message.contains("stored by a newer tether (gateway state version 99; this build reads up to 2)"),
        "{}",
        error.message
    );
    let record = store.get_session(&session, tether_store::now_ms()).await.expect("read").expect("the session");
    assert_eq!(record.state["app"], newer, "left for the newer tether");
    drop(client);
    within("shutdown", third.shutdown()).await;
}
