//! Starting a process that must die with the keeper: the engine and every
//! stdio child. The crate's one `unsafe` (a `pre_exec` hook) is here.
//!
//! [`die_with_keeper`] makes the process ask the kernel for SIGKILL when
//! the keeper goes (`PR_SET_PDEATHSIG`), then checks the keeper is still
//! its parent: if the keeper died between the fork and that call, the
//! signal would never come, so the process does not start at all.
//!
//! Linux's death signal follows the *thread* that forked, not the process:
//! call [`std::process::Command::spawn`] only from a thread that lives as
//! long as the keeper (the keeper's runtime is single-threaded, on the
//! main thread). Processes are spawned with std, never tokio: the keeper's
//! reaper, not a `wait` per child, learns every exit.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Sets `command` up to be killed (SIGKILL) when the keeper dies.
pub fn die_with_keeper(command: &mut Command) -> &mut Command {
    let keeper = rustix::process::getpid();
    let hook = move || -> std::io::Result<()> {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        if rustix::process::getppid() != Some(keeper) {
            // The keeper is gone already: std turns this error into
            // `_exit` in the child (and an error for a parent, were one left).
            return Err(rustix::io::Errno::SRCH.into());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe work is allowed. It makes two system calls (prctl,
    // getppid) through rustix, which neither allocates nor takes a lock,
    // and builds its error from a raw errno (no allocation either). It
    // captures only a `Pid` (a copied integer).
    unsafe { command.pre_exec(hook) }
}
