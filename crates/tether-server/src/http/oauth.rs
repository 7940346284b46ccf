//! The OAuth 2.1 resource server of the MCP authorization spec
//! (`basic/authorization`, 2025-11-25 and 2026-07-28): every endpoint
//! (`/mcp`, `/mcp/NAME`) is a protected resource whose identifier is the URL
//! clients use (`--public-url` plus the endpoint's path). It publishes its
//! RFC 9728 metadata ([`ResourceServer::metadata`]), answers a request
//! without a usable token with a `WWW-Authenticate: Bearer` challenge naming
//! that metadata ([`ResourceServer::challenge`]), and checks JWT access
//! tokens ([`ResourceServer::verify`]), and opaque ones by RFC 7662
//! introspection at their issuer when tether has a client there
//! (`--oauth-client-id`).
//!
//! [`ResourceServer::verify`] takes only an [`Unlisted`] token, which only
//! `http::auth` makes, after the token file (`--auth-tokens`) did not
//! hold it: a static token is never sent to an authorization server.
//!
//! A token is accepted only when it is a JWT signed by a key of one of the
//! configured issuers (found by RFC 8414 / OpenID discovery, its JWKS cached),
//! with an algorithm of [`ALLOWED`] that fits the key (never `none`, never an
//! HMAC algorithm: a public key is no secret), no critical header extension
//! (`crit`: tether understands none, so RFC 7515 4.1.11 has it refuse them
//! all), its `iss` that issuer, its `aud` this endpoint's resource (RFC 8707:
//! a token for another endpoint is refused), and `exp`/`nbf` within
//! [`LEEWAY`]. An unknown `kid` refetches the issuer's keys at most once per
//! [`REFETCH_EVERY`], so a flood of made-up `kid`s does not flood the
//! authorization server; keys it dropped are kept for [`STALE_KEEP`]. An
//! issuer whose keys were never fetched and cannot be reached fails closed
//! (503). A checked token is remembered by the SHA-256 of the token and of
//! the resource it was checked for, until it expires, so a client's later
//! requests cost a hash (a token whose `aud` names two endpoints is checked
//! once on each).
//!
//! A token that is not a JWT is opaque: with an introspection client set,
//! it is introspected at each issuer that publishes an
//! `introspection_endpoint` until one calls it active (its `aud` must name
//! this endpoint's resource, its `iss`, when given, that issuer). An active
//! answer is remembered until the token's `exp` but never longer than
//! [`INTROSPECTED_KEEP`] (so a token revoked at the issuer is refused within
//! it; a token without `exp` is accepted and remembered that long), an
//! inactive one for [`INACTIVE_KEEP`]. At most [`INTROSPECTIONS`] run at
//! once, and tokens tether does not remember are introspected at most
//! [`INTROSPECT_RATE`] a second from all clients together and
//! [`INTROSPECT_RATE_PER_CLIENT`] from one client address (each with a
//! burst): past that a token is refused with a 401 saying to retry later,
//! asking nobody, so a flood of made-up tokens cannot flood the
//! authorization server. Remembered tokens are never limited.
//!
//! Every answer of an authorization server (metadata, keys, introspection)
//! is read up to [`MAX_ANSWER_BYTES`]; a bigger one is an error naming its
//! URL.
//!
//! The principal of a token is `SUB@ISS`; sessions, streams, tasks and
//! resume tokens are bound to it like to any principal.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub use super::auth::Unlisted;

/// Signature algorithms accepted: asymmetric only.
pub const ALLOWED: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// Clock skew allowed on `exp` and `nbf`.
pub const LEEWAY: Duration = Duration::from_secs(30);
/// An unknown `kid` refetches an issuer's keys at most this often.
pub const REFETCH_EVERY: Duration = Duration::from_secs(30);
/// Keys an issuer stopped publishing are still accepted this long.
pub const STALE_KEEP: Duration = Duration::from_secs(600);
/// The longest token looked at.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Checked tokens remembered at most (expired ones go first).
const MAX_REMEMBERED: usize = 100_000;
/// How long a fetch of an issuer's metadata or keys may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// An opaque token an issuer called inactive is refused without asking again this long.
pub const INACTIVE_KEEP: Duration = Duration::from_secs(60);
/// An opaque token an issuer called active is remembered at most this long
/// (less when its `exp` comes sooner): a token revoked at the issuer is
/// refused within it, and one whose answer has no `exp` is accepted this long.
pub const INTROSPECTED_KEEP: Duration = Duration::from_secs(300);
/// Introspection requests in flight at most; more wait their turn.
pub const INTROSPECTIONS: usize = 16;
/// Introspections of tokens tether does not remember, per second, from all
/// clients together: well above what clients that each introspect a new
/// token once every few minutes need, well below a flood.
pub const INTROSPECT_RATE: f64 = 20.0;
/// The burst above [`INTROSPECT_RATE`] (many clients arriving at once, a restart).
pub const INTROSPECT_BURST: f64 = 40.0;
/// Introspections of tokens tether does not remember, per second, from one
/// client address (an IPv6 client's /64): a client has one token, or a few.
pub const INTROSPECT_RATE_PER_CLIENT: f64 = 2.0;
/// The burst above [`INTROSPECT_RATE_PER_CLIENT`].
pub const INTROSPECT_BURST_PER_CLIENT: f64 = 5.0;
/// Client addresses whose introspections are counted at most; when all are
/// in use, an address whose count has recovered is forgotten, and a new
/// address waits until one has.
pub const INTROSPECT_CLIENTS: usize = 4096;
/// The largest answer read from an authorization server (its metadata, its
/// keys, an introspection).
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// The warning that introspections are refused is repeated at most this often.
const LIMIT_WARNING_EVERY: Duration = Duration::from_secs(10);

/// tether's own client at the authorization servers, for introspection
/// (`--oauth-client-id`, secret in `TETHER_OAUTH_CLIENT_SECRET`).
#[derive(Clone, PartialEq)]
pub struct ClientCredentials {
    /// The client ID.
    pub id: String,
    /// Its secret (never logged).
    pub secret: String,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials").field("id", &self.id).field("secret", &"<redacted>").finish()
    }
}

/// `--oauth-issuer`, `--public-url`, `--oauth-scopes`.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthConfig {
    /// The authorization servers whose tokens are accepted (issuer URLs).
    pub issuers: Vec<String>,
    /// The base URL clients use (no trailing `/`); an endpoint's resource
    /// is it and the endpoint's path.
    pub public_url: String,
    /// The scopes advertised (`scopes_supported`, and the challenge's `scope`).
    pub scopes: Vec<String>,
    /// tether's client for RFC 7662 introspection of opaque tokens (none:
    /// only JWT access tokens are accepted).
    pub introspection: Option<ClientCredentials>,
}

/// A token that passed: whose it is and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// Who the token is for: its `sub` (an opaque token's `sub` or `client_id`) at its issuer, `SUB@ISSUER`.
    pub principal: String,
    /// The scopes it grants.
    pub scopes: Vec<String>,
    /// Its claims, for policies.
    pub claims: Arc<Value>,
    /// Until when (seconds since the epoch) it is remembered: its `exp` and
    /// [`LEEWAY`] for a JWT, at most [`INTROSPECTED_KEEP`] for an opaque one.
    until: u64,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// 401 `invalid_token`, with a description a person understands.
    Invalid(String),
    /// 503: the issuer's keys cannot be had (fail closed).
    Unavailable(String),
    /// 401 without asking the issuer: too many tokens tether does not know
    /// were presented (by this client address, or by all); retry later.
    Limited(String),
}

/// One issuer's keys, and where its metadata says they and its introspection are.
#[derive(Default)]
struct Keys {
    jwks_uri: Option<String>,
    introspection_endpoint: Option<String>,
    /// By `kid`: the key, its algorithm, and when the issuer last published it.
    by_kid: HashMap<String, (DecodingKey, Algorithm, Instant)>,
    last_fetch: Option<Instant>,
}

struct Issuer {
    url: String,
    keys: tokio::sync::Mutex<Keys>,
}

/// The resource server of every endpoint.
pub struct ResourceServer {
    config: OAuthConfig,
    issuers: Vec<Issuer>,
    http: reqwest::Client,
    /// Checked tokens, by [`remembered_key`] (the token and the resource).
    remembered: Mutex<HashMap<[u8; 32], Token>>,
    /// Opaque tokens an issuer called inactive, by hash, until when they are refused unasked.
    inactive: Mutex<HashMap<[u8; 32], Instant>>,
    introspections: tokio::sync::Semaphore,
    /// How many introspections of tokens not remembered may start now.
    limit: Mutex<IntrospectionLimit>,
}

impl ResourceServer {
    /// The resource server `config` describes; an error says which setting is wrong.
    pub fn new(mut config: OAuthConfig) -> Result<Self, String> {
        if config.issuers.is_empty() {
            return Err("--oauth-issuer: name at least one authorization server".into());
        }
        for issuer in &config.issuers {
            if !(issuer.starts_with("https://") || issuer.starts_with("http://")) {
                return Err(format!("--oauth-issuer `{issuer}` is not an http(s) URL"));
            }
        }
        config.public_url = config.public_url.trim_end_matches('/').to_owned();
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot make the HTTP client for the authorization servers: {e}"))?;
        let issuers = config.issuers.iter().map(|url| Issuer { url: url.clone(), keys: Default::default() }).collect();
        Ok(Self {
            config,
            issuers,
            http,
            remembered: Mutex::default(),
            inactive: Mutex::default(),
            introspections: tokio::sync::Semaphore::new(INTROSPECTIONS),
            limit: Mutex::new(IntrospectionLimit::new(Instant::now())),
        })
    }

    /// The resource identifier of `endpoint` (`""`: `/mcp`).
    pub fn resource(&self, endpoint: &str) -> String {
        match endpoint {
            "" => format!("{}/mcp", self.config.public_url),
            name => format!("{}/mcp/{name}", self.config.public_url),
        }
    }

    /// Where `endpoint`'s RFC 9728 metadata is served.
    pub fn metadata_url(&self, endpoint: &str) -> String {
        let path = self.resource(endpoint)[self.config.public_url.len()..].to_owned();
        format!("{}/.well-known/oauth-protected-resource{path}", self.config.public_url)
    }

    /// `endpoint`'s RFC 9728 protected resource metadata.
    pub fn metadata(&self, endpoint: &str) -> Value {
        json!({
            "resource": self.resource(endpoint),
            "authorization_servers": self.config.issuers,
            "scopes_supported": self.config.scopes.iter().filter(|s| *s != "offline_access").collect::<Vec<_>>(),
            "bearer_methods_supported": ["header"],
            "resource_name": format!("tether {}", if endpoint.is_empty() { "/mcp".to_owned() } else { format!("/mcp/{endpoint}") }),
        })
    }

    /// The `WWW-Authenticate` value of a 401 on `endpoint`; `refusal` the
    /// reason a presented token was refused (none when none was sent).
    pub fn challenge(&self, endpoint: &str, refusal: Option<&str>) -> String {
        let mut challenge = format!("Bearer resource_metadata=\"{}\"", self.metadata_url(endpoint));
        let scopes: Vec<&str> = self.config.scopes.iter().map(String::as_str).filter(|s| *s != "offline_access").collect();
        if !scopes.is_empty() {
            challenge.push_str(&format!(", scope=\"{}\"", scopes.join(" ")));
        }
        if let Some(reason) = refusal {
            let reason: String = reason.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect();
            challenge.push_str(&format!(", error=\"invalid_token\", error_description=\"{reason}\""));
        }
        challenge
    }

    /// The `WWW-Authenticate` value of a 403 on `endpoint` for a request
    /// that needs `scopes` (all of them, so one step-up is enough).
    pub fn insufficient_scope(&self, endpoint: &str, scopes: &[String], description: &str) -> String {
        let description: String = description.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect();
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}\", error_description=\"{description}\"",
            scopes.join(" "),
            self.metadata_url(endpoint)
        )
    }

    /// Checks `token` for `endpoint`; `client` is the address of the
    /// client that sent it (none: unknown, counted as one address), for the
    /// limit on introspections.
    pub async fn verify(&self, token: Unlisted<'_>, endpoint: &str, client: Option<IpAddr>) -> Result<Token, Refusal> {
        let token = token.as_str();
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::Invalid(format!("the token is longer than {MAX_TOKEN_BYTES} bytes")));
        }
        let resource = self.resource(endpoint);
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let key = remembered_key(&digest, &resource);
        let now = unix_now();
        if let Some(known) = self.remembered.lock().get(&key).filter(|t| t.until > now) {
            return Ok(known.clone());
        }
        let checked = match token.split('.').count() {
            3 => self.check(token, &resource).await?,
            _ => self.introspect(token, digest, &resource, client).await?,
        };
        let mut remembered = self.remembered.lock();
        if remembered.len() >= MAX_REMEMBERED {
            remembered.retain(|_, t| t.until > now);
            if remembered.len() >= MAX_REMEMBERED {
                remembered.clear();
            }
        }
        remembered.insert(key, checked.clone());
        Ok(checked)
    }

    /// Checks an opaque token by RFC 7662 introspection at the issuers
    /// (within the limits of [`IntrospectionLimit`]).
    async fn introspect(
        &self,
        token: &str,
        digest: [u8; 32],
        resource: &str,
        client_address: Option<IpAddr>,
    ) -> Result<Token, Refusal> {
        let Some(client) = &self.config.introspection else {
            return Err(Refusal::Invalid(
                "the token is not a JWT, and this server checks opaque tokens only with an introspection client (--oauth-client-id)"
                    .into(),
            ));
        };
        let now = Instant::now();
        if self.inactive.lock().get(&digest).is_some_and(|until| *until > now) {
            return Err(Refusal::Invalid("the token is not active".into()));
        }
        self.limit.lock().take(client_address, now).map_err(|limit| {
            let whose = match limit {
                Limit::Client => "from your address",
                Limit::Overall | Limit::Clients => "to this server",
            };
            Refusal::Limited(format!(
                "too many access tokens it does not know were presented {whose} for tether to check them all at the authorization server; retry in a few seconds"
            ))
        })?;
        let _turn = self.introspections.acquire().await.map_err(|_| Refusal::Unavailable("shutting down".into()))?;
        let mut unreachable = None;
        for issuer in &self.issuers {
            let endpoint = match self.introspection_endpoint(issuer).await {
                Ok(Some(endpoint)) => endpoint,
                Ok(None) => continue,
                Err(e) => {
                    unreachable = Some(e);
                    continue;
                }
            };
            let answer = self
                .http
                .post(&endpoint)
                .basic_auth(&client.id, Some(&client.secret))
                .form(&[("token", token), ("token_type_hint", "access_token")])
                .send()
                .await;
            let claims: Value = match answer {
                Ok(response) if response.status().is_success() => {
                    match read_capped(&endpoint, response)
                        .await
                        .and_then(|body| serde_json::from_slice(&body).map_err(|e| format!("{endpoint}: {e}")))
                    {
                        Ok(claims) => claims,
                        Err(e) => {
                            unreachable = Some(e);
                            continue;
                        }
                    }
                }
                Ok(response) => {
                    tracing::warn!(issuer = %issuer.url, status = %response.status(), "introspection refused; check --oauth-client-id and TETHER_OAUTH_CLIENT_SECRET");
                    unreachable = Some(format!("{endpoint} answered {}", response.status()));
                    continue;
                }
                Err(e) => {
                    unreachable = Some(format!("{endpoint}: {e}"));
                    continue;
                }
            };
            if claims.get("active") != Some(&Value::Bool(true)) {
                continue;
            }
            return active_token(claims, &issuer.url, resource);
        }
        if let Some(e) = unreachable {
            return Err(Refusal::Unavailable(format!("the token could not be introspected: {e}")));
        }
        let mut inactive = self.inactive.lock();
        if inactive.len() >= MAX_REMEMBERED {
            inactive.retain(|_, until| *until > now);
        }
        if inactive.len() < MAX_REMEMBERED {
            inactive.insert(digest, now + INACTIVE_KEEP);
        }
        Err(Refusal::Invalid("the token is not active".into()))
    }

    /// The issuer's `introspection_endpoint` (its metadata fetched once).
    async fn introspection_endpoint(&self, issuer: &Issuer) -> Result<Option<String>, String> {
        let mut keys = issuer.keys.lock().await;
        if keys.jwks_uri.is_none() {
            self.discover_into(&issuer.url, &mut keys).await?;
        }
        Ok(keys.introspection_endpoint.clone())
    }

    async fn check(&self, token: &str, resource: &str) -> Result<Token, Refusal> {
        let invalid = |m: &str| Refusal::Invalid(m.to_owned());
        if let Some(crit) = unverified_part(token, 0).as_ref().and_then(|h| h.get("crit")) {
            let named: String = crit.to_string().chars().take(120).collect();
            return Err(Refusal::Invalid(format!(
                "the token's header marks {named} as critical (`crit`), an extension this server does not understand, so it refuses the token (RFC 7515 4.1.11)"
            )));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| {
            match unverified_part(token, 0).and_then(|h| h.get("alg").cloned()) {
                Some(alg) => Refusal::Invalid(format!("tokens signed with {alg} are not accepted")),
                None => invalid("the token is not a JWT"),
            }
        })?;
        if !ALLOWED.contains(&header.alg) {
            return Err(Refusal::Invalid(format!("tokens signed with {:?} are not accepted", header.alg)));
        }
        let iss = unverified_issuer(token).ok_or_else(|| invalid("the token names no issuer"))?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.url == iss)
            .ok_or_else(|| Refusal::Invalid(format!("tokens of {iss} are not accepted here")))?;
        let kid = header.kid.clone().unwrap_or_default();
        let (key, alg) = self.key(issuer, &kid).await?;
        if alg != header.alg {
            return Err(Refusal::Invalid(format!("the token's algorithm {:?} is not its key's ({alg:?})", header.alg)));
        }
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&issuer.url]);
        validation.set_audience(&[resource]);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            Refusal::Invalid(match e.kind() {
                ErrorKind::ExpiredSignature => "the token has expired".to_owned(),
                ErrorKind::ImmatureSignature => "the token is not valid yet".to_owned(),
                ErrorKind::InvalidAudience => format!("the token is not for this resource; ask for one for {resource}"),
                ErrorKind::InvalidIssuer => "the token's issuer is not accepted".to_owned(),
                ErrorKind::InvalidSignature => "the token's signature does not verify".to_owned(),
                ErrorKind::MissingRequiredClaim(claim) => format!("the token has no `{claim}`"),
                _ => "the token is not valid".to_owned(),
            })
        })?;
        let claims = data.claims;
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid("the token has no `sub`"))?;
        let scopes = match (claims.get("scope"), claims.get("scp")) {
            (Some(Value::String(s)), _) => s.split_whitespace().map(str::to_owned).collect(),
            (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        // `exp` is required above, so it is there.
        let until = claims.get("exp").and_then(Value::as_u64).unwrap_or(0).saturating_add(LEEWAY.as_secs());
        let principal = format!("{sub}@{}", issuer.url);
        Ok(Token { principal, scopes, claims: Arc::new(claims), until })
    }

    /// The issuer's key `kid` (fetched if unknown, at most once per
    /// [`REFETCH_EVERY`]).
    async fn key(&self, issuer: &Issuer, kid: &str) -> Result<(DecodingKey, Algorithm), Refusal> {
        let mut keys = issuer.keys.lock().await;
        let now = Instant::now();
        if let Some((key, alg, _)) = keys.by_kid.get(kid) {
            return Ok((key.clone(), *alg));
        }
        let may_fetch = keys.last_fetch.is_none_or(|at| now.duration_since(at) >= REFETCH_EVERY);
        if may_fetch {
            keys.last_fetch = Some(now);
            match self.fetch(issuer, &mut keys).await {
                Ok(fetched) => {
                    for (kid, (key, alg)) in fetched {
                        keys.by_kid.insert(kid, (key, alg, now));
                    }
                    keys.by_kid.retain(|_, (_, _, seen)| now.duration_since(*seen) < STALE_KEEP);
                }
                Err(e) if keys.by_kid.is_empty() => {
                    tracing::warn!(issuer = %issuer.url, error = %e, "cannot fetch the authorization server's keys; its tokens are refused until it answers");
                    return Err(Refusal::Unavailable(format!("the authorization server {} cannot be reached: {e}", issuer.url)));
                }
                Err(e) => {
                    tracing::warn!(issuer = %issuer.url, error = %e, "cannot refetch the authorization server's keys; the ones known go on")
                }
            }
            if let Some((key, alg, _)) = keys.by_kid.get(kid) {
                return Ok((key.clone(), *alg));
            }
        }
        if keys.by_kid.is_empty() {
            return Err(Refusal::Unavailable(format!("the keys of the authorization server {} are not known yet", issuer.url)));
        }
        Err(Refusal::Invalid("the token's key (kid) is not one of its issuer's".into()))
    }

    /// The issuer's current keys: its metadata (RFC 8414, else OpenID
    /// discovery) names its JWKS.
    async fn fetch(&self, issuer: &Issuer, keys: &mut Keys) -> Result<Vec<(String, (DecodingKey, Algorithm))>, String> {
        let jwks_uri = match &keys.jwks_uri {
            Some(uri) => uri.clone(),
            None => self.discover_into(&issuer.url, keys).await?,
        };
        let set: JwkSet = self.get_json(&jwks_uri).await?;
        Ok(set.keys.iter().filter_map(|jwk| Some((jwk.common.key_id.clone()?, usable(jwk)?))).collect())
    }

    /// Reads the issuer's metadata into `keys`; returns its `jwks_uri`.
    async fn discover_into(&self, issuer: &str, keys: &mut Keys) -> Result<String, String> {
        let base = issuer.trim_end_matches('/');
        let (origin, path) = split_origin(base);
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{base}/.well-known/openid-configuration"),
            format!("{origin}/.well-known/openid-configuration{path}"),
        ];
        let mut last = String::new();
        for url in candidates {
            match self.get_json::<Value>(&url).await {
                Ok(meta) if meta.get("issuer").and_then(Value::as_str) == Some(issuer) => {
                    let field = |name: &str| meta.get(name).and_then(Value::as_str).map(str::to_owned);
                    let jwks_uri = field("jwks_uri").ok_or_else(|| format!("{url} names no jwks_uri"))?;
                    keys.jwks_uri = Some(jwks_uri.clone());
                    keys.introspection_endpoint = field("introspection_endpoint");
                    return Ok(jwks_uri);
                }
                Ok(_) => last = format!("{url} describes another issuer"),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let response = self.http.get(url).send().await.map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let body = read_capped(url, response).await?;
        serde_json::from_slice(&body).map_err(|e| format!("{url}: {e}"))
    }
}

/// The body of `url`'s answer, at most [`MAX_ANSWER_BYTES`] of it (a bigger
/// one is an error naming the URL and the cap, read no further).
async fn read_capped(url: &str, mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let too_big = || {
        format!(
            "{url}: the answer is larger than {} MiB, the most tether reads from an authorization server",
            MAX_ANSWER_BYTES >> 20
        )
    };
    if response.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The key of a checked token in the remembered ones: the token's SHA-256
/// and the resource it was checked for (a token may name several).
fn remembered_key(token_digest: &[u8; 32], resource: &str) -> [u8; 32] {
    let mut key = Sha256::new();
    key.update(token_digest);
    key.update(resource.as_bytes());
    key.finalize().into()
}

/// Which limit refused an introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// This client address's.
    Client,
    /// All clients' together.
    Overall,
    /// Every tracked address is still counting (see [`INTROSPECT_CLIENTS`]).
    Clients,
}

/// A token bucket: `tokens` of at most a burst, refilled at a rate.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Self { tokens: burst, at: now }
    }

    /// The tokens at `now`, without changing the bucket.
    fn level(&self, now: Instant, rate: f64, burst: f64) -> f64 {
        (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate).min(burst)
    }

    fn refill(&mut self, now: Instant, rate: f64, burst: f64) {
        self.tokens = self.level(now, rate, burst);
        self.at = now;
    }
}

/// The limits on introspecting tokens tether does not remember: all
/// clients together, and each client address (an IPv6 one's /64, since one
/// host has a whole /64; none is one address), at most
/// [`INTROSPECT_CLIENTS`] addresses held.
struct IntrospectionLimit {
    overall: Bucket,
    clients: HashMap<Option<IpAddr>, Bucket>,
    warned: Option<Instant>,
}

impl IntrospectionLimit {
    fn new(now: Instant) -> Self {
        Self { overall: Bucket::full(INTROSPECT_BURST, now), clients: HashMap::new(), warned: None }
    }

    /// Takes one introspection for `client` at `now`, or says which limit refuses it.
    fn take(&mut self, client: Option<IpAddr>, now: Instant) -> Result<(), Limit> {
        let taken = self.try_take(client.map(client_key), now);
        if taken.is_err() && self.warned.is_none_or(|at| now.saturating_duration_since(at) >= LIMIT_WARNING_EVERY) {
            self.warned = Some(now);
            tracing::warn!(
                per_second = INTROSPECT_RATE,
                per_client_per_second = INTROSPECT_RATE_PER_CLIENT,
                "too many unknown access tokens to introspect: refused without asking the authorization server (a flood of made-up tokens?)"
            );
        }
        taken
    }

    fn try_take(&mut self, key: Option<IpAddr>, now: Instant) -> Result<(), Limit> {
        let (rate, burst) = (INTROSPECT_RATE_PER_CLIENT, INTROSPECT_BURST_PER_CLIENT);
        if !self.clients.contains_key(&key) && self.clients.len() >= INTROSPECT_CLIENTS {
            // A bucket that is full again is no different from a new one.
            self.clients.retain(|_, bucket| bucket.level(now, rate, burst) < burst);
            if self.clients.len() >= INTROSPECT_CLIENTS {
                return Err(Limit::Clients);
            }
        }
        let bucket = self.clients.entry(key).or_insert_with(|| Bucket::full(burst, now));
        bucket.refill(now, rate, burst);
        self.overall.refill(now, INTROSPECT_RATE, INTROSPECT_BURST);
        if bucket.tokens < 1.0 {
            return Err(Limit::Client);
        }
        if self.overall.tokens < 1.0 {
            return Err(Limit::Overall);
        }
        bucket.tokens -= 1.0;
        self.overall.tokens -= 1.0;
        Ok(())
    }
}

/// The address a client is counted under: an IPv4 address (also one mapped
/// into IPv6), or an IPv6 address's /64.
fn client_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

/// An active introspection answer as a [`Token`] for `resource`, or why not.
fn active_token(claims: Value, issuer: &str, resource: &str) -> Result<Token, Refusal> {
    let invalid = |m: String| Err(Refusal::Invalid(m));
    if let Some(iss) = claims.get("iss").and_then(Value::as_str).filter(|iss| *iss != issuer) {
        return invalid(format!("the token's issuer {iss} is not the one that introspected it"));
    }
    let audience = match claims.get("aud") {
        Some(Value::String(aud)) => aud == resource,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(resource)),
        _ => false,
    };
    if !audience {
        return invalid(format!("the token is not for this resource; ask for one for {resource}"));
    }
    let now = unix_now();
    // `exp` is optional in an introspection answer (RFC 7662 2.2): without
    // one, the token is remembered no longer than INTROSPECTED_KEEP.
    let keep = now.saturating_add(INTROSPECTED_KEEP.as_secs());
    let until = match claims.get("exp") {
        None | Some(Value::Null) => keep,
        Some(exp) => match exp.as_u64() {
            Some(exp) if exp.saturating_add(LEEWAY.as_secs()) <= now => return invalid("the token has expired".into()),
            Some(exp) => exp.saturating_add(LEEWAY.as_secs()).min(keep),
            None => return invalid(format!("the token's `exp` ({exp}) is not a time in seconds")),
        },
    };
    if claims.get("nbf").and_then(Value::as_u64).is_some_and(|nbf| nbf > now + LEEWAY.as_secs()) {
        return invalid("the token is not valid yet".into());
    }
    // A token of client credentials names its client, not always a `sub`.
    let Some(sub) = ["sub", "client_id"].iter().find_map(|k| claims.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()))
    else {
        return invalid("the token has no `sub`".into());
    };
    let principal = format!("{sub}@{issuer}");
    let scopes = claims.get("scope").and_then(Value::as_str).map(|s| s.split_whitespace().map(str::to_owned).collect());
    Ok(Token { principal, scopes: scopes.unwrap_or_default(), claims: Arc::new(claims), until })
}

/// A JWK's key and the one algorithm tokens signed with it may use; none
/// for a symmetric key or an algorithm outside [`ALLOWED`].
fn usable(jwk: &Jwk) -> Option<(DecodingKey, Algorithm)> {
    let named = jwk.common.key_algorithm.and_then(|a| a.to_string().parse::<Algorithm>().ok());
    let alg = match (&jwk.algorithm, named) {
        (_, Some(alg)) => alg,
        (AlgorithmParameters::RSA(_), None) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), None) => match ec.curve {
            jsonwebtoken::jwk::EllipticCurve::P256 => Algorithm::ES256,
            jsonwebtoken::jwk::EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        (AlgorithmParameters::OctetKeyPair(_), None) => Algorithm::EdDSA,
        _ => return None,
    };
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) || !ALLOWED.contains(&alg) {
        return None;
    }
    Some((DecodingKey::from_jwk(jwk).ok()?, alg))
}

/// The `iss` of a JWT, read before its signature is checked (only to pick
/// the keys it is checked with).
fn unverified_issuer(token: &str) -> Option<String> {
    unverified_part(token, 1)?.get("iss")?.as_str().map(str::to_owned)
}

/// Part `n` of a JWT (0: header, 1: claims) as JSON, unverified.
fn unverified_part(token: &str, n: usize) -> Option<Value> {
    let part = token.split('.').nth(n)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// `https://host:port` and the path of a URL.
fn split_origin(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => url.split_at(after_scheme + i),
        None => (url, ""),
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ResourceServer {
        ResourceServer::new(OAuthConfig {
            issuers: vec!["http://127.0.0.1:1/oidc".into()],
            public_url: "http://127.0.0.1:8787/".into(),
            scopes: vec!["tools:read".into(), "offline_access".into()],
            introspection: None,
        })
        .unwrap()
    }

    #[test]
    fn each_endpoint_is_a_resource_with_its_own_metadata_and_challenge() {
        let rs = server();
        assert_eq!(rs.resource(""), "http://127.0.0.1:8787/mcp");
        assert_eq!(rs.resource("fx"), "http://127.0.0.1:8787/mcp/fx");
        assert_eq!(rs.metadata_url("fx"), "http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp/fx");
        let meta = rs.metadata("fx");
        assert_eq!(meta["resource"], "http://127.0.0.1:8787/mcp/fx");
        assert_eq!(meta["authorization_servers"], json!(["http://127.0.0.1:1/oidc"]));
        assert_eq!(meta["scopes_supported"], json!(["tools:read"]), "never offline_access");
        assert_eq!(
            rs.challenge("", None),
            "Bearer resource_metadata=\"http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp\", scope=\"tools:read\""
        );
        assert!(
            rs.challenge("", Some("the \"token\" has expired"))
                .ends_with("error=\"invalid_token\", error_description=\"the token has expired\"")
        );
    }

    #[tokio::test]
    async fn what_is_not_a_signed_jwt_of_an_accepted_issuer_is_refused_before_any_fetch() {
        let rs = server();
        let refused = |r: Result<Token, Refusal>| match r {
            Err(Refusal::Invalid(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(refused(rs.verify(Unlisted::for_tests("not a jwt"), "", None).await).contains("not a JWT"));
        assert!(refused(rs.verify(Unlisted::for_tests("a.b.c"), "", None).await).contains("not a JWT"));
        assert!(
            refused(rs.verify(Unlisted::for_tests(&"x".repeat(MAX_TOKEN_BYTES + 1)), "", None).await).contains("longer than")
        );
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let none = format!("{}.{}.", b64(json!({"alg": "none"})), b64(json!({"iss": "http://127.0.0.1:1/oidc", "sub": "x"})));
        assert!(rs.verify(Unlisted::for_tests(&none), "", None).await.is_err(), "alg none");
        let hs =
            format!("{}.{}.c2ln", b64(json!({"alg": "HS256", "typ": "JWT"})), b64(json!({"iss": "http://127.0.0.1:1/oidc"})));
        assert!(refused(rs.verify(Unlisted::for_tests(&hs), "", None).await).contains("HS256"));
        let foreign =
            format!("{}.{}.c2ln", b64(json!({"alg": "RS256", "kid": "k"})), b64(json!({"iss": "https://evil.example"})));
        assert!(refused(rs.verify(Unlisted::for_tests(&foreign), "", None).await).contains("https://evil.example"));
    }

    #[test]
    fn an_introspected_token_must_be_for_this_resource_of_this_issuer_and_unexpired() {
        let resource = "http://127.0.0.1:8787/mcp";
        let now = unix_now();
        let good =
            json!({"active": true, "client_id": "svc", "aud": resource, "exp": now + 60, "scope": "a b", "iss": "http://as"});
        let token = active_token(good.clone(), "http://as", resource).unwrap();
        assert_eq!(token.principal, "svc@http://as", "client_id when there is no sub");
        assert_eq!(token.scopes, ["a", "b"]);
        let with = |k: &str, v: Value| {
            let mut c = good.clone();
            c[k] = v;
            active_token(c, "http://as", resource)
        };
        assert_eq!(with("sub", json!("alice")).unwrap().principal, "alice@http://as");
        assert!(with("aud", json!([resource, "x"])).is_ok());
        let refused = |r: Result<Token, Refusal>| match r {
            Err(Refusal::Invalid(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(refused(with("aud", json!("http://127.0.0.1:8787/mcp/fx"))).contains("not for this resource"));
        assert!(refused(with("aud", Value::Null)).contains("not for this resource"));
        assert!(refused(with("exp", json!(now - 120))).contains("expired"));
        assert!(refused(with("iss", json!("http://other"))).contains("issuer"));
        assert!(refused(with("client_id", Value::Null)).contains("sub"));
    }

    #[tokio::test]
    async fn an_issuer_never_reached_fails_closed() {
        let rs = server();
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let token =
            format!("{}.{}.c2ln", b64(json!({"alg": "RS256", "kid": "k"})), b64(json!({"iss": "http://127.0.0.1:1/oidc"})));
        assert!(matches!(rs.verify(Unlisted::for_tests(&token), "", None).await, Err(Refusal::Unavailable(_))));
        // Asked again within REFETCH_EVERY: still closed, without asking.
        assert!(matches!(rs.verify(Unlisted::for_tests(&token), "", None).await, Err(Refusal::Unavailable(_))));
    }
    #[tokio::test]
    async fn a_critical_header_extension_is_refused_before_any_fetch() {
        let rs = server();
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let claims = b64(json!({"iss": "http://127.0.0.1:1/oidc", "sub": "x", "aud": "http://127.0.0.1:8787/mcp"}));
        for crit in [json!(["urn:example:must-understand"]), json!(["exp"]), json!([]), json!("b64")] {
            let header = b64(json!({"alg": "RS256", "kid": "k", "crit": crit, "urn:example:must-understand": true}));
            let token = format!("{header}.{claims}.c2ln");
            match rs.verify(Unlisted::for_tests(&token), "", None).await {
                Err(Refusal::Invalid(m)) => assert!(m.contains("`crit`") && m.contains("RFC 7515"), "{crit}: {m}"),
                other => panic!("{crit}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_introspected_token_without_exp_is_accepted_and_remembered_a_bounded_time() {
        let resource = "http://127.0.0.1:8787/mcp";
        let now = unix_now();
        let keep = INTROSPECTED_KEEP.as_secs();
        let no_exp = json!({"active": true, "sub": "svc", "aud": resource});
        let token = active_token(no_exp, "http://as", resource).expect("an active token without exp is accepted");
        assert_eq!(token.principal, "svc@http://as");
        assert!(token.until >= now + keep && token.until <= unix_now() + keep, "{} vs now {now}", token.until);
        // A far `exp` is remembered no longer either (a revoked token is noticed within the bound).
        let far = json!({"active": true, "sub": "svc", "aud": resource, "exp": now + 86_400});
        assert!(active_token(far, "http://as", resource).unwrap().until <= unix_now() + keep);
        let soon = json!({"active": true, "sub": "svc", "aud": resource, "exp": now + 10});
        assert_eq!(active_token(soon, "http://as", resource).unwrap().until, now + 10 + LEEWAY.as_secs());
        let text = json!({"active": true, "sub": "svc", "aud": resource, "exp": "tomorrow"});
        assert!(matches!(active_token(text, "http://as", resource), Err(Refusal::Invalid(m)) if m.contains("`exp`")));
    }

    #[test]
    fn a_token_is_remembered_per_resource() {
        let rs = server();
        let digest: [u8; 32] = Sha256::digest(b"tok").into();
        let (a, b) = (rs.resource("a"), rs.resource("b"));
        assert_ne!(remembered_key(&digest, &a), remembered_key(&digest, &b));
        let other: [u8; 32] = Sha256::digest(b"tok2").into();
        assert_ne!(remembered_key(&digest, &a), remembered_key(&other, &a));
    }

    /// A loopback HTTP server answering every request with `body` (with a
    /// `Content-Length`, or chunked without one); its URL.
    async fn serve_body(body: Vec<u8>, with_length: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        let body = std::sync::Arc::new(body);
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let result = if with_length {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        match tcp.write_all(head.as_bytes()).await {
                            Ok(()) => tcp.write_all(&body).await,
                            Err(e) => Err(e),
                        }
                    } else {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                        let mut out = head.as_bytes().to_vec();
                        for chunk in body.chunks(64 * 1024) {
                            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                            out.extend_from_slice(chunk);
                            out.extend_from_slice(b"\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                        tcp.write_all(&out).await
                    };
                    let _ = result;
                });
            }
        });
        url
    }

    /// A JSON key set padded to `bytes`.
    fn padded_jwks(bytes: usize) -> Vec<u8> {
        let frame = r#"{"keys":[],"pad":""}"#.len();
        json!({"keys": [], "pad": "x".repeat(bytes - frame)}).to_string().into_bytes()
    }

    #[tokio::test]
    async fn an_answer_of_an_authorization_server_is_read_up_to_one_mib() {
        let rs = server();
        for with_length in [true, false] {
            let fits = serve_body(padded_jwks(MAX_ANSWER_BYTES), with_length).await;
            let keys: Value = rs.get_json(&fits).await.unwrap_or_else(|e| panic!("a 1 MiB answer is read: {e}"));
            assert_eq!(keys["keys"], json!([]));
            let big = serve_body(padded_jwks(MAX_ANSWER_BYTES + 1), with_length).await;
            let refused = rs.get_json::<Value>(&big).await.expect_err("a bigger answer is refused");
            assert!(refused.contains(&big) && refused.contains("1 MiB"), "{refused}");
            let huge = serve_body(padded_jwks(20 * MAX_ANSWER_BYTES), with_length).await;
            assert!(rs.get_json::<Value>(&huge).await.expect_err("refused").contains("1 MiB"));
        }
    }

    #[test]
    fn introspections_are_limited_per_client_and_overall() {
        let start = Instant::now();
        let mut limit = IntrospectionLimit::new(start);
        let at = |ms: u64| start + Duration::from_millis(ms);
        let alice: IpAddr = "192.0.2.1".parse().unwrap();
        let burst = INTROSPECT_BURST_PER_CLIENT as usize;
        for n in 0..burst {
            assert_eq!(limit.take(Some(alice), at(0)), Ok(()), "{n}");
        }
        assert_eq!(limit.take(Some(alice), at(0)), Err(Limit::Client));
        // The same address mapped into IPv6 is the same client.
        assert_eq!(limit.take(Some("::ffff:192.0.2.1".parse().unwrap()), at(0)), Err(Limit::Client));
        // Recovered at its rate: one more after 1/rate seconds.
        let step = (1000.0 / INTROSPECT_RATE_PER_CLIENT) as u64;
        assert_eq!(limit.take(Some(alice), at(step)), Ok(()));
        assert_eq!(limit.take(Some(alice), at(step)), Err(Limit::Client));
        // One IPv6 host's /64 is one client.
        let v6 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        for n in 0..burst {
            assert_eq!(limit.take(v6(&format!("2001:db8::{n:x}")), at(step)), Ok(()), "{n}");
        }
        assert_eq!(limit.take(v6("2001:db8::ffff:1"), at(step)), Err(Limit::Client));
        assert_eq!(limit.take(v6("2001:db8:0:1::1"), at(step)), Ok(()), "another /64");
        // Many addresses: the overall burst, then the overall rate.
        let mut allowed = 0;
        for n in 0..1000u32 {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            match limit.take(Some(address), at(step)) {
                Ok(()) => allowed += 1,
                Err(refused) => assert_eq!(refused, Limit::Overall),
            }
        }
        let taken = burst + 1 + burst + 1 + allowed;
        let refilled = INTROSPECT_RATE * step as f64 / 1000.0;
        assert!(allowed > 0 && taken as f64 <= INTROSPECT_BURST + refilled, "{taken} taken: the overall burst and its refill");
        let later = at(step + 1000);
        let mut allowed = 0;
        for n in 1000..2000u32 {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            allowed += usize::from(limit.take(Some(address), later).is_ok());
        }
        assert!(allowed <= INTROSPECT_RATE as usize + 1, "{allowed} in a second");
        // A client whose address is unknown counts as one.
        let mut limit = IntrospectionLimit::new(start);
        let unknown = (0..100).filter(|_| limit.take(None, at(0)).is_ok()).count();
        assert_eq!(unknown, burst);
    }

    #[test]
    fn the_addresses_counted_are_bounded() {
        let start = Instant::now();
        let mut limit = IntrospectionLimit::new(start);
        for n in 0..(3 * INTROSPECT_CLIENTS as u32) {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            // Spread over time so that the overall limit lets many through.
            let now = start + Duration::from_millis(u64::from(n) * 10);
            let _ = limit.take(Some(address), now);
            let _ = limit.take(Some(address), now);
            assert!(limit.clients.len() <= INTROSPECT_CLIENTS, "{} addresses held", limit.clients.len());
        }
    }
}
