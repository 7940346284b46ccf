//! The systems under test (with `--baseline`, tether's also from an earlier
//! build): how each one is started (as a child process on a loopback port),
//! the stores tether runs on, waiting until a server answers its health
//! check, reading its RSS from `/proc`, and stopping it (SIGTERM) or killing
//! it (SIGKILL). The gateway systems (`gateway_http`, `gateway_stdio`) are
//! started in front of an upstream: a URL or the `stdio_echo` command;
//! tether-gateway in `gateway_federated` with a config file of upstreams and
//! a virtual server of them.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How long a server may take to print its URL and to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Lines of a server's stderr kept for error messages.
const KEPT_LINES: usize = 40;
/// Of those, WARN and ERROR lines kept apart (the rest can push them out).
const KEPT_PROBLEMS: usize = 10;

/// A system the bench knows how to start (`--systems` takes these names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    /// `tether serve --store memory`.
    TetherMemory,
    /// `tether serve --store sqlite:FILE` with FILE in a fresh temp dir.
    TetherSqlite,
    /// tether-sqlite with `--no-metrics`: beside tether-sqlite, what the
    /// Prometheus metrics cost (not in the default systems).
    TetherSqliteNometrics,
    /// `tether serve --store redis://… --store-prefix tether-bench:RANDOM:` (needs a Redis on 127.0.0.1:6379).
    TetherRedis,
    /// tether-redis on a Redis Cluster (`--redis-cluster`, default the three
    /// primaries of `scripts/redis-cluster start`); not in the default systems.
    TetherRedisCluster,
    /// tether on a Redis primary with one replica, both started by the bench
    /// ([`crate::redis_pair`]: append-only file synced on every write),
    /// `--durability normal`; not in the default systems.
    TetherRedisReplica,
    /// tether-redis-replica's topology with `--durability strict
    /// --redis-replicas 1`: every write waits (`WAIT 1`) for the replica;
    /// not in the default systems.
    TetherRedisStrict,
    /// The rmcp reference (`rmcp_ref`: StreamableHttpService + LocalSessionManager).
    Rmcp,
    /// The TypeScript SDK v1 reference (`bench/ts-sdk-server/server.mjs` on node).
    TsSdk,
    /// A bare axum JSON echo route (`axum_floor`): the HTTP floor.
    AxumFloor,
    /// gateway_http and gateway_stdio: `tether serve --store sqlite:FILE
    /// --upstream echo=…` in front of `rmcp_ref` or `stdio_echo`, at `/mcp/echo`;
    /// gateway_federated: `--config FILE` with the virtual server `fed`, at `/mcp/fed`.
    TetherGateway,
    /// gateway_http: `rmcp_ref` called directly (what tether-gateway fronts).
    RmcpDirect,
    /// gateway_stdio: supergateway (npm, `bench/supergateway`) serving `stdio_echo`
    /// over Streamable HTTP, stateful.
    Supergateway,
    /// gateway_stdio: mcp-proxy (PyPI, `bench/mcp-proxy/.venv`) serving `stdio_echo`
    /// over Streamable HTTP, stateful.
    McpProxy,
    /// tools_call_modern: tether-sqlite called over the sessionless 2026-07-28 wire.
    TetherSqliteModern,
    /// tools_call_oauth: tether-sqlite with `--auth-tokens`, a static token per client.
    TetherSqliteToken,
    /// tools_call_oauth: tether-sqlite with `--oauth-issuer` (oidc-provider,
    /// `interop/oauth/provider.mjs`), a JWT access token per client.
    TetherSqliteOauth,
}

/// What a tether system's baseline twin adds to its name (`tether-sqlite@baseline`).
pub const BASELINE_SUFFIX: &str = "@baseline";

/// A system as this run starts it: from its usual program, or, for a tether
/// system's baseline twin (`--baseline`), from the baseline tether binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject {
    pub system: System,
    /// The twin started from `--baseline` (tether systems only).
    pub baseline: bool,
}

impl Subject {
    /// The name in the rows and the table: the system's, or `<system>@baseline`.
    pub fn name(self) -> String {
        format!("{}{}", self.system.name(), if self.baseline { BASELINE_SUFFIX } else { "" })
    }
}

impl From<System> for Subject {
    fn from(system: System) -> Self {
        Subject { system, baseline: false }
    }
}

/// How the load generator talks to a system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// MCP over Streamable HTTP: sessions, `tools/call` of `thought`.
    Mcp,
    /// POST a JSON body, get the same JSON back.
    Echo,
    /// MCP 2026-07-28: no session, the caller in each request's `_meta`; each
    /// client names its notebook session (from its first result) in `_meta`.
    Modern,
    /// MCP through a virtual server: sessions, `tools/call` of each member's
    /// `thought` in turn (`s1__thought`, `s2__thought`, `web__thought`, …).
    Federated,
}

impl System {
    pub const ALL: [System; 17] = [
        System::TetherMemory,
        System::TetherSqlite,
        System::TetherSqliteNometrics,
        System::TetherRedis,
        System::TetherRedisCluster,
        System::TetherRedisReplica,
        System::TetherRedisStrict,
        System::Rmcp,
        System::TsSdk,
        System::AxumFloor,
        System::TetherGateway,
        System::RmcpDirect,
        System::Supergateway,
        System::McpProxy,
        System::TetherSqliteModern,
        System::TetherSqliteToken,
        System::TetherSqliteOauth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            System::TetherMemory => "tether-memory",
            System::TetherSqlite => "tether-sqlite",
            System::TetherSqliteNometrics => "tether-sqlite-nometrics",
            System::TetherRedis => "tether-redis",
            System::TetherRedisCluster => "tether-redis-cluster",
            System::TetherRedisReplica => "tether-redis-replica",
            System::TetherRedisStrict => "tether-redis-strict",
            System::Rmcp => "rmcp",
            System::TsSdk => "ts-sdk",
            System::AxumFloor => "axum-floor",
            System::TetherGateway => "tether-gateway",
            System::RmcpDirect => "rmcp-direct",
            System::Supergateway => "supergateway",
            System::McpProxy => "mcp-proxy",
            System::TetherSqliteModern => "tether-sqlite-modern",
            System::TetherSqliteToken => "tether-sqlite-token",
            System::TetherSqliteOauth => "tether-sqlite-oauth",
        }
    }

    /// A tether-sqlite of one scenario of its own (tools_call_modern, tools_call_oauth).
    pub fn variant(self) -> bool {
        matches!(self, System::TetherSqliteModern | System::TetherSqliteToken | System::TetherSqliteOauth)
    }

    /// A system of the gateway scenarios (and of no other).
    pub fn gateway(self) -> bool {
        matches!(self, System::TetherGateway | System::RmcpDirect | System::Supergateway | System::McpProxy)
    }

    /// The path of its health check: `/healthz`, or mcp-proxy's `/status`.
    fn health_path(self) -> &'static str {
        match self {
            System::McpProxy => "/status",
            _ => "/healthz",
        }
    }

    pub fn protocol(self) -> Protocol {
        match self {
            System::AxumFloor => Protocol::Echo,
            System::TetherSqliteModern => Protocol::Modern,
            _ => Protocol::Mcp,
        }
    }

    pub fn is_tether(self) -> bool {
        matches!(
            self,
            System::TetherMemory
                | System::TetherSqlite
                | System::TetherSqliteNometrics
                | System::TetherRedis
                | System::TetherRedisCluster
                | System::TetherRedisReplica
                | System::TetherRedisStrict
                | System::TetherGateway
                | System::TetherSqliteModern
                | System::TetherSqliteToken
                | System::TetherSqliteOauth
        )
    }

    /// Sessions outlive the process (the store is durable and shared).
    pub fn durable_sessions(self) -> bool {
        matches!(
            self,
            System::TetherSqlite
                | System::TetherSqliteNometrics
                | System::TetherRedis
                | System::TetherRedisCluster
                | System::TetherRedisReplica
                | System::TetherRedisStrict
        )
    }
}

/// Where the programs of the systems are.
#[derive(Debug, Clone)]
pub struct Programs {
    pub tether: PathBuf,
    /// `--baseline`: an earlier tether build, for the baseline twins.
    pub baseline: Option<PathBuf>,
    pub rmcp_ref: PathBuf,
    pub axum_floor: PathBuf,
    pub node: PathBuf,
    pub ts_server: PathBuf,
    pub redis_url: String,
    pub redis_cluster_url: String,
    /// The stdio echo server the gateway_stdio systems serve.
    pub stdio_echo: PathBuf,
    /// supergateway's entry script (`…/node_modules/supergateway/dist/index.js`), run with `node`.
    pub supergateway: PathBuf,
    /// mcp-proxy's command (`bench/mcp-proxy/.venv/bin/mcp-proxy`).
    pub mcp_proxy: PathBuf,
    /// tools_call_oauth's authorization server (`interop/oauth/provider.mjs`), run with `node`.
    pub oauth_provider: PathBuf,
    /// `--pin-servers CPUS`: every server runs on these CPUs (with what it
    /// starts, such as a gateway's upstream), so each system is charged its
    /// own CPU while the load generator runs elsewhere (`scripts/bench --pin`).
    pub pin_servers: Option<String>,
}

impl Programs {
    /// Why `system` cannot run here (its tool is not installed), if it cannot.
    pub fn missing(&self, system: System) -> Option<String> {
        match system {
            System::Supergateway if !runs(&self.node) => {
                Some(format!("supergateway (`{} --version` does not run)", self.node.display()))
            }
            System::Supergateway if !self.supergateway.is_file() => {
                Some(format!("supergateway (no {}: run scripts/bench, which installs it)", self.supergateway.display()))
            }
            System::TetherSqliteOauth if !self.oauth_provider.with_file_name("node_modules").is_dir() => Some(format!(
                "tether-sqlite-oauth (no {}: run scripts/bench, which installs it)",
                self.oauth_provider.with_file_name("node_modules").display()
            )),
            System::McpProxy if !self.mcp_proxy.is_file() => {
                Some(format!("mcp-proxy (no {}: run scripts/bench, which installs it)", self.mcp_proxy.display()))
            }
            System::TetherRedisReplica | System::TetherRedisStrict
                if !runs(Path::new(crate::redis_pair::REDIS_SERVER)) || !runs(Path::new("redis-cli")) =>
            {
                Some(format!("{} (`redis-server --version` or `redis-cli --version` does not run)", system.name()))
            }
            _ => None,
        }
    }
}

/// `cmd` run by `taskset -c CPUS` (which execs it: the PID stays the server's).
fn pinned(cmd: &Command, cpus: &str) -> Command {
    let std = cmd.as_std();
    let mut pinned = Command::new("taskset");
    pinned.args(["-c", cpus]).arg(std.get_program()).args(std.get_args());
    if let Some(dir) = std.get_current_dir() {
        pinned.current_dir(dir);
    }
    for (key, value) in std.get_envs() {
        match value {
            Some(value) => pinned.env(key, value),
            None => pinned.env_remove(key),
        };
    }
    pinned
}

/// Whether `PROGRAM --version` runs and exits 0.
fn runs(program: &Path) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The store a tether server runs on; dropping it removes what it holds
/// (the temp dir, the Redis keys under its prefix, or the Redis servers the
/// bench started for it).
pub enum Store {
    Memory,
    Sqlite {
        dir: tempfile::TempDir,
        file: PathBuf,
    },
    Redis {
        url: String,
        prefix: String,
        /// tether-redis-replica and tether-redis-strict: the primary and
        /// replica started for this store (killed when it is dropped).
        own: Option<crate::redis_pair::RedisPair>,
    },
}

impl Store {
    /// A fresh, empty store for `system` (None for systems that are not tether).
    pub fn fresh(system: System, programs: &Programs) -> anyhow::Result<Option<Store>> {
        Ok(match system {
            System::TetherMemory => Some(Store::Memory),
            System::TetherSqlite
            | System::TetherSqliteNometrics
            | System::TetherGateway
            | System::TetherSqliteModern
            | System::TetherSqliteToken
            | System::TetherSqliteOauth => {
                let dir = tempfile::Builder::new().prefix("tether-bench-").tempdir().context("cannot create a temp dir")?;
                let file = dir.path().join("bench.db");
                Some(Store::Sqlite { dir, file })
            }
            System::TetherRedis => {
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: programs.redis_url.clone(), prefix, own: None })
            }
            System::TetherRedisCluster => {
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: programs.redis_cluster_url.clone(), prefix, own: None })
            }
            System::TetherRedisReplica | System::TetherRedisStrict => {
                let pair = crate::redis_pair::RedisPair::start().with_context(|| format!("{}'s Redis", system.name()))?;
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: pair.url(), prefix, own: Some(pair) })
            }
            _ => None,
        })
    }

    fn args(&self) -> Vec<String> {
        match self {
            Store::Memory => vec!["--store".into(), "memory".into()],
            Store::Sqlite { file, .. } => vec!["--store".into(), format!("sqlite:{}", file.display())],
            Store::Redis { url, prefix, .. } => vec!["--store".into(), url.clone(), "--store-prefix".into(), prefix.clone()],
        }
    }

    /// Bytes the store holds outside the server process: the SQLite files,
    /// or Redis's `used_memory` (the whole Redis, so only deltas mean anything).
    pub fn outside_bytes(&self) -> Option<u64> {
        match self {
            Store::Memory => None,
            Store::Sqlite { dir, .. } => {
                let entries = std::fs::read_dir(dir.path()).ok()?;
                Some(entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            }
            Store::Redis { url, .. } => {
                let mut total = 0;
                for node in redis_nodes(url) {
                    let info = redis_cli(&node, &["INFO", "memory"]).ok()?;
                    total +=
                        info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse::<u64>().ok())?;
                }
                Some(total)
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The bench's own Redis servers go with their keys (`own` drops after this).
        if let Store::Redis { url, prefix, own: None } = self
            && let Err(e) = delete_redis_keys(url, prefix)
        {
            eprintln!("tether-bench: could not delete the Redis keys under {prefix}: {e:#}");
        }
    }
}

/// A Redis node as redis-cli is told of it: host and port.
struct Node {
    host: String,
    port: String,
}

/// The nodes of a `redis://HOST:PORT/` or `redis+cluster://HOST:PORT,…/` URL
/// (credentials and TLS are not for the bench's loopback Redis).
fn redis_nodes(url: &str) -> Vec<Node> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split('/').next().unwrap_or(rest);
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| match h.rsplit_once(':') {
            Some((host, port)) => Node { host: host.to_owned(), port: port.to_owned() },
            None => Node { host: h.to_owned(), port: "6379".to_owned() },
        })
        .collect()
}

/// Runs `redis-cli -h HOST -p PORT ARGS…` and returns its stdout.
fn redis_cli(node: &Node, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", &node.host, "-p", &node.port])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run redis-cli")?;
    anyhow::ensure!(out.status.success(), "redis-cli {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the Redis at `url` answers: every node `PING`s, and a cluster's
/// first node says `cluster_state:ok`.
pub fn redis_available(url: &str) -> bool {
    let nodes = redis_nodes(url);
    let pong = nodes.iter().all(|n| redis_cli(n, &["ping"]).is_ok_and(|out| out.trim() == "PONG"));
    pong && (!url.contains("+cluster://")
        || nodes.first().is_some_and(|n| redis_cli(n, &["CLUSTER", "INFO"]).is_ok_and(|i| i.contains("cluster_state:ok"))))
}

/// Deletes every key under `prefix` on every node, with a script per node
/// (SCAN and UNLINK inside Redis: keys of one command must share a slot on
/// a cluster, and one script per node needs no round trip per key).
fn delete_redis_keys(url: &str, prefix: &str) -> anyhow::Result<()> {
    const DELETE: &str = "#!lua flags=allow-cross-slot-keys\nlocal c, n = '0', 0 repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) \
        c = r[1] for _, k in ipairs(r[2]) do redis.call('UNLINK', k) n = n + 1 end until c == '0' return n";
    let pattern = format!("{prefix}*");
    for node in redis_nodes(url) {
        redis_cli(&node, &["EVAL", DELETE, "0", &pattern])?;
        let left = redis_cli(&node, &["--scan", "--pattern", &pattern])?;
        anyhow::ensure!(left.trim().is_empty(), "keys under {prefix} are left on {}:{}", node.host, node.port);
    }
    Ok(())
}

/// How to start one system.
pub struct Launch {
    pub subject: Subject,
    /// `127.0.0.1:0` or a fixed port (restarts).
    pub listen: String,
    /// rmcp only: `--channel-capacity` (events kept per stream for replay).
    pub channel_capacity: Option<usize>,
    /// tether only: `--max-sessions-per-principal` (the bench's clients are all one principal).
    pub max_sessions: Option<usize>,
    /// The gateway systems: what they serve (tether-gateway as `--upstream
    /// echo=…`, or with `--config FILE`).
    pub upstream: Option<Upstream>,
    /// tether only: more flags (streams_10k: `--session-cache`, the admin API).
    pub extra_args: Vec<String>,
    /// Environment variables set for the process (the admin token).
    pub env: Vec<(String, String)>,
}

/// What a gateway system serves.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A Streamable HTTP MCP endpoint.
    Url(String),
    /// A stdio MCP server: this program, no arguments.
    Stdio(PathBuf),
    /// tether-gateway only: a config file (`--config`) of upstreams and the
    /// virtual server [`FEDERATED_SERVER`] of them ([`federated_config`]).
    Config(PathBuf),
}

/// The upstream's name in tether-gateway's `--upstream NAME=…`, so its endpoint is `/mcp/echo`.
pub const GATEWAY_UPSTREAM: &str = "echo";
/// The virtual server's name in tether-gateway's config, so its endpoint is `/mcp/fed`.
pub const FEDERATED_SERVER: &str = "fed";
/// Between a member's name and its tool's in the virtual server's names (`names = "prefix"`).
pub const FEDERATED_SEPARATOR: &str = "__";

/// A config file's text: an `[upstreams.NAME]` table per member (`command`
/// for a stdio program, `url` for a URL; the gateway's defaults otherwise)
/// and `[servers.fed]` of them all, in order, named by prefix.
pub fn federated_config(members: &[(&str, Upstream)]) -> anyhow::Result<String> {
    // A JSON string is a TOML basic string (the same escapes).
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    let mut toml = String::new();
    for (name, member) in members {
        toml.push_str(&format!("[upstreams.{name}]\n"));
        match member {
            Upstream::Stdio(program) => toml.push_str(&format!("command = [{}]\n\n", quoted(&program.to_string_lossy()))),
            Upstream::Url(url) => toml.push_str(&format!("url = {}\n\n", quoted(url))),
            Upstream::Config(_) => bail!("a member of a virtual server is a command or a URL"),
        }
    }
    let names: Vec<String> = members.iter().map(|(name, _)| quoted(name)).collect();
    toml.push_str(&format!(
        "[servers.{FEDERATED_SERVER}]\nupstreams = [{}]\nnames = \"prefix\"\nseparator = {}\n",
        names.join(", "),
        quoted(FEDERATED_SEPARATOR)
    ));
    Ok(toml)
}

impl Launch {
    pub fn new(subject: Subject) -> Self {
        Self {
            subject,
            listen: "127.0.0.1:0".into(),
            channel_capacity: None,
            max_sessions: None,
            upstream: None,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The stdio command a gateway serves.
    fn stdio_upstream(&self) -> anyhow::Result<&Path> {
        match &self.upstream {
            Some(Upstream::Stdio(program)) => existing(program, "cargo build --release -p tether-bench"),
            _ => bail!("{} needs a stdio upstream", self.subject.name()),
        }
    }

    /// The port to listen on for a server that takes a port, not an address
    /// (it prints no URL the bench can read, so the bench picks the port).
    fn port(&self) -> anyhow::Result<u16> {
        match self.listen.rsplit_once(':').map(|(_, port)| port.parse::<u16>()) {
            Some(Ok(0)) => free_port(),
            Some(Ok(port)) => Ok(port),
            _ => bail!("cannot read a port in {}", self.listen),
        }
    }

    /// The command, and the MCP URL when it is known before the server prints anything.
    fn command(&self, programs: &Programs, store: Option<&Store>) -> anyhow::Result<(Command, Option<String>)> {
        let mut known_url = None;
        let mut cmd = match self.subject.system {
            System::TetherMemory
            | System::TetherSqlite
            | System::TetherSqliteNometrics
            | System::TetherRedis
            | System::TetherRedisCluster
            | System::TetherRedisReplica
            | System::TetherRedisStrict
            | System::TetherGateway
            | System::TetherSqliteModern
            | System::TetherSqliteToken
            | System::TetherSqliteOauth => {
                let store = store.context("a tether system needs a store")?;
                let tether = match (self.subject.baseline, &programs.baseline) {
                    (false, _) => existing(&programs.tether, "cargo build --release -p tether, or pass --tether")?,
                    (true, Some(baseline)) => existing(baseline, "pass a tether binary to --baseline")?,
                    (true, None) => bail!("{} needs --baseline", self.subject.name()),
                };
                let mut cmd = Command::new(tether);
                cmd.args(["serve", "--listen", &self.listen]).args(store.args());
                if let Some(n) = self.max_sessions {
                    cmd.args(["--max-sessions-per-principal", &n.to_string()]);
                }
                match self.subject.system {
                    System::TetherSqliteNometrics => {
                        cmd.arg("--no-metrics");
                    }
                    System::TetherRedisReplica => {
                        cmd.args(["--durability", "normal"]);
                    }
                    System::TetherRedisStrict => {
                        cmd.args(["--durability", "strict", "--redis-replicas", "1"]);
                    }
                    _ => {}
                }
                if self.subject.system == System::TetherGateway {
                    let target = match &self.upstream {
                        Some(Upstream::Url(url)) => url.clone(),
                        Some(Upstream::Stdio(_)) => format!("stdio:{}", shell_quote(&self.stdio_upstream()?.to_string_lossy())),
                        Some(Upstream::Config(file)) => {
                            cmd.arg("--config").arg(existing(file, "written by the bench")?);
                            String::new()
                        }
                        None => bail!("tether-gateway needs an upstream"),
                    };
                    if !target.is_empty() {
                        cmd.args(["--upstream", &format!("{GATEWAY_UPSTREAM}={target}")]);
                    }
                }
                cmd.args(&self.extra_args);
                cmd.env("NO_COLOR", "1").env("RUST_LOG", "info");
                cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
                cmd
            }
            System::Rmcp | System::RmcpDirect => {
                let mut cmd = Command::new(existing(&programs.rmcp_ref, "cargo build --release -p tether-bench")?);
                cmd.args(["--listen", &self.listen]);
                if let Some(n) = self.channel_capacity {
                    cmd.args(["--channel-capacity", &n.to_string()]);
                }
                cmd
            }
            System::AxumFloor => {
                let mut cmd = Command::new(existing(&programs.axum_floor, "cargo build --release -p tether-bench")?);
                cmd.args(["--listen", &self.listen]);
                cmd
            }
            System::TsSdk => {
                let script = existing(&programs.ts_server, "run from the repository root, or pass --ts-server")?
                    .canonicalize()
                    .with_context(|| format!("cannot resolve {}", programs.ts_server.display()))?;
                let dir = script.parent().context("the ts-sdk server has no directory")?.to_path_buf();
                if !dir.join("node_modules").is_dir() {
                    bail!("{} has no node_modules: run `npm ci` in {}", dir.display(), dir.display());
                }
                let mut cmd = Command::new(&programs.node);
                // A heap large enough for 100,000 sessions (the default limit is a few GiB).
                cmd.arg("--max-old-space-size=16384").arg(&script).args(["--listen", &self.listen]);
                cmd.current_dir(&dir);
                cmd
            }
            System::Supergateway => {
                let script = existing(&programs.supergateway, "run scripts/bench, which installs it in bench/supergateway")?;
                let stdio = shell_quote(&self.stdio_upstream()?.to_string_lossy());
                let port = self.port()?;
                let mut cmd = Command::new(&programs.node);
                // Its info log prints every message both ways (on stdout): off, as in production.
                cmd.arg(script).args(["--stdio", &stdio, "--outputTransport", "streamableHttp", "--stateful"]);
                cmd.args(["--port", &port.to_string(), "--healthEndpoint", "/healthz", "--logLevel", "none"]);
                known_url = Some(format!("http://127.0.0.1:{port}/mcp"));
                cmd
            }
            System::McpProxy => {
                let proxy = existing(&programs.mcp_proxy, "run scripts/bench, which installs it in bench/mcp-proxy/.venv")?;
                let stdio = self.stdio_upstream()?;
                let port = self.port()?;
                let mut cmd = Command::new(proxy);
                // INFO logs a line per request (the SDK's "Processing request of type …").
                cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--no-stateless", "--log-level", "WARNING", "--"]);
                cmd.arg(stdio);
                known_url = Some(format!("http://127.0.0.1:{port}/mcp"));
                cmd
            }
        };
        if let Some(cpus) = &programs.pin_servers {
            cmd = pinned(&cmd, cpus);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        Ok((cmd, known_url))
    }

    /// What follows the URL the server prints to make its MCP endpoint.
    fn endpoint_suffix(&self) -> String {
        match (self.subject.system, &self.upstream) {
            (System::TetherGateway, Some(Upstream::Config(_))) => format!("/{FEDERATED_SERVER}"),
            (System::TetherGateway, _) => format!("/{GATEWAY_UPSTREAM}"),
            _ => String::new(),
        }
    }
}

/// `text` as one word for a POSIX shell (and for tether's shell-like split).
fn shell_quote(text: &str) -> String {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c)) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

fn existing<'a>(path: &'a Path, hint: &str) -> anyhow::Result<&'a Path> {
    if path.is_file() { Ok(path) } else { bail!("{} does not exist ({hint})", path.display()) }
}

/// A running server; `stop` or `kill` it when done (dropping it kills the process).
pub struct Server {
    pub subject: Subject,
    child: Child,
    pid: u32,
    /// The MCP endpoint, e.g. `http://127.0.0.1:41234/mcp` (known once `ready` returned).
    pub mcp_url: String,
    url_rx: Option<oneshot::Receiver<String>>,
    /// The last lines of its stderr.
    log: Arc<Mutex<VecDeque<String>>>,
    /// How many of its stderr lines were at WARN or ERROR level, and the last of them.
    problems: Arc<Mutex<(u64, VecDeque<String>)>>,
}

impl Server {
    /// Its process ID (its CPU time is read from `/proc/PID/stat`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Spawns the process and returns at once (the restart scenario times from here).
    pub fn spawn(launch: &Launch, programs: &Programs, store: Option<&Store>) -> anyhow::Result<Server> {
        let (mut cmd, known_url) = launch.command(programs, store)?;
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", launch.subject.name()))?;
        let pid = child.id().context("the server exited at once")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (url_tx, url_rx) = oneshot::channel();
        let suffix = launch.endpoint_suffix();
        let mut url_tx = match known_url {
            Some(url) => {
                let _ = url_tx.send(url);
                None
            }
            None => Some(url_tx),
        };
        let kept = log.clone();
        let problems = Arc::new(Mutex::new((0, VecDeque::new())));
        let kept_problems = problems.clone();
        // Drain stderr for the server's whole life so it never blocks on a full pipe.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = mcp_url_in(&line)
                    && let Some(tx) = url_tx.take()
                {
                    let _ = tx.send(url + &suffix);
                }
                if is_problem(&line)
                    && let Ok(mut problems) = kept_problems.lock()
                {
                    problems.0 += 1;
                    if problems.1.len() == KEPT_PROBLEMS {
                        problems.1.pop_front();
                    }
                    problems.1.push_back(line.clone());
                }
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() == KEPT_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            }
        });
        Ok(Server { subject: launch.subject, child, pid, mcp_url: String::new(), url_rx: Some(url_rx), log, problems })
    }

    /// Spawns the process and waits until it printed its URL and answers `/healthz`.
    pub async fn start(launch: &Launch, programs: &Programs, store: Option<&Store>) -> anyhow::Result<Server> {
        let mut server = Self::spawn(launch, programs, store)?;
        server.ready().await?;
        Ok(server)
    }

    /// Waits for the URL line and a healthy `/healthz` (mcp-proxy: `/status`).
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        let rx = self.url_rx.take().context("ready() called twice")?;
        self.mcp_url = match tokio::time::timeout(START_TIMEOUT, rx).await {
            Ok(Ok(url)) => url,
            Ok(Err(_)) => bail!("{} exited before printing its URL; its stderr:\n{}", self.subject.name(), self.log_tail()),
            Err(_) => bail!("{} printed no URL within {START_TIMEOUT:?}; its stderr:\n{}", self.subject.name(), self.log_tail()),
        };
        let url = format!("{}{}", origin(&self.mcp_url), self.subject.system.health_path());
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match client.get(&url).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::OK => return Ok(()),
                Ok(r) if Instant::now() > deadline => bail!("{url} answered {}", r.status()),
                Err(e) if Instant::now() > deadline => bail!("{url} did not answer: {e}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The last lines the server wrote to stderr.
    pub fn log_tail(&self) -> String {
        self.log.lock().map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n")).unwrap_or_default()
    }

    /// How many lines it logged at WARN or ERROR level, and the last few of them.
    pub fn problems(&self) -> (u64, Vec<String>) {
        self.problems.lock().map(|p| (p.0, p.1.iter().cloned().collect())).unwrap_or_default()
    }

    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        kib_field(&status, field).with_context(|| format!("no {field} line in {path}"))
    }

    /// Peak resident set size of the server so far (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        Ok(self.status_kib("VmHWM:")? as f64 / 1024.0)
    }

    /// Resident set size now (VmRSS), in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmRSS:")? * 1024)
    }

    /// How many live child processes it has (those whose parent it is,
    /// zombies not counted).
    pub fn live_children(&self) -> anyhow::Result<usize> {
        Ok(self.children()?.len())
    }

    /// Its live children's resident set sizes (VmRSS) summed, in bytes: a
    /// child that exits between the listing and the read counts nothing.
    pub fn children_rss_bytes(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for pid in self.children()? {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                total += kib_field(&status, "VmRSS:").unwrap_or(0) * 1024;
            }
        }
        Ok(total)
    }

    /// The PIDs of its live child processes, found by reading every `/proc/PID/stat`.
    fn children(&self) -> anyhow::Result<Vec<u32>> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
            let entry = entry?;
            if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            // A process may exit between the listing and the read.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some((state, ppid)) = state_and_parent(&stat)
                && ppid == self.pid
                && state != "Z"
                && let Ok(pid) = entry.file_name().to_string_lossy().parse()
            {
                pids.push(pid);
            }
        }
        Ok(pids)
    }

    /// kill(2) to our own child, which we have not reaped yet.
    fn signal(&self, signal: rustix::process::Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw).context("pid out of range")?;
        rustix::process::kill_process(pid, signal).with_context(|| format!("cannot signal {}", self.pid))
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after a timeout).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.signal(rustix::process::Signal::TERM)?;
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                // Python's default for SIGTERM (mcp-proxy) is to die of it: that is a stop too.
                let died_of_term =
                    std::os::unix::process::ExitStatusExt::signal(&status) == Some(rustix::process::Signal::TERM.as_raw());
                if !status.success() && !died_of_term {
                    eprintln!("tether-bench: {} ({}) exited with {status} after SIGTERM", self.subject.name(), self.pid);
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("{} ({}) ignored SIGTERM for {STOP_TIMEOUT:?} and was killed", self.subject.name(), self.pid)
            }
        }
    }

    /// SIGKILL, then reap the process.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.signal(rustix::process::Signal::KILL)?;
        let status = tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await.context("a SIGKILLed server did not exit")??;
        anyhow::ensure!(!status.success(), "{} exited cleanly instead of being killed", self.subject.name());
        Ok(())
    }
}

/// A loopback port free right now (for a restart, whose URL is needed before the server prints it).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a probe socket")?;
    Ok(listener.local_addr()?.port())
}

/// A `FIELD:  1234 kB` line of a `/proc/PID/status` text, in KiB.
fn kib_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

/// A log line at WARN or ERROR level (tracing's format: `… WARN target: …`).
fn is_problem(line: &str) -> bool {
    line.split_whitespace().take(3).any(|word| word == "WARN" || word == "ERROR")
}

/// The state and parent PID in a `/proc/PID/stat` line (after the command
/// name, which sits in parentheses and may hold spaces).
fn state_and_parent(stat: &str) -> Option<(&str, u32)> {
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let state = fields.next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// `http://host:port` of a URL.
pub fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..].find('/').map_or(url, |i| &url[..after_scheme + i])
}

/// The first `http://…/mcp` URL in a log line, if any.
fn mcp_url_in(line: &str) -> Option<String> {
    let start = line.find("http://")?;
    let url: String = line[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || ":/.-_[]%".contains(*c)).collect();
    url.ends_with("/mcp").then_some(url)
}

#[cfg(test)]
mod tests {
    use super::{Upstream, federated_config, kib_field, mcp_url_in, origin, shell_quote, state_and_parent};

    #[test]
    fn reads_the_state_and_parent_of_a_proc_stat_line() {
        assert_eq!(state_and_parent("4242 (stdio echo) S 17 4242 17 0 -1"), Some(("S", 17)));
        assert_eq!(state_and_parent("4243 (a) b) Z 17 1"), Some(("Z", 17)));
        assert_eq!(state_and_parent("garbage"), None);
    }

    #[test]
    fn reads_a_kib_field_of_proc_status() {
        let status = "Name:\tstdio_echo\nVmHWM:\t    2100 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(kib_field(status, "VmRSS:"), Some(2048));
        assert_eq!(kib_field(status, "VmSwap:"), None);
    }

    #[test]
    fn a_federated_config_has_a_table_per_member_and_the_virtual_server() {
        let members = [
            ("s1", Upstream::Stdio("/t/stdio_echo".into())),
            ("web", Upstream::Url("http://127.0.0.1:4567/mcp".into())),
            ("odd", Upstream::Stdio("/a \"b\"\\c".into())),
        ];
        assert_eq!(
            federated_config(&members).expect("a config"),
            "[upstreams.s1]\ncommand = [\"/t/stdio_echo\"]\n\n[upstreams.web]\nurl = \"http://127.0.0.1:4567/mcp\"\n\n\
             [upstreams.odd]\ncommand = [\"/a \\\"b\\\"\\\\c\"]\n\n\
             [servers.fed]\nupstreams = [\"s1\", \"web\", \"odd\"]\nnames = \"prefix\"\nseparator = \"__\"\n"
        );
        assert!(federated_config(&[("x", Upstream::Config("/c.toml".into()))]).is_err());
    }

    #[test]
    fn finds_the_url_in_a_log_line() {
        let line = "2026-01-01T00:00:00Z  INFO tether::serve: tether listening on http://127.0.0.1:4567/mcp local=127.0.0.1:4567";
        assert_eq!(mcp_url_in(line).as_deref(), Some("http://127.0.0.1:4567/mcp"));
        assert_eq!(
            mcp_url_in("rmcp reference listening on http://127.0.0.1:80/mcp (channel_capacity 16)").as_deref(),
            Some("http://127.0.0.1:80/mcp")
        );
        assert_eq!(mcp_url_in("INFO authentication is off"), None);
        assert!(super::is_problem("2026-01-01T00:00:00Z  WARN tether_gateway: upstream slow"));
        assert!(!super::is_problem("2026-01-01T00:00:00Z  INFO tether::serve: a WARN in the message"));
    }

    #[test]
    fn health_checks_go_to_the_origin_and_commands_are_quoted_for_a_shell() {
        assert_eq!(origin("http://127.0.0.1:4567/mcp/echo"), "http://127.0.0.1:4567");
        assert_eq!(origin("http://127.0.0.1:4567"), "http://127.0.0.1:4567");
        assert_eq!(shell_quote("/work/target/release/stdio_echo"), "/work/target/release/stdio_echo");
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }
}
