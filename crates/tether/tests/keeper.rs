//! The keeper against the real binary: `tether serve` holds the listening
//! socket and the stdio upstreams' children while its engine (`tether
//! engine`) is killed, restarted or upgraded. Calls in flight end with
//! their real results, a child's own state lives on, no connection is
//! refused; when the keeper itself dies nothing it started lives on.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// A generous bound for any one wait on an event.
const DEADLINE: Duration = Duration::from_secs(60);

fn upstream_flag(name: &str) -> String {
    format!("{name}=stdio:python3 {}", fixture())
}

async fn initialized(c: &Client, client: &str) -> String {
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}});
    let (sid, _) = c.initialize_params(params).await;
    let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    assert_eq!(r.status(), 202);
    sid
}

/// The processes whose parent is `parent`, with their command lines.
fn children_of(parent: u32) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(rest) = stat.rsplit(')').next() else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") || fields.get(1).and_then(|p| p.parse::<u32>().ok()) != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args =
            cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        found.push((pid, args));
    }
    found
}

/// The keeper's engine: its child whose first argument is `engine`.
fn engine_of(keeper: u32) -> Option<u32> {
    children_of(keeper).into_iter().find(|(_, args)| args.get(1).map(String::as_str) == Some("engine")).map(|(pid, _)| pid)
}

/// Waits for an engine of `keeper` other than `not` (the one killed).
async fn next_engine(keeper: u32, not: Option<u32>) -> u32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = engine_of(keeper).filter(|pid| Some(*pid) != not) {
            return pid;
        }
        assert!(started.elapsed() < DEADLINE, "no new engine within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

async fn gone(pid: u32) {
    let started = Instant::now();
    while running(pid) {
        assert!(started.elapsed() < DEADLINE, "process {pid} still runs after {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

fn counter(response: &Value) -> (u32, u64, u64) {
    let s = structured(response);
    let pid = s["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    (pid, s["count"].as_u64().unwrap_or(0), s["initialized"].as_u64().unwrap_or(0))
}

#[tokio::test]
async fn a_killed_engine_leaves_the_sessions_child_to_the_next_one_same_process_same_state_no_new_initialize() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("state")]);
    let keeper = tether.0.id();
    let c = Client::new(&format!("{url}/state"));
    let sid = initialized(&c, "stateful").await;
    let (pid, count, inits) = counter(&c.call(&sid, 1, "counter", json!({})).await);
    assert_eq!((count, inits), (1, 1), "a new child, initialized once");
    let child = children_of(keeper).into_iter().find(|(p, _)| *p == pid);
    assert!(child.is_some(), "the child {pid} is the keeper's, not the engine's: {:?}", children_of(keeper));

    for round in 0..2u64 {
        let engine = engine_of(keeper).expect("the keeper runs an engine");
        kill(engine, "-KILL");
        let next = next_engine(keeper, Some(engine)).await;
        assert_ne!(next, engine);
        let (again, count, inits) = counter(&c.call(&sid, 2 + round, "counter", json!({})).await);
        assert_eq!(again, pid, "round {round}: the same child serves the session after the engine's death");
        assert_eq!((count, inits), (2 + round, 1), "round {round}: its count goes on, and it was initialized once");
    }
    assert!(log_of(&db).contains("took over the child the keeper kept"), "{}", log_of(&db));
}

#[tokio::test]
async fn what_a_kept_child_writes_just_before_its_answer_reaches_the_client_before_the_answer() {
    // A kept child's answer is handed to its request by the keeper socket's
    // reader itself, unless something of the child's waits before it: the
    // progress written back to back before each answer must come first.
    let dir = tempfile::tempdir().unwrap();
    let (_tether, url) = Tether::start(&dir.path().join("t.db"), &["--upstream", &upstream_flag("ticks")]);
    let c = Client::new(&format!("{url}/ticks"));
    let sid = initialized(&c, "order").await;
    for id in 1..=20u64 {
        let params = json!({"name": "ticks", "arguments": {"steps": 8, "ms": 0, "label": "t"}, "_meta": {"progressToken": id}});
        let seen: Vec<Value> = c.request(&sid, id, "tools/call", params).await.iter().map(SseEvent::json).collect();
        let last = seen.last().expect("an answer");
        assert_eq!(last["id"], json!(id), "call {id}: the answer is last: {seen:?}");
        assert_eq!(last["result"]["structuredContent"]["ticks"], json!(8), "call {id}: {last}");
        assert_eq!(progress_of(&seen), (1..=8).collect::<Vec<_>>(), "call {id}: every progress before the answer, in order");
    }
}

/// One client's call in a round of the chaos.
struct Call {
    sid: String,
    label: String,
    token: String,
    last_event: Option<String>,
    seen: Vec<Value>,
}

/// Reads the call's events until `enough` says stop or the stream ends.
async fn follow(call: &mut Call, stream: &mut SseReader, mut enough: impl FnMut(&[Value]) -> bool) {
    while !enough(&call.seen) {
        let Some(event) = stream.next_event().await else { return };
        if event.id.is_some() {
            call.last_event = event.id.clone();
        }
        if !event.data.is_empty() {
            call.seen.push(event.json());
        }
    }
}

fn progress_of(seen: &[Value]) -> Vec<u64> {
    seen.iter().filter(|m| m["method"] == "notifications/progress").filter_map(|m| m["params"]["progress"].as_u64()).collect()
}

fn answers(seen: &[Value], id: u64) -> Vec<&Value> {
    seen.iter().filter(|m| m.get("id") == Some(&json!(id)) && m.get("method").is_none()).collect()
}

/// Connects to `addr` in a loop until `stop`; counts refused connections.
fn connect_loop(
    addr: String,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    tried: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            match tokio::net::TcpStream::connect(&addr).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {}
            }
            tried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").split('/').next().unwrap().to_owned()
}

const STEPS: u64 = 6;

/// Starts a `ticks` call for every session; returns them with their streams
/// once each saw `progress` progress notifications.
async fn start_calls(c: &Client, sessions: &[String], round: u64, progress: usize) -> Vec<(Call, SseReader)> {
    let mut started = Vec::new();
    for (n, sid) in sessions.iter().enumerate() {
        let label = format!("c{n}-r{round}");
        let token = format!("t-{label}");
        let body = json!({"jsonrpc": "2.0", "id": round, "method": "tools/call", "params": {
            "name": "ticks", "arguments": {"steps": STEPS, "ms": 200, "label": label}, "_meta": {"progressToken": token}}});
        let response = c.post(Some(sid), &body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let call = Call { sid: sid.clone(), label, token, last_event: None, seen: Vec::new() };
        started.push((call, SseReader::new(response)));
    }
    for (call, stream) in started.iter_mut() {
        follow(call, stream, |seen| progress_of(seen).len() >= progress).await;
    }
    started
}

/// Follows each call (again, from its last event) until its answer; checks
/// it is its own, real, once, and its progress whole, in order, once.
async fn finish_calls(c: &Client, calls: Vec<Call>, round: u64) {
    for mut call in calls {
        let started = Instant::now();
        while answers(&call.seen, round).is_empty() {
            assert!(started.elapsed() < DEADLINE, "round {round}: {} got no answer: {:?}", call.label, call.seen);
            let Ok(response) = c.get(&call.sid, call.last_event.as_deref()).send().await else { continue };
            if response.status() != 200 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let mut stream = SseReader::new(response);
            follow(&mut call, &mut stream, |seen| !answers(seen, round).is_empty()).await;
        }
        let answered = answers(&call.seen, round);
        assert_eq!(answered.len(), 1, "round {round}: {} ends once: {:?}", call.label, call.seen);
        let result = &answered[0]["result"];
        assert!(answered[0].get("error").is_none(), "round {round}: {} ends with its real result: {}", call.label, answered[0]);
        assert_eq!(result["structuredContent"]["label"], json!(call.label), "round {round}: its own result: {result}");
        let tokens: Vec<&Value> =
            call.seen.iter().filter(|m| m["method"] == "notifications/progress").map(|m| &m["params"]["progressToken"]).collect();
        assert!(tokens.iter().all(|t| **t == json!(call.token)), "round {round}: only its own progress: {tokens:?}");
        assert_eq!(
            progress_of(&call.seen),
            (1..=STEPS).collect::<Vec<_>>(),
            "round {round}: {}'s progress, each once, in order",
            call.label
        );
    }
}

#[tokio::test]
async fn calls_through_a_stdio_upstream_end_with_their_real_results_across_five_engine_kills_and_no_connection_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("ticks")]);
    let keeper = tether.0.id();
    let c = Client::new(&format!("{url}/ticks"));
    let mut sessions = Vec::new();
    for n in 0..12 {
        sessions.push(initialized(&c, &format!("client-{n}")).await);
    }
    let (stop, refused, tried) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let connects = connect_loop(host_port(&url), stop.clone(), refused.clone(), tried.clone());
    let mut engine = engine_of(keeper).expect("an engine");
    for round in 0..5u64 {
        // Every call is running in the child (two progress seen) when the engine dies.
        let calls = start_calls(&c, &sessions, round, 2).await;
        kill(engine, "-KILL");
        engine = next_engine(keeper, Some(engine)).await;
        finish_calls(&c, calls.into_iter().map(|(call, _)| call).collect(), round).await;
    }
    stop.store(true, Ordering::Relaxed);
    connects.await.unwrap();
    let (refused, tried) = (refused.load(Ordering::Relaxed), tried.load(Ordering::Relaxed));
    println!("60 calls across 5 engine kills: each ended once with its own result; {tried} connects, {refused} refused");
    assert_eq!(refused, 0, "no connection refused while the engine restarted ({tried} tried)");
    assert!(!log_of(&db).contains("interrupted"), "no request ended interrupted");
}

#[tokio::test]
async fn an_upgrade_with_sigusr2_under_load_refuses_nothing_interrupts_nothing_and_runs_a_new_engine() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("ticks")]);
    let keeper = tether.0.id();
    let c = Client::new(&format!("{url}/ticks"));
    let mut sessions = Vec::new();
    for n in 0..6 {
        sessions.push(initialized(&c, &format!("client-{n}")).await);
    }
    let (stop, refused, tried) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let connects = connect_loop(host_port(&url), stop.clone(), refused.clone(), tried.clone());
    let engine = engine_of(keeper).expect("an engine");
    let calls = start_calls(&c, &sessions, 0, 1).await;
    kill(keeper, "-USR2");
    let upgraded = next_engine(keeper, Some(engine)).await;
    assert_ne!(upgraded, engine, "a new engine runs");
    finish_calls(&c, calls.into_iter().map(|(call, _)| call).collect(), 0).await;
    // And it serves: a call after the upgrade.
    let after = c.call(&sessions[0], 9, "echo", json!({"after": "upgrade"})).await;
    assert_eq!(structured(&after), &json!({"after": "upgrade"}), "{after}");
    stop.store(true, Ordering::Relaxed);
    connects.await.unwrap();
    assert_eq!(refused.load(Ordering::Relaxed), 0, "no connection refused during the upgrade");
    assert!(!running(engine), "the old engine is gone");
}

#[tokio::test]
async fn an_upgrade_to_a_binary_of_another_protocol_is_refused_and_the_engine_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    // The keeper runs from a copy, which an "upgrade" then replaces.
    let copy = dir.path().join("tether");
    std::fs::copy(binary(), &copy).unwrap();
    let (mut keeper_proc, url) = start_copy(&copy, &db);
    let keeper = keeper_proc.id();
    let engine = next_engine(keeper, None).await;
    std::fs::remove_file(&copy).unwrap();
    std::fs::write(&copy, "#!/bin/sh\necho 999\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    kill(keeper, "-USR2");
    let started = Instant::now();
    while !std::fs::read_to_string(copy.with_extension("log")).unwrap_or_default().contains("not upgrading") {
        assert!(started.elapsed() < DEADLINE, "the refusal is logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = Client::new(&format!("{url}/echo"));
    let sid = initialized(&c, "after-refusal").await;
    let echoed = c.call(&sid, 1, "echo", json!({"still": "serving"})).await;
    assert_eq!(structured(&echoed), &json!({"still": "serving"}));
    assert_eq!(engine_of(keeper), Some(engine), "the same engine serves");
    let _ = keeper_proc.kill();
    let _ = keeper_proc.wait();
}

/// Starts `tether serve` from the binary at `copy`, its log beside it (`.log`).
fn start_copy(copy: &std::path::Path, db: &std::path::Path) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let log = copy.with_extension("log");
    let mut child = std::process::Command::new(copy)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite:{}", db.with_extension("copy.db").display()))
        .args(["--upstream", &upstream_flag("echo")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(i) = line.find("http://") {
            break line[i..].split_whitespace().next().unwrap().to_owned();
        }
    };
    let mut file = std::fs::File::create(log).unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        for line in lines.map_while(Result::ok) {
            let _ = writeln!(file, "{line}");
        }
    });
    (child, url)
}

#[tokio::test]
async fn when_the_keeper_dies_nothing_it_started_lives_on_and_a_new_one_serves_the_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("state")]);
    let keeper = tether.0.id();
    let c = Client::new(&format!("{url}/state"));
    let sid = initialized(&c, "orphans").await;
    let (child, _, _) = counter(&c.call(&sid, 1, "counter", json!({})).await);
    let engine = engine_of(keeper).expect("an engine");
    tether.crash();
    gone(engine).await;
    gone(child).await;
    // The port is free.
    let addr = host_port(&url);
    let started = Instant::now();
    while std::net::TcpListener::bind(&addr).is_err() {
        assert!(started.elapsed() < DEADLINE, "{addr} is still taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("state")]);
    let c = Client::new(&format!("{url}/state"));
    let (pid, count, inits) = counter(&c.call(&sid, 2, "counter", json!({})).await);
    assert_ne!(pid, child, "a new child");
    assert_eq!((count, inits), (1, 1), "the session goes on with a new child, initialized as the client did");
}

#[tokio::test]
async fn the_sessionless_pools_and_a_virtual_servers_children_are_kept_across_an_engine_kill_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let member = |name: &str| {
        format!("[upstreams.{name}]\ncommand = [\"python3\", {:?}]\nenv = {{ FIXTURE_NAME = \"{name}\" }}\n", fixture())
    };
    let config = dir.path().join("tether.toml");
    std::fs::write(&config, format!("{}{}[servers.team]\nupstreams = [\"a\", \"b\"]\n", member("a"), member("b"))).unwrap();
    let (tether, url) = Tether::start(&db, &["--config", config.to_str().unwrap()]);
    let keeper = tether.0.id();
    let base = url.trim_end_matches("/mcp").to_owned();

    // A sessionless client of `a`: its principal's pooled child.
    let a = Client::new(&format!("{base}/mcp/a"));
    let pooled_count = |n: u64| sessionless_request(n, "tools/call", json!({"name": "counter", "arguments": {}}));
    let (_, first) = send_sessionless(&a, &pooled_count(1), Some("counter"), &[]).await;
    let (pooled, count, inits) = counter(&first);
    assert_eq!((count, inits), (1, 1), "{first}");
    // A session of the virtual server: each member's child.
    let team = Client::new(&format!("{base}/mcp/team"));
    let sid = initialized(&team, "team-client").await;
    let (member_b, count, _) = counter(&team.call(&sid, 1, "b__counter", json!({})).await);
    assert_eq!(count, 1);

    let engine = engine_of(keeper).expect("an engine");
    kill(engine, "-KILL");
    next_engine(keeper, Some(engine)).await;

    let (_, again) = send_sessionless(&a, &pooled_count(2), Some("counter"), &[]).await;
    assert_eq!(counter(&again), (pooled, 2, 1), "the pooled child is taken over, its count goes on: {again}");
    let (b_again, count, inits) = counter(&team.call(&sid, 2, "b__counter", json!({})).await);
    assert_eq!((b_again, count, inits), (member_b, 2, 1), "the member's child is the session's still");
}

#[tokio::test]
async fn the_admin_api_lists_the_kept_children_metrics_count_the_restarts_and_tether_upgrade_hands_over() {
    const ADMIN: &str = "an-admin-token-of-the-keeper-test";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (child, url) = start_binary_with_env(
        &format!("sqlite:{}", db.display()),
        &db.with_extension("log"),
        &["--upstream", &upstream_flag("state"), "--admin-token-env", "TETHER_TEST_ADMIN"],
        &[("TETHER_TEST_ADMIN", ADMIN)],
    );
    let tether = Tether(child);
    let keeper = tether.0.id();
    let base = url.trim_end_matches("/mcp").to_owned();
    let c = Client::new(&format!("{base}/mcp/state"));
    let sid = initialized(&c, "admin").await;
    let (pid, _, _) = counter(&c.call(&sid, 1, "counter", json!({})).await);
    let engine = engine_of(keeper).expect("an engine");
    kill(engine, "-KILL");
    let engine = next_engine(keeper, Some(engine)).await;
    let http = reqwest::Client::new();
    let admin = |path: &str| http.get(format!("{base}{path}")).bearer_auth(ADMIN);

    let refused = http.get(format!("{base}/admin/keeper")).send().await.unwrap();
    assert_eq!(refused.status(), 401, "the keeper's admin routes need the admin token");
    let status: Value = admin("/admin/keeper").send().await.unwrap().json().await.unwrap();
    assert_eq!(status["restarts"], 1, "{status}");
    assert_eq!(status["children_taken_over"], 1, "{status}");
    let kept = status["children"].as_array().expect("children");
    assert_eq!(kept.len(), 1, "{status}");
    assert_eq!(kept[0]["pid"], pid, "{status}");
    assert_eq!(kept[0]["label"], json!(format!("state/{sid}")), "{status}");

    let metrics = admin("/metrics").send().await.unwrap().text().await.unwrap();
    for line in ["tether_keeper_engine_restarts_total 1", "tether_keeper_children 1", "tether_keeper_children_taken_over 1"] {
        assert!(
            metrics.lines().any(|l| l == line),
            "/metrics has `{line}`:\n{}",
            metrics.lines().filter(|l| l.contains("keeper")).collect::<Vec<_>>().join("\n")
        );
    }

    // `tether upgrade` asks the keeper through the admin API.
    let out =
        std::process::Command::new(binary()).args(["upgrade", "--url", &url]).env("TETHER_ADMIN_TOKEN", ADMIN).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let upgraded = next_engine(keeper, Some(engine)).await;
    assert_ne!(upgraded, engine);
    let (again, count, inits) = counter(&c.call(&sid, 2, "counter", json!({})).await);
    assert_eq!((again, count, inits), (pid, 2, 1), "the child is the new engine's, as it was");
}

#[tokio::test]
async fn an_upgrade_whose_drain_runs_out_leaves_the_calls_to_the_new_engine_and_they_end_with_their_results() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    // A drain far shorter than the calls: they are left, not interrupted.
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("ticks"), "--drain-timeout", "200ms"]);
    let keeper = tether.0.id();
    let c = Client::new(&format!("{url}/ticks"));
    let mut sessions = Vec::new();
    for n in 0..3 {
        sessions.push(initialized(&c, &format!("client-{n}")).await);
    }
    let engine = engine_of(keeper).expect("an engine");
    let calls = start_calls(&c, &sessions, 0, 1).await;
    kill(keeper, "-USR2");
    next_engine(keeper, Some(engine)).await;
    finish_calls(&c, calls.into_iter().map(|(call, _)| call).collect(), 0).await;
    let log = log_of(&db);
    assert!(log.contains("the request is left to the next process"), "the drain ran out and left them:\n{log}");
    assert!(!log.contains("interrupted by a server restart"), "none ended interrupted");
}

#[tokio::test]
async fn with_no_keeper_tether_serve_is_one_process_and_its_children_are_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("state"), "--no-keeper"]);
    let server = tether.0.id();
    let c = Client::new(&format!("{url}/state"));
    let sid = initialized(&c, "one-process").await;
    let (pid, count, _) = counter(&c.call(&sid, 1, "counter", json!({})).await);
    assert_eq!(count, 1);
    assert_eq!(engine_of(server), None, "no engine process: {:?}", children_of(server));
    assert!(children_of(server).iter().any(|(p, _)| *p == pid), "the child is the server's own");
    // A crash ends the child with the process; the session carries on with a new one.
    tether.crash();
    gone(pid).await;
    let (_tether, url) = Tether::start(&db, &["--upstream", &upstream_flag("state"), "--no-keeper"]);
    let c = Client::new(&format!("{url}/state"));
    let (again, count, inits) = counter(&c.call(&sid, 2, "counter", json!({})).await);
    assert_ne!(again, pid);
    assert_eq!((count, inits), (1, 1), "a new child, initialized as the client initialized the session");
}
