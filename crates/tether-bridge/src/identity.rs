//! Host identity: which process launched the bridge, as its PID and start time.
//!
//! A desktop host (an IDE, a chat app, an agent) starts `tether bridge`, often
//! through a launcher (`sh -c`, `env`, `npx`, `uvx`). The host is the first
//! ancestor that is not such a wrapper; its PID plus its start time name one
//! process instance, so a reused PID never maps to another host's token.
//!
//! Linux reads `/proc/<pid>/stat` (start time in clock ticks since boot, field
//! 22, parsed after the last `)` because process names may contain spaces and
//! parentheses) through `procfs`; macOS reads `pbi_start_tvsec` and
//! `pbi_start_tvusec` through `libproc`. Anything uncertain (PID 0 or 1, an
//! unreadable start time, too many wrappers) is an error, and the caller
//! disables resume: losing a session beats resuming the wrong one.

use std::fmt;

/// How many launcher wrappers are walked past before giving up.
pub const MAX_WRAPPER_DEPTH: usize = 8;

/// One host process instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostIdentity {
    pub pid: u32,
    /// Platform start time: clock ticks since boot (Linux), microseconds since
    /// the epoch (macOS). Only ever compared for equality.
    pub start_time: u64,
}

impl HostIdentity {
    /// `token-<pid>-<start time>`: the token file's name.
    pub fn file_name(&self) -> String {
        format!("token-{}-{}", self.pid, self.start_time)
    }

    /// The identity encoded in a token directory entry: `token-<pid>-<start>`
    /// optionally followed by `.lock` or `.tmp-…`. `None` for anything else.
    pub fn from_file_name(name: &str) -> Option<HostIdentity> {
        let rest = name.strip_prefix("token-")?;
        let stem = rest.split_once('.').map_or(rest, |(stem, _)| stem);
        let (pid, start) = stem.split_once('-')?;
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(pid) || !all_digits(start) {
            return None;
        }
        Some(HostIdentity { pid: pid.parse().ok()?, start_time: start.parse().ok()? })
    }
}

impl fmt::Display for HostIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} started at {}", self.pid, self.start_time)
    }
}

/// What the bridge needs to know about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub start_time: u64,
    /// The kernel's short name (`comm`, at most 15 bytes on Linux).
    pub name: String,
    /// Base name of the executable, when readable.
    pub exe: Option<String>,
    /// The first few command-line arguments, when readable.
    pub argv: Vec<String>,
}

/// A view of the process table (the real one, or a fake in tests).
pub trait ProcessTable {
    /// `None` when the process does not exist or cannot be read.
    fn info(&self, pid: u32) -> Option<ProcessInfo>;

    /// Only the start time (cheaper on some platforms).
    fn start_time(&self, pid: u32) -> Option<u64> {
        self.info(pid).map(|p| p.start_time)
    }
}

/// Why the host could not be identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the host PID would be {0}, which is never a host")]
    ReservedPid(u32),
    #[error("cannot read process {0}")]
    Unreadable(u32),
    #[error("more than {MAX_WRAPPER_DEPTH} launcher wrappers between the host and the bridge")]
    TooDeep,
}

/// Shells and launchers that sit between a host and the bridge.
const WRAPPERS: &[&str] = &["sh", "bash", "dash", "zsh", "fish", "env", "npm", "npx", "uv", "uvx"];
/// npm's entry scripts when node runs them directly.
const NPM_SCRIPTS: &[&str] = &["npm", "npx", "npm-cli.js", "npx-cli.js"];

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether `p` is a launcher wrapper to walk past rather than the host.
pub fn is_wrapper(p: &ProcessInfo) -> bool {
    let argv0 = p.argv.first().map(String::as_str).unwrap_or("");
    // A login shell shows as `-bash`; npm retitles itself `npm exec …`.
    let argv0_name = base_name(argv0.split(' ').next().unwrap_or("")).trim_start_matches('-');
    let comm_word = p.name.split(' ').next().unwrap_or("");
    let names = [p.name.as_str(), comm_word, p.exe.as_deref().unwrap_or(""), argv0_name];
    if names.iter().any(|n| WRAPPERS.contains(n)) {
        return true;
    }
    let is_node = names.iter().any(|n| *n == "node" || *n == "nodejs" || n.starts_with("node-"));
    let runs_npm = p.argv.get(1).is_some_and(|a| NPM_SCRIPTS.contains(&base_name(a)));
    is_node && runs_npm
}

/// The host: `override_pid` as given, or the first non-wrapper ancestor
/// starting at `parent` (the bridge's own parent).
pub fn detect_host(table: &dyn ProcessTable, parent: u32, override_pid: Option<u32>) -> Result<HostIdentity, IdentityError> {
    let usable = |pid: u32| if pid <= 1 { Err(IdentityError::ReservedPid(pid)) } else { Ok(pid) };
    if let Some(pid) = override_pid {
        let pid = usable(pid)?;
        let start_time = table.start_time(pid).ok_or(IdentityError::Unreadable(pid))?;
        return Ok(HostIdentity { pid, start_time });
    }
    let mut pid = parent;
    for _ in 0..=MAX_WRAPPER_DEPTH {
        let info = table.info(usable(pid)?).ok_or(IdentityError::Unreadable(pid))?;
        if !is_wrapper(&info) {
            return Ok(HostIdentity { pid, start_time: info.start_time });
        }
        pid = info.ppid;
    }
    Err(IdentityError::TooDeep)
}

/// The fields of a Linux `/proc/<pid>/stat` line the bridge uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFields {
    pub pid: u32,
    pub name: String,
    pub ppid: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
}

/// Parses a `/proc/<pid>/stat` line (the name is everything between the first
/// `(` and the LAST `)`; the numbers are counted after that `)`).
#[cfg(target_os = "linux")]
pub fn parse_stat(bytes: &[u8]) -> Option<StatFields> {
    use procfs::FromRead;
    // procfs slices around the parentheses; refuse shapes the kernel never
    // writes before handing it the line, so nothing can index out of range.
    let open = bytes.iter().position(|b| *b == b'(')?;
    let close = bytes.iter().rposition(|b| *b == b')')?;
    let fields_follow = bytes.get(close + 2..).is_some_and(|rest| rest.iter().any(|b| !b.is_ascii_whitespace()));
    if !bytes.first()?.is_ascii_digit()
        || open < 2
        || open > close
        || bytes[open - 1] != b' '
        || bytes.get(close + 1) != Some(&b' ')
        || !fields_follow
    {
        return None;
    }
    let stat = procfs::process::Stat::from_read(bytes).ok()?;
    Some(StatFields {
        pid: u32::try_from(stat.pid).ok()?,
        name: stat.comm,
        ppid: u32::try_from(stat.ppid).ok()?,
        start_time: stat.starttime,
    })
}

/// The machine's own process table.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemProcesses;

/// How many command-line arguments are kept (the wrapper test needs two).
#[cfg(target_os = "linux")]
const ARGV_KEPT: usize = 4;

#[cfg(target_os = "linux")]
impl ProcessTable for SystemProcesses {
    fn info(&self, pid: u32) -> Option<ProcessInfo> {
        let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let fields = parse_stat(&stat)?;
        let exe = process.exe().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let mut argv = process.cmdline().unwrap_or_default();
        argv.truncate(ARGV_KEPT);
        Some(ProcessInfo { pid, ppid: fields.ppid, start_time: fields.start_time, name: fields.name, exe, argv })
    }

    fn start_time(&self, pid: u32) -> Option<u64> {
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        parse_stat(&stat).map(|f| f.start_time)
    }
}

#[cfg(target_os = "macos")]
impl ProcessTable for SystemProcesses {
    fn info(&self, pid: u32) -> Option<ProcessInfo> {
        use libproc::bsd_info::BSDInfo;
        use libproc::proc_pid::{pidinfo, pidpath};
        let raw = i32::try_from(pid).ok()?;
        let info = pidinfo::<BSDInfo>(raw, 0).ok()?;
        let start_time = macos_start_time(info.pbi_start_tvsec, info.pbi_start_tvusec)?;
        let name = c_chars_to_string(&info.pbi_comm);
        let exe = pidpath(raw).ok().map(|p| base_name(&p).to_owned());
        // argv needs KERN_PROCARGS2; the executable name covers the wrappers
        // except node running npm, which then counts as the host (safe: the
        // session is merely not resumed).
        Some(ProcessInfo { pid, ppid: info.pbi_ppid, start_time, name, exe, argv: Vec::new() })
    }
}

#[cfg(target_os = "macos")]
fn macos_start_time(sec: u64, usec: u64) -> Option<u64> {
    sec.checked_mul(1_000_000)?.checked_add(usec)
}

#[cfg(target_os = "macos")]
fn c_chars_to_string(raw: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
impl ProcessTable for SystemProcesses {
    fn info(&self, _pid: u32) -> Option<ProcessInfo> {
        None
    }
}

/// The bridge's own parent PID.
pub fn own_parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeTable(HashMap<u32, ProcessInfo>);

    impl FakeTable {
        fn add(&mut self, pid: u32, ppid: u32, name: &str, argv: &[&str]) -> &mut Self {
            let info = ProcessInfo {
                pid,
                ppid,
                start_time: u64::from(pid) * 100,
                name: name.to_owned(),
                exe: None,
                argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            };
            self.0.insert(pid, info);
            self
        }
    }

    impl ProcessTable for FakeTable {
        fn info(&self, pid: u32) -> Option<ProcessInfo> {
            self.0.get(&pid).cloned()
        }
    }

    #[cfg(target_os = "linux")]
    fn stat_line(pid: u32, name: &str, ppid: u32, start: u64) -> String {
        // 52 fields as in a current kernel; field 22 is the start time.
        let mut fields: Vec<String> = vec![pid.to_string(), format!("({name})"), "S".into(), ppid.to_string()];
        fields.extend((5..=21).map(|i| i.to_string()));
        fields.push(start.to_string());
        fields.extend((23..=52).map(|i| i.to_string()));
        fields.join(" ") + "\n"
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn stat_parsing_counts_fields_after_the_last_parenthesis() {
        for name in ["code", "Visual Studio Code", "a) S 1 2 (3", "((())", ") 99 99 99", "x y) 7 (z", "", "tab\there"] {
            let line = stat_line(4242, name, 77, 123_456_789);
            let fields = parse_stat(line.as_bytes()).unwrap_or_else(|| panic!("parses {name:?}"));
            assert_eq!(fields, StatFields { pid: 4242, name: name.to_owned(), ppid: 77, start_time: 123_456_789 }, "{name:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn stat_parsing_refuses_malformed_lines_without_panicking() {
        let good = stat_line(10, "host (x)", 2, 555);
        for cut in 0..good.len() {
            // Any prefix either parses to the same identity or is refused.
            if let Some(f) = parse_stat(&good.as_bytes()[..cut]) {
                assert_eq!((f.pid, f.ppid), (10, 2));
            }
        }
        for bad in [
            "",
            ")",
            "(",
            "()",
            "(x) S 1",
            "12 (x)",
            "12 (x) ",
            "12 (x)S",
            "x (y) S 1 2",
            "12 (x) S notanumber",
            "1é(x) S 1",
            "12(x) S 1",
            "12 ) 1 2 (x 3",
        ] {
            assert!(parse_stat(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_real_table_knows_this_process_and_its_parent() {
        let me = SystemProcesses.info(std::process::id()).expect("own process readable");
        assert_eq!(me.ppid, own_parent_pid());
        assert!(me.start_time > 0);
        assert_eq!(SystemProcesses.start_time(std::process::id()), Some(me.start_time));
        assert!(SystemProcesses.info(u32::MAX - 7).is_none());
    }

    #[test]
    fn wrappers_are_recognised_by_name_executable_or_npm_script() {
        let p = |name: &str, exe: Option<&str>, argv: &[&str]| ProcessInfo {
            name: name.into(),
            exe: exe.map(Into::into),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        for w in [
            p("sh", None, &["sh", "-c", "tether bridge"]),
            p("bash", Some("bash"), &[]),
            p("dash", None, &[]),
            p("zsh", None, &["-zsh"]),
            p("fish", None, &[]),
            p("env", None, &["env", "FOO=1"]),
            p("uv", None, &["uv", "run"]),
            p("uvx", None, &["uvx", "tether"]),
            p("npx", None, &["npx", "tether"]),
            p("npm exec tethe", None, &["npm exec tether-bridge"]),
            p("node", Some("node"), &["node", "/usr/lib/node_modules/npm/bin/npx-cli.js", "tether"]),
            p("node", None, &["/usr/bin/node", "/usr/local/bin/npm", "exec", "tether"]),
            p("MainThread", Some("bash"), &[]),
            p("x", None, &["-bash"]),
        ] {
            assert!(is_wrapper(&w), "{w:?}");
        }
        for host in [
            p("code", Some("code"), &["/usr/share/code/code"]),
            p("claude", None, &["claude"]),
            p("node", Some("node"), &["node", "/opt/app/server.js"]),
            p("bashful", None, &["bashful"]),
            p("python3", None, &["python3", "agent.py"]),
            p("", None, &[]),
        ] {
            assert!(!is_wrapper(&host), "{host:?}");
        }
    }

    #[test]
    fn walking_skips_wrappers_up_to_the_host() {
        let mut t = FakeTable::default();
        t.add(100, 1, "code", &["code"])
            .add(200, 100, "sh", &["sh", "-c", "npx tether bridge"])
            .add(300, 200, "node", &["node", "/usr/lib/node_modules/npm/bin/npx-cli.js"])
            .add(400, 300, "env", &["env"]);
        assert_eq!(detect_host(&t, 400, None), Ok(HostIdentity { pid: 100, start_time: 10_000 }));
        assert_eq!(detect_host(&t, 100, None), Ok(HostIdentity { pid: 100, start_time: 10_000 }));
        // An override is taken as is (no walking), but still checked.
        assert_eq!(detect_host(&t, 400, Some(200)), Ok(HostIdentity { pid: 200, start_time: 20_000 }));
        assert_eq!(detect_host(&t, 400, Some(999)), Err(IdentityError::Unreadable(999)));
        assert_eq!(detect_host(&t, 400, Some(1)), Err(IdentityError::ReservedPid(1)));
        assert_eq!(detect_host(&t, 400, Some(0)), Err(IdentityError::ReservedPid(0)));
    }

    #[test]
    fn walking_gives_up_at_init_unreadable_parents_and_depth() {
        let mut t = FakeTable::default();
        // A wrapper whose parent is init: no host to name.
        t.add(50, 1, "bash", &[]);
        assert_eq!(detect_host(&t, 50, None), Err(IdentityError::ReservedPid(1)));
        assert_eq!(detect_host(&t, 0, None), Err(IdentityError::ReservedPid(0)));
        // A wrapper whose parent cannot be read.
        t.add(60, 61, "sh", &[]);
        assert_eq!(detect_host(&t, 60, None), Err(IdentityError::Unreadable(61)));
        // A long chain of shells.
        let mut chain = FakeTable::default();
        chain.add(1000, 1, "host", &[]);
        for pid in 1001..1001 + MAX_WRAPPER_DEPTH as u32 + 1 {
            chain.add(pid, pid - 1, "sh", &[]);
        }
        let top = 1000 + MAX_WRAPPER_DEPTH as u32 + 1;
        assert_eq!(detect_host(&chain, top, None), Err(IdentityError::TooDeep));
        assert_eq!(detect_host(&chain, top - 1, None), Ok(HostIdentity { pid: 1000, start_time: 100_000 }));
    }

    #[test]
    fn file_names_round_trip_and_reject_other_names() {
        let id = HostIdentity { pid: 4321, start_time: 98_765 };
        assert_eq!(id.file_name(), "token-4321-98765");
        assert_eq!(HostIdentity::from_file_name("token-4321-98765"), Some(id));
        assert_eq!(HostIdentity::from_file_name("token-4321-98765.lock"), Some(id));
        assert_eq!(HostIdentity::from_file_name("token-4321-98765.tmp-00ff"), Some(id));
        for other in [
            "token-",
            "token-1",
            "token-1-",
            "token--2",
            "token-a-2",
            "token-1-2x",
            "tokens-1-2",
            "x",
            "token-1-2-3",
            "token-99999999999-1",
        ] {
            assert_eq!(HostIdentity::from_file_name(other), None, "{other}");
        }
    }
}
