//! The system catalogue: which systems exist (`--systems`), the subjects a
//! run starts (a system, or a tether system's `--baseline` twin), how the
//! load generator talks to each, where their programs are, and how each one
//! is started: its command line ([`Launch`]), its upstream, and the config
//! file of tether-gateway's virtual server.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::process::Command;

use super::process::{free_port, pinned};
use super::store::Store;

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
    /// rmcp_ref's handler served by tether's engine (`rmcp_tether`).
    TetherRmcp,
    /// The TypeScript SDK v1 reference (`bench/ts-sdk-server/server.mjs` on node).
    TsSdk,
    /// A bare axum JSON echo route (`axum_floor`): the HTTP floor.
    AxumFloor,
    /// gateway_http and gateway_stdio: `tether serve --store sqlite:FILE
    /// --upstream echo=…` in front of `rmcp_ref` or `stdio_echo`, at `/mcp/echo`;
    /// gateway_federated: `--config FILE` with the virtual server `fed`, at `/mcp/fed`.
    /// `tether serve` runs the keeper, which runs the server as its child
    /// (`tether engine …`) and holds the stdio children.
    TetherGateway,
    /// gateway_stdio: tether-gateway with `--no-keeper`: one process, its
    /// stdio children its own (the direct pipes the keeper is measured against).
    TetherGatewayNoKeeper,
    /// gateway_stdio: tether-gateway-no-keeper whose stdio command is
    /// `stdio_relay` running `stdio_echo`: a bare process hop that copies
    /// bytes both ways, the floor under the keeper's hop.
    TetherGatewayStdioRelay,
    /// gateway_http: `rmcp_ref` called directly (what tether-gateway fronts).
    RmcpDirect,
    /// gateway_http: `relay_floor`, a bare TCP relay, in front of an
    /// `rmcp_ref` of its own: what one more hop costs, the floor of any gateway.
    RelayFloor,
    /// gateway_stdio: supergateway (npm, `bench/supergateway`) serving `stdio_echo`
    /// over Streamable HTTP, stateful.
    Supergateway,
    /// gateway_stdio: mcp-proxy (PyPI, `bench/mcp-proxy/.venv`) serving `stdio_echo`
    /// over Streamable HTTP, stateful.
    McpProxy,
    /// gateway_http and gateway_stdio: agentgateway (Rust, built from its
    /// source at the pinned release, [`super::agentgateway`]) with one MCP
    /// target, in front of an `rmcp_ref` of its own or serving `stdio_echo`,
    /// stateful, at `/mcp`.
    Agentgateway,
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
    pub const ALL: [System; 22] = [
        System::TetherMemory,
        System::TetherSqlite,
        System::TetherSqliteNometrics,
        System::TetherRedis,
        System::TetherRedisCluster,
        System::TetherRedisReplica,
        System::TetherRedisStrict,
        System::Rmcp,
        System::TetherRmcp,
        System::TsSdk,
        System::AxumFloor,
        System::TetherGateway,
        System::TetherGatewayNoKeeper,
        System::TetherGatewayStdioRelay,
        System::RmcpDirect,
        System::RelayFloor,
        System::Supergateway,
        System::McpProxy,
        System::Agentgateway,
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
            System::TetherRmcp => "tether-rmcp",
            System::TsSdk => "ts-sdk",
            System::AxumFloor => "axum-floor",
            System::TetherGateway => "tether-gateway",
            System::TetherGatewayNoKeeper => "tether-gateway-no-keeper",
            System::TetherGatewayStdioRelay => "tether-gateway-stdio-relay",
            System::RmcpDirect => "rmcp-direct",
            System::RelayFloor => "relay-floor",
            System::Supergateway => "supergateway",
            System::McpProxy => "mcp-proxy",
            System::Agentgateway => "agentgateway",
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
        matches!(
            self,
            System::TetherGateway
                | System::TetherGatewayNoKeeper
                | System::TetherGatewayStdioRelay
                | System::RmcpDirect
                | System::RelayFloor
                | System::Supergateway
                | System::McpProxy
                | System::Agentgateway
        )
    }

    /// The path of its health check: `/healthz`, or mcp-proxy's `/status`
    /// (agentgateway's is on a port of its own: [`Launch::command`]).
    pub(super) fn health_path(self) -> &'static str {
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
                | System::TetherGatewayNoKeeper
                | System::TetherGatewayStdioRelay
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
    /// tether-rmcp: `rmcp_ref`'s handler on tether's engine (`rmcp_tether`, next to `rmcp_ref`).
    pub rmcp_tether: PathBuf,
    pub axum_floor: PathBuf,
    pub relay_floor: PathBuf,
    /// gateway_stdio: the bare stdio relay (`stdio_relay`) of tether-gateway-stdio-relay.
    pub stdio_relay: PathBuf,
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
    /// agentgateway's binary (`bench/agentgateway/target/release/agentgateway`, built by scripts/bench).
    pub agentgateway: PathBuf,
    /// agentgateway's source (`AGENTGATEWAY_SRC`, else `bench/agentgateway/src`): without it, the system is skipped.
    pub agentgateway_src: PathBuf,
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
            System::Agentgateway if !self.agentgateway_src.join("Cargo.toml").is_file() => Some(format!(
                "agentgateway (no source at {}: bring its {} release there, see docs/benchmarks.md)",
                self.agentgateway_src.display(),
                super::agentgateway::PINNED_TAG
            )),
            System::Agentgateway if !runs(&self.agentgateway) => Some(format!(
                "agentgateway (`{} --version` does not run: scripts/bench builds it from {})",
                self.agentgateway.display(),
                self.agentgateway_src.display()
            )),
            System::TetherRedisReplica | System::TetherRedisStrict
                if !runs(Path::new(crate::redis_pair::REDIS_SERVER)) || !runs(Path::new("redis-cli")) =>
            {
                Some(format!("{} (`redis-server --version` or `redis-cli --version` does not run)", system.name()))
            }
            _ => None,
        }
    }
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

/// A system's command as [`Launch::command`] makes it.
pub(super) struct Launched {
    pub(super) cmd: Command,
    /// The MCP URL, when it is known before the server prints anything.
    pub(super) known_url: Option<String>,
    /// The health check's URL, when it is not on the MCP URL's origin.
    pub(super) health_url: Option<String>,
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
    /// tether-gateway only: a config file (`--config`) of the one stdio
    /// upstream [`GATEWAY_UPSTREAM`] ([`stdio_config`]), for what no flag sets
    /// (its `max_processes`); served at `/mcp/echo` as with `--upstream`.
    StdioConfig(PathBuf),
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
            Upstream::Config(_) | Upstream::StdioConfig(_) => bail!("a member of a virtual server is a command or a URL"),
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

/// A config file's text: the stdio server `program` as the upstream
/// [`GATEWAY_UPSTREAM`], with room for `max_processes` live children, all of
/// which one principal may hold (the bench's clients are all one).
pub fn stdio_config(program: &Path, max_processes: usize) -> String {
    // A JSON string is a TOML basic string (the same escapes).
    let quoted = serde_json::Value::from(program.to_string_lossy()).to_string();
    format!(
        "[upstreams.{GATEWAY_UPSTREAM}]\ncommand = [{quoted}]\nmax_processes = {max_processes}\nmax_processes_per_principal = {max_processes}\n"
    )
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

    /// The command, the MCP URL when it is known before the server prints
    /// anything, and its health check's URL when that is not the MCP URL's
    /// origin with [`System::health_path`].
    pub(super) fn command(&self, programs: &Programs, store: Option<&Store>) -> anyhow::Result<Launched> {
        let mut known_url = None;
        let mut health_url = None;
        let mut cmd = match self.subject.system {
            System::TetherMemory
            | System::TetherSqlite
            | System::TetherSqliteNometrics
            | System::TetherRedis
            | System::TetherRedisCluster
            | System::TetherRedisReplica
            | System::TetherRedisStrict
            | System::TetherGateway
            | System::TetherGatewayNoKeeper
            | System::TetherGatewayStdioRelay
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
                    System::TetherGatewayNoKeeper | System::TetherGatewayStdioRelay => {
                        cmd.arg("--no-keeper");
                    }
                    _ => {}
                }
                if matches!(
                    self.subject.system,
                    System::TetherGateway | System::TetherGatewayNoKeeper | System::TetherGatewayStdioRelay
                ) {
                    let target = match &self.upstream {
                        Some(Upstream::Url(url)) => url.clone(),
                        Some(Upstream::Stdio(_)) if self.subject.system == System::TetherGatewayStdioRelay => {
                            let relay = existing(&programs.stdio_relay, "cargo build --release -p tether-bench")?;
                            relay_command(relay, self.stdio_upstream()?)
                        }
                        Some(Upstream::Stdio(_)) => format!("stdio:{}", shell_quote(&self.stdio_upstream()?.to_string_lossy())),
                        Some(Upstream::Config(file) | Upstream::StdioConfig(file)) => {
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
                // Each system says itself whether it runs the keeper, whatever the bench's environment holds.
                cmd.env_remove("TETHER_NO_KEEPER");
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
            System::TetherRmcp => {
                let store = store.context("tether-rmcp needs a store")?;
                let mut cmd = Command::new(existing(&programs.rmcp_tether, "cargo build --release -p tether-bench")?);
                cmd.args(["--listen", &self.listen, "--store", &store.url()]);
                cmd
            }
            System::AxumFloor => {
                let mut cmd = Command::new(existing(&programs.axum_floor, "cargo build --release -p tether-bench")?);
                cmd.args(["--listen", &self.listen]);
                cmd
            }
            System::RelayFloor => {
                let Some(Upstream::Url(url)) = &self.upstream else { bail!("relay-floor needs a URL upstream") };
                let mut cmd = Command::new(existing(&programs.relay_floor, "cargo build --release -p tether-bench")?);
                cmd.args(["--listen", &self.listen, "--upstream", url]);
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
            System::Agentgateway => {
                let program = existing(&programs.agentgateway, "scripts/bench builds it from its source")?;
                let target = match &self.upstream {
                    Some(Upstream::Url(url)) => super::agentgateway::Target::Url(url),
                    Some(Upstream::Stdio(_)) => super::agentgateway::Target::Stdio(self.stdio_upstream()?),
                    _ => bail!("agentgateway needs a URL or a stdio upstream"),
                };
                // Its MCP port, and its readiness probe's (the health check) on a port of its own.
                let (port, ready) = (self.port()?, free_port()?);
                let mut cmd = Command::new(program);
                cmd.arg("--config").arg(super::agentgateway::config(port, ready, &target));
                // What it reads from the environment over its config file: the bench's config decides.
                for var in super::agentgateway::ENVIRONMENT {
                    cmd.env_remove(var);
                }
                known_url = Some(format!("http://127.0.0.1:{port}/mcp"));
                health_url = Some(format!("http://127.0.0.1:{ready}/healthz/ready"));
                cmd
            }
        };
        if let Some(cpus) = &programs.pin_servers {
            cmd = pinned(&cmd, cpus);
        }
        // agentgateway logs on stdout: read as the others' stderr (its WARN and ERROR lines counted).
        let stdout = if self.subject.system == System::Agentgateway { Stdio::piped() } else { Stdio::null() };
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(Stdio::piped()).kill_on_drop(true);
        Ok(Launched { cmd, known_url, health_url })
    }

    /// What follows the URL the server prints to make its MCP endpoint.
    pub(super) fn endpoint_suffix(&self) -> String {
        match (self.subject.system, &self.upstream) {
            (
                System::TetherGateway | System::TetherGatewayNoKeeper | System::TetherGatewayStdioRelay,
                Some(Upstream::Config(_)),
            ) => {
                format!("/{FEDERATED_SERVER}")
            }
            (System::TetherGateway | System::TetherGatewayNoKeeper | System::TetherGatewayStdioRelay, _) => {
                format!("/{GATEWAY_UPSTREAM}")
            }
            _ => String::new(),
        }
    }
}

/// tether-gateway-stdio-relay's `--upstream` target: `program` run by the
/// stdio relay (`stdio:RELAY PROGRAM`, each a word of its own).
fn relay_command(relay: &Path, program: &Path) -> String {
    format!("stdio:{} {}", shell_quote(&relay.to_string_lossy()), shell_quote(&program.to_string_lossy()))
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

#[cfg(test)]
mod tests {
    use super::{Upstream, federated_config, relay_command, shell_quote, stdio_config};
    use crate::server::origin;

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
        assert_eq!(
            stdio_config(std::path::Path::new("/t/stdio \"echo\""), 100),
            "[upstreams.echo]\ncommand = [\"/t/stdio \\\"echo\\\"\"]\nmax_processes = 100\nmax_processes_per_principal = 100\n"
        );
    }

    #[test]
    fn health_checks_go_to_the_origin_and_commands_are_quoted_for_a_shell() {
        assert_eq!(origin("http://127.0.0.1:4567/mcp/echo"), "http://127.0.0.1:4567");
        assert_eq!(origin("http://127.0.0.1:4567"), "http://127.0.0.1:4567");
        assert_eq!(shell_quote("/work/target/release/stdio_echo"), "/work/target/release/stdio_echo");
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
        // The stdio relay's floor: the relay runs the echo server, each path a word.
        assert_eq!(
            relay_command("/t/stdio_relay".as_ref(), "/a b/stdio_echo".as_ref()),
            "stdio:/t/stdio_relay '/a b/stdio_echo'"
        );
    }
}
