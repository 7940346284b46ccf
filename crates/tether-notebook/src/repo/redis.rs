//! Notebook repository on Redis, beside the Redis store (same prefix and
//! connection, single server or cluster, `nb:` keys). Sessions are hashes;
//! per-principal and per-(principal, root) sorted sets by update time make
//! "most recent session of this root" one `ZREVRANGE … 0 0`. Appending a
//! thought is one Lua script on the session's keys, which share its hash
//! tag (one cluster slot); the two indexes are updated after it (their own
//! slots), as hints: every read checks the session itself.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `Pnb:{id}:s` | hash | the session's fields |
//! | `Pnb:{id}:t` | list | thoughts (JSON) in order |
//! | `Pnb:{id}:b` | set | branch ids |
//! | `Pnb:p:{principal}` | zset | session ids by update time |
//! | `Pnb:r:{principal}\n{root}` | zset | session ids of one root by update time |

use async_trait::async_trait;
use redis::AsyncCommands;
use tether_store::redis::{BatchedOp, Call, RedisConn, hash_tag};

use super::{NotebookRepo, NotebookSession, RepoError, SearchHit, SessionFilter, StoredThought};
use crate::thought::{Recorded, ThoughtInput};

/// Appends a thought: an operation of a batch (`tether_store::redis::BatchedOp`).
/// Keys (`ARGV[k + 1]`…): the session hash, its thoughts, its branches, then
/// on a single server the principal's index and the beginning of the root's
/// index key. Arguments (`ARGV[a + 1]`…): principal, thought (JSON), branch
/// or '', now ms, session id.
/// Returns {thoughts, branches, root, 1 if the indexes were updated here}, or
/// false if the session is not the principal's.
const APPEND: &str = r#"
local function op(k, a, n, notes)
  local session, thoughts, branch_set = ARGV[k + 1], ARGV[k + 2], ARGV[k + 3]
  local now, id = ARGV[a + 4], ARGV[a + 5]
  local owner = redis.call('HMGET', session, 'principal', 'root')
  if owner[1] ~= ARGV[a + 1] then return false end
  local count = redis.call('RPUSH', thoughts, ARGV[a + 2])
  if ARGV[a + 3] ~= '' then redis.call('SADD', branch_set, ARGV[a + 3]) end
  local branches = redis.call('SMEMBERS', branch_set)
  redis.call('HSET', session, 'thoughts', count, 'branches', #branches, 'updated', now)
  local root = owner[2] or ''
  -- On a single server the indexes are updated here; on a cluster they are
  -- in other slots: the caller's.
  local indexed = a - k > 3
  if indexed then
    redis.call('ZADD', ARGV[k + 4], now, id)
    if root ~= '' then redis.call('ZADD', ARGV[k + 5]..root, now, id) end
  end
  return {count, branches, root, indexed and 1 or 0}
end
"#;

/// Sessions read per page while filtering by tag.
const PAGE: isize = 200;

pub struct RedisNotebook {
    conn: RedisConn,
    prefix: String,
    /// Thoughts, in batches on a single server.
    append: BatchedOp,
}

impl RedisNotebook {
    pub fn new(conn: RedisConn, store_prefix: &str) -> Self {
        let append = BatchedOp::script(conn.clone(), APPEND, "");
        Self { conn, prefix: format!("{store_prefix}nb:"), append }
    }

    /// A key of notebook session `id` (`s`, `t`, `b`), in its slot.
    fn k(&self, kind: &str, id: &str) -> String {
        format!("{}{{{}}}:{kind}", self.prefix, hash_tag(id))
    }

    fn principal_key(&self, principal: &str) -> String {
        format!("{}p:{principal}", self.prefix)
    }

    /// Puts session `id` at the top of its principal's and its root's lists.
    async fn index(&self, principal: &str, root: &str, id: &str, updated_at_ms: i64) -> Result<(), RepoError> {
        let mut conn = self.conn.clone();
        let _: i64 = conn.zadd(self.principal_key(principal), id, updated_at_ms).await?;
        if !root.is_empty() {
            let _: i64 = conn.zadd(self.root_key(principal, root), id, updated_at_ms).await?;
        }
        Ok(())
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
        let _: () = conn
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
            .await?;
        self.index(&s.principal, &root, &s.id, s.updated_at_ms).await
    }

    async fn get_session(&self, principal: &str, id: &str) -> Result<Option<NotebookSession>, RepoError> {
        Ok(self.load(id).await?.filter(|s| s.principal == principal))
    }

    async fn append_thought(&self, principal: &str, session_id: &str, thought: &ThoughtInput) -> Result<Recorded, RepoError> {
        let now = tether_store::now_ms();
        let body = serde_json::to_string(&StoredThought { input: thought.clone(), recorded_at_ms: now })
            .map_err(|e| RepoError::Storage(e.to_string()))?;
        let branch = thought.branch().map(|(b, _)| b.to_owned()).unwrap_or_default();
        let mut call = Call::new().key(self.k("s", session_id)).key(self.k("t", session_id)).key(self.k("b", session_id));
        if !self.conn.is_cluster() {
            // The batch updates the indexes too.
            call = call.key(self.principal_key(principal)).key(format!("{}r:{principal}\n", self.prefix));
        }
        let call = call.arg(principal.to_owned()).arg(body).arg(branch).num(now).arg(session_id.to_owned());
        let answer = self.append.call(call).await.map_err(|e| RepoError::Storage(e.to_string()))?;
        let answer: Option<(u64, Vec<String>, String, u8)> =
            redis::from_redis_value(answer).map_err(|e| RepoError::Storage(format!("a thought's append answered: {e}")))?;
        let (n, mut branches, root, indexed) = answer.ok_or_else(|| RepoError::NotFound(session_id.to_owned()))?;
        if indexed == 0 {
            self.index(principal, &root, session_id, now).await?;
        }
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
            None => self.principal_key(principal),
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
        for id in self.ids(&self.principal_key(principal), 0, -1).await? {
            let Some(session) = self.get_session(principal, &id).await? else { continue };
            let thoughts = self.thoughts(principal, &id).await?;
            if !super::collect_hits(&session, thoughts, &needle, &mut hits, limit) {
                break;
            }
        }
        Ok(hits)
    }
}
