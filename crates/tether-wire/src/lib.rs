#![warn(missing_docs)]
//! The MCP wire format as every tether crate speaks it: server, client,
//! bridge, bench and tests share these definitions so that a header name, a
//! `_meta` key or an error code is written down exactly once.
//!
//! - [`envelope`]: parsing one inbound JSON-RPC message, rendering outbound ones.
//! - [`error`]: the JSON-RPC error codes and [`RpcError`], the one error type
//!   of a JSON-RPC answer.
//! - [`headers`]: the Streamable HTTP header names.
//! - [`meta`]: the `_meta` keys tether reads and writes.
//! - [`ndjson`]: the one bounded reader of newline-delimited JSON (stdio).
//! - [`shared_writer`]: one pipe or socket many tasks write whole messages
//!   to, in order, written by the sender itself when the kernel takes them.
//! - [`peer`]: [`PeerMessage`], what a peer sends that is not an answer,
//!   and [`PeerSink`], where a transport hands such messages in order.
//! - [`revision`]: the protocol revisions served.
//! - [`sse`]: the one SSE decoder (on `sse-stream`), with a size limit per
//!   event and the last event ID a reader resumes from.

pub mod envelope;
pub mod error;
pub mod headers;
pub mod meta;
pub mod ndjson;
pub mod peer;
pub mod revision;
pub mod shared_writer;
pub mod sse;

pub use envelope::{EnvelopeError, Inbound, parse_message};
pub use error::{RpcError, code};
pub use peer::{PeerMessage, PeerSink};
