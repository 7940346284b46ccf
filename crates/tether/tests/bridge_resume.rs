//! `tether bridge` end to end: this test process plays the desktop host. It
//! launches the real binary as a stdio MCP server in front of a real
//! `tether serve`, talks newline-delimited JSON-RPC to it, answers the
//! notebook's `roots/list`, and checks what the bridge leaves in its token
//! directory and says on stderr across restarts of the bridge and the server.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_bridge::identity::{HostIdentity, ProcessTable, SystemProcesses};
use tether_bridge::token_store::{is_valid_token, log_lines};

const WAIT: Duration = Duration::from_secs(30);
const ROOT: &str = "file:///work/bridge-project";

fn binary() -> String {
    std::env::var("TETHER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tether").to_owned())
}

/// `tether serve` on `listen` with `store`; its /mcp URL.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(store: &str, listen: &str) -> Server {
        let mut child = Command::new(binary())
            .args(["serve", "--listen", listen, "--store", store])
            .env("RUST_LOG", "info")
            .env_remove("TETHER_AUTH_TOKENS")
            .env_remove("TETHER_JSON_RESPONSE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tether serve starts");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let url = loop {
            let line = lines.next().expect("the server printed its address").expect("stderr readable");
            if let Some(i) = line.find("http://") {
                break line[i..].split_whitespace().next().unwrap_or_default().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Server { child, url }
    }

    fn sqlite(db: &Path) -> Server {
        Self::start(&format!("sqlite:{}", db.display()), "127.0.0.1:0")
    }

    /// `127.0.0.1:<port>` of this server, to restart another on the same port.
    fn listen_addr(&self) -> String {
        self.url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned()
    }

    /// `kill -9`.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `tether bridge` process with this test as its host.
struct Bridge {
    child: Child,
    stdin: Option<Arc<Mutex<ChildStdin>>>,
    messages: mpsc::Receiver<Value>,
    log: Arc<Mutex<Vec<String>>>,
    roots_asked: Arc<AtomicUsize>,
    next_id: u64,
}

impl Bridge {
    fn start(url: &str, token_dir: &Path, extra: &[&str]) -> Bridge {
        let mut command = Command::new(binary());
        command.args(["bridge", url, "--token-dir"]).arg(token_dir).args(extra);
        Self::spawn(command)
    }

    fn spawn(mut command: Command) -> Bridge {
        let mut child = command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("MCP_AUTH_TOKEN")
            .env_remove("TETHER_TOKEN_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tether bridge starts");
        let stdin = Arc::new(Mutex::new(child.stdin.take().expect("piped stdin")));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let log_writer = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("TETHER_TEST_DEBUG").is_some() {
                    eprintln!("bridge: {line}");
                }
                log_writer.lock().push(line);
            }
        });
        let (tx, messages) = mpsc::channel();
        let roots_asked = Arc::new(AtomicUsize::new(0));
        // Weak: closing stdin (dropping the last strong handle) must really close it.
        let (answer_to, asked) = (Arc::downgrade(&stdin), roots_asked.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let message: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout carries only JSON-RPC: {line:?}: {e}"));
                if message["method"] == "roots/list" {
                    // The host answers the remote's question, under the bridge's id.
                    asked.fetch_add(1, Ordering::SeqCst);
                    let answer =
                        json!({"jsonrpc": "2.0", "id": message["id"], "result": {"roots": [{"uri": ROOT, "name": "project"}]}});
                    if let Some(stdin) = answer_to.upgrade() {
                        let mut stdin = stdin.lock();
                        let _ = writeln!(stdin, "{answer}");
                        let _ = stdin.flush();
                    }
                } else if tx.send(message).is_err() {
                    return;
                }
            }
        });
        Bridge { child, stdin: Some(stdin), messages, log, roots_asked, next_id: 0 }
    }

    fn send(&self, message: &Value) {
        let mut stdin = self.stdin.as_ref().expect("stdin open").lock();
        writeln!(stdin, "{message}").expect("bridge reads stdin");
        stdin.flush().expect("flush");
    }

    /// Sends a request and returns its response (skipping notifications).
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(format!("host-{}", self.next_id));
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self
                .messages
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no response to {method} within {WAIT:?} ({e}); bridge log:\n{}", self.log_text()));
            if message["id"] == id {
                return message;
            }
        }
    }

    /// initialize (declaring roots) + notifications/initialized; the result.
    fn initialize(&mut self) -> Value {
        let response = self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": true}},
                "clientInfo": {"name": "bridge-test-host", "version": "1"}}),
        );
        assert!(response.get("result").is_some(), "initialize failed: {response}\nlog:\n{}", self.log_text());
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        response["result"].clone()
    }

    /// Records thought `n`; the notebook's thought count.
    fn thought(&mut self, n: u64) -> u64 {
        let args = json!({"thought": format!("thought {n}"), "thoughtNumber": n, "totalThoughts": 9, "nextThoughtNeeded": true});
        let response = self.request("tools/call", json!({"name": "thought", "arguments": args}));
        response["result"]["structuredContent"]["thoughtHistoryLength"]
            .as_u64()
            .unwrap_or_else(|| panic!("thought {n} failed: {response}\nlog:\n{}", self.log_text()))
    }

    fn log_text(&self) -> String {
        self.log.lock().join("\n")
    }

    fn count_log(&self, needle: &str) -> usize {
        self.log.lock().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits until a stderr line contains `needle`.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while self.count_log(needle) == 0 {
            assert!(Instant::now() < deadline, "no log line {needle:?}; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes stdin (how a host stops a stdio server) and waits for the exit.
    fn close(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                // Give the stderr thread a moment to collect the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return (status, self.log_text());
            }
            assert!(Instant::now() < deadline, "the bridge did not exit after stdin closed; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This test process: the host of every bridge it starts without `--host-pid`.
fn me() -> HostIdentity {
    let pid = std::process::id();
    HostIdentity { pid, start_time: SystemProcesses.start_time(pid).expect("own start time") }
}

fn identity_of(pid: u32) -> HostIdentity {
    HostIdentity { pid, start_time: SystemProcesses.start_time(pid).expect("start time") }
}

/// A private token directory (0700, as the bridge requires).
fn token_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    dir
}

fn token_path(dir: &Path, host: HostIdentity) -> PathBuf {
    dir.join(host.file_name())
}

fn read_token(dir: &Path, host: HostIdentity) -> String {
    let path = token_path(dir, host);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let token = text.strip_suffix('\n').expect("one line").to_owned();
    assert!(is_valid_token(&token), "{token:?}");
    token
}

fn token_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| HostIdentity::from_file_name(n).is_some() && !n.contains('.'))
        .collect();
    names.sort();
    names
}

/// A fake second host: a process that lives while the test needs it.
struct FakeHost(Child);

impl FakeHost {
    fn start() -> FakeHost {
        FakeHost(Command::new("sleep").arg("300").spawn().expect("sleep runs"))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn first_run_then_a_restart_resumes_with_the_notebook_context_intact() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();

    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    let result = bridge.initialize();
    assert_eq!(result["serverInfo"]["name"], "tether-notebook");
    assert!(!result.to_string().contains("dev.tether/"), "the host never sees tether's _meta: {result}");
    bridge.wait_log(log_lines::NOT_FOUND);
    let first_token = read_token(dir.path(), me());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(token_path(dir.path(), me())).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(bridge.thought(1), 1);
    assert_eq!(bridge.thought(2), 2);
    let deadline = Instant::now() + WAIT;
    while bridge.roots_asked.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the notebook's roots/list reached the host; log:\n{}", bridge.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, log) = bridge.close();
    assert!(status.success(), "closing stdin ends the bridge cleanly: {status}\n{log}");

    // The host restarts the bridge: same remote session, thoughts continue.
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    let result = bridge.initialize();
    assert!(!result.to_string().contains("dev.tether/"));
    bridge.wait_log(log_lines::RESUMED);
    assert_eq!(bridge.thought(3), 3, "the notebook context survived the bridge restart");
    let state = bridge.request("tools/call", json!({"name": "init", "arguments": {"operation": "get_state"}}));
    assert!(state.get("result").is_some(), "{state}");
    let second_token = read_token(dir.path(), me());
    assert_ne!(second_token, first_token, "every initialize rotates the token");
    assert_eq!(bridge.count_log(log_lines::NOT_FOUND), 0);
    let (status, _) = bridge.close();
    assert!(status.success());
    assert_eq!(token_files(dir.path()), [me().file_name()]);
}

#[test]
fn a_corrupted_token_file_is_deleted_and_the_session_starts_fresh() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    assert_eq!(bridge.thought(1), 1);
    let good = read_token(dir.path(), me());
    bridge.close();

    // A torn write: half a token.
    let path = token_path(dir.path(), me());
    std::fs::write(&path, &good[..20]).unwrap();
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    bridge.wait_log(log_lines::CORRUPTED);
    assert_eq!(bridge.thought(1), 1, "fresh session");
    assert_eq!(bridge.count_log(log_lines::RESUMED), 0);
    let fresh = read_token(dir.path(), me());
    assert_ne!(fresh, good);
    bridge.close();
}

#[test]
fn a_server_that_forgot_the_session_rejects_the_token_and_the_bridge_starts_fresh() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    assert_eq!(bridge.thought(1), 1);
    let old = read_token(dir.path(), me());
    bridge.close();
    server.kill();

    let forgetful = Server::start("memory", "127.0.0.1:0");
    let mut bridge = Bridge::start(&forgetful.url, dir.path(), &[]);
    bridge.initialize();
    bridge.wait_log(log_lines::REJECTED);
    assert_eq!(bridge.thought(1), 1);
    let new = read_token(dir.path(), me());
    assert_ne!(new, old, "the refused token was replaced by the fresh session's");
    bridge.close();
}

#[test]
fn two_hosts_keep_two_token_files_and_two_sessions() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();
    let (a, b) = (FakeHost::start(), FakeHost::start());
    let pid = |h: &FakeHost| h.pid().to_string();
    let mut bridge_a = Bridge::start(&server.url, dir.path(), &["--host-pid", &pid(&a)]);
    let mut bridge_b = Bridge::start(&server.url, dir.path(), &["--host-pid", &pid(&b)]);
    bridge_a.initialize();
    bridge_b.initialize();
    assert_eq!(bridge_a.thought(1), 1);
    assert_eq!(bridge_a.thought(2), 2);
    assert_eq!(bridge_b.thought(1), 1, "independent sessions");
    let mut expected = vec![identity_of(a.pid()).file_name(), identity_of(b.pid()).file_name()];
    expected.sort();
    assert_eq!(token_files(dir.path()), expected);
    bridge_a.close();
    bridge_b.close();

    // Each host gets its own session back.
    let mut bridge_b = Bridge::start(&server.url, dir.path(), &["--host-pid", &pid(&b)]);
    bridge_b.initialize();
    assert_eq!(bridge_b.thought(2), 2);
    let mut bridge_a = Bridge::start(&server.url, dir.path(), &["--host-pid", &pid(&a)]);
    bridge_a.initialize();
    assert_eq!(bridge_a.thought(3), 3);
    bridge_a.close();
    bridge_b.close();
}

#[test]
fn a_file_of_a_reused_pid_is_ignored_and_removed() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();
    // A real token of someone else's session (two thoughts deep).
    let other = FakeHost::start();
    let mut bridge = Bridge::start(&server.url, dir.path(), &["--host-pid", &other.pid().to_string()]);
    bridge.initialize();
    bridge.thought(1);
    bridge.thought(2);
    bridge.close();
    let foreign = read_token(dir.path(), identity_of(other.pid()));

    // The same token under this process's PID but another start time: an
    // earlier process that had this PID.
    let reused = HostIdentity { pid: me().pid, start_time: me().start_time + 1 };
    let path = token_path(dir.path(), reused);
    std::fs::write(&path, format!("{foreign}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    bridge.wait_log(log_lines::NOT_FOUND);
    assert_eq!(bridge.thought(1), 1, "a fresh session, not the other host's");
    assert!(!path.exists(), "the stale file is removed at startup");
    assert_eq!(bridge.count_log(log_lines::RESUMED), 0);
    bridge.close();
}

#[test]
fn a_second_concurrent_instance_runs_without_resume_and_leaves_the_first_alone() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::sqlite(&data.path().join("t.db"));
    let dir = token_dir();
    let mut first = Bridge::start(&server.url, dir.path(), &[]);
    first.initialize();
    assert_eq!(first.thought(1), 1);
    assert_eq!(first.thought(2), 2);
    let token = read_token(dir.path(), me());

    let mut second = Bridge::start(&server.url, dir.path(), &[]);
    second.initialize();
    second.wait_log("Another bridge instance of this host");
    assert_eq!(second.count_log("session resume disabled for this instance"), 1, "one log line says so");
    assert_eq!(second.thought(1), 1, "its own fresh session");
    assert_eq!(second.count_log(log_lines::NOT_FOUND), 0, "it never reads the token file");
    let (status, _) = second.close();
    assert!(status.success());
    assert_eq!(read_token(dir.path(), me()), token, "nor writes it");

    assert_eq!(first.thought(3), 3, "the first instance's session is untouched");
    first.close();
    let mut again = Bridge::start(&server.url, dir.path(), &[]);
    again.initialize();
    again.wait_log(log_lines::RESUMED);
    assert_eq!(again.thought(4), 4);
    again.close();
}

#[test]
fn the_bridge_carries_on_when_the_server_restarts_or_forgets_mid_run() {
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("t.db");
    let server = Server::sqlite(&db);
    let listen = server.listen_addr();
    let dir = token_dir();
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    assert_eq!(bridge.thought(1), 1);

    // kill -9 and restart on the same SQLite file: the session is still there.
    server.kill();
    let server = Server::start(&format!("sqlite:{}", db.display()), &listen);
    assert_eq!(bridge.thought(2), 2, "same session after the restart");

    // Restarted on an empty store: 404, the kept token is refused, a fresh
    // session, and the request is retried on it.
    server.kill();
    let _server = Server::start("memory", &listen);
    assert_eq!(bridge.thought(3), 1, "the retried call ran on a fresh session");
    bridge.wait_log(log_lines::REJECTED);
    assert_eq!(bridge.thought(4), 2);
    let (status, log) = bridge.close();
    assert!(status.success(), "{log}");
}

#[test]
fn unknown_hosts_and_open_directories_disable_resume_but_the_bridge_works() {
    let server = Server::start("memory", "127.0.0.1:0");
    let dir = token_dir();
    let mut bridge = Bridge::start(&server.url, dir.path(), &["--host-pid", "1"]);
    bridge.initialize();
    bridge.wait_log(log_lines::NO_IDENTITY);
    assert_eq!(bridge.thought(1), 1);
    bridge.close();
    assert!(token_files(dir.path()).is_empty(), "no token file without a host identity");

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut bridge = Bridge::start(&server.url, &open, &[]);
    bridge.initialize();
    bridge.wait_log("session resume disabled for this instance");
    assert_eq!(bridge.thought(1), 1);
    bridge.close();
    assert!(token_files(&open).is_empty());
}

#[test]
fn launcher_wrappers_are_walked_past_to_the_host() {
    let server = Server::start("memory", "127.0.0.1:0");
    let dir = token_dir();
    // `sh -c` that does not exec the bridge: sh stays between host and bridge.
    let mut command = Command::new("sh");
    command.args(["-c", "\"$0\" \"$@\"; exit $?", &binary(), "bridge", &server.url, "--token-dir"]).arg(dir.path());
    let mut bridge = Bridge::spawn(command);
    bridge.initialize();
    let shell = SystemProcesses.info(bridge.child.id()).expect("the shell runs");
    assert!(["sh", "dash", "bash"].contains(&shell.name.as_str()), "the shell did not exec the bridge: {shell:?}");
    assert_eq!(token_files(dir.path()), [me().file_name()], "named after this process, not the shell");
    bridge.close();
}

#[test]
fn the_bearer_token_comes_from_the_named_variable() {
    let data = tempfile::tempdir().unwrap();
    let tokens = data.path().join("tokens");
    std::fs::write(&tokens, "bridge-secret-0123456789abcdef alice\n").unwrap();
    let store = format!("sqlite:{}", data.path().join("t.db").display());
    let mut child = Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &store, "--auth-tokens"])
        .arg(&tokens)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(i) = line.find("http://") {
            break line[i..].split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let server = Server { child, url };
    let dir = token_dir();

    let mut command = Command::new(binary());
    command.args(["bridge", &server.url, "--auth-token-env", "BRIDGE_TEST_TOKEN", "--token-dir"]).arg(dir.path());
    command.env("BRIDGE_TEST_TOKEN", "bridge-secret-0123456789abcdef");
    let mut bridge = Bridge::spawn(command);
    bridge.initialize();
    assert_eq!(bridge.thought(1), 1);
    bridge.close();

    // Without the token the remote refuses, and the host hears why.
    let mut anonymous = Bridge::start(&server.url, dir.path(), &[]);
    let response = anonymous.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}),
    );
    assert!(response.get("error").is_some(), "{response}");
    anonymous.close();
}

#[test]
fn a_token_file_that_cannot_be_written_is_logged_and_the_bridge_carries_on() {
    let server = Server::start("memory", "127.0.0.1:0");
    let dir = token_dir();
    // A directory where the token file should be: unreadable as a token, and
    // no rename can replace it.
    std::fs::create_dir(token_path(dir.path(), me())).unwrap();
    let mut bridge = Bridge::start(&server.url, dir.path(), &[]);
    bridge.initialize();
    bridge.wait_log(log_lines::CORRUPTED);
    bridge.wait_log(log_lines::WRITE_FAILED_PREFIX);
    assert_eq!(bridge.thought(1), 1);
    let (status, _) = bridge.close();
    assert!(status.success());
}
