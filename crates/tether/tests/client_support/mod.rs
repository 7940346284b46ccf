//! Support for the client tests (`client_*.rs`): `tether serve` as a real
//! process on a loopback port of its own (fixed across restarts), with a
//! SQLite file in a temporary directory, and `tether` client commands run as
//! the user would run them.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test: `TETHER_BIN` or the one cargo built for this run.
pub fn binary() -> String {
    std::env::var("TETHER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tether").to_owned())
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// A `tether serve` process.
pub struct Server {
    pub port: u16,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// Starts on a free port with a SQLite store; `extra` are more flags.
    pub fn start(extra: &[&str]) -> Server {
        let mut s = Server {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        s.spawn();
        s
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("tether.db")
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(binary());
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{}", self.port), "--store"])
            .arg(format!("sqlite:{}", self.db().display()))
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars() {
            if k.starts_with("TETHER_") && k != "TETHER_BIN" {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("the tether binary runs");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr).lines();
            for line in lines.by_ref() {
                match line {
                    Ok(l) if l.contains("http://") => {
                        let _ = tx.send(());
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
            // Keep draining so the server never blocks on a full pipe.
            for _ in lines {}
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("tether serve did not print its address within 60 s");
        }
        self.child = Some(child);
    }

    /// Like `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then a new process on the same port and the same store,
    /// optionally with other flags.
    pub fn crash_and_restart(&mut self, extra: Option<&[&str]>) {
        self.kill();
        if let Some(e) = extra {
            self.extra = e.iter().map(|s| s.to_string()).collect();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `tether ARGS` with a clean client environment (no config file,
/// no MCP_* variables) plus `env`; returns its output.
pub fn tether(args: &[&str], env: &[(&str, &str)], config_home: &Path) -> Output {
    let mut cmd = Command::new(binary());
    cmd.args(args).env("XDG_CONFIG_HOME", config_home).env_remove("RUST_LOG").stdin(Stdio::null());
    for k in ["MCP_AUTH_TOKEN", "MCP_SERVER_URL", "MCP_OAUTH_CLIENT_ID", "MCP_OAUTH_CLIENT_SECRET", "TETHER_OAUTH_CACHE"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the tether binary runs");
    child.wait_with_output().expect("tether finishes")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
