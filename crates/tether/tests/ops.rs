//! Operating tether against the real binary: `/metrics` moves
//! with the work (and `--metrics-listen` moves it off the public listener),
//! `/readyz` is 503 during the drain, `--log-format json` writes one parsable
//! object per line and never a token, the admin API and `tether sessions`
//! (live through the API, stopped through the store), completions.

mod support;
// The Redis servers of a test's own, shared with the server crate's failover tests.
#[path = "../../tether-server/tests/support/redis_server.rs"]
mod redis_server;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use serde_json::{Value, json};
use support::*;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdefgh";
const ADMIN: &str = "admin-token-0123456789abcdef";

/// A running `tether serve` whose stderr goes to a file; killed when dropped.
struct Server {
    child: std::process::Child,
    log: PathBuf,
    url: String,
}

impl Server {
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = dir.join(format!("tether-{}.log", rand::random::<u32>()));
        let stderr = std::fs::File::create(&log).unwrap();
        let mut command = std::process::Command::new(binary());
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--store"])
            .arg(format!("sqlite:{}", dir.join("t.db").display()))
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("TETHER_JSON_RESPONSE")
            .env_remove("TETHER_AUTH_TOKENS")
            .stdout(std::process::Stdio::null())
            .stderr(stderr);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("tether binary runs");
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(url) = text.lines().find_map(|l| l.find("listening on http://").map(|i| &l[i + 13..])) {
                break url.split(|c: char| c.is_whitespace() || c == '"').next().unwrap().to_owned();
            }
            assert!(Instant::now() < deadline, "the server did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        };
        Self { child, log, url }
    }

    fn base(&self) -> String {
        self.url.strip_suffix("/mcp").unwrap().to_owned()
    }

    fn log(&self) -> String {
        let mut text = String::new();
        std::fs::File::open(&self.log).unwrap().read_to_string(&mut text).unwrap();
        text
    }

    fn sigterm(&self) {
        let status = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tokens(dir: &Path) -> String {
    let path = dir.join("tokens");
    std::fs::write(&path, format!("{ALICE} alice\n{BOB} bob\n")).unwrap();
    path.to_str().unwrap().to_owned()
}

async fn scrape(url: &str) -> String {
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r.text().await.unwrap()
}

/// The value of one sample line (`name{labels} value`), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_move_with_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--auth-tokens", &tokens(dir.path())], &[]);
    let metrics = format!("{}/metrics", server.base());
    let before = scrape(&metrics).await;
    for name in [
        "tether_sessions_live",
        "tether_sessions_stored",
        "tether_sse_connections",
        "tether_events_appended_total",
        "tether_events_replayed_total",
        "tether_store_commit_seconds",
        "tether_store_commit_batch_size",
        "tether_store_errors_total",
        "tether_auth_failures_total",
    ] {
        // (Labelled families appear with their first series; they are checked below and in the gateway test.)
        assert!(before.contains(&format!("# TYPE {name}")) || before.contains(name), "{name} missing:\n{before}");
    }
    assert_eq!(sample(&before, "tether_sessions_live"), 0.0);

    let c = Client::with_token(&server.url, ALICE);
    let sid = c.initialize().await;
    let after_init = scrape(&metrics).await;
    assert_eq!(sample(&after_init, "tether_sessions_live"), 1.0, "{after_init}");

    // A call raises tether_events_appended_total (and commits are measured).
    let events = c.request(&sid, 1, "tools/call", json!({"name": "thought", "arguments": thought_args(1)})).await;
    let after_call = scrape(&metrics).await;
    assert!(
        sample(&after_call, "tether_events_appended_total") > sample(&after_init, "tether_events_appended_total"),
        "{after_call}"
    );
    assert!(sample(&after_call, "tether_store_commit_seconds_count") > 0.0, "{after_call}");
    assert!(sample(&after_call, "tether_request_duration_seconds_count{method=\"tools/call\"}") >= 1.0, "{after_call}");
    assert!(sample(&after_call, "tether_http_requests_total{method=\"POST\",status=\"200\"}") >= 2.0, "{after_call}");

    // A replay (Last-Event-ID) raises tether_events_replayed_total.
    let prime = events.first().unwrap().id.clone().unwrap();
    let replayed = SseReader::new(c.get(&sid, Some(&prime)).send().await.unwrap()).all_events().await;
    assert!(replayed.iter().any(|e| e.data.contains("\"id\":1")), "the response replays");
    let after_replay = scrape(&metrics).await;
    assert!(
        sample(&after_replay, "tether_events_replayed_total") > sample(&after_call, "tether_events_replayed_total"),
        "{after_replay}"
    );

    // A bad token raises tether_auth_failures_total.
    let bad = Client::with_token(&server.url, "not-a-token-of-this-server");
    let r = bad.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let after_bad = scrape(&metrics).await;
    assert_eq!(sample(&after_bad, "tether_auth_failures_total"), sample(&after_replay, "tether_auth_failures_total") + 1.0);
    assert!(sample(&after_bad, "tether_http_requests_total{method=\"POST\",status=\"401\"}") >= 1.0);

    // Ending the session moves tether_sessions_live back.
    let r = c.http.delete(&server.url).header("mcp-session-id", &sid).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sample(&scrape(&metrics).await, "tether_sessions_live"), 0.0);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn metrics_listen_moves_metrics_off_the_public_listener_and_no_metrics_turns_them_off() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start(dir.path(), &["--metrics-listen", &addr], &[]);
    let public = reqwest::get(format!("{}/metrics", server.base())).await.unwrap();
    assert_eq!(public.status(), 404, "not on the public listener");
    let own = scrape(&format!("http://{addr}/metrics")).await;
    assert!(own.contains("tether_events_appended_total"), "{own}");
    drop(server);

    // As a config file key too.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("tether.toml");
    std::fs::write(&config, format!("metrics_listen = \"127.0.0.1:{port}\"\n")).unwrap();
    let server = Server::start(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    assert!(scrape(&format!("http://127.0.0.1:{port}/metrics")).await.contains("tether_sessions_live"));
    assert_eq!(reqwest::get(format!("{}/metrics", server.base())).await.unwrap().status(), 404);
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--no-metrics"], &[]);
    assert_eq!(reqwest::get(format!("{}/metrics", server.base())).await.unwrap().status(), 404);
}

#[tokio::test]
async fn the_metrics_listener_closes_a_connection_whose_head_never_finishes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _server = Server::start(dir.path(), &["--metrics-listen", &addr, "--header-timeout", "1s"], &[]);
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // Closed (read returns 0 or an error) well before this, never answered.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), half.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the half-open connection was still open after 20 s");
    assert!(buf.is_empty(), "no answer to a request that never finished: {:?}", String::from_utf8_lossy(&buf));
    // And the listener still serves whole requests.
    assert!(scrape(&format!("http://{addr}/metrics")).await.contains("tether_sessions_live"));
}

fn fixture() -> String {
    format!("{}/../tether-gateway/tests/fixtures/stdio_server.py", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn readyz_is_ready_then_503_while_draining_and_upstream_metrics_move() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = format!("echo=stdio:python3 {}", fixture());
    let mut server = Server::start(dir.path(), &["--upstream", &upstream, "--drain-timeout", "20s"], &[]);
    let readyz = format!("{}/readyz", server.base());
    let r = reqwest::get(&readyz).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "ready");

    let c = Client::new(&format!("{}/echo", server.url));
    let sid = c.initialize().await;
    let metrics = scrape(&format!("{}/metrics", server.base())).await;
    assert_eq!(sample(&metrics, "tether_upstream_processes{upstream=\"echo\"}"), 1.0, "{metrics}");
    assert_eq!(sample(&metrics, "tether_upstream_restarts_total{upstream=\"echo\"}"), 0.0, "{metrics}");
    // A child that dies is started again on the next call, and counted.
    let pid = c.call(&sid, 1, "pid", json!({})).await["result"]["structuredContent"]["pid"].as_i64().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&scrape(&format!("{}/metrics", server.base())).await, "tether_upstream_processes{upstream=\"echo\"}") != 0.0 {
        assert!(Instant::now() < deadline, "the dead child is not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = c.call(&sid, 3, "pid", json!({})).await;
    assert_ne!(again["result"]["structuredContent"]["pid"].as_i64(), Some(pid), "{again}");
    let metrics = scrape(&format!("{}/metrics", server.base())).await;
    assert_eq!(sample(&metrics, "tether_upstream_restarts_total{upstream=\"echo\"}"), 1.0, "{metrics}");
    assert_eq!(sample(&metrics, "tether_upstream_processes{upstream=\"echo\"}"), 1.0, "{metrics}");
    assert!(sample(&metrics, "tether_upstream_request_duration_seconds_count{upstream=\"echo\"}") >= 2.0, "{metrics}");
    let slow = {
        let (c, sid) = (Client::new(&c.url), sid.clone());
        tokio::spawn(async move { c.request(&sid, 2, "tools/call", json!({"name": "slow", "arguments": {"ms": 3000}})).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let terminated = Instant::now();
    server.sigterm();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = reqwest::get(&readyz).await.unwrap();
    assert_eq!(r.status(), 503, "draining");
    let body: Value = r.json().await.unwrap();
    assert!(body["reason"].as_str().unwrap().contains("draining"), "{body}");
    let health = reqwest::get(format!("{}/healthz", server.base())).await.unwrap();
    assert_eq!(health.status(), 200, "/healthz stays as it is: the process is alive");
    // The drain told the call's stream to reconnect, and waits for the call itself.
    let _ = tokio::time::timeout(Duration::from_secs(20), slow).await.expect("the stream ends");
    assert!(server.wait().success());
    assert!(terminated.elapsed() >= Duration::from_millis(2000), "the drain waited for the call in flight");
    let metrics_text = server.log();
    assert!(!metrics_text.contains("end as interrupted"), "the call finished within the drain: {metrics_text}");
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_and_hold_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("TETHER_TEST_ADMIN", ADMIN)];
    let args = ["--auth-tokens", &tokens(dir.path()), "--log-format", "json", "--admin-token-env", "TETHER_TEST_ADMIN"];
    let server = Server::start(dir.path(), &args, &env);
    let c = Client::with_token(&server.url, ALICE);
    let sid = c.initialize().await;
    c.call(&sid, 1, "thought", thought_args(1)).await;
    let bad = Client::with_token(&server.url, "wrong-token-0123456789abcdef");
    let _ = bad.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).send().await.unwrap();
    let admin = reqwest::Client::new();
    let r = admin.get(format!("{}/admin/sessions", server.base())).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = admin.delete(format!("{}/admin/sessions/{sid}", server.base())).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = server.log();
    let mut lines = 0;
    for line in log.lines() {
        let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(object.get(key).is_some(), "{key} missing: {line}");
        }
        lines += 1;
    }
    assert!(lines >= 3, "{log}");
    assert!(log.contains(&format!("\"session\":\"{sid}\"")), "fields such as session are keys: {log}");
    for token in [ALICE, BOB, ADMIN, "wrong-token-0123456789abcdef"] {
        assert!(!log.contains(token), "a token in the log: {log}");
    }
}

#[tokio::test]
async fn the_admin_api_lists_shows_and_ends_sessions_and_refuses_a_missing_or_wrong_token() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("TETHER_TEST_ADMIN", ADMIN)];
    let server =
        Server::start(dir.path(), &["--auth-tokens", &tokens(dir.path()), "--admin-token-env", "TETHER_TEST_ADMIN"], &env);
    let base = server.base();
    let alice = Client::with_token(&server.url, ALICE);
    let bob = Client::with_token(&server.url, BOB);
    let a = alice.initialize().await;
    let b = bob.initialize().await;
    alice.call(&a, 1, "thought", thought_args(1)).await;

    let http = reqwest::Client::new();
    let list = format!("{base}/admin/sessions");
    assert_eq!(http.get(&list).send().await.unwrap().status(), 401, "no token");
    assert_eq!(http.get(&list).bearer_auth("admin-token-0123456789abcdeX").send().await.unwrap().status(), 401, "wrong token");
    assert_eq!(http.get(&list).bearer_auth(ALICE).send().await.unwrap().status(), 401, "a user's token is not the admin's");
    assert_eq!(http.delete(format!("{list}/{a}")).send().await.unwrap().status(), 401);

    let all: Value = http.get(&list).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = all["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{all}");
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    let only: Value = http.get(format!("{list}?principal=bob")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(only["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(only["sessions"][0]["id"], b.as_str());
    let paged: Value = http.get(format!("{list}?limit=1")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(paged["sessions"].as_array().unwrap().len(), 1);
    let next = paged["next"].as_str().expect("a next page");
    let rest: Value =
        http.get(format!("{list}?limit=1&cursor={next}")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(rest["sessions"].as_array().unwrap().len(), 1);
    assert_ne!(rest["sessions"][0]["id"], paged["sessions"][0]["id"]);
    let idle: Value = http.get(format!("{list}?idle=1h")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(idle["sessions"].as_array().unwrap().len(), 0, "nobody idle for an hour: {idle}");
    let other: Value = http.get(format!("{list}?upstream=nope")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(other["sessions"].as_array().unwrap().len(), 0);

    // A resumable call (an operation, also a task) shows under its session.
    let export = json!({"operation": "export", "format": "json"});
    let exported = alice.call(&a, 2, "session", export).await;
    assert!(exported["result"].is_object(), "{exported}");
    let shown: Value = http.get(format!("{list}/{a}")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["principal"], "alice");
    assert!(shown["streams"].as_array().is_some(), "{shown}");
    assert!(shown["requests_in_flight"].as_array().is_some());
    let operations = shown["operations"].as_array().cloned().unwrap_or_default();
    assert_eq!(operations.len(), 1, "{shown}");
    assert_eq!(operations[0]["tool"], "session");
    assert_eq!(operations[0]["state"], "done", "{shown}");
    let shown_b: Value = http.get(format!("{list}/{b}")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown_b["operations"], json!([]), "another session's operations are not listed: {shown_b}");
    assert_eq!(http.get(format!("{list}/ffff")).bearer_auth(ADMIN).send().await.unwrap().status(), 404);

    // POST /admin/notify: notifications only, filtered, stored on the
    // standalone stream first (so a GET opened afterwards still gets it).
    let notify = format!("{base}/admin/notify");
    let message = json!({"method": "notifications/message", "params": {"level": "notice", "data": "maintenance at 22:00"}});
    assert_eq!(http.post(&notify).json(&message).send().await.unwrap().status(), 401, "no token");
    let request = json!({"method": "tools/list"});
    assert_eq!(http.post(&notify).bearer_auth(ADMIN).json(&request).send().await.unwrap().status(), 400, "not a notification");
    let sent: Value = http
        .post(format!("{notify}?principal=bob"))
        .bearer_auth(ADMIN)
        .json(&message)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sent, json!({"notified": 1, "failed": 0}));
    let mut standalone = SseReader::new(bob.get(&b, None).send().await.unwrap());
    let got = standalone.next_message().await.expect("the notification on bob's standalone stream");
    assert_eq!(got["method"], "notifications/message");
    assert_eq!(got["params"]["data"], "maintenance at 22:00");
    drop(standalone);

    let r = http.delete(format!("{list}/{a}")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = alice.post(Some(&a), &json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})).send().await.unwrap();
    assert_eq!(r.status(), 404, "the session ended as a client's DELETE would");
    let left: Value = http.get(&list).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(left["sessions"].as_array().unwrap().len(), 1);
    drop(server);

    // Off without the flag.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], &env);
    assert_eq!(http.get(format!("{}/admin/sessions", server.base())).bearer_auth(ADMIN).send().await.unwrap().status(), 404);
}

fn tether(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = std::process::Command::new(binary());
    command.args(args).env_remove("TETHER_STORE").env_remove("TETHER_ADMIN_TOKEN");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn tether_sessions_against_a_live_server_and_a_stopped_one() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("TETHER_TEST_ADMIN", ADMIN)];
    let mut server =
        Server::start(dir.path(), &["--auth-tokens", &tokens(dir.path()), "--admin-token-env", "TETHER_TEST_ADMIN"], &env);
    let url = server.url.clone();
    let alice = Client::with_token(&url, ALICE);
    let a = alice.initialize().await;
    let b = Client::with_token(&url, BOB).initialize().await;
    let admin = [("TETHER_ADMIN_TOKEN", ADMIN)];
    alice.call(&a, 1, "thought", thought_args(1)).await;
    alice.call(&a, 2, "session", json!({"operation": "export", "format": "json"})).await;

    let (ok, out, err) = tether(&["sessions", "list", "--url", &url, "--json"], &admin);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2, "{out}");
    let (ok, out, err) = tether(&["sessions", "list", "--url", &url], &admin);
    assert!(ok, "{err}");
    assert!(out.starts_with("ID") && out.contains(&a) && out.contains("alice") && out.contains("(2 sessions)"), "{out}");
    let (ok, out, err) = tether(&["sessions", "show", &a, "--url", &url], &admin);
    assert!(ok, "{err}");
    assert!(out.contains("principal   alice"), "{out}");
    let (ok, _, err) = tether(&["sessions", "list", "--url", &url], &[("TETHER_ADMIN_TOKEN", "wrong-admin-token-0123456789")]);
    assert!(!ok && err.contains("refused the admin token"), "{err}");
    let (ok, out, err) = tether(&["sessions", "delete", &b, "--url", &url], &admin);
    assert!(ok && out.contains("ended"), "{out}{err}");

    // The store of a running server is refused, clearly.
    let store = format!("sqlite:{}", dir.path().join("t.db").display());
    let (ok, _, err) = tether(&["sessions", "list", "--store", &store], &[]);
    assert!(!ok && err.contains("held by a running tether server"), "{err}");

    server.sigterm();
    assert!(server.wait().success());
    let (ok, out, err) = tether(&["sessions", "list", "--store", &store, "--json"], &[]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<&str> = listed["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [a.as_str()], "{out}");
    let (ok, out, err) = tether(&["sessions", "show", &a, "--store", &store], &[]);
    assert!(ok && out.contains("alice"), "{out}{err}");
    assert!(out.contains("operations  1") && out.contains("  session  done"), "the stopped store's operations: {out}");
    let (ok, _, err) = tether(&["sessions", "delete", &a, "--store", &store], &[]);
    assert!(ok, "{err}");
    let (ok, out, _) = tether(&["sessions", "list", "--store", &store], &[]);
    assert!(ok && out.contains("(0 sessions)"), "{out}");
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, err) = tether(&["completions", shell], &[]);
        assert!(ok, "{err}");
        assert!(out.contains("tether") && out.contains("sessions") && out.contains("metrics-listen"), "{shell}: {out}");
    }
    let (ok, _, _) = tether(&["completions", "powershell-not"], &[]);
    assert!(!ok);
}

#[tokio::test]
async fn sighup_adds_removes_and_keeps_upstreams_and_reloads_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    let tokens_file = dir.path().join("tokens");
    std::fs::write(&tokens_file, format!("{ALICE} alice\n")).unwrap();
    std::fs::write(&config, format!("auth_tokens = \"{}\"\n", tokens_file.display())).unwrap();
    let server = Server::start(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    let echo = Client::with_token(&format!("{}/echo", server.url), ALICE);
    let r = echo.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})).send().await.unwrap();
    assert_eq!(r.status(), 404, "no upstream yet");

    let hup = || {
        let status = std::process::Command::new("kill").args(["-HUP", &server.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    };
    let with_echo =
        format!("auth_tokens = \"{}\"\n\n[upstreams.echo]\ncommand = [\"python3\", \"{}\"]\n", tokens_file.display(), fixture());
    std::fs::write(&config, &with_echo).unwrap();
    std::fs::write(&tokens_file, format!("{ALICE} alice\n{BOB} bob\n")).unwrap();
    hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("upstream added") {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sid = echo.initialize().await;
    let echoed = echo.call(&sid, 1, "echo", json!({"x": 1})).await;
    assert_eq!(echoed["result"]["structuredContent"], json!({"x": 1}), "{echoed}");
    let bob = Client::with_token(&server.url, BOB);
    bob.initialize().await;

    // A broken file keeps what is in force.
    std::fs::write(&config, "auth_tokens = \"x\"\n[upstreams.echo]\nnonsense = 1\n").unwrap();
    hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("upstreams NOT reloaded") {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(echo.call(&sid, 2, "echo", json!({"y": 2})).await["result"]["structuredContent"], json!({"y": 2}));

    // Removed: the endpoint and its sessions answer 404.
    std::fs::write(&config, format!("auth_tokens = \"{}\"\n", tokens_file.display())).unwrap();
    hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("upstream removed") {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = echo.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn the_config_file_sets_the_listen_address_and_the_store_and_a_bad_key_fails_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let db = dir.path().join("from-config.db");
    let config = dir.path().join("tether.toml");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:{port}\"\nstore = \"sqlite:{}\"\nlog_format = \"json\"\n", db.display()),
    )
    .unwrap();
    let log = dir.path().join("log");
    let mut child = std::process::Command::new(binary())
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .env_remove("TETHER_LISTEN")
        .env_remove("TETHER_STORE")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("listening on") {
        assert!(Instant::now() < deadline, "{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await.unwrap();
    let body: Value = r.json().await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(body["store"], "sqlite", "the kind only, never the path: {body}");
    assert!(db.exists(), "the config's store");

    std::fs::write(&config, "listen = \"127.0.0.1:0\"\n\nlog_fromat = \"json\"\n").unwrap();
    let (ok, _, err) = tether(&["serve", "--config", config.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(err.contains(":3: unknown key `log_fromat`") && err.contains("log_format"), "{err}");
}

/// A primary and its replica (in `dir/primary` and `dir/replica`), both
/// syncing every write to their append-only files, once the replica is online.
fn primary_with_replica(dir: &std::path::Path) -> (RedisServer, RedisServer) {
    let primary = RedisServer::start(&dir.join("primary"), &[]);
    let port = primary.port.to_string();
    let replica = RedisServer::start(&dir.join("replica"), &["--replicaof", "127.0.0.1", &port]);
    primary.wait_for_replica();
    (primary, replica)
}

#[tokio::test]
async fn redis_persistence_is_stated_on_readyz_and_strict_refuses_a_redis_that_can_lose_writes() {
    let dir = tempfile::tempdir().unwrap();
    // No snapshots and no append-only file until the test turns it on.
    let redis = RedisServer::start(dir.path(), &["--appendonly", "no"]);

    // strict on a Redis without an append-only file: refused at start, saying what to change.
    let out = std::process::Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--durability", "strict", "--store", &redis.url()])
        .env_remove("TETHER_DURABILITY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("appendonly yes") && stderr.contains("appendfsync always"), "{stderr}");

    // normal: it serves, and /readyz says what can be lost.
    let (mut normal, url) = start_binary_on(&redis.url(), &dir.path().join("normal.log"), &[]);
    let ready: Value = reqwest::get(url.replace("/mcp", "/readyz")).await.unwrap().json().await.unwrap();
    let _ = normal.kill();
    let _ = normal.wait();
    assert_eq!(ready["store"], "redis");
    assert!(ready["durability"].as_str().unwrap().contains("appendonly no"), "{ready}");

    // With every write synced to its append-only file, strict serves.
    assert_eq!(redis.cli(&["config", "set", "appendonly", "yes"]), "OK");
    assert_eq!(redis.cli(&["config", "set", "appendfsync", "always"]), "OK");
    let (mut strict, url) = start_binary_on(&redis.url(), &dir.path().join("strict.log"), &["--durability", "strict"]);
    let ready: Value = reqwest::get(url.replace("/mcp", "/readyz")).await.unwrap().json().await.unwrap();
    let _ = strict.kill();
    let _ = strict.wait();
    assert!(ready["durability"].as_str().unwrap().contains("loses nothing acknowledged"), "{ready}");
}

#[tokio::test]
async fn strict_with_redis_replicas_acknowledges_only_what_a_replica_has() {
    let dir = tempfile::tempdir().unwrap();
    let (primary, replica) = primary_with_replica(dir.path());

    let (mut tether, url) =
        start_binary_on(&primary.url(), &dir.path().join("t.log"), &["--durability", "strict", "--redis-replicas", "1"]);
    let c = Client::new(&url);
    let sid = c.initialize().await;
    let called = c.call(&sid, 1, "thought", thought_args(1)).await;
    assert_eq!(called["result"]["structuredContent"]["thoughtNumber"], 1, "acknowledged once the replica has it");

    // The replica gone: a write reaches no replica in time, so it is not acknowledged.
    drop(replica);
    let call =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "thought", "arguments": thought_args(2)}});
    let refused = c.post(Some(&sid), &call).send().await.unwrap();
    let status = refused.status();
    let text = refused.text().await.unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("replica"), "says why: {text}");
    let _ = tether.kill();
    let _ = tether.wait();
}

/// The failover the strict promise is for, once: clients write thoughts
/// through tether on a Redis primary whose replica must have each write
/// (`--redis-replicas 1`); the replica falls behind (stopped), the primary is
/// killed with SIGKILL, the replica too, and comes back from its own
/// append-only file as the new primary; tether is started again on it:
/// every thought a client saw acknowledged is there (each session's next
/// thought counts them all). Without the wait this loses acknowledged thoughts.
#[tokio::test]
async fn a_redis_failover_under_strict_with_a_replica_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut primary, replica) = primary_with_replica(dir.path());
    let (mut before, url) =
        start_binary_on(&primary.url(), &dir.path().join("before.log"), &["--durability", "strict", "--redis-replicas", "1"]);

    // Clients call `thought` back to back; each counts what it saw acknowledged.
    let acked = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for _ in 0..6 {
        let c = Client::new(&url);
        let sid = c.initialize().await;
        let acked = acked.clone();
        clients.push(tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let call = json!({"jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
                    "params": {"name": "thought", "arguments": thought_args(n + 1)}});
                let ok = match c.post(Some(&sid), &call).timeout(Duration::from_secs(10)).send().await {
                    Ok(r) if r.status() == 200 => r.text().await.is_ok_and(|t| t.contains("thoughtHistoryLength")),
                    _ => false,
                };
                if !ok {
                    break;
                }
                n += 1;
            }
            acked.lock().push((sid, n));
        }));
    }
    // Some load; then the replica falls behind (stopped: a partition), and
    // the primary dies while writes go on. Without the wait for the replica
    // those writes would be acknowledged and then lost with the primary.
    let offset = |r: &RedisServer| {
        let info = r.cli(&["info", "replication"]);
        info.lines().find_map(|l| l.strip_prefix("master_repl_offset:")).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while offset(&primary) < 20_000 {
        assert!(Instant::now() < deadline, "no load reached the primary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replica.signal("-STOP");
    let stopped_at = offset(&primary);
    // Until the clients stop (their writes not acknowledged) or writes go on past the replica.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !clients.iter().all(|c| c.is_finished()) && offset(&primary) < stopped_at + 20_000 {
        assert!(Instant::now() < deadline, "neither refused nor written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    primary.kill();
    for client in clients {
        client.await.unwrap();
    }
    let _ = before.kill();
    let _ = before.wait();
    // The replica dies too before it read what was on its way (a partition
    // loses it), and comes back from its own append-only file as the new primary.
    drop(replica);
    let promoted = RedisServer::start(&dir.path().join("replica"), &[]);

    // tether follows it.
    let (mut after, url) = start_binary_on(&promoted.url(), &dir.path().join("after.log"), &["--durability", "strict"]);
    let c = Client::new(&url);
    let acked = acked.lock().clone();
    assert!(acked.iter().map(|(_, n)| n).sum::<u64>() > 0, "calls were acknowledged before the kill");
    for (sid, n) in &acked {
        let next = c.call(sid, 1000 + n, "thought", thought_args(n + 1)).await;
        let length = next["result"]["structuredContent"]["thoughtHistoryLength"].as_u64().unwrap_or(0);
        assert!(
            length > *n,
            "session {sid}: {n} thoughts were acknowledged, the replica has {}: {next}",
            length.saturating_sub(1)
        );
    }
    let _ = after.kill();
    let _ = after.wait();
}
