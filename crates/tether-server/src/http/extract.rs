//! The transport's checks as axum extractors, so every handler gets them
//! the same way and none can forget one: the Origin check comes first in
//! every `/mcp` handler (DNS-rebinding protection runs before anything
//! else, also before authentication); the principal, the Accept header and
//! the JSON-RPC body follow. Each rejection is the [`HttpError`] that names
//! what to send instead.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use tether_wire::Inbound;

use super::{AppState, HttpError, validate};
use crate::app::Authorized;

/// A present `Origin` is a localhost origin or one of `--allowed-origin`
/// (403 otherwise). The first extractor of every `/mcp` handler, so it is
/// checked before anything else (authentication included); an extractor
/// rather than `axum::middleware::from_fn`, which boxes a future and clones
/// the route per request.
pub(super) struct OriginAllowed;

impl FromRequestParts<AppState> for OriginAllowed {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        validate::origin(&parts.headers, &state.http.allowed_origins).map(|()| OriginAllowed)
    }
}

/// Who is asking: the principal of the bearer token (401 without a valid one
/// while `--auth-tokens` is on), checked with the client's address (which
/// the accept loop puts on every request) for the limits per client, and
/// what the request carries on of that check ([`Authorized`]).
pub(super) struct Principal(pub String, pub Authorized);

impl FromRequestParts<AppState> for Principal {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if parts.uri.query().is_some_and(|q| q.split('&').any(|pair| pair.starts_with("access_token="))) {
            return Err(HttpError::bad_request(
                "an access token in the query string is refused (it would be logged); send `Authorization: Bearer <token>`",
            ));
        }
        let client = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(peer)| peer.ip());
        let (principal, authorized) = state.auth.authenticate(&parts.headers, endpoint_of(parts.uri.path()), client).await?;
        Ok(Principal(principal, authorized))
    }
}

/// The endpoint a request is for: `""` for `/mcp`, `NAME` for `/mcp/NAME`.
pub(super) struct Endpoint(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Endpoint {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Endpoint(endpoint_of(parts.uri.path()).to_owned()))
    }
}

/// The endpoint of a request path: `""` for `/mcp`, `NAME` for `/mcp/NAME`.
fn endpoint_of(path: &str) -> &str {
    path.strip_prefix("/mcp").map(|rest| rest.trim_start_matches('/')).unwrap_or_default()
}

/// A POST's Accept lists both JSON and SSE (406 otherwise).
pub(super) struct AcceptsAnswers;

impl<S: Send + Sync> FromRequestParts<S> for AcceptsAnswers {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        validate::accept_for_post(&parts.headers).map(|()| AcceptsAnswers)
    }
}

/// A GET's Accept lists SSE (406 otherwise).
pub(super) struct AcceptsStream;

impl<S: Send + Sync> FromRequestParts<S> for AcceptsStream {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        validate::accept_for_get(&parts.headers).map(|()| AcceptsStream)
    }
}

/// One JSON-RPC message in a JSON body of at most `--max-body` bytes (415,
/// 413, or 400 with the JSON-RPC code of what is wrong), with the request's
/// headers (taken, where axum's `HeaderMap` extractor would copy them).
pub(super) struct Message(pub Inbound, pub HeaderMap);

impl FromRequest<AppState> for Message {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (parts, body) = request.into_parts();
        validate::content_type_json(&parts.headers)?;
        let http = &state.http;
        let bytes = validate::read_body(&parts.headers, body, http.max_body, http.body_timeout).await?;
        Ok(Message(tether_wire::parse_message(&bytes)?, parts.headers))
    }
}
