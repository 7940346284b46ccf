//! Choosing and opening a backend from a `--store` value.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{Store, StoreError, StoreResult, memory::MemoryStore, sqlite::SqliteStore};

/// Knobs every backend honours.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Oldest events of a stream are trimmed beyond this many.
    pub max_events_per_stream: u64,
    /// Key prefix of the Redis backend (`--store-prefix`).
    pub redis_prefix: String,
    /// `true`: fsync on every commit (`--durability strict`). `false`: survive
    /// a process crash (WAL written on commit), not necessarily a power loss.
    pub strict_durability: bool,
    /// How long a finished request stream is kept for replay where the
    /// backend expires it by itself (Redis): the session TTL, as the
    /// server's reaper keeps them on SQLite.
    pub finished_stream_ttl: std::time::Duration,
    /// Redis under `strict`: replicas each write must reach (`WAIT`)
    /// before it is acknowledged (`--redis-replicas`).
    pub redis_replicas: u32,
    /// SQLite: how long opening waits for another process to let go of the
    /// store's lock before refusing with [`StoreError::InUse`]. A server
    /// restarted right after `kill -9` of the last one finds the lock still
    /// held for a moment, by a process that is exiting.
    pub lock_wait: std::time::Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            max_events_per_stream: 100_000,
            redis_prefix: "tether:".into(),
            strict_durability: false,
            redis_replicas: 0,
            finished_stream_ttl: std::time::Duration::from_secs(30 * 60),
            lock_wait: std::time::Duration::from_secs(5),
        }
    }
}

/// A parsed `--store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory`: nothing outlives the process.
    Memory,
    /// `sqlite:PATH`: the file at PATH (created, with its folder, 0700 and 0600).
    Sqlite(PathBuf),
    /// `redis://HOST:PORT/DB` or `rediss://…` (TLS); a Redis Cluster as
    /// `redis+cluster://HOST:PORT,HOST:PORT/` (or `rediss+cluster://`).
    Redis(String),
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(s: &str) -> StoreResult<Self> {
        if s == "memory" {
            return Ok(StoreUrl::Memory);
        }
        if let Some(path) = s.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreError::Config("`sqlite:` needs a file path, e.g. sqlite:/var/lib/tether/tether.db".into()));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if crate::redis::is_cluster_url(s) {
            crate::redis::cluster_nodes(s)?;
            return Ok(StoreUrl::Redis(s.to_owned()));
        }
        if s.starts_with("redis://") || s.starts_with("rediss://") {
            return Ok(StoreUrl::Redis(s.to_owned()));
        }
        Err(StoreError::Config(format!(
            "unknown store `{s}`: use `memory`, `sqlite:PATH`, `redis://HOST:PORT/DB` or `redis+cluster://HOST:PORT,HOST:PORT/`"
        )))
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory"),
            StoreUrl::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            StoreUrl::Redis(url) => f.write_str(&crate::redis::redacted(url)),
        }
    }
}

/// Opens the backend named by `url`. SQLite files are created with mode 0600
/// in a 0700 directory when they do not exist yet.
pub async fn open_store(url: &StoreUrl, config: StoreConfig) -> StoreResult<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new(config))),
        StoreUrl::Sqlite(path) => Ok(Arc::new(SqliteStore::open(path, config).await?)),
        StoreUrl::Redis(url) => Ok(Arc::new(crate::redis::RedisStore::open(url, config).await?)),
    }
}
