//! Many sessions at once, for `idle_session` and `restart_100k_sessions`:
//! creating them (`initialize` + `notifications/initialized`, every answer
//! checked) with a fixed number of concurrent clients, and timing the first
//! answered request on an old session after a restart. [`idle_and_restart`]
//! runs `idle_session` and the restart scenarios on one fresh server and
//! makes their rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Args;
use crate::load;
use crate::report::{Row, round};
use crate::scenario::Scenario;
use crate::server::{self, Launch, Programs, Server, Store, Subject, settled_rss};

/// Errors tolerated before a bulk creation gives up (each one is reported).
const MAX_ERRORS: usize = 1;
/// How long a restarted server may take to answer.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);
/// Pause between connection attempts while a restarted server is not listening yet.
const RECONNECT_PAUSE: Duration = Duration::from_micros(500);

/// Creates `total` sessions with `concurrency` clients (one keep-alive
/// connection each); returns their IDs. The connections are closed when it returns.
pub async fn create(url: &str, total: usize, concurrency: usize) -> anyhow::Result<Vec<String>> {
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let progress_every = (total / 10).max(1);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (url, next, errors) = (url.to_string(), next.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let http = load::http_client()?;
            let mut ids = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || errors.load(Ordering::Relaxed) >= MAX_ERRORS {
                    return Ok::<_, String>(ids);
                }
                match load::open_session(&http, &url, false).await {
                    Ok(id) => ids.push(id),
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        return Err(format!("session {}: {e}", i + 1));
                    }
                }
                if (i + 1) % progress_every == 0 {
                    eprintln!("   {} sessions ({:.0}/s)", i + 1, (i + 1) as f64 / started.elapsed().as_secs_f64());
                }
            }
        }));
    }
    let mut all = Vec::with_capacity(total);
    let mut first_error = None;
    for task in tasks {
        match task.await? {
            Ok(ids) => all.extend(ids),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        bail!("creating {total} sessions: {e}");
    }
    anyhow::ensure!(all.len() == total, "created {} sessions, wanted {total}", all.len());
    let unique: std::collections::HashSet<&String> = all.iter().collect();
    anyhow::ensure!(unique.len() == total, "the server handed out {} distinct session IDs for {total} sessions", unique.len());
    Ok(all)
}

/// After a restart began at `spawned`: waits until the server accepts a
/// TCP connection on `addr` (refused means "not listening yet"), then calls
/// `thought` on `session`, which must be answered correctly. Returns ms
/// from `spawned` to the end of that answer.
pub async fn first_answer(addr: std::net::SocketAddr, url: &str, session: &str, spawned: Instant) -> anyhow::Result<f64> {
    let deadline = spawned + RESTART_TIMEOUT;
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => bail!("the restarted server did not listen within {RESTART_TIMEOUT:?}: {e}"),
            Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
        }
    }
    let http = load::http_client().map_err(anyhow::Error::msg)?;
    load::call_thought(&http, url, session, 1)
        .await
        .map_err(anyhow::Error::msg)
        .context("the first request on an old session after the restart")?;
    Ok(spawned.elapsed().as_secs_f64() * 1000.0)
}

/// What one run of [`idle_and_restart`] measures.
pub(crate) struct Sessions {
    /// Sessions created (after the warm-up).
    pub(crate) n: usize,
    /// idle_session: RSS per session.
    pub(crate) idle: bool,
    /// The restart scenario timed after them, if any.
    pub(crate) restart: Option<Scenario>,
}

/// idle_session and/or a restart scenario (restart_100k_sessions,
/// restart_1m_sessions) on one fresh server and store: warm-up sessions,
/// RSS, `n` more sessions, RSS again; then SIGKILL, restart on the same
/// store, time the first answer on an old session.
pub(crate) async fn idle_and_restart(args: &Args, programs: &Programs, subject: Subject, plan: Sessions) -> Vec<Row> {
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
        create(&server.mcp_url, warm, args.session_clients).await.context("warm-up sessions")?;
        let before = settled_rss(&server).await?;
        let store_before = store.as_ref().and_then(Store::outside_bytes);
        let started = Instant::now();
        let ids = match create(&server.mcp_url, n, args.session_clients).await {
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
        let result = first_answer(addr, &url, &old, spawned).await;
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
