//! `tether bridge URL`: the stdio MCP server a desktop host launches. Flags
//! and wiring only; the bridge itself (forwarding, resume tokens, host
//! identity) lives in the `tether-bridge` crate. stdout carries nothing but
//! JSON-RPC; every log line goes to stderr.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tether_bridge::bridge::{self, BridgeOptions};
use tether_bridge::stdio::{self, Outgoing};
use tether_bridge::{ResumeOptions, ResumeTokenStore};
use tether_client::config::{OAUTH_CLIENT_ID_ENV, OAUTH_CLIENT_SECRET_ENV};

/// The variable read for the remote's bearer token unless `--auth-token-env` names another.
const DEFAULT_AUTH_TOKEN_ENV: &str = "MCP_AUTH_TOKEN";

#[derive(Debug, Args)]
pub struct BridgeArgs {
    /// The remote MCP server's Streamable HTTP endpoint, e.g. http://127.0.0.1:8787/mcp.
    url: String,
    /// Directory for resume token files (default: $XDG_RUNTIME_DIR/tether, else
    /// $TMPDIR/tether-<uid>). Created 0700; refused if others can reach it.
    #[arg(long, env = "TETHER_TOKEN_DIR")]
    token_dir: Option<PathBuf>,
    /// The host's PID, instead of detecting the host from the parent process
    /// (walking past sh, bash, env, npx, uvx and similar launchers).
    #[arg(long, value_name = "PID")]
    host_pid: Option<u32>,
    /// Name of the environment variable that holds the remote's bearer token
    /// (default: MCP_AUTH_TOKEN, if set).
    #[arg(long, value_name = "NAME")]
    auth_token_env: Option<String>,
    /// How long one request to the remote may take (e.g. 30s, 5m).
    #[arg(long, env = "TETHER_REQUEST_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Longest JSON-RPC message accepted from the host, in bytes.
    #[arg(long, default_value_t = stdio::DEFAULT_MAX_LINE)]
    max_message_bytes: usize,
}

fn bearer_token(name: Option<&str>) -> anyhow::Result<Option<String>> {
    match name {
        Some(name) => {
            let token = std::env::var(name).with_context(|| format!("--auth-token-env {name}: the variable is not set"))?;
            anyhow::ensure!(!token.trim().is_empty(), "--auth-token-env {name}: the variable is empty");
            Ok(Some(token.trim().to_owned()))
        }
        None => Ok(std::env::var(DEFAULT_AUTH_TOKEN_ENV).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())),
    }
}

pub async fn run(args: BridgeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.url.starts_with("http://") || args.url.starts_with("https://"),
        "the remote URL must start with http:// or https:// (got `{}`)",
        args.url
    );
    anyhow::ensure!(args.max_message_bytes > 0, "--max-message-bytes must be positive");
    let bearer = bearer_token(args.auth_token_env.as_deref())?;
    let resume = ResumeOptions { token_dir: args.token_dir, host_pid: args.host_pid };
    let tokens = tokio::task::spawn_blocking(move || ResumeTokenStore::init(&resume)).await?;
    let oauth = match (std::env::var(OAUTH_CLIENT_ID_ENV), std::env::var(OAUTH_CLIENT_SECRET_ENV)) {
        (Ok(client_id), Ok(client_secret)) if !client_id.is_empty() && !client_secret.is_empty() => {
            Some(tether_client::oauth::OAuthClient { client_id, client_secret })
        }
        _ => None,
    };
    let connector = tether_bridge::client::connector(&args.url, bearer, oauth, args.request_timeout);

    let input = stdio::spawn_reader(std::io::BufReader::new(std::io::stdin()), args.max_message_bytes);
    let (out, written) = stdio::spawn_writer(std::io::stdout());
    let options = BridgeOptions { max_line: args.max_message_bytes, ..BridgeOptions::default() };
    tracing::debug!(url = %args.url, "bridge started");
    tokio::select! {
        () = bridge::run(connector, tokens, input, out.clone(), options) => {}
        () = termination() => tracing::debug!("signal received; the bridge ends"),
    }
    // Everything queued for the host is written before the process ends.
    let _ = out.send(Outgoing::Close).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), written).await;
    Ok(())
}

/// SIGTERM or ctrl-c (a host closes stdin first; the signal is its fallback).
async fn termination() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            let _ = ctrl_c.await;
        }
    }
}
