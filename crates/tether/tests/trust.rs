//! Trust boundaries: bearer tokens and principals, the session resume
//! handshake, and a corpus of bad input that must never produce a 5xx.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tether_server::http::Auth;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef00";

fn token_file(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, text).unwrap();
    path
}

async fn server_with_tokens(backend: Backend) -> TestServer {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let path = token_file(dir.path(), &format!("# test principals\n{ALICE} alice\n{BOB} bob\n"));
    let auth = Auth::from_file(&path).unwrap();
    TestServer::start_with_auth(dir, backend, AppKind::Notebook, quick_config(), auth).await
}

#[tokio::test]
async fn requests_need_a_valid_bearer_token_and_sessions_belong_to_their_principal() {
    for backend in BACKENDS {
        let server = server_with_tokens(backend).await;
        let anonymous = Client::new(&server.url);
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
        for client in [anonymous.clone(), Client::with_token(&server.url, "wrong-token-0123456789")] {
            let resp = client.post(None, &init).send().await.unwrap();
            assert_eq!(resp.status(), 401);
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
            let body: Value = resp.json().await.unwrap();
            assert!(body["error"]["message"].as_str().unwrap().contains("Bearer"));
        }
        let alice = Client::with_token(&server.url, ALICE);
        let bob = Client::with_token(&server.url, BOB);
        let sid = alice.initialize().await;
        assert_eq!(
            alice.call(&sid, 1, "thought", thought_args(1)).await["result"]["structuredContent"]["thoughtHistoryLength"],
            1
        );

        // Bob presenting Alice's session ID: exactly as if it did not exist.
        let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let as_bob = bob.post(Some(&sid), &ping).send().await.unwrap();
        let unknown = bob.post(Some("ffffffffffffffffffffffffffffffffffffffffffffffff"), &ping).send().await.unwrap();
        assert_eq!(as_bob.status(), 404);
        assert_eq!(unknown.status(), 404);
        assert_eq!(as_bob.text().await.unwrap(), unknown.text().await.unwrap(), "same body as an unknown session");
        assert_eq!(bob.get(&sid, None).send().await.unwrap().status(), 404);
        assert_eq!(bob.http.delete(&bob.url).header("mcp-session-id", &sid).send().await.unwrap().status(), 404);
        // Alice's session is untouched by Bob's attempts.
        assert_eq!(
            alice.call(&sid, 3, "thought", thought_args(2)).await["result"]["structuredContent"]["thoughtHistoryLength"],
            2
        );
        // Health needs no token.
        assert_eq!(reqwest::get(format!("{}/healthz", server.base)).await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn token_file_reload_swaps_tokens_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = token_file(dir.path(), &format!("{ALICE} alice\n"));
    let auth = Auth::from_file(&path).unwrap();
    let headers = |t: &str| {
        let mut h = axum::http::HeaderMap::new();
        h.insert("authorization", format!("Bearer {t}").parse().unwrap());
        h
    };
    assert_eq!(auth.principal(&headers(ALICE), "").await.unwrap(), "alice");
    // The scheme is case-insensitive (RFC 7235).
    for scheme in ["BEARER", "bearer", "BeArEr"] {
        let mut h = axum::http::HeaderMap::new();
        h.insert("authorization", format!("{scheme} {ALICE}").parse().unwrap());
        assert_eq!(auth.principal(&h, "").await.unwrap(), "alice", "{scheme}");
    }
    token_file(dir.path(), &format!("{BOB} bob\n"));
    assert_eq!(auth.reload().unwrap(), 1);
    assert!(auth.principal(&headers(ALICE), "").await.is_err(), "removed token stops working");
    assert_eq!(auth.principal(&headers(BOB), "").await.unwrap(), "bob");
    token_file(dir.path(), "garbage-without-principal\n");
    assert!(auth.reload().unwrap_err().contains("line 1"));
    assert_eq!(auth.principal(&headers(BOB), "").await.unwrap(), "bob", "a bad file keeps the old tokens");
}

#[tokio::test]
async fn sighup_reloads_the_token_file_of_the_running_binary() {
    let dir = tempfile::tempdir().unwrap();
    let path = token_file(dir.path(), &format!("{ALICE} alice\n"));
    let (mut child, url) = start_binary(&dir.path().join("t.db"), &["--auth-tokens", path.to_str().unwrap()]);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    assert_eq!(Client::with_token(&url, ALICE).post(None, &init).send().await.unwrap().status(), 200);
    assert_eq!(Client::with_token(&url, BOB).post(None, &init).send().await.unwrap().status(), 401);
    token_file(dir.path(), &format!("{BOB} bob\n"));
    let kill = std::process::Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let mut swapped = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let bob = Client::with_token(&url, BOB).post(None, &init).send().await.unwrap().status();
        let alice = Client::with_token(&url, ALICE).post(None, &init).send().await.unwrap().status();
        if bob == 200 && alice == 401 {
            swapped = true;
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(swapped, "after SIGHUP the new token works and the old one is refused");
}

fn init_params(token: Option<&str>, version: &str) -> Value {
    let mut params = json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "bridge", "version": "1"}});
    if let Some(t) = token {
        params["_meta"] = json!({"dev.tether/sessionResumeToken": t});
    }
    params
}

#[tokio::test]
async fn a_resume_token_reattaches_the_session_once_and_rotates() {
    for backend in BACKENDS {
        let server = server_with_tokens(backend).await;
        let alice = Client::with_token(&server.url, ALICE);
        let (sid, first) = alice.initialize_params(init_params(None, "2025-11-25")).await;
        let token1 =
            first["_meta"]["dev.tether/sessionResumeToken"].as_str().expect("every initialize carries a token").to_owned();
        assert!(!token1.contains(&sid) && !token1.contains("alice"), "token reveals nothing");
        alice.call(&sid, 1, "thought", thought_args(1)).await;

        let (resumed_sid, second) = alice.initialize_params(init_params(Some(&token1), "2025-06-18")).await;
        assert_eq!(resumed_sid, sid, "same Mcp-Session-Id");
        assert_eq!(second["_meta"]["dev.tether/resumed"], true);
        assert_eq!(second["protocolVersion"], "2025-06-18", "the new initialize params replace the stored ones");
        let token2 = second["_meta"]["dev.tether/sessionResumeToken"].as_str().unwrap().to_owned();
        assert_ne!(token2, token1, "rotation");
        // The notebook context survived: the thought count continues.
        let next = alice.call(&sid, 2, "thought", thought_args(2)).await;
        assert_eq!(next["result"]["structuredContent"]["thoughtHistoryLength"], 2);

        // The old token is spent.
        let (fresh_sid, refused) = alice.initialize_params(init_params(Some(&token1), "2025-11-25")).await;
        assert_ne!(fresh_sid, sid);
        assert_eq!(refused["_meta"]["dev.tether/resumed"], false);
        assert_eq!(refused["_meta"]["dev.tether/resumeRefused"], "used");
        assert!(refused["_meta"]["dev.tether/sessionResumeToken"].is_string(), "a fresh session gets its own token");

        // Tampered: every flipped character is refused.
        let mut tampered = token2.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'0' { b'1' } else { b'0' };
        let (_, t) = alice.initialize_params(init_params(Some(std::str::from_utf8(&tampered).unwrap()), "2025-11-25")).await;
        assert_eq!(t["_meta"]["dev.tether/resumeRefused"], "tampered");
        let (_, t) = alice.initialize_params(init_params(Some("not a token"), "2025-11-25")).await;
        assert_eq!(t["_meta"]["dev.tether/resumeRefused"], "tampered");

        // Foreign: Bob cannot take Alice's session, and trying does not spend the token.
        let bob = Client::with_token(&server.url, BOB);
        let (bob_sid, f) = bob.initialize_params(init_params(Some(&token2), "2025-11-25")).await;
        assert_ne!(bob_sid, sid);
        assert_eq!(f["_meta"]["dev.tether/resumeRefused"], "foreign");

        // Expired: the session was deleted.
        let (again_sid, third) = alice.initialize_params(init_params(Some(&token2), "2025-11-25")).await;
        assert_eq!(again_sid, sid, "Bob's attempt did not spend Alice's token");
        let token3 = third["_meta"]["dev.tether/sessionResumeToken"].as_str().unwrap().to_owned();
        assert_eq!(alice.http.delete(&alice.url).header("mcp-session-id", &sid).send().await.unwrap().status(), 200);
        let (_, e) = alice.initialize_params(init_params(Some(&token3), "2025-11-25")).await;
        assert_eq!(e["_meta"]["dev.tether/resumeRefused"], "expired");
    }
}

#[tokio::test]
async fn resume_tokens_survive_a_restart() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let (sid, first) = c.initialize_params(init_params(None, "2025-11-25")).await;
    let token = first["_meta"]["dev.tether/sessionResumeToken"].as_str().unwrap().to_owned();
    let dir = server.crash();
    let server = TestServer::start_in(dir, Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let (resumed, result) = c.initialize_params(init_params(Some(&token), "2025-11-25")).await;
    assert_eq!(resumed, sid);
    assert_eq!(result["_meta"]["dev.tether/resumed"], true, "the server key and token records are durable");
}

/// A corpus of hostile input: nothing answers 5xx, every request is answered,
/// and the server stays healthy.
#[tokio::test]
async fn hostile_input_never_gets_a_5xx_and_the_server_stays_healthy() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let deep_obj = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{}{}}}",
            "{\"a\":".repeat(3000),
            "}".repeat(3000) + "}"
        );
        let bodies: Vec<String> = vec![
            String::new(),
            " ".into(),
            "null".into(),
            "[]".into(),
            "{}".into(),
            "\"ping\"".into(),
            "12345".into(),
            deep,
            deep_obj,
            r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":-1,"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}"#.into(),
            format!(r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#, "x".repeat(10_000)),
            r#"{"jsonrpc":2,"id":1,"method":"ping"}"#.into(),
            r#"{"jsonrpc":"3.0","id":1,"method":"ping"}"#.into(),
            r#"{"id":1,"method":"ping"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":""}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"thought","arguments":[1,2]}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"thought","arguments":{"thought":{},"thoughtNumber":-1,"totalThoughts":1e99,"nextThoughtNeeded":"no"}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope"}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":7}}"#.into(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"deep":[1]}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"both"}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"error":"not an object"}"#.into(),
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}".into(),
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\u{0}ng\"}".into(),
        ];
        let mut n = 0u64;
        let mut send = |req: reqwest::RequestBuilder| {
            n += 1;
            let is_get = req.try_clone().and_then(|r| r.build().ok()).is_some_and(|r| r.method() == reqwest::Method::GET);
            let label = n;
            async move {
                let resp = req.send().await.unwrap_or_else(|e| panic!("case {label}: connection answered: {e}"));
                let status = resp.status().as_u16();
                assert!(status < 500, "case {label}: got {status}");
                // Drain answers to POSTs so request ids free up; a GET's stream stays open.
                if resp.headers().get("content-type").is_none_or(|v| v != "text/event-stream") || !is_get {
                    let _ = tokio::time::timeout(Duration::from_secs(2), resp.bytes()).await;
                }
            }
        };
        for body in &bodies {
            send(c.post(Some(&sid), &json!(null)).body(body.clone())).await;
            send(c.post(None, &json!(null)).body(body.clone())).await;
        }
        // Random byte flips of a valid request.
        let valid = json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "thought", "arguments": thought_args(1)}})
        .to_string()
        .into_bytes();
        let mut seed = 0x2545F4914F6CDD1Du64;
        for _ in 0..300 {
            let mut body = valid.clone();
            for _ in 0..3 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed as usize) % body.len();
                body[i] ^= 1 << (seed % 8);
            }
            send(c.post(Some(&sid), &json!(null)).body(body)).await;
        }
        // Odd headers.
        let odd_headers: Vec<(&str, &[u8])> = vec![
            ("mcp-session-id", b"\xff\xfe"),
            ("mcp-session-id", b"has space"),
            ("mcp-session-id", &[b'a'; 300]),
            ("mcp-protocol-version", b"\xe2\x98\x83"),
            ("last-event-id", b"\xe2\x98\x83"),
            ("content-type", b"application/json; charset=\xff"),
            ("accept", b"\xff"),
            ("origin", b"\xff://x"),
            ("authorization", b"Bearer \xff"),
        ];
        for (name, value) in odd_headers {
            let v = reqwest::header::HeaderValue::from_bytes(value).unwrap();
            send(
                c.post_raw(
                    &[("content-type", "application/json"), ("accept", ACCEPT_BOTH)],
                    r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.into(),
                )
                .header(name, v.clone()),
            )
            .await;
            send(c.http.get(&c.url).header("accept", "text/event-stream").header("mcp-session-id", sid.as_str()).header(name, v))
                .await;
        }
        for ct in ["text/plain", "application/xml", "multipart/form-data", "application/jsonx", ""] {
            send(c.post_raw(&[("content-type", ct), ("accept", ACCEPT_BOTH), ("mcp-session-id", &sid)], "{}".into())).await;
        }
        let health = reqwest::get(format!("{}/healthz", server.base)).await.unwrap();
        assert_eq!(health.status(), 200, "server healthy after {n} hostile requests");
        assert_eq!(c.call(&sid, 9999, "thought", thought_args(2)).await["result"]["isError"], false);
    }
}

#[test]
fn a_token_of_two_principals_and_an_admin_token_of_a_user_refuse_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |tokens: &std::path::Path, env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tether"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--auth-tokens", tokens.to_str().unwrap()])
            .arg("--store")
            .arg(format!("sqlite:{}", dir.path().join("t.db").display()))
            .stdin(std::process::Stdio::null());
        for (k, v) in env {
            cmd.arg("--admin-token-env").arg(k).env(k, v);
        }
        // A refused start exits at once; a started server would not exit.
        let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("tether started instead of refusing");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        (status, stderr)
    };
    let shared = token_file(dir.path(), &format!("{ALICE} alice\n{ALICE} bob\n"));
    let (status, stderr) = serve(&shared, &[]);
    assert!(!status.success());
    assert!(stderr.contains("already `alice`'s"), "{stderr}");

    let tokens = token_file(dir.path(), &format!("{ALICE} alice\n{BOB} bob\n"));
    let (status, stderr) = serve(&tokens, &[("TETHER_TEST_ADMIN", BOB)]);
    assert!(!status.success());
    assert!(stderr.contains("admin token is also a user's token"), "{stderr}");
}

#[tokio::test]
async fn a_resume_token_of_another_endpoint_is_refused_as_foreign_and_stays_good_where_it_belongs() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = format!("fx=stdio:python3 {}", fixture());
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &["--upstream", &upstream]);
    let c = Client::new(&url);
    let (sid, first) = c.initialize_params(init_params(None, "2025-11-25")).await;
    let token = first["_meta"]["dev.tether/sessionResumeToken"].as_str().unwrap().to_owned();

    // Presented on /mcp/fx: refused as foreign, and not spent.
    let fx = Client::new(&format!("{url}/fx"));
    let (fx_sid, refused) = fx.initialize_params(init_params(Some(&token), "2025-11-25")).await;
    assert_ne!(fx_sid, sid);
    assert_eq!(refused["_meta"]["dev.tether/resumed"], false, "{refused}");
    assert_eq!(refused["_meta"]["dev.tether/resumeRefused"], "foreign", "{refused}");

    // Presented where it belongs: the session, resumed.
    let (resumed, again) = c.initialize_params(init_params(Some(&token), "2025-11-25")).await;
    assert_eq!(resumed, sid);
    assert_eq!(again["_meta"]["dev.tether/resumed"], true, "{again}");
    let _ = server.kill();
}

#[tokio::test]
async fn every_route_answers_only_to_the_host_names_it_is_set_up_for() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &["--allowed-host", "mcp.example.com"]);
    let base = url.trim_end_matches("/mcp").to_owned();
    let port = base.rsplit(':').next().unwrap().to_owned();
    let http = reqwest::Client::new();
    let get = |path: &str, host: String| http.get(format!("{base}{path}")).header("host", host).send();
    for path in ["/healthz", "/readyz", "/metrics", "/console/", "/.well-known/oauth-protected-resource"] {
        // A rebinding page's name: refused before any route runs.
        let refused = get(path, format!("evil.example:{port}")).await.unwrap();
        assert_eq!(refused.status(), 421, "{path}");
    }
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let refused = Client::new(&url).post(None, &init).header("host", "evil.example").send().await.unwrap();
    assert_eq!(refused.status(), 421);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("--allowed-host"), "{body}");
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "mcp.example.com".to_owned()] {
        assert_eq!(get("/healthz", host.clone()).await.unwrap().status(), 200, "{host}");
    }
    let _ = server.kill();
}

/// A task is a sessionless `tools/call` of a task tool, with the Tasks extension declared.
fn task_call(id: u64, ms: u64) -> Value {
    let mut meta = sessionless_meta();
    meta[tether_wire::meta::CLIENT_CAPABILITIES] = json!({"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}});
    sessionless_request(id, "tools/call", json!({"name": "slow", "arguments": {"ms": ms}, "_meta": meta}))
}

#[tokio::test]
async fn one_principal_cannot_take_every_task_slot() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("{ALICE} alice\n{BOB} bob\n"));
    let config = dir.path().join("tether.toml");
    let toml = format!(
        "resume_wait = \"0s\"\nmax_tasks_per_principal = 1\n[upstreams.fx]\ncommand = [\"python3\", {:?}]\ntask_tools = [\"slow\"]\n",
        fixture()
    );
    std::fs::write(&config, toml).unwrap();
    let (mut server, url) = start_binary(
        &dir.path().join("t.db"),
        &["--auth-tokens", tokens.to_str().unwrap(), "--config", config.to_str().unwrap()],
    );
    let fx = format!("{url}/fx");
    let (alice, bob) = (Client::with_token(&fx, ALICE), Client::with_token(&fx, BOB));

    // Alice's first task runs; her second is refused before anything is stored, naming the limit.
    let (status, first) = send_sessionless(&alice, &task_call(1, 60_000), Some("slow"), &[]).await;
    assert_eq!((status, &first["result"]["resultType"]), (200, &json!("task")), "{first}");
    let task = first["result"]["taskId"].as_str().expect("a task id").to_owned();
    let refused = alice
        .post_raw(
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-protocol-version", SESSIONLESS),
                ("mcp-method", "tools/call"),
                ("mcp-name", "slow"),
            ],
            task_call(2, 10).to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("max_tasks_per_principal"), "{body}");
    assert_eq!(body["error"]["data"]["limit"], "max_tasks_per_principal", "{body}");

    // Bob is not held back by Alice.
    let (status, bobs) = send_sessionless(&bob, &task_call(3, 10), Some("slow"), &[]).await;
    assert_eq!((status, &bobs["result"]["resultType"]), (200, &json!("task")), "{bobs}");

    // Her task cancelled, her slot comes back.
    let mut meta = sessionless_meta();
    meta[tether_wire::meta::CLIENT_CAPABILITIES] = json!({"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}});
    let cancel = sessionless_request(4, "tasks/cancel", json!({"taskId": task, "_meta": meta}));
    let (status, cancelled) = send_sessionless(&alice, &cancel, Some(&task), &[]).await;
    assert_eq!(status, 200, "{cancelled}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, again) = send_sessionless(&alice, &task_call(5, 10), Some("slow"), &[]).await;
        if status == 200 {
            assert_eq!(again["result"]["resultType"], "task", "{again}");
            break;
        }
        assert_eq!(status, 429, "{again}");
        assert!(std::time::Instant::now() < deadline, "Alice's task slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = server.kill();
}

#[tokio::test]
async fn one_principal_cannot_take_every_sessionless_or_listen_slot() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), &format!("{ALICE} alice\n{BOB} bob\n"));
    let upstream = format!("fx=stdio:python3 {}", fixture());
    let (mut server, url) = start_binary(
        &dir.path().join("t.db"),
        &[
            "--auth-tokens",
            tokens.to_str().unwrap(),
            "--upstream",
            &upstream,
            "--max-sessionless-per-principal",
            "1",
            "--max-listen-per-principal",
            "1",
        ],
    );
    let fx = format!("{url}/fx");
    let (alice, bob) = (Client::with_token(&fx, ALICE), Client::with_token(&fx, BOB));
    let call = |id: u64, tool: &str, args: Value| sessionless_request(id, "tools/call", json!({"name": tool, "arguments": args}));

    // Alice's slow call holds her one slot: her next request gets 429 naming the limit.
    // (A probe may take the slot first and refuse the slow call: it is started again.)
    let start_slow = || {
        let alice = Client::with_token(&fx, ALICE);
        tokio::spawn(async move { send_sessionless(&alice, &call(1, "slow", json!({"ms": 60_000})), Some("slow"), &[]).await })
    };
    let mut slow = start_slow();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let r = alice
            .post_raw(
                &[
                    ("content-type", "application/json"),
                    ("accept", "application/json, text/event-stream"),
                    ("mcp-protocol-version", SESSIONLESS),
                    ("mcp-method", "tools/call"),
                    ("mcp-name", "echo"),
                ],
                call(2, "echo", json!({"x": 1})).to_string(),
            )
            .send()
            .await
            .unwrap();
        if r.status() == 429 && !slow.is_finished() {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "Alice's second request was never refused: {}", r.status());
        if slow.is_finished() {
            slow = start_slow();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("max_sessionless_requests_per_principal"), "{body}");
    // Bob is not held back by Alice.
    let (status, answer) = send_sessionless(&bob, &call(3, "echo", json!({"x": 2})), Some("echo"), &[]).await;
    assert_eq!(status, 200, "{answer}");
    // Her call gone, her slot comes back.
    slow.abort();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = send_sessionless(&alice, &call(4, "echo", json!({"x": 3})), Some("echo"), &[]).await;
        if status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "Alice's slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The same for listen streams.
    let listen = |c: &Client| {
        let params = json!({"notifications": {"toolsListChanged": true}, "_meta": sessionless_meta()});
        c.post_raw(
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-protocol-version", SESSIONLESS),
                ("mcp-method", "subscriptions/listen"),
            ],
            sessionless_request(9, "subscriptions/listen", params).to_string(),
        )
        .send()
    };
    let held = listen(&alice).await.unwrap();
    assert_eq!(held.status(), 200);
    let second = listen(&alice).await.unwrap();
    assert_eq!(second.status(), 429);
    assert!(second.text().await.unwrap().contains("max_listen_streams_per_principal"));
    assert_eq!(listen(&bob).await.unwrap().status(), 200, "Bob's own slot");
    drop(held);
    let _ = server.kill();
}
