//! An rmcp server whose sessions survive restarts: rmcp's tool macros, served
//! by tether's engine. Run it with
//! `cargo run --release -p tether --example rmcp_server -- --listen 127.0.0.1:8080 --store sqlite:./rmcp.db`
//! and point any MCP client at `http://127.0.0.1:8080/mcp`.
use std::{sync::Arc, time::Duration};

use clap::Parser;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};

#[derive(Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Where sessions live: `sqlite:PATH`, `redis://HOST:PORT/DB` or `memory`.
    #[arg(long, default_value = "sqlite:./rmcp.db")]
    store: String,
    /// A tool safe to run twice: a call of it cut by a crash runs again after the restart.
    #[arg(long)]
    rerun: Vec<String>,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Echo {
    /// What to send back.
    text: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Slow {
    /// How many steps (one progress notification each, 0.25 s apart).
    steps: u32,
}

#[derive(Clone)]
struct Tools {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    #[tool(description = "Returns its text")]
    fn echo(&self, Parameters(Echo { text }): Parameters<Echo>) -> String {
        text
    }

    #[tool(description = "Takes a while, telling its progress")]
    async fn slow(
        &self,
        Parameters(Slow { steps }): Parameters<Slow>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, ErrorData> {
        for step in 1..=steps {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Some(token) = ctx.meta.get_progress_token() {
                let progress = ProgressNotificationParam::new(token, f64::from(step)).with_total(f64::from(steps));
                ctx.peer.notify_progress(progress).await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            }
        }
        Ok(format!("done after {steps} steps"))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let handler = tether_rmcp::RmcpApp::new(|| Tools { tool_router: Tools::tool_router() }).rerun_after_restart(args.rerun);
    let server = tether_server::Server::builder().store(args.store).mount(Arc::new(handler)).build().await?;
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    server.serve(args.listen, stop).await?;
    Ok(())
}
