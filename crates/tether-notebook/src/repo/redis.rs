//! Notebook repository on Redis, beside the Redis store (same prefix,
//! `nb:` keys). Sessions are hashes; per-principal and per-(principal, root)
//! sorted sets by update time make "most recent session of this root" one
//! `ZREVRANGE … 0 0`. Appending a thought is one Lua script.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P nb:s:{id}` | hash | the session's fields |
//! | `P nb:p:{principal}` | zset | session ids by update time |
//! | `P nb:r:{principal}\n{root}` | zset | session ids of one root by update time |
//! | `P nb:t:{id}` | list | thoughts (JSON) in order |
//! | `P nb:b:{id}` | set | branch ids |

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::{NotebookRepo, NotebookSession, RepoError, SearchHit, SessionFilter, StoredThought};
use crate::thought::{Recorded, ThoughtInput};

const APPEND: &str = r#"
if redis.call('HGET', KEYS[1], 'principal') ~= ARGV[1] then return false end
local n = redis.call('RPUSH', KEYS[2], ARGV[2])
if ARGV[3] ~= '' then redis.call('SADD', KEYS[3], ARGV[3]) end
local bc = redis.call('SCARD', KEYS[3])
redis.call('HSET', KEYS[1], 'thoughts', n, 'branches', bc, 'updated', ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[5])
local root = redis.call('HGET', KEYS[1], 'root')
if root and root ~= '' then redis.call('ZADD', KEYS[5]..root, ARGV[4], ARGV[5]) end
return {n, redis.call('SMEMBERS', KEYS[3])}
"#;

/// Sessions read per page while filtering by tag.
const PAGE: isize = 200;

pub struct RedisNotebook {
    conn: ConnectionManager,
    prefix: String,
    append: Script,
}

impl RedisNotebook {
    pub fn new(conn: ConnectionManager, store_prefix: &str) -> Self {
        Self { conn, prefix: format!("{store_prefix}nb:"), append: Script::new(APPEND) }
    }

    fn k(&self, kind: &str, id: &str) -> String {
        format!("{}{kind}:{id}", self.prefix)
    }

    fn root_key(&self, principal: &str, root: &str) -> String {
        format!("{}r:{principal}\n{root}", self.prefix)
    }

    async fn load(&self, id: &str) -> Result<Option<NotebookSession>, RepoError> {
        let mut conn = self.conn.clone();
        let fields: std::collections::HashMap<String, String> = conn.hgetall(self.k("s", id)).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let get = |f: &str| fields.get(f).cloned().unwrap_or_default();
        let num = |f: &str| fields.get(f).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        Ok(Some(NotebookSession {
            id: id.to_owned(),
            principal: get("principal"),
            title: get("title"),
            tags: serde_json::from_str(&get("tags")).unwrap_or_default(),
            mcp_root_uri: fields.get("root").filter(|r| !r.is_empty()).cloned(),
            created_at_ms: num("created"),
            updated_at_ms: num("updated"),
            thought_count: num("thoughts") as u64,
            branch_count: num("branches") as u64,
        }))
    }

    async fn ids(&self, key: &str, start: isize, stop: isize) -> Result<Vec<String>, RepoError> {
        let mut conn = self.conn.clone();
        Ok(conn.zrevrange(key, start, stop).await?)
    }
}

#[async_trait]
impl NotebookRepo for RedisNotebook {
    async fn create_session(&self, s: &NotebookSession) -> Result<(), RepoError> {
        let mut conn = self.conn.clone();
        let tags = serde_json::to_string(&s.tags).map_err(|e| RepoError::Storage(e.to_string()))?;
        let root = s.mcp_root_uri.clone().unwrap_or_default();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset_multiple(
                self.k("s", &s.id),
                &[
                    ("principal", s.principal.clone()),
                    ("title", s.title.clone()),
                    ("tags", tags),
                    ("root", root.clone()),
                    ("created", s.created_at_ms.to_string()),
                    ("updated", s.updated_at_ms.to_string()),
                    ("thoughts", s.thought_count.to_string()),
                    ("branches", s.branch_count.to_string()),
                ],
            )
            .ignore()
            .zadd(self.k("p", &s.principal), &s.id, s.updated_at_ms)
            .ignore();
        if !root.is_empty() {
            pipe.zadd(self.root_key(&s.principal, &root), &s.id, s.updated_at_ms).ignore();
        }
        let _: () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    async fn get_session(&self, principal: &str, id: &str) -> Result<Option<NotebookSession>, RepoError> {
        Ok(self.load(id).await?.filter(|s| s.principal == principal))
    }

    async fn append_thought(&self, principal: &str, session_id: &str, thought: &ThoughtInput) -> Result<Recorded, RepoError> {
        let mut conn = self.conn.clone();
        let body = serde_json::to_string(&StoredThought { input: thought.clone(), recorded_at_ms: tether_store::now_ms() })
            .map_err(|e| RepoError::Storage(e.to_string()))?;
        let branch = thought.branch().map(|(b, _)| b.to_owned()).unwrap_or_default();
        let answer: Option<(u64, Vec<String>)> = self
            .append
            .key(self.k("s", session_id))
            .key(self.k("t", session_id))
            .key(self.k("b", session_id))
            .key(self.k("p", principal))
            .key(format!("{}r:{principal}\n", self.prefix))
            .arg(principal)
            .arg(body)
            .arg(branch)
            .arg(tether_store::now_ms())
            .arg(session_id)
            .invoke_async(&mut conn)
            .await?;
        let (n, mut branches) = answer.ok_or_else(|| RepoError::NotFound(session_id.to_owned()))?;
        branches.sort();
        Ok(Recorded { thought_history_length: n, branches })
    }

    async fn thoughts(&self, principal: &str, session_id: &str) -> Result<Vec<StoredThought>, RepoError> {
        if self.get_session(principal, session_id).await?.is_none() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let raw: Vec<String> = conn.lrange(self.k("t", session_id), 0, -1).await?;
        raw.iter().map(|t| serde_json::from_str(t).map_err(|e| RepoError::Storage(format!("stored thought: {e}")))).collect()
    }

    async fn latest_for_root(&self, principal: &str, root: &str) -> Result<Option<NotebookSession>, RepoError> {
        match self.ids(&self.root_key(principal, root), 0, 0).await?.first() {
            Some(id) => self.get_session(principal, id).await,
            None => Ok(None),
        }
    }

    async fn list_sessions(&self, principal: &str, filter: &SessionFilter) -> Result<Vec<NotebookSession>, RepoError> {
        let key = match &filter.root {
            Some(root) => self.root_key(principal, root),
            None => self.k("p", principal),
        };
        let mut out = Vec::new();
        let mut start = 0;
        loop {
            let ids = self.ids(&key, start, start + PAGE - 1).await?;
            if ids.is_empty() {
                return Ok(out);
            }
            for id in &ids {
                if let Some(s) = self.get_session(principal, id).await?
                    && filter.tag.as_ref().is_none_or(|t| s.tags.contains(t))
                {
                    out.push(s);
                    if out.len() >= filter.limit {
                        return Ok(out);
                    }
                }
            }
            start += PAGE;
        }
    }

    async fn search(&self, principal: &str, text: &str, limit: usize) -> Result<Vec<SearchHit>, RepoError> {
        let needle = text.to_lowercase();
        let mut hits = Vec::new();
        for id in self.ids(&self.k("p", principal), 0, -1).await? {
            let Some(session) = self.get_session(principal, &id).await? else { continue };
            let thoughts = self.thoughts(principal, &id).await?;
            if !super::collect_hits(&session, thoughts, &needle, &mut hits, limit) {
                break;
            }
        }
        Ok(hits)
    }
}
