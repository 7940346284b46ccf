//! A child's stderr in tether's log ([`StderrLog`]): each line truncated,
//! at most [`STDERR_LINES_PER_WINDOW`] per [`LOG_WINDOW`], then a count of
//! what was left out; tagged with the upstream and the session; the last
//! one kept for error messages.

use std::sync::Arc;
use std::time::Duration;

use tether_wire::ndjson::{self, Line, LineDecoder};
use tokio::io::BufReader;
use tokio::process::ChildStderr;

use super::shared::{Shared, preview};
use crate::burst::{Admit, Burst};

/// Bytes of one stderr line logged (and read) at most.
const STDERR_LINE_MAX: usize = 2048;
/// Stderr lines logged per [`LOG_WINDOW`] at most.
const STDERR_LINES_PER_WINDOW: u32 = 100;
const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Characters of the last stderr line quoted in error messages.
const LAST_STDERR_MAX: usize = 300;

pub(super) async fn read_stderr(stderr: ChildStderr, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stderr);
    let mut decoder = LineDecoder::new(STDERR_LINE_MAX);
    let mut log = StderrLog::new();
    while let Ok(Some(line)) = ndjson::read_line(&mut reader, &mut decoder).await {
        let text = match line {
            Line::Text(text) => preview(&text, STDERR_LINE_MAX),
            Line::TooLong { len, head, .. } => format!("{} ({len} bytes)", preview(&head, STDERR_LINE_MAX)),
        };
        log.line(&shared, text);
    }
}

/// A child's stderr lines in tether's log: at most
/// [`STDERR_LINES_PER_WINDOW`] per [`LOG_WINDOW`], then a count of what was
/// left out; the last one kept for error messages.
pub(crate) struct StderrLog {
    burst: Burst,
}

impl StderrLog {
    pub(crate) fn new() -> Self {
        Self { burst: Burst::new(STDERR_LINES_PER_WINDOW, LOG_WINDOW) }
    }

    pub(crate) fn bytes(&mut self, shared: &Shared, line: &[u8]) {
        self.line(shared, preview(line, STDERR_LINE_MAX));
    }

    fn line(&mut self, shared: &Shared, text: String) {
        let burst = &mut self.burst;
        match burst.admit() {
            Admit::Log { left_out: 0 } => {
                tracing::info!(upstream = %shared.upstream, session = %shared.session, "stderr: {text}");
            }
            Admit::Log { left_out } => tracing::info!(
                upstream = %shared.upstream,
                session = %shared.session,
                "stderr: {text} (after {left_out} lines left out of this log: more than {STDERR_LINES_PER_WINDOW} in {} s)",
                LOG_WINDOW.as_secs()
            ),
            Admit::Drop => {}
        }
        let last: String = text.chars().take(LAST_STDERR_MAX).collect();
        *shared.last_stderr.lock() = Some(last);
    }
}
