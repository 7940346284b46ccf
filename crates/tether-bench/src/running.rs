//! A system as a scenario runs it ([`Running`]): started on a fresh store
//! with what the scenario puts around it (tether-gateway's `rmcp_ref` or
//! `stdio_echo` upstream, the config file of its virtual server,
//! tools_call_oauth's bearer tokens and authorization server), and stopped
//! with all of it.

use std::os::unix::fs::OpenOptionsExt;

use anyhow::Context;

use crate::auth;
use crate::load;
use crate::scenario::Scenario;
use crate::server::{self, Launch, Programs, Server, Store, Subject, System, Upstream};

/// Starts `system` on a fresh store (or none).
pub(crate) async fn start(programs: &Programs, launch: &Launch) -> anyhow::Result<(Server, Option<Store>)> {
    let store = Store::fresh(launch.subject.system, programs)?;
    let server = Server::start(launch, programs, store.as_ref()).await?;
    Ok((server, store))
}

/// A system as a scenario runs it, with what it needs around it.
pub(crate) struct Running {
    pub(crate) server: Server,
    /// Its store (removed when this is dropped).
    _store: Option<Store>,
    /// tether-gateway in gateway_http and gateway_federated, relay-floor,
    /// agentgateway in gateway_http: the `rmcp_ref` it fronts.
    upstream: Option<Server>,
    /// tether-gateway with a virtual server: the dir of its config file
    /// (tether-sqlite-token: of its token file).
    _config: Option<tempfile::TempDir>,
    /// tools_call_oauth: the bearer tokens its clients send.
    pub(crate) tokens: Vec<String>,
    /// tether-sqlite-oauth: the authorization server (stopped with it).
    _issuer: Option<auth::Issuer>,
}

impl Running {
    /// The processes of what the server fronts, for their CPU per call: the
    /// `rmcp_ref` it forwards to, and every process under the server but
    /// those in `counted` (the server's own: with a keeper, the engine; for
    /// tether-gateway-stdio-relay, its relays): its stdio servers.
    pub(crate) fn upstream_processes(&self, counted: &[u32]) -> Vec<u32> {
        let mut pids = self.upstream.as_ref().map(|u| u.processes().unwrap_or_else(|_| vec![u.pid()])).unwrap_or_default();
        pids.extend(self.server.descendants().unwrap_or_default().into_iter().filter(|pid| !counted.contains(pid)));
        pids
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let stopped = self.server.stop().await;
        if let Some(upstream) = self.upstream {
            upstream.stop().await.context("its upstream rmcp_ref")?;
        }
        stopped
    }
}

/// An `rmcp_ref` for tether-gateway to front (gateway_http, gateway_federated).
async fn rmcp_upstream(programs: &Programs) -> anyhow::Result<Server> {
    Server::start(&Launch::new(System::RmcpDirect.into()), programs, None).await.context("the rmcp_ref upstream of a gateway")
}

/// Starts `subject` as `scenario` runs it: for tools_call as it is; for
/// gateway_http tether-gateway, relay-floor and agentgateway each in front of an `rmcp_ref`
/// of its own (started first) and rmcp-direct as that `rmcp_ref`; for gateway_stdio each system
/// serving `stdio_echo`; for gateway_federated tether-gateway serving the
/// virtual server of two `stdio_echo` members and an `rmcp_ref` of its own
/// ([`load::FEDERATED_MEMBERS`]).
pub(crate) async fn start_for(programs: &Programs, scenario: Scenario, subject: Subject) -> anyhow::Result<Running> {
    let mut launch = Launch::new(subject);
    let mut upstream = None;
    match (scenario, subject.system) {
        (Scenario::GatewayHttp, System::TetherGateway | System::RelayFloor | System::Agentgateway) => {
            let rmcp = rmcp_upstream(programs).await?;
            launch.upstream = Some(Upstream::Url(rmcp.mcp_url.clone()));
            upstream = Some(rmcp);
        }
        (Scenario::GatewayFederated, System::TetherGateway) => {
            let rmcp = rmcp_upstream(programs).await?;
            let [s1, s2, web] = load::FEDERATED_MEMBERS;
            let members = [
                (s1, Upstream::Stdio(programs.stdio_echo.clone())),
                (s2, Upstream::Stdio(programs.stdio_echo.clone())),
                (web, Upstream::Url(rmcp.mcp_url.clone())),
            ];
            return start_federated(programs, subject, &members, Some(rmcp)).await;
        }
        (Scenario::GatewayStdio | Scenario::GatewayMemory, _) => {
            launch.upstream = Some(Upstream::Stdio(programs.stdio_echo.clone()))
        }
        (Scenario::ToolsCallOauth, System::TetherSqliteToken) => {
            let dir = tempfile::Builder::new().prefix("tether-bench-tokens-").tempdir().context("cannot create a temp dir")?;
            let file = dir.path().join("tokens");
            let tokens: Vec<String> = (0..BEARER_TOKENS).map(|_| format!("{:032x}", rand::random::<u128>())).collect();
            let lines: String = tokens.iter().map(|t| format!("{t} bench\n")).collect();
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()));
            written.with_context(|| format!("cannot write {}", file.display()))?;
            launch.extra_args = vec!["--auth-tokens".into(), file.display().to_string()];
            let (server, store) = start(programs, &launch).await?;
            return Ok(Running { server, _store: store, upstream, _config: Some(dir), tokens, _issuer: None });
        }
        (Scenario::ToolsCallOauth, System::TetherSqliteOauth) => {
            let issuer = auth::Issuer::start(&programs.oauth_provider).await?;
            launch.extra_args = vec!["--oauth-issuer".into(), issuer.url.clone()];
            let (server, store) = start(programs, &launch).await?;
            let tokens = issuer.tokens(&server.mcp_url, BEARER_TOKENS).await?;
            return Ok(Running { server, _store: store, upstream, _config: None, tokens, _issuer: Some(issuer) });
        }
        _ => {}
    }
    let (server, store) = start(programs, &launch).await?;
    Ok(Running { server, _store: store, upstream, _config: None, tokens: Vec::new(), _issuer: None })
}

/// Distinct bearer tokens of tools_call_oauth's systems (client `i` sends token `i % BEARER_TOKENS`).
const BEARER_TOKENS: usize = 64;

/// tether-gateway with a config file of `members` and the virtual server
/// `fed` of them (its MCP URL `/mcp/fed`); `upstream` is stopped with it.
pub(crate) async fn start_federated(
    programs: &Programs,
    subject: Subject,
    members: &[(&str, Upstream)],
    upstream: Option<Server>,
) -> anyhow::Result<Running> {
    let dir = tempfile::Builder::new().prefix("tether-bench-config-").tempdir().context("cannot create a temp dir")?;
    let file = dir.path().join("tether.toml");
    std::fs::write(&file, server::federated_config(members)?).with_context(|| format!("cannot write {}", file.display()))?;
    let mut launch = Launch::new(subject);
    launch.upstream = Some(Upstream::Config(file));
    // On an error the upstream is dropped, which kills it.
    let (server, store) = start(programs, &launch).await?;
    Ok(Running { server, _store: store, upstream, _config: Some(dir), tokens: Vec::new(), _issuer: None })
}
