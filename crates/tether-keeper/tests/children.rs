//! `Children` driven the way an engine drives it: frames over a real
//! socketpair, real child processes (`python3`, `sh`), a real reaper.
//! Every wait is on an event, bounded by a generous deadline.

use std::sync::Once;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tether_keeper::children::{Children, EngineGone};
use tether_keeper::proto::{self, Decoder, SpawnSpec, ToEngine, ToKeeper};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(30);

/// Every `Children` of this test binary, for the one reaper.
static TABLES: Mutex<Vec<Children>> = Mutex::new(Vec::new());

/// A reaper as the keeper's: every exit goes to the table that knows the pid.
/// (It waits for known pids only: std's spawn reaps a child whose exec
/// failed itself, and a `wait(-1)` on another thread would race it. The
/// keeper reaps on the thread that spawns, so it has no such race.)
fn children() -> Children {
    static REAPER: Once = Once::new();
    REAPER.call_once(|| {
        std::thread::spawn(|| {
            loop {
                let tables = TABLES.lock().clone();
                for table in &tables {
                    for kept in table.kept() {
                        let pid = rustix::process::Pid::from_raw(kept.pid as i32);
                        if let Ok(Some((_, status))) = rustix::process::waitpid(pid, rustix::process::WaitOptions::NOHANG) {
                            table.reaped(kept.pid, status);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    });
    let children = Children::new();
    TABLES.lock().push(children.clone());
    children
}

struct Engine {
    stream: UnixStream,
    decoder: Decoder,
    serving: JoinHandle<EngineGone>,
}

impl Engine {
    /// A new engine connection, past its Welcome.
    async fn connect(children: &Children, epoch: u64) -> (Self, Vec<proto::Kept>) {
        let mut engine = Self::open(children, epoch);
        engine.send(ToKeeper::Hello { version: proto::VERSION, pid: std::process::id() }).await;
        match engine.next().await {
            ToEngine::Welcome { version, epoch: e, children, .. } => {
                assert_eq!((version, e), (proto::VERSION, epoch));
                (engine, children)
            }
            other => panic!("{other:?}"),
        }
    }

    fn open(children: &Children, epoch: u64) -> Self {
        let (keeper, engine) = UnixStream::pair().unwrap();
        let children = children.clone();
        let serving = tokio::spawn(async move { children.serve_engine(keeper, &[], epoch).await });
        Self { stream: engine, decoder: Decoder::new(), serving }
    }

    async fn send(&mut self, message: ToKeeper) {
        self.stream.write_all(&proto::frame(&message)).await.unwrap();
    }

    /// The next frame, or `None` at the end of the connection.
    async fn try_next(&mut self) -> Option<ToEngine> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(message) = self.decoder.next::<ToEngine>().unwrap() {
                    return Some(message);
                }
                let mut buf = BytesMut::with_capacity(64 * 1024);
                if self.stream.read_buf(&mut buf).await.unwrap() == 0 {
                    return None;
                }
                self.decoder.push(&buf);
            }
        })
        .await
        .expect("the keeper said nothing within the deadline")
    }

    async fn next(&mut self) -> ToEngine {
        self.try_next().await.expect("the keeper closed the connection")
    }

    /// The next frame that is not `Written` or `Stderr`.
    async fn next_main(&mut self) -> ToEngine {
        loop {
            match self.next().await {
                ToEngine::Written { .. } | ToEngine::Stderr { .. } => {}
                other => return other,
            }
        }
    }

    async fn spawn(&mut self, spec: SpawnSpec) -> (u64, u32) {
        self.send(ToKeeper::Spawn { req: 7, spec }).await;
        match self.next_main().await {
            ToEngine::Spawned { req: 7, child, pid } => (child, pid),
            other => panic!("{other:?}"),
        }
    }

    /// Ends the connection as an engine crash does; waits for the keeper to see it.
    async fn crash(self) {
        drop(self.stream);
        let gone = tokio::time::timeout(DEADLINE, self.serving).await.unwrap().unwrap();
        assert_eq!(gone, EngineGone::Closed);
    }
}

fn spec(program: &str, args: &[&str]) -> SpawnSpec {
    SpawnSpec {
        program: program.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
        cwd: None,
        max_line: 1 << 20,
        hold_bytes: 4 << 20,
        orphan_ms: 600_000,
        label: "test".into(),
    }
}

fn python(script: &str) -> SpawnSpec {
    spec("python3", &["-u", "-c", script])
}

/// Whether the process is gone (no such pid, or a zombie nobody reaps).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn line_of(message: &ToEngine) -> (u64, u64, String) {
    match message {
        ToEngine::Line { child, frame, line } => (*child, *frame, String::from_utf8_lossy(line).into_owned()),
        other => panic!("not a line: {other:?}"),
    }
}

#[tokio::test]
async fn lines_survive_an_engine_crash_numbered_none_lost_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("done");
    let children = children();
    let (mut engine, kept) = Engine::connect(&children, 1).await;
    assert!(kept.is_empty());
    // Five lines now, five more once the engine is gone, then it waits.
    let script = format!(
        "import sys, time, os\nfor i in range(1, 6): print(f'line {{i}}')\nsys.stdin.readline()\n\
         for i in range(6, 11): print(f'line {{i}}')\nopen({:?}, 'w').close()\ntime.sleep(600)",
        marker.display().to_string()
    );
    let (child, pid) = engine.spawn(python(&script)).await;
    for n in 1..=5 {
        assert_eq!(line_of(&engine.next_main().await), (child, n, format!("line {n}")));
    }
    engine.send(ToKeeper::Ack { child, upto: 3 }).await;
    engine.send(ToKeeper::Write { child, seq: 1, tag: Bytes::new(), line: Bytes::from_static(b"go on") }).await;
    // The keeper reads the Write before it sees the crash: the line reaches the child.
    engine.crash().await;
    until("the child to write its last lines with no engine attached", || marker.exists()).await;

    let (mut engine, kept) = Engine::connect(&children, 2).await;
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].child, kept[0].pid, kept[0].attached), (child, pid, false));
    engine.send(ToKeeper::Attach { child, after: 3 }).await;
    match engine.next_main().await {
        ToEngine::Attached { child: c, written, open } => assert_eq!((c, written, open.len()), (child, 1, 0)),
        other => panic!("{other:?}"),
    }
    for n in 4..=10 {
        assert_eq!(line_of(&engine.next_main().await), (child, n, format!("line {n}")));
    }
    // Nothing after the tenth: a Status answer is next.
    engine.send(ToKeeper::Ack { child, upto: 10 }).await;
    engine.send(ToKeeper::Status { req: 1 }).await;
    match engine.next_main().await {
        ToEngine::Status { req: 1, restarts, held_bytes, children, .. } => {
            assert_eq!((restarts, held_bytes), (1, 0));
            assert_eq!((children[0].pid, children[0].attached), (pid, true));
        }
        other => panic!("{other:?}"),
    }
    children.stop_all(Duration::from_secs(2)).await;
    assert!(gone(pid));
}

#[tokio::test]
async fn exited_comes_after_every_frame_with_the_status_as_a_person_reads_it() {
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let script = "import sys\nsys.stderr.write('careful\\n')\nsys.stderr.flush()\nfor i in range(3): print(i)\nsys.exit(3)";
    engine.send(ToKeeper::Spawn { req: 1, spec: python(script) }).await;
    // Nothing of the child's comes before the answer that names it.
    let ToEngine::Spawned { req: 1, child, .. } = engine.next().await else { panic!("Spawned first") };
    let mut stderr = Vec::new();
    let mut n = 0;
    while n < 3 {
        match engine.next().await {
            ToEngine::Stderr { child: c, line } => stderr.push((c, line)),
            ToEngine::Line { frame, .. } => {
                n += 1;
                assert_eq!(frame, n);
            }
            other => panic!("{other:?}"),
        }
    }
    loop {
        match engine.next().await {
            ToEngine::Stderr { child: c, line } => stderr.push((c, line)),
            ToEngine::Exited { child: c, status } => {
                assert_eq!((c, status.as_str()), (child, "exited (exit status: 3)"));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    // Its stderr went to the engine that holds it, tagged with the child.
    assert_eq!(stderr, [(child, Bytes::from("careful"))]);
    let mut failed = spec("/nonexistent/server", &[]);
    failed.cwd = Some("/".into());
    engine.send(ToKeeper::Spawn { req: 9, spec: failed }).await;
    match engine.next_main().await {
        ToEngine::SpawnFailed { req: 9, error } => {
            assert!(error.starts_with("cannot start `/nonexistent/server` in /: No such file"), "{error}")
        }
        other => panic!("{other:?}"),
    }
}

const ECHO: &str = "import sys\nfor line in sys.stdin: print('echo: ' + line.strip())";

#[tokio::test]
async fn a_line_already_written_is_not_written_again_even_by_a_new_engine() {
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let (child, _) = engine.spawn(python(ECHO)).await;
    let write = |seq: u64, line: &'static str| ToKeeper::Write { child, seq, tag: Bytes::new(), line: Bytes::from(line) };
    for (seq, line) in [(1, "a"), (2, "b"), (2, "b"), (1, "a"), (3, "c")] {
        engine.send(write(seq, line)).await;
    }
    // (`Written` comes for a resend at once, else every WRITTEN_EVERY lines.)
    let mut echoes = Vec::new();
    while echoes.len() < 3 {
        match engine.next().await {
            ToEngine::Written { .. } => {}
            ToEngine::Line { frame, line, .. } => echoes.push((frame, String::from_utf8_lossy(&line).into_owned())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(echoes, [(1, "echo: a".to_owned()), (2, "echo: b".to_owned()), (3, "echo: c".to_owned())]);
    engine.send(ToKeeper::Ack { child, upto: 3 }).await;
    engine.crash().await;

    // A new engine resends what it had not seen confirmed: skipped.
    let (mut engine, _) = Engine::connect(&children, 2).await;
    engine.send(ToKeeper::Attach { child, after: 3 }).await;
    assert!(matches!(engine.next_main().await, ToEngine::Attached { written: 3, .. }));
    engine.send(write(2, "b")).await;
    engine.send(write(3, "c")).await;
    engine.send(write(4, "end")).await;
    assert_eq!(line_of(&engine.next_main().await), (child, 4, "echo: end".into()));
    children.stop_all(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_flooding_child_with_no_engine_is_paused_and_then_everything_arrives_in_order() {
    const LINES: u64 = 3000;
    const HOLD: u64 = 64 * 1024;
    const LINE: u64 = 1000;
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let script = format!("import sys\nfor i in range(1, {LINES} + 1): sys.stdout.write('%06d' % i + 'x' * {} + '\\n')", LINE - 6);
    let mut flood = python(&script);
    flood.hold_bytes = HOLD;
    let (child, pid) = engine.spawn(flood).await;
    engine.crash().await;

    // Held with no engine: the count climbs past the bound by at most one line, and stays.
    let (mut engine, _) = Engine::connect(&children, 2).await;
    let mut req = 0;
    let mut status = async |engine: &mut Engine| {
        req += 1;
        engine.send(ToKeeper::Status { req }).await;
        match engine.next_main().await {
            ToEngine::Status { held_bytes, .. } => held_bytes,
            other => panic!("{other:?}"),
        }
    };
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let held = status(&mut engine).await;
        assert!(held <= HOLD + LINE, "{held} bytes held");
        if held > HOLD {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the keeper never reached its bound ({held} bytes)");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..10 {
        assert!(status(&mut engine).await <= HOLD + LINE);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!gone(pid), "the child is blocked on its pipe, not gone");
    // A paused child blocks nobody else.
    let (echo, _) = engine.spawn(python(ECHO)).await;
    engine.send(ToKeeper::Write { child: echo, seq: 1, tag: Bytes::new(), line: Bytes::from("still here") }).await;
    assert_eq!(line_of(&engine.next_main().await), (echo, 1, "echo: still here".into()));

    engine.send(ToKeeper::Attach { child, after: 0 }).await;
    assert!(matches!(engine.next_main().await, ToEngine::Attached { .. }));
    let mut n = 0;
    loop {
        match engine.next_main().await {
            ToEngine::Line { frame, line, .. } => {
                n += 1;
                assert_eq!(frame, n);
                assert_eq!(line.len() as u64, LINE);
                assert_eq!(&line[..6], format!("{n:06}").as_bytes());
                if n % 50 == 0 {
                    engine.send(ToKeeper::Ack { child, upto: n }).await;
                }
            }
            ToEngine::Exited { status, .. } => {
                assert_eq!(status, "exited (exit status: 0)");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(n, LINES);
}

#[tokio::test]
async fn open_tags_come_back_on_attach_and_done_removes_them() {
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let (child, _) = engine.spawn(python(ECHO)).await;
    for (seq, tag) in [(1, "s1/r1"), (2, "s1/r2"), (3, "s2/r1")] {
        engine.send(ToKeeper::Write { child, seq, tag: Bytes::from(tag), line: Bytes::from("x") }).await;
    }
    engine.send(ToKeeper::Done { child, tags: vec![Bytes::from("s1/r2")] }).await;
    // The Status answer comes after every frame above was handled.
    engine.send(ToKeeper::Status { req: 1 }).await;
    while !matches!(engine.next().await, ToEngine::Status { .. }) {}
    engine.crash().await;
    let (mut engine, _) = Engine::connect(&children, 2).await;
    engine.send(ToKeeper::Attach { child, after: 0 }).await;
    match engine.next_main().await {
        ToEngine::Attached { open, .. } => assert_eq!(open, [Bytes::from("s1/r1"), Bytes::from("s2/r1")]),
        other => panic!("{other:?}"),
    }
    children.stop_all(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn an_orphan_is_stopped_after_its_time_and_stop_kills_the_whole_group() {
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let mut orphan = spec("sh", &["-c", "sleep 1000"]);
    orphan.orphan_ms = 300;
    let (orphan_child, orphan_pid) = engine.spawn(orphan).await;
    let (group, leader) = engine.spawn(spec("sh", &["-c", "sleep 1000 & echo $!; wait"])).await;
    let grandchild: u32 = line_of(&engine.next_main().await).2.parse().unwrap();
    engine.send(ToKeeper::Release { child: group }).await;
    engine.crash().await;

    until("the orphan to be stopped", || gone(orphan_pid)).await;
    until("the orphan to be forgotten", || children.kept().iter().all(|k| k.child != orphan_child)).await;

    let (mut engine, kept) = Engine::connect(&children, 2).await;
    assert!(kept.iter().any(|k| k.child == group));
    engine.send(ToKeeper::Attach { child: orphan_child, after: 0 }).await;
    assert!(matches!(engine.next_main().await, ToEngine::AttachFailed { reason, .. } if reason.starts_with("no such child")));
    engine.send(ToKeeper::Attach { child: group, after: 1 }).await;
    assert!(matches!(engine.next_main().await, ToEngine::Attached { .. }));
    engine.send(ToKeeper::Stop { child: group }).await;
    match engine.next_main().await {
        ToEngine::Exited { child, status } => assert_eq!((child, status.as_str()), (group, "was killed by signal 9")),
        other => panic!("{other:?}"),
    }
    assert!(gone(leader));
    until("the grandchild to go with its group", || gone(grandchild)).await;

    // A child no engine holds, stopped by one that never attached it: it hears `Exited` too.
    let (unheld, _) = engine.spawn(spec("sleep", &["1000"])).await;
    engine.send(ToKeeper::Release { child: unheld }).await;
    engine.send(ToKeeper::Stop { child: unheld }).await;
    match engine.next_main().await {
        ToEngine::Exited { child, status } => assert_eq!((child, status.as_str()), (unheld, "was killed by signal 9")),
        other => panic!("{other:?}"),
    }
    until("the stopped child to be forgotten", || children.kept().iter().all(|k| k.child != unheld)).await;
}

#[tokio::test]
async fn an_engine_of_another_version_is_refused_and_the_connection_closes() {
    let children = children();
    let mut engine = Engine::open(&children, 1);
    engine.send(ToKeeper::Hello { version: proto::VERSION + 1, pid: 1 }).await;
    match engine.next().await {
        ToEngine::Refused { reason } => {
            assert!(reason.starts_with(&format!("engine speaks keeper protocol {}", proto::VERSION + 1)), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(engine.try_next().await.is_none());
    assert!(matches!(engine.serving.await.unwrap(), EngineGone::Refused(_)));
    // A frame that cannot be read ends the connection, not the keeper.
    let mut engine = Engine::open(&children, 2);
    engine.stream.write_all(&[1, 0, 0, 0, 200]).await.unwrap();
    assert!(engine.try_next().await.is_none());
    assert!(matches!(engine.serving.await.unwrap(), EngineGone::Broken(_)));
}

#[tokio::test]
async fn an_attach_waits_for_the_engine_holding_the_child_to_let_go_or_to_go() {
    let children = children();
    let (mut first, _) = Engine::connect(&children, 1).await;
    let (child, _) = first.spawn(python(ECHO)).await;
    let (mut second, _) = Engine::connect(&children, 2).await;
    second.send(ToKeeper::Attach { child, after: 0 }).await;
    // Still waiting: the Status asked after it is answered first.
    second.send(ToKeeper::Status { req: 5 }).await;
    assert!(matches!(second.next_main().await, ToEngine::Status { req: 5, .. }));
    first.send(ToKeeper::Release { child }).await;
    assert!(matches!(second.next_main().await, ToEngine::Attached { child: c, .. } if c == child));

    // A third waits for the second, which crashes.
    let (mut third, _) = Engine::connect(&children, 3).await;
    third.send(ToKeeper::Attach { child, after: 0 }).await;
    third.send(ToKeeper::Status { req: 6 }).await;
    assert!(matches!(third.next_main().await, ToEngine::Status { req: 6, .. }));
    second.crash().await;
    assert!(matches!(third.next_main().await, ToEngine::Attached { child: c, .. } if c == child));
    third.send(ToKeeper::Write { child, seq: 1, tag: Bytes::new(), line: Bytes::from("mine") }).await;
    assert_eq!(line_of(&third.next_main().await), (child, 1, "echo: mine".into()));
    children.stop_all(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn an_over_long_line_is_one_frame_of_its_length_head_and_tail() {
    let children = children();
    let (mut engine, _) = Engine::connect(&children, 1).await;
    let mut long = python("print('{' + 'x' * 998 + '}')\nprint('short')");
    long.max_line = 100;
    let (child, _) = engine.spawn(long).await;
    match engine.next_main().await {
        ToEngine::TooLong { child: c, frame: 1, len: 1000, head, tail } => {
            assert_eq!((c, head.len(), tail.len()), (child, 100, 512));
            assert!(head.starts_with(b"{x") && tail.ends_with(b"x}"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(line_of(&engine.next_main().await), (child, 2, "short".into()));
}
