//! `rmcp_ref`: the `rmcp` reference system of tether-bench.
//!
//! An MCP server built the way rmcp's documentation builds one:
//! `StreamableHttpService` with its in-memory `LocalSessionManager`, stateful
//! (legacy session) mode with SSE responses and priming events, served by
//! axum with TCP_NODELAY on every accepted socket (without it every SSE
//! response stalls about 40 ms behind the client's delayed ACK).
//!
//! It offers one tool, `thought`, with the input and the structuredContent
//! of tether's notebook tool (`{thoughtNumber, totalThoughts,
//! nextThoughtNeeded, branches: [], thoughtHistoryLength}`); the thoughts are
//! kept in memory per session, as the original sequential-thinking server
//! does. Like tether's notebook, it asks a client that declares `roots` for
//! `roots/list` on the standalone stream after `notifications/initialized`
//! and on every `notifications/roots/list_changed` (the bench's replay
//! scenario uses that to put many events on one stream).
//!
//! The handler (`thinker.rs`) is also what `rmcp_tether` serves on tether's
//! engine (the tether-rmcp system).
//!
//! `--channel-capacity` sets `SessionConfig::channel_capacity`, which is also
//! how many events per stream the session keeps for `Last-Event-ID` replay
//! (rmcp's default: 16). It prints `listening on http://ADDR/mcp` on stderr,
//! answers `GET /healthz`, and exits on SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use clap::Parser;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

#[path = "../thinker.rs"]
mod thinker;
use thinker::Thinker;

#[derive(Debug, Parser)]
#[command(name = "rmcp_ref", about = "rmcp StreamableHttpService reference server for tether-bench")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// `SessionConfig::channel_capacity`: events kept per stream for replay (rmcp's default is 16).
    #[arg(long, default_value_t = 16)]
    channel_capacity: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut manager = LocalSessionManager::default();
    manager.session_config.channel_capacity = args.channel_capacity.max(1);
    let service: StreamableHttpService<Thinker, LocalSessionManager> =
        StreamableHttpService::new(|| Ok(Thinker::default()), Arc::new(manager), StreamableHttpServerConfig::default());
    let router = axum::Router::new().nest_service("/mcp", service).route("/healthz", axum::routing::get(|| async { "ok" }));

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    eprintln!("rmcp reference listening on http://{addr}/mcp (channel_capacity {})", args.channel_capacity);
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            eprintln!("rmcp_ref: cannot set TCP_NODELAY: {e}");
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = axum::serve(listener, router) => served?,
        _ = term.recv() => {}
    }
    Ok(())
}
