//! `stdio_relay`: the floor of a process hop for tether-bench's gateway_stdio.
//!
//! `stdio_relay PROGRAM [ARGS…]` runs PROGRAM as its child (stdin and stdout
//! piped, stderr inherited) and copies bytes both ways with two plain
//! threads and 64 KiB buffers: its stdin to the child's stdin, the child's
//! stdout to its stdout, each chunk written as soon as it is read. It reads
//! no lines and no JSON and holds nothing. Served as the stdio upstream of a
//! `tether serve --no-keeper`, it is what one more process between the
//! gateway and its stdio server costs on this machine (two more pipes, two
//! more reads and writes per message each way, the switches to and from a
//! third process), the part of the keeper's cost that no process hop can
//! take out; the keeper frames, numbers and holds every line on top.
//!
//! The end of its stdin closes the child's stdin; the end of the child's
//! stdout ends it, with the child's exit status. tether stops a stdio
//! upstream by killing its process group, which holds the child too.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::{Command, ExitCode, Stdio};

/// Bytes read (and then written) at a time, each way.
const BUFFER: usize = 64 * 1024;

/// Copies `from` to `to` until `from` ends or either fails, writing each
/// read chunk whole at once (no buffering on the way).
fn pump(mut from: impl Read, mut to: impl Write) -> std::io::Result<()> {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buffer[..n])?;
    }
}

/// Its own stdin or stdout as a plain file: reads and writes go straight to
/// the descriptor, past std's buffers and locks.
fn raw(fd: impl AsFd) -> std::io::Result<std::fs::File> {
    Ok(std::fs::File::from(fd.as_fd().try_clone_to_owned()?))
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: stdio_relay PROGRAM [ARGS…]");
        return ExitCode::from(2);
    };
    let spawned = Command::new(&program).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("stdio_relay: cannot run {}: {e}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let (Some(child_in), Some(child_out)) = (child.stdin.take(), child.stdout.take()) else {
        eprintln!("stdio_relay: the child's pipes are missing");
        return ExitCode::FAILURE;
    };
    let (stdin, stdout) = match (raw(std::io::stdin()), raw(std::io::stdout())) {
        (Ok(stdin), Ok(stdout)) => (stdin, stdout),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("stdio_relay: cannot take its stdin or stdout: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Toward the child: when its own stdin ends, the child's is closed
    // (dropped with the thread's `child_in`), so the child sees the end too.
    std::thread::spawn(move || {
        if let Err(e) = pump(stdin, child_in) {
            eprintln!("stdio_relay: stdin to the child: {e}");
        }
    });
    // From the child, on this thread: its stdout's end is the relay's end.
    if let Err(e) = pump(child_out, stdout) {
        eprintln!("stdio_relay: the child's stdout: {e}");
    }
    match child.wait() {
        Ok(status) => ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            eprintln!("stdio_relay: cannot wait for the child: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pump;

    #[test]
    fn pump_copies_every_byte_until_the_end() {
        let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut output = Vec::new();
        pump(&input[..], &mut output).unwrap();
        assert_eq!(output, input);
    }
}
