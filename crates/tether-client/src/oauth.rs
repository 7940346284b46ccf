//! Following a server's OAuth 401 challenge (the MCP authorization spec)
//! with client credentials: [`authorize`] asks the server once without a
//! token; a 401 whose `WWW-Authenticate: Bearer` names `resource_metadata`
//! leads to the protected resource metadata (RFC 9728), its authorization
//! server's metadata (RFC 8414, else OpenID discovery) and a
//! `client_credentials` token for that resource (RFC 8707), with the
//! challenge's scope.
//!
//! Tokens are cached as files ([`TokenCache`]): 0600 in a 0700 folder
//! (`TETHER_OAUTH_CACHE`, else `$XDG_CACHE_HOME/tether/oauth`, else
//! `~/.cache/tether/oauth`), one per resource and client, used until a
//! minute before they expire. A folder or file others can read is refused,
//! not used. The client's secret is never written anywhere.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::ClientError;

/// How long one discovery or token request may take.
const TIMEOUT: Duration = Duration::from_secs(15);
/// A cached token is not used in its last minute.
const MARGIN_SECS: u64 = 60;

/// A confidential client of the authorization server (client credentials).
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthClient {
    /// Its client ID.
    pub client_id: String,
    /// Its secret (never logged: `Debug` redacts it).
    pub client_secret: String,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient").field("client_id", &self.client_id).field("client_secret", &"<redacted>").finish()
    }
}

/// Where tokens are kept between runs.
#[derive(Debug, Clone)]
pub struct TokenCache {
    dir: PathBuf,
}

impl TokenCache {
    /// `TETHER_OAUTH_CACHE`, else `$XDG_CACHE_HOME/tether/oauth`, else `~/.cache/tether/oauth`.
    pub fn default_location(env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let dir = match (env("TETHER_OAUTH_CACHE"), env("XDG_CACHE_HOME"), env("HOME")) {
            (Some(dir), _, _) => PathBuf::from(dir),
            (None, Some(cache), _) => Path::new(&cache).join("tether/oauth"),
            (None, None, Some(home)) => Path::new(&home).join(".cache/tether/oauth"),
            _ => return None,
        };
        Some(Self { dir })
    }

    /// The cache in folder `dir`.
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn file(&self, resource: &str, client_id: &str) -> PathBuf {
        let key = Sha256::digest(format!("{resource}\0{client_id}").as_bytes());
        self.dir.join(format!("{}.json", hex::encode(&key[..16])))
    }

    /// The cached token for `resource`, if it is good for more than a minute.
    fn get(&self, resource: &str, client_id: &str) -> Result<Option<String>, ClientError> {
        let file = self.file(resource, client_id);
        if !file.exists() {
            return Ok(None);
        }
        check_private(&self.dir, 0o077)?;
        check_private(&file, 0o077)?;
        let text = std::fs::read_to_string(&file).map_err(|e| config(format!("cannot read {}: {e}", file.display())))?;
        let Ok(entry) = serde_json::from_str::<Value>(&text) else { return Ok(None) };
        let expires = entry.get("expires_at").and_then(Value::as_u64).unwrap_or(0);
        Ok(entry.get("access_token").and_then(Value::as_str).filter(|_| expires > now() + MARGIN_SECS).map(str::to_owned))
    }

    fn put(&self, resource: &str, client_id: &str, token: &str, lifetime: u64) -> Result<(), ClientError> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        if !self.dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| config(format!("cannot create {}: {e}", self.dir.display())))?;
        }
        check_private(&self.dir, 0o077)?;
        let file = self.file(resource, client_id);
        let partial = file.with_extension("partial");
        let entry = json!({"resource": resource, "client_id": client_id, "access_token": token, "expires_at": now() + lifetime});
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .and_then(|mut f| f.write_all(entry.to_string().as_bytes()))
            .and_then(|()| std::fs::rename(&partial, &file));
        written.map_err(|e| config(format!("cannot write {}: {e}", file.display())))
    }

    /// Forgets the cached token for `resource` (the server refused it).
    pub fn forget(&self, resource: &str, client_id: &str) {
        let _ = std::fs::remove_file(self.file(resource, client_id));
    }
}

/// Refuses a path whose mode gives group or others what `mask` names.
fn check_private(path: &Path, mask: u32) -> Result<(), ClientError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).map_err(|e| config(format!("cannot read {}: {e}", path.display())))?.permissions().mode();
    if mode & mask != 0 {
        return Err(config(format!(
            "{} is readable by others (mode {:o}); chmod go-rwx it, or remove it",
            path.display(),
            mode & 0o777
        )));
    }
    Ok(())
}

fn config(message: String) -> ClientError {
    ClientError::Config(message)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the server's challenge points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The protected resource metadata's URL (RFC 9728).
    pub resource_metadata: String,
    /// The scope the challenge asks for, if any.
    pub scope: Option<String>,
}

impl Challenge {
    /// The `resource_metadata` and `scope` of a `WWW-Authenticate: Bearer` value.
    pub fn parse(header: &str) -> Option<Self> {
        let rest = header.trim_start().strip_prefix("Bearer").or_else(|| header.trim_start().strip_prefix("bearer"))?;
        let param = |name: &str| {
            let at = rest.find(&format!("{name}=\""))? + name.len() + 2;
            let end = rest[at..].find('"')?;
            Some(rest[at..at + end].to_owned())
        };
        Some(Self { resource_metadata: param("resource_metadata")?, scope: param("scope").filter(|s| !s.is_empty()) })
    }
}

/// A token for the server at `url` when it asks for one: the cached one,
/// else one obtained by following its 401 challenge with `client`. `None`
/// when the server answers without asking for a token.
pub async fn authorize(url: &str, client: &OAuthClient, cache: Option<&TokenCache>) -> Result<Option<String>, ClientError> {
    let http = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ClientError::Transport(format!("cannot set up the HTTP client: {e}")))?;
    // Ask once without a token: the answer names what to do.
    let ping = json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
    let asked = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(ping.to_string())
        .send()
        .await
        .map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
    if asked.status() != reqwest::StatusCode::UNAUTHORIZED {
        return Ok(None);
    }
    let header = asked.headers().get(reqwest::header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let challenge = Challenge::parse(header).ok_or_else(|| ClientError::Auth {
        status: 401,
        message: format!("{url} wants a token but names no resource_metadata to find its authorization server"),
    })?;
    let metadata: Value = get_json(&http, &challenge.resource_metadata).await?;
    let resource = metadata.get("resource").and_then(Value::as_str).unwrap_or(url).to_owned();
    if let Some(token) = cache.map(|c| c.get(&resource, &client.client_id)).transpose()?.flatten() {
        return Ok(Some(token));
    }
    let issuer = metadata
        .get("authorization_servers")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| auth(format!("{} names no authorization server", challenge.resource_metadata)))?;
    let token_endpoint = token_endpoint(&http, issuer).await?;
    let scope = challenge.scope.clone().or_else(|| {
        let supported = metadata.get("scopes_supported").and_then(Value::as_array)?;
        Some(supported.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")).filter(|s| !s.is_empty())
    });
    let mut form = vec![("grant_type", "client_credentials"), ("resource", resource.as_str())];
    if let Some(scope) = &scope {
        form.push(("scope", scope));
    }
    let granted = request_token(&http, &token_endpoint, client, &form)
        .await
        .map_err(|e| auth(format!("{e}; check the client's id and secret (authorization server {issuer})")))?;
    let lifetime = granted.expires_in.unwrap_or(300);
    if let Some(cache) = cache {
        cache.put(&resource, &client.client_id, &granted.access_token, lifetime)?;
    }
    Ok(Some(granted.access_token))
}

/// What a token endpoint granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The token.
    pub access_token: String,
    /// Its lifetime in seconds, when the server says.
    pub expires_in: Option<u64>,
}

/// POSTs `form` (a grant) to `token_endpoint` as `client` (HTTP Basic);
/// an error names the endpoint, the client and the server's `error`.
pub async fn request_token(
    http: &reqwest::Client,
    token_endpoint: &str,
    client: &OAuthClient,
    form: &[(&str, &str)],
) -> Result<Granted, String> {
    let answer = http
        .post(token_endpoint)
        .basic_auth(&client.client_id, Some(&client.client_secret))
        .form(form)
        .send()
        .await
        .map_err(|e| format!("{token_endpoint}: {e}"))?;
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let error = body.get("error").and_then(Value::as_str).unwrap_or("no error code");
        let description = body.get("error_description").and_then(Value::as_str).unwrap_or_default();
        return Err(format!("{token_endpoint} refused client {} ({status}, {error}: {description})", client.client_id));
    }
    let access_token = body
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("{token_endpoint} answered without an access_token"))?;
    Ok(Granted { access_token: access_token.to_owned(), expires_in: body.get("expires_in").and_then(Value::as_u64) })
}

fn auth(message: String) -> ClientError {
    ClientError::Auth { status: 401, message }
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, ClientError> {
    let response = http.get(url).send().await.map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
    if !response.status().is_success() {
        return Err(ClientError::Transport(format!("{url} answered {}", response.status())));
    }
    response.json().await.map_err(|e| ClientError::Transport(format!("{url} is not JSON: {e}")))
}

/// The issuer's token endpoint (RFC 8414 metadata, else OpenID discovery).
pub async fn token_endpoint(http: &reqwest::Client, issuer: &str) -> Result<String, ClientError> {
    let base = issuer.trim_end_matches('/');
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let (origin, path) = match base[after_scheme..].find('/') {
        Some(i) => base.split_at(after_scheme + i),
        None => (base, ""),
    };
    let mut last = String::new();
    for url in
        [format!("{origin}/.well-known/oauth-authorization-server{path}"), format!("{base}/.well-known/openid-configuration")]
    {
        match get_json(http, &url).await {
            Ok(meta) => match meta.get("token_endpoint").and_then(Value::as_str) {
                Some(endpoint) => return Ok(endpoint.to_owned()),
                None => last = format!("{url} names no token_endpoint"),
            },
            Err(e) => last = e.to_string(),
        }
    }
    Err(ClientError::Transport(format!("cannot find the token endpoint of {issuer}: {last}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_names_its_metadata_and_scope() {
        let c = Challenge::parse(
            r#"Bearer resource_metadata="http://h/.well-known/oauth-protected-resource/mcp", scope="a b", error="invalid_token""#,
        )
        .unwrap();
        assert_eq!(c.resource_metadata, "http://h/.well-known/oauth-protected-resource/mcp");
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert_eq!(Challenge::parse("Bearer").map(|c| c.resource_metadata), None);
        assert_eq!(Challenge::parse("Basic realm=\"x\""), None);
    }

    #[test]
    fn cached_tokens_are_private_files_used_until_their_last_minute() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = TokenCache::at(dir.path().join("oauth"));
        assert_eq!(cache.get("http://h/mcp", "svc").unwrap(), None);
        cache.put("http://h/mcp", "svc", "tok", 3600).unwrap();
        assert_eq!(cache.get("http://h/mcp", "svc").unwrap().as_deref(), Some("tok"));
        assert_eq!(cache.get("http://h/mcp", "other").unwrap(), None, "per client");
        let file = cache.file("http://h/mcp", "svc");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(dir.path().join("oauth")).unwrap().permissions().mode() & 0o777, 0o700);
        cache.put("http://h/mcp", "svc", "short", 30).unwrap();
        assert_eq!(cache.get("http://h/mcp", "svc").unwrap(), None, "not in its last minute");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(cache.get("http://h/mcp", "svc").unwrap_err().to_string().contains("readable by others"));
        cache.forget("http://h/mcp", "svc");
        assert_eq!(cache.get("http://h/mcp", "svc").unwrap(), None);
    }
}
