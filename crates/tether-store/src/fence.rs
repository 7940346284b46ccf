//! Writes a request queues without waiting for their commit, and the check
//! that keeps the request's response from being stored if one of them failed.
//!
//! The notebook's SQLite repository queues a thought and answers at once;
//! the response's events are appended right after through the same writer,
//! so both usually share one group commit (one wait instead of two). "Stored
//! before seen" still holds: the response is seen only after its own commit,
//! which is the thought's or a later one. If the thought's write failed, the
//! append that carries the response fails with
//! [`StoreError::EarlierWriteFailed`]
//! instead of claiming success.
//!
//! The scope is a tokio task-local: the engine runs each request in
//! [`scope`]. Outside one, nothing can be deferred ([`in_scope`]). An
//! answer that is not stored (a sessionless request's) waits for
//! [`committed`] instead: what it claims is in the store before it leaves.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::{StoreError, StoreResult};

tokio::task_local! {
    static PENDING: RefCell<Vec<Ticket>>;
}

const QUEUED: u8 = 0;
const RAN: u8 = 1;
const FAILED: u8 = 2;
const COMMITTED: u8 = 3;

/// How long [`committed`] waits for the writer before it gives up.
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What became of one deferred write.
#[derive(Clone, Debug, Default)]
pub struct Ticket(Arc<TicketState>);

#[derive(Debug, Default)]
struct TicketState {
    state: AtomicU8,
    /// Woken when the commit's outcome is known.
    settled: tokio::sync::Notify,
}

impl Ticket {
    /// The write ran inside the open transaction (not yet committed).
    pub(crate) fn ran(&self, ok: bool) {
        self.0.state.store(if ok { RAN } else { FAILED }, Ordering::Release);
    }

    /// The transaction's outcome; a write that failed stays failed.
    pub(crate) fn committed(&self, ok: bool) {
        let ok = ok && self.0.state.load(Ordering::Acquire) == RAN;
        self.0.state.store(if ok { COMMITTED } else { FAILED }, Ordering::Release);
        self.0.settled.notify_waiters();
    }

    /// Whether something stored after this write may rely on it. Called on
    /// the writer, after the write's own job (the queue is FIFO): it has
    /// run in this transaction or was committed in an earlier one.
    fn holds(&self) -> bool {
        matches!(self.0.state.load(Ordering::Acquire), RAN | COMMITTED)
    }

    /// Waits for the commit's outcome.
    async fn settled(&self) -> StoreResult<()> {
        loop {
            let notified = self.0.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.0.state.load(Ordering::Acquire) {
                COMMITTED => return Ok(()),
                QUEUED | RAN => notified.await,
                _ => return Err(StoreError::EarlierWriteFailed("a write this request made failed".into())),
            }
        }
    }
}

/// Waits until every write the current task deferred is committed (and
/// forgets them): for an answer that is not stored, so it cannot follow
/// them through the writer. Fails if one of them failed or the writer did
/// not settle them in time.
pub async fn committed() -> StoreResult<()> {
    for ticket in pending(true) {
        match tokio::time::timeout(COMMIT_WAIT, ticket.settled()).await {
            Ok(settled) => settled?,
            Err(_) => return Err(StoreError::Backend("the store did not confirm a write in time".into())),
        }
    }
    Ok(())
}

/// Runs `f` with a fresh set of deferred writes (one request).
pub async fn scope<F: Future>(f: F) -> F::Output {
    PENDING.scope(RefCell::new(Vec::new()), f).await
}

/// Whether the current task can defer writes.
pub fn in_scope() -> bool {
    PENDING.try_with(|_| ()).is_ok()
}

/// Records a deferred write of the current task; false outside a scope.
pub(crate) fn push(ticket: Ticket) -> bool {
    PENDING.try_with(|p| p.borrow_mut().push(ticket)).is_ok()
}

/// The deferred writes the current task's next append depends on. An
/// append that stores a final response `take`s them (the response was the
/// last thing that relied on them); any other append checks them and leaves
/// them for the response.
pub(crate) fn pending(take: bool) -> Vec<Ticket> {
    PENDING.try_with(|p| if take { std::mem::take(&mut *p.borrow_mut()) } else { p.borrow().clone() }).unwrap_or_default()
}

/// On the writer: fails if a write these depend on failed.
pub(crate) fn check(tickets: &[Ticket]) -> StoreResult<()> {
    if tickets.iter().all(Ticket::holds) {
        Ok(())
    } else {
        Err(StoreError::EarlierWriteFailed("a write this request made before its response failed".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_holds_only_after_its_write_ran_and_until_its_commit_fails() {
        let t = Ticket::default();
        assert!(check(std::slice::from_ref(&t)).is_err(), "queued, not run: nothing may rely on it");
        t.ran(true);
        assert!(check(std::slice::from_ref(&t)).is_ok());
        t.committed(false);
        assert!(matches!(check(&[t]), Err(StoreError::EarlierWriteFailed(_))));
        let failed = Ticket::default();
        failed.ran(false);
        failed.committed(true);
        assert!(check(&[failed]).is_err(), "a write that failed stays failed when the rest commits");
    }

    #[tokio::test]
    async fn committed_waits_for_every_deferred_write_and_fails_with_one() {
        scope(async {
            let t = Ticket::default();
            assert!(push(t.clone()));
            let writer = tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                t.ran(true);
                t.committed(true);
            });
            committed().await.expect("committed");
            writer.await.unwrap();
            let failed = Ticket::default();
            assert!(push(failed.clone()));
            failed.ran(false);
            failed.committed(true);
            assert!(matches!(committed().await, Err(StoreError::EarlierWriteFailed(_))));
            assert!(committed().await.is_ok(), "nothing left to wait for");
        })
        .await;
    }

    #[tokio::test]
    async fn deferred_writes_belong_to_their_task_and_the_final_append_takes_them() {
        assert!(!in_scope());
        assert!(!push(Ticket::default()), "nothing can be deferred outside a scope");
        scope(async {
            assert!(push(Ticket::default()));
            assert_eq!(pending(false).len(), 1, "a non-final append leaves them");
            assert_eq!(pending(true).len(), 1);
            assert!(pending(true).is_empty(), "the final append took them");
        })
        .await;
    }
}
