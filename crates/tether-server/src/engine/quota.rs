//! [`Admission`]: how many of one kind of thing (sessionless requests
//! running, open `subscriptions/listen` streams, tasks running) the server
//! takes at once (its ceiling) and each principal of them ([`Quota`], its
//! share), so that one principal cannot take every slot and leave the
//! others refused.
//!
//! Invariant: a principal's count is the number of live [`Held`] guards it
//! has; the map holds only principals with at least one (a guard's drop
//! removes an entry that reaches zero), so it is bounded by the ceiling.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One kind of thing under a server-wide ceiling and a per-principal share,
/// and the words its refusals use.
pub(crate) struct Admission {
    server: Arc<Semaphore>,
    ceiling: usize,
    share: Arc<Quota>,
    /// What is counted, plural ("sessionless requests").
    noun: &'static str,
    /// "runs" or "holds".
    verb: &'static str,
    /// The config keys of the ceiling and of the share.
    ceiling_key: &'static str,
    share_key: &'static str,
    /// What the principal can do about its share ("close one first").
    remedy: &'static str,
}

/// The room one admitted thing takes (the server's and its principal's),
/// given back when dropped.
pub(crate) struct Admitted {
    _server: OwnedSemaphorePermit,
    _share: Held,
}

/// Why a thing was not admitted: the limit's config key, and a sentence
/// that names it.
pub(crate) enum Refused {
    /// The principal holds its share already (429: its own will end).
    Share(&'static str, String),
    /// The server is at its ceiling (the limit is everyone's).
    Ceiling(&'static str, String),
}

impl Admission {
    pub(crate) fn new(
        noun: &'static str,
        verb: &'static str,
        (ceiling_key, ceiling): (&'static str, usize),
        (share_key, share): (&'static str, usize),
        remedy: &'static str,
    ) -> Self {
        Self {
            server: Arc::new(Semaphore::new(ceiling.max(1))),
            ceiling: ceiling.max(1),
            share: Quota::new(share),
            noun,
            verb,
            ceiling_key,
            share_key,
            remedy,
        }
    }

    /// Room for one more of `principal`'s, or why not.
    pub(crate) fn admit(&self, principal: &str) -> Result<Admitted, Refused> {
        let share = self.share.take(principal).ok_or_else(|| {
            Refused::Share(
                self.share_key,
                format!(
                    "`{principal}` already {} {} {} ({}); {}",
                    self.verb,
                    self.share.limit(),
                    self.noun,
                    self.share_key,
                    self.remedy
                ),
            )
        })?;
        let server = self.server.clone().try_acquire_owned().map_err(|_| {
            Refused::Ceiling(
                self.ceiling_key,
                format!(
                    "this server already {} {} {} ({}); try again shortly",
                    self.verb, self.ceiling, self.noun, self.ceiling_key
                ),
            )
        })?;
        Ok(Admitted { _server: server, _share: share })
    }
}

impl Refused {
    pub(crate) fn message(self) -> String {
        match self {
            Refused::Share(_, m) | Refused::Ceiling(_, m) => m,
        }
    }
}

/// Per-principal counts of one kind, each at most `limit`.
struct Quota {
    limit: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One slot of a principal's quota, given back when dropped.
struct Held {
    quota: Arc<Quota>,
    principal: String,
}

impl Quota {
    fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit: limit.max(1), counts: Mutex::new(HashMap::new()) })
    }

    fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for `principal`, or `None` when it holds `limit` already.
    fn take(self: &Arc<Self>, principal: &str) -> Option<Held> {
        let mut counts = self.counts.lock();
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
        let mut counts = self.quota.counts.lock();
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
        assert!(!quota.counts.lock().contains_key("bob"), "no entry for a principal holding nothing");
    }

    #[test]
    fn the_ceiling_holds_over_every_principal_and_a_refusal_names_its_limit() {
        let admission = Admission::new("things", "holds", ("max_things", 3), ("max_things_per_principal", 2), "drop one");
        let _a = [admission.admit("alice").ok().unwrap(), admission.admit("alice").ok().unwrap()];
        match admission.admit("alice") {
            Err(Refused::Share("max_things_per_principal", m)) => {
                assert!(m.contains("max_things_per_principal") && m.contains("drop one"), "{m}")
            }
            _ => panic!("alice is over her share"),
        }
        let _b = admission.admit("bob").ok().unwrap();
        match admission.admit("carol") {
            Err(Refused::Ceiling("max_things", m)) => assert!(m.contains("max_things") && m.contains("3 things"), "{m}"),
            _ => panic!("the server is at its ceiling"),
        }
    }
}
