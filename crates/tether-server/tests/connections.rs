//! Slow and abandoned connections cannot hold the server: a head that never
//! completes, an idle keep-alive connection and a body that trickles are
//! cut after their timeouts, connections beyond the cap wait until one
//! closes, and SSE streams that get keep-alives outlive every timeout.
//! Real sockets against the real accept loop, with short timeouts.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use tether_server::EngineConfig;
use tether_server::http::HttpConfig;
use tether_store::StoreConfig;
use tether_store::memory::MemoryStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADER: Duration = Duration::from_millis(300);
const IDLE: Duration = Duration::from_millis(1500);
const BODY: Duration = Duration::from_millis(400);

fn config() -> HttpConfig {
    HttpConfig { header_timeout: HEADER, idle_timeout: IDLE, body_timeout: BODY, ..HttpConfig::default() }
}

async fn server(http: HttpConfig) -> std::net::SocketAddr {
    let engine = EngineConfig { keepalive: Duration::from_millis(100), ..EngineConfig::default() };
    serve_http(Arc::new(MemoryStore::new(StoreConfig::default())), engine, http).await.0
}

fn healthz(close: bool) -> String {
    let connection = if close { "close" } else { "keep-alive" };
    request("GET", "/healthz", &[("Connection", connection)], "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_half_a_head_is_closed_after_the_header_timeout() {
    let addr = server(config()).await;
    // The server's clock starts when it accepts, which may be before connect
    // returns here: start ours before, so it never runs ahead of the server's.
    let started = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: appl").await.unwrap();
    let seen = closed_by_server(&mut tcp).await;
    assert!(started.elapsed() >= HEADER, "closed before the header timeout");
    assert!(seen.is_empty(), "nothing is answered to half a head: {}", String::from_utf8_lossy(&seen));

    // A connection that sends nothing at all owes its head just the same.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    closed_by_server(&mut silent).await;

    // A head sent in time is served.
    assert_eq!(exchange(addr, &healthz(true)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_not_the_header_timeout() {
    let addr = server(config()).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(healthz(false).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.expect("first answer").status, 200);
    // Idle longer than the header timeout (but not the idle one): still open.
    tokio::time::sleep(HEADER + Duration::from_millis(200)).await;
    // The server's idle clock starts once it has written the answer, before we
    // read it: start ours before the request, so it never runs ahead.
    let idle_since = Instant::now();
    tcp.write_all(healthz(false).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut tcp).await.expect("second answer on the same connection").status, 200);
    let seen = closed_by_server(&mut tcp).await;
    assert!(idle_since.elapsed() >= IDLE, "closed before the idle timeout");
    assert!(seen.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_gets_408_and_the_connection_closes() {
    let addr = server(config()).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let body = initialize_body().to_string();
    let whole = post(&initialize_body(), None, &[]);
    // The head and a first piece of the body, then nothing more.
    let head_and_some = &whole[..whole.len() - body.len() + 10];
    let started = Instant::now();
    tcp.write_all(head_and_some.as_bytes()).await.unwrap();
    let response = read_response(&mut tcp).await.expect("an answer to the slow body");
    assert_eq!(response.status, 408, "{}", response.text());
    assert!(started.elapsed() >= BODY);
    assert!(response.text().contains("--body-timeout"), "{}", response.text());
    closed_by_server(&mut tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let addr = server(HttpConfig { max_connections: 2, idle_timeout: Duration::from_secs(30), ..config() }).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(healthz(false).as_bytes()).await.unwrap();
        assert_eq!(read_response(&mut tcp).await.expect("served under the cap").status, 200);
        held.push(tcp);
    }
    // The kernel completes the handshake (listen backlog); the server does not serve it.
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(healthz(true).as_bytes()).await.unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(800), third.read(&mut byte)).await;
    assert!(waited.is_err(), "the third connection was answered while two were held: {waited:?}");
    // Still waiting after longer than the header timeout: its clock starts when it is accepted.
    drop(held.pop());
    let response = read_response(&mut third).await.expect("served once a connection closed");
    assert_eq!(response.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_with_keep_alives_outlive_every_timeout() {
    let addr = server(config()).await;
    let session = initialize(addr).await;
    let longest = IDLE.max(HEADER).max(BODY) + Duration::from_millis(500);

    // The standalone GET stream.
    let mut get = TcpStream::connect(addr).await.unwrap();
    let headers = [("Accept", "text/event-stream"), ("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", PROTOCOL)];
    get.write_all(request("GET", "/mcp", &headers, "").as_bytes()).await.unwrap();
    let mut buffered = Vec::new();
    let (status, _) = read_head(&mut get, &mut buffered).await.expect("the stream's head");
    assert_eq!(status, 200);

    // A POST whose answer takes longer than every timeout streams keep-alives meanwhile.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let ms = u64::try_from(longest.as_millis()).unwrap();
    slow.write_all(post(&call_body(1, "sleep", json!({"ms": ms})), Some(&session), &[]).as_bytes()).await.unwrap();

    let deadline = Instant::now() + longest;
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), get.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => panic!("the standalone stream was closed after {:?}", deadline - longest),
            Ok(Ok(n)) => buffered.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&buffered).into_owned();
    assert!(text.lines().filter(|l| l.starts_with(':')).count() >= 2, "keep-alives on the stream: {text:?}");

    let answer = read_response(&mut slow).await.expect("the slow call's stream");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.message()["result"]["structuredContent"]["ms"], json!(ms), "{}", answer.text());
    assert!(answer.text().lines().any(|l| l.starts_with(':')), "keep-alives while it worked: {}", answer.text());
}
