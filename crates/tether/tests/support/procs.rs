//! The processes a gateway test runs: `tether serve` itself (killed when
//! dropped), the stdio fixture of crates/tether-gateway, and the Python SDK
//! fixture of interop/servers.

use super::start_binary;

/// A running `tether serve`, killed (SIGKILL) when dropped, also when a test fails.
pub struct Tether(pub std::process::Child);

impl Tether {
    pub fn start(db: &std::path::Path, args: &[&str]) -> (Self, String) {
        let (child, url) = start_binary(db, args);
        (Self(child), url)
    }

    /// `kill -9`, as a crash would.
    pub fn crash(mut self) {
        self.kill();
    }

    /// `kill -9` of the keeper, then waits until its engine, which dies of
    /// its parent's death a moment later (and holds the store's lock until
    /// then), is gone too: a server started next on the same store must
    /// not find it in use.
    fn kill(&mut self) {
        let engines = children_of(self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while engines.iter().any(|&pid| alive(pid)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for Tether {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The live processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat_of(pid).is_some_and(|(state, ppid)| ppid == parent && state != 'Z'))
        .collect()
}

/// Whether `pid` runs (a zombie, or gone, does not).
fn alive(pid: u32) -> bool {
    stat_of(pid).is_some_and(|(state, _)| state != 'Z')
}

/// A process's state and parent, from `/proc/PID/stat` (after its `(comm)`).
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// The stdio fixture server (run with `python3`).
pub fn fixture() -> String {
    format!("{}/../tether-gateway/tests/fixtures/stdio_server.py", env!("CARGO_MANIFEST_DIR"))
}

/// A fixture server of `interop/servers/py_server.py` (the official Python
/// SDK) in `shape` on a free port; killed when dropped.
pub struct PyServer(pub std::process::Child);

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_py_server(shape: &str) -> (PyServer, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    start_py_server_on(shape, port)
}

/// [`start_py_server`] on `port` (a restart of one that was there).
pub fn start_py_server_on(shape: &str, port: u16) -> (PyServer, String) {
    use std::io::BufRead;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ensure = std::process::Command::new("bash").arg(root.join("interop/servers/ensure.sh")).output().unwrap();
    assert!(
        ensure.status.success(),
        "interop/servers/ensure.sh failed (this test needs python3 >= 3.10 with venv): {}",
        String::from_utf8_lossy(&ensure.stderr)
    );
    let mut child = std::process::Command::new(root.join("interop/py/.venv/bin/python"))
        .arg(root.join("interop/servers/py_server.py"))
        .args([shape, &port.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(match std::env::var_os("PY_SERVER_TRACE") {
            Some(_) => std::process::Stdio::inherit(),
            None => std::process::Stdio::null(),
        })
        .spawn()
        .expect("the Python SDK fixture starts");
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let ready = lines.next().and_then(Result::ok);
    assert_eq!(ready.as_deref(), Some("READY"), "py_server.py {shape} did not start");
    std::thread::spawn(move || for _ in lines {});
    (PyServer(child), format!("http://127.0.0.1:{port}/mcp"))
}
