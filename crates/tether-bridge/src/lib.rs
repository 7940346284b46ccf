//! `tether bridge`: a stdio MCP server that a desktop host launches. It
//! forwards everything to a remote Streamable HTTP MCP server and, when the
//! host restarts it, picks the same remote session back up through a resume
//! token kept in a file named after the host's process identity.
//!
//! - [`identity`]: who the host is (PID + start time, past launcher wrappers).
//! - [`token_dir`]: the private directory the tokens live in.
//! - [`token_store`]: `ResumeTokenStore`, the one owner of resume state.
//! - [`stdio`]: newline-delimited JSON-RPC framing with bounded lines.
//! - [`upstream`]: the remote session as the bridge needs it.
//! - [`bridge`]: the forwarding core.
//! - [`client`]: the real remote, through the client runtime (`tether-client`).

pub mod bridge;
pub mod client;
pub mod identity;
pub mod stdio;
pub mod token_dir;
pub mod token_store;
pub mod upstream;

pub use token_store::{ResumeOptions, ResumeTokenStore};
