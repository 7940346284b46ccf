//! [`Burst`]: logging a run of like lines (an upstream's stderr, its
//! unreadable output) without letting a chatty or hostile upstream flood
//! tether's log: at most so many lines per window, then one summary line
//! saying how many were left out.

use std::time::{Duration, Instant};

/// A budget of log lines per window.
#[derive(Debug)]
pub(crate) struct Burst {
    per_window: u32,
    window: Duration,
    started: Option<Instant>,
    logged: u32,
    left_out: u64,
}

/// What to do with one more line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Log it; `left_out` lines were dropped since the last one logged.
    Log { left_out: u64 },
    /// Over the budget: drop it (it is counted for the next summary).
    Drop,
}

impl Burst {
    pub(crate) fn new(per_window: u32, window: Duration) -> Self {
        Self { per_window, window, started: None, logged: 0, left_out: 0 }
    }

    pub(crate) fn admit(&mut self) -> Admit {
        self.admit_at(Instant::now())
    }

    fn admit_at(&mut self, now: Instant) -> Admit {
        let window_over = self.started.is_none_or(|at| now.duration_since(at) >= self.window);
        if window_over {
            self.started = Some(now);
            self.logged = 0;
        }
        if self.logged >= self.per_window {
            self.left_out += 1;
            return Admit::Drop;
        }
        self.logged += 1;
        Admit::Log { left_out: std::mem::take(&mut self.left_out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_to_its_budget_and_the_next_window_says_how_many_were_left_out() {
        let mut burst = Burst::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(burst.admit_at(t0), Admit::Log { left_out: 0 });
        assert_eq!(burst.admit_at(t0), Admit::Log { left_out: 0 });
        for _ in 0..5 {
            assert_eq!(burst.admit_at(t0 + Duration::from_secs(1)), Admit::Drop);
        }
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(10)), Admit::Log { left_out: 5 });
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(11)), Admit::Log { left_out: 0 });
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(12)), Admit::Drop);
    }
}
