//! Runs the shared store conformance suite against every built-in backend.

use std::sync::Arc;

use tether_store::conformance::{Harness, run_all};
use tether_store::memory::MemoryStore;
use tether_store::sqlite::SqliteStore;
use tether_store::{Store, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig { max_events_per_stream: 100, ..StoreConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_backend_conforms() {
    let harness = Harness {
        fresh: Box::new(|| Box::pin(async { Arc::new(MemoryStore::new(config())) as Arc<dyn Store> })),
        reopen: None,
    };
    run_all(&harness).await;
    // The memory store is one of the backends that drop finished streams by age.
    let store = MemoryStore::new(config());
    store.create_session(&tether_store::conformance::session("s", "p", 60_000)).await.unwrap();
    store.start_stream("s", "r1", vec![(tether_store::EventKind::Final, bytes::Bytes::from_static(b"ok"))]).await.unwrap();
    assert_eq!(store.drop_finished_streams("r", "r2", tether_store::now_ms() + 1, 10).await.unwrap(), 1);
    assert!(store.stream("s", "r1").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_backend_conforms() {
    sqlite_conforms(config()).await;
}

/// `--durability strict`: every commit waits for its fsync, so the writer
/// commits on the blocking pool instead of a runtime worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_backend_conforms_with_strict_durability() {
    sqlite_conforms(StoreConfig { strict_durability: true, ..config() }).await;
}

async fn sqlite_conforms(config: StoreConfig) {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fresh_dir = dir.clone();
    let (fresh_config, reopen_config) = (config.clone(), config);
    let harness = Harness {
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
    };
    run_all(&harness).await;
}

/// The Redis named by `TETHER_TEST_REDIS_URL` (scripts/test sets it after
/// making sure Redis answers), else the local default. A missing Redis is a
/// failure with a clear message, never a silent pass.
pub fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_backend_conforms() {
    use tether_store::redis::RedisStore;
    let url = redis_url();
    let run = format!("tether-test:{}:", std::process::id());
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probe = RedisStore::open(&url, config()).await;
    if let Err(e) = probe {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis) or set TETHER_TEST_REDIS_URL.");
    }
    let last_prefix = Arc::new(std::sync::Mutex::new(String::new()));
    let (fresh_url, fresh_last, fresh_run) = (url.clone(), last_prefix.clone(), run.clone());
    let harness = Harness {
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
    };
    run_all(&harness).await;
    delete_prefix(&redis_url(), &run).await;
}

/// Removes every key a test run created.
pub async fn delete_prefix(url: &str, prefix: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await.unwrap();
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await.unwrap();
    }
}
