//! Redis backend, for several replicas sharing one store: a single Redis
//! server (`redis://`, `rediss://`) or a Redis Cluster (`redis+cluster://`,
//! `conn`).
//!
//! Every multi-key step on one session is one Lua script (`scripts`), so
//! it is atomic on the server and no lock is ever held across a network
//! round trip. Every key of a session carries the session's hash tag
//! (`{id}`, [`conn::hash_tag`]), so each script touches one cluster slot;
//! the indexes over all sessions are keys of their own, updated after the
//! session's script (an index entry is a hint: the reaper checks the
//! session's own hash before it drops anything). Session keys expire with
//! their session (native TTLs); the reaper removes index entries.
//!
//! This module opens the store (the connection, the announcement listener,
//! the server's persistence checked, the key layout checked) and wires the
//! parts together; each part is a module of its own: `layout` (the keys
//! under the prefix, their table, and the layout marker checked at open),
//! `scripts` (the Lua scripts), `store` (the [`Store`](crate::Store) on all
//! of it), `events` (an event log as a Redis Stream or stored whole),
//! `announce` (appends announced over pub/sub and the listener of those
//! announcements), `persistence` (what the server can lose, and whether
//! `--durability strict` can run on it), `batch` (group commit) and `conn`
//! (one connection type for a server and a cluster).

mod announce;
mod batch;
mod conn;
mod events;
mod layout;
mod persistence;
mod scripts;
mod store;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::broadcast;

pub use batch::{BatchedOp, Call};
pub use conn::{RedisConn, cluster_nodes, hash_tag, is_cluster_url};

use announce::Listener;
use persistence::Persistence;
use scripts::Scripts;

use crate::{RemoteAppend, StoreConfig, StoreError, StoreResult};

/// Announcements buffered for live delivery; a slow consumer falls back to reading the store.
const REMOTE_BUFFER: usize = 1024;

/// Redis's client timeouts: a connection that does not open within this...
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// ...and an answer that does not come within this are failures (503s).
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// `redis://user:secret@host` → `redis://user:***@host` for logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => format!("{}***{}", &url[..s + 3], &url[at..]),
            }
        }
        _ => url.to_owned(),
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    crate::observe::error();
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() || e.is_cluster_error() {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Backend(format!("redis: {e}"))
    }
}

/// The [`Store`](crate::Store) on Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConn,
    prefix: Arc<str>,
    url: Arc<str>,
    cap: u64,
    /// Milliseconds a stream stored whole is kept (`StoreConfig::finished_stream_ttl`).
    finished_ttl_ms: u64,
    scripts: Arc<Scripts>,
    /// Appends, in batches on a single server (`redis/scripts/append.lua`).
    append: BatchedOp,
    /// Sessions' stamps (`HMGET`), pipelined together on a single server.
    stamps: BatchedOp,
    remote: broadcast::Sender<RemoteAppend>,
    /// What a crash, a power loss and a failover can lose, from the
    /// server's persistence settings as read at open.
    durability: String,
    /// The listener (a task on a single server, a subscribed connection on a
    /// cluster) stops when the last clone of the store is gone.
    _alive: Arc<Listener>,
}

/// How long a write waits for its replicas under `--redis-replicas`.
const REPLICA_WAIT_MS: u64 = 2_000;

impl RedisStore {
    /// Connects (failing fast with a readable error if Redis does not answer)
    /// and starts the live-announcement listener, which reconnects by itself.
    pub async fn open(url: &str, config: StoreConfig) -> StoreResult<Self> {
        let prefix: Arc<str> = config.redis_prefix.clone().into();
        let (remote, _) = broadcast::channel(REMOTE_BUFFER);
        let cap = config.max_events_per_stream.max(1);
        let finished_ttl_ms = (config.finished_stream_ttl.as_millis() as u64).max(1);
        let answered_within = |what: &str| format!("redis at {} did not answer within 5s{what}", redacted(url));
        let replicas = match (config.redis_replicas, config.strict_durability) {
            (0, _) => None,
            (_, false) => {
                return Err(StoreError::Config(
                    "--redis-replicas waits for replicas under --durability strict only; add --durability strict, or drop it"
                        .into(),
                ));
            }
            (count, true) => Some(conn::Replicas { count, timeout_ms: REPLICA_WAIT_MS }),
        };
        if is_cluster_url(url) {
            if prefix.contains(['{', '}']) {
                return Err(StoreError::Config(format!(
                    "the Redis key prefix `{prefix}` holds `{{` or `}}`, which would break the cluster's hash tags; choose another --store-prefix"
                )));
            }
            let nodes = cluster_nodes(url)?;
            let builder = |b: redis::cluster::ClusterClientBuilder| {
                b.connection_timeout(CONNECT_TIMEOUT).response_timeout(RESPONSE_TIMEOUT).retries(2).max_retry_wait(1000)
            };
            let client = builder(redis::cluster::ClusterClientBuilder::new(nodes.clone()))
                .build()
                .map_err(|e| StoreError::Config(format!("bad Redis Cluster URL {}: {e}", redacted(url))))?;
            let conn = tokio::time::timeout(Duration::from_secs(5), client.get_async_connection())
                .await
                .map_err(|_| StoreError::Unavailable(answered_within("")))?
                .map_err(|e| StoreError::Unavailable(format!("cannot connect to the Redis Cluster at {}: {e}", redacted(url))))?;
            let subscriber = builder(redis::cluster::ClusterClientBuilder::new(nodes));
            let listener = Arc::new(announce::subscribe_sharded(subscriber, url, &prefix, remote.clone()).await?);
            return Self::ready(
                url,
                prefix,
                (cap, finished_ttl_ms, config.strict_durability),
                RedisConn::Cluster(conn, replicas),
                remote,
                listener,
            )
            .await;
        }
        let client = redis::Client::open(url).map_err(|e| StoreError::Config(format!("bad redis URL {}: {e}", redacted(url))))?;
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn =
            tokio::time::timeout(Duration::from_secs(5), ConnectionManager::new_with_config(client.clone(), manager_config))
                .await
                .map_err(|_| StoreError::Unavailable(answered_within("")))?
                .map_err(|e| StoreError::Unavailable(format!("cannot connect to redis at {}: {e}", redacted(url))))?;
        let alive = Arc::new(Listener::Task);
        tokio::spawn(announce::listen(client, format!("{prefix}live"), remote.clone(), Arc::downgrade(&alive)));
        Self::ready(
            url,
            prefix,
            (cap, finished_ttl_ms, config.strict_durability),
            RedisConn::single(conn, replicas),
            remote,
            alive,
        )
        .await
    }

    /// The store on a connection, once the server's persistence and the key
    /// layout under the prefix are checked.
    async fn ready(
        url: &str,
        prefix: Arc<str>,
        (cap, finished_ttl_ms, strict): (u64, u64, bool),
        conn: RedisConn,
        remote: broadcast::Sender<RemoteAppend>,
        alive: Arc<Listener>,
    ) -> StoreResult<Self> {
        let persistence = Persistence::read(&mut conn.clone()).await;
        let durability = persistence.what_can_be_lost();
        if strict && let Err(change) = persistence.strict_enough() {
            return Err(StoreError::Config(format!(
                "--durability strict on Redis needs every acknowledged write on disk before it is acknowledged, and the server at {} {change}; or run with --durability normal",
                redacted(url)
            )));
        }
        tracing::info!(store = %redacted(url), %durability, "redis persistence");
        let channel = if conn.is_cluster() { String::new() } else { format!("{prefix}live") };
        let append = BatchedOp::script(conn.clone(), &scripts::append(), &channel);
        let stamps = BatchedOp::commands(conn.clone());
        let store = Self {
            durability,
            append,
            stamps,
            conn,
            url: redacted(url).into(),
            prefix,
            cap,
            finished_ttl_ms,
            scripts: Arc::new(Scripts::new()),
            remote,
            _alive: alive,
        };
        store.check_layout().await?;
        Ok(store)
    }

    /// A connection for other repositories (the notebook) under the same prefix.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The prefix of every key this store writes (`--store-prefix`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(super::redacted("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
        assert_eq!(super::redacted("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(super::redacted("rediss://:pw@h"), "rediss://:***@h");
    }
}
