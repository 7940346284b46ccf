//! The scenarios (`--scenarios`): their names, in table order, and which
//! systems run each one; whether a scenario's rows come from interleaved
//! rounds.

use crate::server::System;

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
    /// tools_call's load through tether-gateway and agentgateway to `rmcp_ref`, and to `rmcp_ref` directly.
    #[value(name = "gateway_http")]
    GatewayHttp,
    /// tools_call's load to `stdio_echo` through tether-gateway, supergateway, mcp-proxy and agentgateway.
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
    /// tether-gateway with 1,000 live sessions and 100 stdio children:
    /// `kill -9` of its engine (the keeper's child), then the time to the
    /// first answered call on an old session and until every session with a
    /// child answered; and the keeper's RSS with those children under load.
    #[value(name = "engine_restart")]
    EngineRestart,
}

impl Scenario {
    pub const ALL: [Scenario; 13] = [
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
        Scenario::EngineRestart,
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
            Scenario::EngineRestart => "engine_restart",
        }
    }

    /// Whether `system` is one of this scenario's systems.
    pub fn runs(self, system: System) -> bool {
        match self {
            Scenario::ToolsCall => !system.gateway() && !system.variant(),
            Scenario::Replay10k | Scenario::IdleSession => {
                !system.gateway() && !system.variant() && !matches!(system, System::AxumFloor | System::TetherRmcp)
            }
            Scenario::Restart100kSessions => system.durable_sessions(),
            Scenario::Restart1mSessions => {
                matches!(system, System::TetherSqlite | System::TetherRedis | System::TetherRedisCluster)
            }
            Scenario::GatewayHttp => {
                matches!(system, System::TetherGateway | System::RmcpDirect | System::RelayFloor | System::Agentgateway)
            }
            Scenario::GatewayStdio => {
                matches!(
                    system,
                    System::TetherGateway
                        | System::TetherGatewayNoKeeper
                        | System::TetherGatewayStdioRelay
                        | System::Supergateway
                        | System::McpProxy
                        | System::Agentgateway
                )
            }
            Scenario::GatewayMemory | Scenario::GatewayFederated | Scenario::EngineRestart => system == System::TetherGateway,
            Scenario::ToolsCallModern => matches!(system, System::TetherSqlite | System::TetherSqliteModern),
            Scenario::Streams10k => system == System::TetherSqlite,
            Scenario::ToolsCallOauth => matches!(system, System::TetherSqliteToken | System::TetherSqliteOauth),
        }
    }

    /// A gateway scenario of rounds: its systems front an upstream (an
    /// `rmcp_ref`, stdio servers), whose CPU per call is measured beside theirs.
    pub fn gateway(self) -> bool {
        matches!(self, Scenario::GatewayHttp | Scenario::GatewayStdio | Scenario::GatewayFederated)
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
