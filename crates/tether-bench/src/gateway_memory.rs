//! The `gateway_memory` scenario: tether-gateway's own RSS growth per live
//! command-upstream session and its children's RSS per session, in front of
//! one `stdio_echo` and then serving a virtual server of three `stdio_echo`
//! members, each on a fresh server.

use anyhow::Context;

use crate::Args;
use crate::load;
use crate::report::{Row, round};
use crate::running::{Running, start_federated, start_for};
use crate::scenario::Scenario;
use crate::server::{Programs, Subject, Upstream, settled_rss};

/// Warm-up sessions of gateway_memory (each ended with DELETE before the first RSS reading).
const GATEWAY_WARM_UP: usize = 5;
/// gateway_memory's virtual server: three stdio members (`stdio_echo` each).
const MEMORY_MEMBERS: [&str; 3] = ["s1", "s2", "s3"];

/// One command-upstream session as gateway_memory opens it: `initialize`,
/// `notifications/initialized` and one checked `tools/call` of `thought`
/// (so its child is started and has answered), or through a virtual server
/// one of each member's `thought` (so every member's child is); returns the
/// session id.
async fn live_session(http: &reqwest::Client, url: &str, members: &[&str]) -> Result<String, String> {
    let session = load::open_session(http, url, false).await?;
    // As a client does first (and the virtual server does for its members
    // anyway): the same work on both sides of the memory line.
    load::list_tools(http, url, &session).await.map_err(|e| format!("tools/list: {e}"))?;
    if members.is_empty() {
        load::call_thought(http, url, &session, 1).await.map_err(|e| format!("tools/call: {e}"))?;
    }
    for (id, member) in (1..).zip(members) {
        load::call_member_thought(http, url, &session, id, member, 1).await.map_err(|e| format!("tools/call: {e}"))?;
    }
    Ok(session)
}

/// What gateway_memory read on one server: tether's RSS before and after
/// the live sessions, and its live children and their RSS after them.
struct Memory {
    before: u64,
    after: u64,
    children: usize,
    children_rss: u64,
}

impl Memory {
    /// tether's own RSS growth per live session.
    fn per_session(&self, n: usize) -> f64 {
        (self.after as f64 - self.before as f64) / n as f64
    }
    /// The live children's RSS per live session.
    fn children_per_session(&self, n: usize) -> f64 {
        self.children_rss as f64 / n as f64
    }
}

/// gateway_memory's reading of one started server: warm-up sessions (ended
/// again, so their children stop), RSS, `n` live sessions, 2 s of rest, RSS
/// again; each session must still hold a child per member (one without
/// members).
async fn memory_of(running: Running, n: usize, members: &[&str]) -> anyhow::Result<Memory> {
    let server = &running.server;
    let result = async {
        let http = load::http_client().map_err(anyhow::Error::msg)?;
        let url = server.mcp_url.as_str();
        for i in 0..GATEWAY_WARM_UP {
            let session = live_session(&http, url, members).await.map_err(|e| anyhow::anyhow!("warm-up session {i}: {e}"))?;
            load::delete_session(&http, url, &session).await.map_err(|e| anyhow::anyhow!("warm-up session {i}: {e}"))?;
        }
        let before = settled_rss(server).await?;
        let left = server.live_children()?;
        anyhow::ensure!(left == 0, "{left} children still live after DELETE of the warm-up sessions");
        let mut sessions = Vec::with_capacity(n);
        for i in 0..n {
            sessions.push(live_session(&http, url, members).await.map_err(|e| anyhow::anyhow!("session {i}: {e}"))?);
        }
        let after = settled_rss(server).await?;
        let children = server.live_children()?;
        let children_rss = server.children_rss_bytes()?;
        let want = n * members.len().max(1);
        anyhow::ensure!(children == want, "{children} live children after {n} sessions, want {want}");
        Ok::<_, anyhow::Error>(Memory { before, after, children, children_rss })
    }
    .await;
    if result.is_err() {
        eprintln!("   server log tail:\n{}", server.log_tail());
    }
    running.stop().await?;
    result
}

/// gateway_memory on one fresh tether-gateway in front of `stdio_echo`
/// ([`memory_of`]): `bytes` is tether's own RSS growth per live session,
/// `children_bytes` its children's RSS per session; then the same on a
/// fresh tether-gateway serving a virtual server of three `stdio_echo`
/// members (`federated_bytes`, `federated_children_bytes`).
pub(crate) async fn gateway_memory(args: &Args, programs: &Programs, subject: Subject) -> Row {
    let n = usize::from(args.gateway_sessions);
    eprintln!("== {}: gateway_memory ({n} live command-upstream sessions)", subject.name());
    let mut row = Row::new(subject, Scenario::GatewayMemory, 1, args.quick);
    row.count = Some(n as u64);
    let outcome = async {
        let running = start_for(programs, Scenario::GatewayMemory, subject).await?;
        let single = memory_of(running, n, &[]).await?;
        eprintln!(
            "   RSS {} KiB -> {} KiB: {:.0} bytes per live session; {} live children, {:.0} bytes of theirs per session",
            single.before / 1024,
            single.after / 1024,
            single.per_session(n),
            single.children,
            single.children_per_session(n)
        );
        eprintln!("== {}: gateway_memory, a virtual server of {} stdio members", subject.name(), MEMORY_MEMBERS.len());
        let members: Vec<(&str, Upstream)> =
            MEMORY_MEMBERS.iter().map(|&name| (name, Upstream::Stdio(programs.stdio_echo.clone()))).collect();
        let running = start_federated(programs, subject, &members, None).await.context("the virtual server")?;
        let federated = memory_of(running, n, &MEMORY_MEMBERS).await.context("the virtual server")?;
        eprintln!(
            "   RSS {} KiB -> {} KiB: {:.0} bytes per live session; {} live children, {:.0} bytes of theirs per session",
            federated.before / 1024,
            federated.after / 1024,
            federated.per_session(n),
            federated.children,
            federated.children_per_session(n)
        );
        Ok::<_, anyhow::Error>((single, federated))
    }
    .await;
    match outcome {
        Ok((single, federated)) => {
            row.bytes = Some(round(single.per_session(n), 0));
            row.children_bytes = Some(round(single.children_per_session(n), 0));
            row.federated_bytes = Some(round(federated.per_session(n), 0));
            row.federated_children_bytes = Some(round(federated.children_per_session(n), 0));
            row.rss_mib = Some(round(single.after as f64 / 1048576.0, 1));
            row.note = Some(format!(
                "{} live children; RSS {} -> {} KiB; the virtual server: {} live children, RSS {} -> {} KiB",
                single.children,
                single.before / 1024,
                single.after / 1024,
                federated.children,
                federated.before / 1024,
                federated.after / 1024
            ));
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}
