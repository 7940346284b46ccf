//! The read connections: a small pool beside the writer (WAL lets reads run
//! while it commits), so a read neither waits for a commit nor opens a
//! connection of its own.
//!
//! Reads run on the blocking pool: a query may touch the disk, and a
//! runtime worker must not wait for it.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::Connection;

use super::{open_connection, tune};
use crate::{StoreError, StoreResult};

/// Read connections kept open; reads beyond this many at once wait for one
/// (opening a connection per read would cost more than waiting).
const READ_POOL: usize = 8;

/// Idle read connections of one file, opened when first needed.
#[derive(Clone)]
pub(super) struct ReaderPool {
    readers: Arc<Mutex<Vec<Connection>>>,
    read_permits: Arc<tokio::sync::Semaphore>,
    path: Arc<PathBuf>,
}

impl ReaderPool {
    pub(super) fn new(path: Arc<PathBuf>) -> Self {
        Self { readers: Arc::new(Mutex::new(Vec::new())), read_permits: Arc::new(tokio::sync::Semaphore::new(READ_POOL)), path }
    }

    /// Runs `f` on a pooled read connection.
    pub(super) async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let permit = self
            .read_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("sqlite reader pool closed".into()))?;
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = readers.lock().pop();
            let conn = match pooled {
                Some(c) => c,
                None => {
                    let c = open_connection(path.as_path())?;
                    tune(&c)?;
                    c
                }
            };
            let result = f(&conn);
            {
                let mut pool = readers.lock();
                if pool.len() < READ_POOL {
                    pool.push(conn);
                }
            }
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
    }
}
