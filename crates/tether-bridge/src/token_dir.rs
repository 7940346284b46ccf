//! The token directory: where resume tokens live, and whether it is private
//! enough to trust.
//!
//! Default: `$XDG_RUNTIME_DIR/tether`, else `$TMPDIR/tether-<uid>` (`/tmp` when
//! `TMPDIR` is unset). A missing directory is created 0700. An existing one is
//! used only if it is a real directory (not a symlink), owned by this user,
//! and closed to group and others; otherwise resume is disabled for this
//! instance. Files inside are opened without following symlinks and checked
//! the same way (regular, owned by this user, no group/other bits).

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a directory or file is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error("is a symbolic link")]
    Symlink,
    #[error("is not a {0}")]
    WrongType(&'static str),
    #[error("is owned by uid {owner}, not by this user (uid {me})")]
    NotOwned { owner: u32, me: u32 },
    #[error("is accessible to group or others (mode {0:04o}; `chmod go-rwx` it)")]
    TooOpen(u32),
    #[error("cannot be used: {0}")]
    Io(#[from] io::Error),
}

/// This process's real user ID.
pub fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// `$XDG_RUNTIME_DIR/tether`, else `$TMPDIR/tether-<uid>`.
pub fn default_token_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("tether"),
        _ => std::env::temp_dir().join(format!("tether-{}", current_uid())),
    }
}

/// What a trusted entry must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Directory,
    RegularFile,
}

/// The trust rule on raw metadata values (separate for tests: ownership by
/// another user cannot be arranged without privileges).
pub fn check_entry(
    kind: Kind,
    is_symlink: bool,
    is_dir: bool,
    is_file: bool,
    owner: u32,
    mode: u32,
    me: u32,
) -> Result<(), Untrusted> {
    if is_symlink {
        return Err(Untrusted::Symlink);
    }
    match kind {
        Kind::Directory if !is_dir => return Err(Untrusted::WrongType("directory")),
        Kind::RegularFile if !is_file => return Err(Untrusted::WrongType("regular file")),
        _ => {}
    }
    if owner != me {
        return Err(Untrusted::NotOwned { owner, me });
    }
    if mode & 0o077 != 0 {
        return Err(Untrusted::TooOpen(mode & 0o7777));
    }
    Ok(())
}

/// [`check_entry`] on real metadata (from `lstat` or `fstat`).
pub fn check_metadata(kind: Kind, meta: &Metadata) -> Result<(), Untrusted> {
    let ft = meta.file_type();
    check_entry(kind, ft.is_symlink(), ft.is_dir(), ft.is_file(), meta.uid(), meta.mode(), current_uid())
}

/// Creates `dir` (0700) if missing, then checks that it can be trusted.
pub fn prepare(dir: &Path) -> Result<(), Untrusted> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
                Ok(()) => {}
                // Someone else made it in between: the check below decides.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    }
    check_metadata(Kind::Directory, &std::fs::symlink_metadata(dir)?)
}

/// The `O_NOFOLLOW` and `O_CLOEXEC` flags for `OpenOptions::custom_flags`.
fn no_follow_flags() -> i32 {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    // The flag values are small positive constants on every platform.
    i32::try_from(flags.bits()).unwrap_or(0)
}

/// Opens an existing file for reading without following a symlink (a
/// symlink fails with `ELOOP`), non-blocking so a planted FIFO cannot hang
/// the bridge, then checks it is a private regular file of this user.
pub fn open_private_read(path: &Path) -> Result<File, Untrusted> {
    let flags = no_follow_flags() | i32::try_from(rustix::fs::OFlags::NONBLOCK.bits()).unwrap_or(0);
    let file = OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    check_metadata(Kind::RegularFile, &file.metadata()?)?;
    Ok(file)
}

/// Creates a new private file (0600, must not exist) for writing.
pub fn create_private_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(no_follow_flags()).open(path)
}

/// Opens or creates a private file (0600) for locking, without following a
/// symlink, and checks it.
pub fn open_private_lock(path: &Path) -> Result<File, Untrusted> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(no_follow_flags())
        .open(path)?;
    check_metadata(Kind::RegularFile, &file.metadata()?)?;
    Ok(file)
}

/// Fsyncs a directory so a rename in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_rule_refuses_links_wrong_types_other_owners_and_open_modes() {
        let me = 1000;
        assert!(check_entry(Kind::Directory, false, true, false, me, 0o40700, me).is_ok());
        assert!(check_entry(Kind::RegularFile, false, false, true, me, 0o100600, me).is_ok());
        assert!(check_entry(Kind::RegularFile, false, false, true, me, 0o100400, me).is_ok());
        assert!(matches!(check_entry(Kind::Directory, true, false, false, me, 0o777, me), Err(Untrusted::Symlink)));
        assert!(matches!(check_entry(Kind::Directory, false, false, true, me, 0o600, me), Err(Untrusted::WrongType(_))));
        assert!(matches!(check_entry(Kind::RegularFile, false, true, false, me, 0o700, me), Err(Untrusted::WrongType(_))));
        assert!(matches!(check_entry(Kind::RegularFile, false, false, false, me, 0o600, me), Err(Untrusted::WrongType(_))));
        assert!(matches!(
            check_entry(Kind::Directory, false, true, false, 0, 0o700, me),
            Err(Untrusted::NotOwned { owner: 0, me: 1000 })
        ));
        for mode in [0o710, 0o701, 0o750, 0o705, 0o770, 0o777, 0o720, 0o702] {
            assert!(
                matches!(check_entry(Kind::Directory, false, true, false, me, mode, me), Err(Untrusted::TooOpen(_))),
                "{mode:o}"
            );
        }
        for mode in [0o640, 0o604, 0o660, 0o666] {
            assert!(
                matches!(check_entry(Kind::RegularFile, false, false, true, me, mode, me), Err(Untrusted::TooOpen(_))),
                "{mode:o}"
            );
        }
        let message = check_entry(Kind::Directory, false, true, false, me, 0o755, me).unwrap_err().to_string();
        assert!(message.contains("0755") && message.contains("chmod go-rwx"), "{message}");
    }

    #[test]
    fn prepare_creates_0700_and_refuses_open_or_linked_directories() {
        let base = tempfile::tempdir().unwrap();
        let fresh = base.path().join("a/b/tether");
        prepare(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);
        prepare(&fresh).unwrap();

        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(prepare(&fresh), Err(Untrusted::TooOpen(0o750))));
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o700)).unwrap();

        let link = base.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(matches!(prepare(&link), Err(Untrusted::Symlink)));

        let file = base.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(prepare(&file), Err(Untrusted::WrongType(_))));
    }

    #[test]
    fn private_files_are_not_followed_through_symlinks_and_must_be_0600() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, "x").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(open_private_read(&real).is_ok());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(open_private_read(&link).is_err(), "symlink refused");
        assert!(open_private_lock(&link).is_err(), "symlink refused for locks too");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(open_private_read(&real), Err(Untrusted::TooOpen(_))));

        let created = dir.path().join("new");
        drop(create_private_new(&created).unwrap());
        assert_eq!(std::fs::metadata(&created).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(create_private_new(&created).is_err(), "must not exist yet");
    }
}
