//! stdio framing: newline-delimited JSON-RPC messages, one per line, with a
//! bounded line length.
//!
//! Reading is `tether_wire::ndjson`'s, which never buffers more than the
//! limit: an over-long line is skipped to its end and reported as such, with
//! its head and tail to answer it by its id. Writing puts one compact JSON message per
//! line (serde_json escapes every newline inside strings) and flushes, so
//! nothing but JSON-RPC reaches stdout.
//!
//! Both directions run on their own plain threads and talk to the bridge
//! through bounded channels: a blocking read of stdin can never be
//! cancelled, and on a runtime's blocking pool it would keep the process
//! from exiting after a signal.

use std::io::{BufRead, Write};

use serde_json::Value;
use tether_wire::ndjson::{Line, LineDecoder, read_line_blocking};
use tokio::sync::{mpsc, oneshot};

/// Default bound on one incoming line (the same as the server's body limit).
pub const DEFAULT_MAX_LINE: usize = 4 * 1024 * 1024;
/// Lines read ahead of the bridge at most.
const READ_AHEAD: usize = 16;
/// Messages queued for the host at most.
const WRITE_QUEUE: usize = 256;

/// Writes one message as one line and flushes.
pub fn write_message<W: Write>(out: &mut W, message: &Value) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    out.write_all(&bytes)?;
    out.flush()
}

/// Reads lines on a thread; the channel closes at the end of input (or on a
/// read error, which is logged) and the thread ends when the receiver is gone.
pub fn spawn_reader<R: BufRead + Send + 'static>(input: R, max: usize) -> mpsc::Receiver<Line> {
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    let spawned = std::thread::Builder::new().name("bridge-stdin".into()).spawn(move || {
        let (mut input, mut decoder) = (input, LineDecoder::new(max));
        loop {
            match read_line_blocking(&mut input, &mut decoder) {
                Ok(Some(line)) => {
                    if tx.blocking_send(line).is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("reading stdin failed: {e}");
                    return;
                }
            }
        }
    });
    if let Err(e) = spawned {
        // The receiver sees a closed channel: the bridge ends as on end of input.
        tracing::error!("cannot start the stdin reader: {e}");
    }
    rx
}

/// What the bridge hands the writer thread.
#[derive(Debug)]
pub enum Outgoing {
    Message(Value),
    /// Everything queued before this is written; then the thread ends.
    Close,
}

/// The writer thread's queue, and a signal that fires when it has ended
/// (after `Close`, when every sender is gone, or when the host stopped
/// reading: a write error).
pub fn spawn_writer<W: Write + Send + 'static>(mut output: W) -> (mpsc::Sender<Outgoing>, oneshot::Receiver<()>) {
    let (tx, mut rx) = mpsc::channel::<Outgoing>(WRITE_QUEUE);
    let (done_tx, done_rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("bridge-stdout".into()).spawn(move || {
        while let Some(Outgoing::Message(message)) = rx.blocking_recv() {
            if let Err(e) = write_message(&mut output, &message) {
                tracing::warn!("writing to stdout failed: {e}");
                break;
            }
        }
        let _ = done_tx.send(());
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the stdout writer: {e}");
    }
    (tx, done_rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(s: &str) -> Line {
        Line::Text(s.as_bytes().to_vec())
    }

    #[test]
    fn messages_are_one_line_each() {
        let mut out = Vec::new();
        write_message(&mut out, &json!({"jsonrpc": "2.0", "method": "x", "params": {"text": "a\nb\r\nc"}})).unwrap();
        write_message(&mut out, &json!({"id": 1})).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 2);
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["params"]["text"], "a\nb\r\nc");
    }

    #[tokio::test]
    async fn the_threads_deliver_lines_and_write_until_close() {
        let mut rx = spawn_reader(std::io::Cursor::new(b"one\ntwo\n".to_vec()), 100);
        assert_eq!(rx.recv().await, Some(text("one")));
        assert_eq!(rx.recv().await, Some(text("two")));
        assert_eq!(rx.recv().await, None, "end of input closes the channel");

        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Shared::default();
        let (tx, done) = spawn_writer(sink.clone());
        tx.send(Outgoing::Message(json!({"id": 1}))).await.unwrap();
        tx.send(Outgoing::Message(json!({"id": 2}))).await.unwrap();
        tx.send(Outgoing::Close).await.unwrap();
        done.await.unwrap();
        assert_eq!(String::from_utf8(sink.0.lock().clone()).unwrap(), "{\"id\":1}\n{\"id\":2}\n");
    }
}
