//! Many sessions at once, for `idle_session` and `restart_100k_sessions`:
//! creating them (`initialize` + `notifications/initialized`, every answer
//! checked) with a fixed number of concurrent clients, and timing the first
//! answered request on an old session after a restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::load;

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
