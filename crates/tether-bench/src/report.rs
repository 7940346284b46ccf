//! What a bench run produces: the rows (JSON), the Markdown table, the
//! budget check of the server, of the gateway's and of its virtual
//! servers' (ratios measured in the same run) and an SVG bar chart of
//! `tools_call` throughput at 64 clients.

use serde::Serialize;

use crate::server::{Subject, System};

/// The scenarios, in table order (`--scenarios` takes these names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    #[value(name = "tools_call")]
    ToolsCall,
    #[value(name = "replay_10k")]
    Replay10k,
    #[value(name = "restart_100k_sessions")]
    Restart100kSessions,
    /// The restart with 1,000,000 stored sessions (`--million-sessions`), and the store's bytes per session.
    #[value(name = "restart_1m_sessions")]
    Restart1mSessions,
    #[value(name = "idle_session")]
    IdleSession,
    /// tools_call's load through tether-gateway to `rmcp_ref`, and to `rmcp_ref` directly.
    #[value(name = "gateway_http")]
    GatewayHttp,
    /// tools_call's load to `stdio_echo` through tether-gateway, supergateway and mcp-proxy.
    #[value(name = "gateway_stdio")]
    GatewayStdio,
    /// tether-gateway's RSS growth per live command-upstream session (a
    /// `stdio_echo` child each), and per live session of a virtual server of
    /// three `stdio_echo` members (three children each).
    #[value(name = "gateway_memory")]
    GatewayMemory,
    /// tools_call's load through a virtual server of tether-gateway (two
    /// `stdio_echo` members, one `rmcp_ref`), each client calling the
    /// members' `thought` in turn.
    #[value(name = "gateway_federated")]
    GatewayFederated,
    /// tools_call's load over the 2026-07-28 wire (tether-sqlite-modern) beside the session era's (tether-sqlite).
    #[value(name = "tools_call_modern")]
    ToolsCallModern,
    /// 10,000 sessions with an open standalone stream each on one tether-sqlite: RSS, idle CPU, fan-out time.
    #[value(name = "streams_10k")]
    Streams10k,
    /// tools_call's load with a bearer token per client: static tokens
    /// (tether-sqlite-token) beside JWT access tokens of a real
    /// authorization server (tether-sqlite-oauth).
    #[value(name = "tools_call_oauth")]
    ToolsCallOauth,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::ToolsCall,
        Scenario::Replay10k,
        Scenario::Restart100kSessions,
        Scenario::Restart1mSessions,
        Scenario::IdleSession,
        Scenario::GatewayHttp,
        Scenario::GatewayStdio,
        Scenario::GatewayMemory,
        Scenario::GatewayFederated,
        Scenario::ToolsCallModern,
        Scenario::Streams10k,
        Scenario::ToolsCallOauth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::ToolsCall => "tools_call",
            Scenario::Replay10k => "replay_10k",
            Scenario::Restart100kSessions => "restart_100k_sessions",
            Scenario::Restart1mSessions => "restart_1m_sessions",
            Scenario::IdleSession => "idle_session",
            Scenario::GatewayHttp => "gateway_http",
            Scenario::GatewayStdio => "gateway_stdio",
            Scenario::GatewayMemory => "gateway_memory",
            Scenario::GatewayFederated => "gateway_federated",
            Scenario::ToolsCallModern => "tools_call_modern",
            Scenario::Streams10k => "streams_10k",
            Scenario::ToolsCallOauth => "tools_call_oauth",
        }
    }

    /// Whether `system` is one of this scenario's systems.
    pub fn runs(self, system: System) -> bool {
        match self {
            Scenario::ToolsCall => !system.gateway() && !system.variant(),
            Scenario::Replay10k | Scenario::IdleSession => !system.gateway() && !system.variant() && system != System::AxumFloor,
            Scenario::Restart100kSessions => system.durable_sessions(),
            Scenario::Restart1mSessions => {
                matches!(system, System::TetherSqlite | System::TetherRedis | System::TetherRedisCluster)
            }
            Scenario::GatewayHttp => matches!(system, System::TetherGateway | System::RmcpDirect),
            Scenario::GatewayStdio => matches!(system, System::TetherGateway | System::Supergateway | System::McpProxy),
            Scenario::GatewayMemory | Scenario::GatewayFederated => system == System::TetherGateway,
            Scenario::ToolsCallModern => matches!(system, System::TetherSqlite | System::TetherSqliteModern),
            Scenario::Streams10k => system == System::TetherSqlite,
            Scenario::ToolsCallOauth => matches!(system, System::TetherSqliteToken | System::TetherSqliteOauth),
        }
    }

    /// Sessions the budget's line of a session scenario is for.
    pub fn budget_sessions(self) -> u64 {
        if self == Scenario::Restart1mSessions { MILLION_SESSIONS } else { BUDGET_SESSIONS }
    }

    /// Whether its rows come from interleaved rounds of the tools_call load.
    pub fn interleaved(self) -> bool {
        matches!(
            self,
            Scenario::ToolsCall
                | Scenario::GatewayHttp
                | Scenario::GatewayStdio
                | Scenario::GatewayFederated
                | Scenario::ToolsCallModern
                | Scenario::ToolsCallOauth
        )
    }
}

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
            children_bytes: None,
            federated_bytes: None,
            federated_children_bytes: None,
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

fn find<'a>(rows: &'a [Row], system: &str, scenario: Scenario, clients: Option<usize>) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.system == system && r.scenario == scenario.name() && clients.is_none_or(|c| r.clients == c) && r.valid())
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// `a`'s requests/s over `b`'s round by round, when both ran the same
/// rounds: each pair ran minutes apart at most, so the host's drift (tens of
/// percent within minutes on a shared VM) cancels out of each ratio, which a
/// ratio of two separately taken medians does not do.
fn paired_ratios(a: &Row, b: &Row) -> Option<Vec<f64>> {
    let usable = |r: &Row| r.rounds_rps.len() > 1 && r.rounds_rps.iter().all(|&v| v > 0.0);
    (usable(a) && usable(b) && a.rounds_rps.len() == b.rounds_rps.len())
        .then(|| a.rounds_rps.iter().zip(&b.rounds_rps).map(|(x, y)| x / y).collect())
}

/// `a`'s requests/s over `b`'s, and its text: the median of the paired
/// rounds' ratios when both ran the same rounds, with the ratio of the two
/// median rounds beside it; else the ratio of the two rows.
pub fn rps_ratio(a: &Row, b: &Row) -> Option<(String, f64)> {
    let (x, y) = a.rps.zip(b.rps).filter(|&(_, y)| y > 0.0)?;
    let of_medians = format!("{:.2}x ({x:.0} / {y:.0} rps)", x / y);
    Some(match paired_ratios(a, b) {
        Some(mut ratios) => {
            let listed = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
            let paired = median(&mut ratios).unwrap_or(0.0);
            (format!("{paired:.2}x (median of {} paired rounds: {listed}); median rounds {of_medians}", ratios.len()), paired)
        }
        None => (of_medians, x / y),
    })
}

/// Sessions the budget's restart and idle lines are measured with.
const BUDGET_SESSIONS: u64 = 100_000;
/// Sessions of the budget's `restart_1m_sessions` lines.
const MILLION_SESSIONS: u64 = 1_000_000;

/// A budget ratio line: `a`'s requests/s >= `target` times `b`'s.
fn ratio_line(line: &str, a: Option<&Row>, b: Option<&Row>, target: f64) -> String {
    let judged = a.zip(b).and_then(|(a, b)| rps_ratio(a, b)).map(|(text, ratio)| (text, ratio >= target));
    let (measured, verdict) = match judged {
        Some((text, true)) => (text, "yes"),
        Some((text, false)) => (text, "**no**"),
        None => ("not measured".to_string(), "—"),
    };
    format!("| {line} | {measured} | >= {target}x | {verdict} |\n")
}

/// The gateway budget's gateway_stdio line: tether-gateway's requests/s >= 3 times
/// the faster of supergateway and mcp-proxy (the one tether-gateway's paired
/// ratio is the lowest against), with a lower p99 than that one. Both are
/// reported; a reference that did not run is named.
fn gateway_stdio_line(rows: &[Row]) -> String {
    const TARGET: f64 = 3.0;
    let at_64 = |system: &str| find(rows, system, Scenario::GatewayStdio, Some(64));
    let line = "tether-gateway gateway_stdio (64 clients) >= 3x the faster of supergateway and mcp-proxy, with a lower p99";
    let target = format!(">= {TARGET}x, lower p99");
    let Some(gateway) = at_64("tether-gateway") else {
        return format!("| {line} | not measured | {target} | — |\n");
    };
    let mut parts = Vec::new();
    // (ratio, p99 lower, name) against each reference measured
    let mut against: Vec<(f64, bool, &str)> = Vec::new();
    for other in ["supergateway", "mcp-proxy"] {
        match at_64(other).and_then(|row| Some((row, rps_ratio(gateway, row)?))) {
            Some((row, (text, ratio))) => {
                let (ours, theirs) = (gateway.p99_ms.unwrap_or(f64::INFINITY), row.p99_ms.unwrap_or(f64::INFINITY));
                parts.push(format!("vs {other}: {text}; p99 {ours:.3} / {theirs:.3} ms"));
                against.push((ratio, ours < theirs, other));
            }
            None => parts.push(format!("vs {other}: not measured")),
        }
    }
    let faster = against.iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let verdict = match faster {
        Some(&(ratio, lower_p99, name)) => {
            parts.push(format!("the faster: {name}"));
            if ratio >= TARGET && lower_p99 { "yes" } else { "**no**" }
        }
        None => "—",
    };
    format!("| {line} | {} | {target} | {verdict} |\n", parts.join("; "))
}

/// A streams_10k budget line: what, its figure, unit, limit.
type StreamsLine = (&'static str, fn(&Row) -> Option<f64>, &'static str, f64);

/// The streams_10k budget lines: with 10,000 idle streams open, the
/// server's RSS and idle CPU, then the fan-out of one notification to all.
/// A run with fewer streams is shown, not judged.
fn streams_lines(rows: &[Row]) -> String {
    const STREAMS: u64 = 10_000;
    let row = find(rows, "tether-sqlite", Scenario::Streams10k, None);
    let mut s = String::new();
    let lines: [StreamsLine; 3] = [
        ("RSS", |r| r.rss_mib, "MiB", 200.0),
        ("idle CPU", |r| r.cpu_percent, "% of one core", 5.0),
        ("fan-out to every stream", |r| r.fanout_ms, "ms", 2000.0),
    ];
    for (what, figure, unit, limit) in lines {
        let (text, met) = match row.and_then(|r| Some((r.count.unwrap_or(0), figure(r)?))) {
            Some((n, v)) if n < STREAMS => (format!("{v:.1} {unit} with {n} streams"), "— (the budget is for 10,000 streams)"),
            Some((_, v)) => (format!("{v:.1} {unit}"), if v <= limit { "yes" } else { "**no**" }),
            None => ("not measured".to_string(), "—"),
        };
        s.push_str(&format!("| tether-sqlite streams_10k {what} | {text} | <= {limit} {unit} | {met} |\n"));
    }
    s
}

/// The gateway budget's memory line: tether's RSS growth per live command-upstream
/// session, its children not counted.
fn gateway_memory_line(rows: &[Row]) -> String {
    const LIMIT_MIB: f64 = 2.0;
    let (text, met) = match find(rows, "tether-gateway", Scenario::GatewayMemory, None).and_then(|r| r.bytes) {
        Some(b) => (
            format!("{:.1} KiB per session ({b:.0} bytes)", b / 1024.0),
            if b <= LIMIT_MIB * 1048576.0 { "yes" } else { "**no**" },
        ),
        None => ("not measured".to_string(), "—"),
    };
    format!("| tether-gateway gateway_memory | {text} | <= {LIMIT_MIB} MiB per session | {met} |\n")
}

/// The rate a client gets calling the gateway's single-upstream endpoints
/// in gateway_federated's proportion (two stdio calls to one HTTP call):
/// the weighted harmonic mean of their requests/s.
pub fn federated_mix(stdio_rps: f64, http_rps: f64) -> f64 {
    3.0 / (2.0 / stdio_rps + 1.0 / http_rps)
}

/// The virtual servers' throughput line: tether-gateway's gateway_federated
/// requests/s at 64 clients >= 0.9 times the mix ([`federated_mix`]) of its
/// gateway_stdio and gateway_http rows of the same run. Judged like the
/// ratio lines: the median of the rounds' ratios (each round's federated
/// slice over the mix of the same round's two single-upstream slices) when
/// the three ran the same rounds, with the ratio of the median rounds beside it.
fn gateway_federated_line(rows: &[Row]) -> String {
    const TARGET: f64 = 0.9;
    let line = "tether-gateway gateway_federated (64 clients) >= 0.9x the gateway_stdio/gateway_http mix";
    let row = |scenario| find(rows, "tether-gateway", scenario, Some(64)).filter(|r| r.rps.is_some_and(|v| v > 0.0));
    let judged = match (row(Scenario::GatewayFederated), row(Scenario::GatewayStdio), row(Scenario::GatewayHttp)) {
        (Some(federated), Some(stdio), Some(http)) => {
            let (f, s, h) = (federated.rps.unwrap_or(0.0), stdio.rps.unwrap_or(0.0), http.rps.unwrap_or(0.0));
            let mix = federated_mix(s, h);
            let of_medians = format!("{:.2}x ({f:.0} / {mix:.0} rps; mix = 3 / (2 / {s:.0} stdio + 1 / {h:.0} http))", f / mix);
            let rounds = [&federated.rounds_rps, &stdio.rounds_rps, &http.rounds_rps];
            let paired =
                rounds.iter().all(|r| r.len() > 1 && r.len() == federated.rounds_rps.len() && r.iter().all(|&v| v > 0.0));
            Some(if paired {
                let mut ratios: Vec<f64> = (0..federated.rounds_rps.len())
                    .map(|i| federated.rounds_rps[i] / federated_mix(stdio.rounds_rps[i], http.rounds_rps[i]))
                    .collect();
                let listed = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
                let ratio = median(&mut ratios).unwrap_or(0.0);
                (format!("{ratio:.2}x (median of {} paired rounds: {listed}); median rounds {of_medians}", ratios.len()), ratio)
            } else {
                (of_medians, f / mix)
            })
        }
        _ => None,
    };
    let (text, met) = match judged {
        Some((text, ratio)) => (text, if ratio >= TARGET { "yes" } else { "**no**" }),
        None => ("not measured".to_string(), "—"),
    };
    format!("| {line} | {text} | >= {TARGET}x | {met} |\n")
}

/// The virtual servers' memory line: RSS per live session of a virtual
/// server of three stdio members (tether's growth plus its children's RSS)
/// at most 3 times that of gateway_memory's single stdio upstream, both
/// from the gateway_memory row. tether's own ratio is shown beside it.
fn gateway_federated_memory_line(rows: &[Row]) -> String {
    const LIMIT: f64 = 3.0;
    let line = "tether-gateway gateway_federated memory per session <= 3x one member's";
    let figures = find(rows, "tether-gateway", Scenario::GatewayMemory, None)
        .and_then(|r| Some((r.bytes?, r.children_bytes?, r.federated_bytes?, r.federated_children_bytes?)));
    let kib = |b: f64| b / 1024.0;
    let (text, met) = match figures {
        Some((one, one_children, three, three_children)) if one + one_children > 0.0 => {
            let (single, federated) = (one + one_children, three + three_children);
            let ratio = federated / single;
            let alone = if one > 0.0 { format!("{:.2}x", three / one) } else { "—".into() };
            (
                format!(
                    "{ratio:.2}x ({:.1} / {:.1} KiB per live session, tether + its children; tether alone {alone}: {:.1} / {:.1} KiB)",
                    kib(federated),
                    kib(single),
                    kib(three),
                    kib(one)
                ),
                if ratio <= LIMIT { "yes" } else { "**no**" },
            )
        }
        _ => ("not measured".to_string(), "—"),
    };
    format!("| {line} | {text} | <= {LIMIT}x | {met} |\n")
}

/// The budget of the server and the gateway, each line with what this run measured. A
/// ratio line is judged by the median of the paired rounds' ratios when the
/// run had rounds, and shows the ratio of the two median rounds beside it.
pub fn budget(rows: &[Row]) -> String {
    let mut s = String::from("| budget line | measured | target | met |\n|---|---|---|---|\n");
    let tools_call = |system: &str| find(rows, system, Scenario::ToolsCall, Some(64));
    let sqlite = tools_call("tether-sqlite");
    for (line, other, target) in [
        ("tether-sqlite tools_call (64 clients) >= rmcp", "rmcp", 1.0),
        ("tether-sqlite tools_call (64 clients) >= 5x ts-sdk", "ts-sdk", 5.0),
        ("tether-sqlite tools_call (64 clients) >= 0.5x axum-floor", "axum-floor", 0.5),
        ("tether-sqlite tools_call (64 clients) >= 0.8x tether-memory", "tether-memory", 0.8),
    ] {
        s.push_str(&ratio_line(line, sqlite, tools_call(other), target));
    }
    let gateway_http = |system: &str| find(rows, system, Scenario::GatewayHttp, Some(64));
    s.push_str(&ratio_line(
        "tether-gateway gateway_http (64 clients) >= 0.6x rmcp-direct",
        gateway_http("tether-gateway"),
        gateway_http("rmcp-direct"),
        0.6,
    ));
    let modern = |system: &str| find(rows, system, Scenario::ToolsCallModern, Some(64));
    s.push_str(&ratio_line(
        "tether-sqlite-modern tools_call_modern (64 clients) >= 0.9x tether-sqlite (session era, same rounds)",
        modern("tether-sqlite-modern"),
        modern("tether-sqlite"),
        0.9,
    ));
    let oauth = |system: &str| find(rows, system, Scenario::ToolsCallOauth, Some(64));
    s.push_str(&ratio_line(
        "tether-sqlite-oauth tools_call_oauth (64 clients) >= 0.95x tether-sqlite-token (same rounds)",
        oauth("tether-sqlite-oauth"),
        oauth("tether-sqlite-token"),
        0.95,
    ));
    let tools_call = |system: &str| find(rows, system, Scenario::ToolsCall, Some(64));
    s.push_str(&ratio_line(
        "tether-redis tools_call (64 clients) >= 0.8x tether-sqlite",
        tools_call("tether-redis"),
        tools_call("tether-sqlite"),
        0.8,
    ));
    s.push_str(&streams_lines(rows));
    s.push_str(&gateway_stdio_line(rows));
    s.push_str(&gateway_memory_line(rows));
    s.push_str(&gateway_federated_line(rows));
    s.push_str(&gateway_federated_memory_line(rows));
    for system in ["tether-memory", "tether-sqlite", "tether-redis"] {
        let line = |scenario: Scenario, figure: fn(&Row) -> Option<f64>, unit: &str, limit: f64| {
            let (text, met) = match find(rows, system, scenario, None).and_then(|r| Some((r.count, figure(r)?))) {
                // The budget's restart and idle lines are for 100,000 sessions; fewer
                // (a --quick run) leave a fixed overhead spread over too few.
                Some((Some(sessions), v)) if scenario != Scenario::Replay10k && sessions < scenario.budget_sessions() => {
                    let budget = scenario.budget_sessions();
                    (
                        format!("{v:.1} {unit} with {sessions} sessions"),
                        if budget == MILLION_SESSIONS {
                            "— (the budget is for 1,000,000 sessions)"
                        } else {
                            "— (the budget is for 100,000 sessions)"
                        },
                    )
                }
                Some((_, v)) => (format!("{v:.1} {unit}"), if v <= limit { "yes" } else { "**no**" }),
                None => ("not measured".to_string(), "—"),
            };
            format!("| {system} {} | {text} | <= {limit} {unit} | {met} |\n", scenario.name())
        };
        // Redis's replay line is the tighter 30 ms.
        let replay_limit = if system == "tether-redis" { 30.0 } else { 50.0 };
        s.push_str(&line(Scenario::Replay10k, |r| r.ms, "ms", replay_limit));
        if system != "tether-memory" {
            s.push_str(&line(Scenario::Restart100kSessions, |r| r.ms, "ms", 500.0));
            s.push_str(&line(Scenario::Restart1mSessions, |r| r.ms, "ms", 500.0));
        }
        s.push_str(&line(Scenario::IdleSession, |r| r.bytes, "bytes", 1024.0));
    }
    s
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
    fn budget_ratios_and_verdicts() {
        let rows = vec![
            tools(System::TetherSqlite, 4000.0),
            tools(System::TetherMemory, 16000.0),
            tools(System::Rmcp, 2000.0),
            Row { ms: Some(12.0), ..Row::new(System::TetherSqlite, Scenario::Replay10k, 1, false) },
        ];
        let b = budget(&rows);
        assert!(b.contains("| tether-sqlite tools_call (64 clients) >= rmcp | 2.00x (4000 / 2000 rps) | >= 1x | yes |"), "{b}");
        assert!(b.contains(">= 0.8x tether-memory | 0.25x (4000 / 16000 rps) | >= 0.8x | **no** |"), "{b}");
        assert!(b.contains("ts-sdk | not measured"), "{b}");
        assert!(b.contains("| tether-sqlite replay_10k | 12.0 ms | <= 50 ms | yes |"), "{b}");
    }

    #[test]
    fn restart_and_idle_with_fewer_sessions_than_the_budget_are_shown_but_not_judged() {
        let idle = |system, count, bytes| Row {
            bytes: Some(bytes),
            count: Some(count),
            ..Row::new(system, Scenario::IdleSession, 64, count < 100_000)
        };
        let rows = vec![idle(System::TetherSqlite, 10_000, 3880.0), idle(System::TetherMemory, 100_000, 2000.0)];
        let b = budget(&rows);
        assert!(
            b.contains("| tether-sqlite idle_session | 3880.0 bytes with 10000 sessions | <= 1024 bytes | — (the budget is for 100,000 sessions) |"),
            "{b}"
        );
        assert!(b.contains("| tether-memory idle_session | 2000.0 bytes | <= 1024 bytes | **no** |"), "{b}");
    }

    #[test]
    fn a_ratio_over_rounds_is_the_median_of_each_rounds_ratio() {
        // The host slowed down in round 2 for memory and in round 3 for
        // sqlite: the medians' ratio (800 / 1000) says no, each round says yes.
        let with_rounds = |system, rounds: &[f64], median| Row { rounds_rps: rounds.to_vec(), ..tools(system, median) };
        let rows = vec![
            with_rounds(System::TetherSqlite, &[900.0, 800.0, 500.0], 800.0),
            with_rounds(System::TetherMemory, &[1000.0, 600.0, 1100.0], 1000.0),
            with_rounds(System::Rmcp, &[1000.0, 1000.0], 1000.0),
        ];
        let b = budget(&rows);
        assert!(
            b.contains(">= 0.8x tether-memory | 0.90x (median of 3 paired rounds: 0.90, 1.33, 0.45); median rounds 0.80x (800 / 1000 rps) | >= 0.8x | yes |"),
            "{b}"
        );
        // Rounds that do not pair up fall back to the median rounds.
        assert!(b.contains(">= rmcp | 0.80x (800 / 1000 rps) | >= 1x | **no** |"), "{b}");
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn the_gateway_lines_judge_tether_gateway_against_rmcp_direct_and_the_faster_stdio_gateway() {
        let at_64 =
            |system, scenario, rps, p99| Row { rps: Some(rps), p99_ms: Some(p99), ..Row::new(system, scenario, 64, false) };
        let rows = vec![
            at_64(System::TetherGateway, Scenario::GatewayHttp, 700.0, 5.0),
            at_64(System::RmcpDirect, Scenario::GatewayHttp, 1000.0, 4.0),
            at_64(System::TetherGateway, Scenario::GatewayStdio, 3000.0, 9.0),
            at_64(System::Supergateway, Scenario::GatewayStdio, 900.0, 8.0),
            at_64(System::McpProxy, Scenario::GatewayStdio, 100.0, 200.0),
        ];
        let b = budget(&rows);
        assert!(
            b.contains(
                "| tether-gateway gateway_http (64 clients) >= 0.6x rmcp-direct | 0.70x (700 / 1000 rps) | >= 0.6x | yes |"
            ),
            "{b}"
        );
        // 3.33x the faster one (supergateway), but its p99 is not lower: not met.
        assert!(
            b.contains("| vs supergateway: 3.33x (3000 / 900 rps); p99 9.000 / 8.000 ms; vs mcp-proxy: 30.00x (3000 / 100 rps); p99 9.000 / 200.000 ms; the faster: supergateway | >= 3x, lower p99 | **no** |"),
            "{b}"
        );
        // Without supergateway, mcp-proxy is the faster one; the missing one is named.
        let b = budget(&[rows[2].clone(), rows[4].clone()]);
        assert!(b.contains("vs supergateway: not measured; vs mcp-proxy: 30.00x (3000 / 100 rps); p99 9.000 / 200.000 ms; the faster: mcp-proxy | >= 3x, lower p99 | yes |"), "{b}");
        assert!(
            b.contains("| tether-gateway gateway_http (64 clients) >= 0.6x rmcp-direct | not measured | >= 0.6x | — |"),
            "{b}"
        );
        assert!(Scenario::GatewayStdio.runs(System::McpProxy) && !Scenario::GatewayHttp.runs(System::McpProxy));
        assert!(!Scenario::ToolsCall.runs(System::TetherGateway) && !Scenario::IdleSession.runs(System::RmcpDirect));
    }

    #[test]
    fn the_gateway_memory_line_is_judged_per_live_session_against_2_mib() {
        let memory = |bytes| Row {
            bytes: Some(bytes),
            count: Some(60),
            ..Row::new(System::TetherGateway, Scenario::GatewayMemory, 1, true)
        };
        let b = budget(&[memory(37_888.0)]);
        assert!(
            b.contains("| tether-gateway gateway_memory | 37.0 KiB per session (37888 bytes) | <= 2 MiB per session | yes |"),
            "{b}"
        );
        let b = budget(&[memory(3.0 * 1048576.0)]);
        assert!(
            b.contains(
                "| tether-gateway gateway_memory | 3072.0 KiB per session (3145728 bytes) | <= 2 MiB per session | **no** |"
            ),
            "{b}"
        );
        assert!(budget(&[]).contains("| tether-gateway gateway_memory | not measured | <= 2 MiB per session | — |"));
        assert!(Scenario::GatewayMemory.runs(System::TetherGateway) && !Scenario::GatewayMemory.runs(System::TetherSqlite));
        assert!(!Scenario::GatewayMemory.interleaved());
    }

    #[test]
    fn the_federated_line_judges_the_virtual_server_against_the_mix_of_the_single_upstream_endpoints() {
        let at_64 = |scenario, rps| Row { rps: Some(rps), ..Row::new(System::TetherGateway, scenario, 64, false) };
        // The mix of 3000 (stdio) and 1500 (http) rps, 2:1: 3 / (2/3000 + 1/1500) = 2250 rps.
        assert_eq!(federated_mix(3000.0, 1500.0), 2250.0);
        let rows = vec![
            at_64(Scenario::GatewayStdio, 3000.0),
            at_64(Scenario::GatewayHttp, 1500.0),
            at_64(Scenario::GatewayFederated, 2100.0),
            Row { rps: Some(100.0), ..Row::new(System::TetherGateway, Scenario::GatewayFederated, 1, false) },
        ];
        let b = budget(&rows);
        assert!(
            b.contains("| tether-gateway gateway_federated (64 clients) >= 0.9x the gateway_stdio/gateway_http mix | 0.93x (2100 / 2250 rps; mix = 3 / (2 / 3000 stdio + 1 / 1500 http)) | >= 0.9x | yes |"),
            "{b}"
        );
        let slow = vec![rows[0].clone(), rows[1].clone(), at_64(Scenario::GatewayFederated, 1800.0)];
        assert!(
            budget(&slow).contains("| 0.80x (1800 / 2250 rps; mix = 3 / (2 / 3000 stdio + 1 / 1500 http)) | >= 0.9x | **no** |")
        );
        // Either single-upstream row missing (or failed): not measured.
        let failed = Row::failed(System::TetherGateway, Scenario::GatewayHttp, 64, false, "down".into());
        for rows in [vec![rows[0].clone(), rows[2].clone()], vec![rows[0].clone(), failed, rows[2].clone()]] {
            assert!(
                budget(&rows).contains(
                    "| tether-gateway gateway_federated (64 clients) >= 0.9x the gateway_stdio/gateway_http mix | not measured | >= 0.9x | — |"
                ),
                "{}",
                budget(&rows)
            );
        }
        assert!(Scenario::GatewayFederated.runs(System::TetherGateway) && !Scenario::GatewayFederated.runs(System::RmcpDirect));
        assert!(Scenario::GatewayFederated.interleaved());
    }

    #[test]
    fn the_federated_line_over_shared_rounds_is_the_median_of_each_rounds_ratio_to_that_rounds_mix() {
        // Round 2 was slow for everyone: its ratio is still 1.
        let rounds = |scenario, rps: &[f64], median| Row {
            rps: Some(median),
            rounds_rps: rps.to_vec(),
            ..Row::new(System::TetherGateway, scenario, 64, false)
        };
        let rows = vec![
            rounds(Scenario::GatewayStdio, &[3000.0, 1500.0, 3000.0], 3000.0),
            rounds(Scenario::GatewayHttp, &[1500.0, 750.0, 1500.0], 1500.0),
            // Mixes 2250, 1125, 2250: ratios 0.80, 1.00, 0.96.
            rounds(Scenario::GatewayFederated, &[1800.0, 1125.0, 2160.0], 1800.0),
        ];
        let b = budget(&rows);
        assert!(
            b.contains("| 0.96x (median of 3 paired rounds: 0.80, 1.00, 0.96); median rounds 0.80x (1800 / 2250 rps; mix = 3 / (2 / 3000 stdio + 1 / 1500 http)) | >= 0.9x | yes |"),
            "{b}"
        );
        // Rounds that do not pair up fall back to the median rounds.
        let mut unpaired = rows.clone();
        unpaired[1].rounds_rps.pop();
        assert!(
            budget(&unpaired)
                .contains("| 0.80x (1800 / 2250 rps; mix = 3 / (2 / 3000 stdio + 1 / 1500 http)) | >= 0.9x | **no** |")
        );
    }

    #[test]
    fn the_federated_memory_line_counts_tether_and_its_children_against_one_member() {
        let memory = |one: f64, three: f64| Row {
            bytes: Some(40_960.0),
            children_bytes: Some(one),
            federated_bytes: Some(61_440.0),
            federated_children_bytes: Some(three),
            count: Some(60),
            ..Row::new(System::TetherGateway, Scenario::GatewayMemory, 1, false)
        };
        // (60 + 5940) / (40 + 2008) KiB: 2.93x; tether alone 60 / 40 KiB.
        let b = budget(&[memory(2_056_192.0, 6_082_560.0)]);
        assert!(
            b.contains("| tether-gateway gateway_federated memory per session <= 3x one member's | 2.93x (6000.0 / 2048.0 KiB per live session, tether + its children; tether alone 1.50x: 60.0 / 40.0 KiB) | <= 3x | yes |"),
            "{b}"
        );
        // The gateway_memory line still judges tether's own bytes.
        assert!(b.contains("| tether-gateway gateway_memory | 40.0 KiB per session (40960 bytes) |"), "{b}");
        let b = budget(&[memory(2_056_192.0, 6_500_000.0)]);
        assert!(b.contains("| 3.13x (6407.7 / 2048.0 KiB per live session"), "{b}");
        assert!(b.contains("| <= 3x | **no** |"), "{b}");
        // Without the virtual server's figures (or without gateway_memory): not measured.
        let single = Row { federated_bytes: None, federated_children_bytes: None, ..memory(2_056_192.0, 0.0) };
        for rows in [vec![single], vec![]] {
            assert!(budget(&rows).contains(
                "| tether-gateway gateway_federated memory per session <= 3x one member's | not measured | <= 3x | — |"
            ));
        }
        let notes = table(&[memory(2_056_192.0, 6_082_560.0)], None);
        assert!(
            notes.contains("60 sessions; children +2056192 B/session; virtual server of 3 stdio members: tether +61440 B/session, children +6082560 B/session"),
            "{notes}"
        );
    }

    #[test]
    fn the_streams_lines_judge_10000_streams_and_only_show_fewer() {
        let streams = |n, rss| Row {
            rss_mib: Some(rss),
            cpu_percent: Some(1.5),
            fanout_ms: Some(2500.0),
            count: Some(n),
            ..Row::new(System::TetherSqlite, Scenario::Streams10k, n as usize, true)
        };
        let b = budget(&[streams(10_000, 150.0)]);
        assert!(b.contains("| tether-sqlite streams_10k RSS | 150.0 MiB | <= 200 MiB | yes |"), "{b}");
        assert!(b.contains("| tether-sqlite streams_10k idle CPU | 1.5 % of one core | <= 5 % of one core | yes |"), "{b}");
        assert!(b.contains("| tether-sqlite streams_10k fan-out to every stream | 2500.0 ms | <= 2000 ms | **no** |"), "{b}");
        let b = budget(&[streams(100, 150.0)]);
        assert!(b.contains("150.0 MiB with 100 streams | <= 200 MiB | — (the budget is for 10,000 streams) |"), "{b}");
        assert!(Scenario::Streams10k.runs(System::TetherSqlite) && !Scenario::Streams10k.runs(System::TetherMemory));
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
