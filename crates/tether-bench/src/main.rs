//! `tether-bench`: runs tether and the reference MCP servers side by side on
//! loopback, one after the other on the same machine, through the same
//! checked load generator, and writes the rows (JSON), a Markdown table with
//! the tools_call budget, and an SVG chart. Run it through `scripts/bench`;
//! docs/benchmarks.md describes every scenario and system.
//!
//! - [`server`]: the systems, their stores, starting/stopping/killing them.
//!   [`redis_pair`]: the primary and replica of tether-redis-replica and
//!   tether-redis-strict.
//! - [`load`]: the `tools_call` load generator (also of `gateway_http`,
//!   `gateway_stdio` and `gateway_federated`) and the MCP calls all share.
//! - [`replay`]: `replay_10k`. [`sessions`]: bulk sessions, restart timing.
//! - [`streams`]: `streams_10k`'s open streams and the fan-out to them.
//! - [`report`]: rows, table, budget, chart. SSE is read with
//!   `tether_wire::sse`, the decoder the client and the tests use.
//! - [`baseline`]: with `--baseline`, each tether figure against its twin's
//!   from an earlier build.

mod auth;
mod baseline;
mod load;
mod redis_pair;
mod replay;
mod report;
mod server;
mod sessions;
mod streams;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use report::{Row, Scenario, round};
use server::{BASELINE_SUFFIX, Launch, Programs, Protocol, Server, Store, Subject, System, Upstream};

#[derive(Debug, Parser)]
#[command(
    name = "tether-bench",
    about = "tether and reference MCP servers side by side: throughput, latency, replay, restart, memory"
)]
struct Args {
    /// The `tether` binary to start.
    #[arg(long, default_value = "target/release/tether")]
    tether: PathBuf,
    /// An earlier tether build (e.g. of the commit before a change): every
    /// tether system also runs from it as its twin `<system>@baseline`, with
    /// the same flags and a store of its own, right after it in every
    /// scenario (the same tools_call rounds); the report compares the two.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// The rmcp reference server (default: `rmcp_ref` next to this binary).
    #[arg(long)]
    rmcp_ref: Option<PathBuf>,
    /// The axum floor server (default: `axum_floor` next to this binary).
    #[arg(long)]
    axum_floor: Option<PathBuf>,
    /// Node.js for the TypeScript SDK reference.
    #[arg(long, default_value = "node")]
    node: PathBuf,
    /// The TypeScript SDK reference server script (its node_modules next to it).
    #[arg(long, default_value = "bench/ts-sdk-server/server.mjs")]
    ts_server: PathBuf,
    /// gateway_stdio: the stdio echo server (default: `stdio_echo` next to this binary).
    #[arg(long)]
    stdio_echo: Option<PathBuf>,
    /// gateway_stdio: supergateway's entry script, run with --node (skipped when missing).
    #[arg(long, default_value = "bench/supergateway/node_modules/supergateway/dist/index.js")]
    supergateway: PathBuf,
    /// gateway_stdio: mcp-proxy's command (skipped when missing).
    #[arg(long, default_value = "bench/mcp-proxy/.venv/bin/mcp-proxy")]
    mcp_proxy: PathBuf,
    /// tools_call_oauth: the authorization server's script, run with --node
    /// (oidc-provider; its node_modules next to it).
    #[arg(long, default_value = "interop/oauth/provider.mjs")]
    oauth_provider: PathBuf,
    /// Redis for tether-redis (the system is skipped when `redis-cli -h 127.0.0.1 ping` does not answer).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis: String,
    /// Redis Cluster for tether-redis-cluster (skipped when its nodes do not answer; `scripts/redis-cluster start`).
    #[arg(long, default_value = "redis+cluster://127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303/")]
    redis_cluster: String,
    /// Runs every server on these CPUs (`taskset -c` list, e.g. `1`), with
    /// what it starts; pin the bench itself elsewhere (`scripts/bench --pin`).
    #[arg(long, value_name = "CPUS")]
    pin_servers: Option<String>,
    /// Systems to run, comma-separated, in this order. Each scenario runs
    /// those of its systems that are listed: gateway_http tether-gateway and
    /// rmcp-direct, gateway_stdio tether-gateway, supergateway and mcp-proxy,
    /// gateway_memory and gateway_federated tether-gateway,
    /// tools_call_modern tether-sqlite and tether-sqlite-modern,
    /// tools_call_oauth tether-sqlite-token and tether-sqlite-oauth,
    /// the others the first six.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tether-memory,tether-sqlite,tether-redis,rmcp,ts-sdk,axum-floor,tether-gateway,rmcp-direct,supergateway,mcp-proxy,tether-sqlite-modern,tether-sqlite-token,tether-sqlite-oauth"
    )]
    systems: Vec<System>,
    /// Scenarios to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tools_call,replay_10k,restart_100k_sessions,restart_1m_sessions,idle_session,gateway_http,gateway_stdio,gateway_memory,gateway_federated,tools_call_modern,streams_10k,tools_call_oauth"
    )]
    scenarios: Vec<Scenario>,
    /// tools_call and the gateway scenarios of rounds (gateway_http, gateway_stdio, gateway_federated): concurrent
    /// clients (one session and one connection each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// tools_call and the gateway scenarios: length of each system's measured slice in a round.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// tools_call and the gateway scenarios: calls each system's clients make before the first round (not recorded).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// tools_call and the gateway scenarios: rounds over the scenario's systems, one slice each (A B C, A B C, ...,
    /// every server running throughout); each row reports the round with the
    /// median requests/s. The host drifts by tens of percent within seconds:
    /// short interleaved slices spread that drift over every system instead
    /// of landing on whichever ran in a slow stretch, and the budget's ratio
    /// lines compare each round with the same round of the other system (the
    /// median of those ratios).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// restart_100k_sessions and idle_session: sessions to create.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// restart_1m_sessions: sessions to create (`--quick`: 20,000).
    #[arg(long, default_value_t = 1_000_000)]
    million_sessions: usize,
    /// gateway_memory: live command-upstream sessions to open (each with a
    /// child; on the virtual server of three stdio members, three children);
    /// below the gateway's default `max_processes` of 64 (per upstream), so none is stopped.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u16).range(1..=63))]
    gateway_sessions: u16,
    /// Concurrent clients that create those sessions.
    #[arg(long, default_value_t = 64)]
    session_clients: usize,
    /// streams_10k: sessions, each with its standalone stream open (also with --quick).
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// streams_10k: how long the server's idle CPU is measured (with
    /// --quick 20s); at least the server's keep-alive interval (15 s), so
    /// every stream gets a keep-alive inside it.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    idle_window: Duration,
    /// replay_10k: missed events to replay.
    #[arg(long, default_value_t = 10_000)]
    events: usize,
    /// replay_10k: timed replays of those events (the median is reported).
    #[arg(long, default_value_t = 5)]
    replay_runs: usize,
    /// Shorter runs of every scenario: --duration 1s --warmup 1s --rounds 3 --sessions 10000 --replay-runs 3.
    #[arg(long)]
    quick: bool,
    /// Where the JSON rows are written.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
    /// Where the Markdown table (and the budget check) is written.
    #[arg(long, default_value = "target/bench/results.md")]
    table: PathBuf,
    /// Where the SVG chart of tools_call at 64 clients is written.
    #[arg(long, default_value = "target/bench/tools_call_64.svg")]
    chart: PathBuf,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args.duration = Duration::from_secs(1);
        args.warmup = Duration::from_secs(1);
        args.rounds = 3;
        args.sessions = args.sessions.min(10_000);
        args.million_sessions = args.million_sessions.min(20_000);
        args.replay_runs = args.replay_runs.min(3);
        args.idle_window = args.idle_window.min(Duration::from_secs(20));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tether-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(rows) if rows.iter().all(|r| r.errors == 0) => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("tether-bench: some rows have errors (marked in the table); their numbers are not valid");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tether-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A program next to this executable (the reference servers built with it).
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join(name))).unwrap_or_else(|| PathBuf::from(name))
}

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

async fn run(args: &Args) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(args.clients.iter().all(|&c| c > 0), "--clients must all be 1 or more");
    anyhow::ensure!(!args.duration.is_zero(), "--duration must be more than 0");
    anyhow::ensure!(args.sessions > 0 && args.events > 0, "--sessions and --events must be 1 or more");
    anyhow::ensure!(args.rounds > 0, "--rounds must be 1 or more");
    if let Some(baseline) = &args.baseline {
        anyhow::ensure!(baseline.is_file(), "--baseline {} is not a file", baseline.display());
    }
    let programs = Programs {
        tether: args.tether.clone(),
        baseline: args.baseline.clone(),
        rmcp_ref: args.rmcp_ref.clone().unwrap_or_else(|| sibling("rmcp_ref")),
        axum_floor: args.axum_floor.clone().unwrap_or_else(|| sibling("axum_floor")),
        node: args.node.clone(),
        ts_server: args.ts_server.clone(),
        redis_url: args.redis.clone(),
        redis_cluster_url: args.redis_cluster.clone(),
        stdio_echo: args.stdio_echo.clone().unwrap_or_else(|| sibling("stdio_echo")),
        supergateway: args.supergateway.clone(),
        mcp_proxy: args.mcp_proxy.clone(),
        oauth_provider: args.oauth_provider.clone(),
        pin_servers: args.pin_servers.clone(),
    };
    let wants = |s: Scenario| args.scenarios.contains(&s);
    let load_before = load_average();
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut systems = args.systems.clone();
    for (system, url) in [(System::TetherRedis, &args.redis), (System::TetherRedisCluster, &args.redis_cluster)] {
        if systems.contains(&system) && !server::redis_available(url) {
            eprintln!("== {}: skipped, no Redis answers at {url}", system.name());
            skipped.push(format!("{} (no Redis at {url})", system.name()));
            systems.retain(|&s| s != system);
        }
    }
    for system in [System::TetherRedisReplica, System::TetherRedisStrict] {
        if let Some(why) = systems.contains(&system).then(|| programs.missing(system)).flatten() {
            eprintln!("== {}: skipped, {why}", system.name());
            skipped.push(why);
            systems.retain(|&s| s != system);
        }
    }
    let needing_tools = [
        (Scenario::GatewayStdio, System::Supergateway),
        (Scenario::GatewayStdio, System::McpProxy),
        (Scenario::ToolsCallOauth, System::TetherSqliteOauth),
    ];
    for (scenario, system) in needing_tools {
        if let Some(why) = (wants(scenario) && systems.contains(&system)).then(|| programs.missing(system)).flatten() {
            eprintln!("== {}: skipped, {why}", system.name());
            skipped.push(why);
            systems.retain(|&s| s != system);
        }
    }
    // With --baseline, each tether system is followed by its baseline twin.
    let subjects: Vec<Subject> = systems
        .iter()
        .flat_map(|&system| {
            let twin = (args.baseline.is_some() && system.is_tether()).then_some(Subject { system, baseline: true });
            std::iter::once(Subject::from(system)).chain(twin)
        })
        .collect();
    let of = |scenario: Scenario| -> Vec<Subject> { subjects.iter().copied().filter(|s| scenario.runs(s.system)).collect() };
    // The gateway scenarios of rounds share their rounds: gateway_federated's
    // budget line compares it with gateway_stdio and gateway_http round by
    // round, so its slice comes between theirs.
    let phases: [&[Scenario]; 4] = [
        &[Scenario::ToolsCall],
        &[Scenario::ToolsCallModern],
        &[Scenario::ToolsCallOauth],
        &[Scenario::GatewayHttp, Scenario::GatewayFederated, Scenario::GatewayStdio],
    ];
    for phase in phases {
        let these: Vec<(Scenario, Subject)> =
            phase.iter().filter(|&&s| wants(s)).flat_map(|&s| of(s).into_iter().map(move |subject| (s, subject))).collect();
        if !these.is_empty() {
            rows.extend(interleaved(args, &programs, &these).await);
        }
    }
    if wants(Scenario::GatewayMemory) {
        for subject in of(Scenario::GatewayMemory) {
            rows.push(gateway_memory(args, &programs, subject).await);
        }
    }
    if wants(Scenario::Streams10k) && systems.contains(&System::TetherSqlite) {
        rows.push(streams_10k(args, &programs).await);
    }
    for &subject in &subjects {
        // The floor has no MCP, no streams and no sessions: only tools_call applies;
        // the gateway systems have scenarios of their own.
        if subject.system == System::AxumFloor || subject.system.gateway() || subject.system.variant() {
            continue;
        }
        if wants(Scenario::Replay10k) {
            rows.push(replay_10k(args, &programs, subject).await);
        }
        let restart = wants(Scenario::Restart100kSessions) && subject.system.durable_sessions();
        if wants(Scenario::IdleSession) || restart {
            let plan = Sessions {
                n: args.sessions,
                idle: wants(Scenario::IdleSession),
                restart: restart.then_some(Scenario::Restart100kSessions),
            };
            rows.extend(idle_and_restart(args, &programs, subject, plan).await);
        }
        if wants(Scenario::Restart1mSessions) && Scenario::Restart1mSessions.runs(subject.system) {
            let plan = Sessions { n: args.million_sessions, idle: false, restart: Some(Scenario::Restart1mSessions) };
            rows.extend(idle_and_restart(args, &programs, subject, plan).await);
        }
    }
    sort(&mut rows);

    let caption = args.quick.then(|| {
        format!(
            "`--quick`: {} warm-up + {} measured per tools_call and gateway run, {} sessions for restart/idle, {} for gateway_memory, {} events for replay, {} timed replays",
            humantime::format_duration(args.warmup),
            humantime::format_duration(args.duration),
            args.sessions,
            args.gateway_sessions,
            args.events,
            args.replay_runs
        )
    });
    let table = report::table(&rows, caption.as_deref());
    let budget = report::budget(&rows);
    let mut markdown = format!("{}; load average {load_before} at the start, {} at the end.\n\n", machine(), load_average());
    markdown.push_str(&table);
    if !skipped.is_empty() {
        markdown.push_str(&format!("\nNot run: {}.\n", skipped.join(", ")));
    }
    markdown.push('\n');
    markdown.push_str(&budget);
    if let Some(path) = &args.baseline {
        markdown.push_str(&format!("\nAgainst the baseline `{}` (current / baseline):\n\n", path.display()));
        markdown.push_str(&baseline::comparison(&rows));
    }
    print!("{markdown}");
    write(&args.out, &(serde_json::to_string_pretty(&rows)? + "\n"))?;
    write(&args.table, &markdown)?;
    write(&args.chart, &report::chart(&rows, 64, args.quick))?;
    eprintln!("rows written to {}, table to {}, chart to {}", args.out.display(), args.table.display(), args.chart.display());
    Ok(rows)
}

/// Table order: by scenario, system and clients; a baseline twin's row
/// right after the current build's.
fn sort(rows: &mut [Row]) {
    rows.sort_by_key(|r| {
        let scenario = Scenario::ALL.iter().position(|s| s.name() == r.scenario).unwrap_or(usize::MAX);
        let name = r.system.strip_suffix(BASELINE_SUFFIX).unwrap_or(&r.system);
        let system = System::ALL.iter().position(|s| s.name() == name).unwrap_or(usize::MAX);
        (scenario, system, r.clients, name.len() < r.system.len())
    });
}

/// The 1-minute load average (other work on the machine skews every figure).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// CPU count and model.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| l.strip_prefix("model name").and_then(|v| v.split_once(':')).map(|(_, m)| m.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs ({model})")
}

/// Starts `system` on a fresh store (or none).
async fn start(programs: &Programs, launch: &Launch) -> anyhow::Result<(Server, Option<Store>)> {
    let store = Store::fresh(launch.subject.system, programs)?;
    let server = Server::start(launch, programs, store.as_ref()).await?;
    Ok((server, store))
}

/// A system as a scenario runs it, with what it needs around it.
struct Running {
    server: Server,
    /// Its store (removed when this is dropped).
    _store: Option<Store>,
    /// tether-gateway in gateway_http and gateway_federated: the `rmcp_ref` it fronts.
    upstream: Option<Server>,
    /// tether-gateway with a virtual server: the dir of its config file
    /// (tether-sqlite-token: of its token file).
    _config: Option<tempfile::TempDir>,
    /// tools_call_oauth: the bearer tokens its clients send.
    tokens: Vec<String>,
    /// tether-sqlite-oauth: the authorization server (stopped with it).
    _issuer: Option<auth::Issuer>,
}

impl Running {
    async fn stop(self) -> anyhow::Result<()> {
        let stopped = self.server.stop().await;
        if let Some(upstream) = self.upstream {
            upstream.stop().await.context("its upstream rmcp_ref")?;
        }
        stopped
    }
}

/// An `rmcp_ref` for tether-gateway to front (gateway_http, gateway_federated).
async fn rmcp_upstream(programs: &Programs) -> anyhow::Result<Server> {
    Server::start(&Launch::new(System::RmcpDirect.into()), programs, None)
        .await
        .context("the rmcp_ref upstream of tether-gateway")
}

/// Starts `subject` as `scenario` runs it: for tools_call as it is; for
/// gateway_http tether-gateway in front of an `rmcp_ref` of its own (started
/// first) and rmcp-direct as that `rmcp_ref`; for gateway_stdio each system
/// serving `stdio_echo`; for gateway_federated tether-gateway serving the
/// virtual server of two `stdio_echo` members and an `rmcp_ref` of its own
/// ([`load::FEDERATED_MEMBERS`]).
async fn start_for(programs: &Programs, scenario: Scenario, subject: Subject) -> anyhow::Result<Running> {
    let mut launch = Launch::new(subject);
    let mut upstream = None;
    match (scenario, subject.system) {
        (Scenario::GatewayHttp, System::TetherGateway) => {
            let rmcp = rmcp_upstream(programs).await?;
            launch.upstream = Some(Upstream::Url(rmcp.mcp_url.clone()));
            upstream = Some(rmcp);
        }
        (Scenario::GatewayFederated, System::TetherGateway) => {
            let rmcp = rmcp_upstream(programs).await?;
            let [s1, s2, web] = load::FEDERATED_MEMBERS;
            let members = [
                (s1, Upstream::Stdio(programs.stdio_echo.clone())),
                (s2, Upstream::Stdio(programs.stdio_echo.clone())),
                (web, Upstream::Url(rmcp.mcp_url.clone())),
            ];
            return start_federated(programs, subject, &members, Some(rmcp)).await;
        }
        (Scenario::GatewayStdio | Scenario::GatewayMemory, _) => {
            launch.upstream = Some(Upstream::Stdio(programs.stdio_echo.clone()))
        }
        (Scenario::ToolsCallOauth, System::TetherSqliteToken) => {
            let dir = tempfile::Builder::new().prefix("tether-bench-tokens-").tempdir().context("cannot create a temp dir")?;
            let file = dir.path().join("tokens");
            let tokens: Vec<String> = (0..BEARER_TOKENS).map(|_| format!("{:032x}", rand::random::<u128>())).collect();
            let lines: String = tokens.iter().map(|t| format!("{t} bench\n")).collect();
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()));
            written.with_context(|| format!("cannot write {}", file.display()))?;
            launch.extra_args = vec!["--auth-tokens".into(), file.display().to_string()];
            let (server, store) = start(programs, &launch).await?;
            return Ok(Running { server, _store: store, upstream, _config: Some(dir), tokens, _issuer: None });
        }
        (Scenario::ToolsCallOauth, System::TetherSqliteOauth) => {
            let issuer = auth::Issuer::start(&programs.oauth_provider).await?;
            launch.extra_args = vec!["--oauth-issuer".into(), issuer.url.clone()];
            let (server, store) = start(programs, &launch).await?;
            let tokens = issuer.tokens(&server.mcp_url, BEARER_TOKENS).await?;
            return Ok(Running { server, _store: store, upstream, _config: None, tokens, _issuer: Some(issuer) });
        }
        _ => {}
    }
    let (server, store) = start(programs, &launch).await?;
    Ok(Running { server, _store: store, upstream, _config: None, tokens: Vec::new(), _issuer: None })
}

/// Distinct bearer tokens of tools_call_oauth's systems (client `i` sends token `i % BEARER_TOKENS`).
const BEARER_TOKENS: usize = 64;

/// tether-gateway with a config file of `members` and the virtual server
/// `fed` of them (its MCP URL `/mcp/fed`); `upstream` is stopped with it.
async fn start_federated(
    programs: &Programs,
    subject: Subject,
    members: &[(&str, Upstream)],
    upstream: Option<Server>,
) -> anyhow::Result<Running> {
    let dir = tempfile::Builder::new().prefix("tether-bench-config-").tempdir().context("cannot create a temp dir")?;
    let file = dir.path().join("tether.toml");
    std::fs::write(&file, server::federated_config(members)?).with_context(|| format!("cannot write {}", file.display()))?;
    let mut launch = Launch::new(subject);
    launch.upstream = Some(Upstream::Config(file));
    // On an error the upstream is dropped, which kills it.
    let (server, store) = start(programs, &launch).await?;
    Ok(Running { server, _store: store, upstream, _config: Some(dir), tokens: Vec::new(), _issuer: None })
}

/// The row of one system and client count from its tools_call rounds: the
/// round with the median requests/s, with the spread and every round's
/// requests/s. A round with errors is reported instead.
fn median_round(mut rounds: Vec<Row>) -> Option<Row> {
    if let Some(failed) = rounds.iter().position(|r| r.errors > 0) {
        return Some(rounds.swap_remove(failed));
    }
    let runs = rounds.len();
    let in_round_order: Vec<f64> = rounds.iter().map(|r| r.rps.unwrap_or(0.0)).collect();
    rounds.sort_by(|a, b| a.rps.unwrap_or(0.0).total_cmp(&b.rps.unwrap_or(0.0)));
    let (low, high) = (rounds.first()?.rps.unwrap_or(0.0), rounds.last()?.rps.unwrap_or(0.0));
    let mut median = rounds.swap_remove(runs / 2);
    if runs > 1 {
        median.spread = Some(format!("median of {runs} interleaved rounds, {low:.0} to {high:.0} rps"));
        median.rounds_rps = in_round_order;
    }
    Some(median)
}

/// Calls made at the start of every measured slice and not counted: the
/// system's threads wake up from the other systems' slices.
const SLICE_LEAD_IN: Duration = Duration::from_millis(100);

/// tools_call (and gateway_http, gateway_stdio, gateway_federated: the same
/// load on other systems), interleaved in short slices: every participant's
/// server (a system as a scenario runs it) runs at once (idle outside its
/// slices), each with its clients' sessions open and warmed up; then each
/// round gives every participant one `--duration` slice in turn. The host's
/// speed drifts by tens of percent within seconds (the load generator's own
/// CPU per call, the same work against every system, moves with it), so
/// figures taken minutes apart compare the host as much as the systems;
/// slices a second apart see the same host. The gateway scenarios run in
/// one set of rounds, so their rows pair up round by round across scenarios
/// too. Peak RSS is the server's over the whole run (not its upstream's or
/// children's).
async fn interleaved(args: &Args, programs: &Programs, participants: &[(Scenario, Subject)]) -> Vec<Row> {
    let names: Vec<&str> = participants.iter().fold(Vec::new(), |mut names, (scenario, _)| {
        if !names.contains(&scenario.name()) {
            names.push(scenario.name());
        }
        names
    });
    let name = names.join(" + ");
    let mut servers = Vec::with_capacity(participants.len());
    for &(scenario, subject) in participants {
        eprintln!("== {}: starting for {}", subject.name(), scenario.name());
        servers.push(((scenario, subject), start_for(programs, scenario, subject).await));
    }
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let mut loads = Vec::new();
        for ((scenario, subject), started) in &servers {
            let (scenario, subject) = (*scenario, *subject);
            let row = |error: String| Row::failed(subject, scenario, clients, args.quick, error);
            let server = match started {
                Ok(running) => &running.server,
                Err(e) => {
                    rows.push(row(format!("{e:#}")));
                    continue;
                }
            };
            eprintln!(
                "== {}: {}, {clients} clients, {} warm-up",
                subject.name(),
                scenario.name(),
                humantime::format_duration(args.warmup)
            );
            let protocol = if scenario == Scenario::GatewayFederated { Protocol::Federated } else { subject.system.protocol() };
            let tokens = started.as_ref().map(|r| r.tokens.as_slice()).unwrap_or_default();
            let warmed = match load::Load::open(protocol, &server.mcp_url, clients, tokens).await {
                Ok(mut load) => load.run(args.warmup, Duration::ZERO, None).await.map(|warm_up| (load, warm_up)),
                Err(e) => Err(e),
            };
            match warmed {
                Ok((load, warm_up)) if warm_up.errors == 0 => {
                    loads.push((scenario, subject, server.pid(), load, Vec::with_capacity(args.rounds)))
                }
                Ok((_, warm_up)) => rows.push(row(format!("warm-up: {}", warm_up.first_errors.join("; ")))),
                Err(e) => rows.push(row(format!("{e:#}"))),
            }
        }
        for round in 1..=args.rounds {
            eprintln!("== {name}, {clients} clients, round {round} of {}", args.rounds);
            for (scenario, subject, pid, load, rounds) in &mut loads {
                let outcome = load.run(SLICE_LEAD_IN, args.duration, Some(*pid)).await;
                rounds.push(measured(*subject, *scenario, clients, args.quick, outcome));
            }
        }
        rows.extend(loads.into_iter().filter_map(|(_, _, _, _, rounds)| median_round(rounds)));
    }
    for ((scenario, subject), started) in servers {
        let Ok(running) = started else { continue };
        let label = format!("{} ({})", subject.name(), scenario.name());
        let own = |r: &Row| r.system == subject.name() && r.scenario == scenario.name();
        match running.server.peak_rss_mib() {
            Ok(rss) => rows.iter_mut().filter(|r| own(r)).for_each(|r| r.rss_mib = Some(round(rss, 1))),
            Err(e) => eprintln!("   {label}: cannot read the peak RSS: {e:#}"),
        }
        let (count, last) = running.server.problems();
        if count > 0 {
            eprintln!("   {label} logged {count} WARN/ERROR lines; the last ones:\n{}", last.join("\n"));
            for r in rows.iter_mut().filter(|r| own(r)) {
                let logged = format!("server log: {count} WARN/ERROR lines");
                r.note = Some(r.note.take().map_or(logged.clone(), |n| format!("{n}; {logged}")));
            }
        }
        if rows.iter().any(|r| own(r) && r.errors > 0) {
            eprintln!("   {label} log tail:\n{}", running.server.log_tail());
        }
        if let Err(e) = running.stop().await {
            eprintln!("   {e:#}");
        }
    }
    rows
}

/// One slice's row.
fn measured(subject: Subject, scenario: Scenario, clients: usize, quick: bool, outcome: anyhow::Result<load::Outcome>) -> Row {
    let mut row = Row::new(subject, scenario, clients, quick);
    match outcome {
        Ok(outcome) => {
            for e in &outcome.first_errors {
                eprintln!("   {}: error: {e}", subject.name());
            }
            row.rps = Some(round(outcome.rps(), 1));
            row.p50_ms = Some(round(outcome.quantile_ms(0.50), 3));
            row.p99_ms = Some(round(outcome.quantile_ms(0.99), 3));
            row.client_us_per_call = outcome.client_us_per_call().map(|us| round(us, 1));
            row.server_us_per_call = outcome.server_us_per_call().map(|us| round(us, 1));
            row.errors = outcome.errors;
            row.error = outcome.first_errors.first().cloned();
            eprintln!(
                "   {:<40} {:>8.0} rps, p50 {:.3} ms, p99 {:.3} ms, {} errors, CPU per call: server {:.1} µs, load generator {:.1} µs",
                format!("{} {}", subject.name(), scenario.name()),
                outcome.rps(),
                outcome.quantile_ms(0.5),
                outcome.quantile_ms(0.99),
                outcome.errors,
                outcome.server_us_per_call().unwrap_or(f64::NAN),
                outcome.client_us_per_call().unwrap_or(f64::NAN)
            );
        }
        Err(e) => {
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

/// replay_10k on one fresh server.
async fn replay_10k(args: &Args, programs: &Programs, subject: Subject) -> Row {
    eprintln!("== {}: replay_10k ({} events)", subject.name(), args.events);
    let mut row = Row::new(subject, Scenario::Replay10k, 1, args.quick);
    row.count = Some(args.events as u64);
    let mut launch = Launch::new(subject);
    if subject.system == System::Rmcp {
        // rmcp keeps `channel_capacity` events per stream for replay (16 by default).
        let capacity = args.events + 16;
        launch.channel_capacity = Some(capacity);
        row.note = Some(format!("SessionConfig.channel_capacity = {capacity} (default 16 keeps 16 events)"));
    }
    let outcome = async {
        let (server, _store) = start(programs, &launch).await?;
        let result = replay::run(&server.mcp_url, args.events, args.replay_runs).await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", server.log_tail());
        }
        let rss = server.peak_rss_mib();
        server.stop().await?;
        Ok::<_, anyhow::Error>((result?, rss?))
    }
    .await;
    match outcome {
        Ok((outcome, rss)) => {
            let ms = outcome.ms;
            eprintln!("   median {ms:.1} ms of {} runs ({:.1} to {:.1} ms)", outcome.runs, outcome.min_ms, outcome.max_ms);
            row.ms = Some(round(ms, 1));
            row.spread = Some(format!("median of {} runs, {:.1} to {:.1} ms", outcome.runs, outcome.min_ms, outcome.max_ms));
            let retries = format!("fill: {} retries after 429", outcome.fill_retries);
            eprintln!("   {retries}");
            row.note = Some(match row.note.take() {
                Some(note) => format!("{note}; {retries}"),
                None => retries,
            });
            if outcome.resent_last_event {
                eprintln!("   note: the server re-sent the Last-Event-ID event before the missed ones");
                row.deviation =
                    Some(format!("re-sent the Last-Event-ID event first (a duplicate), then the {} missed ones", args.events));
            }
            row.rss_mib = Some(round(rss, 1));
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

/// Resident bytes after letting the server settle.
async fn settled_rss(server: &Server) -> anyhow::Result<u64> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.rss_bytes()
}

/// What one run of [`idle_and_restart`] measures.
struct Sessions {
    /// Sessions created (after the warm-up).
    n: usize,
    /// idle_session: RSS per session.
    idle: bool,
    /// The restart scenario timed after them, if any.
    restart: Option<Scenario>,
}

/// idle_session and/or a restart scenario (restart_100k_sessions,
/// restart_1m_sessions) on one fresh server and store: warm-up sessions,
/// RSS, `n` more sessions, RSS again; then SIGKILL, restart on the same
/// store, time the first answer on an old session.
async fn idle_and_restart(args: &Args, programs: &Programs, subject: Subject, plan: Sessions) -> Vec<Row> {
    let Sessions { n, idle, restart: restart_scenario } = plan;
    let restart = restart_scenario.is_some();
    eprintln!(
        "== {}: {} sessions for{}{}",
        subject.name(),
        n,
        if idle { " idle_session" } else { "" },
        restart_scenario.map_or(String::new(), |s| format!(" {}", s.name()))
    );
    let mut idle_row = Row::new(subject, Scenario::IdleSession, args.session_clients, args.quick);
    let mut restart_row =
        Row::new(subject, restart_scenario.unwrap_or(Scenario::Restart100kSessions), args.session_clients, args.quick);
    idle_row.count = Some(n as u64);
    restart_row.count = Some(n as u64);
    let outcome = async {
        // Warm-up: thread stacks, pools, JIT, allocator arenas are not per-session costs.
        let warm = (n / 100).max(args.session_clients);
        // All the bench's sessions belong to one (anonymous) principal; tether
        // caps that at 100,000 by default, which warm-up + 100,000 exceeds.
        let mut launch = Launch::new(subject);
        if subject.system.is_tether() {
            launch.max_sessions = Some(warm + n + 1_000);
        }
        let store = Store::fresh(subject.system, programs)?;
        let server = Server::start(&launch, programs, store.as_ref()).await?;
        sessions::create(&server.mcp_url, warm, args.session_clients).await.context("warm-up sessions")?;
        let before = settled_rss(&server).await?;
        let store_before = store.as_ref().and_then(Store::outside_bytes);
        let started = Instant::now();
        let ids = match sessions::create(&server.mcp_url, n, args.session_clients).await {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("   server log tail:\n{}", server.log_tail());
                return Err(e);
            }
        };
        eprintln!("   {n} sessions in {:.1} s", started.elapsed().as_secs_f64());
        if idle {
            let after = settled_rss(&server).await?;
            idle_row.bytes = Some(round((after as f64 - before as f64) / n as f64, 0));
            idle_row.rss_mib = Some(round(after as f64 / (1024.0 * 1024.0), 1));
            if let (Some(a), Some(b)) = (store.as_ref().and_then(Store::outside_bytes), store_before) {
                idle_row.store_bytes = Some(round((a as f64 - b as f64) / n as f64, 0));
            }
            eprintln!(
                "   RSS {:.1} MiB -> {:.1} MiB: {:.0} bytes per idle session",
                before as f64 / 1048576.0,
                after as f64 / 1048576.0,
                idle_row.bytes.unwrap_or(0.0)
            );
        }
        if !restart {
            server.stop().await?;
            return Ok(());
        }
        if restart_scenario == Some(Scenario::Restart1mSessions)
            && let (Some(after), Some(before)) = (store.as_ref().and_then(Store::outside_bytes), store_before)
        {
            restart_row.bytes_per_session = Some(round((after as f64 - before as f64) / n as f64, 0));
            eprintln!("   store: {:.0} bytes per stored session", restart_row.bytes_per_session.unwrap_or(0.0));
        }
        let old = ids[ids.len() / 2].clone();
        drop(ids);
        server.kill().await?;
        let port = server::free_port()?;
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        launch.listen = addr.to_string();
        let spawned = Instant::now();
        let mut restarted = Server::spawn(&launch, programs, store.as_ref())?;
        let url = format!("http://{addr}/mcp");
        let result = sessions::first_answer(addr, &url, &old, spawned).await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", restarted.log_tail());
        }
        let ms = result?;
        eprintln!("   restart: first answer on an old session {ms:.1} ms after spawning");
        restart_row.ms = Some(round(ms, 1));
        restarted.ready().await?;
        restart_row.rss_mib = Some(round(restarted.peak_rss_mib()?, 1));
        restarted.stop().await?;
        drop(store);
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        eprintln!("   error: {e:#}");
        for row in [&mut idle_row, &mut restart_row] {
            if row.bytes.is_none() && row.ms.is_none() {
                row.errors = 1;
                row.error = Some(format!("{e:#}"));
            }
        }
    }
    let mut rows = Vec::new();
    if idle {
        rows.push(idle_row);
    }
    if restart {
        rows.push(restart_row);
    }
    rows
}

/// The environment variable that hands streams_10k's server its admin token.
const ADMIN_TOKEN_ENV: &str = "TETHER_BENCH_ADMIN_TOKEN";
/// The server's keep-alive interval (tether's default; there is no flag).
const SERVER_KEEPALIVE: Duration = Duration::from_secs(15);

/// Raises this process's soft limit on open files to `wanted` (its hard
/// limit allowing); the servers it spawns inherit it. Returns the limit.
fn raise_open_files(wanted: u64) -> anyhow::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let soft = limit.current.unwrap_or(u64::MAX);
    anyhow::ensure!(
        hard >= wanted,
        "streams_10k needs {wanted} open files in the bench and in the server, the hard limit is {hard}: raise it (ulimit -Hn, or LimitNOFILE)"
    );
    if soft < wanted {
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(wanted), maximum: limit.maximum })
            .context("cannot raise the soft limit on open files")?;
    }
    Ok(soft.max(wanted))
}

/// streams_10k on one fresh tether-sqlite: `--streams` sessions, a
/// standalone GET stream open on each; after the server settled, its RSS and
/// CPU over `--idle-window` (every stream must have had a keep-alive by
/// then); then one notification to every session through the admin API and
/// the time until the last stream has it.
async fn streams_10k(args: &Args, programs: &Programs) -> Row {
    let n = args.streams;
    let subject = Subject::from(System::TetherSqlite);
    eprintln!("== {}: streams_10k ({n} sessions with an open stream each)", subject.name());
    let mut row = Row::new(subject, Scenario::Streams10k, n, args.quick);
    row.count = Some(n as u64);
    let outcome = async {
        anyhow::ensure!(n > 0, "--streams must be 1 or more");
        // The bench holds a socket per stream, and so does the server (which
        // inherits the limit), plus its store's files and the session clients.
        let files = raise_open_files(n as u64 + 1_024)?;
        let token = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let mut launch = Launch::new(subject);
        // Sessions with an open stream are never evicted; a cache below their
        // number would rescan the whole map on every insertion beyond it.
        // The connection cap (default 10,000) must leave room beside the
        // streams for the admin API's POST: at the cap it would wait in the
        // listen backlog until a stream closed, that is forever.
        launch.extra_args = vec![
            "--session-cache".into(),
            (n + 1_024).to_string(),
            "--max-connections".into(),
            (n + 1_024).to_string(),
            "--admin-token-env".into(),
            ADMIN_TOKEN_ENV.into(),
        ];
        launch.env = vec![(ADMIN_TOKEN_ENV.into(), token.clone())];
        launch.max_sessions = Some(n + 1_024);
        let (server, _store) = start(programs, &launch).await?;
        let result = async {
            let started = Instant::now();
            let ids = sessions::create(&server.mcp_url, n, args.session_clients).await.context("creating the sessions")?;
            eprintln!("   {n} sessions in {:.1} s (open files: {files})", started.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss_sessions = server.rss_bytes()?;
            let origin = server::origin(&server.mcp_url);
            let addr: std::net::SocketAddr =
                origin.trim_start_matches("http://").parse().with_context(|| format!("no address in {}", server.mcp_url))?;
            let path = &server.mcp_url[origin.len()..];
            let started = Instant::now();
            let streams = streams::Streams::open(addr, path, &ids).await?;
            eprintln!("   {n} streams open in {:.1} s", started.elapsed().as_secs_f64());
            drop(ids);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss_open = server.rss_bytes()?;
            let per_stream = (rss_open as f64 - rss_sessions as f64) / n as f64;
            let pid = server.pid().to_string();
            let (cpu_before, at) = (load::cpu_time(&pid).context("cannot read the server's CPU time")?, Instant::now());
            tokio::time::sleep(args.idle_window).await;
            let cpu = load::cpu_time(&pid).context("cannot read the server's CPU time")?.saturating_sub(cpu_before);
            let window = at.elapsed();
            let rss_idle = server.rss_bytes()?;
            streams.check()?;
            let (fewest, most) = streams.keepalives();
            if args.idle_window >= SERVER_KEEPALIVE {
                anyhow::ensure!(fewest >= 1, "a stream had no keep-alive after {window:?} idle");
            }
            let (fanout_ms, answer) = streams.fan_out(&format!("{origin}/admin/notify"), &token).await?;
            let rss_after = server.rss_bytes()?;
            let peak = server.peak_rss_mib()?;
            drop(streams);
            eprintln!(
                "   RSS {:.1} MiB with the sessions, {:.1} MiB with the streams open ({per_stream:.0} B per stream), {:.1} MiB idle, {:.1} MiB after the fan-out (peak {peak:.1}); idle CPU {:.2}% over {:.1} s; keep-alives per stream {fewest} to {most}; fan-out {fanout_ms:.0} ms ({answer})",
                rss_sessions as f64 / 1048576.0,
                rss_open as f64 / 1048576.0,
                rss_idle as f64 / 1048576.0,
                rss_after as f64 / 1048576.0,
                cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
                window.as_secs_f64()
            );
            Ok::<_, anyhow::Error>((rss_idle, cpu, window, (fewest, most), fanout_ms, (rss_sessions, per_stream, rss_after, peak)))
        }
        .await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", server.log_tail());
        }
        let (count, last) = server.problems();
        server.stop().await?;
        result.map(|r| (r, count, last))
    }
    .await;
    match outcome {
        Ok(((rss_idle, cpu, window, (fewest, most), fanout_ms, (rss_sessions, per_stream, rss_after, peak)), problems, last)) => {
            row.bytes = Some(round(per_stream, 0));
            row.rss_mib = Some(round(rss_idle as f64 / 1048576.0, 1));
            row.cpu_percent = Some(round(cpu.as_secs_f64() / window.as_secs_f64() * 100.0, 2));
            row.fanout_ms = Some(round(fanout_ms, 1));
            let mut note = format!(
                "idle window {:.0} s, keep-alives per stream {fewest} to {most}; RSS {:.1} MiB before the streams opened (bytes: RSS growth per open stream), {:.1} MiB after the fan-out, peak {peak:.1} MiB; --session-cache {} --max-sessions-per-principal {} --max-connections {}",
                window.as_secs_f64(),
                rss_sessions as f64 / 1048576.0,
                rss_after as f64 / 1048576.0,
                n + 1_024,
                n + 1_024,
                n + 1_024
            );
            if problems > 0 {
                eprintln!("   the server logged {problems} WARN/ERROR lines; the last ones:\n{}", last.join("\n"));
                note.push_str(&format!("; server log: {problems} WARN/ERROR lines"));
            }
            row.note = Some(note);
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

/// Warm-up sessions of gateway_memory (each ended with DELETE before the first RSS reading).
const GATEWAY_WARM_UP: usize = 5;
/// gateway_memory's virtual server: three stdio members (`stdio_echo` each).
const MEMORY_MEMBERS: [&str; 3] = ["s1", "s2", "s3"];

/// One command-upstream session as gateway_memory opens it: `initialize`,
/// `notifications/initialized` and one checked `tools/call` of `thought`
/// (so its child is started and has answered), or through a virtual server
/// one of each member's `thought` (so every member's child is); returns the
/// session id.
async fn live_session(http: &reqwest::Client, url: &str, members: &[&str]) -> Result<String, String> {
    let session = load::open_session(http, url, false).await?;
    // As a client does first (and the virtual server does for its members
    // anyway): the same work on both sides of the memory line.
    load::list_tools(http, url, &session).await.map_err(|e| format!("tools/list: {e}"))?;
    if members.is_empty() {
        load::call_thought(http, url, &session, 1).await.map_err(|e| format!("tools/call: {e}"))?;
    }
    for (id, member) in (1..).zip(members) {
        load::call_member_thought(http, url, &session, id, member, 1).await.map_err(|e| format!("tools/call: {e}"))?;
    }
    Ok(session)
}

/// What gateway_memory read on one server: tether's RSS before and after
/// the live sessions, and its live children and their RSS after them.
struct Memory {
    before: u64,
    after: u64,
    children: usize,
    children_rss: u64,
}

impl Memory {
    /// tether's own RSS growth per live session.
    fn per_session(&self, n: usize) -> f64 {
        (self.after as f64 - self.before as f64) / n as f64
    }
    /// The live children's RSS per live session.
    fn children_per_session(&self, n: usize) -> f64 {
        self.children_rss as f64 / n as f64
    }
}

/// gateway_memory's reading of one started server: warm-up sessions (ended
/// again, so their children stop), RSS, `n` live sessions, 2 s of rest, RSS
/// again; each session must still hold a child per member (one without
/// members).
async fn memory_of(running: Running, n: usize, members: &[&str]) -> anyhow::Result<Memory> {
    let server = &running.server;
    let result = async {
        let http = load::http_client().map_err(anyhow::Error::msg)?;
        let url = server.mcp_url.as_str();
        for i in 0..GATEWAY_WARM_UP {
            let session = live_session(&http, url, members).await.map_err(|e| anyhow::anyhow!("warm-up session {i}: {e}"))?;
            load::delete_session(&http, url, &session).await.map_err(|e| anyhow::anyhow!("warm-up session {i}: {e}"))?;
        }
        let before = settled_rss(server).await?;
        let left = server.live_children()?;
        anyhow::ensure!(left == 0, "{left} children still live after DELETE of the warm-up sessions");
        let mut sessions = Vec::with_capacity(n);
        for i in 0..n {
            sessions.push(live_session(&http, url, members).await.map_err(|e| anyhow::anyhow!("session {i}: {e}"))?);
        }
        let after = settled_rss(server).await?;
        let children = server.live_children()?;
        let children_rss = server.children_rss_bytes()?;
        let want = n * members.len().max(1);
        anyhow::ensure!(children == want, "{children} live children after {n} sessions, want {want}");
        Ok::<_, anyhow::Error>(Memory { before, after, children, children_rss })
    }
    .await;
    if result.is_err() {
        eprintln!("   server log tail:\n{}", server.log_tail());
    }
    running.stop().await?;
    result
}

/// gateway_memory on one fresh tether-gateway in front of `stdio_echo`
/// ([`memory_of`]): `bytes` is tether's own RSS growth per live session,
/// `children_bytes` its children's RSS per session; then the same on a
/// fresh tether-gateway serving a virtual server of three `stdio_echo`
/// members (`federated_bytes`, `federated_children_bytes`).
async fn gateway_memory(args: &Args, programs: &Programs, subject: Subject) -> Row {
    let n = usize::from(args.gateway_sessions);
    eprintln!("== {}: gateway_memory ({n} live command-upstream sessions)", subject.name());
    let mut row = Row::new(subject, Scenario::GatewayMemory, 1, args.quick);
    row.count = Some(n as u64);
    let outcome = async {
        let running = start_for(programs, Scenario::GatewayMemory, subject).await?;
        let single = memory_of(running, n, &[]).await?;
        eprintln!(
            "   RSS {} KiB -> {} KiB: {:.0} bytes per live session; {} live children, {:.0} bytes of theirs per session",
            single.before / 1024,
            single.after / 1024,
            single.per_session(n),
            single.children,
            single.children_per_session(n)
        );
        eprintln!("== {}: gateway_memory, a virtual server of {} stdio members", subject.name(), MEMORY_MEMBERS.len());
        let members: Vec<(&str, Upstream)> =
            MEMORY_MEMBERS.iter().map(|&name| (name, Upstream::Stdio(programs.stdio_echo.clone()))).collect();
        let running = start_federated(programs, subject, &members, None).await.context("the virtual server")?;
        let federated = memory_of(running, n, &MEMORY_MEMBERS).await.context("the virtual server")?;
        eprintln!(
            "   RSS {} KiB -> {} KiB: {:.0} bytes per live session; {} live children, {:.0} bytes of theirs per session",
            federated.before / 1024,
            federated.after / 1024,
            federated.per_session(n),
            federated.children,
            federated.children_per_session(n)
        );
        Ok::<_, anyhow::Error>((single, federated))
    }
    .await;
    match outcome {
        Ok((single, federated)) => {
            row.bytes = Some(round(single.per_session(n), 0));
            row.children_bytes = Some(round(single.children_per_session(n), 0));
            row.federated_bytes = Some(round(federated.per_session(n), 0));
            row.federated_children_bytes = Some(round(federated.children_per_session(n), 0));
            row.rss_mib = Some(round(single.after as f64 / 1048576.0, 1));
            row.note = Some(format!(
                "{} live children; RSS {} -> {} KiB; the virtual server: {} live children, RSS {} -> {} KiB",
                single.children,
                single.before / 1024,
                single.after / 1024,
                federated.children,
                federated.before / 1024,
                federated.after / 1024
            ));
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(clients: usize, rps: f64, p50: f64, rss: f64) -> Row {
        Row {
            rps: Some(rps),
            p50_ms: Some(p50),
            rss_mib: Some(rss),
            ..Row::new(System::TetherSqlite, Scenario::ToolsCall, clients, false)
        }
    }

    #[test]
    fn a_client_count_reports_its_median_round_with_the_spread() {
        let row =
            median_round(vec![run(64, 900.0, 1.0, 40.0), run(64, 700.0, 2.0, 40.0), run(64, 800.0, 3.0, 40.0)]).expect("a row");
        assert_eq!((row.clients, row.rps, row.p50_ms), (64, Some(800.0), Some(3.0)), "the median round, whole");
        assert_eq!(row.spread.as_deref(), Some("median of 3 interleaved rounds, 700 to 900 rps"));
        assert_eq!(row.rounds_rps, vec![900.0, 700.0, 800.0], "every round, in round order");
    }

    #[test]
    fn a_round_with_errors_is_reported_not_hidden_by_the_median() {
        let failed = Row::failed(System::TetherSqlite, Scenario::ToolsCall, 64, false, "wrong answer".into());
        let row = median_round(vec![run(64, 900.0, 1.0, 40.0), failed, run(64, 800.0, 1.0, 40.0)]).expect("a row");
        assert_eq!((row.errors, row.error.as_deref()), (1, Some("wrong answer")));
    }

    #[test]
    fn a_baseline_row_comes_right_after_the_current_one() {
        let twin = |system| Subject { system, baseline: true };
        let mut rows = vec![
            Row::new(twin(System::TetherSqlite), Scenario::ToolsCall, 64, false),
            Row::new(System::Rmcp, Scenario::ToolsCall, 1, false),
            Row::new(twin(System::TetherSqlite), Scenario::ToolsCall, 1, false),
            Row::new(System::TetherSqlite, Scenario::Replay10k, 1, false),
            Row::new(System::TetherSqlite, Scenario::ToolsCall, 64, false),
            Row::new(System::TetherSqlite, Scenario::ToolsCall, 1, false),
        ];
        sort(&mut rows);
        let order: Vec<String> = rows.iter().map(|r| format!("{} {} {}", r.system, r.scenario, r.clients)).collect();
        assert_eq!(
            order,
            [
                "tether-sqlite tools_call 1",
                "tether-sqlite@baseline tools_call 1",
                "tether-sqlite tools_call 64",
                "tether-sqlite@baseline tools_call 64",
                "rmcp tools_call 1",
                "tether-sqlite replay_10k 1",
            ]
        );
    }
}
