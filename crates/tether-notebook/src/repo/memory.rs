//! Notebook repository in memory (`--store memory`, tests).

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{NotebookRepo, NotebookSession, RepoError, SearchHit, SessionFilter, StoredThought};
use crate::thought::{Recorded, ThoughtInput};

#[derive(Default)]
struct Entry {
    session: Option<NotebookSession>,
    thoughts: Vec<StoredThought>,
    branches: BTreeSet<String>,
}

#[derive(Default)]
pub struct MemoryNotebook {
    entries: Mutex<HashMap<String, Entry>>,
}

impl MemoryNotebook {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl NotebookRepo for MemoryNotebook {
    async fn create_session(&self, session: &NotebookSession) -> Result<(), RepoError> {
        let mut map = self.entries.lock();
        map.insert(session.id.clone(), Entry { session: Some(session.clone()), ..Entry::default() });
        Ok(())
    }

    async fn get_session(&self, principal: &str, id: &str) -> Result<Option<NotebookSession>, RepoError> {
        let map = self.entries.lock();
        Ok(map.get(id).and_then(|e| e.session.clone()).filter(|s| s.principal == principal))
    }

    async fn append_thought(&self, principal: &str, session_id: &str, thought: &ThoughtInput) -> Result<Recorded, RepoError> {
        let mut map = self.entries.lock();
        let entry = map
            .get_mut(session_id)
            .filter(|e| e.session.as_ref().is_some_and(|s| s.principal == principal))
            .ok_or_else(|| RepoError::NotFound(session_id.to_owned()))?;
        let now = tether_store::now_ms();
        entry.thoughts.push(StoredThought { input: thought.clone(), recorded_at_ms: now });
        if let Some((branch, _)) = thought.branch() {
            entry.branches.insert(branch.to_owned());
        }
        let (count, branches) = (entry.thoughts.len() as u64, entry.branches.iter().cloned().collect::<Vec<_>>());
        if let Some(s) = entry.session.as_mut() {
            s.thought_count = count;
            s.branch_count = branches.len() as u64;
            s.updated_at_ms = now;
        }
        Ok(Recorded { thought_history_length: count, branches })
    }

    async fn thoughts(&self, principal: &str, session_id: &str) -> Result<Vec<StoredThought>, RepoError> {
        let map = self.entries.lock();
        Ok(map
            .get(session_id)
            .filter(|e| e.session.as_ref().is_some_and(|s| s.principal == principal))
            .map(|e| e.thoughts.clone())
            .unwrap_or_default())
    }

    async fn latest_for_root(&self, principal: &str, root: &str) -> Result<Option<NotebookSession>, RepoError> {
        let filter = SessionFilter { root: Some(root.to_owned()), tag: None, limit: 1 };
        Ok(self.list_sessions(principal, &filter).await?.into_iter().next())
    }

    async fn list_sessions(&self, principal: &str, filter: &SessionFilter) -> Result<Vec<NotebookSession>, RepoError> {
        let map = self.entries.lock();
        let mut out: Vec<NotebookSession> = map
            .values()
            .filter_map(|e| e.session.clone())
            .filter(|s| s.principal == principal)
            .filter(|s| filter.root.as_ref().is_none_or(|r| s.mcp_root_uri.as_ref() == Some(r)))
            .filter(|s| filter.tag.as_ref().is_none_or(|t| s.tags.contains(t)))
            .collect();
        out.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then_with(|| b.id.cmp(&a.id)));
        out.truncate(filter.limit);
        Ok(out)
    }

    async fn search(&self, principal: &str, text: &str, limit: usize) -> Result<Vec<SearchHit>, RepoError> {
        let needle = text.to_lowercase();
        let map = self.entries.lock();
        let mut sessions: Vec<&Entry> =
            map.values().filter(|e| e.session.as_ref().is_some_and(|s| s.principal == principal)).collect();
        sessions.sort_by_key(|e| std::cmp::Reverse(e.session.as_ref().map(|s| s.updated_at_ms)));
        let mut hits = Vec::new();
        for entry in sessions {
            let Some(session) = &entry.session else { continue };
            if !super::collect_hits(session, entry.thoughts.iter().cloned(), &needle, &mut hits, limit) {
                break;
            }
        }
        Ok(hits)
    }
}
