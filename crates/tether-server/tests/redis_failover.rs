//! Redis failover under load: clients call quick and slow tools through two
//! tether replicas sharing a Redis of the test's own, and resume on either;
//! a Redis replica falls behind its primary (a partition on the replication
//! link: a proxy that stops passing what the primary sends), the primary is
//! killed with SIGKILL and the replica promoted, the old primary comes back
//! as the new one's replica, and so on, `TETHER_FAILOVER_KILLS` times
//! (default 1). On a single primary with a replica (the clients' address
//! moves to the promoted one, as Sentinel or a virtual IP moves it) and on a
//! Redis Cluster of three primaries with a replica each (the replica, its
//! link paused, is killed too and restarted from its own append-only file
//! before `CLUSTER FAILOVER TAKEOVER`: what was on its way is lost).
//!
//! Under `--durability strict --redis-replicas 1` the history checker then
//! finds nothing acknowledged lost, and nothing duplicated, reordered,
//! misrouted or unended. Under `normal` (ignored here; `scripts/faults
//! --failover` runs it) the same run counts what a failover loses.
//!
//! Under `normal`, a request whose final response the failover took back
//! still ends for its client: resumed on the replica that ran it, or on the
//! other one, it gets an error saying its outcome is unknown (the
//! `a_final_lost_in_a_failover_…` tests, one request, no load).
//!
//! `TETHER_FAILOVER_CLIENTS` (default 50) and `TETHER_FAULT_SEED` as in the
//! other fault tests. Timeouts only detect hangs.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use support::history::{History, Report, Seen};
use support::load::{Tally, client, replay_all, send};
use support::proxy::{Mode, Proxy};
use support::redis_server::{Cluster, RedisServer};
use support::*;
use tether_server::EngineConfig;
use tether_store::StoreConfig;
use tether_store::redis::RedisStore;

/// The load each round runs before the replica falls behind, and how far behind it falls.
const LOAD: Duration = Duration::from_millis(1_500);
const LAG: Duration = Duration::from_millis(500);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f` (processes, `redis-cli`) without holding up the runtime's
/// other tasks: the tether replicas run on it.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn kills() -> u64 {
    env_number("TETHER_FAILOVER_KILLS", 1).max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_with_its_replica_behind_loses_nothing_acknowledged_under_strict() {
    let report = single(true).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_killed_with_its_replica_behind_loses_nothing_acknowledged_under_strict() {
    let report = cluster(true).await;
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "counts what normal durability loses at a failover: scripts/faults --failover runs it"]
async fn a_primary_killed_with_its_replica_behind_under_normal() {
    single(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "counts what normal durability loses at a failover: scripts/faults --failover runs it"]
async fn a_cluster_primary_killed_with_its_replica_behind_under_normal() {
    cluster(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_lost_in_a_failover_is_ended_when_its_owner_is_resumed() {
    lost_final(0, From::Prime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_lost_in_a_failover_is_ended_when_another_replica_is_resumed() {
    lost_final(1, From::Prime).await;
}

/// The client had read events that the failover took back: its
/// `Last-Event-ID` is past the stream's end in the store now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_an_event_a_failover_took_back_still_resumes_to_a_final() {
    lost_final(1, From::LastSeen).await;
}

/// Where the client resumes from after the failover.
#[derive(Clone, Copy)]
enum From {
    /// The stream's priming event (copied to the replica).
    Prime,
    /// The last event it read before the failover (the lost final).
    LastSeen,
}

/// How long the slow call runs: the replica must have stopped copying
/// before it ends (a few milliseconds after the call was primed).
const SLOW_CALL_MS: u64 = 6_000;
/// Generous: a resumed stream that nobody ends would wait forever.
const LOST_FINAL_DEADLINE: Duration = Duration::from_secs(120);

/// Under `normal`, two tether replicas on a primary with a replica: replica
/// 0 runs a slow call, its client goes away after the priming event (copied
/// to the Redis replica), the Redis replica stops copying, the call ends
/// (its final response on the primary only), the primary dies and the
/// replica is promoted without that final. The client resumes on tether
/// replica `resume_on` (1 must ask replica 0, alive, to end it), `from` its
/// priming event or the last event it read: the stream must end, with an
/// error that says the outcome is unknown.
async fn lost_final(resume_on: usize, from: From) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut primary, replica) =
        blocking(|| (RedisServer::start(&dir.path().join("a"), &[]), RedisServer::start(&dir.path().join("b"), &[])));
    let link = Proxy::start(primary.addr()).await;
    assert_eq!(replica.cli(&["replicaof", "127.0.0.1", &link.addr.port().to_string()]), "OK");
    blocking(|| primary.wait_for_replica());
    let front = Proxy::start(primary.addr()).await;
    // A lease that outlives the test: replica 0 stays the owner, alive,
    // whatever the promoted replica copied of its renewals. Short
    // keep-alives: a waiting stream asks the owner again on each.
    let engine =
        EngineConfig { replica_lease: Duration::from_secs(300), keepalive: Duration::from_secs(1), ..EngineConfig::default() };
    let addrs = tethers_with(&front.url("redis://127.0.0.1/"), false, engine).await;

    let session = initialize(addrs[0]).await;
    let call = post(&call_body(1, "sleep", json!({"ms": SLOW_CALL_MS, "n": 1})), Some(&session), &[]);
    let prime = first_event_id(addrs[0], &call).await;
    blocking(|| {
        // Both tether replicas' leases (written as each started) are copied too.
        let deadline = Instant::now() + Duration::from_secs(60);
        while replica.cli(&["keys", "*kv:lease:*"]).lines().filter(|l| !l.trim().is_empty()).count() < 2 {
            assert!(Instant::now() < deadline, "the tether replicas' leases never reached the Redis replica");
            std::thread::sleep(Duration::from_millis(50));
        }
        primary.wait_for_replica();
    });
    link.set(Mode::Blackhole);
    let (before, last_seen) = resume_to_final(addrs[0], &session, &prime).await;
    assert!(before.get("result").is_some(), "the call's own answer, on the primary: {before}");
    let from = match from {
        From::Prime => prime,
        From::LastSeen => last_seen,
    };

    blocking(|| primary.kill());
    link.set(Mode::Partition);
    assert_eq!(replica.cli(&["replicaof", "no", "one"]), "OK");
    front.retarget(replica.addr());
    let (after, _) = resume_to_final(addrs[resume_on], &session, &from).await;
    assert!(
        after.get("result").is_none(),
        "the final came through the failover: the replica copied it before its link was cut \
         (the host stalled for {SLOW_CALL_MS} ms?): {after}"
    );
    let message = after["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lost by the session store") && message.contains("may or may not have taken effect"),
        "an error that says the answer was lost and the outcome is unknown: {after}"
    );
}

/// Sends `text` (a POST answered with a stream) and returns the ID of the
/// stream's first event, then goes away as a client whose connection dropped.
async fn first_event_id(addr: SocketAddr, text: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(text.as_bytes()).await.expect("send the request");
    let mut buffered = Vec::new();
    let (status, _) = read_head(&mut tcp, &mut buffered).await.expect("a response head");
    assert_eq!(status, 200, "the slow call: {}", String::from_utf8_lossy(&buffered));
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buffered).into_owned();
        if let Some(id) = text.lines().find_map(|l| l.strip_prefix("id:")).filter(|_| text.contains("\n\n")) {
            return id.trim().to_owned();
        }
        match tokio::time::timeout(HANG, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffered.extend_from_slice(&chunk[..n]),
            other => panic!("no event on the slow call's stream: {other:?}"),
        }
    }
}

/// Resumes request 1's stream after `prime` until its final response comes
/// (a store that fails over answers 503 for a while), within
/// [`LOST_FINAL_DEADLINE`]; the final and the last event ID read.
async fn resume_to_final(addr: SocketAddr, session: &str, prime: &str) -> (Value, String) {
    let deadline = Instant::now() + LOST_FINAL_DEADLINE;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        match send(addr, &replay_request(session, prime)).await {
            Ok(answer) if answer.status == 200 => {
                let finals: Vec<Value> = answer.events.iter().filter_map(|e: &Seen| final_of_1(&e.data)).collect();
                if let (Some(last), Some(seen)) = (finals.last(), answer.events.last()) {
                    return (last.clone(), seen.id.clone());
                }
                last = answer.events.iter().map(|e| e.data.clone()).collect();
            }
            Ok(answer) => last = vec![format!("HTTP {}: {}", answer.status, answer.json)],
            Err(e) => last = vec![e],
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("request 1 never ended within {LOST_FINAL_DEADLINE:?} of resuming; last answer: {last:?}");
}

/// A final response to request 1.
fn final_of_1(data: &str) -> Option<Value> {
    serde_json::from_str::<Value>(data)
        .ok()
        .filter(|m| m.get("id") == Some(&json!(1)) && (m.get("result").is_some() || m.get("error").is_some()))
}

/// Two tether replicas on the Redis at `url`, strict with one replica or normal.
async fn tethers(url: &str, strict: bool) -> Vec<SocketAddr> {
    tethers_with(url, strict, EngineConfig { replica_lease: Duration::from_secs(2), ..EngineConfig::default() }).await
}

async fn tethers_with(url: &str, strict: bool, engine: EngineConfig) -> Vec<SocketAddr> {
    let prefix = format!("tether-failover:{}:{}:", std::process::id(), rand::random::<u32>());
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let config = StoreConfig {
            redis_prefix: prefix.clone(),
            strict_durability: strict,
            redis_replicas: u32::from(strict),
            ..StoreConfig::default()
        };
        let store = RedisStore::open(url, config).await.unwrap_or_else(|e| panic!("tether on {url}: {e}"));
        let (addr, _engine) = serve(Arc::new(store), engine.clone()).await;
        addrs.push(addr);
    }
    addrs
}

/// The clients of one run, calling until told to stop.
struct Load {
    seed: u64,
    history: Arc<History>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    addrs: Vec<SocketAddr>,
}

impl Load {
    async fn start(test: &str, addrs: Vec<SocketAddr>, strict: bool) -> Self {
        let seed = fault_seed(test);
        let history = Arc::new(History::new());
        let tally = Arc::new(Tally::default());
        tally.lenient.store(!strict, Ordering::Relaxed);
        // Under strict a stalled write is retried until the shard has a
        // replica again: generous, never a hang's bound.
        tally.patience_secs.store(if strict { 120 } else { 30 }, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(addrs.clone()));
        let forever = Instant::now() + Duration::from_secs(24 * 3600);
        let mut clients = Vec::new();
        for c in 0..env_number("TETHER_FAILOVER_CLIENTS", 50) {
            let session = initialize(addrs[c as usize % addrs.len()]).await;
            let (seed, stop, history, tally) = (seed.wrapping_add(c + 1), stop.clone(), history.clone(), tally.clone());
            clients.push(tokio::spawn(client(shared.clone(), session, seed, forever, stop, history, tally)));
        }
        Self { seed, history, tally, stop, clients, addrs }
    }

    /// Stops the clients, replays every stream and judges the history.
    async fn finish(self, test: &str, kills: u64) -> Report {
        tokio::time::sleep(LOAD).await;
        self.stop.store(true, Ordering::Relaxed);
        for handle in self.clients {
            // Longer than a client's patience with a stalled request.
            tokio::time::timeout(Duration::from_secs(180), handle).await.expect("a client hangs").expect("a client panicked");
        }
        replay_all(self.addrs[0], &self.history).await;
        let report = self.history.check();
        eprintln!(
            "redis_failover: {test}: seed {}: {kills} primary kill(s): clients sent {}, refused {}, resumed {}, given up unended {}; {report}",
            self.seed,
            Tally::get(&self.tally.requests),
            Tally::get(&self.tally.refused),
            Tally::get(&self.tally.resumed),
            Tally::get(&self.tally.unended),
        );
        let problems = self.tally.problems();
        eprintln!(
            "redis_failover: {test}: {} answers the protocol does not allow: {:?}",
            problems.len(),
            problems.iter().take(10).collect::<Vec<_>>()
        );
        assert!(report.acknowledged > 0, "nothing was acknowledged");
        report
    }
}

/// A primary and its replica; the clients' address follows the primary.
async fn single(strict: bool) -> Report {
    let test = if strict { "single strict" } else { "single normal" };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut primary, mut replica) =
        blocking(|| (RedisServer::start(&dir.path().join("a"), &[]), RedisServer::start(&dir.path().join("b"), &[])));
    let mut link = Proxy::start(primary.addr()).await;
    assert_eq!(replica.cli(&["replicaof", "127.0.0.1", &link.addr.port().to_string()]), "OK");
    blocking(|| primary.wait_for_replica());
    let front = Proxy::start(primary.addr()).await;
    let addrs = tethers(&front.url("redis://127.0.0.1/"), strict).await;
    let load = Load::start(test, addrs, strict).await;

    let kills = kills();
    for _ in 0..kills {
        tokio::time::sleep(LOAD).await;
        // The replica falls behind: what the primary sends waits on the link.
        link.set(Mode::Blackhole);
        tokio::time::sleep(LAG).await;
        blocking(|| primary.kill());
        link.set(Mode::Partition);
        assert_eq!(replica.cli(&["replicaof", "no", "one"]), "OK");
        front.retarget(replica.addr());
        // The old primary comes back from its own files as the new one's replica.
        link = Proxy::start(replica.addr()).await;
        let port = link.addr.port().to_string();
        blocking(|| {
            primary.restart(&["--replicaof", "127.0.0.1", &port]);
            replica.wait_for_replica();
        });
        std::mem::swap(&mut primary, &mut replica);
    }
    load.finish(test, kills).await
}

/// A cluster of three primaries with a replica each; each kill takes the next shard's primary.
async fn cluster(strict: bool) -> Report {
    let test = if strict { "cluster strict" } else { "cluster normal" };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut cluster = blocking(|| Cluster::start(dir.path(), 3));
    let addrs = tethers(&cluster.url(), strict).await;
    let load = Load::start(test, addrs, strict).await;

    let kills = kills();
    for kill in 0..kills {
        tokio::time::sleep(LOAD).await;
        let (primary, replica) = blocking(|| {
            let primaries = cluster.primaries();
            let primary = primaries[kill as usize % primaries.len()];
            (primary, cluster.replica_of(primary))
        });
        // The replica stops reading: it falls behind; then both die, and
        // the replica comes back from what it had written.
        cluster.nodes[replica].signal("-STOP");
        tokio::time::sleep(LAG).await;
        blocking(|| {
            cluster.nodes[primary].kill();
            cluster.nodes[replica].kill();
            cluster.nodes[replica].restart(&[]);
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while blocking(|| cluster.nodes[replica].info("replication", "role")).as_deref() != Some("master") {
            blocking(|| cluster.nodes[replica].cli(&["cluster", "failover", "takeover"]));
            assert!(Instant::now() < deadline, "the replica never took over");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        blocking(|| {
            cluster.nodes[primary].restart(&[]);
            cluster.nodes[replica].wait_for_replica();
            cluster.wait_ok();
        });
    }
    load.finish(test, kills).await
}
