//! What an upstream is: a command (a stdio server, one child per tether
//! session) or a URL (a Streamable HTTP or HTTP+SSE server, one upstream
//! session per tether session), from `--upstream NAME=…` or a TOML table
//! `[upstreams.NAME]`; and what a virtual server is (`[servers.NAME]`):
//! several upstreams behind one endpoint.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// One upstream as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Served at `/mcp/NAME`.
    pub name: String,
    pub target: Target,
    /// Bounds an upstream that never answers `initialize`.
    pub init_timeout: Duration,
    /// Tools whose calls by sessionless clients run as durable tasks (`*`: every tool).
    pub task_tools: Vec<String>,
}

impl UpstreamConfig {
    pub fn new(name: String, target: Target) -> Self {
        Self { name, target, init_timeout: DEFAULT_INIT_TIMEOUT, task_tools: Vec::new() }
    }

    /// Whether a sessionless client's call of `tool` runs as a task.
    pub fn is_task_tool(&self, tool: &str) -> bool {
        self.task_tools.iter().any(|t| t == "*" || t == tool)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Command(CommandSpec),
    Url(UrlSpec),
}

/// A stdio server.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// The program and its arguments (no shell runs them).
    pub command: Vec<String>,
    /// The child's environment: only these, plus PATH and HOME.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// A child with nothing in flight is stopped after this long.
    pub idle_timeout: Duration,
    /// Live children of this upstream per tether process, a hard cap
    /// (sessions' children and the sessionless pool together): beyond it
    /// the least recently used idle one stops, else a request that needs a
    /// new child waits up to `process_queue_timeout`, then is refused.
    pub max_processes: usize,
    /// The share of `max_processes` one principal may hold (default: half
    /// of it, at least 1: [`default_share`]), so one principal holding
    /// calls never takes every child.
    pub max_processes_per_principal: usize,
    pub process_queue_timeout: Duration,
    /// A call the child has not answered after this long ends with an error
    /// naming the upstream and this key, and the child gets
    /// `notifications/cancelled` for it: a call never holds its session's
    /// child (and so a place under `max_processes`) forever. `initialize`
    /// is bounded by `upstream_init_timeout` instead.
    pub request_timeout: Duration,
    /// Longest line the child may write on stdout (one JSON-RPC message).
    pub max_message_bytes: usize,
}

/// A Streamable HTTP (or HTTP+SSE) server.
#[derive(Debug, Clone, PartialEq)]
pub struct UrlSpec {
    pub url: String,
    pub headers: BTreeMap<String, String>,
    /// The environment variable holding tether's own bearer token for it.
    pub auth_env: Option<String>,
    /// Forward the client's `Authorization` header instead (off by default).
    pub forward_auth: bool,
    /// Longest message (a JSON body, one SSE event) the upstream may send.
    pub max_message_bytes: usize,
    /// tether's own OAuth tokens for it (`[upstreams.NAME.oauth]`).
    pub oauth: Option<OAuthGrant>,
}

/// `[upstreams.NAME.oauth]`: how tether gets its own access token for a
/// URL upstream (see [`crate::credentials`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthGrant {
    pub grant: Grant,
    /// The authorization server's token endpoint…
    pub token_url: Option<String>,
    /// …or its issuer URL, whose metadata names it.
    pub issuer: Option<String>,
    /// tether's client at that server.
    pub client_id: String,
    /// The environment variable holding the client's secret.
    pub client_secret_env: String,
    pub scope: Option<String>,
    /// The RFC 8707 resource asked for (default: the upstream's URL).
    pub resource: Option<String>,
}

/// How the token is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// One token of tether's own client, for every session.
    ClientCredentials,
    /// RFC 8693: a token on behalf of each caller, exchanged for its access token.
    TokenExchange,
}

pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
pub const DEFAULT_MAX_PROCESSES: usize = 64;
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_PROCESS_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// Long enough for a slow legitimate tool (a build, a crawl); an upstream
/// whose calls take longer says so with `request_timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// The default `max_processes_per_principal`: half of `max_processes`, at
/// least 1, so that one principal leaves room for others.
pub fn default_share(max_processes: usize) -> usize {
    (max_processes / 2).max(1)
}
/// `max_message_bytes` is never set below this (an `initialize` result must fit).
pub const MIN_MESSAGE_BYTES: usize = 64 * 1024;
/// Large enough for a big legitimate tool result (a file, an image).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Parses `NAME=URL` or `NAME=stdio:COMMAND ARGS…` (split like a shell
/// would, without running one).
pub fn parse_flag(flag: &str) -> Result<UpstreamConfig, String> {
    let (name, target) = flag
        .split_once('=')
        .ok_or_else(|| format!("--upstream `{flag}` needs the form NAME=URL or 'NAME=stdio:COMMAND ARGS…'"))?;
    let name = check_name(name)?;
    let target = match target.strip_prefix("stdio:") {
        Some(command) => {
            let command = shell_words::split(command).map_err(|e| format!("--upstream {name}: cannot split `{command}`: {e}"))?;
            if command.is_empty() {
                return Err(format!("--upstream {name}=stdio: needs a command after `stdio:`"));
            }
            Target::Command(CommandSpec::new(command))
        }
        None if target.starts_with("http://") || target.starts_with("https://") => Target::Url(UrlSpec::new(target.to_owned())),
        None => {
            return Err(format!(
                "--upstream {name}: `{target}` is neither an http(s) URL nor `stdio:COMMAND`; write {name}=http://HOST/mcp or '{name}=stdio:npx -y SERVER'"
            ));
        }
    };
    Ok(UpstreamConfig::new(name, target))
}

/// Upstream names are path segments: letters, digits, `-` and `_`.
pub fn check_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(name.to_owned()) } else { Err(format!("upstream name `{name}` must be 1 to 64 letters, digits, `-` or `_`")) }
}

impl CommandSpec {
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            env: BTreeMap::new(),
            cwd: None,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_processes: DEFAULT_MAX_PROCESSES,
            max_processes_per_principal: default_share(DEFAULT_MAX_PROCESSES),
            process_queue_timeout: DEFAULT_PROCESS_QUEUE_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    /// The child's whole environment: `PATH` and `HOME` of this process (a
    /// value that is not UTF-8 is left out), then the configured `env`.
    pub fn environment(&self) -> Vec<(String, String)> {
        let inherited = ["PATH", "HOME"].into_iter().filter_map(|key| std::env::var(key).ok().map(|v| (key.to_owned(), v)));
        inherited.chain(self.env.iter().map(|(k, v)| (k.clone(), v.clone()))).collect()
    }

    /// The command as a person would type it (for messages and logs).
    pub fn display(&self) -> String {
        shell_words::join(&self.command)
    }
}

impl UrlSpec {
    pub fn new(url: String) -> Self {
        Self {
            url,
            headers: BTreeMap::new(),
            auth_env: None,
            forward_auth: false,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            oauth: None,
        }
    }
}

/// `[upstreams.NAME]` in the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTable {
    pub command: Option<Vec<String>>,
    pub url: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    #[serde(default, with = "humantime_serde_opt")]
    pub idle_timeout: Option<Duration>,
    pub max_processes: Option<usize>,
    pub max_processes_per_principal: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    pub process_queue_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    pub request_timeout: Option<Duration>,
    pub max_message_bytes: Option<usize>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub auth_env: Option<String>,
    #[serde(default)]
    pub forward_auth: bool,
    #[serde(default, with = "humantime_serde_opt")]
    pub upstream_init_timeout: Option<Duration>,
    #[serde(default)]
    pub task_tools: Vec<String>,
    pub oauth: Option<OAuthGrant>,
}

impl UpstreamTable {
    pub fn into_config(self, name: &str) -> Result<UpstreamConfig, String> {
        let name = check_name(name)?;
        let target = match (self.command, self.url) {
            (Some(command), None) => {
                if command.is_empty() {
                    return Err(format!("[upstreams.{name}] command must name a program"));
                }
                if !self.headers.is_empty() || self.auth_env.is_some() || self.forward_auth || self.oauth.is_some() {
                    return Err(format!(
                        "[upstreams.{name}] headers, auth_env, forward_auth and oauth are for a url upstream; a command gets env instead"
                    ));
                }
                let mut spec = CommandSpec::new(command);
                spec.env = self.env;
                spec.cwd = self.cwd;
                spec.idle_timeout = self.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT);
                spec.max_processes = self.max_processes.unwrap_or(DEFAULT_MAX_PROCESSES).max(1);
                spec.max_processes_per_principal = self
                    .max_processes_per_principal
                    .unwrap_or_else(|| default_share(spec.max_processes))
                    .clamp(1, spec.max_processes);
                spec.process_queue_timeout = self.process_queue_timeout.unwrap_or(DEFAULT_PROCESS_QUEUE_TIMEOUT);
                spec.request_timeout = match self.request_timeout {
                    Some(timeout) if timeout.is_zero() => {
                        return Err(format!(
                            "[upstreams.{name}] request_timeout must be longer than 0 (such as \"10m\"): it ends a call the upstream has not answered after that long"
                        ));
                    }
                    Some(timeout) => timeout,
                    None => DEFAULT_REQUEST_TIMEOUT,
                };
                if let Some(max) = self.max_message_bytes {
                    spec.max_message_bytes = max.max(MIN_MESSAGE_BYTES);
                }
                Target::Command(spec)
            }
            (None, Some(url)) => {
                if self.max_processes.is_some()
                    || self.max_processes_per_principal.is_some()
                    || self.process_queue_timeout.is_some()
                    || self.request_timeout.is_some()
                {
                    return Err(format!(
                        "[upstreams.{name}] max_processes, max_processes_per_principal, process_queue_timeout and request_timeout are for a command upstream (a URL upstream's call ends when its client cancels it, or after an hour)"
                    ));
                }
                if let Some(oauth) = &self.oauth {
                    if self.auth_env.is_some() || self.forward_auth {
                        return Err(format!(
                            "[upstreams.{name}] oauth gets tether's own token: it cannot go with auth_env or forward_auth"
                        ));
                    }
                    if oauth.token_url.is_none() == oauth.issuer.is_none() {
                        return Err(format!(
                            "[upstreams.{name}.oauth] needs exactly one of token_url (the token endpoint) or issuer (whose metadata names it)"
                        ));
                    }
                }
                let mut spec = UrlSpec::new(url);
                spec.headers = self.headers;
                spec.auth_env = self.auth_env;
                spec.forward_auth = self.forward_auth;
                spec.oauth = self.oauth;
                if let Some(max) = self.max_message_bytes {
                    spec.max_message_bytes = max.max(MIN_MESSAGE_BYTES);
                }
                Target::Url(spec)
            }
            _ => return Err(format!("[upstreams.{name}] needs exactly one of `command` or `url`")),
        };
        let mut config = UpstreamConfig::new(name, target);
        config.init_timeout = self.upstream_init_timeout.unwrap_or(DEFAULT_INIT_TIMEOUT);
        config.task_tools = self.task_tools;
        Ok(config)
    }
}

/// `"10m"`-style durations in TOML.
mod humantime_serde_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_a_url_or_a_command_split_like_a_shell() {
        let url = parse_flag("remote=http://127.0.0.1:9000/mcp").unwrap();
        assert_eq!(url.target, Target::Url(UrlSpec::new("http://127.0.0.1:9000/mcp".into())));
        let cmd = parse_flag("everything=stdio:npx -y '@modelcontextprotocol/server-everything' \"a b\"").unwrap();
        let Target::Command(spec) = cmd.target else { panic!("a command") };
        assert_eq!(spec.command, ["npx", "-y", "@modelcontextprotocol/server-everything", "a b"]);
        assert!(parse_flag("noequals").unwrap_err().contains("NAME=URL"));
        assert!(parse_flag("bad/name=http://x").unwrap_err().contains("letters"));
        assert!(parse_flag("x=ftp://x").unwrap_err().contains("neither"));
        assert!(parse_flag("x=stdio:").unwrap_err().contains("needs a command"));
        assert!(parse_flag("x=stdio:'unclosed").unwrap_err().contains("cannot split"));
    }

    #[test]
    fn tables_need_one_target_and_refuse_unknown_keys() {
        let table: UpstreamTable =
            toml::from_str("command = [\"srv\", \"--x\"]\nidle_timeout = \"10m\"\nenv = { A = \"1\" }").unwrap();
        let config = table.into_config("s").unwrap();
        let Target::Command(spec) = config.target else { panic!("a command") };
        assert_eq!(spec.idle_timeout, Duration::from_secs(600));
        assert_eq!(spec.env.get("A").map(String::as_str), Some("1"));
        let both: UpstreamTable = toml::from_str("command = [\"a\"]\nurl = \"http://x\"").unwrap();
        assert!(both.into_config("s").unwrap_err().contains("exactly one"));
        assert!(toml::from_str::<UpstreamTable>("comand = [\"a\"]").unwrap_err().to_string().contains("comand"));
    }

    #[test]
    fn one_principals_share_defaults_to_half_the_cap_and_a_set_one_is_kept_within_it() {
        let share = |extra: &str| {
            let table: UpstreamTable = toml::from_str(&format!("command = [\"srv\"]\n{extra}")).unwrap();
            let Target::Command(spec) = table.into_config("s").unwrap().target else { panic!("a command") };
            (spec.max_processes, spec.max_processes_per_principal)
        };
        assert_eq!(share(""), (64, 32), "the default cap, half of it each");
        assert_eq!(share("max_processes = 3"), (3, 1), "below the cap: one principal cannot take every child");
        assert_eq!(share("max_processes = 4"), (4, 2));
        assert_eq!(share("max_processes = 1"), (1, 1), "at least one");
        assert_eq!(share("max_processes = 3\nmax_processes_per_principal = 3"), (3, 3), "as set");
        assert_eq!(share("max_processes = 3\nmax_processes_per_principal = 9"), (3, 3), "never beyond the cap");
        let Target::Command(flag) = parse_flag("x=stdio:srv").unwrap().target else { panic!("a command") };
        assert_eq!((flag.max_processes, flag.max_processes_per_principal), (64, 32), "--upstream too");
        assert_eq!(default_share(0), 1);
    }

    #[test]
    fn request_timeout_is_a_duration_for_a_command_upstream_ten_minutes_unless_set() {
        let config = |text: &str| toml::from_str::<UpstreamTable>(text).unwrap().into_config("s");
        let timeout = |text: &str| match config(text).unwrap().target {
            Target::Command(spec) => spec.request_timeout,
            Target::Url(_) => panic!("a command"),
        };
        assert_eq!(timeout("command = [\"srv\"]"), Duration::from_secs(600));
        assert_eq!(timeout("command = [\"srv\"]\nrequest_timeout = \"30s\""), Duration::from_secs(30));
        assert_eq!(timeout("command = [\"srv\"]\nrequest_timeout = \"2h\""), Duration::from_secs(7200));
        let zero = config("command = [\"srv\"]\nrequest_timeout = \"0s\"").unwrap_err();
        assert!(zero.contains("[upstreams.s] request_timeout must be longer than 0"), "{zero}");
        let unreadable = toml::from_str::<UpstreamTable>("command = [\"srv\"]\nrequest_timeout = \"soon\"").unwrap_err();
        assert!(unreadable.to_string().contains("request_timeout"), "{unreadable}");
        let url = config("url = \"http://127.0.0.1:9/mcp\"\nrequest_timeout = \"30s\"").unwrap_err();
        assert!(url.contains("request_timeout are for a command upstream"), "{url}");
    }

    #[test]
    fn forward_auth_is_for_url_upstreams() {
        let url: UpstreamTable = toml::from_str("url = \"http://127.0.0.1:9/mcp\"\nforward_auth = true").unwrap();
        let Target::Url(spec) = url.into_config("r").unwrap().target else { panic!("a url") };
        assert!(spec.forward_auth);
        let command: UpstreamTable = toml::from_str("command = [\"srv\"]\nforward_auth = true").unwrap();
        assert!(command.into_config("s").unwrap_err().contains("for a url upstream"));
    }

    #[test]
    fn an_oauth_table_names_its_grant_and_one_way_to_the_token_endpoint() {
        let table = |text: &str| toml::from_str::<UpstreamTable>(text).map_err(|e| e.to_string());
        let base = "url = \"http://u/mcp\"\n[oauth]\nclient_id = \"t\"\nclient_secret_env = \"S\"\n";
        let ok = table(&format!("{base}grant = \"token_exchange\"\nissuer = \"http://as\"")).unwrap();
        let Target::Url(spec) = ok.into_config("u").unwrap().target else { panic!("a url") };
        let oauth = spec.oauth.unwrap();
        assert_eq!(oauth.grant, Grant::TokenExchange);
        assert_eq!(oauth.issuer.as_deref(), Some("http://as"));
        let both = table(&format!("{base}grant = \"client_credentials\"\nissuer = \"http://as\"\ntoken_url = \"http://as/t\""));
        assert!(both.unwrap().into_config("u").unwrap_err().contains("exactly one of token_url"));
        let neither = table(&format!("{base}grant = \"client_credentials\""));
        assert!(neither.unwrap().into_config("u").unwrap_err().contains("exactly one of token_url"));
        let with_env = table(&format!("auth_env = \"T\"\n{base}grant = \"client_credentials\"\ntoken_url = \"http://as/t\""));
        assert!(with_env.unwrap().into_config("u").unwrap_err().contains("cannot go with auth_env"));
        assert!(table(&format!("{base}grant = \"password\"\ntoken_url = \"x\"")).is_err(), "an unknown grant");
    }
}

/// A virtual server (`[servers.NAME]`): several upstreams behind one
/// endpoint, their tools, prompts and resources merged under one session.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub name: String,
    /// The members, names of upstreams, in priority order.
    pub upstreams: Vec<String>,
    pub names: Naming,
    /// Between a member's name and its tool's or prompt's under `prefix`.
    pub separator: String,
    pub tools: ToolRules,
    pub on_member_down: MemberDown,
    /// Entries per page of a merged list (`cursor` pages through the rest).
    pub page_size: usize,
    /// A member's four lists together are kept up to this many bytes (as
    /// the member sent them); the rest is cut, with a warning and a metric.
    pub max_list_bytes: usize,
}

/// How the members' names are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Naming {
    /// `MEMBER{separator}NAME`: no two members can collide.
    #[default]
    Prefix,
    /// A member's own names; on a collision the member listed first wins.
    Priority,
    /// A member's own names; a collision refuses to start.
    None,
}

/// What clients see of a member that cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberDown {
    /// Its tools leave the lists (with `list_changed`) and its calls get an
    /// error naming it, until it is back.
    #[default]
    Hide,
    /// The whole endpoint refuses requests until it is back.
    Fail,
}

/// `[servers.NAME.tools]`: which merged tools are offered, and as what.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRules {
    /// Glob patterns (`*`) over the merged names; empty: every tool.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Merged name → the name clients see.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// Name clients see → the description they see.
    #[serde(default)]
    pub describe: BTreeMap<String, String>,
}

pub const DEFAULT_SEPARATOR: &str = "__";
pub const DEFAULT_PAGE_SIZE: usize = 100;
const MAX_PAGE_SIZE: usize = 1000;
/// `max_list_bytes` by default: far more tool descriptions than any model reads.
pub const DEFAULT_MAX_LIST_BYTES: usize = 8 * 1024 * 1024;
/// `max_list_bytes` is never set below this.
const MIN_LIST_BYTES: usize = 64 * 1024;

/// `[servers.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTable {
    pub upstreams: Vec<String>,
    #[serde(default)]
    pub names: Naming,
    pub separator: Option<String>,
    #[serde(default)]
    pub tools: ToolRules,
    #[serde(default)]
    pub on_member_down: MemberDown,
    pub page_size: Option<usize>,
    pub max_list_bytes: Option<usize>,
}

impl ServerTable {
    /// The virtual server `name`, its members among `upstreams` (the names
    /// of every configured upstream).
    pub fn into_config(self, name: &str, upstreams: &[&str]) -> Result<ServerConfig, String> {
        let name = check_name(name).map_err(|e| format!("[servers.{name}]: {e}"))?;
        if upstreams.contains(&name.as_str()) {
            return Err(format!("[servers.{name}]: an upstream is named `{name}` too; /mcp/{name} can serve only one of them"));
        }
        if self.upstreams.is_empty() {
            return Err(format!("[servers.{name}] upstreams must name at least one [upstreams.*] table"));
        }
        let mut seen = Vec::new();
        for member in &self.upstreams {
            if !upstreams.contains(&member.as_str()) {
                return Err(format!(
                    "[servers.{name}] upstreams: `{member}` is not an upstream; the upstreams are: {}",
                    upstreams.join(", ")
                ));
            }
            if seen.contains(&member) {
                return Err(format!("[servers.{name}] upstreams: `{member}` is listed twice"));
            }
            seen.push(member);
        }
        let separator = self.separator.unwrap_or_else(|| DEFAULT_SEPARATOR.to_owned());
        if separator.is_empty() || separator.len() > 8 || separator.chars().any(char::is_whitespace) {
            return Err(format!("[servers.{name}] separator must be 1 to 8 characters without spaces, such as \"__\""));
        }
        for pattern in &self.tools.allow {
            glob::Pattern::new(pattern)
                .map_err(|e| format!("[servers.{name}.tools] allow: `{pattern}` is not a pattern: {e}"))?;
        }
        let page_size = self.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(format!("[servers.{name}] page_size must be 1 to {MAX_PAGE_SIZE}"));
        }
        let max_list_bytes = self.max_list_bytes.unwrap_or(DEFAULT_MAX_LIST_BYTES);
        if max_list_bytes < MIN_LIST_BYTES {
            return Err(format!("[servers.{name}] max_list_bytes must be at least {MIN_LIST_BYTES}"));
        }
        Ok(ServerConfig {
            name,
            upstreams: self.upstreams,
            names: self.names,
            separator,
            tools: self.tools,
            on_member_down: self.on_member_down,
            page_size,
            max_list_bytes,
        })
    }
}
