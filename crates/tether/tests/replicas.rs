//! Several replicas on one Redis: any replica serves any request of any
//! session. Three in-process replicas on loopback ports share a prefix.
//! Every scenario runs on a single Redis (`single::`) and on a three-primary
//! Redis Cluster (`cluster::`, started by scripts/test).

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tether_server::EngineConfig;

fn config() -> EngineConfig {
    EngineConfig { replica_lease: Duration::from_millis(900), ..quick_config() }
}

async fn three(url: &str, app: AppKind) -> (TestServer, TestServer, TestServer) {
    let (url, prefix) = (url.to_owned(), fresh_prefix());
    (
        TestServer::start_replica(&url, &prefix, app, config()).await,
        TestServer::start_replica(&url, &prefix, app, config()).await,
        TestServer::start_replica(&url, &prefix, app, config()).await,
    )
}

async fn initialize_on_one_call_on_another_replay_and_listen_on_a_third(redis: String) {
    let (a, b, c) = three(&redis, AppKind::Test).await;
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let sid = ca.initialize().await;
    let events = cb.request(&sid, 1, "tools/call", json!({"name": "chatty", "arguments": {"steps": 3, "pause_ms": 5}})).await;
    assert_eq!(events.len(), 5);
    // Replay B's stream on C.
    let mut replay = SseReader::new(cc.get(&sid, events[0].id.as_deref()).send().await.unwrap());
    let replayed: Vec<_> = replay.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(replayed, events[1..].to_vec(), "a stream written on B replays on C");

    // C holds the standalone stream; A and B both raise session messages.
    let mut standalone = SseReader::new(cc.get(&sid, None).send().await.unwrap());
    let _prime = standalone.next_event().await.unwrap();
    for i in 0..10u64 {
        let on = if i % 2 == 0 { &ca } else { &cb };
        on.call(&sid, 10 + i, "announce", json!({})).await;
    }
    let mut ids = Vec::new();
    for _ in 0..10 {
        let e = standalone.next_event().await.expect("delivered live across replicas");
        assert_eq!(e.json()["method"], "notifications/tools/list_changed");
        ids.push(e.id.unwrap());
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 10, "no duplicates at the replay-to-live boundary");
    let next = standalone.next_block(Duration::from_millis(700)).await.unwrap();
    assert!(next.comment, "nothing extra: {next:?}");
}

async fn a_server_request_raised_on_one_replica_is_answered_through_another(redis: String) {
    let (a, b, c) = three(&redis, AppKind::Test).await;
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let sid = ca.initialize().await;
    let mut standalone = SseReader::new(cc.get(&sid, None).send().await.unwrap());
    let _prime = standalone.next_event().await.unwrap();
    // `ask` runs on A; its POST connection is dropped, so roots/list goes to the standalone log.
    let resp = ca
        .post(
            Some(&sid),
            &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "ask", "arguments": {"delay_ms": 300}}}),
        )
        .send()
        .await
        .unwrap();
    let mut post = SseReader::new(resp);
    let prime = post.next_event().await.unwrap();
    drop(post);
    // The client listens on C: A routes the request there.
    let request = standalone.next_message().await.unwrap();
    assert_eq!(request["method"], "roots/list", "raised on A, delivered on C's GET");
    let answer = json!({"jsonrpc": "2.0", "id": request["id"], "result": {"roots": [{"uri": "file:///replicated"}]}});
    assert_eq!(cb.post(Some(&sid), &answer).send().await.unwrap().status(), 202);
    let mut final_stream = SseReader::new(cc.get(&sid, prime.id.as_deref()).send().await.unwrap());
    let done = final_stream.all_events().await.into_iter().rfind(|e| !e.data.is_empty()).unwrap().json();
    assert_eq!(done["id"], 7);
    assert_eq!(done["result"]["structuredContent"]["roots"][0]["uri"], "file:///replicated", "A got the answer POSTed to B");
}

async fn a_get_on_one_replica_takes_over_the_standalone_stream_from_another(redis: String) {
    let (a, b, c) = three(&redis, AppKind::Test).await;
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let sid = ca.initialize().await;
    let mut old = SseReader::new(cb.get(&sid, None).send().await.unwrap());
    let _ = old.next_event().await.unwrap();
    let mut new = SseReader::new(cc.get(&sid, None).send().await.unwrap());
    let _ = new.next_event().await.unwrap();
    // Keep-alives may come meanwhile; the stream must end within the deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut ended = false;
    while std::time::Instant::now() < deadline {
        if old.next_block(Duration::from_secs(30)).await.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the GET on B is closed when one on C opens");
    ca.call(&sid, 1, "announce", json!({})).await;
    assert_eq!(new.next_message().await.unwrap()["method"], "notifications/tools/list_changed");
}

async fn the_notebook_follows_the_client_across_replicas(redis: String) {
    let (a, b, c) = three(&redis, AppKind::Notebook).await;
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let sid = ca.initialize_with(json!({"roots": {}})).await;
    let roots = json!([{"uri": "file:///proj"}]);
    let started = cb.call_with_roots(&sid, 1, "init", json!({"operation": "start_new", "title": "replicated"}), &roots).await;
    assert_eq!(structured(&started)["mcpRootUri"], "file:///proj");
    for (n, client) in [(1u64, &ca), (2, &cb), (3, &cc)] {
        let r = client.call_with_roots(&sid, 10 + n, "thought", thought_args(n), &roots).await;
        assert_eq!(structured(&r)["thoughtHistoryLength"], n, "one notebook session whichever replica answers");
    }
    let state = cc.call(&sid, 20, "init", json!({"operation": "get_state"})).await;
    assert_eq!(structured(&state)["boundRoot"], "file:///proj", "state set on B is seen on C");
    assert_eq!(structured(&state)["thoughtCount"], 3);
    // Another MCP session recovers it by root on any replica.
    let other = cc.initialize_with(json!({"roots": {}})).await;
    let loaded = ca.call_with_roots(&other, 1, "init", json!({"operation": "load_context"}), &roots).await;
    assert_eq!(structured(&loaded)["sessionId"], structured(&started)["sessionId"]);
}

async fn a_replica_killed_mid_stream_loses_nothing_committed(redis: String) {
    let (a, b, _c) = three(&redis, AppKind::Test).await;
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let sid = ca.initialize().await;
    let resp = ca
        .post(
            Some(&sid),
            &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "chatty", "arguments": {"steps": 50, "pause_ms": 40}}}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = SseReader::new(resp);
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(stream.next_event().await.unwrap());
    }
    a.crash(); // kill -9 of replica A, mid-stream
    drop(stream);
    // B replays what A committed and, once A's lease lapsed, ends the stream honestly.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut resumed = SseReader::new(cb.get(&sid, seen[0].id.as_deref()).send().await.unwrap());
    let events: Vec<_> = resumed.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(events[..3].to_vec(), seen[1..4].to_vec(), "what the client saw replays identically on B");
    let last = events.last().unwrap().json();
    assert_eq!(last["id"], 3);
    assert_eq!(last["error"]["code"], -32603, "interrupted, reported honestly: {last}");
    let steps = events.iter().filter(|e| e.json()["method"] == "notifications/message").count();
    assert!(steps >= 3, "every committed notification is there ({steps})");
    // The session carries on on B.
    assert_eq!(cb.request(&sid, 4, "ping", json!({})).await.len(), 2);
}

/// Each scenario above on a single Redis and on a Redis Cluster.
macro_rules! on_redis_and_cluster {
    ($($scenario:ident),* $(,)?) => {
        mod single {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                super::$scenario(super::redis_url()).await
            })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                super::$scenario(super::redis_cluster_url()).await
            })*
        }
    };
}

on_redis_and_cluster!(
    initialize_on_one_call_on_another_replay_and_listen_on_a_third,
    a_server_request_raised_on_one_replica_is_answered_through_another,
    a_get_on_one_replica_takes_over_the_standalone_stream_from_another,
    the_notebook_follows_the_client_across_replicas,
    a_replica_killed_mid_stream_loses_nothing_committed,
);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_redis(port: u16, dir: &std::path::Path) -> std::process::Child {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test says REDIS MISSING otherwise)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_means_503_with_a_reason_and_service_resumes_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut redis = start_redis(port, dir.path());
    let url = format!("redis://127.0.0.1:{port}/");
    let server = TestServer::start_replica(&url, &fresh_prefix(), AppKind::Notebook, config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    assert_eq!(c.call(&sid, 1, "thought", thought_args(1)).await["result"]["isError"], false);

    redis.kill().unwrap();
    redis.wait().unwrap();
    let resp = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("storage unavailable"), "{body}");
    let health = reqwest::get(format!("{}/healthz", server.base)).await.unwrap();
    assert_eq!(health.status(), 503);
    let health: Value = health.json().await.unwrap();
    assert!(health["reason"].as_str().unwrap().contains("redis"), "{health}");

    let mut redis = start_redis(port, dir.path());
    let mut healthy = false;
    for _ in 0..100 {
        if reqwest::get(format!("{}/healthz", server.base)).await.unwrap().status() == 200 {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healthy, "service resumes without restarting the replica");
    let r = c.call(&sid, 3, "thought", thought_args(2)).await;
    assert_eq!(structured(&r)["thoughtHistoryLength"], 2, "the session survived the Redis restart (AOF)");
    redis.kill().unwrap();
    redis.wait().unwrap();
}
