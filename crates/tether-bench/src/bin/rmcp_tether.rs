//! `rmcp_tether`: the `tether-rmcp` system of tether-bench: `rmcp_ref`'s
//! handler (`thinker.rs`), unchanged, served by tether's engine through
//! tether-rmcp (`tether_server::Server` on `--store`), as a Rust program that
//! embeds tether would serve it. It allocates with mimalloc, as the `tether`
//! binary does (glibc's allocator costs a server like this about a quarter of
//! its CPU: docs/benchmarks.md). It prints `listening on http://ADDR/mcp` on
//! stderr, answers `GET /healthz`, and drains on SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;

#[path = "../thinker.rs"]
mod thinker;
use thinker::Thinker;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "rmcp_tether", about = "rmcp_ref's handler served by tether's engine, for tether-bench")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where sessions live (`sqlite:PATH`, `memory`, `redis://HOST:PORT/DB`).
    #[arg(long)]
    store: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = tether_rmcp::RmcpApp::new(Thinker::default);
    let server = tether_server::Server::builder().store(args.store).mount(Arc::new(app)).build().await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!("rmcp_ref's handler served by tether listening on http://{}/mcp", listener.local_addr()?);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    server.serve_on(listener, async move { term.recv().await.map_or((), drop) }).await?;
    Ok(())
}
