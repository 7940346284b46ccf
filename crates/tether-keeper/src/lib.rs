//! The keeper: `tether serve`'s supervisor process. It binds the listening
//! sockets, starts the engine (`tether engine …`) as its child and restarts
//! it when it dies, and owns every stdio upstream child, carrying their
//! bytes to and from the engine over a control socket ([`proto`]) so that
//! neither a crash nor an upgrade of the engine loses a byte or a child.
//!
//! - [`proto`]: the control protocol, without I/O;
//! - [`client`]: the engine's side of it (spawn, attach, write, acknowledge);
//! - [`children`]: the keeper's table of children (spawn, stdout frames
//!   held until acknowledged, stdin writes, stderr, orphans, exits, stop);
//! - `engine_conn`: the keeper's side of the protocol, one engine connection
//!   ([`children::Children::serve_engine`]: handshake, writer, each message);
//! - [`supervisor`]: the keeper process (sockets, engine, reaper, signals);
//! - [`spawn`]: starting a process that dies with the keeper.

// The keeper relies on Linux's `PR_SET_PDEATHSIG`; elsewhere only the
// protocol and the engine's side build (and no keeper starts an engine).
#[cfg(target_os = "linux")]
pub mod children;
pub mod client;
#[cfg(target_os = "linux")]
mod engine_conn;
pub mod proto;
#[cfg(target_os = "linux")]
pub mod spawn;
#[cfg(target_os = "linux")]
pub mod supervisor;
