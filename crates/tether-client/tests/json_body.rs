//! A server that answers a request with a JSON body holding several
//! messages one after another (a notification, then the response), as some
//! servers write a streamed answer: the client delivers the notification
//! and returns the response.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tether_client::{ClientOptions, PeerMessage, Session};
use tokio::sync::mpsc;

async fn mcp(body: Bytes) -> Response {
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message["id"].clone();
    let json = [("content-type", "application/json")];
    match message["method"].as_str() {
        Some("initialize") => {
            let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "lines", "version": "0"}}});
            (StatusCode::OK, json, result.to_string()).into_response()
        }
        Some(m) if m.starts_with("notifications/") => StatusCode::ACCEPTED.into_response(),
        _ => {
            let progress =
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}});
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"content": []}});
            (StatusCode::OK, json, format!("{progress}\n{answer}\n")).into_response()
        }
    }
}

#[tokio::test]
async fn several_messages_in_one_json_body_are_each_taken() {
    let app = Router::new().route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (session, _) = Session::connect(
        &url,
        ClientOptions::default(),
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    )
    .await
    .unwrap();
    let (tx, mut rx) = mpsc::channel(8);
    session.deliver_to(Arc::new(tx)).await;
    let result = session.request("tools/call", Some(json!({"name": "x"}))).await.expect("the response after the notification");
    assert_eq!(result, json!({"content": []}));
    let delivered = rx.try_recv().expect("the notification was delivered before the answer returned");
    assert!(
        matches!(delivered, PeerMessage::Notification { ref method, .. } if method == "notifications/progress"),
        "{delivered:?}"
    );
}
