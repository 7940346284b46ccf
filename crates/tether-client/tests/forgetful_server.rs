//! A server that forgets every session at once (answers 404 to everything
//! but initialize): the pool initializes again once, retries once, and then
//! reports the failure instead of looping.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tether_client::{ClientError, Pool, PoolOptions, RequiresSession, ServerSpec};
use tether_wire::headers::SESSION_ID;

#[derive(Clone, Default)]
struct Counts {
    initialize: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

async fn mcp(State(counts): State<Counts>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match message["method"].as_str() {
        Some("initialize") => {
            let n = counts.initialize.fetch_add(1, Ordering::SeqCst);
            let result = json!({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "forgetful", "version": "0"}}});
            (StatusCode::OK, [("content-type", "application/json"), (SESSION_ID, &format!("s{n}"))], result.to_string())
                .into_response()
        }
        Some(m) if m.starts_with("notifications/") => StatusCode::ACCEPTED.into_response(),
        _ if headers.contains_key(SESSION_ID) => {
            counts.calls.fetch_add(1, Ordering::SeqCst);
            (StatusCode::NOT_FOUND, "Session not found").into_response()
        }
        _ => (StatusCode::BAD_REQUEST, "Bad Request: Mcp-Session-Id header is required").into_response(),
    }
}

#[tokio::test]
async fn a_second_404_after_reinitializing_is_reported() {
    let counts = Counts::default();
    let app = Router::new()
        .route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }).delete(|| async { StatusCode::OK }))
        .with_state(counts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let pool = Pool::new(PoolOptions::default());
    let server = ServerSpec::new(&url).requires_session(RequiresSession::Always);
    let result = pool.call_tool(&server, "anything", json!({}), None).await;
    assert!(matches!(result, Err(ClientError::SessionNotFound)), "the second failure is reported: {result:?}");
    assert_eq!(counts.initialize.load(Ordering::SeqCst), 2, "initialize again exactly once");
    assert_eq!(counts.calls.load(Ordering::SeqCst), 2, "the request is retried exactly once");
    pool.shutdown().await;
}
