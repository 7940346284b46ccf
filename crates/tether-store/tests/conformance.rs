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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_backend_conforms() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fresh_dir = dir.clone();
    let harness = Harness {
        fresh: Box::new(move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let path = fresh_dir.path().join(format!("db{n}.sqlite"));
            Box::pin(async move { Arc::new(SqliteStore::open(&path, config()).await.unwrap()) as Arc<dyn Store> })
        }),
        reopen: Some(Box::new(move |store: Arc<dyn Store>| {
            let path = store.describe().trim_start_matches("sqlite:").to_owned();
            Box::pin(async move {
                drop(store);
                // The writer thread lets go of the file lock when its last handle is gone.
                for _ in 0..100 {
                    match SqliteStore::open(std::path::Path::new(&path), config()).await {
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
