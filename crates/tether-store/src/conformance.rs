//! The store conformance suite: one set of checks that every backend must
//! pass. Backends call [`run_all`] from their own test files with a factory
//! that opens a fresh store; durable backends also pass a reopen function.
//! A test file that makes one test per scenario (so a failure names its
//! scenario and the scenarios run in parallel) expands
//! [`conformance_scenarios!`](crate::conformance_scenarios), the list
//! [`run_all`] runs.
//!
//! Each check panics with a message naming the broken promise.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::{EventKind, SessionRecord, Store, now_ms};

/// A boxed future, as the harness's factories return.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Closes a store and opens it again on the same data (backends that keep data).
pub type Reopen = Box<dyn Fn(Arc<dyn Store>) -> BoxFut<Arc<dyn Store>> + Send + Sync>;

/// Opens a store for a check. `reopen` (durable backends only) drops the
/// given store without flushing and opens the same data again.
pub struct Harness {
    /// Opens a fresh, empty store.
    pub fresh: Box<dyn Fn() -> BoxFut<Arc<dyn Store>> + Send + Sync>,
    /// Drops a store without flushing and opens its data again (durable backends).
    pub reopen: Option<Reopen>,
}

/// A session record for the checks: `id` of `principal`, expiring in `ttl_ms`.
pub fn session(id: &str, principal: &str, ttl_ms: i64) -> SessionRecord {
    let now = now_ms();
    SessionRecord {
        id: id.into(),
        principal: principal.into(),
        created_at_ms: now,
        expires_at_ms: now + ttl_ms,
        revision: 0,
        state: serde_json::json!({"v": 0}),
    }
}

/// Every scenario, in the order [`run_all`] runs them, for a test file's
/// macro: `conformance_scenarios!(m, args...)` expands to
/// `m! { [args...] kind name, ... }`, where `kind` says what the scenario
/// function takes: `store` a fresh store (`&Arc<dyn Store>` from
/// [`Harness::fresh`]), `harness` the [`Harness`] (it opens its own stores),
/// `durable` a harness with [`Harness::reopen`] (skipped without one).
#[macro_export]
macro_rules! conformance_scenarios {
    ($m:ident $(, $($args:tt)*)?) => {
        $m! {
            [$($($args)*)?]
            store sessions_roundtrip,
            store session_compare_and_set,
            store session_expiry,
            store every_session_pages_through,
            store append_ordering_and_read_after,
            store streams_are_independent,
            harness trimming_keeps_the_newest,
            store concurrent_appenders,
            store cursors,
            store kv_compare_and_set_and_expiry,
            store delete_drops_logs,
            store finished_streams_are_dropped_by_age_or_kept,
            durable reopen_keeps_committed,
        }
    };
}

/// Runs every check below on fresh stores from `h`.
pub async fn run_all(h: &Harness) {
    macro_rules! run {
        ([] $($kind:ident $scenario:ident,)*) => {
            $(run!(@ $kind $scenario);)*
        };
        (@ store $scenario:ident) => {
            $scenario(&(h.fresh)().await).await
        };
        (@ harness $scenario:ident) => {
            $scenario(h).await
        };
        (@ durable $scenario:ident) => {
            if h.reopen.is_some() {
                $scenario(h).await;
            }
        };
    }
    crate::conformance_scenarios!(run);
}

/// A session is read back as written; creating it again conflicts.
pub async fn sessions_roundtrip(store: &Arc<dyn Store>) {
    let s = session("s1", "alice", 60_000);
    store.create_session(&s).await.unwrap();
    assert!(store.create_session(&s).await.is_err(), "creating an existing live session must conflict");
    let got = store.get_session("s1", now_ms()).await.unwrap().expect("session readable after create");
    assert_eq!(got, s);
    assert!(store.get_session("nope", now_ms()).await.unwrap().is_none());
    store.create_session(&session("s2", "alice", 120_000)).await.unwrap();
    store.create_session(&session("s3", "bob", 60_000)).await.unwrap();
    let listed: Vec<String> = store.list_sessions("alice", 10).await.unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, vec!["s2".to_string(), "s1".to_string()], "list by principal, most recently active first");
    assert!(store.touch_session("s1", now_ms() + 600_000).await.unwrap());
    let listed: Vec<String> = store.list_sessions("alice", 1).await.unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, vec!["s1".to_string()], "touch moves a session to the front; limit honoured");
    assert_eq!(store.count_sessions("alice", now_ms()).await.unwrap(), 2);
    assert_eq!(store.count_sessions("bob", now_ms()).await.unwrap(), 1);
    assert_eq!(store.count_sessions("alice", now_ms() + 10_000_000).await.unwrap(), 0, "expired sessions do not count");
    assert!(!store.touch_session("ghost", now_ms()).await.unwrap());
}

/// Paging through the sessions yields each one once.
pub async fn every_session_pages_through(store: &Arc<dyn Store>) {
    let now = now_ms();
    assert_eq!(store.scan_sessions(None, 10, now).await.unwrap(), crate::SessionPage::default(), "nothing stored yet");
    for i in 0..7 {
        let principal = if i % 2 == 0 { "alice" } else { "bob" };
        store.create_session(&session(&format!("page{i}"), principal, 60_000 + i * 1_000)).await.unwrap();
    }
    store.create_session(&session("gone", "carol", 50)).await.unwrap();
    let later = now_ms() + 1_000;
    assert_eq!(store.count_all_sessions(later).await.unwrap(), 7, "live sessions of every principal, expired ones not");
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = store.scan_sessions(cursor.as_deref(), 3, later).await.unwrap();
        assert!(page.sessions.len() <= 3, "a page holds at most its limit");
        pages += 1;
        seen.extend(page.sessions.into_iter().map(|s| s.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 10, "paging ends");
    }
    seen.sort();
    assert_eq!(seen, (0..7).map(|i| format!("page{i}")).collect::<Vec<_>>(), "every live session once, across pages");
    assert_eq!(pages, 3, "7 sessions in pages of 3");
}

/// A session's state changes only over the revision it was read at.
pub async fn session_compare_and_set(store: &Arc<dyn Store>) {
    store.create_session(&session("cas", "p", 60_000)).await.unwrap();
    let r1 = store.update_session_state("cas", 0, &serde_json::json!({"v": 1})).await.unwrap();
    assert_eq!(r1, Some(1));
    let stale = store.update_session_state("cas", 0, &serde_json::json!({"v": 99})).await.unwrap();
    assert_eq!(stale, None, "a stale revision must not overwrite");
    let got = store.get_session("cas", now_ms()).await.unwrap().unwrap();
    assert_eq!((got.revision, got.state), (1, serde_json::json!({"v": 1})));
    assert_eq!(store.update_session_state("missing", 0, &serde_json::json!({})).await.unwrap(), None);
    // The stamp is what a replica checks on every request: the revision
    // and expiry as stored, nothing for a session gone or expired.
    let stamp = store.session_stamp("cas", now_ms()).await.unwrap().expect("a live session has a stamp");
    assert_eq!((stamp.revision, stamp.expires_at_ms), (1, got.expires_at_ms));
    assert!(store.session_stamp("cas", got.expires_at_ms).await.unwrap().is_none(), "expired at its expiry");
    assert!(store.session_stamp("missing", now_ms()).await.unwrap().is_none());
}

/// An expired session is gone.
pub async fn session_expiry(store: &Arc<dyn Store>) {
    store.create_session(&session("old", "p", 50)).await.unwrap();
    store.create_session(&session("young", "p", 600_000)).await.unwrap();
    store.append("old", "g", EventKind::Message, Bytes::from_static(b"x")).await.unwrap();
    let later = now_ms() + 1_000;
    assert!(store.get_session("old", later).await.unwrap().is_none(), "expired session must read as absent");
    let expired = store.expire_sessions(later, 100).await.unwrap();
    assert_eq!(expired, vec!["old".to_string()]);
    assert!(store.read_after("old", "g", 0, 10).await.unwrap().is_empty(), "expiry drops the session's logs");
    assert!(store.get_session("young", later).await.unwrap().is_some());
    // An expired ID can be reused.
    store.create_session(&session("old", "p", 60_000)).await.unwrap();
}

/// Appends are numbered in order and read back after any point.
pub async fn append_ordering_and_read_after(store: &Arc<dyn Store>) {
    store.create_session(&session("s", "p", 60_000)).await.unwrap();
    let mut seqs = Vec::new();
    seqs.push(store.append("s", "r1", EventKind::Prime, Bytes::from_static(b"")).await.unwrap());
    for i in 0..20 {
        seqs.push(store.append("s", "r1", EventKind::Message, Bytes::from(format!("m{i}"))).await.unwrap());
    }
    seqs.push(store.append("s", "r1", EventKind::Final, Bytes::from_static(b"done")).await.unwrap());
    assert_eq!(seqs, (1..=22).collect::<Vec<u64>>(), "sequence numbers start at 1 and grow by one");
    let all = store.read_after("s", "r1", 0, 100).await.unwrap();
    assert_eq!(all.len(), 22);
    assert_eq!(all[0].kind, EventKind::Prime);
    assert_eq!(all[21].kind, EventKind::Final);
    assert_eq!(all[5].payload, Bytes::from("m4"));
    let page = store.read_after("s", "r1", 10, 5).await.unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![11, 12, 13, 14, 15]);
    assert!(store.read_after("s", "r1", 22, 5).await.unwrap().is_empty());
    let summary = store.stream("s", "r1").await.unwrap().unwrap();
    assert_eq!((summary.first_seq, summary.last_seq, summary.finished), (1, 22, true));
    // A batch lands in order, numbered after what was there.
    let first = store
        .append_batch("s", "r2", vec![(EventKind::Prime, Bytes::from_static(b"p")), (EventKind::Final, Bytes::from_static(b"f"))])
        .await
        .unwrap();
    assert_eq!(first, 1);
    let batch = store.read_after("s", "r2", 0, 10).await.unwrap();
    assert_eq!(batch.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(), vec![(1, EventKind::Prime), (2, EventKind::Final)]);
    assert_eq!(store.append("s", "r2", EventKind::Message, Bytes::from_static(b"m")).await.unwrap(), 3);
    let more = vec![(EventKind::Message, Bytes::from_static(b"m4")), (EventKind::Message, Bytes::from_static(b"m5"))];
    assert_eq!(store.append_batch("s", "r2", more).await.unwrap(), 4, "a batch on a stream with events starts after them");
    let tail = store.read_after("s", "r2", 3, 10).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| (e.seq, e.payload.clone())).collect::<Vec<_>>(),
        vec![(4, Bytes::from("m4")), (5, Bytes::from("m5"))]
    );
    assert!(store.stream("s", "nope").await.unwrap().is_none());
    // A new stream starts at 1; claiming that an existing one is new never overwrites it.
    assert_eq!(store.start_stream("s", "r3", vec![(EventKind::Prime, Bytes::from_static(b"p3"))]).await.unwrap(), 1);
    assert_eq!(store.append("s", "r3", EventKind::Final, Bytes::from_static(b"f3")).await.unwrap(), 2);
    if let Ok(seq) = store.start_stream("s", "r3", vec![(EventKind::Message, Bytes::from_static(b"late"))]).await {
        assert_eq!(seq, 3, "numbered after what was there");
    }
    let r3 = store.read_after("s", "r3", 0, 10).await.unwrap();
    assert_eq!(
        &r3[..2].iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
        &[Bytes::from_static(b"p3"), Bytes::from_static(b"f3")]
    );
    // A stream that starts with its final event (a quick answer) reads
    // back in pages and summarises like any other, and numbering goes on
    // if events follow.
    let quick = vec![(EventKind::Prime, Bytes::from_static(b"p4")), (EventKind::Final, Bytes::from_static(b"f4"))];
    assert_eq!(store.start_stream("s", "r4", quick).await.unwrap(), 1);
    let r4 = store.read_after("s", "r4", 1, 10).await.unwrap();
    assert_eq!(
        r4.iter().map(|e| (e.seq, e.kind, e.payload.clone())).collect::<Vec<_>>(),
        [(2, EventKind::Final, Bytes::from("f4"))]
    );
    assert_eq!(store.read_after("s", "r4", 0, 1).await.unwrap().len(), 1);
    let summary = store.stream("s", "r4").await.unwrap().unwrap();
    assert_eq!((summary.first_seq, summary.last_seq, summary.finished), (1, 2, true));
    assert_eq!(store.append("s", "r4", EventKind::Message, Bytes::from_static(b"m4")).await.unwrap(), 3);
    let r4 = store.read_after("s", "r4", 0, 10).await.unwrap();
    assert_eq!(r4.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(r4[0].payload, Bytes::from("p4"));
}

/// One stream's events never show in another's.
pub async fn streams_are_independent(store: &Arc<dyn Store>) {
    store.create_session(&session("a", "p", 60_000)).await.unwrap();
    store.create_session(&session("b", "p", 60_000)).await.unwrap();
    store.append("a", "g", EventKind::Message, Bytes::from_static(b"a-g-1")).await.unwrap();
    store.append("a", "r", EventKind::Prime, Bytes::from_static(b"")).await.unwrap();
    store.append("b", "g", EventKind::Message, Bytes::from_static(b"b-g-1")).await.unwrap();
    assert_eq!(store.append("a", "g", EventKind::Message, Bytes::from_static(b"a-g-2")).await.unwrap(), 2);
    let a_g = store.read_after("a", "g", 0, 10).await.unwrap();
    assert_eq!(a_g.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(), vec![Bytes::from("a-g-1"), Bytes::from("a-g-2")]);
    let names: Vec<String> = store.open_streams("a").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(names, vec!["g".to_string(), "r".to_string()]);
    assert!(!store.open_streams("a").await.unwrap()[1].finished);
    // A final event closes a stream; a quick request (first and final events together) is never open.
    store.append("a", "r", EventKind::Final, Bytes::from_static(b"done")).await.unwrap();
    store
        .start_stream("a", "q", vec![(EventKind::Prime, Bytes::new()), (EventKind::Final, Bytes::from_static(b"ok"))])
        .await
        .unwrap();
    let names: Vec<String> = store.open_streams("a").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(names, vec!["g".to_string()], "only the stream without a final event is open");
    assert!(store.stream("a", "r").await.unwrap().is_some_and(|s| s.finished && s.last_seq == 2));
    assert!(store.stream("a", "q").await.unwrap().is_some_and(|s| s.finished && s.first_seq == 1 && s.last_seq == 2));
}

/// A stream over its cap loses its oldest events, never its newest.
pub async fn trimming_keeps_the_newest(h: &Harness) {
    // Backends under test are opened with max_events_per_stream = 100 (see the harnesses).
    let store = (h.fresh)().await;
    store.create_session(&session("t", "p", 60_000)).await.unwrap();
    for i in 0..150u32 {
        store.append("t", "g", EventKind::Message, Bytes::from(i.to_string())).await.unwrap();
    }
    let kept = store.read_after("t", "g", 0, 1000).await.unwrap();
    assert_eq!(kept.len(), 100, "a stream keeps exactly its cap of events");
    assert_eq!(kept[0].seq, 51);
    assert_eq!(kept[99].seq, 150);
    let summary = store.stream("t", "g").await.unwrap().unwrap();
    assert_eq!((summary.first_seq, summary.last_seq), (51, 150));
}

/// Concurrent appends to one stream each get a number of their own.
pub async fn concurrent_appenders(store: &Arc<dyn Store>) {
    store.create_session(&session("c", "p", 60_000)).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..16u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..5u32 {
                let seq = store.append("c", "g", EventKind::Message, Bytes::from(format!("{w}:{i}"))).await.unwrap();
                mine.push(seq);
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let mine = t.await.unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "one appender's events keep their order");
        all.extend(mine);
    }
    all.sort();
    assert_eq!(all, (1..=80).collect::<Vec<u64>>(), "concurrent appends get unique, gap-free sequence numbers");
    let events = store.read_after("c", "g", 0, 1000).await.unwrap();
    assert_eq!(events.len(), 80);
}

/// A cursor never moves back, and goes with its session.
pub async fn cursors(store: &Arc<dyn Store>) {
    store.create_session(&session("k", "p", 60_000)).await.unwrap();
    assert_eq!(store.cursor("k", "g").await.unwrap(), 0);
    store.set_cursor("k", "g", 5).await.unwrap();
    store.set_cursor("k", "g", 3).await.unwrap();
    assert_eq!(store.cursor("k", "g").await.unwrap(), 5, "a cursor never moves back");
    store.delete_session("k").await.unwrap();
    assert_eq!(store.cursor("k", "g").await.unwrap(), 0, "cursors go with their session");
}

/// Key/value records: compare-and-set on their revision, and expiry.
pub async fn kv_compare_and_set_and_expiry(store: &Arc<dyn Store>) {
    let r1 = store.kv_compare_and_set("ops", "a", None, Bytes::from_static(b"one"), None).await.unwrap();
    let r1 = r1.expect("create when absent");
    assert_eq!(store.kv_compare_and_set("ops", "a", None, Bytes::from_static(b"x"), None).await.unwrap(), None);
    let r2 = store.kv_compare_and_set("ops", "a", Some(r1), Bytes::from_static(b"two"), None).await.unwrap().unwrap();
    assert_ne!(r1, r2);
    assert_eq!(store.kv_compare_and_set("ops", "a", Some(r1), Bytes::from_static(b"x"), None).await.unwrap(), None);
    let got = store.kv_get("ops", "a", now_ms()).await.unwrap().unwrap();
    assert_eq!((got.value, got.revision), (Bytes::from("two"), r2));
    assert!(store.kv_get("other", "a", now_ms()).await.unwrap().is_none(), "namespaces are separate");
    // Delete then re-create: an old revision must not match the new record.
    assert!(store.kv_delete("ops", "a").await.unwrap());
    let r3 = store.kv_compare_and_set("ops", "a", None, Bytes::from_static(b"three"), None).await.unwrap().unwrap();
    assert!(r3 != r1 && r3 != r2, "revisions are never reused");
    // Expiry.
    let soon = now_ms() + 30;
    store.kv_compare_and_set("ops", "e", None, Bytes::from_static(b"e"), Some(soon)).await.unwrap().unwrap();
    assert!(store.kv_get("ops", "e", now_ms()).await.unwrap().is_some());
    assert!(store.kv_get("ops", "e", soon + 1).await.unwrap().is_none(), "expired records read as absent");
    tokio::time::sleep(std::time::Duration::from_millis(40)).await;
    assert!(
        store.kv_compare_and_set("ops", "e", None, Bytes::from_static(b"new"), None).await.unwrap().is_some(),
        "an expired record counts as absent for compare-and-set"
    );
}

/// Deleting a session drops its streams; a new session of the same ID starts them from 1.
pub async fn delete_drops_logs(store: &Arc<dyn Store>) {
    store.create_session(&session("d", "p", 60_000)).await.unwrap();
    store.append("d", "g", EventKind::Message, Bytes::from_static(b"x")).await.unwrap();
    assert!(store.delete_session("d").await.unwrap());
    assert!(!store.delete_session("d").await.unwrap());
    assert!(store.get_session("d", now_ms()).await.unwrap().is_none());
    assert!(store.read_after("d", "g", 0, 10).await.unwrap().is_empty());
    assert!(store.open_streams("d").await.unwrap().is_empty());
    // A new session with the same ID starts its streams from 1.
    store.create_session(&session("d", "p", 60_000)).await.unwrap();
    assert_eq!(store.append("d", "g", EventKind::Message, Bytes::from_static(b"y")).await.unwrap(), 1);
}

/// `drop_finished_streams` drops exactly the finished streams in its name
/// range, of every session, while their sessions live; a backend that keeps
/// logs until their session goes (the default) drops nothing.
pub async fn finished_streams_are_dropped_by_age_or_kept(store: &Arc<dyn Store>) {
    let x = |n: u8| Bytes::from(vec![b'x'; usize::from(n)]);
    for s in ["a", "b"] {
        store.create_session(&session(s, "p", 60_000)).await.unwrap();
        store.start_stream(s, "r1", vec![(EventKind::Final, x(1))]).await.unwrap();
        store.start_stream(s, "r2", vec![(EventKind::Prime, x(2)), (EventKind::Final, x(3))]).await.unwrap();
        store.start_stream(s, "r3", vec![(EventKind::Prime, x(4))]).await.unwrap();
        store.start_stream(s, "r9", vec![(EventKind::Final, x(5))]).await.unwrap();
        store.append(s, "g1", EventKind::Message, x(6)).await.unwrap();
    }
    let dropped = store.drop_finished_streams("r", "r5", now_ms() + 60_000, 1_000).await.unwrap();
    let kept = |s: &'static str, stream: &'static str| {
        let store = store.clone();
        async move { store.stream(s, stream).await.unwrap().is_some() }
    };
    if dropped == 0 {
        for s in ["a", "b"] {
            for stream in ["r1", "r2", "r3", "r9", "g1"] {
                assert!(kept(s, stream).await, "a backend that drops nothing keeps {s}/{stream}");
            }
        }
        return;
    }
    assert_eq!(dropped, 6, "r1 (one event) and r2 (two) of both sessions");
    for s in ["a", "b"] {
        assert!(!kept(s, "r1").await && !kept(s, "r2").await, "finished streams in range are dropped");
        assert!(store.read_after(s, "r2", 0, 10).await.unwrap().is_empty());
        assert!(kept(s, "r3").await, "an open stream stays");
        assert!(kept(s, "r9").await, "a stream named after the range stays");
        assert!(kept(s, "g1").await, "the standalone stream stays");
        assert!(store.get_session(s, now_ms()).await.unwrap().is_some(), "the session lives on");
    }
    assert_eq!(store.drop_finished_streams("r", "r5", now_ms() + 60_000, 1_000).await.unwrap(), 0, "nothing twice");
}

/// What was committed is there after a reopen without a flush.
pub async fn reopen_keeps_committed(h: &Harness) {
    let store = (h.fresh)().await;
    store.create_session(&session("r", "p", 60_000)).await.unwrap();
    for i in 0..10u32 {
        store.append("r", "g", EventKind::Message, Bytes::from(i.to_string())).await.unwrap();
    }
    store.kv_compare_and_set("ops", "k", None, Bytes::from_static(b"v"), None).await.unwrap().unwrap();
    let reopen = h.reopen.as_ref().expect("durable harness");
    let store = reopen(store).await;
    assert!(store.get_session("r", now_ms()).await.unwrap().is_some(), "sessions survive reopen");
    assert_eq!(store.read_after("r", "g", 0, 100).await.unwrap().len(), 10, "committed events survive reopen");
    assert_eq!(
        store.append("r", "g", EventKind::Message, Bytes::from_static(b"after")).await.unwrap(),
        11,
        "sequence numbers continue after reopen"
    );
    let kv = store.kv_get("ops", "k", now_ms()).await.unwrap().unwrap();
    let next = store.kv_compare_and_set("ops", "k", Some(kv.revision), Bytes::from_static(b"w"), None).await.unwrap();
    assert!(next.is_some_and(|r| r > kv.revision), "revisions keep growing after reopen");
}
