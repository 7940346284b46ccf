//! Redis faults under load: three replicas share the real
//! Redis of the test command (`TETHER_TEST_REDIS_URL`, default
//! redis://127.0.0.1:6379/), each through a TCP proxy of the test's own
//! (`support/proxy.rs`). Clients call tools on any replica and resume on
//! any; one replica is delayed, then partitioned from Redis while the
//! others keep it. The partitioned replica answers 503 (it never serves
//! from what it holds in memory), the others go on, and after healing the
//! history checker finds nothing lost, duplicated or misrouted and no
//! request with two final answers.
//!
//! The seed is printed (`TETHER_FAULT_SEED=…` replays it);
//! `TETHER_FAULT_SECS` lengthens the load. Timeouts only detect hangs.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use support::history::History;
use support::load::{Tally, client, replay_all, send};
use support::proxy::{Mode, Proxy, redis_addr};
use support::*;
use tether_server::EngineConfig;
use tether_store::StoreConfig;
use tether_store::redis::RedisStore;

/// Connections to Redis are cut and refused: the replica's client fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_redis_answers_503_and_the_histories_hold_after_healing() {
    partition_under_load(Mode::Partition, 6.0).await;
}

/// Nothing reaches Redis and nothing is closed (packets dropped): the
/// replica's client notices only at its response timeout (5 s), so the
/// partition lasts longer than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_redis_goes_silent_answers_503_and_the_histories_hold_after_healing() {
    partition_under_load(Mode::Blackhole, 20.0).await;
}

/// `n` replicas sharing the test command's Redis under a fresh key prefix,
/// each through a proxy of its own.
async fn replicas_behind_proxies(n: usize, test: &str, lease: Duration) -> (Vec<Proxy>, Vec<std::net::SocketAddr>) {
    let url = std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let upstream = redis_addr(&url).await;
    let prefix = format!("tether-test:{test}:{}:{}:", std::process::id(), rand::random::<u32>());
    let config = EngineConfig { replica_lease: lease, ..EngineConfig::default() };
    let mut proxies = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..n {
        let proxy = Proxy::start(upstream).await;
        let store_config = StoreConfig { redis_prefix: prefix.clone(), ..StoreConfig::default() };
        let store = RedisStore::open(&proxy.url(&url), store_config)
            .await
            .unwrap_or_else(|e| panic!("Redis is needed and not reachable at {url}: {e}; run scripts/test (it starts Redis)"));
        let (addr, _engine) = serve(Arc::new(store), config.clone()).await;
        proxies.push(proxy);
        addrs.push(addr);
    }
    (proxies, addrs)
}

async fn partition_under_load(cut: Mode, default_secs: f64) {
    let seed = fault_seed("replica_chaos");
    let mut rng = StdRng::seed_from_u64(seed);
    let (proxies, addrs) = replicas_behind_proxies(3, "chaos", Duration::from_millis(900)).await;
    let (victim, healthy) = (addrs[2], addrs[0]);

    let history = Arc::new(History::new());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shared = Arc::new(Mutex::new(addrs.clone()));
    let total = fault_load_time(default_secs);
    let until = Instant::now() + total;
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let session = initialize(addrs[c as usize % 3]).await;
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

    // Delay first: slower, never wrong.
    tokio::time::sleep(total / 6).await;
    proxies[2].set(Mode::Delay(Duration::from_millis(rng.random_range(5..40))));
    tokio::time::sleep(total / 6).await;

    // The partition: the victim alone loses Redis.
    proxies[2].set(cut);
    let partitioned = Instant::now();
    let mut refused = 0;
    let mut polls = Vec::new();
    let mut stale = Vec::new();
    while partitioned.elapsed() < total / 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let health = send(victim, &request("GET", "/healthz", &[("Connection", "close")], "")).await;
        polls.push(health.as_ref().map_or(0, |h| h.status));
        if let Ok(health) = &health
            && health.status == 503
        {
            refused += 1;
            let reason = health.json["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("redis"), "a partitioned replica's /healthz names Redis: {reason:?}");
        }
        // What it holds in memory is not served: a replay of any stream
        // read so far is refused, never answered from a stale cache.
        if let Some((session, stream)) = history.streams().first().cloned() {
            let replay = send(victim, &replay_request(&session, &format!("{stream}.0"))).await;
            if let Ok(replay) = replay
                && replay.status == 200
                && partitioned.elapsed() > Duration::from_millis(500)
            {
                stale.push(format!("{stream}: {:?}", replay.events));
            }
        }
    }
    proxies[2].set(Mode::Pass);
    eprintln!("replica_chaos: /healthz of the partitioned replica: {polls:?}");
    assert!(refused > 0, "the partitioned replica never said 503 on /healthz");
    assert_eq!(stale, Vec::<String>::new(), "a partitioned replica served streams from memory");

    for handle in clients {
        tokio::time::timeout(HANG * 6, handle).await.expect("a client hangs").expect("a client panicked");
    }
    stop.store(true, Ordering::Relaxed);

    // After healing: every replica serves again; histories checked through one.
    let healed = Instant::now();
    loop {
        let health = send(victim, &request("GET", "/healthz", &[("Connection", "close")], "")).await;
        if health.is_ok_and(|h| h.status == 200) {
            break;
        }
        assert!(healed.elapsed() < HANG, "the healed replica stays unhealthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replay_all(healthy, &history).await;
    let report = history.check();
    eprintln!(
        "replica_chaos: {cut:?}: seed {seed}: clients sent {}, refused {}, resumed {}, /healthz 503s while partitioned {refused}; {report}",
        Tally::get(&tally.requests),
        Tally::get(&tally.refused),
        Tally::get(&tally.resumed),
    );
    let problems: Vec<String> = tally.problems().into_iter().filter(|p| !p.contains("connect")).collect();
    assert_eq!(problems, Vec::<String>::new(), "answers the protocol does not allow");
    report.assert_clean();
    assert!(report.acknowledged > 0);
}

/// The lease lapse, asserted directly: a call runs on a replica that is
/// then cut off from Redis. Once its lease has lapsed, a client resuming on
/// another replica gets the call's end, "interrupted", exactly once; after
/// healing, when the cut-off replica's work finishes, its answer is not
/// stored as a second end (the stream was taken over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replicas_call_ends_as_interrupted_once_its_lease_lapses_and_only_once() {
    let lease = Duration::from_millis(900);
    let (proxies, addrs) = replicas_behind_proxies(2, "lease", lease).await;
    let (healthy, victim) = (addrs[0], addrs[1]);
    let session = initialize(victim).await;

    // A call that outlives the partition; its stream's priming ID is what
    // the client resumes from.
    let work = Duration::from_millis(4_000);
    let started = Instant::now();
    let call = call_body(7, "sleep", serde_json::json!({"ms": work.as_millis() as u64}));
    let mut tcp = tokio::net::TcpStream::connect(victim).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut tcp, post(&call, Some(&session), &[]).as_bytes()).await.expect("send the call");
    let mut buffered = Vec::new();
    let (status, _) = read_head(&mut tcp, &mut buffered).await.expect("the call's response head");
    assert_eq!(status, 200);
    let prime = loop {
        let text = String::from_utf8_lossy(&buffered).into_owned();
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix("id: ")) {
            break line.trim().to_owned();
        }
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(HANG, tokio::io::AsyncReadExt::read(&mut tcp, &mut chunk))
            .await
            .expect("the call's stream is primed")
            .expect("read the call's stream");
        assert!(n > 0, "the call's stream closed before it was primed");
        buffered.extend_from_slice(&chunk[..n]);
    };

    proxies[1].set(Mode::Partition);
    // The lease lapses `lease` after the last renewal that got through.
    tokio::time::sleep(lease * 2).await;
    let finals = |events: &[support::history::Seen]| -> Vec<serde_json::Value> {
        events
            .iter()
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(&e.data).ok())
            .filter(|m| m["id"] == 7 && (m.get("result").is_some() || m.get("error").is_some()))
            .collect()
    };
    let resumed = send(healthy, &replay_request(&session, &prime)).await.expect("resume on the other replica");
    assert_eq!(resumed.status, 200, "resume on the other replica: {:?}", resumed.json);
    let ended = finals(&resumed.events);
    assert_eq!(ended.len(), 1, "the call ends once on the other replica: {:?}", resumed.events);
    assert_eq!(ended[0]["error"]["code"], -32603, "{:?}", ended[0]);
    let message = ended[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("interrupted"), "the end says the call was interrupted: {message:?}");
    assert!(started.elapsed() < work, "the call ended before its work did: the test raced its own timing");

    // Healing; the cut-off replica's work then finishes and must not end
    // the call a second time.
    proxies[1].set(Mode::Pass);
    drop(tcp);
    tokio::time::sleep(work.saturating_sub(started.elapsed()) + Duration::from_millis(1_500)).await;
    for (name, addr) in [("healthy", healthy), ("healed", victim)] {
        let replay = send(addr, &replay_request(&session, &prime)).await.expect("replay after healing");
        assert_eq!(replay.status, 200, "replay on the {name} replica: {:?}", replay.json);
        let ended = finals(&replay.events);
        assert_eq!(ended.len(), 1, "one end of the call on the {name} replica after healing: {:?}", replay.events);
        assert_eq!(ended[0]["error"]["code"], -32603, "{:?}", ended[0]);
    }
}
