//! One connection type for a single Redis server and for a Redis Cluster, so
//! the store and the notebook issue the same commands to either, and the
//! `--store` URL that names it.
//!
//! A cluster is named `redis+cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT/`
//! (or `rediss+cluster://` for TLS): the nodes it starts from; the client
//! learns the rest of the topology and follows `MOVED`/`ASK` by itself.

use std::borrow::Cow;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::batch::BatchQueue;
use crate::{StoreError, StoreResult};

/// A connection to one Redis server (multiplexed, reconnecting) or to a
/// Redis Cluster (a connection per node, commands routed by key slot).
/// A single server's connection carries the queue of its batching task
/// (`batch.rs`), which every batched operation on it shares; the task's own
/// connection has none.
#[derive(Clone)]
pub enum RedisConn {
    /// One Redis server: its connection, the batching task's queue, the
    /// replicas `strict` waits for.
    Single(ConnectionManager, Option<BatchQueue>, Option<Replicas>),
    /// A Redis Cluster, and the replicas `strict` waits for.
    Cluster(ClusterConnection, Option<Replicas>),
}

/// `--durability strict --redis-replicas N`: after every command that may
/// write, `WAIT N` on the same connection (on a cluster, on every primary's
/// connection: the client routes `WAIT` to all primaries and answers the
/// fewest replicas any had, and each node's connection is the one its
/// writes went over); fewer replicas within [`Replicas::timeout_ms`] fail
/// the call like a disk error (its writes are on the primary, but nothing
/// is acknowledged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    pub count: u32,
    pub timeout_ms: u64,
}

impl RedisConn {
    /// A single server's connection, with its batching task started.
    pub fn single(conn: ConnectionManager, replicas: Option<Replicas>) -> Self {
        let queue = super::batch::start(RedisConn::Single(conn.clone(), None, replicas));
        RedisConn::Single(conn, Some(queue), replicas)
    }

    /// Whether this is a Redis Cluster's connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(..))
    }

    /// Whether writes wait for replicas (`--redis-replicas`).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas().is_some()
    }

    fn replicas(&self) -> Option<Replicas> {
        match self {
            RedisConn::Single(_, _, replicas) | RedisConn::Cluster(_, replicas) => *replicas,
        }
    }

    pub(crate) fn batch_queue(&self) -> Option<&BatchQueue> {
        match self {
            RedisConn::Single(_, queue, _) => queue.as_ref(),
            RedisConn::Cluster(..) => None,
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let wait = self.replicas().filter(|_| may_write(cmd));
        match (self, wait) {
            (RedisConn::Single(c, _, _), Some(replicas)) => Box::pin(async move {
                let reply = c.req_packed_command(cmd).await?;
                wait_for(c, replicas).await?;
                Ok(reply)
            }),
            (RedisConn::Single(c, _, _), None) => c.req_packed_command(cmd),
            (RedisConn::Cluster(c, _), Some(replicas)) => Box::pin(async move {
                let Some(key) = first_key(cmd) else {
                    let reply = c.req_packed_command(cmd).await?;
                    wait_for(c, replicas).await?;
                    return Ok(reply);
                };
                // The write and its WAIT in one pipeline to the node of the
                // key's slot: they run on the same node whatever the slot
                // map says by then (a redirect moves both), so a node that
                // took the write without its replicas (an old primary back
                // for a moment) answers for it.
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(Slot::for_key(key), SlotAddr::Master));
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone()).add_command(wait_command(replicas));
                let mut replies = c.route_pipeline(pipe, 0, 2, route).await?;
                let acked = replies.pop();
                let reply = replies.pop().unwrap_or(Value::Nil);
                enough(acked.as_ref().map_or(Ok(0), redis::from_redis_value_ref::<i64>)?, replicas)?;
                Ok(reply)
            }),
            (RedisConn::Cluster(c, _), None) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(&'a mut self, pipeline: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        let wait = self.replicas().filter(|_| pipeline.cmd_iter().any(may_write));
        match (self, wait) {
            (RedisConn::Single(c, _, _), Some(replicas)) => Box::pin(async move {
                let replies = c.req_packed_commands(pipeline, offset, count).await?;
                wait_for(c, replicas).await?;
                Ok(replies)
            }),
            (RedisConn::Single(c, _, _), None) => c.req_packed_commands(pipeline, offset, count),
            (RedisConn::Cluster(c, _), Some(replicas)) => Box::pin(async move {
                // As for one command: the pipeline and its WAIT on one node.
                let key = pipeline.cmd_iter().find_map(first_key).filter(|_| !pipeline.is_transaction());
                let Some(key) = key else {
                    let replies = c.req_packed_commands(pipeline, offset, count).await?;
                    wait_for(c, replicas).await?;
                    return Ok(replies);
                };
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(Slot::for_key(key), SlotAddr::Master));
                let mut pipe = pipeline.clone();
                pipe.add_command(wait_command(replicas));
                let mut replies = c.route_pipeline(pipe, offset, count + 1, route).await?;
                let acked = replies.pop();
                enough(acked.as_ref().map_or(Ok(0), redis::from_redis_value_ref::<i64>)?, replicas)?;
                Ok(replies)
            }),
            (RedisConn::Cluster(c, _), None) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c, _, _) => c.get_db(),
            RedisConn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// Commands that never write: no `WAIT` after them.
const READS: &[&str] = &[
    "GET",
    "MGET",
    "HGET",
    "HMGET",
    "HGETALL",
    "HLEN",
    "EXISTS",
    "SCAN",
    "SSCAN",
    "HSCAN",
    "ZSCAN",
    "SMEMBERS",
    "SCARD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREVRANGE",
    "ZCARD",
    "ZSCORE",
    "XRANGE",
    "XREVRANGE",
    "XLEN",
    "LRANGE",
    "LLEN",
    "TTL",
    "PTTL",
    "TYPE",
    "PING",
    "INFO",
    "CONFIG",
    "WAIT",
    "SCRIPT",
    "STRLEN",
    "EVALSHA_RO",
    "EVAL_RO",
];

/// Whether `cmd` may write (anything not known to be a read, scripts included).
fn may_write(cmd: &Cmd) -> bool {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => !READS.iter().any(|r| r.as_bytes().eq_ignore_ascii_case(name)),
        _ => true,
    }
}

/// `WAIT count timeout` on `conn`: an error unless that many replicas have
/// every write this connection sent so far.
async fn wait_for(conn: &mut impl ConnectionLike, replicas: Replicas) -> redis::RedisResult<()> {
    let acked: i64 = wait_command(replicas).query_async(conn).await?;
    enough(acked, replicas)
}

fn wait_command(replicas: Replicas) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas.count).arg(replicas.timeout_ms);
    cmd
}

/// An error unless `acked` replicas are as many as `replicas` asks.
fn enough(acked: i64, replicas: Replicas) -> redis::RedisResult<()> {
    if acked < i64::from(replicas.count) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "a write did not reach its replicas",
            format!(
                "{acked} of {} replica(s) had it within {} ms (--redis-replicas); nothing was acknowledged",
                replicas.count, replicas.timeout_ms
            ),
        )));
    }
    Ok(())
}

/// The first key `cmd` names (after a script's key count), which picks its
/// slot; `None` for a command without keys.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let scripted = [&b"EVALSHA"[..], b"EVAL", b"FCALL"].iter().any(|s| s.eq_ignore_ascii_case(name));
    if scripted {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        return if keys == 0 { None } else { args.next() };
    }
    args.next()
}

/// Whether `url` names a Redis Cluster.
pub fn is_cluster_url(url: &str) -> bool {
    url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
}

/// The node URLs of a `redis+cluster://` URL, each with the URL's
/// credentials and TLS choice.
pub fn cluster_nodes(url: &str) -> StoreResult<Vec<String>> {
    let bad = |why: &str| {
        StoreError::Config(format!(
            "bad Redis Cluster URL {}: {why}; write it as redis+cluster://HOST:PORT,HOST:PORT/ (rediss+cluster:// for TLS)",
            super::redacted(url)
        ))
    };
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
        ("rediss", rest)
    } else {
        return Err(bad("it does not start with redis+cluster://"));
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() && path != "0" {
        return Err(bad("a cluster has only database 0"));
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((c, h)) => (Some(c), h),
        None => (None, authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| match credentials {
            Some(c) => format!("{scheme}://{c}@{h}/"),
            None => format!("{scheme}://{h}/"),
        })
        .collect();
    if nodes.is_empty() {
        return Err(bad("it names no node"));
    }
    Ok(nodes)
}

/// The hash tag that puts every key of one session (or one record family)
/// in one cluster slot: the ID itself, unless it holds a character that
/// would end or empty the tag (`{`, `}`) or is empty, in which case it is
/// written as `~` and its bytes in hex. Generated IDs never hold `{`, `}` or
/// `~`, so two IDs never share a tag.
pub fn hash_tag(id: &str) -> Cow<'_, str> {
    if !id.is_empty() && !id.contains(['{', '}', '~']) {
        return Cow::Borrowed(id);
    }
    let mut tag = String::with_capacity(1 + 2 * id.len());
    tag.push('~');
    for b in id.bytes() {
        tag.push_str(&format!("{b:02x}"));
    }
    Cow::Owned(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_node_with_the_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002/").unwrap(),
            ["redis://127.0.0.1:7001/", "redis://127.0.0.1:7002/"]
        );
        assert_eq!(cluster_nodes("rediss+cluster://u:p@a:1,b:2").unwrap(), ["rediss://u:p@a:1/", "rediss://u:p@b:2/"]);
        assert!(cluster_nodes("redis+cluster:///").is_err());
        assert!(cluster_nodes("redis+cluster://a:1/3").is_err());
        assert!(is_cluster_url("redis+cluster://a:1/") && !is_cluster_url("redis://a:1/"));
    }

    #[test]
    fn a_commands_slot_comes_from_its_first_key_a_scripts_after_its_key_count() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc").arg(2).arg("k1").arg("k2").arg("v");
        assert_eq!(first_key(&eval), Some(&b"k1"[..]));
        let mut keyless = redis::cmd("EVALSHA");
        keyless.arg("abc").arg(0).arg("v");
        assert_eq!(first_key(&keyless), None);
        let mut set = redis::cmd("SET");
        set.arg("k").arg("v");
        assert_eq!(first_key(&set), Some(&b"k"[..]));
        assert_eq!(first_key(&redis::cmd("PING")), None);
    }

    #[test]
    fn hash_tags_are_the_id_unless_it_could_break_the_tag() {
        assert_eq!(hash_tag("8f3a"), "8f3a");
        assert_eq!(hash_tag("a}b"), "~617d62");
        assert_eq!(hash_tag(""), "~");
        assert_ne!(hash_tag("~61"), hash_tag("a"));
        assert_eq!(hash_tag("~61"), "~7e3631");
    }
}
