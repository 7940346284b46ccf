//! What a test process logs, kept in memory for the test to read.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

/// Everything this process logs at `level` and above, from the first call
/// on (one subscriber per process: the first call's level holds).
pub fn captured(level: tracing::Level) -> Arc<Mutex<Vec<u8>>> {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(logs.clone());
        let subscriber =
            tracing_subscriber::fmt().with_ansi(false).with_max_level(level).with_writer(move || sink.clone()).finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in a test process");
        logs
    })
    .clone()
}
