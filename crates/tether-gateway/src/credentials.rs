//! [`TokenSource`]: tether's own OAuth access tokens for a URL upstream
//! (`[upstreams.NAME.oauth]`), so that the client's token never goes
//! upstream (the MCP authorization spec forbids passing it through).
//!
//! Two grants, tether authenticating as its own client at the upstream's
//! authorization server (HTTP Basic, the secret read from the environment
//! variable `client_secret_env` at each fetch, never logged or stored):
//! - `client_credentials`: one token per upstream, shared by every session;
//! - `token_exchange` (RFC 8693): a token obtained on behalf of the caller,
//!   its access token as the `subject_token`, one per caller's token.
//!
//! Both ask for the upstream's `resource` (RFC 8707; default its URL) and
//! the configured `scope`. Invariant: a token is reused until shortly
//! before it expires ([`refresh_at`]) and never after; the cache holds at
//! most [`MAX_CACHED`] tokens (expired ones go first), and one fetch per
//! upstream runs at a time, so a burst of new sessions asks once.
//!
//! A token the upstream refuses with HTTP 401 (revoked before it expired)
//! is dropped and replaced ([`TokenSource::renew`]): the callers that saw
//! the refusal share one fetch, and a new token is fetched so at most once
//! per [`RENEW_EVERY`] per upstream, so an upstream that refuses every token
//! cannot turn each call into a request to the authorization server. A 401
//! means the upstream ran nothing, so the refused message is sent once more
//! with the new token (see `http`, `sessionless_url` and `passthrough`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tether_client::{Bearer, oauth};
use tether_wire::RpcError;

use crate::config::{Grant, OAuthGrant};

/// Tokens cached at most per upstream.
const MAX_CACHED: usize = 10_000;
/// How long a token request may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The lifetime assumed when the server does not say (`expires_in`).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// After the upstream refused tether's token (HTTP 401), a new one is
/// fetched for it at most this often per upstream: the refusal says the
/// cached token is no good (revoked), but an upstream that refuses every
/// token must not make each call a request to the authorization server.
/// Until this has passed since the last renewal, a refusal stands (the
/// call fails, naming it).
pub const RENEW_EVERY: Duration = Duration::from_secs(5);

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// One upstream's tokens.
pub struct TokenSource {
    grant: OAuthGrant,
    /// The upstream's resource identifier (its URL unless configured).
    resource: String,
    upstream: String,
    http: reqwest::Client,
    /// The token endpoint, once known (configured, or from the issuer's metadata).
    token_url: tokio::sync::OnceCell<String>,
    /// By the caller's token hash (`token_exchange`) or `[0; 32]` (`client_credentials`).
    cached: Mutex<HashMap<[u8; 32], Cached>>,
    fetching: tokio::sync::Mutex<()>,
    /// When a refused token was last replaced ([`RENEW_EVERY`]).
    renewed_at: Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct Cached {
    token: String,
    refresh_at: Instant,
}

impl TokenSource {
    pub fn new(grant: OAuthGrant, upstream: &str, url: &str) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot make the HTTP client for upstream {upstream}'s authorization server: {e}"))?;
        let token_url = tokio::sync::OnceCell::new_with(grant.token_url.clone());
        Ok(Self {
            resource: grant.resource.clone().unwrap_or_else(|| url.to_owned()),
            grant,
            upstream: upstream.to_owned(),
            http,
            token_url,
            cached: Mutex::default(),
            fetching: tokio::sync::Mutex::new(()),
            renewed_at: Mutex::new(None),
        })
    }

    /// Whether a token is obtained for each caller (it then needs the
    /// caller's `Authorization`).
    pub fn per_caller(&self) -> bool {
        self.grant.grant == Grant::TokenExchange
    }

    /// A current access token for the upstream; `client_authorization` is
    /// the caller's `Authorization` value (the subject of a token exchange).
    pub async fn token(&self, client_authorization: Option<&str>) -> Result<String, RpcError> {
        let (subject, key) = self.subject(client_authorization)?;
        if let Some(token) = self.fresh(&key) {
            return Ok(token);
        }
        let _one_at_a_time = self.fetching.lock().await;
        if let Some(token) = self.fresh(&key) {
            return Ok(token);
        }
        self.fetch_and_keep(subject, key).await
    }

    /// The upstream refused `refused` with HTTP 401 (revoked, or otherwise
    /// no longer good before it expired): the token to send instead, or
    /// `None` while the refusal stands ([`RENEW_EVERY`] has not passed since
    /// the last renewal of this upstream). Callers that saw the same refusal
    /// share one fetch: those after the first find its new token cached.
    pub async fn renew(&self, client_authorization: Option<&str>, refused: &str) -> Result<Option<String>, RpcError> {
        let (subject, key) = self.subject(client_authorization)?;
        let _one_at_a_time = self.fetching.lock().await;
        match self.fresh(&key) {
            // Replaced since it was sent (by another caller's renewal).
            Some(token) if token != refused => return Ok(Some(token)),
            Some(_) => {
                let now = Instant::now();
                {
                    let mut renewed_at = self.renewed_at.lock();
                    if renewed_at.is_some_and(|at| now.saturating_duration_since(at) < RENEW_EVERY) {
                        tracing::debug!(upstream = %self.upstream, "the upstream refused a token renewed moments ago; not asking again yet");
                        return Ok(None);
                    }
                    *renewed_at = Some(now);
                }
                // Dropped whatever comes of the fetch: it is never sent again.
                self.cached.lock().remove(&key);
                tracing::info!(upstream = %self.upstream, "the upstream refused tether's access token (HTTP 401); fetching a new one");
            }
            // Due anyway: an ordinary fetch.
            None => {}
        }
        self.fetch_and_keep(subject, key).await.map(Some)
    }

    /// The subject of a token exchange (none for client credentials) and
    /// the cache key of its token.
    fn subject<'a>(&self, client_authorization: Option<&'a str>) -> Result<(Option<&'a str>, [u8; 32]), RpcError> {
        let subject = match self.grant.grant {
            Grant::ClientCredentials => None,
            Grant::TokenExchange => {
                let token = client_authorization.and_then(tether_wire::headers::bearer_token).ok_or_else(|| {
                    self.error("its token is exchanged for the caller's access token, and this request carries none")
                })?;
                Some(token)
            }
        };
        let key: [u8; 32] = subject.map_or([0; 32], |t| Sha256::digest(t.as_bytes()).into());
        Ok((subject, key))
    }

    /// Fetches a token and caches it under `key` (the caller holds `fetching`).
    async fn fetch_and_keep(&self, subject: Option<&str>, key: [u8; 32]) -> Result<String, RpcError> {
        let (token, lifetime) = self.fetch(subject).await.map_err(|e| self.error(&e))?;
        let now = Instant::now();
        let mut cached = self.cached.lock();
        if cached.len() >= MAX_CACHED {
            cached.retain(|_, c| c.refresh_at > now);
            if cached.len() >= MAX_CACHED {
                cached.clear();
            }
        }
        cached.insert(key, Cached { token: token.clone(), refresh_at: now + refresh_at(lifetime) });
        Ok(token)
    }

    /// The cached token for `client_authorization`, if it is current.
    fn cached(&self, client_authorization: Option<&str>) -> Option<String> {
        let (_, key) = self.subject(client_authorization).ok()?;
        self.fresh(&key)
    }

    fn fresh(&self, key: &[u8; 32]) -> Option<String> {
        let cached = self.cached.lock();
        cached.get(key).filter(|c| c.refresh_at > Instant::now()).map(|c| c.token.clone())
    }

    fn error(&self, what: &str) -> RpcError {
        RpcError::internal(format!("upstream {}: cannot get its access token: {what}", self.upstream))
    }

    /// Asks the authorization server; the token and how long it lives.
    async fn fetch(&self, subject: Option<&str>) -> Result<(String, Duration), String> {
        let client_secret = std::env::var(&self.grant.client_secret_env)
            .ok()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("the environment variable {} (client_secret_env) is not set", self.grant.client_secret_env))?;
        let token_url = self
            .token_url
            .get_or_try_init(|| async {
                let issuer = self.grant.issuer.as_deref().ok_or("neither token_url nor issuer is set")?;
                oauth::token_endpoint(&self.http, issuer).await.map_err(|e| e.to_string())
            })
            .await?;
        let mut form: Vec<(&str, &str)> = vec![("resource", &self.resource)];
        if let Some(scope) = &self.grant.scope {
            form.push(("scope", scope));
        }
        match subject {
            None => form.push(("grant_type", "client_credentials")),
            Some(subject) => form.extend([
                ("grant_type", TOKEN_EXCHANGE),
                ("subject_token", subject),
                ("subject_token_type", ACCESS_TOKEN_TYPE),
                ("requested_token_type", ACCESS_TOKEN_TYPE),
            ]),
        }
        let client = oauth::OAuthClient { client_id: self.grant.client_id.clone(), client_secret };
        let granted = oauth::request_token(&self.http, token_url, &client, &form).await?;
        let lifetime = granted.expires_in.map_or(DEFAULT_LIFETIME, Duration::from_secs);
        tracing::debug!(upstream = %self.upstream, lifetime = ?lifetime, exchanged = subject.is_some(), "got an access token for the upstream");
        Ok((granted.access_token, lifetime))
    }
}

/// The changing bearer token of one upstream connection: refreshed from
/// its [`TokenSource`] before each request (a cache hit while the token is
/// good), for the caller whose `Authorization` it last saw.
///
/// Invariant: the cell never goes back to a token the source replaced: it
/// is set under `installing`, with the source's token as it stands then, so
/// a request that read the old token just before a renewal cannot put it
/// back after the renewal put the new one there.
pub(crate) struct Credentials {
    tokens: Arc<TokenSource>,
    bearer: Bearer,
    caller: Mutex<Option<String>>,
    installing: Mutex<()>,
}

impl Credentials {
    /// Credentials for a connection opened for a caller with `client_authorization`.
    pub(crate) fn new(tokens: Arc<TokenSource>, client_authorization: Option<String>) -> Self {
        Self { tokens, bearer: Bearer::default(), caller: Mutex::new(client_authorization), installing: Mutex::new(()) }
    }

    /// The cell the connection's client runtime sends from.
    pub(crate) fn bearer(&self) -> Bearer {
        self.bearer.clone()
    }

    /// The caller's newest `Authorization` (a token exchange trades it the
    /// next time the upstream's token is due).
    pub(crate) fn present(&self, client_authorization: Option<&str>) {
        if let Some(authorization) = client_authorization {
            let mut caller = self.caller.lock();
            if caller.as_deref() != Some(authorization) {
                *caller = Some(authorization.to_owned());
            }
        }
    }

    /// Makes sure the cell holds a current token; the token (what a
    /// request sent now carries, for [`Credentials::renew`]).
    pub(crate) async fn refresh(&self) -> Result<String, RpcError> {
        let caller = self.caller.lock().clone();
        let token = self.tokens.token(caller.as_deref()).await?;
        self.install(caller.as_deref(), token)
    }

    /// The upstream refused `refused` with HTTP 401: puts a renewed token in
    /// the cell ([`TokenSource::renew`]); whether there is one to send the
    /// refused message again with.
    pub(crate) async fn renew(&self, refused: &str) -> Result<bool, RpcError> {
        let caller = self.caller.lock().clone();
        let Some(token) = self.tokens.renew(caller.as_deref(), refused).await? else { return Ok(false) };
        self.install(caller.as_deref(), token)?;
        Ok(true)
    }

    /// Puts the source's current token for `caller` in the cell (`token`,
    /// just had from it, if it holds none now); the token put there.
    fn install(&self, caller: Option<&str>, token: String) -> Result<String, RpcError> {
        let _one_at_a_time = self.installing.lock();
        let token = self.tokens.cached(caller).unwrap_or(token);
        self.bearer.set(&token).map_err(|e| self.tokens.error(&e.to_string()))?;
        Ok(token)
    }
}

/// When a token of `lifetime` is replaced: a minute before it expires, or
/// halfway for a short-lived one.
fn refresh_at(lifetime: Duration) -> Duration {
    lifetime.saturating_sub(Duration::from_secs(60)).max(lifetime / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_replaced_before_it_expires() {
        assert_eq!(refresh_at(Duration::from_secs(3600)), Duration::from_secs(3540));
        assert_eq!(refresh_at(Duration::from_secs(60)), Duration::from_secs(30));
        assert_eq!(refresh_at(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_token_exchange_needs_the_callers_token() {
        let grant = OAuthGrant {
            grant: Grant::TokenExchange,
            token_url: Some("http://127.0.0.1:9/token".into()),
            issuer: None,
            client_id: "tether".into(),
            client_secret_env: "TETHER_TEST_NEVER_SET".into(),
            scope: None,
            resource: None,
        };
        let source = TokenSource::new(grant, "up", "http://127.0.0.1:9/mcp").unwrap();
        assert!(source.per_caller());
        let e = source.token(None).await.unwrap_err();
        assert!(e.message.contains("carries none"), "{}", e.message);
        let e = source.token(Some("Bearer abc")).await.unwrap_err();
        assert!(e.message.contains("TETHER_TEST_NEVER_SET"), "{}", e.message);
    }
}
