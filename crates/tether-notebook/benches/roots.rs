//! Root lookups at scale: `latest_for_root` (what `load_context` does) and
//! `list_sessions` (filtered by root) with 10,000 notebook sessions across
//! 100 roots, on SQLite and in memory. Prints p50/p99 per operation.
//!
//! Run: `cargo bench -p tether-notebook --bench roots`

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use tether_notebook::{MemoryNotebook, NotebookRepo, NotebookSession, SessionFilter, SqliteNotebook};
use tether_store::StoreConfig;
use tether_store::sqlite::SqliteStore;

const SESSIONS: usize = 10_000;
const ROOTS: usize = 100;
const PRINCIPALS: usize = 4;
const LOOKUPS: usize = 2_000;

fn root(i: usize) -> String {
    format!("file:///home/dev/project-{}", i % ROOTS)
}

async fn fill(repo: &Arc<dyn NotebookRepo>) {
    for chunk in (0..SESSIONS).collect::<Vec<_>>().chunks(500) {
        join_all(chunk.iter().map(|&i| {
            let repo = repo.clone();
            async move {
                let mut s =
                    NotebookSession::new(&format!("p{}", i % PRINCIPALS), None, vec![format!("t{}", i % 7)], Some(root(i)));
                s.updated_at_ms += i as i64;
                repo.create_session(&s).await.expect("insert");
            }
        }))
        .await;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure<F, Fut>(name: &str, backend: &str, mut op: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut micros = Vec::with_capacity(LOOKUPS);
    for i in 0..LOOKUPS {
        let t = Instant::now();
        op(i).await;
        micros.push(t.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(|a, b| a.total_cmp(b));
    println!("| {backend} | {name} | {LOOKUPS} | {:.1} | {:.1} |", percentile(&micros, 0.5), percentile(&micros, 0.99));
}

async fn run(backend: &str, repo: Arc<dyn NotebookRepo>) {
    let t = Instant::now();
    fill(&repo).await;
    eprintln!("{backend}: inserted {SESSIONS} sessions in {:?}", t.elapsed());
    measure("latest_for_root (load_context)", backend, |i| {
        let repo = repo.clone();
        async move {
            let j = i * 7 % SESSIONS;
            let found = repo.latest_for_root(&format!("p{}", j % PRINCIPALS), &root(j)).await.expect("lookup");
            assert!(found.is_some());
        }
    })
    .await;
    measure("list_sessions(root, limit 20)", backend, |i| {
        let repo = repo.clone();
        async move {
            let j = i * 13 % SESSIONS;
            let filter = SessionFilter { root: Some(root(j)), tag: None, limit: 20 };
            let list = repo.list_sessions(&format!("p{}", j % PRINCIPALS), &filter).await.expect("list");
            assert!(!list.is_empty());
        }
    })
    .await;
    measure("list_sessions(all, limit 20)", backend, |i| {
        let repo = repo.clone();
        async move {
            let filter = SessionFilter { root: None, tag: None, limit: 20 };
            let list = repo.list_sessions(&format!("p{}", i % PRINCIPALS), &filter).await.expect("list");
            assert_eq!(list.len(), 20);
        }
    })
    .await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        println!("{SESSIONS} sessions, {ROOTS} roots, {PRINCIPALS} principals; latencies in microseconds\n");
        println!("| backend | operation | n | p50_us | p99_us |");
        println!("|---|---|---|---|---|");
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("bench.db"), StoreConfig::default()).await.expect("open");
        let sqlite: Arc<dyn NotebookRepo> = Arc::new(SqliteNotebook::new(store.db().clone()).await.expect("schema"));
        run("sqlite", sqlite).await;
        run("memory", Arc::new(MemoryNotebook::new())).await;
    });
}
