//! Redis servers of a test's own: processes on free loopback ports, each
//! with its directory and an append-only file synced on every write, that
//! a test kills with SIGKILL, pauses, restarts on the same port from what
//! they wrote, and asks with `redis-cli`. A single primary with a replica,
//! or a Redis Cluster of primaries with a replica each.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server, a replica or a cluster may take to come up.
const UP: Duration = Duration::from_secs(60);

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// What it was started with beyond the port and the directory.
    args: Vec<String>,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl RedisServer {
    /// A server in `dir` (created), syncing every write to its append-only file.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        std::fs::create_dir_all(dir).expect("the server's directory");
        let mut args: Vec<String> = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut server = Self { child: None, port: free_port(), dir: dir.to_owned(), args };
        server.spawn(&[]);
        server
    }

    fn spawn(&mut self, more: &[&str]) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(&self.args)
            .args(more)
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test needs it too)");
        self.child = Some(child);
        let deadline = Instant::now() + UP;
        while self.cli(&["ping"]) != "PONG" {
            assert!(Instant::now() < deadline, "redis-server on port {} never answered", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Started again on its port from its own files, with `more` arguments.
    pub fn restart(&mut self, more: &[&str]) {
        self.kill();
        self.spawn(more);
    }

    /// SIGKILL: whatever it had not written dies with it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill runs");
            assert!(status.success(), "kill {signal}");
        }
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The value of `field` in `INFO section`.
    pub fn info(&self, section: &str, field: &str) -> Option<String> {
        let info = self.cli(&["info", section]);
        info.lines().find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_owned()))
    }

    /// Waits until a replica is online and has everything this primary had
    /// when the wait began (writes may go on meanwhile).
    pub fn wait_for_replica(&self) {
        let deadline = Instant::now() + UP;
        let offset = |info: &str| {
            info.lines().find_map(|l| l.strip_prefix("master_repl_offset:")).and_then(|v| v.trim().parse::<u64>().ok())
        };
        let target = offset(&self.cli(&["info", "replication"])).unwrap_or(0);
        loop {
            let info = self.cli(&["info", "replication"]);
            let caught_up = info.lines().filter(|l| l.starts_with("slave")).any(|l| {
                l.contains("state=online")
                    && l.split(',').find_map(|kv| kv.strip_prefix("offset=")).and_then(|v| v.parse::<u64>().ok()) >= Some(target)
            });
            if caught_up {
                return;
            }
            assert!(Instant::now() < deadline, "the replica of port {} never caught up: {info}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A Redis Cluster of `primaries` primaries with a replica each, in `dir`.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn start(dir: &Path, primaries: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..primaries * 2)
            .map(|n| {
                RedisServer::start(
                    &dir.join(format!("node{n}")),
                    &["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(created.status.success(), "cluster create: {}", String::from_utf8_lossy(&created.stdout));
        let cluster = Self { nodes };
        cluster.wait_ok();
        for primary in cluster.primaries() {
            cluster.nodes[primary].wait_for_replica();
        }
        cluster
    }

    /// `redis+cluster://` naming every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}/", nodes.join(","))
    }

    /// Indexes of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].info("replication", "role").as_deref() == Some("master")).collect()
    }

    /// The index of the replica of primary `primary`.
    pub fn replica_of(&self, primary: usize) -> usize {
        let port = self.nodes[primary].port;
        (0..self.nodes.len())
            .find(|&i| {
                self.nodes[i].info("replication", "master_port").as_deref() == Some(&port.to_string())
                    && self.nodes[i].info("replication", "role").as_deref() == Some("slave")
            })
            .unwrap_or_else(|| panic!("no replica of the primary on port {port}"))
    }

    /// Waits until every running node says the cluster is ok.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + UP;
        while !self.nodes.iter().all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok")) {
            assert!(Instant::now() < deadline, "the cluster never reached cluster_state:ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
