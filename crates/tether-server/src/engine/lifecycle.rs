//! The engine's lifecycle: every task it starts, and the two moments of its
//! end.
//!
//! Invariant: no engine task runs untracked, so [`Lifecycle::drain`] can
//! wait for all of them. Shutdown has two steps: `shutdown` is cancelled
//! first (streams close, no new work is taken), and `interrupt` only once
//! the drain timeout has passed (work still running then ends as
//! interrupted and stores that answer). The drain runs once; later calls
//! wait for the first.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// After the interruption: how long the interrupted work gets to store its answers.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(crate) struct Lifecycle {
    /// Cancelled when shutdown starts: streams close, no new work is taken.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the drain timeout passed: work still running ends as interrupted.
    pub(crate) interrupt: CancellationToken,
    /// Every task the engine started (requests, pumps, handlers, upkeep).
    tasks: TaskTracker,
    /// Set once the drain has run.
    drained: tokio::sync::OnceCell<()>,
}

impl Lifecycle {
    /// Runs `task` tracked, so shutdown can wait for it.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// [`Lifecycle::spawn`] of a request's work, in the current span (its
    /// JSON-RPC span) when spans are on (`crate::trace`).
    pub(crate) fn spawn_request<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if crate::trace::enabled() {
            self.tasks.spawn(task.in_current_span());
        } else {
            self.tasks.spawn(task);
        }
    }

    /// Runs `rest` (what follows the tasks' end: the applications, the
    /// store) after the tasks were drained, once; later calls wait for the first.
    pub(crate) async fn drain_once<F: Future<Output = ()>>(&self, drain_timeout: Duration, rest: F) {
        self.drained
            .get_or_init(|| async move {
                self.stop_tasks(drain_timeout).await;
                rest.await;
            })
            .await;
    }

    /// Stops taking work, gives what runs `drain_timeout` to finish, then
    /// interrupts what is left and gives it [`INTERRUPT_GRACE`] to store
    /// its answers.
    async fn stop_tasks(&self, drain_timeout: Duration) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(drain_timeout, self.tasks.wait()).await.is_err() {
            tracing::warn!(running = self.tasks.len(), "requests still running after the drain timeout end as interrupted");
            self.interrupt.cancel();
            if tokio::time::timeout(INTERRUPT_GRACE, self.tasks.wait()).await.is_err() {
                tracing::warn!(
                    running = self.tasks.len(),
                    "tasks still running at exit; their requests close as interrupted on the next start"
                );
            }
        }
    }
}
