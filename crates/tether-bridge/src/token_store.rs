//! `ResumeTokenStore`: everything about session resume on the bridge's side,
//! in one place (init, load, store, delete).
//!
//! The rest of the bridge asks for a token before it initializes the remote,
//! hands over every token the remote issues, and deletes the token the
//! remote refused. It never learns whether resume is enabled: when the host
//! cannot be identified, the token directory cannot be trusted, or another
//! instance of the same host holds the lock, this store keeps the token in
//! memory only (so a re-initialize after the remote forgot the session still
//! presents it) and never touches any file.
//!
//! On disk: `<token dir>/token-<host pid>-<host start time>` holds the token
//! as one line (`tt1_` + 64 lowercase hex + `\n`), written atomically (a
//! private temp file in the same directory, fsync, rename, fsync of the
//! directory). `token-….lock` next to it carries an exclusive `flock` for as
//! long as this bridge runs. At start, files of hosts that are gone (PID
//! absent, or alive with another start time: PID reuse) are removed, a
//! bounded number per start.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use crate::identity::{self, HostIdentity, ProcessTable, SystemProcesses};
use crate::token_dir::{self, Untrusted};

/// The only token shape the bridge stores or presents from a file.
pub const TOKEN_PREFIX: &str = "tt1_";
const TOKEN_HEX_LEN: usize = 64;
/// Bytes of a token file: prefix, hex, newline.
pub const TOKEN_FILE_LEN: usize = TOKEN_PREFIX.len() + TOKEN_HEX_LEN + 1;
/// Directory entries looked at per start during stale cleanup.
pub const CLEANUP_SCAN_LIMIT: usize = 1024;
/// Stale files removed per start at most.
pub const CLEANUP_REMOVE_LIMIT: usize = 64;

/// The exact log lines of the seed.
pub mod log_lines {
    pub const NOT_FOUND: &str = "Token file not found (first run or clean slate)";
    pub const CORRUPTED: &str = "Token file corrupted, treating as stale";
    pub const NO_IDENTITY: &str = "Could not verify parent process start time, session resume disabled for this instance";
    pub const REJECTED: &str = "Broker rejected resume token, starting fresh session";
    pub const RESUMED: &str = "Session resumed successfully";
    pub const WRITE_FAILED_PREFIX: &str = "Failed to write token file: ";
}

/// Where resume state lives and who the host is.
#[derive(Debug, Clone, Default)]
pub struct ResumeOptions {
    /// `--token-dir`; `None`: [`token_dir::default_token_dir`].
    pub token_dir: Option<PathBuf>,
    /// `--host-pid`; `None`: detect the host by walking up from the parent.
    pub host_pid: Option<u32>,
}

/// Whether `token` has the one shape a tether token has.
pub fn is_valid_token(token: &str) -> bool {
    token.len() == TOKEN_PREFIX.len() + TOKEN_HEX_LEN
        && token.starts_with(TOKEN_PREFIX)
        && token.as_bytes()[TOKEN_PREFIX.len()..].iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The token in a token file's bytes, if they are exactly one valid token
/// line; anything else (torn, padded, other shape) is corrupted.
pub fn parse_token_file(bytes: &[u8]) -> Option<String> {
    let line = bytes.strip_suffix(b"\n")?;
    let token = std::str::from_utf8(line).ok()?;
    is_valid_token(token).then(|| token.to_owned())
}

/// Resume state for one bridge instance. See the module docs.
#[derive(Debug)]
pub struct ResumeTokenStore {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// Memory only: no file is read or written.
    Disabled {
        token: Option<String>,
    },
    Enabled(OnDisk),
}

#[derive(Debug)]
struct OnDisk {
    dir: PathBuf,
    path: PathBuf,
    host: HostIdentity,
    /// Holds the exclusive `flock` until this store is dropped.
    _lock: File,
}

impl ResumeTokenStore {
    /// Sets up resume for the real host of this process.
    pub fn init(options: &ResumeOptions) -> Self {
        Self::init_with(&SystemProcesses, identity::own_parent_pid(), options)
    }

    /// Sets up resume with an explicit process table and parent (tests).
    pub fn init_with(table: &dyn ProcessTable, parent: u32, options: &ResumeOptions) -> Self {
        let disabled = Self { inner: Inner::Disabled { token: None } };
        let host = match identity::detect_host(table, parent, options.host_pid) {
            Ok(host) => host,
            Err(e) => {
                warn!("{}", log_lines::NO_IDENTITY);
                debug!("host identity: {e}");
                return disabled;
            }
        };
        let dir = options.token_dir.clone().unwrap_or_else(token_dir::default_token_dir);
        if let Err(e) = token_dir::prepare(&dir) {
            warn!("Token directory {} {e}; session resume disabled for this instance", dir.display());
            return disabled;
        }
        cleanup_stale(&dir, table, host);
        let path = dir.join(host.file_name());
        let lock_path = dir.join(format!("{}.lock", host.file_name()));
        let lock = match lock_exclusive(&lock_path) {
            Ok(lock) => lock,
            Err(LockError::Held) => {
                warn!(
                    "Another bridge instance of this host ({host}) holds {}, session resume disabled for this instance",
                    path.display()
                );
                return disabled;
            }
            Err(LockError::Other(e)) => {
                warn!("Cannot lock {}: {e}; session resume disabled for this instance", lock_path.display());
                return disabled;
            }
        };
        remove_own_temp_files(&dir, host);
        debug!("session resume enabled: host {host}, token file {}", path.display());
        Self { inner: Inner::Enabled(OnDisk { dir, path, host, _lock: lock }) }
    }

    /// The token to present with the next `initialize`, if there is one.
    pub fn load(&mut self) -> Option<String> {
        match &mut self.inner {
            Inner::Disabled { token } => token.clone(),
            Inner::Enabled(disk) => disk.load(),
        }
    }

    /// Keeps the token the remote just issued (every initialize rotates it).
    /// A failure is logged; the bridge carries on.
    pub fn store(&mut self, token: &str) {
        match &mut self.inner {
            Inner::Disabled { token: slot } => *slot = Some(token.to_owned()),
            Inner::Enabled(disk) => {
                if !is_valid_token(token) {
                    warn!("{}the remote issued a token of an unknown format", log_lines::WRITE_FAILED_PREFIX);
                    disk.delete();
                } else if let Err(e) = disk.write(token) {
                    warn!("{}{e}", log_lines::WRITE_FAILED_PREFIX);
                }
            }
        }
    }

    /// Forgets the token (the remote refused it).
    pub fn delete(&mut self) {
        match &mut self.inner {
            Inner::Disabled { token } => *token = None,
            Inner::Enabled(disk) => disk.delete(),
        }
    }

    /// The token file this instance owns, when resume is enabled (tests and
    /// diagnostics only; the bridge itself never asks).
    pub fn token_path(&self) -> Option<&Path> {
        match &self.inner {
            Inner::Enabled(disk) => Some(&disk.path),
            Inner::Disabled { .. } => None,
        }
    }
}

impl OnDisk {
    fn load(&mut self) -> Option<String> {
        let file = match token_dir::open_private_read(&self.path) {
            Ok(file) => file,
            Err(Untrusted::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                info!("{}", log_lines::NOT_FOUND);
                return None;
            }
            Err(e) => return self.corrupted(&e.to_string()),
        };
        let mut bytes = Vec::with_capacity(TOKEN_FILE_LEN + 1);
        // One byte more than a valid file: a longer file is corrupted too.
        if let Err(e) = file.take(TOKEN_FILE_LEN as u64 + 1).read_to_end(&mut bytes) {
            return self.corrupted(&e.to_string());
        }
        match parse_token_file(&bytes) {
            Some(token) => {
                debug!("loaded the resume token of host {}", self.host);
                Some(token)
            }
            None => self.corrupted(&format!("{} bytes that are not one token line", bytes.len())),
        }
    }

    fn corrupted(&mut self, detail: &str) -> Option<String> {
        warn!("{}", log_lines::CORRUPTED);
        debug!("token file {}: {detail}", self.path.display());
        self.delete();
        None
    }

    fn write(&self, token: &str) -> io::Result<()> {
        let temp = self.dir.join(format!("{}.tmp-{:016x}", self.host.file_name(), rand::random::<u64>()));
        let result = (|| {
            let mut file = token_dir::create_private_new(&temp)?;
            file.write_all(format!("{token}\n").as_bytes())?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&temp, &self.path)?;
            token_dir::sync_dir(&self.dir)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    fn delete(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!("Cannot delete token file {}: {e}", self.path.display()),
        }
    }
}

enum LockError {
    Held,
    Other(String),
}

fn lock_exclusive(path: &Path) -> Result<File, LockError> {
    let file = token_dir::open_private_lock(path).map_err(|e| LockError::Other(e.to_string()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK || e == rustix::io::Errno::AGAIN => Err(LockError::Held),
        Err(e) => Err(LockError::Other(io::Error::from(e).to_string())),
    }
}

/// Removes token, lock and temp files of hosts that are gone: the PID does
/// not exist, or it exists with another start time (PID reuse). Looks at
/// most [`CLEANUP_SCAN_LIMIT`] entries and removes at most
/// [`CLEANUP_REMOVE_LIMIT`]; returns how many it removed.
pub fn cleanup_stale(dir: &Path, table: &dyn ProcessTable, own: HostIdentity) -> usize {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            debug!("stale token cleanup skipped: {e}");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.take(CLEANUP_SCAN_LIMIT).flatten() {
        if removed >= CLEANUP_REMOVE_LIMIT {
            break;
        }
        let name = entry.file_name();
        let Some(host) = name.to_str().and_then(HostIdentity::from_file_name) else { continue };
        if host == own || (host.pid > 1 && table.start_time(host.pid) == Some(host.start_time)) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => debug!("cannot remove stale {}: {e}", entry.path().display()),
        }
    }
    if removed > 0 {
        info!("Removed {removed} token files of hosts that are gone");
    }
    removed
}

/// Temp files of this host left by a crash mid-write (only called while
/// holding the lock, so no writer of this host is running).
fn remove_own_temp_files(dir: &Path, host: HostIdentity) {
    let prefix = format!("{}.tmp-", host.file_name());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.take(CLEANUP_SCAN_LIMIT).flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ProcessInfo;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    const T1: &str = "tt1_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const T2: &str = "tt1_ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    /// A process table of hosts with their start times; the bridge's parent
    /// is the host itself.
    #[derive(Default, Clone)]
    struct Hosts(HashMap<u32, u64>);

    impl ProcessTable for Hosts {
        fn info(&self, pid: u32) -> Option<ProcessInfo> {
            let start_time = *self.0.get(&pid)?;
            Some(ProcessInfo { pid, ppid: 1, start_time, name: format!("host{pid}"), ..Default::default() })
        }
    }

    fn hosts(list: &[(u32, u64)]) -> Hosts {
        Hosts(list.iter().copied().collect())
    }

    fn opts(dir: &Path) -> ResumeOptions {
        ResumeOptions { token_dir: Some(dir.to_owned()), host_pid: None }
    }

    fn private_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    #[test]
    fn token_shape_is_exact() {
        assert!(is_valid_token(T1));
        assert!(!is_valid_token(&T1.to_uppercase()));
        assert!(!is_valid_token(&T1[..T1.len() - 1]));
        assert!(!is_valid_token(&format!("{T1}0")));
        assert!(!is_valid_token(&T1.replace("tt1_", "tt2_")));
        assert!(!is_valid_token(&T1.replacen('a', "g", 1)));
        assert_eq!(parse_token_file(format!("{T1}\n").as_bytes()).as_deref(), Some(T1));
    }

    #[test]
    fn every_truncation_of_a_valid_file_is_corrupted() {
        let full = format!("{T1}\n");
        assert_eq!(full.len(), TOKEN_FILE_LEN);
        for cut in 0..full.len() {
            assert_eq!(parse_token_file(&full.as_bytes()[..cut]), None, "cut at {cut}");
        }
        for extra in ["\n", " ", "x", "\r\n"] {
            assert_eq!(parse_token_file(format!("{T1}\n{extra}").as_bytes()), None, "{extra:?} after the line");
        }
        for variant in [format!("{T1} \n"), format!("{T1}\r\n"), format!(" {T1}\n"), T1.to_owned()] {
            assert_eq!(parse_token_file(variant.as_bytes()), None, "{variant:?}");
        }
        assert_eq!(parse_token_file(&[0xff; TOKEN_FILE_LEN]), None);
    }

    #[test]
    fn every_truncated_file_on_disk_is_deleted_and_loads_nothing() {
        let dir = private_dir();
        let table = hosts(&[(4242, 7)]);
        let full = format!("{T1}\n");
        for cut in 0..full.len() {
            let mut store = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
            let path = store.token_path().unwrap().to_owned();
            std::fs::write(&path, &full.as_bytes()[..cut]).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(store.load(), None, "cut at {cut}");
            assert!(!path.exists(), "corrupted file deleted (cut at {cut})");
        }
        // The untruncated file loads.
        let mut store = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        store.store(T1);
        assert_eq!(store.load().as_deref(), Some(T1));
        // An oversized file is corrupted too.
        let path = store.token_path().unwrap().to_owned();
        std::fs::write(&path, format!("{T1}\n{T2}\n")).unwrap();
        assert_eq!(store.load(), None);
        assert!(!path.exists());
    }

    #[test]
    fn store_rotates_atomically_and_leaves_no_temp_files() {
        let dir = private_dir();
        let table = hosts(&[(4242, 7)]);
        let mut store = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        assert_eq!(store.load(), None, "first run");
        store.store(T1);
        assert_eq!(store.load().as_deref(), Some(T1));
        store.store(T2);
        assert_eq!(store.load().as_deref(), Some(T2), "rotation replaces the token");
        let path = store.token_path().unwrap().to_owned();
        assert_eq!(path.file_name().unwrap(), "token-4242-7");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{T2}\n"));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["token-4242-7", "token-4242-7.lock"]);
        store.delete();
        assert_eq!(store.load(), None);
        assert_eq!(names(dir.path()), ["token-4242-7.lock"]);
        // A token of another shape is not written (it could never be loaded).
        store.store(T1);
        store.store("not-a-tether-token");
        assert_eq!(store.load(), None);
    }

    #[test]
    fn a_symlinked_or_open_token_file_is_treated_as_corrupted() {
        let dir = private_dir();
        let table = hosts(&[(4242, 7)]);
        let mut store = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        let path = store.token_path().unwrap().to_owned();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, format!("{T1}\n")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert_eq!(store.load(), None, "not followed");
        assert!(std::fs::symlink_metadata(&path).is_err(), "the link is removed");
        assert!(elsewhere.exists(), "its target is untouched");

        store.store(T1);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(store.load(), None, "readable by others: not trusted");
    }

    #[test]
    fn a_second_instance_of_the_same_host_runs_without_files() {
        let dir = private_dir();
        let table = hosts(&[(4242, 7)]);
        let mut first = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        first.store(T1);
        let mut second = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        assert!(second.token_path().is_none(), "lock contention disables resume");
        assert_eq!(second.load(), None, "never reads the first one's token");
        second.store(T2);
        second.delete();
        assert_eq!(first.load().as_deref(), Some(T1), "never writes or deletes it either");
        assert_eq!(second.load(), None);
        second.store(T2);
        assert_eq!(second.load().as_deref(), Some(T2), "its own token stays in memory");
        // Once the first is gone, a new instance gets the lock and the token.
        drop(first);
        drop(second);
        let mut third = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        assert_eq!(third.load().as_deref(), Some(T1));
    }

    #[test]
    fn unknown_hosts_and_untrusted_directories_disable_resume() {
        let dir = private_dir();
        let mut no_host = ResumeTokenStore::init_with(&hosts(&[]), 4242, &opts(dir.path()));
        assert!(no_host.token_path().is_none());
        no_host.store(T1);
        assert_eq!(no_host.load().as_deref(), Some(T1), "memory only");
        assert!(names(dir.path()).is_empty(), "no file touched");

        let table = hosts(&[(4242, 7)]);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        assert!(open.token_path().is_none(), "group/other access disables resume");
        assert!(names(dir.path()).is_empty());

        let override_pid = ResumeOptions { token_dir: Some(dir.path().join("sub")), host_pid: Some(1) };
        assert!(ResumeTokenStore::init_with(&table, 4242, &override_pid).token_path().is_none());
        let created = ResumeOptions { token_dir: Some(dir.path().join("sub")), host_pid: Some(4242) };
        assert!(ResumeTokenStore::init_with(&table, 99, &created).token_path().is_some());
        assert_eq!(std::fs::metadata(dir.path().join("sub")).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn startup_removes_files_of_gone_hosts_and_pid_reuse_leftovers_only() {
        let dir = private_dir();
        let write = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("{T1}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        write("token-100-5"); // alive host (same start time): kept
        write("token-100-5.lock");
        write("token-100-6"); // PID reuse: PID 100 alive with another start time
        write("token-200-5"); // PID gone
        write("token-200-5.lock");
        write("token-200-5.tmp-0123");
        write("token-4242-7.tmp-dead"); // own crash leftover: removed under the lock
        write("unrelated-file");
        let table = hosts(&[(100, 5), (4242, 7)]);
        let mut store = ResumeTokenStore::init_with(&table, 4242, &opts(dir.path()));
        assert_eq!(store.load(), None);
        assert_eq!(names(dir.path()), ["token-100-5", "token-100-5.lock", "token-4242-7.lock", "unrelated-file"]);
    }

    #[test]
    fn cleanup_is_bounded() {
        let dir = private_dir();
        for pid in 0..(CLEANUP_REMOVE_LIMIT + 10) {
            std::fs::write(dir.path().join(format!("token-{}-1", 10_000 + pid)), "x").unwrap();
        }
        let own = HostIdentity { pid: 4242, start_time: 7 };
        assert_eq!(cleanup_stale(dir.path(), &hosts(&[]), own), CLEANUP_REMOVE_LIMIT);
        assert_eq!(cleanup_stale(dir.path(), &hosts(&[]), own), 10);
        assert_eq!(cleanup_stale(dir.path(), &hosts(&[]), own), 0);
    }
}
