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
//! A token is accepted only when it is a JWT signed by a key of one of the
//! configured issuers (found by RFC 8414 / OpenID discovery, its JWKS cached),
//! with an algorithm of [`ALLOWED`] that fits the key (never `none`, never an
//! HMAC algorithm: a public key is no secret), its `iss` that issuer, its
//! `aud` this endpoint's resource (RFC 8707: a token for another endpoint is
//! refused), and `exp`/`nbf` within [`LEEWAY`]. An unknown `kid` refetches the
//! issuer's keys at most once per [`REFETCH_EVERY`], so a flood of made-up
//! `kid`s does not flood the authorization server; keys it dropped are kept
//! for [`STALE_KEEP`]. An issuer whose keys were never fetched and cannot be
//! reached fails closed (503). A checked token is remembered by its SHA-256
//! until it expires, so a client's later requests cost a hash.
//!
//! A token that is not a JWT is opaque: with an introspection client set,
//! it is introspected at each issuer that publishes an
//! `introspection_endpoint` until one calls it active (its `aud` must name
//! this endpoint's resource, its `iss`, when given, that issuer); an active
//! answer is remembered until the token's `exp`, an inactive one for
//! [`INACTIVE_KEEP`], and at most [`INTROSPECTIONS`] run at once, so a flood
//! of made-up tokens cannot flood the authorization server.
//!
//! The principal of a token is `SUB@ISS`; sessions, streams, tasks and
//! resume tokens are bound to it like to any principal.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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
/// Introspection requests in flight at most; more wait their turn.
pub const INTROSPECTIONS: usize = 16;

/// tether's own client at the authorization servers, for introspection
/// (`--oauth-client-id`, secret in `TETHER_OAUTH_CLIENT_SECRET`).
#[derive(Clone, PartialEq)]
pub struct ClientCredentials {
    pub id: String,
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
    pub principal: String,
    pub scopes: Vec<String>,
    /// Its claims, for policies.
    pub claims: Value,
    /// Its `exp` (seconds since the epoch).
    expires: u64,
    /// The resource it was checked for.
    resource: String,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// 401 `invalid_token`, with a description a person understands.
    Invalid(String),
    /// 503: the issuer's keys cannot be had (fail closed).
    Unavailable(String),
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
    remembered: Mutex<HashMap<[u8; 32], Token>>,
    /// Opaque tokens an issuer called inactive, by hash, until when they are refused unasked.
    inactive: Mutex<HashMap<[u8; 32], Instant>>,
    introspections: tokio::sync::Semaphore,
}

impl ResourceServer {
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

    /// Checks `token` for `endpoint`.
    pub async fn verify(&self, token: &str, endpoint: &str) -> Result<Token, Refusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::Invalid(format!("the token is longer than {MAX_TOKEN_BYTES} bytes")));
        }
        let resource = self.resource(endpoint);
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = unix_now();
        if let Some(known) = self.remembered.lock().get(&digest).filter(|t| t.expires + LEEWAY.as_secs() > now).cloned() {
            if known.resource == resource {
                return Ok(known);
            }
            return Err(Refusal::Invalid(format!("the token is not for this resource; ask for one for {resource}")));
        }
        let checked = match token.split('.').count() {
            3 => self.check(token, &resource).await?,
            _ => self.introspect(token, digest, &resource).await?,
        };
        let mut remembered = self.remembered.lock();
        if remembered.len() >= MAX_REMEMBERED {
            remembered.retain(|_, t| t.expires + LEEWAY.as_secs() > now);
            if remembered.len() >= MAX_REMEMBERED {
                remembered.clear();
            }
        }
        remembered.insert(digest, checked.clone());
        Ok(checked)
    }

    /// Checks an opaque token by RFC 7662 introspection at the issuers.
    async fn introspect(&self, token: &str, digest: [u8; 32], resource: &str) -> Result<Token, Refusal> {
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
                Ok(response) if response.status().is_success() => match response.json().await {
                    Ok(claims) => claims,
                    Err(e) => {
                        unreachable = Some(format!("{endpoint}: {e}"));
                        continue;
                    }
                },
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
        let expires = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        let principal = format!("{sub}@{}", issuer.url);
        Ok(Token { principal, scopes, claims, expires, resource: resource.to_owned() })
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
        response.json::<T>().await.map_err(|e| format!("{url}: {e}"))
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
    let expires = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
    let now = unix_now();
    if expires + LEEWAY.as_secs() <= now {
        return invalid("the token has expired".into());
    }
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
    Ok(Token { principal, scopes: scopes.unwrap_or_default(), claims, expires, resource: resource.to_owned() })
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
        assert!(refused(rs.verify("not a jwt", "").await).contains("not a JWT"));
        assert!(refused(rs.verify("a.b.c", "").await).contains("not a JWT"));
        assert!(refused(rs.verify(&"x".repeat(MAX_TOKEN_BYTES + 1), "").await).contains("longer than"));
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let none = format!("{}.{}.", b64(json!({"alg": "none"})), b64(json!({"iss": "http://127.0.0.1:1/oidc", "sub": "x"})));
        assert!(rs.verify(&none, "").await.is_err(), "alg none");
        let hs =
            format!("{}.{}.c2ln", b64(json!({"alg": "HS256", "typ": "JWT"})), b64(json!({"iss": "http://127.0.0.1:1/oidc"})));
        assert!(refused(rs.verify(&hs, "").await).contains("HS256"));
        let foreign =
            format!("{}.{}.c2ln", b64(json!({"alg": "RS256", "kid": "k"})), b64(json!({"iss": "https://evil.example"})));
        assert!(refused(rs.verify(&foreign, "").await).contains("https://evil.example"));
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
        assert!(matches!(rs.verify(&token, "").await, Err(Refusal::Unavailable(_))));
        // Asked again within REFETCH_EVERY: still closed, without asking.
        assert!(matches!(rs.verify(&token, "").await, Err(Refusal::Unavailable(_))));
    }
}
