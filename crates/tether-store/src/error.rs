//! The one error type of the store crate.

/// What a store operation can fail with. Messages are written for operators.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("record already exists: {0}")]
    Conflict(String),
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    #[error("store backend error: {0}")]
    Backend(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A write the request deferred ([`crate::fence`]) failed, so what
    /// depends on it was not stored.
    #[error("{0}")]
    EarlierWriteFailed(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}
