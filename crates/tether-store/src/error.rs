//! The one error type of the store crate.

/// What a store operation can fail with. Messages are written for operators.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A record that must be new exists already.
    #[error("record already exists: {0}")]
    Conflict(String),
    /// The store cannot be reached or written now (a full disk, Redis
    /// down); trying again later may work.
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    /// The backend refused an operation.
    #[error("store backend error: {0}")]
    Backend(String),
    /// What is stored cannot be read as what it should be.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The store's URL or settings are wrong; the message says which.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// Another process holds the SQLite store at this path (its lock file
    /// stayed locked for [`crate::StoreConfig::lock_wait`]).
    #[error("{0} is in use by another tether process; stop it or choose another --store path")]
    InUse(String),
    /// A write the request deferred ([`crate::fence`]) failed, so what
    /// depends on it was not stored.
    #[error("{0}")]
    EarlierWriteFailed(String),
}

/// A store operation's outcome.
pub type StoreResult<T> = Result<T, StoreError>;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}
