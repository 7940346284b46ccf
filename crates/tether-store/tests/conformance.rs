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
        redis_harness(&run(scenario)).await
    }

    async fn passed(scenario: &str) {
        delete_prefix(&redis_url(), &run(scenario)).await;
    }

    tether_store::conformance_scenarios!(one_test_per_scenario, reopen);
}

/// The Redis named by `TETHER_TEST_REDIS_URL` (scripts/test sets it after
/// making sure Redis answers), else the local default. A missing Redis is a
/// failure with a clear message, never a silent pass.
pub fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// Stores under key prefixes that start with `run`, one per fresh store.
async fn redis_harness(run: &str) -> Harness {
    use tether_store::redis::RedisStore;
    let url = redis_url();
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probe = RedisStore::open(&url, config()).await;
    if let Err(e) = probe {
        panic!(
            "Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis) or set TETHER_TEST_REDIS_URL."
        );
    }
    let last_prefix = Arc::new(std::sync::Mutex::new(String::new()));
    let (fresh_url, fresh_last, fresh_run) = (url.clone(), last_prefix.clone(), run.to_owned());
    Harness {
        fresh: Box::new(move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let url = fresh_url.clone();
            let prefix = format!("{fresh_run}{n}:");
            *fresh_last.lock().unwrap() = prefix.clone();
            Box::pin(async move {
                let config = StoreConfig { redis_prefix: prefix, ..config() };
                Arc::new(RedisStore::open(&url, config).await.unwrap()) as Arc<dyn Store>
            })
        }),
        // A new connection (a new process) on the same keys.
        reopen: Some(Box::new(move |store: Arc<dyn Store>| {
            let url = url.clone();
            let prefix = last_prefix.lock().unwrap().clone();
            Box::pin(async move {
                drop(store);
                let config = StoreConfig { redis_prefix: prefix, ..config() };
                Arc::new(RedisStore::open(&url, config).await.unwrap()) as Arc<dyn Store>
            })
        })),
    }
}

/// Removes every key a test run created.
pub async fn delete_prefix(url: &str, prefix: &str) {
    let client = ::redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await.unwrap();
    for chunk in keys.chunks(500) {
        let _: i64 = ::redis::cmd("DEL").arg(chunk).query_async(&mut conn).await.unwrap();
    }
}
