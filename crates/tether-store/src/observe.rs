//! A hook for whoever wants to see the store at work (the server's
//! Prometheus metrics): group commits with their duration and size, and
//! backend errors. The store does not know who listens; without a hook
//! installed nothing is measured (not even the clock is read).

use std::sync::OnceLock;
use std::time::Duration;

/// What the store reports. Called on the committing task: keep it cheap
/// (atomic increments).
pub trait StoreObserver: Send + Sync + 'static {
    /// A group commit of `batch` jobs finished (successfully or not) after `took`.
    fn commit(&self, took: Duration, batch: usize);
    /// A backend operation failed (a commit, a Redis call).
    fn error(&self);
}

static OBSERVER: OnceLock<Box<dyn StoreObserver>> = OnceLock::new();

/// Installs the process's observer; the first one stays (later calls return false).
pub fn install(observer: Box<dyn StoreObserver>) -> bool {
    OBSERVER.set(observer).is_ok()
}

pub(crate) fn observer() -> Option<&'static dyn StoreObserver> {
    OBSERVER.get().map(|b| b.as_ref())
}

/// Reports a backend error to the observer, if any.
pub(crate) fn error() {
    if let Some(o) = observer() {
        o.error();
    }
}
