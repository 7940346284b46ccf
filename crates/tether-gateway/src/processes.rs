//! [`Processes`]: the hard cap on one command upstream's live children, and
//! [`ServerProcesses`]: the ceiling on the live children of every command
//! upstream of this tether process together (`--max-stdio-processes`).
//!
//! A child is started only with a [`ProcessPermit`], and the permit is held
//! by the child's supervisor until the child has been reaped: the number of
//! live children can never pass `max_processes`, however many sessions,
//! sessionless requests and tasks want one; one principal never holds
//! more than `max_processes_per_principal` (but for the anonymous
//! principal of a server without authentication, the only one there is,
//! which may hold them all); and all the upstreams together
//! (however many are configured, and across a SIGHUP reload, where the old
//! upstream's children still count) never pass `max_stdio_processes`. A
//! request that finds no room asks the gateway to stop an idle child of the
//! upstream (once), then waits for a permit up to `process_queue_timeout`,
//! then is refused with [`RpcError::limit_reached`] naming the limit.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;
use tether_wire::RpcError;
use tokio::sync::Notify;

/// Which limit a request met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Every child of the upstream is taken.
    Total,
    /// The principal holds its whole share.
    Principal,
    /// Every child the tether process may run (all upstreams together) is taken.
    Server,
}

/// The default of `--max-stdio-processes`.
pub const DEFAULT_MAX_STDIO_PROCESSES: usize = 1024;

/// The live children of every command upstream of this tether process,
/// counted against one ceiling. One instance serves the process
/// ([`ServerProcesses::global`]); tests make their own.
#[derive(Debug)]
pub struct ServerProcesses {
    max: AtomicUsize,
    live: AtomicUsize,
    released: Notify,
}

static SERVER: LazyLock<Arc<ServerProcesses>> = LazyLock::new(|| ServerProcesses::new(DEFAULT_MAX_STDIO_PROCESSES));

impl ServerProcesses {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max: AtomicUsize::new(max.max(1)), live: AtomicUsize::new(0), released: Notify::new() })
    }

    /// The process's ceiling, which every upstream's [`Processes::new`] counts against.
    pub fn global() -> Arc<Self> {
        SERVER.clone()
    }

    /// Sets the ceiling (at least 1); `tether serve` does, from
    /// `--max-stdio-processes`, before any upstream starts a child.
    pub fn set_max(&self, max: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Children alive now, of every upstream.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// One more child, if there is room.
    fn try_add(&self) -> bool {
        let max = self.max();
        self.live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
    }

    fn remove(&self) {
        let _ = self.live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.released.notify_waiters();
    }
}

/// The live children of one command upstream, counted.
#[derive(Debug)]
pub struct Processes {
    upstream: String,
    max: usize,
    per_principal: usize,
    queue_timeout: Duration,
    state: Mutex<Counts>,
    released: Notify,
    /// The ceiling of all upstreams together.
    server: Arc<ServerProcesses>,
}

#[derive(Debug, Default)]
struct Counts {
    live: usize,
    by_principal: HashMap<String, usize>,
}

/// One live child's place under the cap; dropping it frees the place.
#[derive(Debug)]
pub struct ProcessPermit {
    processes: Arc<Processes>,
    principal: String,
}

impl Drop for ProcessPermit {
    fn drop(&mut self) {
        {
            let mut counts = self.processes.state.lock();
            counts.live = counts.live.saturating_sub(1);
            if let Some(n) = counts.by_principal.get_mut(&self.principal) {
                *n -= 1;
                if *n == 0 {
                    counts.by_principal.remove(&self.principal);
                }
            }
        }
        self.processes.server.remove();
        self.processes.released.notify_waiters();
    }
}

impl Processes {
    /// An upstream's cap, counted against the process's ceiling too.
    pub fn new(upstream: &str, max: usize, per_principal: usize, queue_timeout: Duration) -> Arc<Self> {
        Self::within(upstream, max, per_principal, queue_timeout, ServerProcesses::global())
    }

    /// An upstream's cap under the ceiling `server`.
    pub fn within(
        upstream: &str,
        max: usize,
        per_principal: usize,
        queue_timeout: Duration,
        server: Arc<ServerProcesses>,
    ) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            upstream: upstream.to_owned(),
            max,
            per_principal: per_principal.clamp(1, max),
            queue_timeout,
            state: Mutex::default(),
            released: Notify::new(),
            server,
        })
    }

    /// Children alive now (permits held).
    pub fn live(&self) -> usize {
        self.state.lock().live
    }

    /// A permit for `principal` if there is room now, else the limit met.
    pub fn try_take(self: &Arc<Self>, principal: &str) -> Result<ProcessPermit, Limit> {
        let mut counts = self.state.lock();
        if counts.live >= self.max {
            return Err(Limit::Total);
        }
        let held = counts.by_principal.get(principal).copied().unwrap_or(0);
        if held >= self.per_principal && principal != tether_server::http::ANONYMOUS {
            return Err(Limit::Principal);
        }
        if !self.server.try_add() {
            return Err(Limit::Server);
        }
        counts.live += 1;
        counts.by_principal.insert(principal.to_owned(), held + 1);
        Ok(ProcessPermit { processes: self.clone(), principal: principal.to_owned() })
    }

    /// A permit for `principal`: at once if there is room; else after
    /// `make_room` (asked once, told which limit was met; the server-wide
    /// one as [`Limit::Total`], since any idle child of this upstream frees
    /// a place under it too) stopped an idle child; else the first one
    /// freed (here or, for the server-wide ceiling, by any upstream) within
    /// the queue timeout.
    pub async fn take<F, Fut>(self: &Arc<Self>, principal: &str, make_room: F) -> Result<ProcessPermit, RpcError>
    where
        F: FnOnce(Limit) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut limit = match self.try_take(principal) {
            Ok(permit) => return Ok(permit),
            Err(limit) => limit,
        };
        make_room(if limit == Limit::Server { Limit::Total } else { limit }).await;
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        loop {
            let released = self.released.notified();
            let elsewhere = self.server.released.notified();
            tokio::pin!(released, elsewhere);
            released.as_mut().enable();
            elsewhere.as_mut().enable();
            match self.try_take(principal) {
                Ok(permit) => return Ok(permit),
                Err(met) => limit = met,
            }
            let freed = async {
                tokio::select! {
                    () = released => {}
                    () = elsewhere => {}
                }
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(self.refusal(limit));
            }
        }
    }

    fn refusal(&self, limit: Limit) -> RpcError {
        tether_server::metrics::upstream_process_refused(&self.upstream);
        let wait = humantime::format_duration(self.queue_timeout);
        let upstream = &self.upstream;
        let (name, max, message) = match limit {
            Limit::Total => {
                let max = self.max;
                let message = format!(
                    "upstream {upstream} is at its max_processes limit ({max} live children, none idle) and none was freed within {wait}; try again when a call has finished, or raise max_processes in [upstreams.{upstream}]"
                );
                ("max_processes", max, message)
            }
            Limit::Principal => {
                let max = self.per_principal;
                let message = format!(
                    "upstream {upstream} is at its max_processes_per_principal limit ({max} children held by this principal, none idle) and none was freed within {wait}; try again when a call has finished, or raise max_processes_per_principal in [upstreams.{upstream}]"
                );
                ("max_processes_per_principal", max, message)
            }
            Limit::Server => {
                let max = self.server.max();
                let message = format!(
                    "upstream {upstream} cannot start a child: tether is at its max_stdio_processes limit ({max} live children of all command upstreams together, none of this upstream idle) and none was freed within {wait}; try again when a call has finished, or raise --max-stdio-processes (max_stdio_processes in the config file)"
                );
                ("max_stdio_processes", max, message)
            }
        };
        let data = serde_json::Map::from_iter([("max".into(), json!(max)), ("upstream".into(), json!(self.upstream))]);
        RpcError::limit_reached(name, message, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_wire::code;

    #[tokio::test]
    async fn permits_never_pass_the_caps_and_a_freed_one_goes_to_a_waiter() {
        let processes = Processes::new("fx", 3, 2, Duration::from_secs(30));
        let a1 = processes.try_take("alice").unwrap();
        let _a2 = processes.try_take("alice").unwrap();
        assert_eq!(processes.try_take("alice").unwrap_err(), Limit::Principal);
        let _b1 = processes.try_take("bob").unwrap();
        assert_eq!(processes.try_take("carol").unwrap_err(), Limit::Total);
        assert_eq!(processes.live(), 3);

        // A waiter gets the place freed after it started waiting.
        let waiting = {
            let processes = processes.clone();
            tokio::spawn(async move { processes.take("carol", |_| async {}).await })
        };
        tokio::task::yield_now().await;
        drop(a1);
        let carols = waiting.await.unwrap().unwrap();
        assert_eq!(carols.principal, "carol");
        assert_eq!(processes.live(), 3);
        drop(carols);
        assert_eq!(processes.live(), 2);
    }

    #[test]
    fn without_authentication_the_one_principal_may_hold_every_child() {
        let processes = Processes::new("fx", 3, 1, Duration::from_secs(30));
        let held: Vec<_> = (0..3).map(|_| processes.try_take(tether_server::http::ANONYMOUS).unwrap()).collect();
        assert_eq!(processes.try_take(tether_server::http::ANONYMOUS).unwrap_err(), Limit::Total);
        assert_eq!(held.len(), 3);
    }

    #[tokio::test]
    async fn with_no_room_a_request_is_refused_after_the_queue_timeout_naming_the_limit() {
        let processes = Processes::new("fx", 1, 1, Duration::from_millis(100));
        let _held = processes.try_take("alice").unwrap();
        let mut asked = None;
        let refused = processes
            .take("bob", |limit| {
                asked = Some(limit);
                async {}
            })
            .await
            .unwrap_err();
        assert_eq!(asked, Some(Limit::Total), "make_room was asked, with the limit met");
        assert_eq!(refused.code, code::SERVER_ERROR);
        assert!(refused.message.contains("upstream fx is at its max_processes limit (1 live children"), "{refused:?}");
        assert_eq!(refused.data.unwrap()["limit"], "max_processes");
    }

    #[tokio::test]
    async fn all_upstreams_together_stay_under_the_servers_ceiling_and_a_child_freed_anywhere_goes_to_a_waiter() {
        let server = ServerProcesses::new(2);
        let x = Processes::within("x", 8, 8, Duration::from_secs(30), server.clone());
        let y = Processes::within("y", 8, 8, Duration::from_secs(30), server.clone());
        let x1 = x.try_take("alice").unwrap();
        let _y1 = y.try_take("bob").unwrap();
        assert_eq!(y.try_take("carol").unwrap_err(), Limit::Server, "y has room of its own, the server has none");
        assert_eq!((x.live(), y.live(), server.live()), (1, 1, 2));

        // make_room is asked to stop an idle child of y (any principal's);
        // then the place x frees goes to y's waiter.
        let (asked_tx, asked_rx) = tokio::sync::oneshot::channel();
        let waiting = {
            let y = y.clone();
            tokio::spawn(async move {
                y.take("carol", |limit| {
                    let _ = asked_tx.send(limit);
                    async {}
                })
                .await
            })
        };
        assert_eq!(asked_rx.await.unwrap(), Limit::Total);
        drop(x1);
        let carols = waiting.await.unwrap().unwrap();
        assert_eq!((x.live(), y.live(), server.live()), (0, 2, 2));
        drop(carols);
        assert_eq!(server.live(), 1);
    }

    #[tokio::test]
    async fn with_no_room_under_the_servers_ceiling_the_refusal_names_max_stdio_processes() {
        let server = ServerProcesses::new(1);
        let x = Processes::within("x", 4, 4, Duration::from_secs(30), server.clone());
        let y = Processes::within("y", 4, 4, Duration::from_millis(100), server.clone());
        let _held = x.try_take("alice").unwrap();
        let refused = y.take("bob", |_| async {}).await.unwrap_err();
        assert_eq!(refused.code, code::SERVER_ERROR);
        let data = refused.data.clone().unwrap();
        assert_eq!((data["limit"].as_str(), data["max"].as_u64()), (Some("max_stdio_processes"), Some(1)), "{refused:?}");
        for part in ["upstream y cannot start a child", "max_stdio_processes limit (1 live children", "--max-stdio-processes"] {
            assert!(refused.message.contains(part), "{part:?} in {refused:?}");
        }
        // A refused permit took nothing: the count is the one held.
        assert_eq!((y.live(), server.live()), (0, 1));
        server.set_max(2);
        assert!(y.try_take("bob").is_ok(), "a raised ceiling makes room");
    }
}
