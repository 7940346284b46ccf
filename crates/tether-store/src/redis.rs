//! Redis backend, for several replicas sharing one store: a single Redis
//! server (`redis://`, `rediss://`) or a Redis Cluster (`redis+cluster://`,
//! [`conn`]).
//!
//! Every multi-key step on one session is one Lua script (`redis/scripts/`),
//! so it is atomic on the server and no lock is ever held across a network
//! round trip. Every key of a session carries the session's hash tag
//! (`{id}`, [`conn::hash_tag`]), so each script touches one cluster slot;
//! the indexes over all sessions are keys of their own, updated after the
//! session's script (an index entry is a hint: the reaper checks the
//! session's own hash before it drops anything). Layout under the prefix `P`
//! (default `tether:`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P{id}:s` | hash | session: principal, created, expires, revision, state |
//! | `P{id}:ss` | set | the session's open streams (no final event yet) |
//! | `P{id}:e:{stream}` | stream | events, entry ID `0-{seq}` (numbered by Redis, `0-*`), capped with `MAXLEN`; an open stream expires with its session, a finished one about one session TTL after its final event |
//! | `P{id}:c` | hash | cursor per stream |
//! | `Psp:{principal}` / `Psx` | zset | sessions by principal / by expiry |
//! | `P{tag}:kv:{ns}:{key}` | hash | value, revision, expiry (plus a native TTL); `tag` is the key up to its first `/` or `.` (a session's records share its slot, as do an operation's chunks `OP.N`) |
//! | `P{tag}:kvrev` | counter | key/value revisions of that slot, never reused |
//! | channel `Plive` (single server) | pub/sub | `{session}\n{stream}\n{seq}` after every append |
//! | channels `Plive:0` … `Plive:15` (cluster) | sharded pub/sub | the same, on the channel of the session's shard of 16 |
//!
//! | `Playout` | string | the key layout (3); keys of layouts 1 (untagged, before Redis Cluster support) and 2 (per-stream hashes) are converted at open |
//!
//! Session keys expire with their session (native TTLs); the reaper removes
//! index entries.

mod batch;
mod conn;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value as RValue};
use tokio::sync::broadcast;

pub use batch::{BatchedOp, Call};
pub use conn::{RedisConn, cluster_nodes, hash_tag, is_cluster_url};

use crate::{
    EventKind, RemoteAppend, SessionRecord, Store, StoreConfig, StoreError, StoreResult, StoredEvent, StreamSummary,
    VersionedValue, now_ms,
};

/// Announcements buffered for live delivery; a slow consumer falls back to reading the store.
const REMOTE_BUFFER: usize = 1024;

/// Sharded announcement channels on a cluster (`Plive:0` … `Plive:15`):
/// spread over the shards, few enough for every replica to listen to all.
const LIVE_SHARDS: u64 = 16;

/// The key layout this version reads and writes (`P layout`):
/// 2 = every key of a session carries its hash tag;
/// 3 = `ss` lists open streams only, no per-stream hashes (`q`, `f`).
const LAYOUT: i64 = 3;

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

/// The function `drop(b)` the scripts that remove sessions begin with.
const DROP_SESSION: &str = include_str!("redis/scripts/drop_session.lua");
/// The function `records(blob)` the scripts that read a stream stored whole begin with.
const RECORDS: &str = include_str!("redis/scripts/records.lua");

/// One script per multi-key step; each file says at its top what the script
/// does and what its KEYS and ARGV are.
struct Scripts {
    create: Script,
    update: Script,
    touch: Script,
    delete: Script,
    expire: Script,
    streams: Script,
    set_cursor: Script,
    kv_cas: Script,
    migrate_sessions: Script,
    migrate_kv: Script,
    migrate_streams: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_drop = |body: &str| Script::new(&format!("{DROP_SESSION}\n{body}"));
        Self {
            create: with_drop(include_str!("redis/scripts/create_session.lua")),
            update: Script::new(include_str!("redis/scripts/update_session_state.lua")),
            touch: Script::new(include_str!("redis/scripts/touch_session.lua")),
            delete: with_drop(include_str!("redis/scripts/delete_session.lua")),
            expire: with_drop(include_str!("redis/scripts/expire_sessions.lua")),
            streams: Script::new(&format!("{RECORDS}\n{}", include_str!("redis/scripts/streams.lua"))),
            set_cursor: Script::new(include_str!("redis/scripts/set_cursor.lua")),
            kv_cas: Script::new(include_str!("redis/scripts/kv_compare_and_set.lua")),
            migrate_sessions: Script::new(include_str!("redis/scripts/migrate_session.lua")),
            migrate_kv: Script::new(include_str!("redis/scripts/migrate_kv.lua")),
            migrate_streams: Script::new(include_str!("redis/scripts/migrate_streams.lua")),
        }
    }
}

/// The [`Store`] on Redis.
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
    /// Whether this open found (and converted) keys of an earlier layout.
    upgraded: bool,
    /// What a crash, a power loss and a failover can lose, from the
    /// server's persistence settings as read at open.
    durability: String,
    /// The listener (a task on a single server, a subscribed connection on a
    /// cluster) stops when the last clone of the store is gone.
    _alive: Arc<Listener>,
}

/// What keeps announcements coming in while the store lives.
enum Listener {
    /// A task that holds a `Weak` of this and stops when it is gone.
    Task,
    /// The cluster connection whose node connections hold the sharded subscriptions.
    Cluster(#[allow(dead_code)] redis::cluster_async::ClusterConnection),
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
            let announcements = remote.clone();
            let push = move |info: redis::PushInfo| -> Result<(), std::convert::Infallible> {
                if info.kind == redis::PushKind::SMessage
                    && let Some(RValue::BulkString(payload)) = info.data.get(1)
                {
                    for append in parse_announcement(payload) {
                        let _ = announcements.send(append);
                    }
                }
                Ok(())
            };
            let subscriber = builder(redis::cluster::ClusterClientBuilder::new(nodes))
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(push)
                .build()
                .map_err(|e| StoreError::Config(format!("bad Redis Cluster URL {}: {e}", redacted(url))))?;
            let mut listener = tokio::time::timeout(Duration::from_secs(5), subscriber.get_async_connection())
                .await
                .map_err(|_| StoreError::Unavailable(answered_within(" (announcements)")))?
                .map_err(|e| StoreError::Unavailable(format!("cannot connect to the Redis Cluster at {}: {e}", redacted(url))))?;
            let channels: Vec<String> = (0..LIVE_SHARDS).map(|n| format!("{prefix}live:{n}")).collect();
            // One SSUBSCRIBE per channel: each goes to the node of its slot,
            // and the client subscribes again after a reconnect or a move.
            for channel in &channels {
                listener.ssubscribe(channel).await.map_err(unavailable)?;
            }
            let listener = Arc::new(Listener::Cluster(listener));
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
        tokio::spawn(listen(client, format!("{prefix}live"), remote.clone(), Arc::downgrade(&alive)));
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

    /// The store on a connection, its keys brought to this version's layout.
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
        let append =
            BatchedOp::script(conn.clone(), &format!("{RECORDS}\n{}", include_str!("redis/scripts/append.lua")), &channel);
        let stamps = BatchedOp::commands(conn.clone());
        let mut store = Self {
            upgraded: false,
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
        store.upgraded = store.upgrade_layout().await?;
        Ok(store)
    }

    /// Brings keys an earlier version wrote under this prefix (layout 1:
    /// untagged session keys `P s:ID`…, one shared revision counter
    /// `P kvrev`; layout 2: per-stream hashes `q`, `f` and every stream in
    /// `ss`) to this version's layout, once, before serving; then
    /// marks the prefix (`P layout`). Replicas of the old version must be
    /// stopped first: upgrade every replica together. A cluster never held
    /// layout 1. Returns whether it found keys of layout 1.
    async fn upgrade_layout(&self) -> StoreResult<bool> {
        const PAGE: usize = 500;
        let mut conn = self.conn.clone();
        let marker = self.key(&["layout"]);
        let found = conn.get::<_, Option<i64>>(&marker).await.map_err(unavailable)?;
        match found {
            Some(LAYOUT) => return Ok(false),
            Some(newer) if newer > LAYOUT => {
                return Err(StoreError::Config(format!(
                    "the keys under prefix `{}` were written by a newer tether (key layout {newer}; this one reads {LAYOUT}): run the newer version",
                    self.prefix
                )));
            }
            _ => {}
        }
        let (by_expiry, old_counter) = (self.key(&["sx"]), self.key(&["kvrev"]));
        // Layout 1 had no marker.
        let earlier = found.is_none()
            && !self.conn.is_cluster()
            && redis::cmd("EXISTS").arg(&by_expiry).arg(&old_counter).query_async::<i64>(&mut conn).await.map_err(unavailable)?
                > 0;
        if earlier {
            tracing::info!(prefix = %self.prefix, "converting the Redis keys of an earlier tether to the hash-tagged layout");
            let mut moved_sessions = 0usize;
            let mut pages = std::pin::pin!(self.session_pages());
            while let Some(ids) = pages.try_next().await? {
                let mut page = self.scripts.migrate_sessions.prepare_invoke();
                page.arg(&*self.prefix);
                for id in &ids {
                    page.arg(id).arg(self.base(id));
                }
                let _: i64 = page.invoke_async(&mut conn).await.map_err(unavailable)?;
                moved_sessions += ids.len();
            }
            let mut moved_records = 0usize;
            let pattern = format!("{}kv:*", self.prefix);
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                let mut page = self.scripts.migrate_kv.prepare_invoke();
                page.arg(&old_counter);
                let mut any = false;
                for old in &keys {
                    // `P kv:NS:KEY`: namespaces hold no `:`.
                    let Some((namespace, key)) = old[pattern.len() - 1..].split_once(':') else { continue };
                    let (record, counter) = self.kv_keys(namespace, key);
                    page.arg(old).arg(record).arg(counter);
                    any = true;
                }
                if any {
                    let n: i64 = page.invoke_async(&mut conn).await.map_err(unavailable)?;
                    moved_records += n as usize;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            tracing::info!(sessions = moved_sessions, records = moved_records, "Redis keys converted");
        }
        self.open_streams_only().await?;
        let _: () = conn.set(&marker, LAYOUT).await.map_err(unavailable)?;
        Ok(earlier)
    }

    /// Layout 2 → 3 (`migrate_streams.lua`) for every session in the
    /// by-expiry index: a page per script on a single server, a session per
    /// script on a cluster (its slot). Nothing to do on a new prefix.
    async fn open_streams_only(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let mut converted = 0i64;
        let mut pages = std::pin::pin!(self.session_pages());
        while let Some(ids) = pages.try_next().await? {
            if self.conn.is_cluster() {
                for id in &ids {
                    let base = self.base(id);
                    let mut one = self.scripts.migrate_streams.key(format!("{base}s"));
                    converted += one.arg(base).invoke_async::<i64>(&mut conn).await.map_err(unavailable)?;
                }
            } else {
                let mut page = self.scripts.migrate_streams.prepare_invoke();
                for id in &ids {
                    page.arg(self.base(id));
                }
                converted += page.invoke_async::<i64>(&mut conn).await.map_err(unavailable)?;
            }
        }
        if converted > 0 {
            tracing::info!(sessions = converted, "Redis stream keys converted to layout 3 (open streams only)");
        }
        Ok(())
    }

    /// The ids of the by-expiry index (`sx`), a page at a time, for the
    /// conversions of earlier layouts.
    fn session_pages(&self) -> impl futures::Stream<Item = StoreResult<Vec<String>>> + Send + '_ {
        const LAYOUT_PAGE: isize = 500;
        let by_expiry = self.key(&["sx"]);
        futures::stream::try_unfold((self.conn.clone(), 0isize), move |(mut conn, start)| {
            let by_expiry = by_expiry.clone();
            async move {
                let ids: Vec<String> = conn.zrange(&by_expiry, start, start + LAYOUT_PAGE - 1).await.map_err(unavailable)?;
                Ok((!ids.is_empty()).then(|| (ids, (conn, start + LAYOUT_PAGE))))
            }
        })
    }

    /// Whether opening found keys an earlier version wrote under this prefix
    /// (and converted the store's own): applications sharing the prefix
    /// convert theirs then (the notebook's `upgrade_layout`).
    pub fn upgraded_from_earlier_layout(&self) -> bool {
        self.upgraded
    }

    /// A connection for other repositories (the notebook) under the same prefix.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.to_string();
        for p in parts {
            k.push_str(p);
        }
        k
    }

    /// `P{id}:`, the beginning of every key of session `id` (one cluster slot).
    fn base(&self, id: &str) -> String {
        format!("{}{{{}}}:", self.prefix, hash_tag(id))
    }

    /// A key/value record and its slot's revision counter.
    fn kv_keys(&self, namespace: &str, key: &str) -> (String, String) {
        let tag = hash_tag(key.split(['/', '.']).next().unwrap_or(key));
        let base = format!("{}{{{tag}}}:", self.prefix);
        (format!("{base}kv:{namespace}:{key}"), format!("{base}kvrev"))
    }

    /// The by-principal and by-expiry entries of a session: what its
    /// script cannot write, since they live in other slots.
    async fn index(&self, id: &str, principal: &str, expires_at_ms: i64) -> StoreResult<()> {
        let (mut by_principal, mut by_expiry) = (self.conn.clone(), self.conn.clone());
        let (_, _): (i64, i64) = futures::try_join!(
            by_principal.zadd(self.key(&["sp:", principal]), id, expires_at_ms),
            by_expiry.zadd(self.key(&["sx"]), id, expires_at_ms),
        )
        .map_err(unavailable)?;
        Ok(())
    }

    async fn unindex(&self, id: &str, principal: Option<&str>) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: i64 = conn.zrem(self.key(&["sx"]), id).await.map_err(unavailable)?;
        if let Some(principal) = principal {
            let _: i64 = conn.zrem(self.key(&["sp:", principal]), id).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// On a cluster, where a script cannot publish to a channel outside its
    /// slot: announces an append on the sharded channel of its session.
    async fn announce_sharded(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let shard = session.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
            % LIVE_SHARDS;
        let _: i64 = redis::cmd("SPUBLISH")
            .arg(format!("{}live:{shard}", self.prefix))
            .arg(format!("{session}\n{stream}\n{seq}"))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

/// `{session}\n{stream}\n{seq}`, once per append: a batch of appends
/// publishes its lines as one message, [`Store::announce`] one append. A
/// message that does not parse whole is dropped whole.
fn parse_announcement(payload: &[u8]) -> Vec<RemoteAppend> {
    let Ok(text) = std::str::from_utf8(payload) else { return Vec::new() };
    let mut lines = text.split('\n');
    let mut appends = Vec::new();
    while let Some(session) = lines.next() {
        let (Some(stream), Some(Ok(seq))) = (lines.next(), lines.next().map(str::parse)) else { return Vec::new() };
        appends.push(RemoteAppend { session: session.into(), stream: stream.into(), seq });
    }
    appends
}

/// Forwards `Plive` announcements into `tx` until the store is dropped;
/// reconnects with a capped backoff when Redis goes away.
async fn listen(client: redis::Client, channel: String, tx: broadcast::Sender<RemoteAppend>, alive: std::sync::Weak<Listener>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if alive.upgrade().is_none() {
            return;
        }
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                if pubsub.subscribe(&channel).await.is_ok() {
                    backoff = Duration::from_millis(100);
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if alive.upgrade().is_none() {
                            return;
                        }
                        for append in parse_announcement(msg.get_payload_bytes()) {
                            let _ = tx.send(append);
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "redis pub/sub unavailable; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One `XRANGE` entry, `[ID, [k, KIND, p, PAYLOAD]]` (the fields as a map in
/// RESP3), as a stored event; `None` if it is not one.
fn stored_event(entry: RValue) -> Option<StoredEvent> {
    let RValue::Array(parts) = entry else { return None };
    let mut parts = parts.into_iter();
    let (RValue::BulkString(id), Some(fields)) = (parts.next()?, parts.next()) else { return None };
    let seq = std::str::from_utf8(id.strip_prefix(b"0-")?).ok()?.parse().ok()?;
    let pairs: Vec<(RValue, RValue)> = match fields {
        RValue::Array(flat) => {
            let mut flat = flat.into_iter();
            std::iter::from_fn(|| Some((flat.next()?, flat.next()?))).collect()
        }
        RValue::Map(pairs) => pairs,
        _ => return None,
    };
    let (mut kind, mut payload) = (None, None);
    for (name, value) in pairs {
        match (name, value) {
            (RValue::BulkString(name), RValue::BulkString(k)) if name == b"k" => {
                kind = std::str::from_utf8(&k).ok()?.parse::<u8>().ok().and_then(EventKind::from_u8);
            }
            (RValue::BulkString(name), RValue::BulkString(p)) if name == b"p" => payload = Some(Bytes::from(p)),
            _ => {}
        }
    }
    Some(StoredEvent { seq, kind: kind?, payload: payload? })
}

/// A stream stored whole (`records.lua`): per event its kind (one digit),
/// its payload's length in decimal, `:` and the payload.
fn encode_whole(events: &[(EventKind, Bytes)]) -> Bytes {
    let mut blob = Vec::with_capacity(events.iter().map(|(_, p)| p.len() + 12).sum());
    for (kind, payload) in events {
        blob.extend_from_slice(format!("{}{}:", *kind as u8, payload.len()).as_bytes());
        blob.extend_from_slice(payload);
    }
    Bytes::from(blob)
}

/// The events of a stream stored whole, numbered from 1; `None` if the
/// blob is not one [`encode_whole`] wrote.
fn decode_whole(blob: Bytes) -> Option<Vec<StoredEvent>> {
    let mut events = Vec::new();
    let mut pos = 0;
    while pos < blob.len() {
        let kind = EventKind::from_u8(blob[pos].checked_sub(b'0')?)?;
        let colon = pos + 1 + blob[pos + 1..].iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&blob[pos + 1..colon]).ok()?.parse().ok()?;
        let end = colon.checked_add(1 + len).filter(|&end| end <= blob.len())?;
        events.push(StoredEvent { seq: events.len() as u64 + 1, kind, payload: blob.slice(colon + 1..end) });
        pos = end;
    }
    Some(events)
}

impl RedisStore {
    async fn read_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(format!("{}s", self.base(id)))
            .arg(&["principal", "created", "expires", "revision", "state"][..])
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let [Some(principal), Some(created), Some(expires), Some(revision), Some(state)] =
            <[Option<Vec<u8>>; 5]>::try_from(values).map_err(|_| StoreError::Corrupt(format!("session {id}")))?
        else {
            return Ok(None);
        };
        let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| StoreError::Corrupt(format!("session {id}")));
        let num = |b: Vec<u8>| text(b)?.parse::<i64>().map_err(|_| StoreError::Corrupt(format!("session {id}")));
        Ok(Some(SessionRecord {
            id: id.to_owned(),
            principal: text(principal)?,
            created_at_ms: num(created)?,
            expires_at_ms: num(expires)?,
            revision: num(revision)? as u64,
            state: serde_json::from_slice(&state).map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?,
        }))
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn create_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let state = serde_json::to_string(&s.state).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = self.conn.clone();
        let base = self.base(&s.id);
        let created: i64 = self
            .scripts
            .create
            .key(format!("{base}s"))
            .arg(&base)
            .arg(&s.principal)
            .arg(s.created_at_ms)
            .arg(s.expires_at_ms)
            .arg(s.revision)
            .arg(state)
            .arg(now_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if created != 1 {
            return Err(StoreError::Conflict(format!("session {}", s.id)));
        }
        self.index(&s.id, &s.principal, s.expires_at_ms).await
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        Ok(self.read_session(id).await?.filter(|s| s.expires_at_ms > now_ms))
    }

    async fn session_stamp(&self, id: &str, now_ms: i64) -> StoreResult<Option<crate::SessionStamp>> {
        let read = Call::new().arg("HMGET").arg(format!("{}s", self.base(id))).arg("revision").arg("expires");
        let (revision, expires): (Option<u64>, Option<i64>) = redis::from_redis_value(self.stamps.call(read).await?)
            .map_err(|e| StoreError::Corrupt(format!("session {id}: {e}")))?;
        Ok(match (revision, expires) {
            (Some(revision), Some(expires_at_ms)) if expires_at_ms > now_ms => {
                Some(crate::SessionStamp { revision, expires_at_ms })
            }
            _ => None,
        })
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = self.conn.clone();
        let r: i64 = self
            .scripts
            .update
            .key(format!("{}s", self.base(id)))
            .arg(expected)
            .arg(state)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let base = self.base(id);
        let touched: Option<(String, i64)> = self
            .scripts
            .touch
            .key(format!("{base}s"))
            .arg(&base)
            .arg(expires_at_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some((principal, expires)) = touched else { return Ok(false) };
        self.index(id, &principal, expires).await?;
        Ok(true)
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let base = self.base(id);
        let principal: Option<String> =
            self.scripts.delete.key(format!("{base}s")).arg(&base).invoke_async(&mut conn).await.map_err(unavailable)?;
        self.unindex(id, principal.as_deref()).await?;
        Ok(principal.is_some())
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let now = now_ms();
        let ids = self.live_ids(&self.key(&["sp:", principal]), now, 0, limit).await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self.get_session(&id, now).await? {
                out.push(s);
            }
        }
        Ok(out)
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        conn.zcount(self.key(&["sp:", principal]), format!("({now_ms}"), "+inf").await.map_err(unavailable)
    }

    /// Pages by position in the expiry index (`sx`), most recently active first.
    async fn scan_sessions(&self, cursor: Option<&str>, limit: usize, now_ms: i64) -> StoreResult<crate::SessionPage> {
        let offset: usize = match cursor {
            None => 0,
            Some(c) => c.parse().map_err(|_| StoreError::Backend(format!("`{c}` is not a page cursor of this store")))?,
        };
        let ids = self.live_ids(&self.key(&["sx"]), now_ms, offset, limit.saturating_add(1)).await?;
        let more = ids.len() > limit;
        let mut sessions = Vec::with_capacity(ids.len().min(limit));
        for id in ids.iter().take(limit) {
            if let Some(s) = self.get_session(id, now_ms).await? {
                sessions.push(s);
            }
        }
        let next = more.then(|| (offset + limit).to_string());
        Ok(crate::SessionPage { sessions, next })
    }

    async fn count_all_sessions(&self, now_ms: i64) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        conn.zcount(self.key(&["sx"]), format!("({now_ms}"), "+inf").await.map_err(unavailable)
    }

    /// Candidates from the by-expiry index, each dropped by a script on its
    /// own slot that checks the session's hash first: one renewed meanwhile
    /// is kept (and its index entry left for its new expiry).
    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        let candidates: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.key(&["sx"]))
            .arg("-inf")
            .arg(now_ms)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut dropped = Vec::with_capacity(candidates.len());
        for id in candidates {
            let base = self.base(&id);
            let (outcome, detail): (i64, String) = self
                .scripts
                .expire
                .key(format!("{base}s"))
                .arg(&base)
                .arg(now_ms)
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            match outcome {
                1 => {
                    self.unindex(&id, Some(&detail)).await?;
                    dropped.push(id);
                }
                // Gone already (its keys expired natively): only the index entry is left.
                0 => {
                    let _: i64 = conn.zrem(self.key(&["sx"]), &id).await.map_err(unavailable)?;
                    dropped.push(id);
                }
                // Renewed after the index was read: the renewal re-indexes it.
                _ => {}
            }
        }
        Ok(dropped)
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        self.append_batch(session, stream, vec![(kind, payload)]).await
    }

    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, false).await
    }

    /// A stream that starts with its final event is stored whole (`append.lua`).
    async fn start_stream(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, true).await
    }

    /// One round trip: the Redis Stream's entries after `after` and the
    /// stream stored whole, whichever exists.
    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        // Read as raw replies and taken apart by value: a replay reads
        // thousands of entries, and each payload is moved, not copied.
        // Both forms in one round trip, the Redis Stream first: a stream
        // moved from the whole form in between reads as empty (its
        // announcement wakes the reader again), never as both forms.
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE")
            .arg(format!("{base}e:{stream}"))
            .arg(format!("(0-{after}"))
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .cmd("GET")
            .arg(format!("{base}d:{stream}"));
        if self.conn.waits_for_replicas() {
            // A read sees writes applied but not yet on a replica (their
            // WAIT may still fail, and a failover lose them). A small write
            // after it on the same node, whose WAIT the connection makes,
            // shows nothing a failover can take back.
            pipe.cmd("SET").arg(format!("{base}barrier")).arg(1).arg("PX").arg(60_000).ignore();
        }
        let (entries, whole): (RValue, RValue) = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        let corrupt = || StoreError::Corrupt(format!("an event of stream {stream} of session {session}"));
        let events: Vec<StoredEvent> = match (entries, whole) {
            (RValue::Array(entries), RValue::Nil) => {
                entries.into_iter().map(|entry| stored_event(entry).ok_or_else(corrupt)).collect::<StoreResult<_>>()?
            }
            (RValue::Array(entries), RValue::BulkString(blob)) if entries.is_empty() => {
                let events = decode_whole(Bytes::from(blob)).ok_or_else(corrupt)?;
                events.into_iter().filter(|e| e.seq > after).take(limit).collect()
            }
            _ => return Err(corrupt()),
        };
        Ok(events)
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let mut out: Vec<StreamSummary> = self.stream_summaries(session, "").await?.into_iter().filter(|s| !s.finished).collect();
        out.sort_by(|a, b| a.stream.cmp(&b.stream));
        Ok(out)
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        if stream.is_empty() {
            return Ok(None);
        }
        Ok(self.stream_summaries(session, stream).await?.into_iter().next())
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        let _: i64 = self
            .scripts
            .set_cursor
            .key(format!("{base}s"))
            .key(format!("{base}c"))
            .arg(stream)
            .arg(seq)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = conn.hget(format!("{}c", self.base(session)), stream).await.map_err(unavailable)?;
        Ok(v.unwrap_or(0))
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let mut conn = self.conn.clone();
        let (record, _) = self.kv_keys(namespace, key);
        let values: Vec<Option<Vec<u8>>> =
            redis::cmd("HMGET").arg(record).arg(&["v", "r", "x"][..]).query_async(&mut conn).await.map_err(unavailable)?;
        let mut values = values.into_iter();
        let (Some(Some(value)), Some(Some(revision))) = (values.next(), values.next()) else { return Ok(None) };
        let expires: Option<i64> = values
            .next()
            .flatten()
            .and_then(|x| String::from_utf8(x).ok())
            .filter(|x| !x.is_empty())
            .and_then(|x| x.parse().ok());
        if expires.is_some_and(|t| t <= now_ms) {
            return Ok(None);
        }
        let revision = String::from_utf8(revision)
            .ok()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| StoreError::Corrupt(format!("kv {namespace}/{key}")))?;
        Ok(Some(VersionedValue { value: Bytes::from(value), revision, expires_at_ms: expires }))
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let mut conn = self.conn.clone();
        let (record, counter) = self.kv_keys(namespace, key);
        let r: i64 = self
            .scripts
            .kv_cas
            .key(record)
            .key(counter)
            .arg(expected.map(|e| e.to_string()).unwrap_or_default())
            .arg(value.as_ref())
            .arg(expires_at_ms.map(|e| e.to_string()).unwrap_or_default())
            .arg(now_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok((r >= 0).then_some(r as u64))
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = conn.del(self.kv_keys(namespace, key).0).await.map_err(unavailable)?;
        Ok(n > 0)
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.map_err(unavailable)?;
        Ok(())
    }

    async fn flush(&self) -> StoreResult<()> {
        Ok(())
    }

    fn durability(&self) -> Option<String> {
        Some(self.durability.clone())
    }

    fn describe(&self) -> String {
        let kind = if self.conn.is_cluster() { "cluster " } else { "" };
        format!("{kind}{} (prefix {})", self.url, self.prefix)
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn announce(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        if self.conn.is_cluster() {
            return self.announce_sharded(session, stream, seq).await;
        }
        let mut conn = self.conn.clone();
        let _: i64 = conn.publish(self.key(&["live"]), format!("{session}\n{stream}\n{seq}")).await.map_err(unavailable)?;
        Ok(())
    }

    fn remote_appends(&self) -> Option<broadcast::Receiver<RemoteAppend>> {
        Some(self.remote.subscribe())
    }
}

impl RedisStore {
    /// One call of the append operation (`append.lua`), batched with other
    /// appends on a single server (on a cluster a second round trip, the
    /// sharded announcement). `fresh`: the caller has just named the stream.
    async fn append_events(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>, fresh: bool) -> StoreResult<u64> {
        let Some((last_kind, _)) = events.last() else {
            return Err(StoreError::Backend("append_batch needs at least one event".into()));
        };
        let base = self.base(session);
        let count = events.len() as u64;
        let mut call = Call::new().key(format!("{base}s")).arg(base).arg(session.to_owned()).arg(stream.to_owned()).num(self.cap);
        call = if fresh && *last_kind == EventKind::Final {
            call.arg("done").num(count).arg(encode_whole(&events)).num(self.finished_ttl_ms)
        } else {
            events.into_iter().fold(call.arg("add"), |call, (kind, payload)| call.num(kind as u8).arg(payload))
        };
        let first = match self.append.call(call).await? {
            RValue::Int(first) if first > 0 => first as u64,
            other => return Err(StoreError::Corrupt(format!("an append to stream {stream} answered {other:?}"))),
        };
        if self.conn.is_cluster()
            && let Err(e) = self.announce_sharded(session, stream, first + count - 1).await
        {
            // Stored is what counts; other replicas' pumps poll the store too.
            tracing::debug!(%session, error = %e, "could not announce an append");
        }
        Ok(first)
    }

    /// IDs in an index (by expiry) of sessions alive at `now_ms`, latest
    /// expiry first: `limit` of them from position `offset`.
    async fn live_ids(&self, index: &str, now_ms: i64, offset: usize, limit: usize) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        redis::cmd("ZRANGE")
            .arg(index)
            .arg("+inf")
            .arg(format!("({now_ms}"))
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(offset)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)
    }

    /// The open streams of a session (`one` empty) or one stream, as the `streams` script reports them.
    async fn stream_summaries(&self, session: &str, one: &str) -> StoreResult<Vec<StreamSummary>> {
        let mut conn = self.conn.clone();
        let base = self.base(session);
        let rows: Vec<(String, i64, i64, i64)> = self
            .scripts
            .streams
            .key(format!("{base}ss"))
            .arg(&base)
            .arg(one)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(stream, first, last, fin)| StreamSummary {
                stream,
                first_seq: first as u64,
                last_seq: last as u64,
                finished: fin == 1,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use redis::Value as V;

    fn bulk(b: &[u8]) -> V {
        V::BulkString(b.to_vec())
    }

    #[test]
    fn an_xrange_entry_is_an_event_and_anything_else_is_not() {
        let entry = |id: &[u8], fields: V| V::Array(vec![bulk(id), fields]);
        let fields = V::Array(vec![bulk(b"k"), bulk(b"2"), bulk(b"p"), bulk(b"{}")]);
        let event = super::stored_event(entry(b"0-7", fields.clone())).unwrap();
        assert_eq!((event.seq, event.kind, &event.payload[..]), (7, crate::EventKind::Final, &b"{}"[..]));
        let map = V::Map(vec![(bulk(b"p"), bulk(b"x")), (bulk(b"k"), bulk(b"1"))]);
        assert_eq!(super::stored_event(entry(b"0-1", map)).unwrap().payload, &b"x"[..]);
        for bad in [
            entry(b"7", fields.clone()),
            entry(b"0-x", fields.clone()),
            entry(b"0-1", V::Array(vec![bulk(b"k"), bulk(b"9"), bulk(b"p"), bulk(b"")])),
            entry(b"0-1", V::Array(vec![bulk(b"k"), bulk(b"1")])),
            entry(b"0-1", V::Array(vec![bulk(b"k")])),
            V::Array(vec![bulk(b"0-1")]),
            V::Int(3),
        ] {
            assert!(super::stored_event(bad.clone()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn an_announcement_names_one_append_or_a_batch_of_them() {
        let appends = super::parse_announcement(b"s1\nr-1\n3\ns2\n_\n9");
        let seen: Vec<_> = appends.iter().map(|a| (a.session.as_str(), a.stream.as_str(), a.seq)).collect();
        assert_eq!(seen, [("s1", "r-1", 3), ("s2", "_", 9)]);
        assert_eq!(super::parse_announcement(b"s1\nr-1\n3").len(), 1);
        for bad in [&b"s1\nr-1"[..], b"s1\nr-1\nx", b"s1\nr-1\n3\ns2", b"\xff\n_\n1"] {
            assert!(super::parse_announcement(bad).is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn a_stream_stored_whole_reads_back_and_anything_else_is_refused() {
        use crate::EventKind::{Final, Prime};
        let events = vec![(Prime, Bytes::new()), (Final, Bytes::from_static(b"{\"a\":\"1:2\"}"))];
        let blob = super::encode_whole(&events);
        assert_eq!(&blob[..], &b"00:211:{\"a\":\"1:2\"}"[..]);
        let back = super::decode_whole(blob).unwrap();
        assert_eq!(
            back.iter().map(|e| (e.seq, e.kind, e.payload.clone())).collect::<Vec<_>>(),
            [(1, Prime, Bytes::new()), (2, Final, events[1].1.clone())]
        );
        for bad in [&b"2"[..], b"25:abc", b"x1:a", b"9", b"2a:b", b"21:a2"] {
            assert!(super::decode_whole(Bytes::from_static(bad)).is_none(), "{bad:?}");
        }
        assert_eq!(super::decode_whole(Bytes::new()).unwrap().len(), 0);
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(super::redacted("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
        assert_eq!(super::redacted("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(super::redacted("rediss://:pw@h"), "rediss://:***@h");
    }
}

/// A Redis server's persistence settings as read at open (`CONFIG GET`,
/// `INFO replication`); `None` where the server would not say (a managed
/// service that refuses `CONFIG`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Persistence {
    appendonly: Option<String>,
    appendfsync: Option<String>,
    replicas: Option<u64>,
}

impl Persistence {
    async fn read(conn: &mut RedisConn) -> Self {
        let config = |name: &'static str| {
            let mut conn = conn.clone();
            async move {
                let reply: redis::RedisResult<RValue> = redis::cmd("CONFIG").arg("GET").arg(name).query_async(&mut conn).await;
                config_value(&reply.ok()?, name)
            }
        };
        let appendonly = config("appendonly").await;
        let appendfsync = config("appendfsync").await;
        let info: Option<String> = redis::cmd("INFO").arg("replication").query_async(&mut conn.clone()).await.ok();
        let replicas = info
            .as_deref()
            .and_then(|i| i.lines().find_map(|l| l.trim().strip_prefix("connected_slaves:")).and_then(|n| n.trim().parse().ok()));
        Self { appendonly, appendfsync, replicas }
    }

    /// What a process crash, a power loss and a failover can lose, in words.
    fn what_can_be_lost(&self) -> String {
        let disk = match (self.appendonly.as_deref(), self.appendfsync.as_deref()) {
            (Some("yes"), Some("always")) => "a Redis crash or a power loss loses nothing acknowledged (appendfsync always)",
            (Some("yes"), Some("everysec")) => {
                "a Redis crash loses nothing acknowledged; a power loss up to the last second (appendfsync everysec)"
            }
            (Some("yes"), _) => {
                "a Redis crash loses nothing acknowledged; a power loss what the OS had not written (appendfsync no)"
            }
            (Some(_), _) => "a Redis restart or crash loses everything acknowledged since its last snapshot (appendonly no)",
            (None, _) => "unknown: the server would not tell its persistence settings (CONFIG GET refused)",
        };
        let failover = match self.replicas {
            Some(0) => "no replica is connected".to_owned(),
            Some(n) => format!("a failover loses what the {n} replica(s) had not copied yet (replication is asynchronous)"),
            None => "replicas unknown".to_owned(),
        };
        format!("{disk}; {failover}")
    }

    /// Whether `--durability strict` can promise that nothing acknowledged
    /// is lost to a crash or a power loss; else what to change.
    fn strict_enough(&self) -> Result<(), String> {
        match (self.appendonly.as_deref(), self.appendfsync.as_deref()) {
            (Some("yes"), Some("always")) => Ok(()),
            (None, _) | (_, None) => Err("does not say how it persists (CONFIG GET appendonly/appendfsync refused)".into()),
            (Some(on), Some(sync)) => Err(format!(
                "has appendonly {on} and appendfsync {sync}: set `appendonly yes` and `appendfsync always` (CONFIG SET, and in redis.conf)"
            )),
        }
    }
}

/// The value of `name` in a `CONFIG GET` reply (a flat array or a map, RESP2 or 3).
fn config_value(reply: &RValue, name: &str) -> Option<String> {
    let text = |v: &RValue| match v {
        RValue::BulkString(b) => String::from_utf8(b.clone()).ok(),
        RValue::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        RValue::Array(items) => {
            items.chunks(2).find(|kv| kv.first().and_then(text).as_deref() == Some(name))?.get(1).and_then(text)
        }
        RValue::Map(pairs) => pairs.iter().find(|(k, _)| text(k).as_deref() == Some(name)).and_then(|(_, v)| text(v)),
        _ => None,
    }
    .map(|v| v.to_ascii_lowercase())
}

#[cfg(test)]
mod persistence_tests {
    use super::*;

    #[test]
    fn strict_needs_an_append_only_file_synced_on_every_write() {
        let p = |on: &str, sync: &str, replicas| Persistence {
            appendonly: Some(on.into()),
            appendfsync: Some(sync.into()),
            replicas: Some(replicas),
        };
        assert!(p("yes", "always", 1).strict_enough().is_ok());
        let refused = p("no", "everysec", 0).strict_enough().unwrap_err();
        assert!(refused.contains("appendonly yes") && refused.contains("appendfsync always"), "{refused}");
        assert!(p("yes", "everysec", 0).strict_enough().is_err());
        assert!(Persistence::default().strict_enough().unwrap_err().contains("refused"));
        assert!(p("no", "everysec", 0).what_can_be_lost().contains("since its last snapshot"));
        assert!(p("yes", "always", 2).what_can_be_lost().contains("2 replica(s)"));
        let reply = RValue::Array(vec![RValue::BulkString(b"appendonly".to_vec()), RValue::BulkString(b"no".to_vec())]);
        assert_eq!(config_value(&reply, "appendonly").as_deref(), Some("no"));
        assert_eq!(config_value(&reply, "appendfsync"), None);
    }
}
