//! Runs the shared store conformance suite against every built-in backend:
//! one test per scenario and backend (`memory::cursors`,
//! `sqlite_strict::session_expiry`, ...), so a failure names its scenario
//! and the scenarios run in parallel. Each test opens stores of its own (a
//! temporary directory, a Redis key prefix) from its module's `harness`.

use std::sync::Arc;

use tether_store::conformance::Harness;
use tether_store::memory::MemoryStore;
use tether_store::sqlite::SqliteStore;
use tether_store::{Store, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig { max_events_per_stream: 100, ..StoreConfig::default() }
}

/// Expanded by `tether_store::conformance_scenarios!(one_test_per_scenario, reopen | no_reopen)`
/// in a backend's module: a test per scenario, which takes its stores from
/// the module's `harness(scenario)` and calls its `passed(scenario)` once the
/// scenario passed. `no_reopen`: the backend keeps nothing across a reopen,
/// so the `durable` scenarios are left out.
macro_rules! one_test_per_scenario {
    ([$reopen:ident] $($kind:ident $scenario:ident,)*) => {
        $(one_test_per_scenario!(@test $reopen $kind $scenario);)*
    };
    (@run store $scenario:ident $h:ident) => {
        tether_store::conformance::$scenario(&($h.fresh)().await).await
    };
    (@run harness $scenario:ident $h:ident) => {
        tether_store::conformance::$scenario(&$h).await
    };
    (@run durable $scenario:ident $h:ident) => {
        tether_store::conformance::$scenario(&$h).await
    };
    (@test no_reopen durable $scenario:ident) => {};
    (@test $reopen:ident $kind:ident $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            let h = harness(stringify!($scenario)).await;
            one_test_per_scenario!(@run $kind $scenario h);
            passed(stringify!($scenario)).await;
        }
    };
}

mod memory {
    use super::*;

    async fn harness(_scenario: &str) -> Harness {
        Harness { fresh: Box::new(|| Box::pin(async { Arc::new(MemoryStore::new(config())) as Arc<dyn Store> })), reopen: None }
    }

    async fn passed(_scenario: &str) {}

    tether_store::conformance_scenarios!(one_test_per_scenario, no_reopen);

    /// The memory store is one of the backends that drop finished streams by age.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn drops_finished_streams_by_age() {
        let store = MemoryStore::new(config());
        store.create_session(&tether_store::conformance::session("s", "p", 60_000)).await.unwrap();
        store.start_stream("s", "r1", vec![(tether_store::EventKind::Final, bytes::Bytes::from_static(b"ok"))]).await.unwrap();
        assert_eq!(store.drop_finished_streams("r", "r2", tether_store::now_ms() + 1, 10).await.unwrap(), 1);
        assert!(store.stream("s", "r1").await.unwrap().is_none());
    }
}

mod sqlite {
    use super::*;

    async fn harness(_scenario: &str) -> Harness {
        sqlite_harness(config())
    }

    async fn passed(_scenario: &str) {}

    tether_store::conformance_scenarios!(one_test_per_scenario, reopen);
}

/// `--durability strict`: every commit waits for its fsync, so the writer
/// commits on the blocking pool instead of a runtime worker.
mod sqlite_strict {
    use super::*;

    async fn harness(_scenario: &str) -> Harness {
        sqlite_harness(StoreConfig { strict_durability: true, ..config() })
    }

    async fn passed(_scenario: &str) {}

    tether_store::conformance_scenarios!(one_test_per_scenario, reopen);
}

/// Stores in a temporary directory of their own, kept as long as the harness.
fn sqlite_harness(config: StoreConfig) -> Harness {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fresh_dir = dir.clone();
    let (fresh_config, reopen_config) = (config.clone(), config);
    Harness {
        fresh: Box::new(move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let path = fresh_dir.path().join(format!("db{n}.sqlite"));
            let config = fresh_config.clone();
            Box::pin(async move { Arc::new(SqliteStore::open(&path, config).await.unwrap()) as Arc<dyn Store> })
        }),
        reopen: Some(Box::new(move |store: Arc<dyn Store>| {
            let path = store.describe().trim_start_matches("sqlite:").to_owned();
            let config = reopen_config.clone();
            Box::pin(async move {
                drop(store);
                // The file lock is let go when the last handle (and writer task) is gone.
                for _ in 0..100 {
                    match SqliteStore::open(std::path::Path::new(&path), config.clone()).await {
                        Ok(s) => return Arc::new(s) as Arc<dyn Store>,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                    }
                }
                panic!("could not reopen {path}");
            })
        })),
    }
}

mod redis {
    use super::*;

    /// The scenario's own keys: tests of one process (`cargo test`) run side by side.
    fn run(scenario: &str) -> String {
        format!("tether-test:{}:{scenario}:", std::process::id())
    }

    async fn harness(scenario: &str) -> Harness {
        redis_harness(&redis_url(), &run(scenario)).await
    }

    async fn passed(scenario: &str) {
        delete_prefix(&redis_url(), &run(scenario)).await;
    }

    tether_store::conformance_scenarios!(one_test_per_scenario, reopen);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn appends_are_announced_to_every_replica() {
        announcements_reach_other_replicas(&redis_url(), &run("announce")).await;
    }
}

/// The same scenarios on a three-primary Redis Cluster (scripts/test starts
/// it with scripts/redis-cluster): every script must touch one slot.
mod redis_cluster {
    use super::*;

    fn run(scenario: &str) -> String {
        format!("tether-test:{}:{scenario}:", std::process::id())
    }

    async fn harness(scenario: &str) -> Harness {
        redis_harness(&redis_cluster_url(), &run(scenario)).await
    }

    async fn passed(scenario: &str) {
        delete_prefix(&redis_cluster_url(), &run(scenario)).await;
    }

    tether_store::conformance_scenarios!(one_test_per_scenario, reopen);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn appends_are_announced_to_every_replica() {
        announcements_reach_other_replicas(&redis_cluster_url(), &run("announce")).await;
    }
}

/// Two stores on the same keys (two replicas): what one appends, the other
/// hears of, for sessions whose keys are spread over every shard.
async fn announcements_reach_other_replicas(url: &str, prefix: &str) {
    use tether_store::redis::RedisStore;
    let config = StoreConfig { redis_prefix: prefix.to_owned(), ..config() };
    let writer = RedisStore::open(url, config.clone()).await.unwrap();
    let listener = RedisStore::open(url, config).await.unwrap();
    let mut heard = listener.remote_appends().unwrap();
    for n in 0..24 {
        let id = format!("announced-{n}");
        writer.create_session(&tether_store::conformance::session(&id, "p", 60_000)).await.unwrap();
        let first = writer
            .append_batch(&id, "r1", vec![(tether_store::EventKind::Message, bytes::Bytes::from_static(b"a")); 2])
            .await
            .unwrap();
        let append = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                let a = heard.recv().await.unwrap();
                if a.session == id {
                    return a;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the append to {id} was not announced within 5 s"));
        assert_eq!((append.stream.as_str(), append.seq), ("r1", first + 1), "the batch is announced with its last seq");
    }
    delete_prefix(url, prefix).await;
}

/// The Redis named by `TETHER_TEST_REDIS_URL` (scripts/test sets it after
/// making sure Redis answers), else the local default. A missing Redis is a
/// failure with a clear message, never a silent pass.
pub fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// The Redis Cluster named by `TETHER_TEST_REDIS_CLUSTER_URL` (scripts/test
/// sets it after scripts/redis-cluster started one), else that script's
/// default. Missing is a failure with a clear message, as for Redis.
pub fn redis_cluster_url() -> String {
    std::env::var("TETHER_TEST_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis+cluster://127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303/".into())
}

/// Stores under key prefixes that start with `run`, one per fresh store.
async fn redis_harness(url: &str, run: &str) -> Harness {
    use tether_store::redis::RedisStore;
    let url = url.to_owned();
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probe = RedisStore::open(&url, config()).await;
    if let Err(e) = probe {
        panic!(
            "Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis and, with scripts/redis-cluster, a Redis Cluster) or set TETHER_TEST_REDIS_URL / TETHER_TEST_REDIS_CLUSTER_URL."
        );
    }
    let last_prefix = Arc::new(parking_lot::Mutex::new(String::new()));
    let (fresh_url, fresh_last, fresh_run) = (url.clone(), last_prefix.clone(), run.to_owned());
    Harness {
        fresh: Box::new(move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let url = fresh_url.clone();
            let prefix = format!("{fresh_run}{n}:");
            *fresh_last.lock() = prefix.clone();
            Box::pin(async move {
                let config = StoreConfig { redis_prefix: prefix, ..config() };
                Arc::new(RedisStore::open(&url, config).await.unwrap()) as Arc<dyn Store>
            })
        }),
        // A new connection (a new process) on the same keys.
        reopen: Some(Box::new(move |store: Arc<dyn Store>| {
            let url = url.clone();
            let prefix = last_prefix.lock().clone();
            Box::pin(async move {
                drop(store);
                let config = StoreConfig { redis_prefix: prefix, ..config() };
                Arc::new(RedisStore::open(&url, config).await.unwrap()) as Arc<dyn Store>
            })
        })),
    }
}

/// Removes every key a test run created (on each node of a cluster).
pub async fn delete_prefix(url: &str, prefix: &str) {
    let nodes = if tether_store::redis::is_cluster_url(url) {
        tether_store::redis::cluster_nodes(url).unwrap()
    } else {
        vec![url.to_owned()]
    };
    for node in nodes {
        let client = ::redis::Client::open(node).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = ::redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await.unwrap();
        // One key per DEL: on a cluster node, keys of one call must share a slot.
        for key in keys {
            let _: i64 = ::redis::cmd("DEL").arg(key).query_async(&mut conn).await.unwrap();
        }
    }
}
