//! `relay_floor`: the floor of a proxy hop for tether-bench's gateway_http.
//!
//! A bare TCP relay in front of an MCP server: every accepted connection is
//! joined to a connection of its own to the upstream, and bytes are copied
//! both ways (`tokio::io::copy_bidirectional`) without being read as HTTP,
//! JSON-RPC or SSE. Nothing is stored. It is what one more TCP hop on
//! loopback costs on this machine, the part of a gateway's cost that no
//! gateway can take out; tether-gateway adds HTTP on both sides, MCP and
//! its durable store on top. Served the same way as the other Rust systems
//! (tokio's multi-threaded runtime, TCP_NODELAY on both sockets). It prints
//! `listening on http://ADDR/mcp` on stderr (the upstream's path), relays
//! `GET /healthz` like everything else, and exits on SIGTERM.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Parser)]
#[command(name = "relay_floor", about = "Bare TCP relay in front of an MCP server: the proxy-hop floor for tether-bench")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The upstream's MCP URL (`http://HOST:PORT/PATH`): connections go to HOST:PORT.
    #[arg(long)]
    upstream: String,
}

/// `HOST:PORT` and `/PATH` of a plain `http://` URL.
fn split_url(url: &str) -> anyhow::Result<(&str, &str)> {
    let rest = url.strip_prefix("http://").with_context(|| format!("{url} is not an http:// URL"))?;
    Ok(rest.find('/').map_or((rest, "/"), |slash| rest.split_at(slash)))
}

async fn relay(mut client: TcpStream, upstream: String) {
    let mut server = match TcpStream::connect(&upstream).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("relay_floor: cannot connect to {upstream}: {e}");
            return;
        }
    };
    if let Err(e) = client.set_nodelay(true).and_then(|()| server.set_nodelay(true)) {
        eprintln!("relay_floor: cannot set TCP_NODELAY: {e}");
    }
    // A peer closing or resetting ends the relay; neither is an error here.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (upstream, path) = split_url(&args.upstream)?;
    let upstream = upstream.to_owned();
    let listener = TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    eprintln!("relay floor listening on http://{addr}{path}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    tokio::spawn(relay(client, upstream.clone()));
                }
                Err(e) => eprintln!("relay_floor: accept failed: {e}"),
            },
            _ = term.recv() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn an_upstream_url_splits_into_address_and_path() {
        assert_eq!(split_url("http://127.0.0.1:4000/mcp").ok(), Some(("127.0.0.1:4000", "/mcp")));
        assert_eq!(split_url("http://127.0.0.1:4000").ok(), Some(("127.0.0.1:4000", "/")));
        assert!(split_url("https://example.com/mcp").is_err());
    }
}
