//! Where notebook sessions and thoughts are kept. The trait speaks of
//! sessions and thoughts of one principal; every read and write names the
//! principal, so one principal never sees another's notebook.

pub mod memory;
pub mod redis;
pub mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::thought::{Recorded, ThoughtInput};

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("notebook session {0} not found")]
    NotFound(String),
    #[error("{0}")]
    Storage(String),
}

impl From<tether_store::StoreError> for RepoError {
    fn from(e: tether_store::StoreError) -> Self {
        RepoError::Storage(e.to_string())
    }
}

impl From<::redis::RedisError> for RepoError {
    fn from(e: ::redis::RedisError) -> Self {
        RepoError::Storage(format!("redis: {e}"))
    }
}

impl From<rusqlite::Error> for RepoError {
    fn from(e: rusqlite::Error) -> Self {
        RepoError::Storage(e.to_string())
    }
}

/// A notebook session (one line of reasoning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotebookSession {
    pub id: String,
    pub principal: String,
    pub title: String,
    pub tags: Vec<String>,
    pub mcp_root_uri: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub thought_count: u64,
    pub branch_count: u64,
}

impl NotebookSession {
    pub fn new(principal: &str, title: Option<String>, tags: Vec<String>, root: Option<String>) -> Self {
        let now = tether_store::now_ms();
        let id = hex::encode(rand::random::<[u8; 12]>());
        Self {
            title: title.unwrap_or_else(|| format!("Session {}", &id[..8])),
            id,
            principal: principal.to_owned(),
            tags,
            mcp_root_uri: root,
            created_at_ms: now,
            updated_at_ms: now,
            thought_count: 0,
            branch_count: 0,
        }
    }
}

/// One stored thought.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredThought {
    #[serde(flatten)]
    pub input: ThoughtInput,
    pub recorded_at_ms: i64,
}

#[async_trait]
pub trait NotebookRepo: Send + Sync + 'static {
    async fn create_session(&self, session: &NotebookSession) -> Result<(), RepoError>;

    /// The session if it exists and belongs to `principal`.
    async fn get_session(&self, principal: &str, id: &str) -> Result<Option<NotebookSession>, RepoError>;

    /// Appends a thought (and its branch, if any) and bumps the counters.
    async fn append_thought(&self, principal: &str, session_id: &str, thought: &ThoughtInput) -> Result<Recorded, RepoError>;

    /// All thoughts of a session in the order they were recorded.
    async fn thoughts(&self, principal: &str, session_id: &str) -> Result<Vec<StoredThought>, RepoError>;

    /// The most recently updated session of `principal` bound to `root`
    /// (one indexed lookup).
    async fn latest_for_root(&self, principal: &str, root: &str) -> Result<Option<NotebookSession>, RepoError>;

    /// Sessions of `principal`, most recently updated first, optionally only
    /// those of one root or carrying one tag.
    async fn list_sessions(&self, principal: &str, filter: &SessionFilter) -> Result<Vec<NotebookSession>, RepoError>;

    /// Thoughts of `principal` whose text contains `text` (case-insensitive),
    /// newest sessions first, at most `limit`.
    async fn search(&self, principal: &str, text: &str, limit: usize) -> Result<Vec<SearchHit>, RepoError>;
}

/// What `list_sessions` keeps.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    pub root: Option<String>,
    pub tag: Option<String>,
    pub limit: usize,
}

/// One thought found by `search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchHit {
    pub session_id: String,
    pub session_title: String,
    /// 1-based position of the thought in its session.
    pub index: u64,
    pub thought_number: u64,
    pub thought: String,
}

/// Appends to `hits` the thoughts of `session` whose text contains `needle`
/// (already lowercased); false once `limit` hits are collected.
pub(crate) fn collect_hits(
    session: &NotebookSession,
    thoughts: impl IntoIterator<Item = StoredThought>,
    needle: &str,
    hits: &mut Vec<SearchHit>,
    limit: usize,
) -> bool {
    for (i, t) in thoughts.into_iter().enumerate() {
        if hits.len() >= limit {
            return false;
        }
        if t.input.thought.to_lowercase().contains(needle) {
            hits.push(SearchHit {
                session_id: session.id.clone(),
                session_title: session.title.clone(),
                index: i as u64 + 1,
                thought_number: t.input.thought_number,
                thought: t.input.thought,
            });
        }
    }
    hits.len() < limit
}
