//! `[[policies]]` on resources and the audit log, against the real binary
//! with the stdio fixture (crates/tether-gateway) at `/mcp/fx`: a resource
//! rule holds for every spelling of the URIs it names (they are matched
//! normalised), and the audit log loses nothing silently: a removed file is
//! created again, a rotated one is reopened on SIGHUP, and a write that fails
//! is counted (`tether_audit_write_errors_total`, `tether_audit_dropped_total`)
//! and shown (`tether_audit_failing`, `/healthz`'s `audit`) until the file
//! is writable again.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// A generous deadline for what the server does on its own.
const DEADLINE: Duration = Duration::from_secs(30);

/// On `/mcp/fx`, `file:///secret/*` and `file:///private/*` (the second
/// written in capitals and with `localhost`) are refused to everyone; on
/// `/mcp/pub`, `file` URIs are allowed only under `/public/`. Neither covers
/// `fixture://` URIs.
const RULES: &str = r#"
[[policies]]
endpoint = "fx"
resources = ["file:///secret/*", "FILE://LOCALHOST/private/*"]
allow = "false"

[[policies]]
endpoint = "pub"
resources = ["file:*"]
allow = 'mcp.resource.uri.startsWith("file:///public/")'
"#;

struct Started {
    _tether: Tether,
    /// `/mcp/fx`.
    fx: Client,
    session: String,
    /// The server's base URL (`http://127.0.0.1:PORT`).
    base: String,
    pid: u32,
}

/// tether with [`RULES`] and the audit log at `audit` (the fixture at
/// `/mcp/fx` and `/mcp/pub`), and a session at `/mcp/fx`.
async fn start(dir: &Path, audit: &Path) -> Started {
    let config = dir.join("tether.toml");
    std::fs::write(&config, format!("audit_log = {:?}\n{RULES}", audit.display().to_string())).unwrap();
    let [fx, public] = ["fx", "pub"].map(|name| format!("{name}=stdio:python3 {}", fixture()));
    let args = ["--config", config.to_str().unwrap(), "--upstream", &fx, "--upstream", &public];
    let (tether, url) = Tether::start(&dir.join("t.db"), &args);
    let pid = tether.0.id();
    let base = url.trim_end_matches("/mcp").to_owned();
    let fx = Client::new(&format!("{base}/mcp/fx"));
    let session = fx.initialize().await;
    Started { _tether: tether, fx, session, base, pid }
}

/// `resources/read` of `uri` on `/mcp/fx`: the HTTP status and the JSON-RPC answer.
async fn read(s: &Started, id: u64, uri: &str) -> (u16, Value) {
    read_on(&s.fx, &s.session, id, uri).await
}

async fn read_on(client: &Client, session: &str, id: u64, uri: &str) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "resources/read", "params": {"uri": uri}});
    let response = client.post(Some(session), &body).send().await.unwrap();
    let status = response.status().as_u16();
    let answer = match response.headers().get("content-type").and_then(|v| v.to_str().ok()) {
        Some(t) if t.starts_with("text/event-stream") => {
            SseReader::new(response).all_events().await.last().map(SseEvent::json).unwrap_or(Value::Null)
        }
        _ => response.json().await.unwrap_or(Value::Null),
    };
    (status, answer)
}

/// A refused `resources/read` of `file:///secret/<name>`: one `deny` line.
async fn deny(s: &Started, id: u64, name: &str) {
    let (status, answer) = read(s, id, &format!("file:///secret/{name}")).await;
    assert_eq!(status, 403, "{answer}");
}

/// The JSON lines of `path` (none when it does not exist).
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The audited names of `path`'s lines.
fn names(path: &Path) -> Vec<String> {
    lines(path).iter().filter_map(|l| l["name"].as_str().map(str::to_owned)).collect()
}

/// Waits (polling, within [`DEADLINE`]) until `ready` holds.
async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One sample of `/metrics` (`0` when the series is absent).
async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

async fn healthz(base: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}/healthz")).await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn every_spelling_of_a_denied_resource_uri_is_refused_and_audited_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let s = start(dir.path(), &audit).await;

    let public = Client::new(&s.fx.url.replace("/mcp/fx", "/mcp/pub"));
    let public_session = public.initialize().await;

    // Allowed (also spelled otherwise) or not covered: the fixture answers with what it read.
    let allowed = [
        (&s.fx, &s.session, "file:///public/a"),
        (&s.fx, &s.session, "fixture://fx/%zz"),
        (&public, &public_session, "file:///public/a"),
        (&public, &public_session, "file://localhost/public/a"),
        (&public, &public_session, "FILE:/public/./a"),
    ];
    for (n, (client, session, uri)) in allowed.into_iter().enumerate() {
        let (status, answer) = read_on(client, session, n as u64, uri).await;
        assert_eq!(status, 200, "{uri}: {answer}");
        assert_eq!(answer["result"]["contents"][0]["uri"], uri, "{uri}: {answer}");
    }

    // On /mcp/fx: every spelling of a file under /secret/ or /private/.
    let secret = [
        "file:///secret/b",
        "file:////secret/b",
        "FILE:///secret/b",
        "file://localhost/secret/b",
        "file://LocalHost/secret/b",
        "file:/secret/b",
        "file:///%73ecret/b",
        "file:///%73%65cret/b",
        "file:///./secret/b",
        "file:///public/../secret/b",
        "file:///public/%2e%2E/secret/b",
        "file:///secret//b",
        // The rule is written `FILE://LOCALHOST/private/*`.
        "file:///private/key",
        // Cannot be normalised safely: refused, since the rule covers `file`.
        "file:///public/..%2Fsecret/b",
        "file:///public/..%2fsecret/b",
        "file:///public/..%5Csecret/b",
        "file:///public\\..\\secret\\b",
        "file:///secret/b%00",
        "file:///secret/%zz",
        "file:///secret/%4",
        "file:///../secret/b",
        "file:///public/../../secret/b",
        "file://evil/secret/b",
        "file://user@localhost/secret/b",
        "file:secret/b",
        "file:///public/a?/../../secret/b",
        "file:///public/a#/../../secret/b",
        "file:///secret/b\n",
    ];
    // On /mcp/pub: out of /public/ once normalised (the expression sees the normalised URI).
    let outside = [
        "file:///public/../etc/passwd",
        "file:///public/./../etc/passwd",
        "file:///public/%2e%2e/etc/passwd",
        "file://localhost/public/../etc/passwd",
        "file:///public/..%2Fetc/passwd",
        "file:///public/a?/../../etc/passwd",
    ];
    let refused =
        secret.iter().map(|uri| (&s.fx, &s.session, uri)).chain(outside.iter().map(|uri| (&public, &public_session, uri)));
    for (n, (client, session, uri)) in refused.enumerate() {
        let (status, answer) = read_on(client, session, 100 + n as u64, uri).await;
        assert_eq!(status, 403, "{uri:?} must be refused: {answer}");
        assert!(answer.get("result").is_none(), "{uri:?}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("policy refuses"), "{uri:?}: {answer}");
    }
    // resources/subscribe is decided the same way.
    let subscribe = json!({"jsonrpc": "2.0", "id": 99, "method": "resources/subscribe", "params": {"uri": "file:////secret/b"}});
    assert_eq!(s.fx.post(Some(&s.session), &subscribe).send().await.unwrap().status(), 403);

    // Every refusal is audited under the URI as it was sent.
    let all = secret.len() + outside.len() + 1;
    wait_until("every refusal is in the audit log", || lines(&audit).iter().filter(|l| l["decision"] == "deny").count() >= all)
        .await;
    let denied: Vec<Value> = lines(&audit).into_iter().filter(|l| l["decision"] == "deny").collect();
    for uri in secret.iter().chain(&outside) {
        assert!(denied.iter().any(|l| l["name"] == *uri && l["method"] == "resources/read"), "{uri:?} not audited: {denied:?}");
    }
    let unsafe_line = denied.iter().find(|l| l["name"] == "file:///public/..%2Fsecret/b").unwrap();
    assert!(unsafe_line["rule"].as_str().unwrap().contains("cannot be normalised"), "{unsafe_line}");
}

#[tokio::test]
async fn a_removed_audit_log_is_created_again_and_the_next_decisions_land_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("logs/audit.jsonl");
    let s = start(dir.path(), &audit).await;
    deny(&s, 1, "before").await;
    wait_until("the first decision is written", || names(&audit).contains(&"file:///secret/before".to_owned())).await;

    std::fs::remove_file(&audit).unwrap();
    // Decisions go on; within a second or so the file is there again with them.
    let mut n = 100;
    let deadline = Instant::now() + DEADLINE;
    loop {
        n += 1;
        deny(&s, n, &format!("after-{n}")).await;
        if names(&audit).iter().any(|name| name.starts_with("file:///secret/after-")) {
            break;
        }
        assert!(Instant::now() < deadline, "no decision ever lands in a new file at the path");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&audit).unwrap().permissions().mode() & 0o777, 0o600, "created private again");
    // From then on every decision lands there.
    deny(&s, 1000, "last").await;
    wait_until("the last decision is written", || names(&audit).contains(&"file:///secret/last".to_owned())).await;
    assert!(!names(&audit).contains(&"file:///secret/before".to_owned()), "a new file");
}

#[tokio::test]
async fn a_rotated_audit_log_is_reopened_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let rotated = dir.path().join("audit.jsonl.1");
    let s = start(dir.path(), &audit).await;
    deny(&s, 1, "before").await;
    wait_until("the first decision is written", || names(&audit).contains(&"file:///secret/before".to_owned())).await;

    // logrotate's way: rename, then SIGHUP; tether opens the path anew at once.
    std::fs::rename(&audit, &rotated).unwrap();
    let status = std::process::Command::new("kill").args(["-HUP", &s.pid.to_string()]).status().unwrap();
    assert!(status.success());
    wait_until("SIGHUP creates the file again", || audit.exists()).await;

    deny(&s, 2, "after").await;
    wait_until("the next decision is in the new file", || names(&audit).contains(&"file:///secret/after".to_owned())).await;
    assert_eq!(names(&rotated), ["file:///secret/before"], "the rotated file keeps what it had, and nothing more");
    assert_eq!(names(&audit), ["file:///secret/after"]);
}

#[tokio::test]
async fn a_failing_audit_log_is_counted_and_reported_until_it_is_writable_again() {
    let dir = tempfile::tempdir().unwrap();
    // A full disk: every write to /dev/full fails with ENOSPC.
    let audit: PathBuf = dir.path().join("audit.jsonl");
    std::os::unix::fs::symlink("/dev/full", &audit).unwrap();
    let s = start(dir.path(), &audit).await;
    let (status, health) = healthz(&s.base).await;
    assert_eq!((status, health["audit"].as_str()), (200, Some("ok")), "{health}");

    const LOST: u64 = 5;
    for n in 0..LOST {
        deny(&s, n, &format!("lost-{n}")).await;
    }
    let deadline = Instant::now() + DEADLINE;
    while metric(&s.base, "tether_audit_dropped_total").await < LOST as f64 {
        assert!(Instant::now() < deadline, "the lost decisions are never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&s.base, "tether_audit_dropped_total").await, LOST as f64, "each lost line counted once");
    assert!(metric(&s.base, "tether_audit_write_errors_total").await >= 1.0);
    assert_eq!(metric(&s.base, "tether_audit_failing").await, 1.0);
    let (status, health) = healthz(&s.base).await;
    assert_eq!(status, 200, "a failing audit log does not take the server out: {health}");
    assert_eq!(health["audit"], "failing", "{health}");

    // Room again (the path now a plain file): the next decisions are written, and it says so.
    std::fs::remove_file(&audit).unwrap();
    let mut n = 100;
    let deadline = Instant::now() + DEADLINE;
    loop {
        n += 1;
        deny(&s, n, &format!("kept-{n}")).await;
        if names(&audit).iter().any(|name| name.starts_with("file:///secret/kept-")) {
            break;
        }
        assert!(Instant::now() < deadline, "the audit log is never written again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(std::fs::symlink_metadata(&audit).unwrap().file_type().is_file());
    let deadline = Instant::now() + DEADLINE;
    while metric(&s.base, "tether_audit_failing").await != 0.0 {
        assert!(Instant::now() < deadline, "tether_audit_failing stays 1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(healthz(&s.base).await.1["audit"], "ok");
    assert!(!names(&audit).iter().any(|name| name.contains("lost-")), "what was lost is not made up");
}
