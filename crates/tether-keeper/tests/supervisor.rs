//! The keeper process, run for real (this test binary started again as the
//! keeper, see [`keeper_process`]) with a fake engine: a Python script that
//! speaks just enough of the control protocol (Hello, the listening socket
//! from Welcome's SCM_RIGHTS, a Spawn, Handover) and answers every
//! connection on the port with `hi`. Every wait is on an event, bounded by
//! a generous deadline.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use tether_keeper::supervisor::{KeeperConfig, run};

const DEADLINE: Duration = Duration::from_secs(30);

/// Not a test: the keeper itself, when this binary is started with
/// `KEEPER_TEST=ADDR|PROGRAM|ARG…` (see [`Keeper::start`]).
#[test]
fn keeper_process() {
    let Ok(config) = std::env::var("KEEPER_TEST") else { return };
    let mut parts = config.split('|');
    let addr: SocketAddr = parts.next().unwrap().parse().unwrap();
    let program = PathBuf::from(parts.next().unwrap());
    let engine_args = parts.map(Into::into).collect();
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).init();
    let code = run(KeeperConfig { listeners: vec![("listen".into(), addr)], program, engine_args });
    std::process::exit(code);
}

const FAKE_ENGINE: &str = r#"#!/usr/bin/env python3
import os, select, signal, socket, struct, subprocess, sys, threading
VERSION = @VERSION@
if sys.argv[1] == 'keeper-protocol':
    print(VERSION)
    sys.exit(0)
assert sys.argv[1] == 'engine', sys.argv
out, modes = sys.argv[2], sys.argv[3:]
def frame(kind, body): return struct.pack('<IB', len(body) + 1, kind) + body
def b(x): x = x.encode(); return struct.pack('<I', len(x)) + x
def note(name, line):
    with open(os.path.join(out, name), 'a') as f: f.write(line + '\n')
if 'stubborn' in modes:
    # Notes SIGHUP and SIGTERM, and drains forever.
    signal.signal(signal.SIGHUP, lambda *_: note('signals', 'HUP'))
    signal.signal(signal.SIGTERM, lambda *_: note('signals', 'TERM'))
elif 'fails' in modes:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(3))
ctl = socket.socket(fileno=0)
ctl.sendall(frame(1, struct.pack('<II', 1, os.getpid())))
data, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 8)
assert data[4] == 1 and len(fds) == 1, (data, fds)
buf = bytearray(data[4 + struct.unpack('<I', data[:4])[0]:])
def next_frame():
    global buf
    while len(buf) < 4 or len(buf) < 4 + struct.unpack('<I', buf[:4])[0]:
        more = ctl.recv(1 << 16)
        if not more: os._exit(3)
        buf += more
    n = struct.unpack('<I', buf[:4])[0]
    f, buf = bytes(buf[4:4 + n]), buf[4 + n:]
    return f
note('engines', '%d %s' % (os.getpid(), os.environ['TETHER_KEEPER_LISTENERS']))
if 'never-ready' not in modes:
    ctl.sendall(frame(10, b''))
if 'exit-early' in modes:
    os._exit(5)
welcome = data[5:4 + struct.unpack('<I', data[:4])[0]]
count, at, kept = struct.unpack('<I', welcome[20:24])[0], 24, []
for _ in range(count):
    kept.append(struct.unpack('<Q', welcome[at:at + 8])[0])
    at += 16 + struct.unpack('<I', welcome[at + 12:at + 16])[0] + 1
if 'attach' in modes:
    for child in kept:
        ctl.sendall(frame(3, struct.pack('<QQ', child, 0)))
        note('attached', '%d %s' % (child, {5: 'attached', 6: 'failed'}.get(next_frame()[0], '?')))
if 'leak' in modes and not kept:
    # Something the engine starts keeps its stdin (the control socket) open.
    note('leaks', str(subprocess.Popen(['sleep', '1000']).pid))
if 'spawn' in modes and not kept:
    spec = (b('sleep') + struct.pack('<I', 1) + b('1000') + struct.pack('<I', 1) + b('PATH') + b(os.environ['PATH'])
            + b'\0' + struct.pack('<QQQ', 1 << 20, 1 << 20, 600000) + b('sleep'))
    ctl.sendall(frame(2, struct.pack('<Q', 1) + spec))
    f = next_frame()
    assert f[0] == 3, f
    note('children', str(struct.unpack('<I', f[17:21])[0]))
handover = threading.Event()
def control():
    while True:
        if next_frame()[0] == 13:
            handover.set()
threading.Thread(target=control, daemon=True).start()
# The listening socket's file description is shared with the keeper and the
# next engine: select, never settimeout (that would make it non-blocking for all).
listener = socket.socket(fileno=fds[0])
while not handover.is_set():
    if select.select([listener], [], [], 0.05)[0]:
        conn, _ = listener.accept()
        conn.sendall(b'hi\n')
        conn.close()
os._exit(0)
"#;

struct Keeper {
    process: Child,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Keeper {
    /// A keeper on a port of its own (it binds port 0; its log says which).
    fn start(version: u32, modes: &[&str]) -> Self {
        let mut keeper = Self::start_on("127.0.0.1:0".parse().unwrap(), version, modes);
        until("the keeper to listen", || keeper.log().contains("listening on"));
        let log = keeper.log();
        let bound = log.split("listening on ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap();
        keeper.addr = bound.parse().unwrap();
        keeper
    }

    fn start_on(addr: SocketAddr, version: u32, modes: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("fake-tether");
        std::fs::write(&program, FAKE_ENGINE.replace("@VERSION@", &version.to_string())).unwrap();
        std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut config = format!("{addr}|{}|{}", program.display(), dir.path().display());
        for mode in modes {
            config.push('|');
            config.push_str(mode);
        }
        let log = std::fs::File::create(dir.path().join("keeper.log")).unwrap();
        let process = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "keeper_process", "--nocapture"])
            .env("KEEPER_TEST", config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { process, dir, addr }
    }

    fn pid(&self) -> u32 {
        self.process.id()
    }

    fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    /// The engines started so far, in order.
    fn engines(&self) -> Vec<u32> {
        self.lines("engines").iter().map(|l| l.split(' ').next().unwrap().parse().unwrap()).collect()
    }

    fn children(&self) -> Vec<u32> {
        self.lines("children").iter().map(|l| l.parse().unwrap()).collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("keeper.log")).unwrap_or_default()
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal);
    }

    /// Waits for the keeper to exit: its exit code (None: killed).
    fn exit(&mut self) -> Option<i32> {
        until("the keeper to exit", || self.process.try_wait().unwrap().is_some());
        self.process.wait().unwrap().code()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the keeper's log (and its engines' stderr):\n{}", self.log());
        }
        if self.process.try_wait().ok().flatten().is_none() {
            kill(self.pid(), Signal::KILL);
            let _ = self.process.wait();
        }
    }
}

/// A process the test started outside the keeper's care.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(Pid::from_raw(self.0 as i32).unwrap(), Signal::KILL);
    }
}

fn kill(pid: u32, signal: Signal) {
    rustix::process::kill_process(Pid::from_raw(pid as i32).unwrap(), signal).unwrap();
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the process is gone (no such pid, or a zombie).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Connects to the port again and again: answered, refused, other failures.
struct ConnectLoop {
    stop: Arc<AtomicBool>,
    counts: Arc<[AtomicU64; 3]>,
    thread: std::thread::JoinHandle<()>,
}

impl ConnectLoop {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
        let (s, c) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let outcome = match TcpStream::connect(addr) {
                    Ok(mut stream) => {
                        stream.set_read_timeout(Some(DEADLINE)).unwrap();
                        let mut answer = String::new();
                        match stream.read_to_string(&mut answer) {
                            Ok(_) if answer == "hi\n" => 0,
                            _ => 2,
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => 1,
                    Err(_) => 2,
                };
                c[outcome].fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self { stop, counts, thread }
    }

    fn answered(&self) -> u64 {
        self.counts[0].load(Ordering::Relaxed)
    }

    fn wait_answers(&self, more: u64) {
        let target = self.answered() + more;
        until("connections answered", || self.answered() >= target);
    }

    /// (answered, refused, failed otherwise)
    fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        let [a, r, f] = &*self.counts;
        (a.load(Ordering::Relaxed), r.load(Ordering::Relaxed), f.load(Ordering::Relaxed))
    }
}

/// Nobody listens there any more.
fn port_free(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

#[test]
fn the_port_stays_open_while_a_dead_engine_is_restarted() {
    let mut keeper = Keeper::start(1, &[]);
    until("the first engine", || keeper.engines().len() == 1);
    assert_eq!(keeper.lines("engines")[0].split(' ').nth(1), Some("listen"));
    let connects = ConnectLoop::start(keeper.addr);
    connects.wait_answers(5);
    let first = keeper.engines()[0];
    kill(first, Signal::KILL);
    until("a second engine", || keeper.engines().len() == 2);
    connects.wait_answers(5);
    let (answered, refused, failed) = connects.finish();
    // Never refused: the keeper holds the port. A connection the killed
    // engine had already accepted dies with it; the loop makes one at a
    // time, so at most one can have been there.
    assert_eq!(refused, 0, "{answered} answered, {failed} failed otherwise");
    assert!(
        failed <= 1,
        "{failed} connections failed otherwise ({answered} answered): more than the one the killed engine could hold"
    );
    assert_ne!(keeper.engines()[1], first);
    assert!(gone(first));
    let log = keeper.log();
    assert!(log.contains("WARN") && log.contains(&format!("the engine (pid {first}) was killed by signal 9")), "{log}");
    keeper.signal(Signal::TERM);
    assert_eq!(keeper.exit(), Some(0));
    until("the port to be free", || port_free(keeper.addr));
}

#[test]
fn sigterm_stops_the_engine_and_every_child_and_frees_the_port() {
    let mut keeper = Keeper::start(1, &["spawn"]);
    until("the engine's child", || keeper.children().len() == 1);
    let (engine, child) = (keeper.engines()[0], keeper.children()[0]);
    assert!(!gone(child));
    keeper.signal(Signal::TERM);
    assert_eq!(keeper.exit(), Some(0));
    assert!(gone(engine) && gone(child));
    until("the port to be free", || port_free(keeper.addr));
}

#[test]
fn when_the_keeper_is_killed_its_engine_and_children_die_and_the_port_is_freed() {
    let mut keeper = Keeper::start(1, &["spawn"]);
    until("the engine's child", || keeper.children().len() == 1);
    let (engine, child) = (keeper.engines()[0], keeper.children()[0]);
    keeper.signal(Signal::KILL);
    assert_eq!(keeper.exit(), None);
    until("the engine to die with the keeper", || gone(engine));
    until("the child to die with the keeper", || gone(child));
    until("the port to be free", || port_free(keeper.addr));
}

#[test]
fn sigusr2_with_a_binary_of_another_protocol_changes_nothing() {
    let keeper = Keeper::start(99, &[]);
    until("the first engine", || keeper.engines().len() == 1);
    keeper.signal(Signal::USR2);
    let refusal = "speaks keeper protocol 99, this keeper 1: not upgrading; the engine serving now goes on";
    until("the upgrade to be refused", || keeper.log().contains(refusal));
    assert_eq!(keeper.engines().len(), 1);
    assert!(!gone(keeper.engines()[0]));
    assert!(keeper.log().contains("ERROR"));
}

#[test]
fn sigusr2_hands_over_to_a_new_engine_without_a_refused_connection() {
    let keeper = Keeper::start(1, &["spawn"]);
    until("the engine's child", || keeper.children().len() == 1);
    let connects = ConnectLoop::start(keeper.addr);
    connects.wait_answers(5);
    let first = keeper.engines()[0];
    keeper.signal(Signal::USR2);
    until("the new engine", || keeper.engines().len() == 2);
    connects.wait_answers(5);
    let (_, refused, failed) = connects.finish();
    assert_eq!((refused, failed), (0, 0));
    until("the old engine to exit", || gone(first));
    assert!(keeper.log().contains("handed over"), "{}", keeper.log());
    // The child it started is kept for the new one.
    assert!(!gone(keeper.children()[0]));
}

#[test]
fn a_port_in_use_is_a_clear_error_and_exit_code_1() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut keeper = Keeper::start_on(taken.local_addr().unwrap(), 1, &[]);
    assert_eq!(keeper.exit(), Some(1));
    let log = keeper.log();
    assert!(log.contains(&format!("cannot listen on {}: ", taken.local_addr().unwrap())), "{log}");
    assert!(log.contains("is another server using it? pick another with --listen"), "{log}");
    assert!(keeper.engines().is_empty());
}

#[test]
fn a_restarted_engine_takes_the_children_even_if_the_old_one_left_its_socket_open() {
    let keeper = Keeper::start(1, &["spawn", "attach", "leak"]);
    until("the engine's child", || keeper.children().len() == 1);
    let leak: u32 = keeper.lines("leaks")[0].parse().unwrap();
    let _leak = KillOnDrop(leak);
    kill(keeper.engines()[0], Signal::KILL);
    let restarted = Instant::now();
    until("the new engine to attach the child", || !keeper.lines("attached").is_empty());
    let attached = keeper.lines("attached");
    assert_eq!(attached, ["1 attached"]);
    // Not the 30 s an Attach waits for a live engine: the dead one's connection was closed.
    assert!(restarted.elapsed() < Duration::from_secs(10), "{:?}", restarted.elapsed());
    assert_eq!(keeper.children().len(), 1, "the new engine started no child of its own");
}

#[test]
fn sighup_reaches_the_engine_and_a_second_sigterm_stops_a_draining_engine_at_once() {
    let mut keeper = Keeper::start(1, &["spawn", "stubborn"]);
    until("the engine's child", || keeper.children().len() == 1);
    let (engine, child) = (keeper.engines()[0], keeper.children()[0]);
    keeper.signal(Signal::HUP);
    until("the engine to get SIGHUP", || keeper.lines("signals") == ["HUP"]);
    keeper.signal(Signal::TERM);
    until("the engine to get SIGTERM", || keeper.lines("signals") == ["HUP", "TERM"]);
    // It drains (forever): the keeper waits, and so does the child.
    assert!(keeper.process.try_wait().unwrap().is_none());
    assert!(!gone(child));
    keeper.signal(Signal::TERM);
    assert_eq!(keeper.exit(), Some(128 + 9));
    assert!(gone(engine) && gone(child));
    assert!(keeper.log().contains("told to stop again: killing the engine and every child now"));
}

#[test]
fn the_keeper_exits_with_the_code_its_engine_failed_with_when_stopping() {
    let mut keeper = Keeper::start(1, &["fails"]);
    until("the first engine", || keeper.engines().len() == 1);
    keeper.signal(Signal::TERM);
    assert_eq!(keeper.exit(), Some(3));
}

#[test]
fn an_engine_that_exits_before_it_ever_served_stops_the_keeper_with_its_code() {
    // A bad flag or config: restarting would only fail again, and a
    // supervisor above (systemd, a container runtime) must see the failure.
    let mut keeper = Keeper::start(1, &["never-ready", "exit-early"]);
    assert_eq!(keeper.exit(), Some(5));
    assert_eq!(keeper.engines().len(), 1, "not restarted");
    assert!(keeper.log().contains("before it served: the keeper stops"), "{}", keeper.log());
    until("the port to be free", || port_free(keeper.addr));
}
