//! Appends announced over pub/sub, so that every replica delivers live what
//! any of them stored: `{session}\n{stream}\n{seq}` per append, on the
//! channel `Plive` of a single server (published by the append script, a
//! batch's lines as one message) or, on a cluster, with `SPUBLISH` on the
//! sharded channel `Plive:N` of the session's shard; and the [`Listener`]
//! that feeds what every replica announces into the store's
//! `remote_appends`.
//!
//! Invariant: an announcement only says "read the store". One that is lost
//! (a slow consumer, a reconnect) costs latency, never an event: a pump
//! falls back to reading the store. A message that does not parse whole is
//! dropped whole.

use std::time::Duration;

use futures::StreamExt;
use redis::Value as RValue;
use tokio::sync::broadcast;

use super::{RedisStore, redacted, unavailable};
use crate::{RemoteAppend, StoreError, StoreResult};

/// Sharded announcement channels on a cluster (`Plive:0` … `Plive:15`):
/// spread over the shards, few enough for every replica to listen to all.
const LIVE_SHARDS: u64 = 16;

/// What keeps announcements coming in while the store lives.
pub(super) enum Listener {
    /// A task that holds a `Weak` of this and stops when it is gone.
    Task,
    /// The cluster connection whose node connections hold the sharded subscriptions.
    Cluster(#[allow(dead_code)] redis::cluster_async::ClusterConnection),
}

/// On a cluster: a connection of its own (RESP3, its pushes forwarded into
/// `remote`) subscribed to every sharded channel; `client` names the nodes
/// and carries the store's timeouts.
pub(super) async fn subscribe_sharded(
    client: redis::cluster::ClusterClientBuilder,
    url: &str,
    prefix: &str,
    remote: broadcast::Sender<RemoteAppend>,
) -> StoreResult<Listener> {
    let announcements = remote;
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
    let subscriber = client
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(push)
        .build()
        .map_err(|e| StoreError::Config(format!("bad Redis Cluster URL {}: {e}", redacted(url))))?;
    let mut listener = tokio::time::timeout(Duration::from_secs(5), subscriber.get_async_connection())
        .await
        .map_err(|_| StoreError::Unavailable(format!("redis at {} did not answer within 5s (announcements)", redacted(url))))?
        .map_err(|e| StoreError::Unavailable(format!("cannot connect to the Redis Cluster at {}: {e}", redacted(url))))?;
    let channels: Vec<String> = (0..LIVE_SHARDS).map(|n| format!("{prefix}live:{n}")).collect();
    // One SSUBSCRIBE per channel: each goes to the node of its slot,
    // and the client subscribes again after a reconnect or a move.
    for channel in &channels {
        listener.ssubscribe(channel).await.map_err(unavailable)?;
    }
    Ok(Listener::Cluster(listener))
}

impl RedisStore {
    /// On a cluster, where a script cannot publish to a channel outside its
    /// slot: announces an append on the sharded channel of its session.
    pub(super) async fn announce_sharded(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
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
/// publishes its lines as one message, [`Store::announce`](crate::Store::announce)
/// one append. A message that does not parse whole is dropped whole.
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
pub(super) async fn listen(
    client: redis::Client,
    channel: String,
    tx: broadcast::Sender<RemoteAppend>,
    alive: std::sync::Weak<Listener>,
) {
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

#[cfg(test)]
mod tests {
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
}
