//! `tether serve` as the keeper: the small supervisor that holds the
//! listening sockets and the stdio upstreams' processes and runs the
//! server as its child, `tether engine` with the same arguments
//! (`tether_keeper::supervisor`). Linux only (it relies on
//! `PR_SET_PDEATHSIG`); elsewhere `tether serve` runs as one process, as
//! with `--no-keeper`.

use std::ffi::OsString;

use crate::serve::{ServeArgs, keeper_listeners};

/// Whether this platform has the keeper.
pub const SUPPORTED: bool = cfg!(target_os = "linux");

/// Runs the keeper until the server stops; its exit code.
pub fn run(args: &ServeArgs) -> std::process::ExitCode {
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(e) => {
            eprintln!("tether: cannot find this program's path to start the engine with: {e}; run with --no-keeper");
            return std::process::ExitCode::FAILURE;
        }
    };
    // The engine reads the arguments (and the config file) itself, on
    // every start: a restarted engine sees what an operator changed.
    let argv: Vec<OsString> = std::env::args_os().collect();
    let engine_args = match argv.iter().position(|a| a == "serve") {
        Some(at) => argv[at + 1..].to_vec(),
        None => Vec::new(),
    };
    supervise(keeper_listeners(args), program, engine_args)
}

#[cfg(target_os = "linux")]
fn supervise(
    listeners: Vec<(String, std::net::SocketAddr)>,
    program: std::path::PathBuf,
    engine_args: Vec<OsString>,
) -> std::process::ExitCode {
    let config = tether_keeper::supervisor::KeeperConfig { listeners, program, engine_args };
    let code = tether_keeper::supervisor::run(config);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(not(target_os = "linux"))]
fn supervise(_: Vec<(String, std::net::SocketAddr)>, _: std::path::PathBuf, _: Vec<OsString>) -> std::process::ExitCode {
    // Not reached: `SUPPORTED` is false here.
    std::process::ExitCode::FAILURE
}

/// The engine's side: when the keeper's control socket closes, the keeper
/// is dead and the kernel is about to kill this engine too
/// (`PR_SET_PDEATHSIG`); it exits at once rather than act on children it
/// no longer has (as a `kill -9` would end it).
pub fn die_with(keeper: std::sync::Arc<tether_keeper::client::Keeper>) {
    tokio::spawn(async move {
        keeper.gone().await;
        tracing::error!("the keeper is gone: this engine stops with it");
        std::process::exit(1);
    });
}

/// How often the engine asks its keeper for its counts (for `/metrics`).
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The engine's side: the keeper's counts in `/metrics`, refreshed every
/// [`STATUS_EVERY`] until the keeper is gone.
pub fn watch(keeper: std::sync::Arc<tether_keeper::client::Keeper>) {
    tether_server::metrics::keeper_taken_over(keeper.kept_at_start().len());
    tokio::spawn(async move {
        loop {
            match keeper.status().await {
                Ok(status) => tether_server::metrics::keeper_status(
                    status.restarts,
                    std::time::Duration::from_millis(status.last_restart_ms),
                    status.children.len(),
                    status.held_bytes,
                ),
                Err(_) => return,
            }
            tokio::select! {
                () = tokio::time::sleep(STATUS_EVERY) => {}
                () = keeper.gone() => return,
            }
        }
    });
}

/// The keeper's part of the admin API (behind the admin token):
/// `GET /admin/keeper` (its counts and every child it keeps) and
/// `POST /admin/keeper/upgrade` (as `SIGUSR2` to the keeper: a new engine
/// from the binary now on disk takes over).
pub fn admin_routes(keeper: std::sync::Arc<tether_keeper::client::Keeper>) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use serde_json::json;
    let status = {
        let keeper = keeper.clone();
        move || async move {
            match keeper.status().await {
                Ok(s) => {
                    let children: Vec<_> = s
                        .children
                        .iter()
                        .map(|k| json!({"child": k.child, "pid": k.pid, "label": k.label, "attached": k.attached}))
                        .collect();
                    let body = json!({
                        "epoch": keeper.epoch(),
                        "restarts": s.restarts,
                        "last_restart_ms": s.last_restart_ms,
                        "held_bytes": s.held_bytes,
                        "children_taken_over": keeper.kept_at_start().len(),
                        "children": children,
                    });
                    (StatusCode::OK, axum::Json(body))
                }
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": e}))),
            }
        }
    };
    let upgrade = || async {
        let keeper = rustix::process::getppid();
        match keeper.map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::USR2)) {
            Some(Ok(())) => (
                StatusCode::ACCEPTED,
                axum::Json(json!({"upgrading": true, "see": "the server's log: the keeper checks the new binary first"})),
            ),
            _ => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": "the keeper cannot be signalled"}))),
        }
    };
    axum::Router::new().route("/admin/keeper", get(status)).route("/admin/keeper/upgrade", post(upgrade))
}

/// `tether upgrade --url URL`: asks a running server's keeper, through the
/// admin API, to start a new engine from the binary now on disk.
#[derive(Debug, clap::Args)]
pub struct UpgradeArgs {
    /// The server (its base URL or its /mcp URL); its admin API must be on,
    /// the token in $TETHER_ADMIN_TOKEN.
    #[arg(long)]
    url: String,
}

pub async fn upgrade(args: UpgradeArgs) -> anyhow::Result<()> {
    let body =
        crate::sessions_cmd::admin_call(&args.url, |http, base| Ok(http.post(format!("{base}/admin/keeper/upgrade")))).await?;
    println!("{body}");
    Ok(())
}
