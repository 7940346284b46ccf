//! The sessions this process holds in memory: a cache of the store
//! (invariant 8: memory holds a cache, never the only copy). Bounded by
//! `--session-cache`: beyond it the least recently used idle sessions leave
//! memory (and the application hears so); one in use never does. Also the
//! per-principal session count that `--max-sessions-per-principal` checks,
//! and the lazy refresh of a session's expiry in the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use tether_store::now_ms;

use super::session::Session;
use super::{EngineError, Inner};
use crate::app::EndReason;

/// Drops the least recently seen idle sessions from memory until `target`
/// remain (or no idle one is left), and returns them. Idle means nothing but
/// the map holds it: no request, pump or handler uses it, so no in-memory
/// state is lost; the next request rehydrates it from the store. Checked
/// under the map's lock, which every lookup takes too, so no one can pick it
/// up meanwhile.
pub(crate) fn evict_idle(map: &mut HashMap<String, Arc<Session>>, target: usize) -> Vec<Arc<Session>> {
    let excess = map.len().saturating_sub(target);
    let mut idle: Vec<(i64, String)> =
        map.iter().filter(|(_, s)| Arc::strong_count(s) == 1).map(|(id, s)| (s.last_seen(), id.clone())).collect();
    if idle.len() > excess && excess > 0 {
        idle.select_nth_unstable(excess - 1);
        idle.truncate(excess);
    }
    idle.into_iter().filter_map(|(_, id)| map.remove(&id)).collect()
}

/// The sessions held in memory, and what the cache keeps beside them.
#[derive(Default)]
pub(crate) struct SessionCache {
    pub(super) sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// When a full cache is scanned for idle sessions next.
    pub(super) eviction: EvictionSchedule,
    /// Held while a session is loaded from the store (one load at a time).
    pub(super) loading: tokio::sync::Mutex<()>,
    /// Live sessions per principal as last counted in the store, plus the
    /// ones created here since (refreshed every few seconds).
    pub(super) principal_counts: Mutex<HashMap<String, (u64, i64)>>,
}

/// When the next eviction scan of a full cache is due. A scan that frees
/// too little (every session in use: open streams, requests) must not run
/// again at the very next insertion, or holding many busy sessions costs a
/// full scan per new session: the next one waits for another eighth of the
/// capacity to arrive.
#[derive(Debug, Default)]
pub(crate) struct EvictionSchedule(std::sync::atomic::AtomicUsize);

impl EvictionSchedule {
    /// Whether a map of `len` sessions should be scanned now.
    pub(crate) fn due(&self, len: usize, capacity: usize) -> bool {
        len > capacity && len >= self.0.load(Ordering::Relaxed)
    }

    /// A scan left `len` sessions: the next waits for `capacity / 8` more.
    pub(crate) fn scanned(&self, len: usize, capacity: usize) {
        self.0.store(len + (capacity / 8).max(1), Ordering::Relaxed);
    }
}

impl Inner {
    /// Expiry written to the store: the TTL plus a tenth of slack, because
    /// activity only touches the store when the expiry drifted that much.
    pub(crate) fn expiry_from(&self, now: i64) -> i64 {
        let ttl = self.config.session_ttl.as_millis() as i64;
        now + ttl + ttl / 10
    }

    pub(crate) fn cache(self: &Arc<Self>, session: Arc<Session>) {
        let evicted = {
            let mut map = self.cache.sessions.lock();
            map.insert(session.id.clone(), session);
            let capacity = self.config.session_cache.max(1);
            if self.cache.eviction.due(map.len(), capacity) {
                // Down to 7/8 at once, so the scan runs once per capacity/8 insertions.
                let evicted = evict_idle(&mut map, capacity - capacity / 8);
                self.cache.eviction.scanned(map.len(), capacity);
                evicted
            } else {
                Vec::new()
            }
        };
        self.ended(evicted, EndReason::Evicted);
    }

    /// Drops a session from memory only (another replica ended it).
    pub(crate) fn forget(self: &Arc<Self>, session: &Arc<Session>) {
        session.closed.cancel();
        let removed = self.cache.sessions.lock().remove(&session.id);
        self.ended(removed.into_iter().collect(), EndReason::Evicted);
    }

    pub(crate) fn cached(&self, id: &str) -> Option<Arc<Session>> {
        self.cache.sessions.lock().get(id).cloned()
    }

    /// Idle sessions leave memory (the store still has them).
    pub(crate) fn drop_idle(self: &Arc<Self>, idle_before: i64) {
        let idle: Vec<Arc<Session>> =
            self.cache.sessions.lock().values().filter(|s| s.last_seen() < idle_before && !s.is_busy()).cloned().collect();
        let mut dropped = Vec::new();
        for s in idle {
            if self.hub.session_connections(&s.id) == 0
                && let Some(removed) = self.cache.sessions.lock().remove(&s.id)
            {
                dropped.push(removed);
            }
        }
        self.ended(dropped, EndReason::Evicted);
    }

    pub(crate) fn touch(&self, session: &Arc<Session>, now: i64) {
        session.last_seen.store(now, Ordering::Relaxed);
        let ttl = self.config.session_ttl.as_millis() as i64;
        let persisted = session.expires_persisted.load(Ordering::Relaxed);
        let wanted = self.expiry_from(now);
        if wanted - persisted > ttl / 10 {
            session.expires_persisted.store(wanted, Ordering::Relaxed);
            let store = self.store.clone();
            let id = session.id.clone();
            self.life.spawn(async move {
                if let Err(e) = store.touch_session(&id, wanted).await {
                    tracing::warn!(session = %id, error = %e, "could not extend session expiry");
                }
            });
        }
    }

    /// Enforces `max_sessions_per_principal`. The count comes from the
    /// store at most every few seconds and is kept up to date locally in
    /// between, so it is exact on one node and close with replicas.
    pub(crate) async fn admit_session(&self, principal: &str) -> Result<(), EngineError> {
        const RECOUNT_MS: i64 = 5_000;
        let now = now_ms();
        let cached = self.cache.principal_counts.lock().get(principal).copied();
        let count = match cached {
            Some((count, at)) if now - at < RECOUNT_MS => count,
            _ => self.store.count_sessions(principal, now).await?,
        };
        let max = self.config.max_sessions_per_principal as u64;
        if count >= max {
            return Err(EngineError::TooMany(format!(
                "this principal already has {count} live sessions (limit {max}); end some with DELETE or let them expire"
            )));
        }
        let at = match cached {
            Some((_, at)) if now - at < RECOUNT_MS => at,
            _ => now,
        };
        let mut m = self.cache.principal_counts.lock();
        m.insert(principal.to_owned(), (count + 1, at));
        if m.len() > 100_000 {
            m.clear();
        }
        Ok(())
    }

    /// Forgets and deletes a session (DELETE or expiry).
    pub(crate) async fn end_session(self: &Arc<Self>, session: &Arc<Session>, reason: EndReason) -> Result<(), EngineError> {
        session.closed.cancel();
        if let Some(entry) = self.cache.principal_counts.lock().get_mut(&session.principal) {
            entry.0 = entry.0.saturating_sub(1);
        }
        session.inflight.lock().values().for_each(tokio_util::sync::CancellationToken::cancel);
        self.cache.sessions.lock().remove(&session.id);
        self.store.delete_session(&session.id).await?;
        self.ended(vec![session.clone()], reason);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    #[test]
    fn a_full_cache_of_busy_sessions_is_scanned_once_per_eighth_of_its_capacity() {
        let (schedule, capacity) = (super::EvictionSchedule::default(), 1024);
        assert!(!schedule.due(1024, capacity), "within capacity: no scan");
        let mut scans = 0;
        // 10,000 sessions that all stay in use: no scan frees anything.
        for len in 1025..=10_000 {
            if schedule.due(len, capacity) {
                scans += 1;
                schedule.scanned(len, capacity);
            }
        }
        assert_eq!(scans, (10_000 - 1025) / 128 + 1, "one scan per 128 insertions, not one per insertion");
        // A scan that frees room brings the threshold back to the capacity.
        schedule.scanned(capacity - capacity / 8, capacity);
        assert!(schedule.due(capacity + 1, capacity));
    }

    use super::*;
    use crate::engine::SessionState;
    use crate::ids;

    fn session(id: &str, last_seen: i64) -> Arc<Session> {
        let state = SessionState {
            client: Arc::new(crate::app::ClientDeclaration {
                protocol_version: "2025-11-25".into(),
                client_info: Value::Null,
                client_capabilities: json!({}),
            }),
            standalone_stream: ids::new_standalone_stream(),
            initialized: true,
            resume_generation: 0,
            app: Map::new(),
            endpoint: String::new(),
        };
        let s = Session::new(id.into(), "p".into(), 0, state, i64::MAX);
        s.last_seen.store(last_seen, Ordering::Relaxed);
        Arc::new(s)
    }

    #[test]
    fn eviction_drops_the_oldest_idle_sessions_and_never_one_in_use() {
        let mut map = HashMap::new();
        let mut held = Vec::new();
        for i in 0..10 {
            let s = session(&format!("s{i}"), i);
            if i < 3 {
                held.push(s.clone()); // in use: a request or pump holds it
            }
            map.insert(s.id.clone(), s);
        }
        let evicted = evict_idle(&mut map, 6);
        assert_eq!(evicted.len(), 4, "the evicted sessions are handed back (the application hears of them)");
        let mut left: Vec<&str> = map.keys().map(String::as_str).collect();
        left.sort();
        assert_eq!(left, ["s0", "s1", "s2", "s7", "s8", "s9"], "oldest idle ones go, held ones stay");

        evict_idle(&mut map, 0);
        let mut left: Vec<&str> = map.keys().map(String::as_str).collect();
        left.sort();
        assert_eq!(left, ["s0", "s1", "s2"], "sessions in use are never dropped");
        drop(held);
    }
}
