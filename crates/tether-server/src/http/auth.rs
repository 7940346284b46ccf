//! Bearer-token authentication: who is asking (the principal).
//!
//! `--auth-tokens FILE` holds one `TOKEN PRINCIPAL` pair per line (`#`
//! comments, blank lines ignored). Tokens are kept only as SHA-256 digests and
//! every lookup compares against every entry in constant time, so neither
//! timing nor the table's order reveals a token. With `--oauth-issuer`, the
//! endpoints are OAuth resource servers too (see [`super::oauth`]): a token
//! the file does not hold is checked as an access token, and a request
//! without a usable one gets the challenge that leads a client to the
//! authorization server. Without either, every request belongs to one
//! anonymous principal.
//!
//! A token of the file is never sent anywhere: the resource server checks
//! only an [`Unlisted`] token, which only this module makes, after the
//! table did not hold it. A static token has no claims, so a policy that
//! needs claims refuses it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use parking_lot::RwLock;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::HttpError;
use super::oauth::{Refusal, ResourceServer};
use crate::app::Authorized;
use crate::policy::{Decision, Policy, Subject, Target};

/// The principal of every request while authentication is off.
pub use crate::app::ANONYMOUS;

/// Parsed token file.
#[derive(Debug, Default)]
pub struct TokenTable {
    entries: Vec<([u8; 32], String)>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenTable {
    /// Parses the file's text; errors name the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<([u8; 32], String, usize)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(token), Some(principal), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: expected `TOKEN PRINCIPAL`", n + 1));
            };
            if token.len() < 16 {
                return Err(format!("line {}: token is shorter than 16 characters; use a long random token", n + 1));
            }
            if principal == ANONYMOUS {
                return Err(format!("line {}: `{ANONYMOUS}` is reserved", n + 1));
            }
            let token_digest = digest(token);
            if let Some((_, other, at)) = entries.iter().find(|(d, _, _)| *d == token_digest) {
                if other != principal {
                    return Err(format!(
                        "line {}: this token is already `{other}`'s (line {at}); a token belongs to one principal",
                        n + 1
                    ));
                }
                continue;
            }
            entries.push((token_digest, principal.to_owned(), n + 1));
        }
        let entries = entries.into_iter().map(|(d, p, _)| (d, p)).collect::<Vec<_>>();
        if entries.is_empty() {
            return Err("no `TOKEN PRINCIPAL` lines: every request would be refused".into());
        }
        Ok(Self { entries })
    }

    /// How many tokens the file holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file holds no token.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `token` is one of the file's (whoever's).
    pub fn holds(&self, token: &str) -> bool {
        self.principal(token).is_some()
    }

    /// The principal of `token`, comparing against every entry.
    pub fn principal(&self, token: &str) -> Option<&str> {
        let wanted = digest(token);
        let mut found = None;
        for (d, principal) in &self.entries {
            if bool::from(d.ct_eq(&wanted)) && found.is_none() {
                found = Some(principal.as_str());
            }
        }
        found
    }
}

/// A bearer token the token file does not hold: the only kind
/// [`ResourceServer::verify`] takes, so a token of the file is never sent
/// to an authorization server. Made only by [`Auth`], after its table did
/// not hold the token.
#[derive(Clone, Copy)]
pub struct Unlisted<'a>(&'a str);

impl<'a> Unlisted<'a> {
    /// The token itself, for the resource server that verifies it.
    pub fn as_str(&self) -> &'a str {
        self.0
    }

    /// For the resource server's own unit tests, which have no table.
    #[cfg(test)]
    pub(super) fn for_tests(token: &'a str) -> Self {
        Self(token)
    }
}

/// A bearer token looked up in the table: whose it is, or [`Unlisted`].
enum Lookup<'a> {
    Listed(String),
    Unlisted(Unlisted<'a>),
}

/// The authentication policy of one server; cheap to clone, reloadable.
#[derive(Clone, Default)]
pub struct Auth {
    table: Arc<RwLock<Option<Arc<TokenTable>>>>,
    path: Option<Arc<PathBuf>>,
    oauth: Option<Arc<ResourceServer>>,
    /// What principals may call (`[[policies]]`), if any rule is set.
    policy: Option<Arc<Policy>>,
}

impl Auth {
    /// Everything belongs to [`ANONYMOUS`].
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Reads `path`; fails with a message naming the file and the line.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let auth = Self { path: Some(Arc::new(path.to_path_buf())), ..Self::default() };
        auth.reload()?;
        Ok(auth)
    }

    /// The bearer tokens of `table` (for a program that holds its tokens
    /// itself rather than in an `--auth-tokens` file; not reloaded).
    pub fn from_tokens(table: TokenTable) -> Self {
        Self { table: Arc::new(RwLock::new(Some(Arc::new(table)))), ..Self::default() }
    }

    /// Access tokens of `server`'s issuers are accepted too.
    pub fn with_oauth(mut self, server: ResourceServer) -> Self {
        self.oauth = Some(Arc::new(server));
        self
    }

    /// Tools are allowed per principal by `policy`.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// The policy, if `[[policies]]` are set.
    pub fn policy(&self) -> Option<&Arc<Policy>> {
        self.policy.as_ref()
    }

    /// `token` in the table: its principal, or the token as [`Unlisted`]
    /// (the only place one is made).
    fn lookup<'a>(&self, token: &'a str) -> Lookup<'a> {
        let table = self.table.read().clone();
        match table.as_ref().and_then(|t| t.principal(token)) {
            Some(principal) => Lookup::Listed(principal.to_owned()),
            None => Lookup::Unlisted(Unlisted(token)),
        }
    }

    /// The refusal of a use `decision` denies: 403, with the
    /// `insufficient_scope` challenge when a rule names the scope it needs
    /// (worded by [`Policy::refusal_message`]: a token of the token file is
    /// told it carries no scopes).
    pub fn refusal(&self, endpoint: &str, subject: &Subject, target: Target<'_>, decision: &Decision) -> Option<HttpError> {
        let Decision::Deny { scopes, .. } = decision else { return None };
        let message = Policy::refusal_message(subject, target, None, decision);
        let challenge = match (&self.oauth, scopes.is_empty()) {
            (Some(oauth), false) => Some(oauth.insufficient_scope(endpoint, scopes, &message)),
            _ => None,
        };
        Some(HttpError {
            www_authenticate: challenge,
            ..HttpError::new(StatusCode::FORBIDDEN, tether_wire::code::SERVER_ERROR, message)
        })
    }

    /// Whether `token` is one of the token file's (an admin token must not be).
    pub fn holds_token(&self, token: &str) -> bool {
        self.table.read().clone().is_some_and(|t| t.holds(token))
    }

    /// The OAuth resource server, if `--oauth-issuer` is set.
    pub fn oauth(&self) -> Option<&ResourceServer> {
        self.oauth.as_deref()
    }

    /// Whether requests need a token (a token file or table, or OAuth).
    pub fn is_enabled(&self) -> bool {
        self.path.is_some() || self.oauth.is_some() || self.table.read().is_some()
    }

    /// Re-reads the token file (SIGHUP). On error the old table stays.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.path else { return Ok(0) };
        let text = std::fs::read_to_string(path.as_path()).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let table = TokenTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let n = table.len();
        *self.table.write() = Some(Arc::new(table));
        Ok(n)
    }

    /// The principal of a request to `endpoint` from a client whose address
    /// is not known (all such clients share one count of introspections).
    pub async fn principal(&self, headers: &HeaderMap, endpoint: &str) -> Result<String, HttpError> {
        self.authenticate(headers, endpoint, None).await.map(|(principal, _)| principal)
    }

    /// Who sent a request to `endpoint` from the client at `client`: its
    /// principal and what the request carries on ([`Authorized`]: the
    /// token verified here, once, and its claims), or 401 with a
    /// `WWW-Authenticate: Bearer` challenge (with `Retry-After` past the
    /// limit on introspections; 503 while the authorization server's keys
    /// cannot be had).
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        endpoint: &str,
        client: Option<IpAddr>,
    ) -> Result<(String, Authorized), HttpError> {
        let presented =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(tether_wire::headers::bearer_token);
        if !self.is_enabled() {
            // Nothing checks it here; an upstream with `forward_auth` may.
            let authorized = presented.map(|t| Authorized::verified(t, Arc::new(Value::Null))).unwrap_or_default();
            return Ok((ANONYMOUS.to_owned(), authorized));
        }
        let unauthorized = |m: &str, refusal: Option<&str>| {
            crate::metrics::auth_failure();
            let challenge = match &self.oauth {
                Some(oauth) => oauth.challenge(endpoint, refusal),
                None => "Bearer".to_owned(),
            };
            HttpError {
                www_authenticate: Some(challenge),
                ..HttpError::new(StatusCode::UNAUTHORIZED, tether_wire::code::INVALID_REQUEST, m)
            }
        };
        let token =
            presented.ok_or_else(|| unauthorized("authentication required: send `Authorization: Bearer <token>`", None))?;
        let unlisted = match self.lookup(token) {
            Lookup::Listed(principal) => return Ok((principal, Authorized::verified(token, Arc::new(Value::Null)))),
            Lookup::Unlisted(unlisted) => unlisted,
        };
        let Some(oauth) = &self.oauth else {
            return Err(unauthorized(
                "the Bearer token is not valid for this server: check it, or ask the operator for one",
                None,
            ));
        };
        match oauth.verify(unlisted, endpoint, client).await {
            Ok(checked) => Ok((checked.principal, Authorized::verified(token, checked.claims))),
            Err(Refusal::Invalid(reason)) => {
                Err(unauthorized(&format!("the access token is refused: {reason}; get a new one and retry"), Some(&reason)))
            }
            Err(Refusal::Limited(reason)) => {
                Err(HttpError { retry_after: Some(LIMITED_RETRY_AFTER_SECS), ..unauthorized(&reason, None) })
            }
            Err(Refusal::Unavailable(reason)) => Err(HttpError {
                retry_after: Some(OAUTH_RETRY_AFTER_SECS),
                ..HttpError::new(StatusCode::SERVICE_UNAVAILABLE, tether_wire::code::INTERNAL_ERROR, reason)
            }),
        }
    }
}

/// `Retry-After` while an authorization server's keys cannot be had.
const OAUTH_RETRY_AFTER_SECS: u32 = 5;
/// `Retry-After` of a token refused past the limit on introspections (a
/// client's count recovers by one in half a second).
const LIMITED_RETRY_AFTER_SECS: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_comments_and_names_bad_lines() {
        let t = TokenTable::parse("# team\nAAAAAAAAAAAAAAAAAAAA alice\n\n  BBBBBBBBBBBBBBBBBBBB   bob  \n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.principal("AAAAAAAAAAAAAAAAAAAA"), Some("alice"));
        assert_eq!(t.principal("BBBBBBBBBBBBBBBBBBBB"), Some("bob"));
        assert_eq!(t.principal("AAAAAAAAAAAAAAAAAAAB"), None);
        assert_eq!(t.principal(""), None);
        assert!(TokenTable::parse("onlyonefield").unwrap_err().contains("line 1"));
        assert!(TokenTable::parse("short alice").unwrap_err().contains("16"));
        assert!(TokenTable::parse("AAAAAAAAAAAAAAAAAAAA a b").unwrap_err().contains("line 1"));
        assert!(TokenTable::parse("# nothing\n").is_err());
        let twice = TokenTable::parse("AAAAAAAAAAAAAAAAAAAA alice\nAAAAAAAAAAAAAAAAAAAA bob\n").unwrap_err();
        assert!(twice.contains("line 2") && twice.contains("`alice`'s (line 1)"), "{twice}");
        assert_eq!(TokenTable::parse("AAAAAAAAAAAAAAAAAAAA alice\nAAAAAAAAAAAAAAAAAAAA alice\n").unwrap().len(), 1);
    }
}
