//! The Streamable HTTP front: `POST/GET/DELETE /mcp` and `GET /healthz` on
//! axum. Transport concerns only (headers, status codes, SSE framing); every
//! decision about sessions and streams is the engine's.

mod admin;
mod auth;
mod config;
mod conn;
mod error;
mod extract;
mod host;
pub mod oauth;
pub use host::AllowedHosts;
mod ops;
pub mod sessionless;
mod sse;
mod validate;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::net::TcpListener;

pub use admin::{admin_guarded, admin_router, session_summary};
pub use auth::{ANONYMOUS, Auth, TokenTable};
pub use config::HttpConfig;
pub use error::HttpError;
pub use ops::metrics_router;

use tether_wire::{Inbound, code, headers};

use crate::engine::{Engine, PostOutcome, Refusal, Reply, Session};
use crate::policy::{Subject, Target};
use extract::{AcceptsAnswers, AcceptsStream, Endpoint, Message, OriginAllowed, Principal};

#[derive(Clone)]
pub(crate) struct AppState {
    engine: Engine,
    auth: Auth,
    http: Arc<HttpConfig>,
}

/// The router with `/mcp`, `/healthz` and `/readyz` (which need no token).
pub fn router(engine: Engine, auth: Auth, http: Arc<HttpConfig>) -> Router {
    let state = AppState { engine, auth, http };
    let mcp = Router::new()
        .route("/mcp", post(post_mcp).get(get_mcp).delete(delete_mcp))
        .route("/mcp/{endpoint}", post(post_mcp).get(get_mcp).delete(delete_mcp));
    // RFC 9728: `/mcp/NAME`'s metadata at the path-suffixed well-known URL
    // (and `/mcp`'s also at the bare one); 404 without `--oauth-issuer`.
    let metadata = Router::new()
        .route("/.well-known/oauth-protected-resource", get(resource_metadata))
        .route("/.well-known/oauth-protected-resource/{*resource}", get(resource_metadata));
    Router::new().merge(mcp).merge(metadata).route("/healthz", get(healthz)).route("/readyz", get(ops::readyz)).with_state(state)
}

/// An endpoint's protected resource metadata (no token needed).
async fn resource_metadata(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    let path = uri.path().trim_start_matches("/.well-known/oauth-protected-resource");
    let endpoint = match path {
        "" | "/mcp" => Some(""),
        other => other.strip_prefix("/mcp/").filter(|name| !name.is_empty() && !name.contains('/')),
    };
    match (state.auth.oauth(), endpoint) {
        (Some(oauth), Some(endpoint)) if state.engine.serves(endpoint) => axum::Json(oauth.metadata(endpoint)).into_response(),
        (None, _) => HttpError::new(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "this server is not an OAuth resource server (no --oauth-issuer)",
        )
        .into_response(),
        _ => HttpError::new(StatusCode::NOT_FOUND, code::INVALID_REQUEST, format!("no endpoint at {path}")).into_response(),
    }
}

/// Serves until `shutdown` resolves; then tells open streams to reconnect,
/// stops accepting, and flushes the store. Connections are held to
/// `http`: header, idle and body timeouts and a cap on how many are open
/// (`conn.rs`).
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    auth: Auth,
    http: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, Router::new(), engine, auth, http, shutdown).await
}

/// Connections a separate metrics listener holds at once: scrapers, not clients.
const METRICS_MAX_CONNECTIONS: usize = 64;

/// Serves `/metrics` alone on its own listener (`--metrics-listen`) until
/// the process exits, with the main listener's header and idle timeouts and
/// a small cap on open connections, so that a stuck or hostile scraper
/// cannot hold sockets there either.
pub async fn serve_metrics(listener: TcpListener, engine: Engine, config: &HttpConfig) -> std::io::Result<()> {
    let limits = conn::Limits {
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: METRICS_MAX_CONNECTIONS.min(config.max_connections),
    };
    let hosts = host::HostLayer(config.allowed_hosts.clone().map(Arc::new));
    conn::serve(listener, metrics_router(engine).layer(hosts), limits, std::future::pending()).await
}

/// [`serve`] with `extra` routes merged beside `/mcp` and `/healthz` (the
/// web console): same origin, outside the Origin check and authentication.
pub async fn serve_with(
    listener: TcpListener,
    extra: Router,
    engine: Engine,
    auth: Auth,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = conn::Limits {
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
    };
    let app = layered_router(engine.clone(), auth, config, extra);
    let on_shutdown = engine.clone();
    let result = conn::serve(listener, app, limits, async move {
        shutdown.await;
        tracing::info!("shutting down: asking open streams to reconnect");
        on_shutdown.shutdown().await;
    })
    .await;
    // Already done when the graceful shutdown ran; this covers a listener error.
    engine.shutdown().await;
    tracing::info!("store flushed; bye");
    result
}

/// [`router`] with `extra` merged and the layers every request served goes
/// through: request counting and trace spans where they are on, and,
/// outermost, the `Host` check of `config.allowed_hosts` (a request for a
/// name this server is not set up for goes no further).
pub fn layered_router(engine: Engine, auth: Auth, config: HttpConfig, extra: Router) -> Router {
    let hosts = host::HostLayer(config.allowed_hosts.clone().map(Arc::new));
    let mut app = router(engine, auth, Arc::new(config)).merge(extra);
    if crate::metrics::enabled() {
        app = app.layer(ops::CountLayer);
    }
    if crate::trace::enabled() {
        app = app.layer(crate::trace::TraceLayer);
    }
    app.layer(hosts)
}

async fn post_mcp(
    _: OriginAllowed,
    State(state): State<AppState>,
    Endpoint(endpoint): Endpoint,
    Principal(principal, mut authorized): Principal,
    _: AcceptsAnswers,
    Message(message, headers): Message,
) -> Result<Response, HttpError> {
    decide_use(&state.auth, &endpoint, &principal, &mut authorized, &message)?;
    if let Some(down) = state.engine.unavailable(&endpoint) {
        let id = match &message {
            Inbound::Request { id, .. } => Some(id.clone()),
            _ => None,
        };
        return Err(HttpError {
            id,
            retry_after: Some(LIMIT_RETRY_AFTER_SECS),
            data: down.data.map(Box::new),
            ..HttpError::new(StatusCode::SERVICE_UNAVAILABLE, down.code, down.message)
        });
    }
    if sessionless::is_sessionless(&message, &headers) {
        return sessionless::post(&state, &endpoint, principal, authorized, &headers, message).await;
    }
    let engine = &state.engine;
    let reply = if state.http.json_response { Reply::Json } else { Reply::Stream };
    let outcome = match message {
        Inbound::Request { id, method, params } if method == "initialize" => {
            engine.initialize(&endpoint, &principal, id, params, reply, Some(authorized)).await?
        }
        message => {
            let session = existing_session(&state, &endpoint, &headers, &principal).await?;
            engine.post(session, message, reply, Some(authorized)).await?
        }
    };
    let retry = state.http.sse_retry_ms;
    Ok(match outcome {
        PostOutcome::Accepted => StatusCode::ACCEPTED.into_response(),
        PostOutcome::Stream { frames, session_id } => sse::response(frames, retry, Some(&session_id)),
        PostOutcome::Complete { frames, session_id } => sse::complete(&frames, retry, &session_id),
        PostOutcome::Sessionless { body, refusal } => answer_response(body, Some(refusal), None),
        PostOutcome::Json { body, session_id } => match body.await {
            Ok(body) => json_response(body, Some(&session_id)),
            Err(_) => return Err(HttpError::internal("the request's task ended without an answer")),
        },
    })
}

/// The endpoint's policy on the use a `tools/call`, `prompts/get`,
/// `resources/read` or `resources/subscribe` makes, decided here, once: a
/// refusal is audited and answered 403 before anything reaches the engine;
/// an allowed use goes on with its decision in `authorized`, which
/// [`crate::policy::Policed`] takes instead of deciding again (and audits,
/// with the member a virtual server's name comes from).
fn decide_use(
    auth: &Auth,
    endpoint: &str,
    principal: &str,
    authorized: &mut crate::app::Authorized,
    message: &Inbound,
) -> Result<(), HttpError> {
    let Some(policy) = auth.policy().filter(|p| p.covers(endpoint)) else { return Ok(()) };
    let Inbound::Request { method, params, id } = message else { return Ok(()) };
    // A malformed use goes on to the application's policy, which refuses it (-32602).
    let Ok(Some(target)) = Target::of(method, params.as_ref()) else { return Ok(()) };
    let subject = Subject { principal: principal.to_owned(), claims: authorized.claims().clone() };
    let decision = policy.decide(endpoint, method, target, &subject);
    if let Some(refused) = auth.refusal(endpoint, &subject, target, &decision) {
        policy.record(endpoint, method, target, None, principal, &decision);
        return Err(HttpError { id: Some(id.clone()), ..refused });
    }
    authorized.decide(method, target, decision);
    Ok(())
}

fn json_response(body: bytes::Bytes, session_id: Option<&str>) -> Response {
    answer_response(body, None, session_id)
}

/// `Retry-After` of a 503 to retry later: a call elsewhere may end (or an
/// upstream come back) any moment, and a retry waits in the queue again.
const LIMIT_RETRY_AFTER_SECS: u32 = 1;

/// One JSON-RPC answer as a JSON body, its status by what it refused: 503
/// with `Retry-After` for a refusal to retry later, 404 for an unknown method, 400
/// for a request the 2026-07-28 rules refuse, else 200.
fn answer_response(body: bytes::Bytes, refusal: Option<Refusal>, session_id: Option<&str>) -> Response {
    let status = match refusal {
        Some(Refusal { principal_limit: true, .. }) => StatusCode::TOO_MANY_REQUESTS,
        Some(Refusal { retry_later: true, .. }) => StatusCode::SERVICE_UNAVAILABLE,
        Some(Refusal { code: code::METHOD_NOT_FOUND, .. }) => StatusCode::NOT_FOUND,
        Some(Refusal {
            code: code::HEADER_MISMATCH | code::MISSING_REQUIRED_CLIENT_CAPABILITY | code::UNSUPPORTED_PROTOCOL_VERSION,
            ..
        }) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(LIMIT_RETRY_AFTER_SECS));
    }
    if let Some(id) = session_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        response.headers_mut().insert(headers::SESSION_ID, id);
    }
    response
}

/// The session named by `Mcp-Session-Id` for this principal, after the
/// checks every request on an existing session gets.
async fn existing_session(
    state: &AppState,
    endpoint: &str,
    headers: &HeaderMap,
    principal: &str,
) -> Result<Arc<Session>, HttpError> {
    validate::protocol_version(headers)?;
    if !state.engine.serves(endpoint) {
        return Err(crate::engine::EngineError::UnknownEndpoint(endpoint.to_owned()).into());
    }
    let session_id = validate::session_id(headers)?;
    Ok(state.engine.session(endpoint, &session_id, principal).await?)
}

async fn get_mcp(
    _: OriginAllowed,
    State(state): State<AppState>,
    Endpoint(endpoint): Endpoint,
    Principal(principal, _): Principal,
    _: AcceptsStream,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    if sessionless::header_is_sessionless(&headers) {
        return Ok(sessionless::method_not_allowed());
    }
    let engine = &state.engine;
    let session = existing_session(&state, &endpoint, &headers, &principal).await?;
    let frames = match validate::last_event_id(&headers)? {
        Some(last) => engine.resume(session, &last).await?,
        None => engine.open_standalone(session).await?,
    };
    Ok(sse::response(frames, state.http.sse_retry_ms, None))
}

async fn delete_mcp(
    _: OriginAllowed,
    State(state): State<AppState>,
    Endpoint(endpoint): Endpoint,
    Principal(principal, _): Principal,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    if sessionless::header_is_sessionless(&headers) {
        return Ok(sessionless::method_not_allowed());
    }
    let session = existing_session(&state, &endpoint, &headers, &principal).await?;
    state.engine.delete(session).await?;
    Ok(StatusCode::OK.into_response())
}

/// The store's kind for the health routes (`sqlite`, `redis`,
/// `redis-cluster`, `memory`): never its path or address, which an
/// unauthenticated route must not tell.
pub(crate) fn store_kind(store: &dyn tether_store::Store) -> &'static str {
    let described = store.describe();
    match described.split([':', ' ']).next().unwrap_or_default() {
        "sqlite" => "sqlite",
        "memory" => "memory",
        "cluster" => "redis-cluster",
        d if d.starts_with("redis") => "redis",
        _ => "other",
    }
}

/// 200 while the store answers, else 503 with the reason; with an audit
/// log, `audit` says `ok` or `failing` (decisions are being lost, see
/// [`crate::audit`]), which does not change the status: the server still serves.
async fn healthz(State(state): State<AppState>) -> Response {
    let store = store_kind(state.engine.store().as_ref());
    let (status, mut body) = match state.engine.health().await {
        Ok(()) => (StatusCode::OK, json!({"status": "ok", "store": store})),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "unavailable", "store": store, "reason": e.to_string()})),
    };
    if let Some(audit) = crate::audit::health() {
        body["audit"] = json!(audit);
    }
    (status, axum::Json(body)).into_response()
}
