//! Shared by the client subcommands (`tether tools`, `tether call`): the
//! `--config` / `--requires-session` flags, turning a target (URL or server
//! name) into a server spec, and the exit codes with a one-line reason:
//! 0 success, 1 the tool returned `isError`, 2 usage (bad arguments, bad
//! JSON, bad config), 3 connection, protocol or auth failure.

use std::path::PathBuf;
use std::process::ExitCode;

use tether_client::{ClientError, Config, Protocol, RequiresSession, Resolved};
use tether_wire::{RpcError, code};

/// Flags every client subcommand takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Config file with `[servers.NAME]` sections (default:
    /// $XDG_CONFIG_HOME/tether/config.toml, else ~/.config/tether/config.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Whether the server needs `initialize` first: auto (try without a
    /// session, initialize when told to), true, false. Overrides the config.
    #[arg(long, value_name = "auto|true|false", value_parser = parse_requires_session)]
    pub requires_session: Option<RequiresSession>,
    /// The protocol era: auto (ask server/discover and speak 2026-07-28
    /// where it is offered, else initialize a session), session (the
    /// session era, 2025-11-25), sessionless (2026-07-28 only).
    #[arg(long, value_name = "auto|session|sessionless", default_value = "auto", value_parser = parse_protocol)]
    pub protocol: Protocol,
}

fn parse_protocol(s: &str) -> Result<Protocol, String> {
    s.parse()
}

fn parse_requires_session(s: &str) -> Result<RequiresSession, String> {
    s.parse()
}

/// Why a client command failed.
#[derive(Debug)]
pub enum Failure {
    /// Exit 2.
    Usage(String),
    /// Exit 3.
    Connection(String),
}

impl Failure {
    /// Prints the one-line reason and returns the exit code.
    pub fn exit(self) -> ExitCode {
        let (code, message) = match self {
            Failure::Usage(m) => (2, m),
            Failure::Connection(m) => (3, m),
        };
        eprintln!("tether: {}", one_line(&message));
        ExitCode::from(code)
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The server a command talks to. With an OAuth client configured and no
/// static token, a server that answers 401 with a `resource_metadata`
/// challenge is followed to its authorization server for a token
/// ([`tether_client::oauth`]; cached as a 0600 file).
pub async fn resolve(target: Option<&str>, common: &CommonArgs) -> Result<Resolved, Failure> {
    let (config, _path) = Config::load_or_default(common.config.as_deref()).map_err(|e| Failure::Usage(e.to_string()))?;
    let env = |name: &str| std::env::var(name).ok();
    let mut resolved = config.resolve(target, &env).map_err(|e| Failure::Usage(e.to_string()))?;
    if let Some(r) = common.requires_session {
        resolved.spec.requires_session = r;
    }
    resolved.spec.protocol = common.protocol;
    if let (Some(client), None) = (&resolved.oauth, &resolved.spec.options.bearer_token) {
        let cache = tether_client::oauth::TokenCache::default_location(&env);
        let token = tether_client::oauth::authorize(&resolved.spec.url, client, cache.as_ref())
            .await
            .map_err(|e| Failure::Connection(format!("{}: cannot get an access token: {e}", resolved.spec.url)))?;
        resolved.spec.options.bearer_token = token;
    }
    Ok(resolved)
}

/// A client error as a failure with advice.
pub fn failure(e: ClientError, resolved: &Resolved) -> Failure {
    match e {
        ClientError::Auth { status, message } => Failure::Connection(format!(
            "{} refused the request (HTTP {status}: {message}); {}",
            resolved.spec.url,
            resolved.token_hint()
        )),
        ClientError::Config(m) => Failure::Usage(m),
        ClientError::Rpc(RpcError { code: code::INVALID_PARAMS, message, .. }) => {
            Failure::Usage(format!("the server refused the arguments (invalid params): {message}"))
        }
        ClientError::Rpc(RpcError { code, message, .. }) => {
            Failure::Connection(format!("the server answered with error {code}: {message}"))
        }
        ClientError::SessionNotFound => Failure::Connection(format!(
            "{} forgot the session twice in a row; try again, or check the server's logs",
            resolved.spec.url
        )),
        ClientError::Transport(m) => Failure::Connection(m),
    }
}

/// Runs `work` on a pool, terminating its sessions afterwards; ctrl-c
/// terminates them too and exits 130.
pub async fn with_pool<F, Fut>(options: tether_client::PoolOptions, work: F) -> ExitCode
where
    F: FnOnce(tether_client::Pool) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    let pool = tether_client::Pool::new(options);
    let code = tokio::select! {
        code = work(pool.clone()) => code,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("tether: interrupted");
            ExitCode::from(130)
        }
    };
    pool.shutdown().await;
    code
}
