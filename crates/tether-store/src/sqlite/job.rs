//! What one caller asks of a group commit: its work, how that work is undone
//! alone when it fails (a savepoint of its own), and how its caller is
//! answered once the commit's outcome is known.
//!
//! The writer ([`super::writer`]) only sees [`Job`]s, so a write whose
//! caller waits ([`SqliteDb::write`](super::SqliteDb::write)) and one whose
//! caller goes on ([`SqliteDb::write_deferred`](super::SqliteDb::write_deferred))
//! share one queue and one commit.

use tokio::sync::oneshot;

use super::WriterCtx;
use crate::{StoreError, StoreResult};

/// One caller's work in a group commit.
pub(super) trait Job: Send {
    /// Runs the work in the open transaction; `isolated` wraps it in its own
    /// savepoint. `false` when it failed (its changes must be undone).
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool;
    /// Answers the caller once the commit's outcome is known.
    fn complete(self: Box<Self>, commit: StoreResult<()>);
}

pub(super) struct WriteJob<T, F> {
    pub(super) work: F,
    pub(super) result: Option<StoreResult<T>>,
    pub(super) answer: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for WriteJob<T, F>
where
    T: Send,
    F: FnMut(&mut WriterCtx) -> StoreResult<T> + Send,
{
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool {
        let result = if isolated { run_in_savepoint(ctx, &mut self.work) } else { (self.work)(ctx) };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn complete(self: Box<Self>, commit: StoreResult<()>) {
        let result = self.result.unwrap_or_else(|| Err(StoreError::Backend("the write did not run".into())));
        let _ = self.answer.send(commit.and(result));
    }
}

/// A write whose caller does not wait for its commit ([`SqliteDb::write_deferred`](super::SqliteDb::write_deferred)).
pub(super) struct DeferredJob<F> {
    pub(super) work: F,
    pub(super) ticket: crate::fence::Ticket,
    pub(super) on_failure: Option<Box<dyn FnOnce() + Send>>,
}

impl<F> Job for DeferredJob<F>
where
    F: FnMut(&mut WriterCtx) -> StoreResult<()> + Send,
{
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool {
        let result = if isolated { run_in_savepoint(ctx, &mut self.work) } else { (self.work)(ctx) };
        if let Err(e) = &result {
            tracing::error!(error = %e, "a deferred write failed; the response that depends on it is not stored");
        }
        self.ticket.ran(result.is_ok());
        result.is_ok()
    }

    fn complete(self: Box<Self>, commit: StoreResult<()>) {
        if let Err(e) = &commit {
            tracing::error!(error = %e, "the commit of a deferred write failed");
        }
        let ok = commit.is_ok() && crate::fence::check(std::slice::from_ref(&self.ticket)).is_ok();
        self.ticket.committed(ok);
        if !ok && let Some(on_failure) = self.on_failure {
            on_failure();
        }
    }
}

fn run_in_savepoint<T>(ctx: &mut WriterCtx, f: &mut impl FnMut(&mut WriterCtx) -> StoreResult<T>) -> StoreResult<T> {
    ctx.conn.prepare_cached("SAVEPOINT job")?.execute([])?;
    match f(ctx) {
        Ok(v) => {
            ctx.conn.prepare_cached("RELEASE job")?.execute([])?;
            Ok(v)
        }
        Err(e) => {
            // The job's cached sequence numbers may be ahead of its rolled-back rows.
            ctx.seqs.clear();
            let _ = ctx.conn.execute_batch("ROLLBACK TO job; RELEASE job");
            Err(e)
        }
    }
}
