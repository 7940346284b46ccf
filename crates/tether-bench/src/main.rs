//! `tether-bench`: runs tether and the reference MCP servers side by side on
//! loopback, one after the other on the same machine, through the same
//! checked load generator, and writes the rows (JSON), a Markdown table with
//! the tools_call budget, and an SVG chart. Run it through `scripts/bench`;
//! docs/benchmarks.md describes every scenario and system. This file is the
//! command line and the run's top-level flow: which systems are skipped,
//! which scenarios run in which order, and what is written.
//!
//! - [`scenario`]: the scenarios and which systems run each one.
//! - [`server`]: the systems, their stores, starting/stopping/killing them,
//!   `/proc`. [`redis_pair`]: the primary and replica of
//!   tether-redis-replica and tether-redis-strict.
//! - [`running`]: a system as a scenario runs it, with its upstream, config
//!   or tokens.
//! - [`rounds`]: the interleaved rounds of tools_call, tools_call_modern,
//!   tools_call_oauth and the gateway scenarios of rounds.
//! - [`load`]: the `tools_call` load generator (also of `gateway_http`,
//!   `gateway_stdio` and `gateway_federated`) and the MCP calls all share.
//! - [`replay`]: `replay_10k`. [`sessions`]: bulk sessions, restart timing,
//!   `idle_session` and the restart scenarios.
//! - [`streams`]: `streams_10k`'s open streams and the fan-out to them.
//! - [`gateway_memory`]: the `gateway_memory` scenario.
//! - [`engine_restart`]: the `engine_restart` scenario (kill -9 of the
//!   keeper's engine; the keeper's memory).
//! - [`report`]: rows, table, chart. [`budget`]: the budget lines. SSE is
//!   read with `tether_wire::sse`, the decoder the client and the tests use.
//! - [`baseline`]: with `--baseline`, each tether figure against its twin's
//!   from an earlier build.
//! - [`auth`]: tools_call_oauth's authorization server.

mod auth;
mod baseline;
mod budget;
mod engine_restart;
mod gateway_memory;
mod load;
mod redis_pair;
mod replay;
mod report;
mod rounds;
mod running;
mod scenario;
mod server;
mod sessions;
mod streams;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use engine_restart::engine_restart;
use gateway_memory::gateway_memory;
use replay::replay_10k;
use report::{Row, sort};
use rounds::interleaved;
use scenario::Scenario;
use server::{Programs, Subject, System};
use sessions::{Sessions, idle_and_restart};
use streams::streams_10k;

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
    /// gateway_http: the bare TCP relay (default: `relay_floor` next to this binary).
    #[arg(long)]
    relay_floor: Option<PathBuf>,
    /// gateway_stdio: the bare stdio relay (default: `stdio_relay` next to this binary).
    #[arg(long)]
    stdio_relay: Option<PathBuf>,
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
    /// gateway_http and gateway_stdio: agentgateway's binary, which
    /// scripts/bench builds from --agentgateway-src (skipped when it does not
    /// run or the source is missing).
    #[arg(long, env = "AGENTGATEWAY_BIN", default_value = "bench/agentgateway/target/release/agentgateway")]
    agentgateway: PathBuf,
    /// agentgateway's source, at the pinned release (docs/benchmarks.md says
    /// how to bring it; git ignores the default).
    #[arg(long, env = "AGENTGATEWAY_SRC", default_value = "bench/agentgateway/src")]
    agentgateway_src: PathBuf,
    /// Prints the release of the agentgateway source (`TAG COMMIT` when it is
    /// the pinned one, else `unpinned unknown`, with why on stderr) and
    /// exits: what scripts/bench stamps its build with.
    #[arg(long)]
    agentgateway_release: bool,
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
    /// those of its systems that are listed: gateway_http tether-gateway,
    /// rmcp-direct, relay-floor and agentgateway, gateway_stdio tether-gateway,
    /// tether-gateway-no-keeper, tether-gateway-stdio-relay, supergateway, mcp-proxy and agentgateway,
    /// gateway_memory, gateway_federated and engine_restart tether-gateway,
    /// tools_call_modern tether-sqlite and tether-sqlite-modern,
    /// tools_call_oauth tether-sqlite-token and tether-sqlite-oauth,
    /// the others the first six.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tether-memory,tether-sqlite,tether-redis,rmcp,ts-sdk,axum-floor,tether-gateway,tether-gateway-no-keeper,tether-gateway-stdio-relay,rmcp-direct,relay-floor,supergateway,mcp-proxy,agentgateway,tether-sqlite-modern,tether-sqlite-token,tether-sqlite-oauth"
    )]
    systems: Vec<System>,
    /// Scenarios to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tools_call,replay_10k,restart_100k_sessions,restart_1m_sessions,idle_session,gateway_http,gateway_stdio,gateway_memory,gateway_federated,tools_call_modern,streams_10k,tools_call_oauth,engine_restart"
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
    /// engine_restart: kills of the engine (each after 31 s up; the median
    /// and the slowest are reported; `--quick`: at most 3).
    #[arg(long, default_value_t = 5)]
    engine_kills: usize,
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
    /// Shorter runs of every scenario: --duration 1s --warmup 1s --rounds 3 --sessions 10000 --replay-runs 3 --engine-kills 3.
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
    if args.agentgateway_release {
        match server::agentgateway::release_of(&args.agentgateway_src) {
            Ok(_) => println!("{} {}", server::agentgateway::PINNED_TAG, server::agentgateway::PINNED_COMMIT),
            Err(why) => {
                eprintln!("tether-bench: the agentgateway source {} is {why}", args.agentgateway_src.display());
                println!("unpinned unknown");
            }
        }
        return ExitCode::SUCCESS;
    }
    if args.quick {
        args.duration = Duration::from_secs(1);
        args.warmup = Duration::from_secs(1);
        args.rounds = 3;
        args.sessions = args.sessions.min(10_000);
        args.million_sessions = args.million_sessions.min(20_000);
        args.replay_runs = args.replay_runs.min(3);
        args.engine_kills = args.engine_kills.min(3);
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
        rmcp_tether: sibling("rmcp_tether"),
        axum_floor: args.axum_floor.clone().unwrap_or_else(|| sibling("axum_floor")),
        relay_floor: args.relay_floor.clone().unwrap_or_else(|| sibling("relay_floor")),
        stdio_relay: args.stdio_relay.clone().unwrap_or_else(|| sibling("stdio_relay")),
        node: args.node.clone(),
        ts_server: args.ts_server.clone(),
        redis_url: args.redis.clone(),
        redis_cluster_url: args.redis_cluster.clone(),
        stdio_echo: args.stdio_echo.clone().unwrap_or_else(|| sibling("stdio_echo")),
        supergateway: args.supergateway.clone(),
        mcp_proxy: args.mcp_proxy.clone(),
        agentgateway: args.agentgateway.clone(),
        agentgateway_src: args.agentgateway_src.clone(),
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
        (Scenario::GatewayHttp, System::Agentgateway),
        (Scenario::GatewayStdio, System::Agentgateway),
        (Scenario::ToolsCallOauth, System::TetherSqliteOauth),
    ];
    for (scenario, system) in needing_tools {
        if let Some(why) = (wants(scenario) && systems.contains(&system)).then(|| programs.missing(system)).flatten() {
            eprintln!("== {}: skipped, {why}", system.name());
            skipped.push(why);
            systems.retain(|&s| s != system);
        }
    }
    // agentgateway runs from whatever its source is; one that is not the pinned release is said so.
    let mut notes = Vec::new();
    let agentgateway_runs =
        systems.contains(&System::Agentgateway) && (wants(Scenario::GatewayHttp) || wants(Scenario::GatewayStdio));
    let mut agentgateway_unpinned = None;
    if agentgateway_runs {
        let src = args.agentgateway_src.display();
        match server::agentgateway::release_of(&args.agentgateway_src) {
            Ok(release) => {
                eprintln!("== agentgateway: {release}, built from {src}");
                notes.push(format!("agentgateway: {release}, built from {src}."));
            }
            Err(why) => {
                eprintln!("== agentgateway: its source {src} is {why}; measured as it is");
                notes.push(format!("agentgateway: its source {src} is {why}."));
                agentgateway_unpinned = Some(format!("not the pinned {}", server::agentgateway::PINNED_TAG));
            }
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
    if wants(Scenario::EngineRestart) {
        for subject in of(Scenario::EngineRestart) {
            rows.push(engine_restart(args, &programs, subject).await);
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
    if let Some(unpinned) = &agentgateway_unpinned {
        for row in rows.iter_mut().filter(|r| r.system == System::Agentgateway.name()) {
            row.note = Some(row.note.take().map_or(unpinned.clone(), |n| format!("{n}; {unpinned}")));
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
    let budget = budget::budget(&rows);
    let mut markdown = format!("{}; load average {load_before} at the start, {} at the end.\n\n", machine(), load_average());
    markdown.push_str(&table);
    if !skipped.is_empty() {
        markdown.push_str(&format!("\nNot run: {}.\n", skipped.join(", ")));
    }
    for note in &notes {
        markdown.push_str(&format!("\n{note}\n"));
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
