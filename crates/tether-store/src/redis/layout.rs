//! The key layout under the prefix `P` (default `tether:`): the names every
//! part of the backend builds its keys with, and which layout the keys under
//! a prefix are in.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P{id}:s` | hash | session: principal, created, expires, revision, state |
//! | `P{id}:ss` | set | the session's open streams (no final event yet) |
//! | `P{id}:e:{stream}` | stream | events, entry ID `0-{seq}` (numbered by Redis, `0-*`), capped with `MAXLEN`; an open stream expires with its session, a finished one about one session TTL after its final event |
//! | `P{id}:d:{stream}` | string | a stream that began with its final event, stored whole (`events::encode_whole`), kept for `finished_stream_ttl` |
//! | `P{id}:barrier` | string | under `--redis-replicas`, written after a replay's read so that its `WAIT` covers what the read saw (60 s) |
//! | `P{id}:c` | hash | cursor per stream |
//! | `Psp:{principal}` / `Psx` | zset | sessions by principal / by expiry |
//! | `P{tag}:kv:{ns}:{key}` | hash | value, revision, expiry (plus a native TTL); `tag` is the key up to its first `/` or `.` (a session's records share its slot, as do an operation's chunks `OP.N`) |
//! | `P{tag}:kvrev` | counter | key/value revisions of that slot, never reused |
//! | channel `Plive` (single server) | pub/sub | `{session}\n{stream}\n{seq}` after every append |
//! | channels `Plive:0` … `Plive:15` (cluster) | sharded pub/sub | the same, on the channel of the session's shard of 16 |
//! | `Playout` | string | the key layout (3); keys of layouts 1 (untagged, before Redis Cluster support) and 2 (per-stream hashes) are converted at open |
//!
//! Invariant: every key of a session carries its hash tag (`{id}`), and a
//! key/value record the tag of its key up to the first `/` or `.`, so every
//! script's keys are in one cluster slot; the marker `Playout` says which
//! layout the keys under the prefix are in, and a version serves only its own.

use futures::TryStreamExt;
use redis::AsyncCommands;

use super::{RedisStore, hash_tag, unavailable};
use crate::{StoreError, StoreResult};

/// The key layout this version reads and writes (`P layout`):
/// 2 = every key of a session carries its hash tag;
/// 3 = `ss` lists open streams only, no per-stream hashes (`q`, `f`).
const LAYOUT: i64 = 3;

impl RedisStore {
    /// Brings keys an earlier version wrote under this prefix (layout 1:
    /// untagged session keys `P s:ID`…, one shared revision counter
    /// `P kvrev`; layout 2: per-stream hashes `q`, `f` and every stream in
    /// `ss`) to this version's layout, once, before serving; then
    /// marks the prefix (`P layout`). Replicas of the old version must be
    /// stopped first: upgrade every replica together. A cluster never held
    /// layout 1. Returns whether it found keys of layout 1.
    pub(super) async fn upgrade_layout(&self) -> StoreResult<bool> {
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

    pub(super) fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.to_string();
        for p in parts {
            k.push_str(p);
        }
        k
    }

    /// `P{id}:`, the beginning of every key of session `id` (one cluster slot).
    pub(super) fn base(&self, id: &str) -> String {
        format!("{}{{{}}}:", self.prefix, hash_tag(id))
    }

    /// A key/value record and its slot's revision counter.
    pub(super) fn kv_keys(&self, namespace: &str, key: &str) -> (String, String) {
        let tag = hash_tag(key.split(['/', '.']).next().unwrap_or(key));
        let base = format!("{}{{{tag}}}:", self.prefix);
        (format!("{base}kv:{namespace}:{key}"), format!("{base}kvrev"))
    }
}
