//! `axum_floor`: the HTTP floor of tether-bench.
//!
//! A bare axum route, `POST /mcp`, that parses the JSON body and sends it
//! back as JSON: no MCP, no sessions, no SSE, no storage. It is what plain
//! HTTP/1 + JSON costs on this machine, served the same way as tether and the
//! rmcp reference (axum on tokio's multi-threaded runtime, TCP_NODELAY on
//! every accepted socket). It prints `listening on http://ADDR/mcp` on
//! stderr, answers `GET /healthz`, and exits on SIGTERM.

use std::net::SocketAddr;

use axum::Json;
use axum::serve::ListenerExt;
use clap::Parser;
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(name = "axum_floor", about = "Bare axum JSON echo route: the HTTP floor for tether-bench")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

async fn echo(Json(body): Json<Value>) -> Json<Value> {
    Json(body)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let router =
        axum::Router::new().route("/mcp", axum::routing::post(echo)).route("/healthz", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    eprintln!("axum floor listening on http://{addr}/mcp");
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            eprintln!("axum_floor: cannot set TCP_NODELAY: {e}");
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = axum::serve(listener, router) => served?,
        _ = term.recv() => {}
    }
    Ok(())
}
