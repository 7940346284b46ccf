//! [`Quota`]: how many of one kind of thing (sessionless requests running,
//! open `subscriptions/listen` streams) each principal may hold at once,
//! under the server-wide ceiling, so that one principal cannot take every
//! slot and leave the others 429s.
//!
//! Invariant: a principal's count is the number of live [`Held`] guards it
//! has; the map holds only principals with at least one (a guard's drop
//! removes an entry that reaches zero), so it is bounded by the ceiling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Per-principal counts of one kind, each at most `limit`.
pub(crate) struct Quota {
    limit: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One slot of a principal's quota, given back when dropped.
pub(crate) struct Held {
    quota: Arc<Quota>,
    principal: String,
}

impl Quota {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit: limit.max(1), counts: Mutex::new(HashMap::new()) })
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for `principal`, or `None` when it holds `limit` already.
    pub(crate) fn take(self: &Arc<Self>, principal: &str) -> Option<Held> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(principal.to_owned()).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Held { quota: self.clone(), principal: principal.to_owned() })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.quota.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_its_own_slots_and_gets_them_back() {
        let quota = Quota::new(2);
        let a1 = quota.take("alice").unwrap();
        let _a2 = quota.take("alice").unwrap();
        assert!(quota.take("alice").is_none(), "alice holds her two");
        let b = quota.take("bob").expect("bob is not held back by alice");
        drop(a1);
        assert!(quota.take("alice").is_some(), "a slot given back is taken again");
        drop(b);
        assert!(!quota.counts.lock().unwrap().contains_key("bob"), "no entry for a principal holding nothing");
    }
}
