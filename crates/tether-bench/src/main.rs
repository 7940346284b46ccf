//! `tether-bench`: starts each system under test, drives MCP `tools/call`
//! load against it at each client count, and prints a Markdown table (and
//! writes the same rows as JSON). Run it through `scripts/bench`.

mod load;
mod server;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde::Serialize;

use server::{Server, System};

#[derive(Debug, Parser)]
#[command(name = "tether-bench", about = "Throughput, latency and memory of tether under MCP tools/call load")]
struct Args {
    /// The `tether` binary to start.
    #[arg(long, default_value = "target/release/tether")]
    tether: PathBuf,
    /// Systems to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "tether-memory,tether-sqlite")]
    systems: Vec<System>,
    /// Concurrent clients (one session and one connection each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Length of the measure window of each run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Calls made before the measure window opens (not recorded).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Short runs: --duration 3s --warmup 1s.
    #[arg(long)]
    quick: bool,
    /// Where the JSON rows are written.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
}

/// One line of the table (and of the JSON file).
#[derive(Debug, Serialize)]
struct Row {
    system: String,
    scenario: String,
    clients: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_mib: f64,
    /// Failed calls or session set-ups; a row with errors is not a valid measurement.
    errors: u64,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args.duration = Duration::from_secs(3);
        args.warmup = Duration::from_secs(1);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tether-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(rows) if rows.iter().all(|r| r.errors == 0) => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("tether-bench: some runs had errors (marked in the table); their numbers are not valid");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tether-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(args.clients.iter().all(|&c| c > 0), "--clients must all be 1 or more");
    anyhow::ensure!(!args.duration.is_zero(), "--duration must be more than 0");
    let mut rows = Vec::new();
    for &system in &args.systems {
        eprintln!("== {}: starting {}", system.name(), args.tether.display());
        let server = Server::start(system, &args.tether).await.with_context(|| format!("starting {}", system.name()))?;
        let mut system_rows = Vec::new();
        for &clients in &args.clients {
            eprintln!(
                "== {}: {clients} clients, {} warm-up + {} measured",
                system.name(),
                humantime::format_duration(args.warmup),
                humantime::format_duration(args.duration)
            );
            let outcome = load::run(&server.mcp_url, clients, args.warmup, args.duration).await?;
            for e in &outcome.first_errors {
                eprintln!("   error: {e}");
            }
            if outcome.errors > 0 {
                eprintln!("   {} errors in this run", outcome.errors);
            }
            system_rows.push(Row {
                system: system.name().to_string(),
                scenario: "tools_call".to_string(),
                clients,
                rps: round(outcome.rps(), 1),
                p50_ms: round(outcome.quantile_ms(0.50), 3),
                p99_ms: round(outcome.quantile_ms(0.99), 3),
                rss_mib: 0.0,
                errors: outcome.errors,
            });
        }
        // Peak RSS covers all of this system's runs, so it is read once at the end.
        let rss = server.peak_rss_mib()?;
        for row in &mut system_rows {
            row.rss_mib = round(rss, 1);
        }
        server.stop().await.with_context(|| format!("stopping {}", system.name()))?;
        rows.extend(system_rows);
    }

    print!("{}", table(&rows));
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(&rows)?;
    std::fs::write(&args.out, json + "\n").with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!("rows written to {}", args.out.display());
    Ok(rows)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The Markdown table; a run with errors says so in its scenario cell.
fn table(rows: &[Row]) -> String {
    let mut s = String::from("| system | scenario | clients | rps | p50_ms | p99_ms | rss_mib |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let scenario = if r.errors == 0 { r.scenario.clone() } else { format!("{} (**{} errors**)", r.scenario, r.errors) };
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.3} | {:.3} | {:.1} |\n",
            r.system, scenario, r.clients, r.rps, r.p50_ms, r.p99_ms, r.rss_mib
        ));
    }
    s
}
