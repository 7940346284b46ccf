//! The comparison with `--baseline`: every tether system also ran from an
//! earlier tether build as its twin `<system>@baseline` (the same flags, a
//! store of its own, the same rounds and scenarios). For each row of the
//! current build's tether systems it gives current / baseline of the figure
//! the budget judges that scenario by, so a reader sees at a glance which
//! got worse; tools_call is compared like the budget's ratio lines (the
//! median of the paired rounds' ratios).

use crate::budget::rps_ratio;
use crate::report::Row;
use crate::scenario::Scenario;
use crate::server::{BASELINE_SUFFIX, System};

/// `a`'s figure over `b`'s, and its text.
fn ratio(a: Option<f64>, b: Option<f64>, unit: &str) -> Option<(String, f64)> {
    let (x, y) = a.zip(b).filter(|&(_, y)| y > 0.0)?;
    Some((format!("{:.2}x ({x:.1} / {y:.1} {unit})", x / y), x / y))
}

/// One line per row of a current tether system: current / baseline, which
/// way is better, and the verdict: better, the same (the ratio shows as
/// 1.00x) or worse. A row without a valid twin is "not measured".
pub fn comparison(rows: &[Row]) -> String {
    let mut s = String::from("| vs baseline | current / baseline | better | verdict |\n|---|---|---|---|\n");
    let current_tether = |r: &Row| System::ALL.iter().any(|s| s.is_tether() && s.name() == r.system);
    for current in rows.iter().filter(|r| current_tether(r)) {
        let Some(scenario) = Scenario::ALL.into_iter().find(|s| s.name() == current.scenario) else { continue };
        let twin_name = format!("{}{BASELINE_SUFFIX}", current.system);
        let twin = rows
            .iter()
            .find(|r| r.system == twin_name && r.scenario == current.scenario && r.clients == current.clients && r.errors == 0)
            .filter(|_| current.errors == 0);
        let (line, higher_is_better) = if scenario.interleaved() {
            (format!("{} {} ({} clients)", current.system, scenario.name(), current.clients), true)
        } else {
            (format!("{} {}", current.system, scenario.name()), false)
        };
        let compared = twin.and_then(|twin| match scenario {
            Scenario::ToolsCall
            | Scenario::ToolsCallModern
            | Scenario::ToolsCallOauth
            | Scenario::GatewayHttp
            | Scenario::GatewayStdio
            | Scenario::GatewayFederated => rps_ratio(current, twin),
            Scenario::Replay10k | Scenario::Restart100kSessions | Scenario::Restart1mSessions | Scenario::EngineRestart => {
                ratio(current.ms, twin.ms, "ms")
            }
            Scenario::IdleSession | Scenario::GatewayMemory => ratio(current.bytes, twin.bytes, "bytes"),
            Scenario::Streams10k => ratio(current.rss_mib, twin.rss_mib, "MiB"),
        });
        let (measured, verdict) = match compared {
            Some((text, r)) if format!("{r:.2}") == "1.00" => (text, "same"),
            Some((text, r)) if (r > 1.0) == higher_is_better => (text, "better"),
            Some((text, _)) => (text, "**worse**"),
            None => ("not measured".to_string(), "—"),
        };
        let better = if higher_is_better { "higher" } else { "lower" };
        s.push_str(&format!("| {line} | {measured} | {better} | {verdict} |\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Subject;

    fn twin(system: System) -> Subject {
        Subject { system, baseline: true }
    }

    #[test]
    fn every_current_tether_row_is_compared_with_its_twin() {
        let tools = |subject: Subject, rounds: &[f64]| Row {
            rps: Some(rounds[1]),
            rounds_rps: rounds.to_vec(),
            ..Row::new(subject, Scenario::ToolsCall, 64, false)
        };
        let replay = |subject: Subject, ms| Row { ms: Some(ms), ..Row::new(subject, Scenario::Replay10k, 1, false) };
        let idle = |subject: Subject, bytes| Row { bytes: Some(bytes), ..Row::new(subject, Scenario::IdleSession, 64, false) };
        let rows = vec![
            tools(System::TetherSqlite.into(), &[900.0, 1000.0, 1100.0]),
            tools(twin(System::TetherSqlite), &[1000.0, 1000.0, 1000.0]),
            tools(System::Rmcp.into(), &[1.0, 1.0, 1.0]),
            replay(System::TetherSqlite.into(), 12.0),
            replay(twin(System::TetherSqlite), 10.0),
            idle(System::TetherMemory.into(), 500.0),
            idle(twin(System::TetherMemory), 1000.0),
            idle(System::TetherSqlite.into(), 600.0),
        ];
        let c = comparison(&rows);
        assert!(
            c.contains("| tether-sqlite tools_call (64 clients) | 1.00x (median of 3 paired rounds: 0.90, 1.00, 1.10); median rounds 1.00x (1000 / 1000 rps) | higher | same |"),
            "{c}"
        );
        assert!(c.contains("| tether-sqlite replay_10k | 1.20x (12.0 / 10.0 ms) | lower | **worse** |"), "{c}");
        assert!(c.contains("| tether-memory idle_session | 0.50x (500.0 / 1000.0 bytes) | lower | better |"), "{c}");
        assert!(c.contains("| tether-sqlite idle_session | not measured | lower | — |"), "{c}");
        assert!(!c.contains("rmcp") && !c.contains("@baseline"), "only the current tether systems have lines: {c}");
    }
}
