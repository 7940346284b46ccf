//! A member's `list_changed`, told once: its lists are read again next
//! time (for every session), the session's client is told once however
//! many members change within [`DEBOUNCE`], and so are the virtual
//! server's listen streams.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tether_server::SessionCtx;
use tokio::sync::broadcast;

use crate::link::ListChanges;
use crate::member_lists::MemberLists;
use crate::slot::Members;

/// How long `list_changed` notifications of members are gathered into one.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The lists a client sees `list_changed` for when a member goes or comes.
pub(super) const LISTS: [&str; 3] =
    ["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"];

/// Tells the session's client `method` (a `list_changed`) once within
/// [`DEBOUNCE`], however often it is asked meanwhile.
pub(super) fn tell(session: &SessionCtx, members: &Arc<Members>, method: &str) {
    if !members.pending.lock().insert(method.to_owned()) {
        return;
    }
    let (task_session, members, method) = (session.clone(), members.clone(), method.to_owned());
    session.spawn(async move {
        tokio::time::sleep(DEBOUNCE).await;
        members.pending.lock().remove(&method);
        if let Err(e) = task_session.notify(&method, None).await {
            tracing::debug!(session = task_session.session_id(), %method, error = %e.message, "list_changed not delivered");
        }
    });
}

/// The list changes of a virtual server for its listen streams: each
/// method goes out once within [`DEBOUNCE`], however often it comes.
pub(super) struct Changes {
    pub(super) sender: broadcast::Sender<String>,
    pub(super) pending: parking_lot::Mutex<HashSet<String>>,
}

impl Changes {
    pub(super) fn publish(self: &Arc<Self>, method: &str) {
        if self.sender.receiver_count() == 0 || !self.pending.lock().insert(method.to_owned()) {
            return;
        }
        let (changes, method) = (self.clone(), method.to_owned());
        // At most one per list method at a time, ending after DEBOUNCE.
        tokio::spawn(async move {
            tokio::time::sleep(DEBOUNCE).await;
            changes.pending.lock().remove(&method);
            let _ = changes.sender.send(method);
        });
    }
}

/// Where a member's `list_changed` go: its lists are read again next time
/// (for every session), the session's client is told once, and so are the
/// listen streams.
pub(super) struct Relay {
    pub(super) changes: Arc<Changes>,
    pub(super) lists: Arc<MemberLists>,
    pub(super) member: usize,
}

impl ListChanges for Relay {
    fn changed<'a>(&'a self, session: &'a SessionCtx, method: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.lists.changed(self.member);
            tell(session, &session.local::<Members>(), method);
            self.changes.publish(method);
        })
    }
}
