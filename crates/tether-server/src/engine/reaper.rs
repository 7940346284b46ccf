//! The reaper: every `reap_interval`, deletes expired sessions (the
//! application hears of each), drops finished request streams older than one
//! session TTL, and lets idle sessions leave memory.

use std::sync::Arc;

use tether_store::now_ms;

use super::Inner;
use crate::app::EndReason;

/// Old request streams dropped per store call (one short write), and calls per reap.
const DROP_EVENTS_PER_ROUND: usize = 10_000;
const DROP_ROUNDS_PER_REAP: usize = 20;
/// A session unused this long leaves memory at the next reap.
const IDLE_IN_MEMORY_MS: i64 = 60_000;

impl Inner {
    /// Runs until shutdown.
    pub(crate) fn spawn_reaper(self: &Arc<Self>) {
        let inner = self.clone();
        self.life.spawn(async move {
            let mut tick = tokio::time::interval(inner.config.reap_interval);
            loop {
                tokio::select! {
                    _ = inner.life.shutdown.cancelled() => return,
                    _ = tick.tick() => inner.reap().await,
                }
            }
        });
    }

    async fn reap(self: &Arc<Self>) {
        match self.store.expire_sessions(now_ms(), 1000).await {
            Ok(expired) => {
                for id in expired {
                    let held = self.cache.sessions.lock().remove(&id);
                    match held {
                        Some(s) => {
                            s.closed.cancel();
                            self.ended(vec![s], EndReason::Expired);
                        }
                        None => self.ended_elsewhere(id.clone(), EndReason::Expired),
                    }
                    tracing::info!(session = %id, "expired session removed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaper could not expire sessions"),
        }
        self.drop_old_request_streams().await;
        self.drop_idle(now_ms() - IDLE_IN_MEMORY_MS);
    }

    /// Finished request streams are kept for replay for one session TTL,
    /// then dropped (whether or not their session still exists).
    async fn drop_old_request_streams(&self) {
        let cutoff = now_ms() - self.config.session_ttl.as_millis() as i64;
        let (from, below) = crate::ids::request_streams_started_before(cutoff);
        for _ in 0..DROP_ROUNDS_PER_REAP {
            match self.store.drop_finished_streams(from, &below, cutoff, DROP_EVENTS_PER_ROUND).await {
                Ok(dropped) if dropped as usize >= DROP_EVENTS_PER_ROUND => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reaper could not drop old request streams");
                    break;
                }
            }
        }
    }
}
