//! What a bench run produces: the rows (JSON) in table order, the
//! Markdown table and an SVG bar chart of `tools_call` throughput at 64
//! clients. The budget check below the table is [`crate::budget`]'s.

use serde::Serialize;

use crate::scenario::Scenario;
use crate::server::{BASELINE_SUFFIX, Subject, System};

/// One line of the table (and of the JSON file). Figures a scenario does
/// not have are left out of the JSON and empty in the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    pub scenario: String,
    pub clients: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<f64>,
    /// Sessions (idle_session, restart_100k_sessions) or events (replay_10k) the scenario used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// idle_session with sqlite or Redis: store bytes per session outside the server process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<f64>,
    /// restart_1m_sessions: the store's growth per stored idle session (the
    /// SQLite files, or Redis's `used_memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_session: Option<f64>,
    /// How many runs the figure (`rps` or `ms`) is the median of, and their range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<String>,
    /// tools_call with `--rounds` above 1: every round's requests/s, in round
    /// order (round `i` of every system ran within the same minute or two).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub rounds_rps: Vec<f64>,
    /// tools_call: the load generator's own CPU µs per call in this run. Its
    /// work per call is the same against every system, so this moves with the
    /// host's speed and with how much the server slows the shared machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_us_per_call: Option<f64>,
    /// streams_10k: the server's CPU while every stream is open and idle, in
    /// percent of one core (its `/proc/PID/stat` over the idle window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    /// streams_10k: ms from sending the notification to the last stream receiving it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fanout_ms: Option<f64>,
    /// The server process's own CPU per call (not its upstream's or children's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_us_per_call: Option<f64>,
    /// The gateway scenarios: the CPU per call of what the server fronts
    /// (the `rmcp_ref` behind it, its stdio servers and what runs under them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_us_per_call: Option<f64>,
    /// gateway_memory: the live children's RSS (their `VmRSS` summed) per
    /// live session; `bytes` is tether's own growth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children_bytes: Option<f64>,
    /// gateway_memory: tether's own RSS growth per live session of the
    /// virtual server of three stdio members (measured as `bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub federated_bytes: Option<f64>,
    /// gateway_memory: that virtual server's live children's RSS per live
    /// session (three children each; measured as `children_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub federated_children_bytes: Option<f64>,
    /// engine_restart: the slowest kill's ms to the first answered call
    /// (`ms` is the median kill's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
    /// engine_restart: every kill's ms to the first answered call, in kill order.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub kills: Vec<f64>,
    /// engine_restart: ms from the kill until every session with a child
    /// answered once, the median kill's and the slowest's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_answered_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_answered_max_ms: Option<f64>,
    /// engine_restart: the stdio children the keeper held (one per session that called).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<u64>,
    /// engine_restart: the keeper's own RSS (VmRSS, the largest sample) with
    /// those children under load, and its bound: what it may hold per child
    /// times the children.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper_rss_bytes: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper_bound_bytes: Option<f64>,
    /// How the system was set up for this row when it differs from its usual
    /// setup; for replay_10k also how many of the fill's notifications were
    /// sent again after a 429.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A `--quick` run: shorter windows, fewer sessions; not the real figures.
    pub quick: bool,
    /// Failed calls or steps; a row with errors is not a valid measurement.
    pub errors: u64,
    /// A protocol deviation the measurement went through (it is not an
    /// error but the table flags it), e.g. a replay that re-sends the
    /// `Last-Event-ID` event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deviation: Option<String>,
    /// The first error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Row {
    pub fn new(subject: impl Into<Subject>, scenario: Scenario, clients: usize, quick: bool) -> Self {
        Row {
            system: subject.into().name(),
            scenario: scenario.name().into(),
            clients,
            rps: None,
            p50_ms: None,
            p99_ms: None,
            rss_mib: None,
            ms: None,
            bytes: None,
            count: None,
            store_bytes: None,
            bytes_per_session: None,
            spread: None,
            rounds_rps: Vec::new(),
            client_us_per_call: None,
            server_us_per_call: None,
            upstream_us_per_call: None,
            children_bytes: None,
            federated_bytes: None,
            federated_children_bytes: None,
            max_ms: None,
            kills: Vec::new(),
            all_answered_ms: None,
            all_answered_max_ms: None,
            children: None,
            keeper_rss_bytes: None,
            keeper_bound_bytes: None,
            cpu_percent: None,
            fanout_ms: None,
            note: None,
            quick,
            errors: 0,
            deviation: None,
            error: None,
        }
    }

    pub fn failed(subject: impl Into<Subject>, scenario: Scenario, clients: usize, quick: bool, error: String) -> Self {
        Row { errors: 1, error: Some(error), ..Row::new(subject, scenario, clients, quick) }
    }

    fn valid(&self) -> bool {
        self.errors == 0
    }
}

pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

/// `12345` → `12,345`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn notes(r: &Row) -> String {
    let mut parts = Vec::new();
    match (r.scenario.as_str(), r.count) {
        ("replay_10k", Some(n)) => parts.push(format!("{} events", thousands(n))),
        ("streams_10k", Some(n)) => parts.push(format!("{} sessions, a stream each", thousands(n))),
        (_, Some(n)) => parts.push(format!("{} sessions", thousands(n))),
        _ => {}
    }
    if let Some(children) = r.children {
        parts.push(format!("{children} stdio children"));
    }
    if let (Some(first), Some(max)) = (r.ms, r.max_ms) {
        let each = r.kills.iter().map(|ms| format!("{ms:.0}")).collect::<Vec<_>>().join(", ");
        parts.push(format!(
            "kill -9 of the engine ×{}: first answered call median {first:.0} ms, max {max:.0} ms ({each})",
            r.kills.len()
        ));
    }
    if let (Some(all), Some(max)) = (r.all_answered_ms, r.all_answered_max_ms) {
        let children = r.children.map_or(String::new(), |c| format!(" {c}"));
        parts.push(format!("every one of the{children} sessions with a child answered: median {all:.0} ms, max {max:.0} ms"));
    }
    if let (Some(rss), Some(bound)) = (r.keeper_rss_bytes, r.keeper_bound_bytes) {
        parts.push(format!("the keeper's RSS under load {:.1} MiB (bound {:.0} MiB)", rss / 1048576.0, bound / 1048576.0));
    }
    if let Some(spread) = &r.spread {
        parts.push(spread.clone());
    }
    if let Some(cpu) = r.cpu_percent {
        parts.push(format!("idle CPU {cpu:.2}% of one core"));
    }
    if let Some(ms) = r.fanout_ms {
        parts.push(format!("fan-out {ms:.0} ms"));
    }
    if let Some(us) = r.server_us_per_call {
        parts.push(format!("server {us:.1} µs CPU/call"));
    }
    if let Some(us) = r.upstream_us_per_call {
        parts.push(format!("upstream {us:.1} µs CPU/call"));
    }
    if let Some(us) = r.client_us_per_call {
        parts.push(format!("load generator {us:.1} µs CPU/call"));
    }
    if let Some(b) = r.store_bytes {
        parts.push(format!("store +{b:.0} B/session"));
    }
    if let Some(b) = r.bytes_per_session {
        parts.push(format!("bytes_per_session {b:.0} (the store)"));
    }
    if let Some(b) = r.children_bytes {
        parts.push(format!("children +{b:.0} B/session"));
    }
    if let Some(b) = r.federated_bytes {
        let children = r.federated_children_bytes.map_or(String::new(), |c| format!(", children +{c:.0} B/session"));
        parts.push(format!("virtual server of 3 stdio members: tether +{b:.0} B/session{children}"));
    }
    if let Some(n) = &r.note {
        parts.push(n.clone());
    }
    if let Some(d) = &r.deviation {
        parts.push(format!("**deviation**: {d}"));
    }
    if r.quick {
        parts.push("quick".into());
    }
    if r.errors > 0 {
        let first_line = r.error.as_deref().unwrap_or("").lines().next().unwrap_or("");
        let short: String = first_line.chars().take(160).collect();
        parts.push(format!("**{} errors**: {}", r.errors, short.replace('|', "\\|")));
    }
    parts.join("; ")
}

/// The Markdown table; a quick run says so above the table and in every row.
pub fn table(rows: &[Row], quick_caption: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(caption) = quick_caption {
        s.push_str(&format!("**Quick run** ({caption}): not the real figures.\n\n"));
    }
    s.push_str("| system | scenario | clients | rps | p50_ms | p99_ms | rss_mib | ms | bytes | notes |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.system,
            r.scenario,
            r.clients,
            cell(r.rps, 1),
            cell(r.p50_ms, 3),
            cell(r.p99_ms, 3),
            cell(r.rss_mib, 1),
            cell(r.ms, 1),
            cell(r.bytes, 0),
            notes(r)
        ));
    }
    s
}

pub(crate) fn find<'a>(rows: &'a [Row], system: &str, scenario: Scenario, clients: Option<usize>) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.system == system && r.scenario == scenario.name() && clients.is_none_or(|c| r.clients == c) && r.valid())
}

/// Table order: by scenario, system and clients; a baseline twin's row
/// right after the current build's.
pub(crate) fn sort(rows: &mut [Row]) {
    rows.sort_by_key(|r| {
        let scenario = Scenario::ALL.iter().position(|s| s.name() == r.scenario).unwrap_or(usize::MAX);
        let name = r.system.strip_suffix(BASELINE_SUFFIX).unwrap_or(&r.system);
        let system = System::ALL.iter().position(|s| s.name() == name).unwrap_or(usize::MAX);
        (scenario, system, r.clients, name.len() < r.system.len())
    });
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A horizontal bar chart of tools_call requests/s at `clients` clients, one bar per system.
pub fn chart(rows: &[Row], clients: usize, quick: bool) -> String {
    let bars: Vec<(&str, f64)> = System::ALL
        .iter()
        .filter_map(|s| find(rows, s.name(), Scenario::ToolsCall, Some(clients)).and_then(|r| r.rps).map(|v| (s.name(), v)))
        .collect();
    let (left, right, top, bar_h, gap) = (130.0, 110.0, 56.0, 26.0, 12.0);
    let plot_w = 520.0;
    let width = left + plot_w + right;
    let height = top + bars.len().max(1) as f64 * (bar_h + gap) + 36.0;
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max);
    let step = nice_step(max / 5.0);
    let axis_max = if step > 0.0 { (max / step).ceil() * step } else { 1.0 };
    let x = |v: f64| left + v / axis_max * plot_w;

    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"13\">\n"
    );
    s.push_str(&format!("<rect width=\"{width}\" height=\"{height}\" fill=\"white\"/>\n"));
    let title =
        format!("tools/call, {clients} clients: requests/s (higher is better){}", if quick { " — quick run" } else { "" });
    s.push_str(&format!("<text x=\"{left}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", escape(&title)));
    s.push_str(&format!(
        "<text x=\"{left}\" y=\"42\" fill=\"#555\">one machine, loopback, same run; every response checked (tether-bench)</text>\n"
    ));
    let bottom = height - 30.0;
    let mut tick = 0.0;
    while step > 0.0 && tick <= axis_max + step / 2.0 {
        let tx = x(tick);
        s.push_str(&format!("<line x1=\"{tx:.1}\" y1=\"{top}\" x2=\"{tx:.1}\" y2=\"{bottom}\" stroke=\"#ddd\"/>\n"));
        s.push_str(&format!(
            "<text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n",
            bottom + 16.0,
            thousands(tick as u64)
        ));
        tick += step;
    }
    for (i, (name, value)) in bars.iter().enumerate() {
        let y = top + i as f64 * (bar_h + gap) + gap / 2.0;
        let colour = if name.starts_with("tether") {
            "#2f6fdf"
        } else if *name == "axum-floor" {
            "#b8b8b8"
        } else {
            "#7a7a7a"
        };
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            left - 8.0,
            y + bar_h / 2.0 + 4.5,
            escape(name)
        ));
        s.push_str(&format!(
            "<rect x=\"{left}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{bar_h}\" fill=\"{colour}\"/>\n",
            (x(*value) - left).max(1.0)
        ));
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            x(*value) + 6.0,
            y + bar_h / 2.0 + 4.5,
            thousands(value.round() as u64)
        ));
    }
    if bars.is_empty() {
        s.push_str(&format!("<text x=\"{left}\" y=\"{:.1}\">no tools_call rows at {clients} clients</text>\n", top + 20.0));
    }
    s.push_str("</svg>\n");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 0.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * power).find(|&s| s >= raw).unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(system: System, rps: f64) -> Row {
        Row { rps: Some(rps), ..Row::new(system, Scenario::ToolsCall, 64, false) }
    }

    #[test]
    fn a_baseline_row_comes_right_after_the_current_one() {
        let twin = |system| Subject { system, baseline: true };
        let mut rows = vec![
            Row::new(twin(System::TetherSqlite), Scenario::ToolsCall, 64, false),
            Row::new(System::Rmcp, Scenario::ToolsCall, 1, false),
            Row::new(twin(System::TetherSqlite), Scenario::ToolsCall, 1, false),
            Row::new(System::TetherSqlite, Scenario::Replay10k, 1, false),
            Row::new(System::TetherSqlite, Scenario::ToolsCall, 64, false),
            Row::new(System::TetherSqlite, Scenario::ToolsCall, 1, false),
        ];
        sort(&mut rows);
        let order: Vec<String> = rows.iter().map(|r| format!("{} {} {}", r.system, r.scenario, r.clients)).collect();
        assert_eq!(
            order,
            [
                "tether-sqlite tools_call 1",
                "tether-sqlite@baseline tools_call 1",
                "tether-sqlite tools_call 64",
                "tether-sqlite@baseline tools_call 64",
                "rmcp tools_call 1",
                "tether-sqlite replay_10k 1",
            ]
        );
    }

    #[test]
    fn chart_has_a_bar_per_measured_system() {
        let svg = chart(&[tools(System::TetherSqlite, 4000.0), tools(System::AxumFloor, 30000.0)], 64, false);
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert!(svg.contains("30,000") && svg.contains("tether-sqlite"));
        assert_eq!(nice_step(3000.0), 5000.0);
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
