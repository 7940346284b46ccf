//! The client runtime against servers built on the official MCP SDKs, on
//! loopback: Python (`MCPServer`) stateful Streamable HTTP, stateless
//! Streamable HTTP with JSON answers, the legacy HTTP+SSE transport, and a
//! TypeScript SDK server. Covers what users rely on: tools work on every
//! shape, `requires_session` auto/true/false, one `initialize` for many
//! parallel first calls, recovery after a server restart, DELETE on idle
//! and shutdown, the default `ping`/`roots/list` handlers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tether_client::{ClientError, ClientOptions, Pool, PoolOptions, Protocol, RequiresSession, ServerSpec, Session};
use tether_wire::{RpcError, code};

fn roots_pool() -> Pool {
    Pool::new(PoolOptions {
        roots: Arc::new(|| vec![json!({"uri": "file:///work/project", "name": "project"})]),
        ..PoolOptions::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_shape_lists_and_calls_tools_through_the_pool() {
    for shape in ALL_SHAPES {
        let server = Fixture::start(shape);
        let pool = roots_pool();
        let spec = ServerSpec::new(server.url()).protocol(Protocol::Session);
        let tools = pool.list_tools(&spec).await.unwrap_or_else(|e| panic!("{shape:?}: tools/list: {e}"));
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        for wanted in ["echo", "add", "fail"] {
            assert!(names.contains(&wanted), "{shape:?}: {names:?}");
        }
        let r = pool.call_tool(&spec, "echo", json!({"text": "héllo"}), None).await.unwrap();
        assert_eq!(text(&r), "héllo", "{shape:?}");
        let r = pool.call_tool(&spec, "add", json!({"a": 2, "b": 3}), None).await.unwrap();
        assert_eq!(sum_of(&r), 5, "{shape:?}");
        let r = pool.call_tool(&spec, "fail", json!({"message": "nope"}), None).await.unwrap();
        assert_eq!(r["isError"], true, "{shape:?}: a tool error is a result, not a transport error: {r}");

        match shape {
            Shape::PyStatelessJson => {
                assert_eq!(pool.session_id(&spec).await, None, "stateless: no session");
                assert_eq!(server.stat("initialize").await, 0, "stateless: no initialize at all");
            }
            Shape::PyLegacy => {
                // HTTP+SSE: the answers came over the event stream.
                assert!(server.stat("gets").await >= 1);
            }
            _ => {
                assert!(pool.session_id(&spec).await.is_some(), "{shape:?}: a session");
                assert_eq!(server.stat("initialize").await, 1, "{shape:?}: one initialize for all calls");
            }
        }
        if shape != Shape::PyStatelessJson {
            // The server asks roots/list; the pool's default handler answers.
            let r = pool.call_tool(&spec, "roots", json!({}), None).await.unwrap();
            assert!(text(&r).contains("file:///work/project"), "{shape:?}: {r}");
        }
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requires_session_auto_true_and_false_behave_as_configured() {
    let server = Fixture::start(Shape::PyStateful);

    // auto: one call without a session, refused; then initialize; then the session is kept.
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session);
    for i in 0..5 {
        let r = pool.call_tool(&spec, "echo", json!({"text": format!("n{i}")}), None).await.unwrap();
        assert_eq!(text(&r), format!("n{i}"));
    }
    assert_eq!(server.stat("sessionless_rejected").await, 1, "auto probes once");
    assert_eq!(server.stat("initialize").await, 1);
    pool.shutdown().await;

    // true: initialize first, no probe.
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Always);
    pool.call_tool(&spec, "echo", json!({"text": "x"}), None).await.unwrap();
    assert_eq!(server.stat("sessionless_rejected").await, 1, "no new probe");
    assert_eq!(server.stat("initialize").await, 2);
    pool.shutdown().await;

    // false: a server that insists is an error naming the setting.
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Never);
    let err = pool.call_tool(&spec, "echo", json!({"text": "x"}), None).await.unwrap_err();
    assert!(matches!(err, ClientError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("requires_session"), "{err}");
    assert_eq!(server.stat("initialize").await, 2, "false never initializes");

    // false against a stateless server just works, without initialize.
    let stateless = Fixture::start(Shape::PyStatelessJson);
    let spec = ServerSpec::new(stateless.url()).protocol(Protocol::Session).requires_session(RequiresSession::Never);
    let r = pool.call_tool(&spec, "add", json!({"a": 1, "b": 1}), None).await.unwrap();
    assert_eq!(sum_of(&r), 2);
    assert_eq!(stateless.stat("initialize").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_parallel_first_calls_make_exactly_one_initialize() {
    for (shape, mode) in
        [(Shape::PyStateful, RequiresSession::Auto), (Shape::Ts, RequiresSession::Auto), (Shape::Ts, RequiresSession::Always)]
    {
        let server = Fixture::start(shape);
        let pool = Pool::default();
        let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(mode);
        let calls = (0..100).map(|i| {
            let pool = pool.clone();
            let spec = spec.clone();
            tokio::spawn(async move { pool.call_tool(&spec, "echo", json!({"text": format!("call {i}")}), None).await })
        });
        let results = futures::future::join_all(calls).await;
        for (i, r) in results.into_iter().enumerate() {
            let r = r.expect("task").unwrap_or_else(|e| panic!("{shape:?} {mode:?}: call {i}: {e}"));
            assert_eq!(text(&r), format!("call {i}"));
        }
        assert_eq!(server.stat("initialize").await, 1, "{shape:?} {mode:?}: exactly one initialize");
        if shape == Shape::PyStateful {
            assert_eq!(server.stat("sessionless_rejected").await, 1, "one caller probes, the others wait");
        }
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_recovers_through_a_new_initialize_after_a_server_restart() {
    for shape in [Shape::PyStateful, Shape::Ts, Shape::PyLegacy] {
        let mut server = Fixture::start(shape);
        let pool = Pool::default();
        let spec = ServerSpec::new(server.url()).protocol(Protocol::Session);
        let r = pool.call_tool(&spec, "echo", json!({"text": "before"}), None).await.unwrap();
        assert_eq!(text(&r), "before");
        let before = pool.session_id(&spec).await;
        if shape == Shape::PyLegacy {
            assert_eq!(server.stat("initialize_rejected").await, 1, "the first session probes Streamable HTTP once");
        }

        server.restart();
        if shape == Shape::PyLegacy {
            // The event stream of the old process is gone; give the reader a moment to see it.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let r = pool
            .call_tool(&spec, "echo", json!({"text": "after"}), None)
            .await
            .unwrap_or_else(|e| panic!("{shape:?}: the call after the restart failed: {e}"));
        assert_eq!(text(&r), "after", "{shape:?}");
        assert_eq!(server.stat("initialize").await, 1, "{shape:?}: the new process saw one initialize");
        if shape == Shape::PyLegacy {
            assert_eq!(server.stat("initialize_rejected").await, 0, "a server known to be legacy is not probed again");
        }
        if shape != Shape::PyLegacy {
            let after = pool.session_id(&spec).await;
            assert!(after.is_some() && after != before, "{shape:?}: a new session ({before:?} -> {after:?})");
        }
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_and_shutdown_send_delete() {
    for shape in [Shape::PyStateful, Shape::Ts] {
        let server = Fixture::start(shape);
        let pool = Pool::new(PoolOptions { idle_timeout: Duration::from_millis(300), ..PoolOptions::default() });
        let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Always);
        pool.call_tool(&spec, "echo", json!({"text": "x"}), None).await.unwrap();
        assert!(pool.session_id(&spec).await.is_some());
        let mut waited = Duration::ZERO;
        while server.stat("deletes").await == 0 && waited < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
        assert_eq!(server.stat("deletes").await, 1, "{shape:?}: the idle session was terminated");
        assert_eq!(pool.session_id(&spec).await, None);

        // The next call opens a new session; shutdown terminates it.
        pool.call_tool(&spec, "echo", json!({"text": "y"}), None).await.unwrap();
        assert_eq!(server.stat("initialize").await, 2);
        pool.shutdown().await;
        assert_eq!(server.stat("deletes").await, 2, "{shape:?}: shutdown terminated the session");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_errors_are_logged_not_raised() {
    let mut server = Fixture::start(Shape::PyStateful);
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Always);
    pool.call_tool(&spec, "echo", json!({"text": "x"}), None).await.unwrap();
    server.restart();
    // The new process does not know the session (404) — shutdown still completes quietly.
    tokio::time::timeout(Duration::from_secs(15), pool.shutdown()).await.expect("shutdown finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_used_directly_delivers_server_requests_and_answers_them() {
    for shape in [Shape::PyStateful, Shape::PyLegacy, Shape::Ts] {
        let server = Fixture::start(shape);
        let params = json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
            "clientInfo": {"name": "direct", "version": "0"}, "_meta": {"example.com/k": 1}});
        let (session, result) = Session::connect(&server.url(), ClientOptions::default(), params).await.unwrap();
        assert!(result["serverInfo"]["name"].is_string(), "{shape:?}: {result}");
        assert_eq!(session.is_legacy(), shape == Shape::PyLegacy);
        let mut incoming = session.take_incoming().expect("incoming once");
        assert!(session.take_incoming().is_none(), "incoming can be taken once");
        let answering = session.clone();
        let handler = tokio::spawn(async move {
            while let Some(m) = incoming.recv().await {
                if let tether_client::PeerMessage::Request { id, method, .. } = m {
                    assert_eq!(method, "roots/list");
                    answering.respond(id, Ok(json!({"roots": [{"uri": "file:///direct"}]}))).await.unwrap();
                }
            }
        });
        let r = session
            .request("tools/call", Some(json!({"name": "roots", "arguments": {}})))
            .await
            .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        assert!(text(&r).contains("file:///direct"), "{shape:?}: {r}");
        let err = session.request("no/such/method", None).await.unwrap_err();
        assert!(matches!(err, ClientError::Rpc(RpcError { code: code::METHOD_NOT_FOUND, .. })), "{shape:?}: {err:?}");
        session.close().await;
        handler.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_say_what_to_check() {
    let port = free_port();
    let pool = Pool::default();
    let spec = ServerSpec::new(format!("http://127.0.0.1:{port}/mcp")).protocol(Protocol::Session);
    let err = pool.call_tool(&spec, "echo", json!({}), None).await.unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    let err = Session::connect("not a url", ClientOptions::default(), Value::Null).await.err().expect("refused");
    assert!(matches!(err, ClientError::Config(_)), "{err:?}");
}
