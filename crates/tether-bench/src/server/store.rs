//! The stores tether runs on (memory, a SQLite file in a temp dir, Redis
//! keys under a fresh prefix, or a Redis pair of the bench's own), what they
//! hold outside the server process, and removing what they hold; the Redis
//! helpers behind them (`redis-cli` per node).

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context;

use super::catalog::{Programs, System};

/// The store a tether server runs on; dropping it removes what it holds
/// (the temp dir, the Redis keys under its prefix, or the Redis servers the
/// bench started for it).
pub enum Store {
    Memory,
    Sqlite {
        dir: tempfile::TempDir,
        file: PathBuf,
    },
    Redis {
        url: String,
        prefix: String,
        /// tether-redis-replica and tether-redis-strict: the primary and
        /// replica started for this store (killed when it is dropped).
        own: Option<crate::redis_pair::RedisPair>,
    },
}

impl Store {
    /// A fresh, empty store for `system` (None for systems that are not tether).
    pub fn fresh(system: System, programs: &Programs) -> anyhow::Result<Option<Store>> {
        Ok(match system {
            System::TetherMemory => Some(Store::Memory),
            System::TetherSqlite
            | System::TetherRmcp
            | System::TetherSqliteNometrics
            | System::TetherGateway
            | System::TetherGatewayNoKeeper
            | System::TetherGatewayStdioRelay
            | System::TetherSqliteModern
            | System::TetherSqliteToken
            | System::TetherSqliteOauth => {
                let dir = tempfile::Builder::new().prefix("tether-bench-").tempdir().context("cannot create a temp dir")?;
                let file = dir.path().join("bench.db");
                Some(Store::Sqlite { dir, file })
            }
            System::TetherRedis => {
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: programs.redis_url.clone(), prefix, own: None })
            }
            System::TetherRedisCluster => {
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: programs.redis_cluster_url.clone(), prefix, own: None })
            }
            System::TetherRedisReplica | System::TetherRedisStrict => {
                let pair = crate::redis_pair::RedisPair::start().with_context(|| format!("{}'s Redis", system.name()))?;
                let prefix = format!("tether-bench:{:016x}:", rand::random::<u64>());
                Some(Store::Redis { url: pair.url(), prefix, own: Some(pair) })
            }
            _ => None,
        })
    }

    /// The store as a `--store` value (a Redis prefix aside).
    pub(super) fn url(&self) -> String {
        match self {
            Store::Memory => "memory".into(),
            Store::Sqlite { file, .. } => format!("sqlite:{}", file.display()),
            Store::Redis { url, .. } => url.clone(),
        }
    }

    pub(super) fn args(&self) -> Vec<String> {
        match self {
            Store::Memory => vec!["--store".into(), "memory".into()],
            Store::Sqlite { file, .. } => vec!["--store".into(), format!("sqlite:{}", file.display())],
            Store::Redis { url, prefix, .. } => vec!["--store".into(), url.clone(), "--store-prefix".into(), prefix.clone()],
        }
    }

    /// Bytes the store holds outside the server process: the SQLite files,
    /// or Redis's `used_memory` (the whole Redis, so only deltas mean anything).
    pub fn outside_bytes(&self) -> Option<u64> {
        match self {
            Store::Memory => None,
            Store::Sqlite { dir, .. } => {
                let entries = std::fs::read_dir(dir.path()).ok()?;
                Some(entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            }
            Store::Redis { url, .. } => {
                let mut total = 0;
                for node in redis_nodes(url) {
                    let info = redis_cli(&node, &["INFO", "memory"]).ok()?;
                    total +=
                        info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse::<u64>().ok())?;
                }
                Some(total)
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The bench's own Redis servers go with their keys (`own` drops after this).
        if let Store::Redis { url, prefix, own: None } = self
            && let Err(e) = delete_redis_keys(url, prefix)
        {
            eprintln!("tether-bench: could not delete the Redis keys under {prefix}: {e:#}");
        }
    }
}

/// A Redis node as redis-cli is told of it: host and port.
struct Node {
    host: String,
    port: String,
}

/// The nodes of a `redis://HOST:PORT/` or `redis+cluster://HOST:PORT,…/` URL
/// (credentials and TLS are not for the bench's loopback Redis).
fn redis_nodes(url: &str) -> Vec<Node> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split('/').next().unwrap_or(rest);
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| match h.rsplit_once(':') {
            Some((host, port)) => Node { host: host.to_owned(), port: port.to_owned() },
            None => Node { host: h.to_owned(), port: "6379".to_owned() },
        })
        .collect()
}

/// Runs `redis-cli -h HOST -p PORT ARGS…` and returns its stdout.
fn redis_cli(node: &Node, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", &node.host, "-p", &node.port])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run redis-cli")?;
    anyhow::ensure!(out.status.success(), "redis-cli {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the Redis at `url` answers: every node `PING`s, and a cluster's
/// first node says `cluster_state:ok`.
pub fn redis_available(url: &str) -> bool {
    let nodes = redis_nodes(url);
    let pong = nodes.iter().all(|n| redis_cli(n, &["ping"]).is_ok_and(|out| out.trim() == "PONG"));
    pong && (!url.contains("+cluster://")
        || nodes.first().is_some_and(|n| redis_cli(n, &["CLUSTER", "INFO"]).is_ok_and(|i| i.contains("cluster_state:ok"))))
}

/// Deletes every key under `prefix` on every node, with a script per node
/// (SCAN and UNLINK inside Redis: keys of one command must share a slot on
/// a cluster, and one script per node needs no round trip per key).
fn delete_redis_keys(url: &str, prefix: &str) -> anyhow::Result<()> {
    const DELETE: &str = "#!lua flags=allow-cross-slot-keys\nlocal c, n = '0', 0 repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) \
        c = r[1] for _, k in ipairs(r[2]) do redis.call('UNLINK', k) n = n + 1 end until c == '0' return n";
    let pattern = format!("{prefix}*");
    for node in redis_nodes(url) {
        redis_cli(&node, &["EVAL", DELETE, "0", &pattern])?;
        let left = redis_cli(&node, &["--scan", "--pattern", &pattern])?;
        anyhow::ensure!(left.trim().is_empty(), "keys under {prefix} are left on {}:{}", node.host, node.port);
    }
    Ok(())
}
