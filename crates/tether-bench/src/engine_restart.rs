//! The `engine_restart` scenario: what a crash of tether's engine costs
//! when the keeper holds the port and the stdio children. One tether-gateway
//! (its keeper, the bench's child, running the engine `tether engine …`) in
//! front of `stdio_echo` with room for [`CHILDREN`] children: [`SESSIONS`]
//! live sessions, the last [`CHILDREN`] of them each holding a child (every
//! `initialize` starts one; past `max_processes` the least recently used
//! idle one stops, so the earlier sessions live on without one).
//!
//! First the keeper's memory: its RSS (`VmRSS` of the keeper alone, sampled)
//! while every session with a child calls back to back, against the bound
//! it holds per child (unacknowledged stdout: [`hold_bytes`]) times the
//! children. Then `--engine-kills` times: `kill -9` of the engine (the
//! keeper's child whose argv[1] is `engine`, from `/proc`), and every session
//! with a child calls at once, retrying what fails (a connection of the dead
//! engine) until it is answered; the time from the kill to the first
//! answered call, and to the last of them (every session's child answered
//! once). Each answer is checked, the new engine must be another process and
//! the keeper's children must be the same processes as before the kill
//! (kept, not restarted).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::Args;
use crate::load;
use crate::report::{Row, round};
use crate::running::start;
use crate::scenario::Scenario;
use crate::server::{self, Launch, Programs, Server, Subject, Upstream, origin};
use crate::sessions;

/// Live sessions (the budget line's 1,000).
pub const SESSIONS: usize = 1_000;
/// Of those, sessions holding a stdio child (the budget line's 100): the
/// upstream's `max_processes`.
pub const CHILDREN: usize = 100;
/// tether's default `max_message_bytes` of a command upstream (16 MiB; the
/// bench's config leaves it as it is).
const MAX_MESSAGE_BYTES: u64 = 16 << 20;
/// How long every session with a child calls back to back while the
/// keeper's RSS is sampled.
const LOAD_WINDOW: Duration = Duration::from_secs(5);
/// How often the keeper's RSS is read under that load.
const RSS_SAMPLE: Duration = Duration::from_millis(50);
/// How long an engine runs before it is killed. The keeper restarts an
/// engine that ran 30 s or more (its `STEADY`) after its first backoff
/// (100 ms); one killed sooner after a longer one (doubling up to 5 s: the
/// crash loop's case, not a crash's).
const ENGINE_UP: Duration = Duration::from_secs(31);
/// How long after a kill every session may take to be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between a failed call (a connection of the dead engine) and the next try.
const RETRY_PAUSE: Duration = Duration::from_millis(2);
/// Clients that create the sessions at once: one. Past `max_processes`
/// every `initialize` stops the least recently used idle child, and two at
/// once may pick the same one: the second then stops none and waits for a
/// place until `process_queue_timeout` (5 s), then is refused (503), though
/// idle children are left (seen with 64 at once, with and without the keeper).
const CREATING_CLIENTS: usize = 1;
/// The environment variable that hands the server its admin token.
const ADMIN_TOKEN_ENV: &str = "TETHER_BENCH_ADMIN_TOKEN";

/// How many bytes of a child's stdout the keeper holds unacknowledged at
/// most: `max(2 × max_message_bytes, 4 MiB)` (tether-gateway's `stdio::kept::hold_bytes`).
pub fn hold_bytes(max_message_bytes: u64) -> u64 {
    max_message_bytes.saturating_mul(2).max(4 << 20)
}

/// The median of `values` (the upper middle one for an even count) and the largest.
fn median_and_max(values: &[f64]) -> Option<(f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some((*sorted.get(sorted.len() / 2)?, *sorted.last()?))
}

/// What one kill measured.
struct Kill {
    /// ms from the kill to the first answered call.
    first_ms: f64,
    /// ms from the kill until every session with a child answered once.
    all_ms: f64,
    /// Calls that failed before their session was answered (connections of the dead engine).
    retries: u64,
    /// The keeper's own figure for the restart (`last_restart_ms` of `GET /admin/keeper`).
    keeper_ms: Option<u64>,
}

/// The admin API of the server.
struct Admin {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Admin {
    /// `GET /admin/keeper`: the keeper's counts and children.
    async fn keeper(&self) -> anyhow::Result<Value> {
        let answer = self.http.get(&self.url).bearer_auth(&self.token).send().await.context("GET /admin/keeper")?;
        let status = answer.status();
        let body = answer.text().await.context("reading GET /admin/keeper")?;
        anyhow::ensure!(status == reqwest::StatusCode::OK, "GET /admin/keeper answered {status}: {body}");
        serde_json::from_str(&body).with_context(|| format!("GET /admin/keeper answered no JSON: {body}"))
    }
}

/// The labels (`UPSTREAM/SESSION`) of the children `GET /admin/keeper` lists.
fn labels(status: &Value) -> BTreeSet<String> {
    let children = status.get("children").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    children.iter().filter_map(|c| c.get("label").and_then(Value::as_str).map(str::to_owned)).collect()
}

/// Every session in `sessions` calls `thought` at once, retrying a failed
/// call until it is answered (or [`ANSWER_TIMEOUT`] after `since`); returns
/// each session's ms from `since` to its answer and the failed calls.
async fn each_answered(
    url: &str,
    sessions: &[String],
    clients: Vec<reqwest::Client>,
    numbers: &Arc<AtomicU64>,
    since: Instant,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let mut tasks = Vec::with_capacity(sessions.len());
    for (session, http) in sessions.iter().cloned().zip(clients) {
        let (url, numbers) = (url.to_owned(), numbers.clone());
        tasks.push(tokio::spawn(async move {
            let mut retries = 0u64;
            loop {
                let n = numbers.fetch_add(1, Ordering::Relaxed);
                match load::call_thought(&http, &url, &session, n).await {
                    Ok(()) => return Ok((since.elapsed().as_secs_f64() * 1000.0, retries)),
                    Err(e) if since.elapsed() > ANSWER_TIMEOUT => {
                        return Err(format!("session {session}: no answer within {ANSWER_TIMEOUT:?}, the last try: {e}"));
                    }
                    Err(_) => {
                        retries += 1;
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
            }
        }));
    }
    let (mut ms, mut retries) = (Vec::with_capacity(tasks.len()), 0);
    for task in tasks {
        let (answered, failed) = task.await?.map_err(anyhow::Error::msg)?;
        ms.push(answered);
        retries += failed;
    }
    Ok((ms, retries))
}

/// Every session in `sessions` calls back to back for [`LOAD_WINDOW`] while
/// the keeper's RSS is sampled; returns the largest sample and the calls made.
async fn keeper_rss_under_load(server: &Server, sessions: &[String], numbers: &Arc<AtomicU64>) -> anyhow::Result<(u64, u64)> {
    let end = Instant::now() + LOAD_WINDOW;
    let mut tasks = Vec::with_capacity(sessions.len());
    for session in sessions {
        let (session, url, numbers) = (session.clone(), server.mcp_url.clone(), numbers.clone());
        tasks.push(tokio::spawn(async move {
            let http = load::http_client()?;
            let mut calls = 0u64;
            while Instant::now() < end {
                let n = numbers.fetch_add(1, Ordering::Relaxed);
                load::call_thought(&http, &url, &session, n).await.map_err(|e| format!("session {session}: {e}"))?;
                calls += 1;
            }
            Ok::<_, String>(calls)
        }));
    }
    let mut largest = 0;
    while Instant::now() < end {
        largest = largest.max(server.own_rss_bytes()?.0);
        tokio::time::sleep(RSS_SAMPLE).await;
    }
    let mut calls = 0;
    for task in tasks {
        calls += task.await?.map_err(anyhow::Error::msg)?;
    }
    Ok((largest, calls))
}

/// The keeper's stdio children now (the engine not counted).
fn kept_children(server: &Server) -> anyhow::Result<BTreeSet<u32>> {
    Ok(server.children()?.into_iter().collect())
}

/// One kill of the engine and the sessions' answers after it ([`Kill`]).
async fn kill_once(server: &Server, admin: &Admin, sessions: &[String], numbers: &Arc<AtomicU64>) -> anyhow::Result<Kill> {
    let engine = server
        .engine_pid()?
        .context("the keeper runs no engine (a child whose argv[1] is `engine`): is this tether built with the keeper?")?;
    let before = kept_children(server)?;
    anyhow::ensure!(
        before.len() == sessions.len(),
        "the keeper holds {} children before the kill, want {}",
        before.len(),
        sessions.len()
    );
    // Fresh clients: no connection of the old engine to find dead first.
    let clients = (0..sessions.len()).map(|_| load::http_client()).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    let pid = i32::try_from(engine).ok().and_then(rustix::process::Pid::from_raw).context("the engine's pid is out of range")?;
    let killed = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL)
        .with_context(|| format!("cannot kill the engine {engine}"))?;
    let (ms, retries) = each_answered(&server.mcp_url, sessions, clients, numbers, killed).await?;
    let (first_ms, all_ms) = ms.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let now = server.engine_pid()?.context("no engine runs after the sessions were answered")?;
    anyhow::ensure!(now != engine, "the engine {engine} answered after its kill -9 (it is still the keeper's engine)");
    let after = kept_children(server)?;
    if after != before {
        let gone = before.difference(&after).count();
        bail!(
            "{gone} of the keeper's {} children are other processes after the engine's restart (each should be kept)",
            before.len()
        );
    }
    let keeper_ms = admin.keeper().await.ok().and_then(|s| s.get("last_restart_ms").and_then(Value::as_u64));
    Ok(Kill { first_ms, all_ms, retries, keeper_ms })
}

/// The sessions: [`SESSIONS`] − [`CHILDREN`] first, then [`CHILDREN`] more
/// (their `initialize` stops the earlier ones' children, the least recently
/// used), each of which calls once; the keeper must then hold exactly their
/// children, one each. Returns those sessions.
async fn sessions_with_children(server: &Server, admin: &Admin, numbers: &Arc<AtomicU64>) -> anyhow::Result<Vec<String>> {
    let url = server.mcp_url.as_str();
    let started = Instant::now();
    sessions::create(url, SESSIONS - CHILDREN, CREATING_CLIENTS).await.context("the sessions without a child")?;
    let with_children = sessions::create(url, CHILDREN, CREATING_CLIENTS).await.context("the sessions with a child")?;
    let http = load::http_client().map_err(anyhow::Error::msg)?;
    for session in &with_children {
        let n = numbers.fetch_add(1, Ordering::Relaxed);
        load::call_thought(&http, url, session, n).await.map_err(|e| anyhow::anyhow!("session {session}: {e}"))?;
    }
    eprintln!("   {SESSIONS} sessions in {:.1} s", started.elapsed().as_secs_f64());
    let status = admin.keeper().await?;
    let want: BTreeSet<String> = with_children.iter().map(|s| format!("{}/{s}", server::GATEWAY_UPSTREAM)).collect();
    let have = labels(&status);
    if have != want {
        bail!(
            "the keeper holds {} children, {} of them of the last {CHILDREN} sessions (want one each, and no other)",
            have.len(),
            have.intersection(&want).count()
        );
    }
    let live = server.live_children()?;
    anyhow::ensure!(live == CHILDREN, "{live} live stdio children of the keeper, want {CHILDREN}");
    Ok(with_children)
}

/// engine_restart on one fresh tether-gateway (its keeper) in front of
/// `stdio_echo` (see the module's text): the row's `ms` is the median kill's
/// ms to the first answered call, `max_ms` the slowest's.
pub(crate) async fn engine_restart(args: &Args, programs: &Programs, subject: Subject) -> Row {
    let kills = args.engine_kills;
    eprintln!(
        "== {}: engine_restart ({SESSIONS} sessions, {CHILDREN} stdio children, {kills} kills of the engine, each after {} s up)",
        subject.name(),
        ENGINE_UP.as_secs()
    );
    let mut row = Row::new(subject, Scenario::EngineRestart, CHILDREN, args.quick);
    row.count = Some(SESSIONS as u64);
    let outcome = async {
        anyhow::ensure!(kills > 0, "--engine-kills must be 1 or more");
        let dir = tempfile::Builder::new().prefix("tether-bench-config-").tempdir().context("cannot create a temp dir")?;
        let file = dir.path().join("tether.toml");
        std::fs::write(&file, server::stdio_config(&programs.stdio_echo, CHILDREN))
            .with_context(|| format!("cannot write {}", file.display()))?;
        let token = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let mut launch = Launch::new(subject);
        launch.upstream = Some(Upstream::StdioConfig(file));
        launch.extra_args = vec!["--admin-token-env".into(), ADMIN_TOKEN_ENV.into()];
        launch.env = vec![(ADMIN_TOKEN_ENV.into(), token.clone())];
        let (server, _store) = start(programs, &launch).await?;
        let admin = Admin {
            http: load::http_client().map_err(anyhow::Error::msg)?,
            url: format!("{}/admin/keeper", origin(&server.mcp_url)),
            token,
        };
        let result = measure(args, &server, &admin, &mut row).await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", server.log_tail());
        }
        server.stop().await?;
        result
    }
    .await;
    if let Err(e) = outcome {
        eprintln!("   error: {e:#}");
        row.errors = 1;
        row.error = Some(format!("{e:#}"));
    }
    row
}

/// The measurements of [`engine_restart`] on its started server, into `row`.
async fn measure(args: &Args, server: &Server, admin: &Admin, row: &mut Row) -> anyhow::Result<()> {
    let numbers = Arc::new(AtomicU64::new(1));
    let (keeper_idle, _) = server.own_rss_bytes()?;
    let sessions = sessions_with_children(server, admin, &numbers).await?;
    let mut engine_since = Instant::now();
    let (rss, calls) = keeper_rss_under_load(server, &sessions, &numbers).await?;
    let (_, peak) = server.own_rss_bytes()?;
    let held = admin.keeper().await?.get("held_bytes").and_then(Value::as_u64).unwrap_or(0);
    let bound = hold_bytes(MAX_MESSAGE_BYTES) * CHILDREN as u64;
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "   the keeper's RSS: {:.1} MiB before the sessions, {:.1} MiB with {CHILDREN} children under load ({calls} calls in {} s; peak {:.1} MiB; {held} bytes held after it); bound {:.0} MiB",
        mib(keeper_idle),
        mib(rss),
        LOAD_WINDOW.as_secs(),
        mib(peak),
        mib(bound)
    );
    row.keeper_rss_bytes = Some(rss as f64);
    row.keeper_bound_bytes = Some(bound as f64);
    row.children = Some(CHILDREN as u64);
    let mut done = Vec::new();
    for kill in 1..=args.engine_kills {
        let wait = ENGINE_UP.saturating_sub(engine_since.elapsed());
        eprintln!(
            "   kill {kill} of {}: in {:.0} s (the engine up {} s first)",
            args.engine_kills,
            wait.as_secs_f64(),
            ENGINE_UP.as_secs()
        );
        tokio::time::sleep(wait).await;
        let measured = kill_once(server, admin, &sessions, &numbers).await.with_context(|| format!("kill {kill}"))?;
        engine_since = Instant::now();
        eprintln!(
            "   kill {kill}: first answered call {:.1} ms after the kill, every one of the {CHILDREN} sessions with a child {:.1} ms; {} failed tries; the keeper's last_restart_ms {}",
            measured.first_ms,
            measured.all_ms,
            measured.retries,
            measured.keeper_ms.map_or("unknown".into(), |ms| ms.to_string())
        );
        done.push(measured);
    }
    let firsts: Vec<f64> = done.iter().map(|k| k.first_ms).collect();
    let alls: Vec<f64> = done.iter().map(|k| k.all_ms).collect();
    let (first, first_max) = median_and_max(&firsts).context("no kill was measured")?;
    let (all, all_max) = median_and_max(&alls).context("no kill was measured")?;
    row.ms = Some(round(first, 1));
    row.max_ms = Some(round(first_max, 1));
    row.all_answered_ms = Some(round(all, 1));
    row.all_answered_max_ms = Some(round(all_max, 1));
    row.kills = firsts.iter().map(|&v| round(v, 1)).collect();
    let keeper: Vec<String> = done.iter().map(|k| k.keeper_ms.map_or("?".into(), |ms| ms.to_string())).collect();
    row.note = Some(format!(
        "the keeper's RSS {:.1} MiB before the sessions, peak {:.1} MiB; {} calls in the load's {} s; the keeper's last_restart_ms per kill: {}",
        mib(keeper_idle),
        mib(peak),
        calls,
        LOAD_WINDOW.as_secs(),
        keeper.join(", ")
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_per_child_is_twice_the_largest_message_and_at_least_4_mib() {
        assert_eq!(hold_bytes(16 << 20), 32 << 20, "tether's default max_message_bytes");
        assert_eq!(hold_bytes(64 << 10), 4 << 20, "the floor");
        assert_eq!(hold_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn the_median_and_the_largest_of_the_kills() {
        assert_eq!(median_and_max(&[300.0, 120.0, 900.0, 110.0, 130.0]), Some((130.0, 900.0)));
        assert_eq!(median_and_max(&[2.0, 1.0]), Some((2.0, 2.0)));
        assert_eq!(median_and_max(&[]), None);
    }

    #[test]
    fn the_children_are_read_by_their_labels() {
        let status = serde_json::json!({"children": [{"child": 1, "pid": 10, "label": "echo/a"}, {"child": 2, "label": "echo/b"}, {"child": 3}]});
        assert_eq!(labels(&status), BTreeSet::from(["echo/a".to_owned(), "echo/b".to_owned()]));
        assert!(labels(&serde_json::json!({})).is_empty());
        assert!(Scenario::EngineRestart.runs(crate::server::System::TetherGateway));
        assert!(!Scenario::EngineRestart.runs(crate::server::System::TetherGatewayNoKeeper));
        assert!(!Scenario::EngineRestart.interleaved());
    }
}
