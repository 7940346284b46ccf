//! The backoff of an upstream that keeps failing to start (or to stay up):
//! after [`FAILURES_BEFORE_BACKOFF`] failures within [`FAILURE_WINDOW`], new
//! connections are refused at once with the last error, for a wait that
//! doubles from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]; one success clears it.
//! Shared by an upstream's endpoint and the virtual servers it is a member of.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tether_server::RpcError;

/// A command that fails this often within [`FAILURE_WINDOW`] is backed off.
const FAILURES_BEFORE_BACKOFF: usize = 3;
const FAILURE_WINDOW: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Recent failures of one upstream.
#[derive(Default)]
pub(crate) struct Backoff(Mutex<Failures>);

#[derive(Default)]
struct Failures {
    at: Vec<Instant>,
    blocked_until: Option<Instant>,
    backoff: Option<Duration>,
    last_error: String,
}

impl Backoff {
    /// `Err` (naming the upstream, the wait and the last error) while backed off.
    pub(crate) fn check(&self, upstream: &str) -> Result<(), RpcError> {
        let failures = self.0.lock();
        match failures.blocked_until {
            Some(until) if until > Instant::now() => Err(RpcError::internal(format!(
                "upstream `{upstream}` keeps failing; trying again in {} s. Last error: {}",
                (until - Instant::now()).as_secs() + 1,
                failures.last_error
            ))),
            _ => Ok(()),
        }
    }

    pub(crate) fn failed(&self, upstream: &str, error: &str) {
        let mut failures = self.0.lock();
        let now = Instant::now();
        failures.at.retain(|at| now.duration_since(*at) < FAILURE_WINDOW);
        failures.at.push(now);
        failures.last_error = error.chars().take(500).collect();
        if failures.at.len() >= FAILURES_BEFORE_BACKOFF {
            let next = failures.backoff.map_or(FIRST_BACKOFF, |b| (b * 2).min(MAX_BACKOFF));
            failures.backoff = Some(next);
            failures.blocked_until = Some(now + next);
            tracing::warn!(%upstream, backoff_s = next.as_secs(), error, "upstream keeps failing; backing off");
        }
    }

    pub(crate) fn succeeded(&self) {
        *self.0.lock() = Failures::default();
    }

    /// What operators see (`describe.rs`): failures within the window, how
    /// long new connections are still refused, the last error.
    pub(crate) fn seen(&self) -> (usize, Option<Duration>, Option<String>) {
        let failures = self.0.lock();
        let now = Instant::now();
        let recent = failures.at.iter().filter(|at| now.duration_since(**at) < FAILURE_WINDOW).count();
        let wait = failures.blocked_until.and_then(|until| until.checked_duration_since(now));
        let last = Some(failures.last_error.clone()).filter(|e| !e.is_empty());
        (recent, wait, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_back_off_with_the_last_error_and_a_success_clears_it() {
        let backoff = Backoff::default();
        backoff.failed("x", "first");
        backoff.failed("x", "second");
        assert!(backoff.check("x").is_ok(), "two failures are not yet a pattern");
        backoff.failed("x", "exit status 1");
        let refused = backoff.check("x").unwrap_err();
        assert!(
            refused.message.contains("upstream `x` keeps failing") && refused.message.contains("exit status 1"),
            "{}",
            refused.message
        );
        backoff.succeeded();
        assert!(backoff.check("x").is_ok());
    }
}
