//! Storage faults under load: several clients call tools
//! and read their streams on the real server over loopback while the SQLite
//! file's WAL writes and fsyncs fail (`SQLITE_FULL`, `SQLITE_IOERR`) at
//! points drawn from a seed, or while the power is cut. The clients'
//! histories are judged by `support/history.rs`.
//!
//! The seed is printed (`TETHER_FAULT_SEED=…`); set it to replay a run.
//! `TETHER_FAULT_SECS` sets how long each test runs its load (default a few
//! seconds; `scripts/faults --minutes N` raises it). Timeouts here only
//! detect hangs; nothing is timed.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use support::history::History;
use support::load::{Tally, client, replay_all, send};
use support::*;
use tether_server::EngineConfig;
use tether_store::StoreConfig;
use tether_store::faults::{self, Fault, Op};
use tether_store::sqlite::SqliteStore;

const CLIENTS: u64 = 4;

fn store_config(strict: bool) -> StoreConfig {
    StoreConfig { strict_durability: strict, ..StoreConfig::default() }
}

async fn health(addr: SocketAddr) -> (u16, String) {
    let text = request("GET", "/healthz", &[("Connection", "close")], "");
    match send(addr, &text).await {
        Ok(answer) => (answer.status, answer.json["reason"].as_str().unwrap_or_default().to_owned()),
        Err(e) => (0, e),
    }
}

struct Load {
    history: Arc<History>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    addr: Arc<Mutex<Vec<SocketAddr>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    sessions: Vec<String>,
}

async fn start_load(addr: SocketAddr, seed: u64, until: Instant, history: Arc<History>) -> Load {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Mutex::new(vec![addr]));
    let mut clients = Vec::new();
    let mut sessions = Vec::new();
    for c in 0..CLIENTS {
        let session = initialize(addr).await;
        sessions.push(session.clone());
        clients.push(tokio::spawn(client(
            shared.clone(),
            session,
            seed.wrapping_add(c + 1),
            until,
            stop.clone(),
            history.clone(),
            tally.clone(),
        )));
    }
    Load { history, tally, stop, addr: shared, clients, sessions }
}

impl Load {
    async fn join(&mut self) {
        for handle in self.clients.drain(..) {
            tokio::time::timeout(HANG * 3, handle).await.expect("a client hangs").expect("a client panicked");
        }
    }
}

/// WAL writes and fsyncs fail at random points while four clients call
/// tools; between faults the store works. Every refusal is a 503 that says
/// why, `/healthz` says why while the store fails, the server recovers by
/// itself, and the history shows nothing lost, duplicated or misrouted.
/// Which file the faults hit.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// The WAL: every commit writes it.
    Wal,
    /// The database file: only checkpoints write (and sync) it.
    Database,
}

async fn io_faults_under_load(strict: bool, target: Target, test: &str) {
    let seed = fault_seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.db");
    let store = SqliteStore::open(&path, store_config(strict)).await.unwrap();
    let (addr, _engine) = serve(Arc::new(store), EngineConfig::default()).await;
    let until = Instant::now() + fault_load_time(4.0);
    let mut load = start_load(addr, seed, until, Arc::new(History::new())).await;

    let mut windows = 0u64;
    let mut unhealthy_seen = 0u64;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        // fsyncs are per commit under strict, per checkpoint otherwise.
        let op = if rng.random_range(0..4) == 0 { Op::Sync } else { Op::Write };
        let fault = if rng.random_bool(0.5) { Fault::Full } else { Fault::IoErr };
        // A checkpoint comes every 200 ms of writes: database faults stay
        // long enough to meet one.
        let window = match target {
            Target::Wal => {
                faults::inject(&path, op, fault, rng.random_range(0..6));
                Duration::from_millis(rng.random_range(20..250))
            }
            Target::Database => {
                faults::inject_database(&path, op, fault, rng.random_range(0..3));
                Duration::from_millis(rng.random_range(150..600))
            }
        };
        windows += 1;
        let ends = Instant::now() + window;
        if rng.random_bool(0.3) {
            tokio::time::sleep(window / 2).await;
            let (status, reason) = health(addr).await;
            if status == 503 {
                unhealthy_seen += 1;
                assert!(reason.contains("fix the file system"), "/healthz says 503 without what to do: {reason:?}");
            } else {
                assert_eq!(status, 200, "/healthz: {reason}");
            }
        }
        tokio::time::sleep(ends.saturating_duration_since(Instant::now())).await;
        faults::clear(&path);
    }
    faults::clear(&path);
    load.join().await;

    // Service resumes by itself: healthy with no request in between, and
    // every session takes a call.
    let started = Instant::now();
    loop {
        let (status, reason) = health(addr).await;
        if status == 200 {
            break;
        }
        // A failed commit keeps the health checks at 503 for FAILURE_MEMORY.
        let limit = tether_store::sqlite::FAILURE_MEMORY + HANG;
        assert!(started.elapsed() < limit, "still unhealthy {limit:?} after the last fault: {status} {reason}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (i, session) in load.sessions.iter().enumerate() {
        let id = 1_000_000 + i as u64;
        load.history.sent(session, id);
        let answer = send(addr, &post(&call_body(id, "echo", json!({})), Some(session), &[("Connection", "close")]))
            .await
            .expect("a call after the faults");
        assert_eq!(answer.status, 200, "a call after the faults: {:?}", answer.json);
        load.history.read(session, id, answer.events);
    }

    replay_all(addr, &load.history).await;
    let report = load.history.check();
    let injected = faults::fired_for(&path);
    eprintln!(
        "{test}: seed {seed}: fault windows {windows}, faults injected {injected}, refused {}, resumed {}, unhealthy answers {unhealthy_seen}; {report}",
        Tally::get(&load.tally.refused),
        Tally::get(&load.tally.resumed),
    );
    assert_eq!(load.tally.problems(), Vec::<String>::new(), "answers the protocol does not allow");
    report.assert_clean();
    assert!(injected > 0, "no fault fired: the test tested nothing");
    assert!(report.acknowledged > 0, "nothing was acknowledged: the test tested nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_errors_and_full_disks_under_load_lose_nothing() {
    io_faults_under_load(false, Target::Wal, "io_errors_and_full_disks_under_load_lose_nothing").await;
}

/// The database file's writes and syncs fail (a checkpoint copying the WAL
/// back meets a full disk or a failing device): commits go on in the WAL,
/// the checkpoint is tried again later, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_file_faults_in_checkpoints_under_load_lose_nothing() {
    io_faults_under_load(false, Target::Database, "database_file_faults_in_checkpoints_under_load_lose_nothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_errors_and_full_disks_under_load_lose_nothing_with_strict_durability() {
    io_faults_under_load(true, Target::Wal, "io_errors_and_full_disks_under_load_lose_nothing_with_strict_durability").await;
}

/// What the disk holds after the power is cut.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// The WAL as of its last fsync, plus a drawn number of the writes
    /// since, the next one torn: a disk that loses its cache.
    AtLastSync,
    /// Every write that completed: a disk that keeps what it acknowledged
    /// (the model of `--durability normal`).
    AtLastWrite,
}

/// Load, then the power is cut at a moment drawn from the seed, leaving
/// the WAL as `cut` says; the copies of the files are opened by a new
/// server and every stream a client read is replayed there. Each read is
/// stamped with the WAL fsyncs completed when it was recorded; returns the
/// history and the count at the cut.
async fn power_loss_under_load(strict: bool, cut: Cut, test: &str) -> (Arc<History>, u64) {
    let seed = fault_seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.db");
    let after = dir.path().join("after").join("tether.db");
    std::fs::create_dir_all(after.parent().unwrap()).unwrap();
    let store = SqliteStore::open(&path, store_config(strict)).await.unwrap();
    faults::track(&path);
    let config = EngineConfig { drain_timeout: Duration::from_millis(200), ..EngineConfig::default() };
    let (addr, engine) = serve(Arc::new(store), config.clone()).await;
    let total = fault_load_time(3.0);
    let until = Instant::now() + total;
    let clock_path = path.clone();
    let history = Arc::new(History::with_clock(move || faults::syncs(&clock_path)));
    let mut load = start_load(addr, seed, until, history).await;
    let cut_at = total.mul_f64(rng.random_range(0.3..0.9));
    tokio::time::sleep(cut_at).await;
    let (keep, tear) = match cut {
        Cut::AtLastSync => (rng.random_range(0..4usize), rng.random_bool(0.5).then(|| rng.random_range(1..4096usize))),
        Cut::AtLastWrite => (usize::MAX, None),
    };
    let disk = faults::power_loss(&path, &after, keep, tear).expect("cut the power");
    load.stop.store(true, Ordering::Relaxed);
    // The dead machine's server: its streams close and its requests end
    // (their answers cannot be stored any more).
    engine.shutdown().await;
    load.join().await;
    faults::untrack(&path);
    eprintln!("{test}: seed {seed}: cut after {cut_at:?}: {disk:?}");

    // The machine comes back: a new server on what the disk held.
    let store = SqliteStore::open(&after, store_config(strict)).await.expect("the files after a power loss open");
    let (addr2, _engine2) = serve(Arc::new(store), config).await;
    *load.addr.lock() = vec![addr2];
    replay_all(addr2, &load.history).await;
    (load.history.clone(), disk.syncs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_with_strict_durability_keeps_every_event_a_client_saw() {
    let test = "power_loss_with_strict_durability_keeps_every_event_a_client_saw";
    let (history, _) = power_loss_under_load(true, Cut::AtLastSync, test).await;
    let report = history.check();
    eprintln!("{test}: {report}");
    report.assert_clean();
    assert!(report.acknowledged > 0, "nothing was acknowledged: the test tested nothing");
}

/// Under `--durability normal` a commit is written to the WAL but synced
/// only by the next checkpoint (every 200 ms of writes), so a power loss may
/// lose exactly the events read after the WAL's last fsync, and only at the
/// end of their streams (what the README states). Everything read before
/// that fsync survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_with_normal_durability_loses_at_most_what_came_after_the_last_wal_sync() {
    let test = "power_loss_with_normal_durability_loses_at_most_what_came_after_the_last_wal_sync";
    let (history, syncs) = power_loss_under_load(false, Cut::AtLastSync, test).await;
    // A read stamped `s` happened before sync s+1 completed: if the cut came
    // after that sync, the read's commit was synced.
    let report = history.check_with(|stamp| stamp >= syncs);
    eprintln!("{test}: WAL syncs before the cut {syncs}: {report}");
    report.assert_clean();
    assert!(report.acknowledged > 0, "nothing was acknowledged: the test tested nothing");
}

/// The model of `--durability normal`: a power cut loses only a
/// write still under way, never one that completed. A commit returns after
/// its WAL write, and a client sees an event only after its commit, so
/// every event any client saw is there after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_with_normal_durability_after_the_last_completed_write_keeps_every_event_a_client_saw() {
    let test = "power_loss_with_normal_durability_after_the_last_completed_write_keeps_every_event_a_client_saw";
    let (history, syncs) = power_loss_under_load(false, Cut::AtLastWrite, test).await;
    let report = history.check();
    eprintln!("{test}: WAL syncs before the cut {syncs}: {report}");
    report.assert_clean();
    assert!(report.acknowledged > 0, "nothing was acknowledged: the test tested nothing");
}

/// Found by the power-loss test: a tool that talks on its stream primes it
/// itself, holding the stream's lock until that commit returns; if
/// `prime_delay` passed meanwhile, the engine primed it too, waiting for
/// that lock without polling the tool: neither went on, and the POST never
/// got its head. With fsync per commit and a short delay it happens at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_talks_as_the_prime_delay_passes_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.db");
    let store = SqliteStore::open(&path, store_config(true)).await.unwrap();
    let config = EngineConfig { prime_delay: Duration::from_millis(1), ..EngineConfig::default() };
    let (addr, _engine) = serve(Arc::new(store), config).await;
    let session = initialize(addr).await;
    for id in 1..=30 {
        let text = post(&call_body(id, "chatty", json!({"n": 2})), Some(&session), &[("Connection", "close")]);
        let answer = send(addr, &text).await.unwrap_or_else(|e| panic!("call {id}: {e}"));
        assert_eq!(answer.status, 200, "call {id}: {:?}", answer.json);
        assert!(answer.events.iter().any(|e| e.data.contains("structuredContent")), "call {id}: {:?}", answer.events);
    }
}
