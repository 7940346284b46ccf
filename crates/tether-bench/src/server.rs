//! The systems under test (with `--baseline`, tether's also from an earlier
//! build): how each one is started (as a child process on a loopback port),
//! the stores tether runs on, waiting until a server answers its health
//! check, reading its RSS from `/proc`, and stopping it (SIGTERM) or killing
//! it (SIGKILL). The gateway systems (`gateway_http`, `gateway_stdio`) are
//! started in front of an upstream: a URL or the `stdio_echo` command;
//! tether-gateway in `gateway_federated` with a config file of upstreams and
//! a virtual server of them.
//!
//! - [`catalog`]: which systems exist, the programs they run and how each
//!   one is started (its command line, its upstream, the virtual server's
//!   config file).
//! - [`store`]: the stores tether runs on, and the bench's Redis helpers.
//! - [`process`]: a started server as a process: spawning (pinned with
//!   `--pin-servers`), waiting for its health check, its log, stopping and
//!   killing it.
//! - [`procfs`]: what `/proc` says about it: RSS, peak RSS, live children.
//! - [`agentgateway`]: agentgateway's pinned release, the check of its
//!   source against it, and its config.

pub mod agentgateway;
mod catalog;
mod process;
mod procfs;
mod store;

pub use catalog::{
    BASELINE_SUFFIX, FEDERATED_SEPARATOR, GATEWAY_UPSTREAM, Launch, Programs, Protocol, Subject, System, Upstream,
    federated_config, stdio_config,
};
pub use process::{Server, free_port, origin};
pub(crate) use procfs::settled_rss;
pub use store::{Store, redis_available};
