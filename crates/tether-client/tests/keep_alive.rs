//! POSTs to a plain `http://` server go on kept-alive connections
//! (`session/plain_http.rs`): one session's requests, one after another,
//! share one connection, even when the caller stops reading an SSE answer
//! before the server has ended it; and a redirect is still followed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_client::{ClientOptions, Session};
use tether_wire::headers::SESSION_ID;

/// The client ports POSTs came from: one per connection.
#[derive(Clone, Default)]
struct Peers(Arc<Mutex<BTreeSet<u16>>>);

async fn mcp(State(peers): State<Peers>, ConnectInfo(peer): ConnectInfo<SocketAddr>, body: Bytes) -> Response {
    peers.0.lock().insert(peer.port());
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match message["method"].as_str() {
        Some("initialize") => {
            let result = json!({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "keep-alive", "version": "0"}}});
            (StatusCode::OK, [("content-type", "application/json"), (SESSION_ID, "s1")], result.to_string()).into_response()
        }
        Some(m) if m.starts_with("notifications/") => StatusCode::ACCEPTED.into_response(),
        _ => {
            // The answer, then the end of the stream a little later: the
            // client has its answer (and drops the body) before the end.
            let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"echo": message["params"]}});
            let events = async_stream(format!("id: 1\ndata: \n\nevent: message\nid: 2\ndata: {answer}\n\n"));
            Response::builder().header("content-type", "text/event-stream").body(events).unwrap()
        }
    }
}

fn async_stream(first: String) -> Body {
    let chunks = futures::stream::unfold(Some(first), |state| async move {
        let chunk = state?;
        Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), None))
    })
    .chain(futures::stream::once(async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, std::io::Error>(Bytes::new())
    }));
    Body::from_stream(chunks)
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await });
    addr
}

fn initialize_params() -> Value {
    json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
}

#[tokio::test]
async fn one_sessions_requests_share_one_connection_even_when_answers_are_dropped_early() {
    let peers = Peers::default();
    let app = Router::new().route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED })).with_state(peers.clone());
    let addr = serve(app).await;
    let (session, _) =
        Session::connect(&format!("http://{addr}/mcp"), ClientOptions::default(), initialize_params()).await.unwrap();
    for n in 0..20 {
        let result = session.request("tools/call", Some(json!({"n": n}))).await.unwrap();
        assert_eq!(result["echo"]["n"], n);
    }
    let used = peers.0.lock().len();
    assert_eq!(used, 1, "initialize, initialized and 20 calls, one after another, on one connection (not {used})");
}

#[tokio::test]
async fn a_redirected_endpoint_is_still_followed() {
    let peers = Peers::default();
    let app = Router::new()
        .route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }))
        .route("/old", post(|| async { (StatusCode::TEMPORARY_REDIRECT, [("location", "/mcp")]) }))
        .with_state(peers.clone());
    let addr = serve(app).await;
    let (session, result) =
        Session::connect(&format!("http://{addr}/old"), ClientOptions::default(), initialize_params()).await.unwrap();
    assert_eq!(result["serverInfo"]["name"], "keep-alive");
    let answer = session.request("tools/call", Some(json!({"n": 7}))).await.unwrap();
    assert_eq!(answer["echo"]["n"], 7);
}

/// Serves `app` on `listener` until `stop` fires; then closes its idle
/// connections (graceful shutdown) and returns.
async fn serve_until(listener: tokio::net::TcpListener, app: Router, stop: tokio::sync::oneshot::Receiver<()>) {
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    let _ = axum::serve(listener, service).with_graceful_shutdown(async { drop(stop.await) }).await;
}

#[tokio::test]
async fn kept_connections_the_server_closed_while_idle_are_replaced_when_it_comes_back() {
    let peers = Peers::default();
    let app =
        || Router::new().route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED })).with_state(peers.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let first = tokio::spawn(serve_until(listener, app(), stopped));
    let (session, _) =
        Session::connect(&format!("http://{addr}/mcp"), ClientOptions::default(), initialize_params()).await.unwrap();
    assert_eq!(session.request("tools/call", Some(json!({"n": 1}))).await.unwrap()["echo"]["n"], 1);
    // The server goes away (closing the idle kept connection) and comes back
    // on the same address: the next call goes out on a new connection.
    stop.send(()).unwrap();
    first.await.unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_keep, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(serve_until(listener, app(), stopped));
    let answer = tokio::time::timeout(Duration::from_secs(10), session.request("tools/call", Some(json!({"n": 2}))))
        .await
        .expect("the call neither hangs on the closed connection")
        .expect("nor fails: it is sent again on a new one");
    assert_eq!(answer["echo"]["n"], 2);
}
