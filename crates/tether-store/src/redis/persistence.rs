//! The Redis server's persistence, read at open (`CONFIG GET`, `INFO
//! replication`): what a crash, a power loss and a failover can lose of
//! what was acknowledged (logged, and stated on `/readyz`), and whether
//! `--durability strict` can run on the server.
//!
//! Invariant: strict runs only on a server that says it puts every write on
//! disk before acknowledging it (`appendonly yes`, `appendfsync always`); a
//! server that will not say is refused too, with what to change.

use redis::Value as RValue;

use super::RedisConn;

/// A Redis server's persistence settings as read at open (`CONFIG GET`,
/// `INFO replication`); `None` where the server would not say (a managed
/// service that refuses `CONFIG`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Persistence {
    appendonly: Option<String>,
    appendfsync: Option<String>,
    replicas: Option<u64>,
}

impl Persistence {
    pub(super) async fn read(conn: &mut RedisConn) -> Self {
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
    pub(super) fn what_can_be_lost(&self) -> String {
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
    pub(super) fn strict_enough(&self) -> Result<(), String> {
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
mod tests {
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
