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
//! misrouted or unended. Under `normal` (ignored here, being long;
//! `scripts/faults --failover` runs it) the same run counts what a failover
//! loses, and fails if a request was left unended: one its client gave up
//! waiting for (30 s of resuming), or one primed and without a final
//! message in the store.
//!
//! Under `normal`, every request a client started ends for it, whatever the
//! failover took back (deterministic tests, one request, no load: the
//! `gated` tool waits for the test between its events, so each failover
//! falls exactly where it must): a request whose final response was lost
//! gets an error saying its outcome is unknown, resumed on the replica that
//! ran it or on the other one, from its priming event or from an event the
//! failover took back (`a_final_lost_in_a_failover_…`,
//! `a_client_holding_an_event_…`); so does one whose priming event was lost
//! with its final (`a_final_lost_with_its_priming_event_…`); one whose
//! priming event was lost while it ran gets its own answer, resumed while
//! it runs or after (`a_request_whose_priming_event_was_lost_…`); and a
//! final never takes the number of an event the client read and the
//! failover took back (`a_message_a_failover_took_back_…`). The chaos runs
//! under `normal` assert that no request was left unended.
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

/// Under `normal` a failover loses what the replica had not copied (the
/// losses are counted, not failed), but every request a client started
/// still ends for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long (a minute or two per kill): scripts/faults --failover runs it"]
async fn a_primary_killed_with_its_replica_behind_under_normal_leaves_no_request_unended() {
    assert_all_ended(&single(false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long (a minute or two per kill): scripts/faults --failover runs it"]
async fn a_cluster_primary_killed_with_its_replica_behind_under_normal_leaves_no_request_unended() {
    assert_all_ended(&cluster(false).await);
}

/// No request was left without its final message in the store (the
/// clients' own count, that none gave up waiting, is asserted by `finish`).
fn assert_all_ended(report: &Report) {
    let unended: Vec<&String> = report.violations.iter().filter(|v| v.contains("never ended")).take(20).collect();
    assert_eq!(report.unended, 0, "requests primed but never ended: {unended:#?}");
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

/// The failover took back the whole stream, its priming event too (which
/// names the replica that ran it): resumed, it was answered 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_lost_with_its_priming_event_is_ended_when_its_owner_is_resumed() {
    lost_stream_ended(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_lost_with_its_priming_event_is_ended_when_another_replica_is_resumed() {
    lost_stream_ended(1).await;
}

/// The failover took back the priming event of a request that still runs:
/// resumed, it was answered 400 while it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_priming_event_was_lost_ends_with_its_result_when_resumed_on_its_owner_while_it_runs() {
    lost_prime_running(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_priming_event_was_lost_ends_with_its_result_when_resumed_on_another_replica_while_it_runs() {
    lost_prime_running(1).await;
}

/// The same request resumed after it ended: its final response took the
/// number of the lost priming event, which the client held, so the resume
/// sent nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_priming_event_was_lost_ends_with_its_result_when_resumed_after_it_ended() {
    let mut pair = Pair::start().await;
    let session = initialize(pair.addrs[0]).await;
    blocking(|| pair.caught_up());
    pair.cut();
    let gate = gate_name();
    let call = post(&call_body(1, "gated", json!({"after": gate})), Some(&session), &[]);
    let prime = first_event_id(pair.addrs[0], &call).await;
    pair.fail_over().await;
    open_gate(&gate);
    blocking(|| pair.wait_for_stream(&prime));
    let (after, _) = resume_to_final(pair.addrs[1], &session, &prime).await;
    assert!(after.get("result").is_some(), "the call's own answer, stored after the failover: {after}");
}

/// A notification the client read was taken back, and the final response
/// took its number: the client, resuming from it, got nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_a_failover_took_back_does_not_give_its_number_to_the_final() {
    let mut pair = Pair::start().await;
    let session = initialize(pair.addrs[0]).await;
    let (before, after) = (gate_name(), gate_name());
    let call = post(&call_body(1, "gated", json!({"before": before, "notify": true, "after": after})), Some(&session), &[]);
    let prime = first_event_id(pair.addrs[0], &call).await;
    blocking(|| pair.caught_up());
    pair.cut();
    open_gate(&before);
    let message = message_id_after(pair.addrs[0], &session, &prime).await;
    pair.fail_over().await;
    open_gate(&after);
    // Stored after the failover, whatever its number: read from the priming event.
    let (answer, _) = resume_to_final(pair.addrs[0], &session, &prime).await;
    assert!(answer.get("result").is_some(), "the call's own answer: {answer}");
    let (answer, _) = resume_to_final(pair.addrs[1], &session, &message).await;
    assert!(answer.get("result").is_some(), "the call's own answer, after the lost message: {answer}");
}

/// Where the client resumes from after the failover.
#[derive(Clone, Copy)]
enum From {
    /// The stream's priming event (copied to the replica).
    Prime,
    /// The last event it read before the failover (the lost final).
    LastSeen,
}

/// Generous: a resumed stream that nobody ends would wait forever.
const LOST_FINAL_DEADLINE: Duration = Duration::from_secs(120);

/// A Redis primary with a replica that copies it through `link` (a proxy
/// the test can stop), and two tether replicas under `normal` durability on
/// it through `front`, which follows the primary: the setup of the
/// deterministic failovers.
struct Pair {
    _dir: tempfile::TempDir,
    primary: RedisServer,
    replica: RedisServer,
    link: Proxy,
    front: Proxy,
    addrs: Vec<SocketAddr>,
}

impl Pair {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (primary, replica) =
            blocking(|| (RedisServer::start(&dir.path().join("a"), &[]), RedisServer::start(&dir.path().join("b"), &[])));
        let link = Proxy::start(primary.addr()).await;
        assert_eq!(replica.cli(&["replicaof", "127.0.0.1", &link.addr.port().to_string()]), "OK");
        blocking(|| primary.wait_for_replica());
        let front = Proxy::start(primary.addr()).await;
        // A lease that outlives the test: each tether replica stays alive to
        // the other, whatever the promoted replica copied of its renewals.
        // Short keep-alives: a waiting stream asks again on each.
        let engine = EngineConfig {
            replica_lease: Duration::from_secs(300),
            keepalive: Duration::from_secs(1),
            ..EngineConfig::default()
        };
        let addrs = tethers_with(&front.url("redis://127.0.0.1/"), false, engine).await;
        Self { _dir: dir, primary, replica, link, front, addrs }
    }

    /// Waits until the Redis replica has everything the primary has now,
    /// both tether replicas' leases included.
    fn caught_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.replica.cli(&["keys", "*kv:lease:*"]).lines().filter(|l| !l.trim().is_empty()).count() < 2 {
            assert!(Instant::now() < deadline, "the tether replicas' leases never reached the Redis replica");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.primary.wait_for_replica();
    }

    /// The Redis replica stops copying: what the primary takes from now on
    /// waits on the link.
    fn cut(&self) {
        self.link.set(Mode::Blackhole);
    }

    /// The primary dies with what the replica had not copied; the replica
    /// is promoted and the tether replicas' address moves to it.
    async fn fail_over(&mut self) {
        blocking(|| self.primary.kill());
        self.link.set(Mode::Partition);
        assert_eq!(self.replica.cli(&["replicaof", "no", "one"]), "OK");
        self.front.retarget(self.replica.addr());
    }

    /// Waits until the promoted replica holds the stream of `event` (an event ID).
    fn wait_for_stream(&self, event: &str) {
        let stream = event.split('.').next().unwrap_or_default();
        let deadline = Instant::now() + LOST_FINAL_DEADLINE;
        while self.replica.cli(&["keys", &format!("*:e:{stream}")]).trim().is_empty() {
            assert!(Instant::now() < deadline, "stream {stream} was never stored again after the failover");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A gate of this test's own for the `gated` tool.
fn gate_name() -> String {
    format!("gate-{}", rand::random::<u64>())
}

/// Under `normal`, two tether replicas on a primary with a replica: replica
/// 0 runs a call, its client goes away after the priming event (copied to
/// the Redis replica), the Redis replica stops copying, the call ends (its
/// final response on the primary only), the primary dies and the replica
/// is promoted without that final. The client resumes on tether replica
/// `resume_on` (1 must ask replica 0, alive, to end it), `from` its
/// priming event or the last event it read: the stream must end, with an
/// error that says the outcome is unknown.
async fn lost_final(resume_on: usize, from: From) {
    let mut pair = Pair::start().await;
    let session = initialize(pair.addrs[0]).await;
    let gate = gate_name();
    let call = post(&call_body(1, "gated", json!({"after": gate})), Some(&session), &[]);
    let prime = first_event_id(pair.addrs[0], &call).await;
    blocking(|| pair.caught_up());
    pair.cut();
    open_gate(&gate);
    let (before, last_seen) = resume_to_final(pair.addrs[0], &session, &prime).await;
    assert!(before.get("result").is_some(), "the call's own answer, on the primary: {before}");
    let from = match from {
        From::Prime => prime,
        From::LastSeen => last_seen,
    };
    pair.fail_over().await;
    let (after, _) = resume_to_final(pair.addrs[resume_on], &session, &from).await;
    assert_lost(&after);
}

/// As [`lost_final`], but the Redis replica stops copying before the call
/// is sent: its priming event is lost too, and with it the only record of
/// which tether replica ran it.
async fn lost_stream_ended(resume_on: usize) {
    let mut pair = Pair::start().await;
    let session = initialize(pair.addrs[0]).await;
    blocking(|| pair.caught_up());
    pair.cut();
    let gate = gate_name();
    let call = post(&call_body(1, "gated", json!({"after": gate})), Some(&session), &[]);
    let prime = first_event_id(pair.addrs[0], &call).await;
    open_gate(&gate);
    let (before, _) = resume_to_final(pair.addrs[0], &session, &prime).await;
    assert!(before.get("result").is_some(), "the call's own answer, on the primary: {before}");
    pair.fail_over().await;
    let (after, _) = resume_to_final(pair.addrs[resume_on], &session, &prime).await;
    assert_lost(&after);
}

/// The priming event of a call that runs on is lost; its client resumes on
/// tether replica `resume_on` while the call runs (the stream must be
/// stored again: the call's replica is asked), then the call ends: the
/// client gets its answer.
async fn lost_prime_running(resume_on: usize) {
    let mut pair = Pair::start().await;
    let session = initialize(pair.addrs[0]).await;
    blocking(|| pair.caught_up());
    pair.cut();
    let gate = gate_name();
    let call = post(&call_body(1, "gated", json!({"after": gate})), Some(&session), &[]);
    let prime = first_event_id(pair.addrs[0], &call).await;
    pair.fail_over().await;
    let resumed = tokio::spawn({
        let (addr, session, prime) = (pair.addrs[resume_on], session.clone(), prime.clone());
        async move { resume_to_final(addr, &session, &prime).await }
    });
    blocking(|| pair.wait_for_stream(&prime));
    open_gate(&gate);
    let (after, _) = resumed.await.expect("the resuming client");
    assert!(after.get("result").is_some(), "the call's own answer: {after}");
}

/// An error saying the answer was lost and the outcome is unknown.
fn assert_lost(after: &Value) {
    assert!(
        after.get("result").is_none(),
        "the final came through the failover: the replica copied it before its link was cut: {after}"
    );
    let message = after["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lost by the session store") && message.contains("may or may not have taken effect"),
        "an error that says the answer was lost and the outcome is unknown: {after}"
    );
}

/// Resumes `session` after `from` and returns the ID of the first event
/// with data (a message), then goes away as a client whose connection dropped.
async fn message_id_after(addr: SocketAddr, session: &str, from: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(replay_request(session, from).as_bytes()).await.expect("send the request");
    let mut buffered = Vec::new();
    let (status, _) = read_head(&mut tcp, &mut buffered).await.expect("a response head");
    assert_eq!(status, 200, "resuming {from}: {}", String::from_utf8_lossy(&buffered));
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buffered).into_owned();
        let mut id = None;
        for line in text.lines() {
            if let Some(at) = line.strip_prefix("id:") {
                id = Some(at.trim().to_owned());
            }
            if line.strip_prefix("data:").is_some_and(|d| !d.trim().is_empty())
                && let Some(id) = id.take()
            {
                return id;
            }
        }
        match tokio::time::timeout(HANG, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffered.extend_from_slice(&chunk[..n]),
            other => panic!("no message after {from}: {other:?}"),
        }
    }
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
        for unended in self.tally.unended_requests() {
            eprintln!("redis_failover: {test}: unended: {unended}");
        }
        eprintln!("redis_failover: {test}: violations by kind: {:?}", kinds(&report.violations));
        for violation in report.violations.iter().filter(|v| !v.contains("is not stored")).take(20) {
            eprintln!("redis_failover: {test}: violation: {violation}");
        }
        let problems = self.tally.problems();
        eprintln!(
            "redis_failover: {test}: {} answers the protocol does not allow: {:?}",
            problems.len(),
            problems.iter().take(10).collect::<Vec<_>>()
        );
        assert!(report.acknowledged > 0, "nothing was acknowledged");
        let given_up = self.tally.unended_requests();
        assert!(given_up.is_empty(), "requests that never ended for their clients: {given_up:#?}");
        report
    }
}

/// The history checker's violations counted by kind (what a failover under
/// `normal` loses, for the report).
fn kinds(violations: &[String]) -> Vec<(&'static str, usize)> {
    const KINDS: [(&str, &str); 8] = [
        ("read but not stored", "is not stored"),
        ("response does not replay", "does not replay"),
        ("two final messages", "final messages"),
        ("an event in two versions", "two versions"),
        ("read twice", "twice"),
        ("a later event survived a lost one", "survived"),
        ("never ended", "never ended"),
        ("out of order", " after "),
    ];
    let mut counts: Vec<(&'static str, usize)> = KINDS.iter().map(|(name, _)| (*name, 0)).collect();
    let mut other = 0;
    for violation in violations {
        match KINDS.iter().position(|(_, marker)| violation.contains(marker)) {
            Some(at) => counts[at].1 += 1,
            None => other += 1,
        }
    }
    counts.push(("other", other));
    counts.retain(|(_, n)| *n > 0);
    counts
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
