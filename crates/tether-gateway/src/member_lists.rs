//! [`MemberLists`]: what each member of a virtual server lists (its tools,
//! prompts, resources and resource templates), read once and shared by
//! every session of the server.
//!
//! A member's lists are read through the session (or sessionless pool)
//! that first needs them, while the other sessions wait for that one read
//! (one read per member at a time), and kept until the member says a list
//! changed (any session's `list_changed`: [`MemberLists::changed`]) or a
//! call found its connection dead ([`MemberLists::changed`] too). A member
//! that could not be listed is read again after [`DOWN_RECHECK`]. A member
//! whose lists depend on who asks (it is given the client's own token) is
//! read per principal instead, with at most [`MAX_PRINCIPALS`] principals'
//! lists kept.
//!
//! Bound: a member's four lists together are kept up to `max_list_bytes`
//! (as the member sent them); past it the rest is cut, with a warning and
//! `tether_virtual_member_lists_cut_total`, and at most [`MAX_PAGES`] pages
//! of one list are read. A member that cannot be listed at all is logged
//! with the reason once each time it goes down.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tether_server::RpcError;
use tether_wire::code;

use crate::catalog::Listed;

/// How often the lists of a member that could not be listed are read again.
pub(crate) const DOWN_RECHECK: Duration = Duration::from_secs(2);
/// Pages of one member's list read at most (a member that never stops
/// giving a `nextCursor` is cut off there).
const MAX_PAGES: usize = 100;
/// Principals whose lists of one member are kept at most, for a member read
/// per principal (the oldest read is forgotten first).
pub(crate) const MAX_PRINCIPALS: usize = 256;

/// One request of a member, answered with its raw JSON.
pub(crate) type Ask<'a> = dyn Fn(&'static str, Option<Map<String, Value>>) -> BoxFuture<'a, Result<Box<serde_json::value::RawValue>, RpcError>>
    + Send
    + Sync
    + 'a;

/// One read of a member's lists.
#[derive(Clone)]
struct Read {
    listed: Option<Arc<Listed>>,
    at: Instant,
    /// The member's generation when the read started.
    generation: u64,
}

/// One member's lists, shared.
struct Member {
    name: String,
    /// Bumped by every change the member announces: reads of an older one are stale.
    generation: AtomicU64,
    /// By principal for a member read per principal, else under `None`.
    reads: parking_lot::Mutex<HashMap<Option<String>, Read>>,
    /// One read at a time.
    reading: tokio::sync::Mutex<()>,
    /// Whether the last read failed (to log a member going down once).
    down: parking_lot::Mutex<bool>,
}

/// Every member's lists of one virtual server.
pub(crate) struct MemberLists {
    server: String,
    members: Vec<Member>,
    max_bytes: usize,
    /// Bumped with any member's generation: a catalog merged from reads no
    /// older than this value is still good.
    changes: AtomicU64,
}

impl MemberLists {
    pub fn new(server: &str, members: &[String], max_bytes: usize) -> Self {
        let members = members
            .iter()
            .map(|name| Member {
                name: name.clone(),
                generation: AtomicU64::new(0),
                reads: parking_lot::Mutex::default(),
                reading: tokio::sync::Mutex::new(()),
                down: parking_lot::Mutex::new(false),
            })
            .collect();
        Self { server: server.to_owned(), members, max_bytes, changes: AtomicU64::new(0) }
    }

    /// Member `member`'s lists as `principal` sees them (`None`: the same
    /// for everyone), read through `ask` when none are fresh. `None` when
    /// it could not be listed.
    pub async fn get(
        &self,
        member: usize,
        principal: Option<&str>,
        capabilities: Option<&Map<String, Value>>,
        ask: &Ask<'_>,
    ) -> Option<Arc<Listed>> {
        let m = &self.members[member];
        let key = principal.map(str::to_owned);
        if let Some(read) = self.fresh(m, &key) {
            return read;
        }
        let _turn = m.reading.lock().await;
        if let Some(read) = self.fresh(m, &key) {
            return read;
        }
        let generation = m.generation.load(Ordering::Acquire);
        let listed = match read_lists(ask, capabilities, self.max_bytes).await {
            Ok((listed, cut)) => {
                if cut {
                    tether_server::metrics::virtual_member_lists_cut(&self.server, &m.name);
                    tracing::warn!(server = %self.server, member = %m.name, max_list_bytes = self.max_bytes, "a member's lists are longer than max_list_bytes: the rest is left out; raise [servers.NAME] max_list_bytes or narrow the member's tools");
                }
                if std::mem::replace(&mut *m.down.lock(), false) {
                    tracing::info!(server = %self.server, member = %m.name, "member listed again");
                }
                Some(Arc::new(listed))
            }
            Err(e) => {
                if !std::mem::replace(&mut *m.down.lock(), true) {
                    tracing::warn!(server = %self.server, member = %m.name, error = %e.message, "member could not be listed: its tools are hidden until it can");
                }
                None
            }
        };
        let mut reads = m.reads.lock();
        if !reads.contains_key(&key)
            && reads.len() >= MAX_PRINCIPALS
            && let Some(oldest) = reads.iter().min_by_key(|(_, r)| r.at).map(|(k, _)| k.clone())
        {
            reads.remove(&oldest);
        }
        reads.insert(key, Read { listed: listed.clone(), at: Instant::now(), generation });
        listed
    }

    /// Member `member`'s lists as `principal` sees them if a fresh read
    /// holds them (`Some(None)`: fresh, and it could not be listed).
    pub fn cached(&self, member: usize, principal: Option<&str>) -> Option<Option<Arc<Listed>>> {
        self.fresh(&self.members[member], &principal.map(str::to_owned))
    }

    /// A read still good: of the member's current generation, and (for a
    /// member that could not be listed) recent.
    fn fresh(&self, m: &Member, key: &Option<String>) -> Option<Option<Arc<Listed>>> {
        let generation = m.generation.load(Ordering::Acquire);
        let reads = m.reads.lock();
        let read = reads.get(key)?;
        let good = read.generation == generation && (read.listed.is_some() || read.at.elapsed() < DOWN_RECHECK);
        good.then(|| read.listed.clone())
    }

    /// Member `member`'s lists are to be read again (it said one changed,
    /// or its connection died under a call).
    pub fn changed(&self, member: usize) {
        self.members[member].generation.fetch_add(1, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// How many changes the members announced so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}

/// Reads a member's four lists through `ask` (every page, up to `max_bytes`
/// in all); whether they were cut. An error when its tools could not be
/// listed (it cannot be reached); a list it does not offer is empty.
pub(crate) async fn read_lists(
    ask: &Ask<'_>,
    capabilities: Option<&Map<String, Value>>,
    max_bytes: usize,
) -> Result<(Listed, bool), RpcError> {
    // A member whose `initialize` declared its capabilities is not asked for
    // lists it does not have (tools are always asked: that is how a member
    // that is down shows).
    let offers = |capability: &str| capabilities.is_none_or(|c| c.get(capability).is_some());
    let budget = Budget { left: AtomicUsize::new(max_bytes), cut: AtomicUsize::new(0) };
    let budget = &budget;
    let all = async |method: &'static str, key: &'static str| -> Result<Vec<Value>, RpcError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| Map::from_iter([("cursor".to_owned(), Value::String(c))]));
            let raw = match ask(method, params).await {
                Ok(raw) => raw,
                Err(e) if e.code == code::METHOD_NOT_FOUND => return Ok(items),
                Err(e) => return Err(e),
            };
            if !budget.take(raw.get().len()) {
                // Over the bound: what fits of this page, then no more pages.
                let page = parse_page(method, key, &raw)?;
                for item in page.items {
                    if !budget.take(serde_json::to_string(&item).map_or(usize::MAX, |s| s.len())) {
                        break;
                    }
                    items.push(item);
                }
                budget.cut.fetch_add(1, Ordering::Relaxed);
                return Ok(items);
            }
            let page = parse_page(method, key, &raw)?;
            drop(raw);
            items.extend(page.items);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(items)
    };
    let maybe = async |offered: bool, method: &'static str, key: &'static str| match offered {
        true => all(method, key).await,
        false => Ok(Vec::new()),
    };
    let (tools, prompts, resources, templates) = futures::join!(
        all("tools/list", "tools"),
        maybe(offers("prompts"), "prompts/list", "prompts"),
        maybe(offers("resources"), "resources/list", "resources"),
        maybe(offers("resources"), "resources/templates/list", "resourceTemplates"),
    );
    let listed = Listed {
        tools: tools?,
        prompts: prompts.unwrap_or_default(),
        resources: resources.unwrap_or_default(),
        templates: templates.unwrap_or_default(),
    };
    Ok((listed, budget.cut.load(Ordering::Relaxed) > 0))
}

/// Bytes of lists still to be kept, shared by the four lists read at once.
struct Budget {
    left: AtomicUsize,
    cut: AtomicUsize,
}

impl Budget {
    /// Takes `n` bytes if that many are left.
    fn take(&self, n: usize) -> bool {
        self.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(n)).is_ok()
    }
}

/// One page of a list: its items and the cursor of the next.
struct Page {
    items: Vec<Value>,
    next: Option<String>,
}

fn parse_page(method: &str, key: &str, raw: &serde_json::value::RawValue) -> Result<Page, RpcError> {
    let mut answer: Map<String, Value> = serde_json::from_str(raw.get())
        .map_err(|e| RpcError::internal(format!("the member answered {method} with no object: {e}")))?;
    let items = match answer.remove(key) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let next = answer.remove("nextCursor").and_then(|c| c.as_str().map(str::to_owned));
    Ok(Page { items, next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(v: Value) -> Box<serde_json::value::RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    type Answer = BoxFuture<'static, Result<Box<serde_json::value::RawValue>, RpcError>>;

    /// A member with `n` tools of about 100 bytes each, two pages.
    fn member(n: usize) -> impl Fn(&'static str, Option<Map<String, Value>>) -> Answer + Send + Sync {
        move |method, params| {
            Box::pin(async move {
                let tool = |i: usize| json!({"name": format!("tool_{i:05}"), "description": "x".repeat(70)});
                match (method, params.and_then(|p| p.get("cursor").cloned())) {
                    ("tools/list", None) => {
                        Ok(raw(json!({"tools": (0..n / 2).map(tool).collect::<Vec<_>>(), "nextCursor": "2"})))
                    }
                    ("tools/list", Some(_)) => Ok(raw(json!({"tools": (n / 2..n).map(tool).collect::<Vec<_>>()}))),
                    _ => Err(RpcError::method_not_found(method)),
                }
            })
        }
    }

    #[tokio::test]
    async fn lists_are_read_whole_under_the_bound_and_cut_past_it() {
        let ask = member(100);
        let (listed, cut) = read_lists(&ask, None, 1 << 20).await.unwrap();
        assert_eq!((listed.tools.len(), cut), (100, false));
        let (listed, cut) = read_lists(&ask, None, 3_000).await.unwrap();
        assert!(cut, "past the bound");
        assert!(!listed.tools.is_empty() && listed.tools.len() < 40, "kept what fits: {}", listed.tools.len());
        assert_eq!(listed.tools[0]["name"], "tool_00000", "in the member's order");
    }

    #[tokio::test]
    async fn a_read_is_shared_until_the_member_changes() {
        let lists = MemberLists::new("team", &["a".to_owned()], 1 << 20);
        let asked = Arc::new(AtomicUsize::new(0));
        let counted = {
            let asked = asked.clone();
            let inner = member(4);
            move |method: &'static str, params: Option<Map<String, Value>>| {
                asked.fetch_add(1, Ordering::Relaxed);
                inner(method, params)
            }
        };
        let first = lists.get(0, None, None, &counted).await.unwrap();
        let again = lists.get(0, None, None, &counted).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "one read for every session");
        let reads = asked.load(Ordering::Relaxed);
        lists.changed(0);
        let after = lists.get(0, None, None, &counted).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &after) && asked.load(Ordering::Relaxed) > reads, "read again after a change");
        let other = lists.get(0, Some("bob"), None, &counted).await.unwrap();
        assert!(!Arc::ptr_eq(&after, &other), "a principal's own read");
    }
}
