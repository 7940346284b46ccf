//! The storage half of one `thought` call, without HTTP: what the SQLite
//! writer costs per call. N concurrent "clients", each with its own MCP
//! session and notebook session, append a thought and then start a request
//! stream with its priming event and final response, inside a request's
//! `tether_store::fence` scope as `tether serve --store sqlite:…` does (the
//! thought is queued and shares the response's commit). Prints calls/s, the
//! CPU per call of the runtime's workers (the clients' side of a call and
//! the writer's commits) and of the checkpointer, and write syscalls and
//! bytes per call, read from /proc (Linux).
//!
//! `cargo run --release -p tether-bench --bin store_path -- [CLIENTS] [SECONDS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_notebook::NotebookRepo;
use tether_notebook::repo::NotebookSession;
use tether_notebook::thought::ThoughtInput;
use tether_store::{EventKind, SessionRecord, Store, StoreConfig};

/// Per-thread counters of this process: (comm, cpu ticks, write syscalls, bytes written).
fn threads() -> Vec<(String, u64, u64, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for entry in dir.flatten() {
        let path = entry.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim().to_owned();
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let ticks = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0);
        let io = std::fs::read_to_string(path.join("io")).unwrap_or_default();
        let field =
            |name: &str| io.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok())).unwrap_or(0);
        out.push((comm, ticks, field("syscw:"), field("wchar:")));
    }
    out
}

/// The runtime's worker threads (tokio's name cut at 15 bytes): the clients and,
/// between their steps, the writer's commits (it has no thread of its own).
const WORKERS: &str = "tokio-rt-worker";

fn totals(comm: &str) -> (u64, u64, u64) {
    threads().into_iter().filter(|t| t.0 == comm).fold((0, 0, 0), |acc, t| (acc.0 + t.1, acc.1 + t.2, acc.2 + t.3))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let seconds: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let dir = tempfile::tempdir()?;
    let store = tether_store::sqlite::SqliteStore::open(&dir.path().join("tether.db"), StoreConfig::default()).await?;
    let notebook = Arc::new(tether_notebook::SqliteNotebook::new(store.db().clone()).await?);
    let store = Arc::new(store);

    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, notebook, stop, measuring, calls) =
            (store.clone(), notebook.clone(), stop.clone(), measuring.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            let session = format!("{:048x}", rand::random::<u128>() ^ c as u128);
            let now = tether_store::now_ms();
            store
                .create_session(&SessionRecord {
                    id: session.clone(),
                    principal: "anonymous".into(),
                    created_at_ms: now,
                    expires_at_ms: now + 1_800_000,
                    revision: 1,
                    state: serde_json::json!({"protocolVersion": "2025-11-25"}),
                })
                .await?;
            let nb = NotebookSession::new("anonymous", None, Vec::new(), None);
            notebook.create_session(&nb).await?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let input = ThoughtInput {
                    thought: format!("bench thought {n}: weighing the next step"),
                    thought_number: n,
                    total_thoughts: n,
                    next_thought_needed: true,
                    is_revision: None,
                    revises_thought: None,
                    branch_from_thought: None,
                    branch_id: None,
                    needs_more_thoughts: None,
                };
                // As `tether serve` runs a request: the thought is queued and
                // the response's events follow it into the same commit.
                let first = tether_store::fence::scope(async {
                    let recorded = notebook.append_thought("anonymous", &nb.id, &input).await?;
                    anyhow::ensure!(recorded.thought_history_length == n, "thought {n} numbered {}", recorded.thought_history_length);
                    let stream = format!("r{:011x}{:016x}", tether_store::now_ms(), rand::random::<u64>());
                    let prime = Bytes::from(format!(r#"{{"id":{n},"method":"tools/call","owner":"0123456789abcdef"}}"#));
                    let response = Bytes::from(format!(
                        r#"{{"jsonrpc":"2.0","id":{n},"result":{{"content":[{{"type":"text","text":"{{\"thoughtNumber\":{n},\"totalThoughts\":{n},\"nextThoughtNeeded\":true,\"branches\":[],\"thoughtHistoryLength\":{n}}}"}}],"structuredContent":{{"thoughtNumber":{n},"totalThoughts":{n},"nextThoughtNeeded":true,"branches":[],"thoughtHistoryLength":{n}}},"isError":false}}}}"#
                    ));
                    let first = store.start_stream(&session, &stream, vec![(EventKind::Prime, prime), (EventKind::Final, response)]).await?;
                    anyhow::Ok(first)
                })
                .await?;
                anyhow::ensure!(first == 1, "stream started at {first}");
                if measuring.load(Ordering::Relaxed) {
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let (w0, c0, started) = (totals(WORKERS), totals("tether-sqlite-c"), Instant::now());
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let (w1, c1, elapsed) = (totals(WORKERS), totals("tether-sqlite-c"), started.elapsed());
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let n = calls.load(Ordering::Relaxed).max(1) as f64;
    let tick_us = 1_000_000.0 / 100.0; // USER_HZ
    println!("| clients | calls/s | workers µs/call | checkpointer µs/call | writes/call | KiB written/call |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {clients} | {:.0} | {:.1} | {:.1} | {:.2} | {:.1} |",
        n / elapsed.as_secs_f64(),
        (w1.0 - w0.0) as f64 * tick_us / n,
        (c1.0 - c0.0) as f64 * tick_us / n,
        ((w1.1 - w0.1) + (c1.1 - c0.1)) as f64 / n,
        ((w1.2 - w0.2) + (c1.2 - c0.2)) as f64 / 1024.0 / n,
    );
    Ok(())
}
