//! Interleaved rounds of the `tools_call` load (tools_call,
//! tools_call_modern, tools_call_oauth, and gateway_http, gateway_federated
//! and gateway_stdio together): every participant started at once, each
//! round one short measured slice per participant in turn, and each
//! participant's row per client count the round with the median requests/s.

use std::time::Duration;

use crate::Args;
use crate::load;
use crate::report::{Row, round};
use crate::running::start_for;
use crate::scenario::Scenario;
use crate::server::{Programs, Protocol, Subject, System};

/// The row of one system and client count from its tools_call rounds: the
/// round with the median requests/s, with the spread and every round's
/// requests/s. A round with errors is reported instead.
fn median_round(mut rounds: Vec<Row>) -> Option<Row> {
    if let Some(failed) = rounds.iter().position(|r| r.errors > 0) {
        return Some(rounds.swap_remove(failed));
    }
    let runs = rounds.len();
    let in_round_order: Vec<f64> = rounds.iter().map(|r| r.rps.unwrap_or(0.0)).collect();
    rounds.sort_by(|a, b| a.rps.unwrap_or(0.0).total_cmp(&b.rps.unwrap_or(0.0)));
    let (low, high) = (rounds.first()?.rps.unwrap_or(0.0), rounds.last()?.rps.unwrap_or(0.0));
    let mut median = rounds.swap_remove(runs / 2);
    if runs > 1 {
        median.spread = Some(format!("median of {runs} interleaved rounds, {low:.0} to {high:.0} rps"));
        median.rounds_rps = in_round_order;
    }
    Some(median)
}

/// Calls made at the start of every measured slice and not counted: the
/// system's threads wake up from the other systems' slices.
const SLICE_LEAD_IN: Duration = Duration::from_millis(100);

/// tools_call (and gateway_http, gateway_stdio, gateway_federated: the same
/// load on other systems), interleaved in short slices: every participant's
/// server (a system as a scenario runs it) runs at once (idle outside its
/// slices), each with its clients' sessions open and warmed up; then each
/// round gives every participant one `--duration` slice in turn. The host's
/// speed drifts by tens of percent within seconds (the load generator's own
/// CPU per call, the same work against every system, moves with it), so
/// figures taken minutes apart compare the host as much as the systems;
/// slices a second apart see the same host. The gateway scenarios run in
/// one set of rounds, so their rows pair up round by round across scenarios
/// too. Peak RSS is the server's over the whole run (not its upstream's or
/// children's; with a keeper, the keeper's and the engine's summed).
pub(crate) async fn interleaved(args: &Args, programs: &Programs, participants: &[(Scenario, Subject)]) -> Vec<Row> {
    let names: Vec<&str> = participants.iter().fold(Vec::new(), |mut names, (scenario, _)| {
        if !names.contains(&scenario.name()) {
            names.push(scenario.name());
        }
        names
    });
    let name = names.join(" + ");
    let mut servers = Vec::with_capacity(participants.len());
    for &(scenario, subject) in participants {
        eprintln!("== {}: starting for {}", subject.name(), scenario.name());
        servers.push(((scenario, subject), start_for(programs, scenario, subject).await));
    }
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let mut loads = Vec::new();
        for ((scenario, subject), started) in &servers {
            let (scenario, subject) = (*scenario, *subject);
            let row = |error: String| Row::failed(subject, scenario, clients, args.quick, error);
            let server = match started {
                Ok(running) => &running.server,
                Err(e) => {
                    rows.push(row(format!("{e:#}")));
                    continue;
                }
            };
            eprintln!(
                "== {}: {}, {clients} clients, {} warm-up",
                subject.name(),
                scenario.name(),
                humantime::format_duration(args.warmup)
            );
            let protocol = if scenario == Scenario::GatewayFederated { Protocol::Federated } else { subject.system.protocol() };
            let tokens = started.as_ref().map(|r| r.tokens.as_slice()).unwrap_or_default();
            let warmed = match load::Load::open(protocol, &server.mcp_url, clients, tokens).await {
                Ok(mut load) => load.run(args.warmup, Duration::ZERO, &[], &[]).await.map(|warm_up| (load, warm_up)),
                Err(e) => Err(e),
            };
            // With a keeper, its engine's CPU too (the engine runs throughout: none is killed here).
            let mut pids = server.processes().unwrap_or_else(|_| vec![server.pid()]);
            // tether-gateway-stdio-relay: its relays' CPU too (each a child of
            // tether, open with its session), as the keeper's is counted for
            // tether-gateway; the echo servers behind them are its upstream's, as everywhere.
            if subject.system == System::TetherGatewayStdioRelay {
                pids.extend(server.children().unwrap_or_default());
            }
            // The gateway scenarios: what it fronts, its upstream and its stdio
            // servers (started by now: every session has called), measured apart.
            let upstream = match started {
                Ok(running) if scenario.gateway() => running.upstream_processes(&pids),
                _ => Vec::new(),
            };
            match warmed {
                Ok((load, warm_up)) if warm_up.errors == 0 => {
                    loads.push((scenario, subject, (pids, upstream), load, Vec::with_capacity(args.rounds)))
                }
                Ok((_, warm_up)) => rows.push(row(format!("warm-up: {}", warm_up.first_errors.join("; ")))),
                Err(e) => rows.push(row(format!("{e:#}"))),
            }
        }
        for round in 1..=args.rounds {
            eprintln!("== {name}, {clients} clients, round {round} of {}", args.rounds);
            for (scenario, subject, pids, load, rounds) in &mut loads {
                let outcome = load.run(SLICE_LEAD_IN, args.duration, &pids.0, &pids.1).await;
                rounds.push(measured(*subject, *scenario, clients, args.quick, outcome));
            }
        }
        rows.extend(loads.into_iter().filter_map(|(_, _, _, _, rounds)| median_round(rounds)));
    }
    for ((scenario, subject), started) in servers {
        let Ok(running) = started else { continue };
        let label = format!("{} ({})", subject.name(), scenario.name());
        let own = |r: &Row| r.system == subject.name() && r.scenario == scenario.name();
        match running.server.peak_rss_mib() {
            Ok(rss) => rows.iter_mut().filter(|r| own(r)).for_each(|r| r.rss_mib = Some(round(rss, 1))),
            Err(e) => eprintln!("   {label}: cannot read the peak RSS: {e:#}"),
        }
        let (count, last) = running.server.problems();
        if count > 0 {
            eprintln!("   {label} logged {count} WARN/ERROR lines; the last ones:\n{}", last.join("\n"));
            for r in rows.iter_mut().filter(|r| own(r)) {
                let logged = format!("server log: {count} WARN/ERROR lines");
                r.note = Some(r.note.take().map_or(logged.clone(), |n| format!("{n}; {logged}")));
            }
        }
        if rows.iter().any(|r| own(r) && r.errors > 0) {
            eprintln!("   {label} log tail:\n{}", running.server.log_tail());
        }
        if let Err(e) = running.stop().await {
            eprintln!("   {e:#}");
        }
    }
    rows
}

/// One slice's row.
fn measured(subject: Subject, scenario: Scenario, clients: usize, quick: bool, outcome: anyhow::Result<load::Outcome>) -> Row {
    let mut row = Row::new(subject, scenario, clients, quick);
    match outcome {
        Ok(outcome) => {
            for e in &outcome.first_errors {
                eprintln!("   {}: error: {e}", subject.name());
            }
            row.rps = Some(round(outcome.rps(), 1));
            row.p50_ms = Some(round(outcome.quantile_ms(0.50), 3));
            row.p99_ms = Some(round(outcome.quantile_ms(0.99), 3));
            row.client_us_per_call = outcome.client_us_per_call().map(|us| round(us, 1));
            row.server_us_per_call = outcome.server_us_per_call().map(|us| round(us, 1));
            row.upstream_us_per_call = outcome.upstream_us_per_call().map(|us| round(us, 1));
            row.errors = outcome.errors;
            row.error = outcome.first_errors.first().cloned();
            eprintln!(
                "   {:<40} {:>8.0} rps, p50 {:.3} ms, p99 {:.3} ms, {} errors, CPU per call: server {:.1} µs, upstream {:.1} µs, load generator {:.1} µs",
                format!("{} {}", subject.name(), scenario.name()),
                outcome.rps(),
                outcome.quantile_ms(0.5),
                outcome.quantile_ms(0.99),
                outcome.errors,
                outcome.server_us_per_call().unwrap_or(f64::NAN),
                outcome.upstream_us_per_call().unwrap_or(f64::NAN),
                outcome.client_us_per_call().unwrap_or(f64::NAN)
            );
        }
        Err(e) => {
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::System;

    fn run(clients: usize, rps: f64, p50: f64, rss: f64) -> Row {
        Row {
            rps: Some(rps),
            p50_ms: Some(p50),
            rss_mib: Some(rss),
            ..Row::new(System::TetherSqlite, Scenario::ToolsCall, clients, false)
        }
    }

    #[test]
    fn a_client_count_reports_its_median_round_with_the_spread() {
        let row =
            median_round(vec![run(64, 900.0, 1.0, 40.0), run(64, 700.0, 2.0, 40.0), run(64, 800.0, 3.0, 40.0)]).expect("a row");
        assert_eq!((row.clients, row.rps, row.p50_ms), (64, Some(800.0), Some(3.0)), "the median round, whole");
        assert_eq!(row.spread.as_deref(), Some("median of 3 interleaved rounds, 700 to 900 rps"));
        assert_eq!(row.rounds_rps, vec![900.0, 700.0, 800.0], "every round, in round order");
    }

    #[test]
    fn a_round_with_errors_is_reported_not_hidden_by_the_median() {
        let failed = Row::failed(System::TetherSqlite, Scenario::ToolsCall, 64, false, "wrong answer".into());
        let row = median_round(vec![run(64, 900.0, 1.0, 40.0), failed, run(64, 800.0, 1.0, 40.0)]).expect("a row");
        assert_eq!((row.errors, row.error.as_deref()), (1, Some("wrong answer")));
    }
}
