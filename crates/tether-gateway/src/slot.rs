//! [`Slot`]: where one upstream's part of a tether session lives. An
//! upstream served alone at `/mcp/NAME` has the session to itself: its
//! [`Link`] is the session's local state and its durable part is the
//! `upstream` of the session's [`SessionState`]. A member of a virtual
//! server shares the session with the other members: each has its link in
//! the session's [`Members`] and its durable part under its name in the
//! state's `members`, so the members' upstream sessions are held, stored
//! and recovered one by one.
//!
//! [`SessionState`]: crate::state::SessionState

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tether_server::{Initialize, SessionCtx, SessionEnd};

use crate::link::Link;

/// Where a gateway keeps its part of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The only upstream of its endpoint.
    Alone,
    /// The member of this name of a virtual server.
    Member(String),
}

/// A virtual server's part of one session (its local state): the members'
/// links, which members its client last saw down, and what is waiting to be told.
#[derive(Default)]
pub(crate) struct Members {
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// The members (by index) down at the last look (`None`: no look yet),
    /// so that one going down or coming back is told with `list_changed`.
    pub down: Mutex<Option<Vec<usize>>>,
    /// `list_changed` notifications waiting to go out (one per method).
    pub pending: Mutex<HashSet<String>>,
}

impl Members {
    fn link(&self, member: &str) -> Arc<Link> {
        self.links.lock().entry(member.to_owned()).or_default().clone()
    }

    fn get(&self, member: &str) -> Option<Arc<Link>> {
        self.links.lock().get(member).cloned()
    }
}

impl Slot {
    /// The session's link of this part (a fresh one if it had none).
    pub fn link(&self, session: &SessionCtx) -> Arc<Link> {
        match self {
            Slot::Alone => session.local::<Link>(),
            Slot::Member(name) => session.local::<Members>().link(name),
        }
    }

    /// The link of this part an `initialize` gives its new session.
    pub fn link_for(&self, init: &mut Initialize<'_>) -> Arc<Link> {
        match self {
            Slot::Alone => {
                let link = Arc::new(Link::default());
                init.set_local(link.clone());
                link
            }
            Slot::Member(name) => init.local::<Members>().link(name),
        }
    }

    /// The link of this part of a session that left this process, if any.
    pub fn ended_link(&self, ended: &SessionEnd) -> Option<Arc<Link>> {
        match self {
            Slot::Alone => ended.local::<Link>(),
            Slot::Member(name) => ended.local::<Members>()?.get(name),
        }
    }

    /// Whether a session's local state holds a live connection of this part.
    pub fn is_connected(&self, local: &(dyn std::any::Any + Send + Sync)) -> bool {
        match self {
            Slot::Alone => local.downcast_ref::<Link>().is_some_and(Link::has_live),
            Slot::Member(name) => local.downcast_ref::<Members>().and_then(|m| m.get(name)).is_some_and(|l| l.has_live()),
        }
    }
}
