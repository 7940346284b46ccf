//! Which server to talk to and how: the TOML config file
//! (`[servers.NAME] url = "...", requires_session = "auto", auth_env = "..."`),
//! the generic environment (`MCP_SERVER_URL`, `MCP_AUTH_TOKEN`) and the
//! resolution of a command-line target (a URL or a server name) into a
//! [`ServerSpec`]. Generic on purpose: no server or provider is special.
//!
//! Tokens: a server with `auth_env = "VAR"` takes its bearer token from
//! `$VAR` only (so a token meant for one server never goes to another);
//! every other server takes `$MCP_AUTH_TOKEN`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::{ClientError, ClientOptions};

/// The default URL when no target is given.
pub const SERVER_URL_ENV: &str = "MCP_SERVER_URL";
/// The generic bearer token.
pub const AUTH_TOKEN_ENV: &str = "MCP_AUTH_TOKEN";
/// The OAuth client (id and secret) a server's 401 challenge is followed
/// with, for a URL that has no `oauth_client_id` of its own in the config.
pub const OAUTH_CLIENT_ID_ENV: &str = "MCP_OAUTH_CLIENT_ID";
/// The secret of the client [`OAUTH_CLIENT_ID_ENV`] names.
pub const OAUTH_CLIENT_SECRET_ENV: &str = "MCP_OAUTH_CLIENT_SECRET";

/// Whether a server needs `initialize` and a session before other requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequiresSession {
    /// Call without a session first; initialize when the server says a
    /// session is required (400 about a missing or invalid session).
    #[default]
    Auto,
    /// Always initialize first.
    Always,
    /// Never initialize (stateless servers); a server that insists is an error.
    Never,
}

impl RequiresSession {
    /// As the config file spells it: `auto`, `true` or `false`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequiresSession::Auto => "auto",
            RequiresSession::Always => "true",
            RequiresSession::Never => "false",
        }
    }
}

impl FromStr for RequiresSession {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(RequiresSession::Auto),
            "true" | "yes" | "always" => Ok(RequiresSession::Always),
            "false" | "no" | "never" => Ok(RequiresSession::Never),
            other => Err(format!("requires_session must be auto, true or false, not {other:?}")),
        }
    }
}

impl<'de> Deserialize<'de> for RequiresSession {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(RequiresSession::Always),
            Raw::Bool(false) => Ok(RequiresSession::Never),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Which protocol era to speak to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Ask `server/discover` first: the sessionless revision (2026-07-28)
    /// if the server offers it, else `initialize` and sessions.
    #[default]
    Auto,
    /// The session era (2025-11-25 and earlier), never `server/discover`.
    Session,
    /// The sessionless revision only.
    Sessionless,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Protocol::Auto),
            // `legacy` and `modern` are the earlier spellings, still understood.
            "session" | "legacy" => Ok(Protocol::Session),
            "sessionless" | "modern" => Ok(Protocol::Sessionless),
            other => Err(format!("protocol must be auto, session or sessionless, not {other:?}")),
        }
    }
}

/// One server as the runtime sees it.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The MCP endpoint's URL.
    pub url: String,
    /// Whether it needs `initialize` first.
    pub requires_session: RequiresSession,
    /// Which revision to speak to it.
    pub protocol: Protocol,
    /// Token, headers and timeouts of its sessions.
    pub options: ClientOptions,
}

impl ServerSpec {
    /// The server at `url`, everything else found out (`auto`).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            requires_session: RequiresSession::Auto,
            protocol: Protocol::Auto,
            options: ClientOptions::default(),
        }
    }

    /// Speaks revision `p` to it.
    pub fn protocol(mut self, p: Protocol) -> Self {
        self.protocol = p;
        self
    }

    /// Whether it needs a session.
    pub fn requires_session(mut self, r: RequiresSession) -> Self {
        self.requires_session = r;
        self
    }

    /// The bearer token its requests carry, if any.
    pub fn bearer_token(mut self, token: Option<String>) -> Self {
        self.options.bearer_token = token;
        self
    }
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Server used when no target is given (and `MCP_SERVER_URL` is unset).
    pub default: Option<String>,
    /// `[servers.NAME]`, by name.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerEntry>,
}

/// `[servers.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    /// The MCP endpoint's URL.
    pub url: String,
    /// `auto` (the default), `true` or `false`.
    #[serde(default)]
    pub requires_session: RequiresSession,
    /// Name of the environment variable holding this server's bearer token.
    pub auth_env: Option<String>,
    /// Extra HTTP headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time limit of one request, e.g. "60s", "5m".
    pub timeout: Option<String>,
    /// The OAuth client this server's 401 challenge is followed with
    /// (client credentials) …
    pub oauth_client_id: Option<String>,
    /// … and the environment variable holding its secret.
    pub oauth_client_secret_env: Option<String>,
}

/// A resolved target: the spec plus what to tell the user about it.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The config name, when the target came from the config file.
    pub name: Option<String>,
    /// The server as the runtime sees it.
    pub spec: ServerSpec,
    /// The environment variable the token comes from (or would).
    pub token_env: String,
    /// The OAuth client to follow a 401 challenge with, if one is configured.
    pub oauth: Option<crate::oauth::OAuthClient>,
}

impl Resolved {
    /// What to do after a 401/403: where the token goes.
    pub fn token_hint(&self) -> String {
        let set = self.spec.options.bearer_token.is_some();
        match (&self.name, self.token_env.as_str(), set) {
            (Some(name), env, false) if env != AUTH_TOKEN_ENV => {
                format!("set {env} to a valid token (auth_env of server `{name}` in the config)")
            }
            (Some(name), env, true) if env != AUTH_TOKEN_ENV => {
                format!("the token in {env} (auth_env of server `{name}`) was refused: check it")
            }
            (_, _, false) => format!(
                "pass a token with {AUTH_TOKEN_ENV}=<token>, or name a variable with auth_env = \"VAR\" for this server in the config, \
                 or, for an OAuth server, set {OAUTH_CLIENT_ID_ENV} and {OAUTH_CLIENT_SECRET_ENV} (client credentials)"
            ),
            (_, _, true) => {
                format!("the token in {AUTH_TOKEN_ENV} was refused: check it, or set auth_env for this server in the config")
            }
        }
    }
}

impl Config {
    /// `$XDG_CONFIG_HOME/tether/config.toml`, else `~/.config/tether/config.toml`.
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".config")))?;
        Some(base.join("tether").join("config.toml"))
    }

    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ClientError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Config(format!("cannot read the config file {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))
    }

    /// `--config FILE` if given (it must exist), else the default path if
    /// the file exists, else an empty config.
    pub fn load_or_default(explicit: Option<&Path>) -> Result<(Config, Option<PathBuf>), ClientError> {
        if let Some(p) = explicit {
            return Ok((Self::load(p)?, Some(p.to_path_buf())));
        }
        match Self::default_path() {
            Some(p) if p.is_file() => Ok((Self::load(&p)?, Some(p))),
            _ => Ok((Config::default(), None)),
        }
    }

    /// Reads a config file's text; an error says which server and key are wrong.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string().trim().to_owned())?;
        for (name, entry) in &config.servers {
            if entry.url.trim().is_empty() {
                return Err(format!("servers.{name}: url is empty"));
            }
            if let Some(t) = &entry.timeout {
                humantime::parse_duration(t).map_err(|e| format!("servers.{name}: timeout {t:?}: {e} (e.g. \"60s\")"))?;
            }
            if entry.auth_env.as_deref().is_some_and(|env| env.is_empty() || env.contains('=') || env.contains('\0')) {
                return Err(format!("servers.{name}: auth_env must name an environment variable"));
            }
        }
        if let Some(d) = config.default.as_ref().filter(|d| !config.servers.contains_key(*d) && !d.contains("://")) {
            return Err(format!("default = {d:?} names no [servers.{d}] section"));
        }
        Ok(config)
    }

    /// A target (URL or server name, or none: `$MCP_SERVER_URL`, then
    /// `default`) as a spec. `env` reads environment variables.
    pub fn resolve(&self, target: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved, ClientError> {
        let target = match target {
            Some(t) => t.to_owned(),
            None => match env(SERVER_URL_ENV).filter(|v| !v.trim().is_empty()) {
                Some(url) => url.trim().to_owned(),
                None => self.default.clone().ok_or_else(|| {
                    ClientError::Config(format!(
                        "no server given: pass a URL or a server name, set {SERVER_URL_ENV}, or set `default` in the config file"
                    ))
                })?,
            },
        };
        if target.contains("://") {
            // A URL; settings of a configured server with that URL apply.
            if let Some((name, entry)) =
                self.servers.iter().find(|(_, e)| e.url.trim_end_matches('/') == target.trim_end_matches('/'))
            {
                return Ok(entry_spec(Some(name), entry, &target, env));
            }
            let token = env(AUTH_TOKEN_ENV).filter(|t| !t.trim().is_empty());
            return Ok(Resolved {
                name: None,
                spec: ServerSpec::new(target).bearer_token(token),
                token_env: AUTH_TOKEN_ENV.to_owned(),
                oauth: oauth_client(env(OAUTH_CLIENT_ID_ENV), OAUTH_CLIENT_SECRET_ENV, env),
            });
        }
        match self.servers.get(&target) {
            Some(entry) => Ok(entry_spec(Some(&target), entry, &entry.url, env)),
            None => {
                let known: Vec<&str> = self.servers.keys().map(String::as_str).collect();
                let known = if known.is_empty() { "none configured".to_owned() } else { known.join(", ") };
                Err(ClientError::Config(format!(
                    "{target:?} is neither a URL (http://...) nor a server in the config file (servers: {known})"
                )))
            }
        }
    }
}

fn entry_spec(name: Option<&String>, entry: &ServerEntry, url: &str, env: &dyn Fn(&str) -> Option<String>) -> Resolved {
    let token_env = entry.auth_env.clone().unwrap_or_else(|| AUTH_TOKEN_ENV.to_owned());
    let token = env(&token_env).filter(|t| !t.trim().is_empty());
    let timeout = entry.timeout.as_deref().and_then(|t| humantime::parse_duration(t).ok()).unwrap_or(Duration::from_secs(60));
    let options = ClientOptions {
        bearer_token: token,
        headers: entry.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        request_timeout: timeout,
        ..ClientOptions::default()
    };
    let oauth = match &entry.oauth_client_id {
        Some(id) => {
            oauth_client(Some(id.clone()), entry.oauth_client_secret_env.as_deref().unwrap_or(OAUTH_CLIENT_SECRET_ENV), env)
        }
        None => oauth_client(env(OAUTH_CLIENT_ID_ENV), OAUTH_CLIENT_SECRET_ENV, env),
    };
    Resolved {
        name: name.cloned(),
        spec: ServerSpec { url: url.to_owned(), requires_session: entry.requires_session, protocol: Protocol::Auto, options },
        token_env,
        oauth,
    }
}

/// The client `id` with its secret from `secret_env` (none without both).
fn oauth_client(id: Option<String>, secret_env: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<crate::oauth::OAuthClient> {
    let client_id = id.filter(|i| !i.trim().is_empty())?;
    let client_secret = env(secret_env).filter(|s| !s.is_empty())?;
    Some(crate::oauth::OAuthClient { client_id, client_secret })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
default = "notes"

[servers.notes]
url = "http://127.0.0.1:8787/mcp"
requires_session = "auto"
auth_env = "NOTES_TOKEN"

[servers.stateless]
url = "http://127.0.0.1:9000/mcp"
requires_session = false
timeout = "5s"
headers = { "X-Team" = "a" }
"#;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn servers_resolve_by_name_url_default_and_environment() {
        let c = Config::parse(SAMPLE).unwrap();
        let env = env_of(&[("NOTES_TOKEN", "n-token"), ("MCP_AUTH_TOKEN", "generic")]);
        let r = c.resolve(Some("notes"), &env).unwrap();
        assert_eq!(r.spec.url, "http://127.0.0.1:8787/mcp");
        assert_eq!(r.spec.options.bearer_token.as_deref(), Some("n-token"), "auth_env wins");
        let r = c.resolve(Some("stateless"), &env).unwrap();
        assert_eq!(r.spec.requires_session, RequiresSession::Never);
        assert_eq!(r.spec.options.request_timeout, Duration::from_secs(5));
        assert_eq!(r.spec.options.headers, vec![("X-Team".to_owned(), "a".to_owned())]);
        assert_eq!(r.spec.options.bearer_token.as_deref(), Some("generic"));
        // A URL of a configured server takes its settings.
        let r = c.resolve(Some("http://127.0.0.1:8787/mcp/"), &env).unwrap();
        assert_eq!(r.name.as_deref(), Some("notes"));
        // No target: MCP_SERVER_URL, then default.
        let r = c.resolve(None, &env_of(&[("MCP_SERVER_URL", "http://h:1/mcp")])).unwrap();
        assert_eq!(r.spec.url, "http://h:1/mcp");
        assert_eq!(c.resolve(None, &env_of(&[])).unwrap().name.as_deref(), Some("notes"));
        // auth_env set but empty: no token, and the hint names the variable.
        let r = c.resolve(Some("notes"), &env_of(&[("MCP_AUTH_TOKEN", "generic")])).unwrap();
        assert_eq!(r.spec.options.bearer_token, None, "a generic token never goes to a server with its own auth_env");
        assert!(r.token_hint().contains("NOTES_TOKEN"));
        let e = c.resolve(Some("nope"), &env).unwrap_err().to_string();
        assert!(e.contains("notes, stateless"), "{e}");
    }

    #[test]
    fn bad_files_are_refused_with_the_place_of_the_mistake() {
        assert!(
            Config::parse("[servers.a]\nurl = \"http://x\"\nrequires_session = \"maybe\"\n")
                .unwrap_err()
                .contains("auto, true or false")
        );
        assert!(Config::parse("[servers.a]\nurl = \"http://x\"\ncolour = 1\n").unwrap_err().contains("colour"));
        assert!(Config::parse("default = \"b\"\n[servers.a]\nurl = \"http://x\"\n").unwrap_err().contains("names no"));
        assert!(Config::parse("[servers.a]\nurl = \"http://x\"\ntimeout = \"soon\"\n").unwrap_err().contains("timeout"));
        assert!(Config::parse("").unwrap().servers.is_empty());
    }
}
