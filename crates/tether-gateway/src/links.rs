//! [`Links`]: the links of every session with a connection to one upstream
//! (shared by the upstream's endpoint and the virtual servers it is a member
//! of), and their upkeep: the idle sweep (`idle_timeout`) and the least
//! recently used idle connection stopped to make room (`max_processes`).
//! A stopped connection's session lives on; its next request starts a new one.
//!
//! The registry holds links weakly: a session that left this process drops
//! out by itself.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::link::Link;
use crate::processes::Limit;

/// How often idle connections are looked for.
const IDLE_SWEEP: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct Links(Mutex<Vec<Weak<Link>>>);

impl Links {
    pub(crate) fn register(&self, link: &Arc<Link>) {
        let mut links = self.0.lock();
        links.retain(|l| l.strong_count() > 0);
        links.push(Arc::downgrade(link));
    }

    /// Every link still held by a session.
    pub(crate) fn live(&self) -> Vec<Arc<Link>> {
        let mut links = self.0.lock();
        links.retain(|l| l.strong_count() > 0);
        links.iter().filter_map(Weak::upgrade).collect()
    }

    /// Stops the least recently used idle connection that frees a place for
    /// `principal` under `limit`; `false` if there was none to stop.
    /// `making` is the link a new connection is being made for (its lock is
    /// held by the caller).
    pub(crate) async fn stop_oldest_idle(&self, limit: Limit, principal: &str, making: Option<&Arc<Link>>) -> bool {
        let counts = |link: &Arc<Link>| limit == Limit::Total || link.principal().as_deref() == Some(principal);
        let oldest = self
            .live()
            .into_iter()
            .filter(|link| making.is_none_or(|m| !Arc::ptr_eq(m, link)) && counts(link) && link.has_live())
            .filter_map(|link| link.idle_for().map(|idle_for| (idle_for, link)))
            .max_by_key(|(idle_for, _)| *idle_for);
        let Some((_, link)) = oldest else { return false };
        let taken = link.live.try_lock().ok().and_then(|mut connection| connection.take());
        let Some(connection) = taken else { return false };
        connection.upstream.close(false).await;
        true
    }
}

/// Stops connections with nothing in flight for `idle` (their sessions live
/// on), until the registry is gone.
pub(crate) async fn sweep_idle(links: Weak<Links>, idle: Duration) {
    let mut tick = tokio::time::interval(IDLE_SWEEP.min(idle));
    loop {
        tick.tick().await;
        let Some(links) = links.upgrade() else { return };
        let candidates: Vec<Arc<Link>> =
            links.live().into_iter().filter(|link| link.idle_for().is_some_and(|d| d >= idle)).collect();
        for link in candidates {
            if let Some(connection) = link.live.lock().await.take() {
                tracing::info!("stopping an idle upstream child (idle_timeout)");
                connection.upstream.close(false).await;
            }
        }
    }
}
