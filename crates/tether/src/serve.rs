//! `tether serve`: flags, store and notebook wiring, signals.

use std::net::SocketAddr;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tether_notebook::{MemoryNotebook, Notebook, NotebookRepo, RedisNotebook, SqliteNotebook};
use tether_server::http::AllowedHosts;
use tether_server::http::Auth;
use tether_server::http::HttpConfig;
use tether_server::http::oauth::{ClientCredentials, OAuthConfig, ResourceServer};
use tether_server::policy::{AuditLog, Policed, Policy};
use tether_server::{Endpoints, Engine, EngineConfig, ToolRouter};
use tether_store::memory::MemoryStore;
use tether_store::sqlite::SqliteStore;
use tether_store::{Store, StoreConfig, StoreUrl};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Durability {
    /// Commits survive a process crash (WAL, no fsync per commit).
    Normal,
    /// Every commit is fsynced: survives power loss, costs throughput.
    Strict,
}

/// How the server writes its log to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Lines for people.
    Text,
    /// One JSON object per line: timestamp, level, target, message and the
    /// event's fields (session, upstream, …) at the top level.
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on. Loopback by default; anything else should sit behind auth.
    #[arg(long, env = "TETHER_LISTEN", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// `sqlite:PATH` (default: tether.db under the XDG data dir), `memory`,
    /// or `redis://HOST:PORT/DB` (`rediss://` for TLS) for several replicas,
    /// or `redis+cluster://HOST:PORT,HOST:PORT/` for a Redis Cluster.
    #[arg(long, env = "TETHER_STORE")]
    store: Option<String>,
    /// Key prefix in Redis (replicas of one deployment share it).
    #[arg(long, env = "TETHER_STORE_PREFIX", default_value = "tether:")]
    store_prefix: String,
    /// Idle time after which a session expires (e.g. 30m, 2h, 90s).
    #[arg(long, env = "TETHER_SESSION_TTL", default_value = "30m", value_parser = humantime::parse_duration)]
    session_ttl: Duration,
    /// Largest accepted request body in bytes (suffixes K, M, KiB, MiB accepted).
    #[arg(long, env = "TETHER_MAX_BODY", default_value = "4MiB", value_parser = parse_size)]
    max_body: usize,
    /// An Origin to allow besides localhost ones (repeat, or comma-separate in the env var).
    #[arg(long = "allowed-origin", env = "TETHER_ALLOWED_ORIGIN", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// A host name requests may carry in `Host` (repeat, or comma-separate
    /// in the env var). Bound to loopback, the loopback names are allowed
    /// besides; bound elsewhere without any, every name is.
    #[arg(long = "allowed-host", env = "TETHER_ALLOWED_HOST", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Answer requests with one JSON body instead of an SSE stream.
    #[arg(long, env = "TETHER_JSON_RESPONSE")]
    json_response: bool,
    /// `strict` fsyncs every commit.
    #[arg(long, env = "TETHER_DURABILITY", value_enum, default_value = "normal")]
    durability: Durability,
    /// Redis under `--durability strict`: every write must reach this many
    /// replicas (`WAIT`, 2 s) before it is acknowledged; fewer fail it with 503.
    #[arg(long, env = "TETHER_REDIS_REPLICAS", default_value_t = 0)]
    redis_replicas: u32,
    /// File of `TOKEN PRINCIPAL` lines: every request then needs
    /// `Authorization: Bearer TOKEN`. Re-read on SIGHUP.
    #[arg(long, env = "TETHER_AUTH_TOKENS")]
    auth_tokens: Option<PathBuf>,
    /// An OAuth authorization server whose JWT access tokens are accepted
    /// (its issuer URL; repeatable). Every endpoint then is an OAuth 2.1
    /// resource server: a request without a valid token gets 401 with a
    /// challenge naming its protected resource metadata. Static tokens
    /// (`--auth-tokens`) are accepted beside.
    #[arg(long = "oauth-issuer", alias = "oauth-issuers", env = "TETHER_OAUTH_ISSUER", value_delimiter = ',')]
    oauth_issuers: Vec<String>,
    /// The base URL clients reach this server at (e.g. behind a proxy):
    /// an endpoint's resource identifier is it plus `/mcp` or `/mcp/NAME`.
    /// Default: `http://` and the listen address.
    #[arg(long, env = "TETHER_PUBLIC_URL")]
    public_url: Option<String>,
    /// The scopes the endpoints advertise (comma-separated).
    #[arg(long, env = "TETHER_OAUTH_SCOPES", value_delimiter = ',')]
    oauth_scopes: Vec<String>,
    /// tether's own client id at the authorization servers: opaque access
    /// tokens are then checked by RFC 7662 introspection (the client's
    /// secret is read from TETHER_OAUTH_CLIENT_SECRET, never a flag).
    #[arg(long, env = "TETHER_OAUTH_CLIENT_ID")]
    oauth_client_id: Option<String>,
    /// Append every `[[policies]]` decision to this file as JSON lines
    /// (created 0600): time, principal, endpoint, method, kind, name,
    /// decision, rule.
    #[arg(long, env = "TETHER_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
    /// How long a resumable call waits for its result before answering with
    /// a `nextResumeToken` (e.g. 2s, 500ms).
    #[arg(long, env = "TETHER_RESUME_WAIT", default_value = "2s", value_parser = humantime::parse_duration)]
    resume_wait: Duration,
    /// Largest page of a result such as a notebook export, for a client
    /// that asked for pages (`_meta["dev.tether/paging"]`).
    #[arg(long, env = "TETHER_RESULT_CHUNK_BYTES", default_value = "64KiB", value_parser = parse_size)]
    result_chunk_bytes: usize,
    /// Largest result of a tool that runs as an operation (a notebook
    /// export, a task), answered whole to a client that did not ask for
    /// pages; past it the result ends with a note saying how much was left
    /// out and how to get all of it.
    #[arg(long, env = "TETHER_MAX_RESULT_BYTES", default_value = "16MiB", value_parser = parse_size)]
    max_result_bytes: usize,
    /// Live sessions one principal may hold; `initialize` beyond it gets 429.
    #[arg(long, env = "TETHER_MAX_SESSIONS_PER_PRINCIPAL", default_value_t = 100_000)]
    max_sessions_per_principal: usize,
    /// Sessionless (2026-07-28) requests running in this process at once,
    /// all principals together (and, apart from them, `subscriptions/listen`
    /// streams open at once); more are refused, naming `max_sessionless_requests`.
    #[arg(long, env = "TETHER_MAX_SESSIONLESS", default_value_t = EngineConfig::default().max_sessionless_requests, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_sessionless: usize,
    /// Sessionless (2026-07-28) requests one principal may run at once; more get 429.
    #[arg(long, env = "TETHER_MAX_SESSIONLESS_PER_PRINCIPAL", default_value_t = 256)]
    max_sessionless_per_principal: usize,
    /// `subscriptions/listen` streams one principal may hold open; more get 429.
    #[arg(long, env = "TETHER_MAX_LISTEN_PER_PRINCIPAL", default_value_t = 64)]
    max_listen_per_principal: usize,
    /// Tasks (resumable operations) running in this process at once; a new
    /// one beyond it gets 503.
    #[arg(long, env = "TETHER_MAX_TASKS", default_value_t = 1024)]
    max_tasks: usize,
    /// Tasks one principal may have running at once; a new one beyond it gets 429.
    #[arg(long, env = "TETHER_MAX_TASKS_PER_PRINCIPAL", default_value_t = 64)]
    max_tasks_per_principal: usize,
    /// Live children of all command (stdio) upstreams together in this
    /// process, a hard ceiling over each upstream's `max_processes`; a
    /// request that needs a child beyond it waits the upstream's
    /// `process_queue_timeout`, then gets 503. Each child holds three pipes:
    /// keep it well below the process's file limit.
    #[arg(long, env = "TETHER_MAX_STDIO_PROCESSES", default_value_t = tether_gateway::processes::DEFAULT_MAX_STDIO_PROCESSES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_stdio_processes: usize,
    /// Sessions kept in memory; beyond it the least recently used idle ones
    /// are dropped from memory (not from the store) and reloaded on their next request.
    #[arg(long, env = "TETHER_SESSION_CACHE", default_value_t = 4_096)]
    session_cache: usize,
    /// Events kept per stream before the oldest are trimmed.
    #[arg(long, env = "TETHER_MAX_EVENTS_PER_STREAM", default_value_t = 100_000)]
    max_events_per_stream: u64,
    /// On SIGTERM or ctrl-c, how long requests in flight get to finish
    /// before they end as interrupted (keep it below your supervisor's stop timeout).
    #[arg(long, env = "TETHER_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// A connection must send a request's complete head (request line and
    /// headers) within this long of opening or of the request's first byte;
    /// else it is closed.
    #[arg(long, env = "TETHER_HEADER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// A keep-alive connection with no request in progress is closed after
    /// this long. Open streams count as requests in progress.
    #[arg(long, env = "TETHER_IDLE_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// A request's body must arrive within this long of its head; else 408
    /// and the connection is closed.
    #[arg(long, env = "TETHER_BODY_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// Connections open at once; beyond it new ones wait (in the listen
    /// backlog) until one closes. Keep it below the process's file limit.
    #[arg(long, env = "TETHER_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// A TOML file with these flags as keys, `[upstreams.NAME]` tables and
    /// `[servers.NAME]` tables (virtual servers); typed flags and TETHER_*
    /// variables override it.
    #[arg(long, env = "TETHER_CONFIG")]
    config: Option<PathBuf>,
    /// Do not serve the web console at /console (it is on by default; it
    /// needs no token to load and sends the one typed in it on its MCP requests).
    #[arg(long, env = "TETHER_NO_CONSOLE")]
    no_console: bool,
    /// Run as one process, without the keeper: by default `tether serve` is
    /// a small supervisor (the keeper) that holds the listening sockets and
    /// the stdio upstreams' processes and runs the server itself as its
    /// child (`tether engine`), restarting it when it dies, so that calls
    /// through stdio upstreams survive a crash or an upgrade of the server.
    #[arg(long, env = "TETHER_NO_KEEPER")]
    pub no_keeper: bool,
    /// Serve `GET /metrics` (Prometheus) on this address of its own instead
    /// of the public listener (where it is then absent).
    #[arg(long, env = "TETHER_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Keep no metrics and serve no /metrics (for measuring what they cost).
    #[arg(long, env = "TETHER_NO_METRICS", conflicts_with = "metrics_listen")]
    no_metrics: bool,
    /// `text` for people, `json` for log collectors (one object per line).
    #[arg(long, env = "TETHER_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Export OpenTelemetry traces (a span per HTTP and per JSON-RPC
    /// request) over OTLP/HTTP to this collector URL; `/v1/traces` is added
    /// when the URL has no path. Off by default.
    #[arg(long, env = "TETHER_OTLP_ENDPOINT", value_name = "URL", value_parser = crate::otel::parse_endpoint)]
    pub otlp_endpoint: Option<String>,
    /// The name of an environment variable holding the admin token: turns
    /// on the admin API /admin/* (`tether sessions`), which needs it as a
    /// Bearer token, and the admin page /console/admin (unless --no-console).
    #[arg(long, env = "TETHER_ADMIN_TOKEN_ENV", value_name = "VAR")]
    admin_token_env: Option<String>,
    /// An MCP server to serve at /mcp/NAME: `NAME=URL` or 'NAME=stdio:COMMAND ARGS…' (repeat for more).
    #[arg(long = "upstream", value_name = "NAME=TARGET")]
    upstreams: Vec<String>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: usize = digits.parse().map_err(|_| format!("`{s}` is not a size such as 4194304, 512K or 4MiB"))?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        other => return Err(format!("unknown size unit `{other}`: use K or M")),
    };
    n.checked_mul(factor).filter(|n| *n > 0).ok_or_else(|| format!("`{s}` is out of range"))
}

pub(crate) fn default_store() -> anyhow::Result<StoreUrl> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .context("cannot find a data directory: set XDG_DATA_HOME or HOME, or pass --store sqlite:PATH")?;
    Ok(StoreUrl::Sqlite(base.join("tether").join("tether.db")))
}

async fn open(url: &StoreUrl, config: StoreConfig) -> anyhow::Result<(Arc<dyn Store>, Arc<dyn NotebookRepo>)> {
    Ok(match url {
        StoreUrl::Memory => (Arc::new(MemoryStore::new(config)), Arc::new(MemoryNotebook::new())),
        StoreUrl::Sqlite(path) => {
            let store = SqliteStore::open(path, config).await?;
            let notebook = SqliteNotebook::new(store.db().clone()).await?;
            (Arc::new(store), Arc::new(notebook))
        }
        StoreUrl::Redis(url) => {
            let store = tether_store::redis::RedisStore::open(url, config).await?;
            let notebook = RedisNotebook::new(store.connection(), store.prefix());
            (Arc::new(store), Arc::new(notebook))
        }
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops the server");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Loads `--auth-tokens` and re-reads it on every SIGHUP (a bad file keeps
/// the old tokens). `oauth`: `--oauth-issuer` is set (authentication is on
/// without a token file, which the OAuth set-up logs).
fn auth(path: Option<&std::path::Path>, oauth: bool) -> anyhow::Result<Auth> {
    let Some(path) = path else {
        if !oauth {
            tracing::info!("authentication is off: every request belongs to principal `anonymous`");
        }
        return Ok(Auth::disabled());
    };
    let auth = Auth::from_file(path).map_err(|e| anyhow::anyhow!("--auth-tokens: {e}"))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(file = %path.display(), "token file is readable by group or others; chmod 600 it");
        }
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hup) => {
                let auth = auth.clone();
                let path = path.to_path_buf();
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        match auth.reload() {
                            Ok(n) => tracing::info!(file = %path.display(), tokens = n, "auth tokens reloaded"),
                            Err(e) => tracing::error!(error = %e, "auth tokens NOT reloaded; the previous tokens stay in force"),
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP; token changes need a restart"),
        }
    }
    tracing::info!(file = %path.display(), "bearer-token authentication is on");
    Ok(auth)
}

/// The `Host` names every route answers to: the loopback names when bound
/// to loopback, `--allowed-host` and `--public-url`'s host; none to check
/// when bound elsewhere without `--allowed-host` (said in the log).
fn allowed_hosts(args: &ServeArgs) -> Option<AllowedHosts> {
    let mut names = args.allowed_hosts.clone();
    if let Some(url) = &args.public_url {
        let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        names.extend(after_scheme.split('/').next().filter(|h| !h.is_empty()).map(str::to_owned));
    }
    if !args.listen.ip().is_loopback() && args.allowed_hosts.is_empty() {
        tracing::warn!(listen = %args.listen, "no --allowed-host: requests are answered whatever their Host header names");
        return None;
    }
    Some(AllowedHosts::loopback_and(&names))
}

/// The sockets a keeper holds for this server, by the names it gives them
/// ([`tether_keeper::client::LISTENERS_ENV`]): the MCP listener and the
/// metrics listener, if it has its own.
pub fn keeper_listeners(args: &ServeArgs) -> Vec<(String, std::net::SocketAddr)> {
    let mut listeners = vec![(LISTEN.to_owned(), args.listen)];
    if let (false, Some(addr)) = (args.no_metrics, args.metrics_listen) {
        listeners.push((METRICS_LISTEN.to_owned(), addr));
    }
    listeners
}

const LISTEN: &str = "listen";
const METRICS_LISTEN: &str = "metrics-listen";

/// A listening socket: the keeper's, or bound here.
async fn take_listener(
    held: &mut Vec<(String, std::net::TcpListener)>,
    name: &str,
    addr: SocketAddr,
) -> anyhow::Result<TcpListener> {
    if let Some(at) = held.iter().position(|(n, _)| n == name) {
        let (_, listener) = held.swap_remove(at);
        listener.set_nonblocking(true)?;
        return Ok(TcpListener::from_std(listener)?);
    }
    let flag = if name == LISTEN { "--listen" } else { "--metrics-listen" };
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}: is another server using it? pick one with {flag}"))
}

/// Runs the server: alone, or as the engine of a keeper (`keeper`: the
/// handshake's outcome, whose listening sockets it serves on).
pub async fn run(args: ServeArgs, keeper: Option<tether_keeper::client::Welcomed>) -> anyhow::Result<()> {
    let (keeper, mut held) = match keeper {
        Some(welcomed) => {
            let (keeper, held) = welcomed.start().map_err(anyhow::Error::msg)?;
            tracing::info!(epoch = keeper.epoch(), kept = keeper.kept_at_start().len(), "engine started by the keeper");
            tether_gateway::stdio::kept::install(keeper.clone());
            crate::keeper::watch(keeper.clone());
            crate::keeper::die_with(keeper.clone());
            (Some(keeper), held)
        }
        None => (None, Vec::new()),
    };
    let auth = auth(args.auth_tokens.as_deref(), !args.oauth_issuers.is_empty())?;
    tether_server::metrics::set_enabled(!args.no_metrics);
    let admin_token = match &args.admin_token_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(token) if token.trim().len() >= 16 => Some(token.trim().to_owned()),
            Ok(_) => anyhow::bail!("--admin-token-env {var}: the token in ${var} must have at least 16 characters"),
            Err(_) => anyhow::bail!("--admin-token-env {var}: ${var} is not set (or not UTF-8); set it to the admin token"),
        },
    };
    if let Some(token) = &admin_token
        && auth.holds_token(token)
    {
        anyhow::bail!(
            "--admin-token-env {}: the admin token is also a user's token in --auth-tokens; give the admin a token of its own",
            args.admin_token_env.as_deref().unwrap_or_default()
        );
    }
    let url: StoreUrl = match &args.store {
        Some(s) => s.parse()?,
        None => default_store()?,
    };
    let store_config = StoreConfig {
        max_events_per_stream: args.max_events_per_stream,
        strict_durability: matches!(args.durability, Durability::Strict),
        redis_replicas: args.redis_replicas,
        redis_prefix: args.store_prefix.clone(),
        finished_stream_ttl: args.session_ttl,
        ..StoreConfig::default()
    };
    let (store, notebook) = open(&url, store_config).await.with_context(|| format!("cannot open store {url}"))?;
    let config = EngineConfig {
        session_ttl: args.session_ttl,
        resume_wait: args.resume_wait,
        result_chunk_bytes: args.result_chunk_bytes,
        max_result_bytes: args.max_result_bytes,
        max_sessions_per_principal: args.max_sessions_per_principal,
        max_sessionless_requests: args.max_sessionless,
        max_sessionless_requests_per_principal: args.max_sessionless_per_principal,
        max_listen_streams_per_principal: args.max_listen_per_principal,
        max_tasks: args.max_tasks,
        max_tasks_per_principal: args.max_tasks_per_principal,
        session_cache: args.session_cache,
        drain_timeout: args.drain_timeout,
        ..EngineConfig::default()
    };
    let http = HttpConfig {
        max_body: args.max_body,
        allowed_hosts: allowed_hosts(&args),
        allowed_origins: args.allowed_origins,
        json_response: args.json_response,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        body_timeout: args.body_timeout,
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        ..HttpConfig::default()
    };
    let listener = take_listener(&mut held, LISTEN, args.listen).await?;
    let local = listener.local_addr()?;
    let auth = match args.oauth_issuers.as_slice() {
        [] => auth,
        issuers => {
            let public_url = args.public_url.clone().unwrap_or_else(|| format!("http://{local}"));
            let introspection = match &args.oauth_client_id {
                None => None,
                Some(id) => {
                    let secret = std::env::var("TETHER_OAUTH_CLIENT_SECRET").ok().filter(|s| !s.is_empty()).with_context(|| {
                        format!("--oauth-client-id {id} is set: put its secret in the environment variable TETHER_OAUTH_CLIENT_SECRET")
                    })?;
                    Some(ClientCredentials { id: id.clone(), secret })
                }
            };
            let config = OAuthConfig { issuers: issuers.to_vec(), public_url, scopes: args.oauth_scopes.clone(), introspection };
            let server = ResourceServer::new(config).map_err(anyhow::Error::msg)?;
            let also = if args.auth_tokens.is_some() { " (and the tokens of --auth-tokens)" } else { " only" };
            tracing::info!(issuers = ?issuers, resource = %server.resource(""), "authentication is on: OAuth access tokens of these issuers accepted{also}");
            auth.with_oauth(server)
        }
    };
    let policies = match args.config.as_deref() {
        Some(path) => crate::serve_config::policies(path)?,
        None => Default::default(),
    };
    // The audit log's latest decisions are the admin API's too.
    let mut audited = None;
    let auth = match (policies.policies.len(), &args.audit_log) {
        (0, None) => auth,
        (0, Some(path)) => {
            anyhow::bail!("--audit-log {} is set, but the config file has no [[policies]] to audit", path.display())
        }
        (n, audit_log) => {
            let mut policy = Policy::from_config(policies).map_err(anyhow::Error::msg)?;
            if let Some(path) = audit_log {
                let audit = AuditLog::open(path).map_err(anyhow::Error::msg)?;
                reopen_audit_on_sighup(audit.clone());
                audited = Some(audit.clone());
                policy = policy.with_audit(audit);
                tracing::info!(file = %path.display(), "policy decisions audited (the file is opened anew on SIGHUP)");
            }
            tracing::info!(rules = n, "policies in force ([[policies]])");
            auth.with_policy(policy)
        }
    };
    let notebook: Arc<dyn tether_server::McpApp> = Arc::new(ToolRouter::new(Notebook::new(notebook)));
    let endpoints = Endpoints::new(Policed::wrap(notebook, "", &[], auth.policy()));
    tether_gateway::processes::ServerProcesses::global().set_max(args.max_stdio_processes);
    let configured = Gateways::read(&args.upstreams, args.config.as_deref())?;
    let mut gateways = Gateways { auth: auth.clone(), ..Gateways::default() };
    gateways.apply(&endpoints, configured, Start::Refuse).await?;
    reload_upstreams_on_sighup(endpoints.clone(), args.upstreams.clone(), args.config.clone(), gateways);
    let engine = Engine::with_endpoints(store, endpoints, config);
    if !local.ip().is_loopback() {
        tracing::warn!(%local, "listening beyond loopback: put authentication in front of this server");
    }
    tracing::info!(%local, store = %url, "tether listening on http://{local}/mcp");
    if let Some(endpoint) = &args.otlp_endpoint {
        tracing::info!(%endpoint, "traces exported over OTLP/HTTP");
    }
    let mut extra = if args.no_console {
        tracing::info!("web console off (--no-console)");
        axum::Router::new()
    } else {
        tracing::info!("web console at http://{local}{}", tether_console::PATH);
        tether_console::router()
    };
    match (args.no_metrics, args.metrics_listen) {
        (true, _) => tracing::info!("metrics off (--no-metrics)"),
        (false, None) => extra = extra.merge(tether_server::http::metrics_router(engine.clone())),
        (false, Some(addr)) => {
            let metrics = take_listener(&mut held, METRICS_LISTEN, addr).await?;
            let at = metrics.local_addr()?;
            tracing::info!(%at, "metrics at http://{at}/metrics");
            let engine = engine.clone();
            let http = http.clone();
            // Served until the process exits: the drain is worth watching too.
            tokio::spawn(async move {
                if let Err(e) = tether_server::http::serve_metrics(metrics, engine, &http).await {
                    tracing::error!(error = %e, "the metrics listener failed");
                }
            });
        }
    }
    if let Some(token) = &admin_token {
        tracing::info!(
            "admin API at http://{local}/admin/sessions (Bearer token from ${})",
            args.admin_token_env.as_deref().unwrap_or("")
        );
        let origins = &http.allowed_origins;
        extra = extra.merge(tether_server::http::admin_router(engine.clone(), token, origins, audited));
        if let Some(keeper) = &keeper {
            let routes = crate::keeper::admin_routes(keeper.clone());
            extra = extra.merge(tether_server::http::admin_guarded(token, origins, routes));
        }
        if !args.no_console {
            tracing::info!("admin page at http://{local}{}", tether_console::ADMIN_PATH);
            extra = extra.merge(tether_console::admin_router());
        }
    }
    if let Some(keeper) = &keeper {
        // From here on a restart is worth it: this engine got as far as serving.
        keeper.ready().await.map_err(anyhow::Error::msg)?;
    }
    tether_server::http::serve_with(listener, extra, engine, auth, http, stop_signal(keeper)).await?;
    Ok(())
}

/// What ends serving: SIGTERM or ctrl-c (a drain), or, under a keeper, its
/// request to hand over to a new engine (an upgrade: the same drain, with
/// the stdio upstreams' processes left to the keeper).
async fn stop_signal(keeper: Option<Arc<tether_keeper::client::Keeper>>) {
    let Some(keeper) = keeper else { return shutdown_signal().await };
    tokio::select! {
        () = shutdown_signal() => {}
        () = keeper.handover_asked() => tracing::info!("the keeper asked for a handover (an upgrade): draining; the next engine takes over"),
    }
}

/// On every SIGHUP, opens the audit log's path anew (after a rotation).
fn reopen_audit_on_sighup(audit: AuditLog) {
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    audit.reopen();
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP; the audit log is reopened only when its file is gone"),
    }
    #[cfg(not(unix))]
    let _ = audit;
}

/// On every SIGHUP, reads the upstreams and virtual servers again (the
/// config file's tables and the `--upstream` flags) and applies the
/// difference (see [`Gateways::apply`]). A broken file keeps what is in
/// force and logs why.
fn reload_upstreams_on_sighup(endpoints: Endpoints, flags: Vec<String>, file: Option<PathBuf>, mut gateways: Gateways) {
    #[cfg(unix)]
    {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hup) => hup,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; upstream changes need a restart");
                return;
            }
        };
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let applied = match Gateways::read(&flags, file.as_deref()) {
                    Ok(wanted) => gateways.apply(&endpoints, wanted, Start::Keep).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = applied {
                    tracing::error!(error = %format!("{e:#}"), "upstreams NOT reloaded; the previous ones stay in force");
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (endpoints, flags, file, gateways);
}

/// The upstreams and virtual servers as configured.
#[derive(Clone, Default)]
struct Configured {
    upstreams: Vec<tether_gateway::config::UpstreamConfig>,
    servers: Vec<tether_gateway::config::ServerConfig>,
}

/// What to do with a virtual server whose members collide.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At start: refuse to start.
    Refuse,
    /// At a reload: keep what is in force.
    Keep,
}

/// The gateway endpoints in force: a [`tether_gateway::Gateway`] per
/// upstream and a [`tether_gateway::VirtualServer`] per `[servers.NAME]`.
#[derive(Default)]
struct Gateways {
    configured: Configured,
    upstreams: std::collections::HashMap<String, Arc<tether_gateway::Gateway>>,
    /// Every endpoint is served under its policy (`Policed`).
    auth: Auth,
}

impl Gateways {
    fn read(flags: &[String], file: Option<&std::path::Path>) -> anyhow::Result<Configured> {
        let upstreams = upstreams(flags, file)?;
        let servers = match file {
            Some(path) => {
                let names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                crate::serve_config::servers(path, &names)?
            }
            None => Vec::new(),
        };
        Ok(Configured { upstreams, servers })
    }

    /// Serves `wanted`: an added upstream or server at once, a removed one's
    /// endpoint answers 404 (its sessions too), a changed upstream serves
    /// new connections with its new settings, and a virtual server is made
    /// again when it or one of its members changed (its sessions keep the
    /// members that stay). A virtual server whose members collide is an
    /// error (nothing is changed).
    async fn apply(&mut self, endpoints: &Endpoints, wanted: Configured, start: Start) -> anyhow::Result<()> {
        if self.auth.oauth().is_some() {
            refuse_forwarded_oauth_tokens(&wanted.upstreams)?;
        }
        let mut upstreams = std::collections::HashMap::new();
        let mut changed = std::collections::HashSet::new();
        for upstream in &wanted.upstreams {
            let gateway = match self.configured.upstreams.iter().find(|u| u.name == upstream.name) {
                Some(old) if old == upstream => self.upstreams.get(&upstream.name).cloned(),
                _ => None,
            };
            let gateway = gateway.unwrap_or_else(|| {
                changed.insert(upstream.name.clone());
                tether_gateway::Gateway::new(upstream.clone())
            });
            upstreams.insert(upstream.name.clone(), gateway);
        }
        let mut servers = Vec::new();
        for server in &wanted.servers {
            let unchanged = self.configured.servers.contains(server) && server.upstreams.iter().all(|m| !changed.contains(m));
            if unchanged && start == Start::Keep {
                continue;
            }
            let made = tether_gateway::VirtualServer::new(server.clone(), &upstreams).map_err(anyhow::Error::msg)?;
            made.check().await.map_err(anyhow::Error::msg)?;
            servers.push(made);
        }
        for old in &self.configured.upstreams {
            if !upstreams.contains_key(&old.name) {
                endpoints.remove(&old.name);
                tracing::info!(upstream = %old.name, "upstream removed: /mcp/{} and its sessions now answer 404", old.name);
            }
        }
        for old in &self.configured.servers {
            if !wanted.servers.iter().any(|s| s.name == old.name) {
                endpoints.remove(&old.name);
                tracing::info!(server = %old.name, "virtual server removed: /mcp/{} and its sessions now answer 404", old.name);
            }
        }
        for name in &changed {
            let verb = if self.upstreams.contains_key(name) { "changed: new connections use the new settings" } else { "added" };
            tracing::info!(upstream = %name, "upstream {verb}; gateway endpoint /mcp/{name}");
            if let Some(gateway) = upstreams.get(name) {
                endpoints.set(name.clone(), Policed::wrap(gateway.clone(), name, &[], self.auth.policy()));
            }
        }
        for server in servers {
            tracing::info!(server = %server.name(), "virtual server endpoint /mcp/{}", server.name());
            let name = server.name().to_owned();
            let members = server.members().to_vec();
            endpoints.set(name.clone(), Policed::wrap(server, &name, &members, self.auth.policy()));
        }
        self.upstreams = upstreams;
        self.configured = wanted;
        Ok(())
    }
}

/// With `--oauth-issuer`, an upstream with `forward_auth = true` would get
/// each client's access token, a token for tether (token passthrough, which
/// the MCP authorization spec forbids): refused, at start and at a reload.
fn refuse_forwarded_oauth_tokens(upstreams: &[tether_gateway::config::UpstreamConfig]) -> anyhow::Result<()> {
    use tether_gateway::config::Target;
    if let Some(upstream) = upstreams.iter().find(|u| matches!(&u.target, Target::Url(spec) if spec.forward_auth)) {
        let name = &upstream.name;
        anyhow::bail!(
            "[upstreams.{name}] forward_auth = true with --oauth-issuer would send each client's OAuth access token, \
             a token meant for tether, to the upstream (the MCP authorization spec forbids passing it through); \
             remove forward_auth and give the upstream a token of tether's own: [upstreams.{name}.oauth] \
             (client credentials, or token exchange on behalf of the caller) or auth_env"
        );
    }
    Ok(())
}

/// The upstreams of `--upstream` flags and of the config file; a name used twice is an error.
fn upstreams(flags: &[String], file: Option<&std::path::Path>) -> anyhow::Result<Vec<tether_gateway::config::UpstreamConfig>> {
    let mut all = match file {
        Some(path) => crate::serve_config::upstreams(path)?,
        None => Vec::new(),
    };
    for flag in flags {
        all.push(tether_gateway::config::parse_flag(flag).map_err(anyhow::Error::msg)?);
    }
    let mut names = std::collections::HashSet::new();
    for upstream in &all {
        if !names.insert(upstream.name.as_str()) {
            anyhow::bail!("upstream `{}` is configured twice; give each a name of its own", upstream.name);
        }
    }
    Ok(all)
}
