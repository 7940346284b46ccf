//! Test support: third-party MCP servers from `interop/servers/` (the
//! official Python SDK in three shapes, the TypeScript SDK), started on a
//! loopback port of their own, restartable on the same port, with their
//! request counters (`GET /stats`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Installs the SDKs the fixture servers need (once per test process).
pub fn ensure_interop() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        let script = repo_root().join("interop/servers/ensure.sh");
        let out = Command::new("bash").arg(&script).output().map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed: {}\nThese tests need python3 (>= 3.10, with venv) and node >= 20 with npm; \
                 `interop/run.sh target/release/tether` installs the same SDKs.",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Python SDK, Streamable HTTP with sessions.
    PyStateful,
    /// Python SDK, Streamable HTTP without sessions, JSON answers.
    PyStatelessJson,
    /// Python SDK, 2024-11-05 HTTP+SSE.
    PyLegacy,
    /// TypeScript SDK, Streamable HTTP with sessions.
    Ts,
}

pub const ALL_SHAPES: [Shape; 4] = [Shape::PyStateful, Shape::PyStatelessJson, Shape::PyLegacy, Shape::Ts];

/// A fixture server process.
pub struct Fixture {
    pub shape: Shape,
    pub port: u16,
    child: Option<Child>,
}

impl Fixture {
    pub fn start(shape: Shape) -> Fixture {
        ensure_interop();
        let mut f = Fixture { shape, port: free_port(), child: None };
        f.spawn();
        f
    }

    fn spawn(&mut self) {
        let root = repo_root();
        let servers = root.join("interop/servers");
        let mut cmd = match self.shape {
            Shape::Ts => {
                let mut c = Command::new("node");
                c.arg(servers.join("ts_server.mjs"));
                c
            }
            shape => {
                let mut c = Command::new(root.join("interop/py/.venv/bin/python"));
                c.arg(servers.join("py_server.py")).arg(match shape {
                    Shape::PyStateful => "stateful",
                    Shape::PyStatelessJson => "stateless-json",
                    _ => "legacy",
                });
                c
            }
        };
        let mut child = cmd
            .arg(self.port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {:?} fixture server: {e}", self.shape));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref() {
                match line {
                    Ok(l) if l.trim() == "READY" => {
                        let _ = tx.send(());
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
            for _ in lines {}
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("the {:?} fixture server did not print READY within 60 s", self.shape);
        }
        self.child = Some(child);
    }

    /// The URL a client is given.
    pub fn url(&self) -> String {
        match self.shape {
            Shape::PyLegacy => format!("http://127.0.0.1:{}/sse", self.port),
            _ => format!("http://127.0.0.1:{}/mcp", self.port),
        }
    }

    /// Request counters of the running process.
    pub async fn stats(&self) -> Value {
        reqwest::get(format!("http://127.0.0.1:{}/stats", self.port)).await.expect("GET /stats").json().await.expect("stats JSON")
    }

    pub async fn stat(&self, key: &str) -> u64 {
        self.stats().await[key].as_u64().unwrap_or_else(|| panic!("no counter {key}"))
    }

    /// Kills the process and starts a new one on the same port (all
    /// sessions are gone).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.spawn();
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The text of a tool result's content, joined.
pub fn text(result: &Value) -> String {
    result["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect()
}

/// `{"sum": n}` from `add`, whether structured or as JSON text.
pub fn sum_of(result: &Value) -> i64 {
    if let Some(n) = result["structuredContent"]["sum"].as_i64() {
        return n;
    }
    let t = text(result);
    let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
    v["sum"].as_i64().or_else(|| v.as_i64()).unwrap_or_else(|| panic!("no sum in {result}"))
}
