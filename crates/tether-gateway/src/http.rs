//! A URL upstream: one upstream MCP session per tether session, over
//! Streamable HTTP (or the 2024-11-05 HTTP+SSE transport, found as the
//! client runtime finds it), on [`tether_client::Session`].
//!
//! The client runtime does the transport work (session and protocol
//! headers, SSE answers, resuming dropped streams, the standalone stream,
//! `notifications/cancelled` for a request dropped before its answer). This
//! module adds what a gateway needs on top: the upstream's credentials
//! (tether's own: a token from `auth_env`, or OAuth tokens from
//! [`crate::credentials`] refreshed before each request, and renewed when
//! the upstream refuses one with HTTP 401, the refused message then sent
//! once more since the upstream ran nothing; the client's
//! `Authorization` only when `forward_auth` opts in), results as raw JSON, the upstream's own
//! messages to the caller's [`PeerSink`] (each delivered before the client
//! runtime reads on), and a 404 (the upstream forgot its
//! session) turning the connection dead so the gateway starts a new one.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;
use serde_json::value::RawValue;
use tether_client::{ClientError, ClientOptions, PeerMessage, RequestTrack, Session};
use tether_wire::RpcError;
use tokio::sync::mpsc;

use crate::config::UrlSpec;
use crate::credentials::{Credentials, TokenSource};
use crate::upstream::{PeerSink, Started, Upstream, UpstreamError, UpstreamResult};

/// The longest one upstream request may take. The client decides when to
/// give up (and cancels); this only bounds a request nobody cancels.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// Opens an upstream session: `initialize` with `initialize_params` as
/// given (then `notifications/initialized`, which the client runtime sends
/// itself; see [`HttpUpstream::notify`]), waiting at most `init_timeout`.
/// `client_authorization` is the client's `Authorization` header value,
/// forwarded only when the upstream has `forward_auth` (and traded for
/// tether's own token when its `oauth` is a token exchange).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    spec: &UrlSpec,
    upstream_name: &str,
    session: &str,
    initialize_params: Value,
    init_timeout: Duration,
    client_authorization: Option<String>,
    tokens: Option<&Arc<TokenSource>>,
    sink: Arc<dyn PeerSink>,
) -> Result<Started, RpcError> {
    let connected = connect(
        spec,
        upstream_name,
        session,
        initialize_params.clone(),
        init_timeout,
        client_authorization.clone(),
        tokens,
        sink.clone(),
    )
    .await;
    let refused = match connected {
        Ok((upstream, initialize_result)) => {
            let carry_on = upstream.carry_on();
            return Ok(Started { upstream, initialize_result, carry_on, resumed: false });
        }
        Err(refused) => refused,
    };
    // An upstream that refuses `initialize` may speak only the sessionless revision.
    let credentials = credentials(tokens, &client_authorization).await?.map(|(credentials, _)| credentials);
    let mut options = client_options(spec, client_authorization, |var| std::env::var(var).ok()).map_err(|_| refused.clone())?;
    options.bearer = credentials.as_ref().map(Credentials::bearer);
    match crate::sessionless_url::start(spec, upstream_name, &initialize_params, options, credentials, init_timeout, sink).await {
        Some(started) => Ok(started),
        None => Err(refused),
    }
}

/// Carries on the upstream session `carry_on` names (from [`Started::carry_on`]
/// of an earlier connection, maybe of another replica), without `initialize`,
/// and checks with a `ping` that the upstream still knows it; `None` if not
/// (the caller then starts a new one).
pub async fn attach(
    spec: &UrlSpec,
    upstream_name: &str,
    session: &str,
    carry_on: &Value,
    client_authorization: Option<String>,
    tokens: Option<&Arc<TokenSource>>,
    sink: Arc<dyn PeerSink>,
) -> Option<Arc<dyn Upstream>> {
    let session_id = carry_on.get("sessionId").and_then(Value::as_str)?;
    let protocol_version = carry_on.get("protocolVersion").and_then(Value::as_str)?;
    let credentials = credentials(tokens, &client_authorization).await.ok()?;
    let mut options = client_options(spec, client_authorization, |var| std::env::var(var).ok()).ok()?;
    options.bearer = credentials.as_ref().map(|(credentials, _)| credentials.bearer());
    let client = Session::attach(&spec.url, options, session_id, protocol_version).await.ok()?;
    let mut pinged = client.request("ping", None).await;
    if let (Err(ClientError::Auth { status: 401, .. }), Some((credentials, sent))) = (&pinged, &credentials)
        && credentials.renew(sent).await.ok()?
    {
        pinged = client.request("ping", None).await;
    }
    let credentials = credentials.map(|(credentials, _)| credentials);
    if let Err(e) = pinged {
        tracing::info!(upstream = %upstream_name, %session, error = %e, "the upstream session cannot be carried on; starting a new one");
        client.close().await;
        return None;
    }
    client.deliver_to(sink).await;
    let upstream = Arc::new(HttpUpstream {
        name: upstream_name.to_owned(),
        session: session.to_owned(),
        url: spec.url.clone(),
        upstream_session_id: Some(session_id.to_owned()),
        client: Mutex::new(Some(client)),
        alive: AtomicBool::new(true),
        credentials,
    });
    tracing::info!(upstream = %upstream_name, %session, "carrying on the stored upstream session");
    Some(upstream)
}

/// [`start`], keeping the concrete type (for
/// [`HttpUpstream::upstream_session_id`], stored with the tether session).
#[allow(clippy::too_many_arguments)]
pub async fn connect(
    spec: &UrlSpec,
    upstream_name: &str,
    session: &str,
    initialize_params: Value,
    init_timeout: Duration,
    client_authorization: Option<String>,
    tokens: Option<&Arc<TokenSource>>,
    sink: Arc<dyn PeerSink>,
) -> Result<(Arc<HttpUpstream>, Box<RawValue>), RpcError> {
    let who = format!("upstream {upstream_name} at {}", spec.url);
    let credentials = credentials(tokens, &client_authorization).await?;
    let mut options = client_options(spec, client_authorization, |var| std::env::var(var).ok())
        .map_err(|e| RpcError::internal(format!("{who}: {e}")))?;
    options.bearer = credentials.as_ref().map(|(credentials, _)| credentials.bearer());
    let mut initialize_params = Some(initialize_params);
    tether_server::trace::inject_meta(&mut initialize_params);
    let initialize_params = initialize_params.unwrap_or_default();
    // An `initialize` refused with 401 ran nothing: it goes once more with a renewed token.
    let connecting = async {
        let connected = Session::connect(&spec.url, options.clone(), initialize_params.clone()).await;
        match (&connected, &credentials) {
            (Err(ClientError::Auth { status: 401, .. }), Some((credentials, sent))) if credentials.renew(sent).await? => {
                Ok(Session::connect(&spec.url, options, initialize_params).await)
            }
            _ => Ok(connected),
        }
    };
    let (client, result) = match tokio::time::timeout(init_timeout, connecting).await {
        Ok(Ok(Ok(connected))) => connected,
        Ok(Ok(Err(e))) => {
            return Err(RpcError { message: format!("{who}: {}", describe(&e, credentials.is_some())), ..as_rpc(e) });
        }
        Ok(Err(renewal)) => return Err(renewal),
        Err(_) => {
            return Err(RpcError::internal(format!(
                "{who} did not answer initialize within {}",
                humantime::format_duration(init_timeout)
            )));
        }
    };
    let credentials = credentials.map(|(credentials, _)| credentials);
    let initialize_result = serde_json::value::to_raw_value(&result)
        .map_err(|e| RpcError::internal(format!("{who}: unreadable initialize result: {e}")))?;
    client.deliver_to(sink).await;
    let upstream = Arc::new(HttpUpstream {
        name: upstream_name.to_owned(),
        session: session.to_owned(),
        url: spec.url.clone(),
        upstream_session_id: client.session_id(),
        client: Mutex::new(Some(client)),
        alive: AtomicBool::new(true),
        credentials,
    });
    Ok((upstream, initialize_result))
}

/// A connection's credentials from the upstream's token source, with a
/// current token already in them; and that token.
async fn credentials(
    tokens: Option<&Arc<TokenSource>>,
    client_authorization: &Option<String>,
) -> Result<Option<(Credentials, String)>, RpcError> {
    let Some(tokens) = tokens else { return Ok(None) };
    let credentials = Credentials::new(tokens.clone(), client_authorization.clone());
    let token = credentials.refresh().await?;
    Ok(Some((credentials, token)))
}

/// The client runtime's options for this upstream: the configured headers,
/// and at most one `Authorization`: tether's bearer token from the
/// environment variable `auth_env`, else the client's header when
/// `forward_auth`, else none (the client's is never forwarded by default).
pub(crate) fn client_options(
    spec: &UrlSpec,
    client_authorization: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ClientOptions, String> {
    let mut headers: Vec<(String, String)> = spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut bearer_token = None;
    if let Some(var) = &spec.auth_env {
        let token = env(var).filter(|t| !t.trim().is_empty()).ok_or_else(|| {
            format!("auth_env names the environment variable {var}, which is not set (or empty) in tether's environment")
        })?;
        bearer_token = Some(token);
    } else if spec.forward_auth
        && let Some(authorization) = client_authorization
    {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
        headers.push(("Authorization".to_owned(), authorization));
    }
    Ok(ClientOptions {
        bearer_token,
        bearer: None,
        headers,
        request_timeout: REQUEST_TIMEOUT,
        max_message_bytes: spec.max_message_bytes,
    })
}

impl HttpUpstream {
    /// What [`attach`] needs to carry this upstream session on elsewhere.
    fn carry_on(&self) -> Option<Value> {
        let client = self.client.lock();
        let client = client.as_ref()?;
        let session_id = client.session_id()?;
        Some(serde_json::json!({"sessionId": session_id, "protocolVersion": client.protocol_version()}))
    }
}

/// One upstream session, as an [`Upstream`].
pub struct HttpUpstream {
    name: String,
    session: String,
    url: String,
    upstream_session_id: Option<String>,
    /// Taken when the connection dies or closes (requests then find no
    /// session; its incoming channel closes once the last one ends).
    client: Mutex<Option<Session>>,
    alive: AtomicBool,
    /// tether's own OAuth token for the upstream, refreshed before each request.
    credentials: Option<Credentials>,
}

/// A client runtime error as a JSON-RPC error: the upstream's own answer
/// as it is, anything else `-32603`.
fn as_rpc(e: ClientError) -> RpcError {
    match e {
        ClientError::Rpc(error) => error,
        other => RpcError::internal(other.to_string()),
    }
}

/// What went wrong, for a person; `oauth`: tether's credentials for the
/// upstream are its own OAuth tokens (`[upstreams.NAME.oauth]`).
fn describe(e: &ClientError, oauth: bool) -> String {
    match e {
        ClientError::Rpc(error) => format!("answered with JSON-RPC error {}: {}", error.code, error.message),
        ClientError::Auth { status, message } if oauth => format!(
            "refused tether's OAuth access token (HTTP {status}): {message}; check the upstream's oauth settings \
             (client_id, scope, resource) and what its authorization server grants that client"
        ),
        ClientError::Auth { status, message } => {
            format!("refused tether's credentials (HTTP {status}): {message}; check auth_env or forward_auth")
        }
        other => other.to_string(),
    }
}

impl HttpUpstream {
    /// The upstream's `Mcp-Session-Id` (none for a stateless server or the
    /// 2024-11-05 transport).
    pub fn upstream_session_id(&self) -> Option<String> {
        self.upstream_session_id.clone()
    }

    /// The client runtime session, with a current token in its credentials.
    async fn ready(&self) -> Result<Session, UpstreamError> {
        if let Some(credentials) = &self.credentials {
            credentials.refresh().await?;
        }
        self.client()
    }

    /// Sends one message (`send` given the session and `message`) with a
    /// current token. Refused with HTTP 401, it was not run: the token is
    /// renewed ([`Credentials::renew`]) and the message sent once more (a
    /// copy is kept for that only with OAuth credentials).
    async fn send<M, T, F, Fut>(&self, message: M, send: F) -> Result<T, UpstreamError>
    where
        M: Clone,
        F: Fn(Session, M) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let Some(credentials) = &self.credentials else {
            return send(self.client()?, message).await.map_err(|e| self.failed(e));
        };
        let sent = credentials.refresh().await?;
        let again = message.clone();
        match send(self.client()?, message).await {
            Err(refused @ ClientError::Auth { status: 401, .. }) => {
                if !credentials.renew(&sent).await? {
                    let mut error = RpcError::from(self.failed(refused));
                    error.message.push_str(&format!(
                        " (a new token was fetched less than {} ago; none is fetched again before then)",
                        humantime::format_duration(crate::credentials::RENEW_EVERY)
                    ));
                    return Err(error.into());
                }
                tracing::info!(upstream = %self.name, session = %self.session, "sending again with a renewed token");
                send(self.client()?, again).await.map_err(|e| self.failed(e))
            }
            done => done.map_err(|e| self.failed(e)),
        }
    }

    fn client(&self) -> Result<Session, UpstreamError> {
        match self.client.lock().as_ref() {
            Some(client) if self.is_alive() => Ok(client.clone()),
            _ => Err(UpstreamError::NotRunning(format!(
                "upstream {} at {}: this upstream session has ended; a new request opens another",
                self.name, self.url
            ))),
        }
    }

    /// The connection is gone: the gateway starts a new one. Lets go of
    /// the client runtime session (returned, for a `close` that ends it).
    fn die(&self) -> Option<Session> {
        self.alive.store(false, Ordering::Release);
        self.client.lock().take()
    }

    /// Maps a failure; a 404 (the upstream forgot the session) ends this connection.
    fn failed(&self, e: ClientError) -> UpstreamError {
        match e {
            ClientError::SessionNotFound => {
                tracing::info!(upstream = %self.name, session = %self.session, "the upstream at {} forgot its session (HTTP 404)", self.url);
                self.die();
                UpstreamError::ForgotSession
            }
            ClientError::Rpc(error) => error.into(),
            // OAuth credentials change in place (renewed by
            // [`HttpUpstream::send`]): the connection stays.
            e @ ClientError::Auth { .. } if self.credentials.is_some() => {
                RpcError::internal(format!("upstream {} at {}: {}", self.name, self.url, describe(&e, true))).into()
            }
            // Other credentials are taken when a connection is made: the
            // next request makes one with the current ones (a rotated token,
            // the client's newer `Authorization` with forward_auth).
            e @ ClientError::Auth { .. } => {
                self.die();
                RpcError::internal(format!("upstream {} at {}: {}", self.name, self.url, describe(&e, false))).into()
            }
            other => RpcError::internal(format!("upstream {} at {}: {}", self.name, self.url, describe(&other, false))).into(),
        }
    }
}

#[async_trait]
impl Upstream for HttpUpstream {
    async fn request(&self, method: &str, mut params: Option<Value>) -> UpstreamResult {
        // The W3C trace context of this request's span (`--otlp-endpoint`),
        // in `params._meta`; the client runtime sends it as the
        // `traceparent` header too.
        tether_server::trace::inject_meta(&mut params);
        // Dropping this future drops the client runtime's request, which
        // sends `notifications/cancelled` under the id it used upstream.
        self.send(params, |client, params| async move { client.request_json(method, params).await }).await
    }

    async fn request_tracked(&self, method: &str, mut params: Option<Value>, track: &RequestTrack) -> UpstreamResult {
        tether_server::trace::inject_meta(&mut params);
        self.send(params, |client, params| async move { client.request_json_tracked(method, params, track).await }).await
    }

    fn resumable(&self) -> bool {
        true
    }

    async fn resume(&self, request_id: Value, after: &str, messages: mpsc::Sender<PeerMessage>) -> UpstreamResult {
        let client = self.ready().await?;
        client.resume_request(request_id, after, messages).await.map_err(|e| self.failed(e))
    }

    /// `notifications/initialized` is not sent again: the client runtime
    /// sent it right after `initialize` (a server may refuse a second one).
    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        if method == "notifications/initialized" {
            return Ok(());
        }
        self.send(params, |client, params| async move { client.notify(method, params).await }).await.map_err(Into::into)
    }

    async fn answer(&self, id: Value, outcome: Result<Value, RpcError>) -> Result<(), RpcError> {
        let outcome = outcome.map_err(|e| e.to_object());
        self.send((id, outcome), |client, (id, outcome)| async move { client.respond(id, outcome).await })
            .await
            .map_err(Into::into)
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    fn present(&self, client_authorization: Option<&str>) {
        if let Some(credentials) = &self.credentials {
            credentials.present(client_authorization);
        }
    }

    /// With `end_session`, DELETEs the upstream session; else only lets go
    /// of it (another replica, or a restart, may use its ID).
    async fn close(&self, end_session: bool) {
        let Some(client) = self.die() else { return };
        if end_session {
            client.close().await;
        }
        // Dropping the last handle stops its background streams.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorization(options: &ClientOptions) -> Vec<&str> {
        let mut found: Vec<&str> = options
            .headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.as_str())
            .collect();
        if let Some(token) = &options.bearer_token {
            found.push(token);
        }
        found
    }

    #[test]
    fn the_clients_authorization_is_forwarded_only_when_asked_and_tethers_own_token_wins() {
        let env = |var: &str| (var == "REMOTE_TOKEN").then(|| "tether-secret".to_owned());
        let client = Some("Bearer client-secret".to_owned());
        let mut spec = UrlSpec::new("http://127.0.0.1:9/mcp".into());
        spec.headers.insert("X-Team".into(), "blue".into());

        let plain = client_options(&spec, client.clone(), env).unwrap();
        assert!(authorization(&plain).is_empty(), "never forwarded by default");
        assert!(plain.headers.contains(&("X-Team".into(), "blue".into())));

        spec.forward_auth = true;
        assert_eq!(authorization(&client_options(&spec, client.clone(), env).unwrap()), ["Bearer client-secret"]);
        assert!(authorization(&client_options(&spec, None, env).unwrap()).is_empty());

        spec.auth_env = Some("REMOTE_TOKEN".into());
        assert_eq!(authorization(&client_options(&spec, client.clone(), env).unwrap()), ["tether-secret"]);

        spec.auth_env = Some("MISSING".into());
        assert!(client_options(&spec, client, env).unwrap_err().contains("MISSING"));
    }
}
