//! The key layout under the prefix `P` (default `tether:`): the names every
//! part of the backend builds its keys with, and the check at open that the
//! keys under a prefix are in this layout.
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
//! | `Playout` | string | the key layout (3), set on a fresh prefix; a prefix in another layout is refused at open |
//!
//! Invariant: every key of a session carries its hash tag (`{id}`), and a
//! key/value record the tag of its key up to the first `/` or `.`, so every
//! script's keys are in one cluster slot; the marker `Playout` says which
//! layout the keys under the prefix are in, and a version serves only its
//! own: there is no conversion (no released version wrote another layout).

use redis::AsyncCommands;

use super::{RedisStore, hash_tag, unavailable};
use crate::{StoreError, StoreResult};

/// The key layout this version reads and writes (`P layout`): every key of
/// a session carries its hash tag, and `ss` lists open streams only. The
/// layouts before it (1: untagged keys, no marker; 2: per-stream hashes
/// `q`, `f`) were written only by pre-release builds and are refused.
const LAYOUT: i64 = 3;

impl RedisStore {
    /// Checks the layout marker (`P layout`) before serving: a fresh prefix
    /// is marked with this version's layout; keys in another layout are
    /// refused (with what to do), never read or changed. A prefix without
    /// a marker that holds keys is of layout 1 (never on a cluster, where
    /// they would not all be in one slot to look for).
    pub(super) async fn check_layout(&self) -> StoreResult<()> {
        let mut conn = self.conn.clone();
        let marker = self.key(&["layout"]);
        match conn.get::<_, Option<i64>>(&marker).await.map_err(unavailable)? {
            Some(LAYOUT) => Ok(()),
            Some(newer) if newer > LAYOUT => Err(StoreError::Config(format!(
                "the keys under prefix `{}` were written by a newer tether (key layout {newer}; this one reads {LAYOUT}): run the newer version",
                self.prefix
            ))),
            Some(older) => Err(self.pre_release_layout(older)),
            None => {
                // Layout 1 had no marker: its by-expiry index, or its one
                // shared revision counter, left behind.
                let layout_1 = !self.conn.is_cluster()
                    && redis::cmd("EXISTS")
                        .arg(self.key(&["sx"]))
                        .arg(self.key(&["kvrev"]))
                        .query_async::<i64>(&mut conn)
                        .await
                        .map_err(unavailable)?
                        > 0;
                if layout_1 {
                    return Err(self.pre_release_layout(1));
                }
                let _: () = conn.set(&marker, LAYOUT).await.map_err(unavailable)?;
                Ok(())
            }
        }
    }

    /// Keys of a layout only a pre-release build wrote: not converted (no
    /// released version wrote them), refused with what to do instead.
    fn pre_release_layout(&self, found: i64) -> StoreError {
        StoreError::Config(format!(
            "the keys under prefix `{p}` are in key layout {found}, which only a pre-release tether wrote; this one reads layout {LAYOUT} and does not convert them: use a fresh prefix (--store-prefix), or delete the keys under `{p}` (FLUSHDB if the database holds nothing else) and start again",
            p = self.prefix
        ))
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
