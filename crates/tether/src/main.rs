//! `tether`: one binary, several subcommands. `serve` runs the durable
//! Streamable HTTP MCP server with the notebook behind it.

mod bridge_cmd;
mod call_cmd;
mod client_config;
mod keeper;
mod otel;
mod serve;
mod serve_config;
mod sessions_cmd;
mod tools_cmd;

use clap::{Parser, Subcommand};

// mimalloc: the server allocates and frees many small buffers on several
// threads; glibc's allocator spent about a quarter of the workers' time on
// them in profiles (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "tether", version, about = "Durable, resumable sessions for the Model Context Protocol")]
// A config file's flags come first and typed ones override them.
#[command(args_override_self = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the MCP server (Streamable HTTP at /mcp) with durable sessions.
    // Boxed: its many flags made the enum several times the size of the others.
    Serve(Box<serve::ServeArgs>),
    /// The server itself, as the keeper (`tether serve`) runs it; not for typing.
    #[command(hide = true)]
    Engine(Box<serve::ServeArgs>),
    /// Prints the keeper control protocol's version (the keeper asks a new
    /// binary before an upgrade).
    #[command(hide = true)]
    KeeperProtocol,
    /// List the tools of an MCP server (a URL or a server name from the config).
    Tools(tools_cmd::ToolsArgs),
    /// Call a tool of an MCP server and print its complete result.
    Call(call_cmd::CallArgs),
    /// Run as a host's stdio MCP server, forwarding to a remote server and
    /// resuming its session across restarts.
    Bridge(bridge_cmd::BridgeArgs),
    /// List, show and end sessions: through a running server's admin API
    /// (`--url`, token from $TETHER_ADMIN_TOKEN) or in a stopped server's store.
    Sessions(sessions_cmd::SessionsArgs),
    /// Ask a running server's keeper to start a new engine from the binary
    /// now on disk (through the admin API; as `kill -USR2` of `tether serve`).
    Upgrade(keeper::UpgradeArgs),
    /// Print a shell completion script (e.g. `tether completions bash > /etc/bash_completion.d/tether`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> std::process::ExitCode {
    let argv = match serve_config::expand(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("tether: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    match &cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(*shell, &mut Cli::command(), "tether", &mut std::io::stdout());
            return std::process::ExitCode::SUCCESS;
        }
        Command::KeeperProtocol => {
            println!("{}", tether_keeper::proto::VERSION);
            return std::process::ExitCode::SUCCESS;
        }
        _ => {}
    }
    // Client commands keep stderr for their one-line reasons.
    let default_filter =
        if matches!(cli.command, Command::Tools(_) | Command::Call(_) | Command::Sessions(_) | Command::Upgrade(_)) {
            "warn"
        } else {
            "info"
        };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let json = matches!(&cli.command, Command::Serve(args) | Command::Engine(args) if args.log_format == serve::LogFormat::Json);
    let otlp = match &cli.command {
        Command::Engine(args) => args.otlp_endpoint.as_deref(),
        Command::Serve(args) if args.no_keeper || !keeper::SUPPORTED => args.otlp_endpoint.as_deref(),
        _ => None,
    };
    let traces = match otlp.map(otel::provider).transpose() {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("tether: --otlp-endpoint: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    otel::init_logging(json, filter, traces.as_ref());
    // `tether serve` is the keeper, unless asked not to be: it runs the
    // server as `tether engine` with the same arguments.
    let cli = match cli.command {
        Command::Serve(args) if !args.no_keeper && keeper::SUPPORTED => return keeper::run(&args),
        command => Cli { command },
    };
    let welcomed = match &cli.command {
        Command::Engine(_) => match tether_keeper::client::handshake() {
            Ok(welcomed) => welcomed,
            Err(e) => {
                eprintln!("tether engine: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tether: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) | Command::Engine(args) => report(serve::run(*args, welcomed).await),
            Command::KeeperProtocol => std::process::ExitCode::SUCCESS,
            // Client commands choose their exit codes (0, 1 isError, 2 usage, 3 connection).
            Command::Tools(args) => tools_cmd::run(args).await,
            Command::Call(args) => call_cmd::run(args).await,
            Command::Bridge(args) => report(bridge_cmd::run(args).await),
            Command::Sessions(args) => report(sessions_cmd::run(args).await),
            Command::Upgrade(args) => report(keeper::upgrade(args).await),
            Command::Completions { .. } => std::process::ExitCode::SUCCESS,
        }
    });
    // After the serve path's drain: the spans of the last requests are ended.
    if let Some(traces) = traces {
        otel::flush(&traces);
    }
    code
}

fn report(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tether: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
