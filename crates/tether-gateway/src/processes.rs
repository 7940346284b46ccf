//! [`Processes`]: the hard cap on one command upstream's live children.
//!
//! A child is started only with a [`ProcessPermit`], and the permit is held
//! by the child's supervisor until the child has been reaped: the number of
//! live children can never pass `max_processes`, however many sessions,
//! sessionless requests and tasks want one, and one principal never holds
//! more than `max_processes_per_principal`. A request that finds no room
//! asks the gateway to stop an idle child (once), then waits for a permit
//! up to `process_queue_timeout`, then is refused with
//! [`RpcError::limit_reached`] naming the limit.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
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
        self.processes.released.notify_waiters();
    }
}

impl Processes {
    pub fn new(upstream: &str, max: usize, per_principal: usize, queue_timeout: Duration) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            upstream: upstream.to_owned(),
            max,
            per_principal: per_principal.clamp(1, max),
            queue_timeout,
            state: Mutex::default(),
            released: Notify::new(),
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
        if held >= self.per_principal {
            return Err(Limit::Principal);
        }
        counts.live += 1;
        counts.by_principal.insert(principal.to_owned(), held + 1);
        Ok(ProcessPermit { processes: self.clone(), principal: principal.to_owned() })
    }

    /// A permit for `principal`: at once if there is room; else after
    /// `make_room` (asked once, told which limit was met) stopped an idle
    /// child; else the first one freed within the queue timeout.
    pub async fn take<F, Fut>(self: &Arc<Self>, principal: &str, make_room: F) -> Result<ProcessPermit, RpcError>
    where
        F: FnOnce(Limit) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut limit = match self.try_take(principal) {
            Ok(permit) => return Ok(permit),
            Err(limit) => limit,
        };
        make_room(limit).await;
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_take(principal) {
                Ok(permit) => return Ok(permit),
                Err(met) => limit = met,
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(self.refusal(limit));
            }
        }
    }

    fn refusal(&self, limit: Limit) -> RpcError {
        tether_server::metrics::upstream_process_refused(&self.upstream);
        let (name, max, what) = match limit {
            Limit::Total => ("max_processes", self.max, "live children, none idle"),
            Limit::Principal => ("max_processes_per_principal", self.per_principal, "children held by this principal, none idle"),
        };
        let wait = humantime::format_duration(self.queue_timeout);
        let message = format!(
            "upstream {} is at its {name} limit ({max} {what}) and none was freed within {wait}; try again when a call has finished, or raise {name} in [upstreams.{}]",
            self.upstream, self.upstream
        );
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
}
