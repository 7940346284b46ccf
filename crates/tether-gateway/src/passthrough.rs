//! The 2026-07-28 era passed through: a sessionless client of an upstream
//! that speaks that revision too (found with `server/discover`, remembered
//! per upstream) has each request forwarded as it sent it. The upstream
//! sees the real client: its own `_meta` (declared capabilities, client
//! info, log level, progress token), never widened; an `input_required`
//! result (`inputRequests`, `requestState`) goes back to the client as the
//! upstream wrote it, and the client's `inputResponses` up again; Tasks are
//! the upstream's; the client's `Mcp-Param-*` headers go along (the
//! upstream checks them against the body). Only tether's own `_meta` keys
//! stay behind.
//!
//! What the upstream sends on a request's own stream (progress, log
//! messages) goes to that request's client alone, in order, before its
//! answer ([`Session::request_json_with_sink`]). A sessionless server asks
//! through results, not requests: a request of the upstream is refused.
//!
//! Only a URL upstream is passed through; a stdio server, and a URL server
//! of the session era, are bridged (see `sessionless`).
//!
//! With tether's own OAuth token, a request the upstream refuses with HTTP
//! 401 (it ran nothing) is sent once more with a renewed token
//! ([`TokenSource::renew`]).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tether_client::{ClientError, PeerMessage, Session};
use tether_server::{Authorized, RawResult, RequestCtx, RpcError};
use tether_wire::{code, meta};
use tokio::sync::mpsc;

use std::sync::Arc;

use crate::config::UrlSpec;
use crate::connector::Passthrough;
use crate::credentials::TokenSource;

/// Messages of one request's stream waiting to be relayed.
const STREAM_BUFFER: usize = 64;

/// A 2026-07-28 URL upstream, for sessionless clients.
pub(crate) struct UrlPassthrough {
    name: String,
    spec: UrlSpec,
    /// tether's own OAuth tokens for the upstream, if it has `oauth`.
    tokens: Option<Arc<TokenSource>>,
    /// Requests without the client's own credentials share this client.
    shared: Session,
}

impl UrlPassthrough {
    /// The upstream, if its `server/discover` names the sessionless
    /// revision; with what it says of itself (as an `initialize` result).
    pub(crate) async fn discover(
        spec: &UrlSpec,
        name: &str,
        tokens: Option<Arc<TokenSource>>,
        timeout: Duration,
    ) -> Option<(Self, Map<String, Value>)> {
        let token = match &tokens {
            Some(tokens) if !tokens.per_caller() => Some(tokens.token(None).await.ok()?),
            _ => None,
        };
        let shared = session(spec, None, token).ok()?;
        let described = crate::sessionless_url::discover(&shared, timeout).await?;
        tracing::info!(upstream = %name, url = %spec.url, "the upstream speaks 2026-07-28: its sessionless clients are passed through");
        Some((Self { name: name.to_owned(), spec: spec.clone(), tokens, shared }, described))
    }

    /// Sends one request on `client`, relaying what comes on its stream.
    async fn forward(
        &self,
        ctx: &RequestCtx,
        client: &Session,
        method: &str,
        params: Option<Value>,
    ) -> Result<RawResult, ClientError> {
        let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
        let timer = tether_server::metrics::upstream_request_started();
        // Dropping this future closes the request's HTTP response: how a
        // sessionless server hears of a cancellation.
        let call = client.request_json_with_sink(method, params, &tx, ctx.param_headers());
        let mut call = std::pin::pin!(call);
        let result = loop {
            tokio::select! {
                biased;
                Some(message) = rx.recv() => self.relay(ctx, client, message).await,
                result = &mut call => break result,
            }
        };
        while let Ok(message) = rx.try_recv() {
            self.relay(ctx, client, message).await;
        }
        timer.done(&self.name);
        result
    }

    /// One message of the upstream on a request's stream, to its client.
    async fn relay(&self, ctx: &RequestCtx, client: &Session, message: PeerMessage) {
        match message {
            PeerMessage::Notification { method, params } => {
                if let Err(e) = ctx.notify(&method, params).await {
                    tracing::debug!(upstream = %self.name, %method, error = %e.message, "an upstream notification did not reach its client");
                }
            }
            PeerMessage::Request { id, method, .. } => {
                let refused = json!({"code": code::METHOD_NOT_FOUND,
                    "message": format!("{method}: a 2026-07-28 server asks its client through an input_required result")});
                if let Err(e) = client.respond(id, Err(refused)).await {
                    tracing::debug!(upstream = %self.name, %method, error = %e, "could not refuse the upstream's request");
                }
            }
        }
    }

    fn failed(&self, e: ClientError) -> RpcError {
        match e {
            ClientError::Rpc(error) => error,
            other => RpcError::internal(format!("upstream {} at {}: {other}", self.name, self.spec.url)),
        }
    }
}

#[async_trait]
impl Passthrough for UrlPassthrough {
    /// Forwards one request of a sessionless client as it sent it.
    async fn request(&self, ctx: &RequestCtx, method: &str, mut params: Map<String, Value>) -> Result<RawResult, RpcError> {
        if let Some(Value::Object(m)) = params.get_mut("_meta") {
            m.retain(|k, _| !k.starts_with(meta::TETHER_PREFIX));
        }
        let presented = ctx.authorized().and_then(Authorized::bearer_token).map(crate::link::bearer_header);
        let mut params = Some(Value::Object(params));
        tether_server::trace::inject_meta(&mut params);
        let (client, token) = match (&self.tokens, self.spec.forward_auth) {
            // tether's own token, current for this caller (a cache hit while good).
            (Some(tokens), _) => {
                let token = tokens.token(presented.as_deref()).await?;
                (session(&self.spec, None, Some(token.clone())).map_err(|e| self.failed(e))?, Some((tokens, token)))
            }
            (None, true) if presented.is_some() => {
                (session(&self.spec, presented.clone(), None).map_err(|e| self.failed(e))?, None)
            }
            _ => (self.shared.clone(), None),
        };
        let Some((tokens, sent)) = token else {
            return self.forward(ctx, &client, method, params).await.map_err(|e| self.failed(e));
        };
        let again = params.clone();
        match self.forward(ctx, &client, method, params).await {
            // Refused with 401: the upstream ran nothing.
            Err(refused @ ClientError::Auth { status: 401, .. }) => {
                let Some(token) = tokens.renew(presented.as_deref(), &sent).await? else { return Err(self.failed(refused)) };
                tracing::info!(upstream = %self.name, "sending again with a renewed token");
                let client = session(&self.spec, None, Some(token)).map_err(|e| self.failed(e))?;
                self.forward(ctx, &client, method, again).await.map_err(|e| self.failed(e))
            }
            done => done.map_err(|e| self.failed(e)),
        }
    }
}

/// A sessionless client of the upstream that declares nothing of its own:
/// every request carries its client's declarations in `_meta`. `token`:
/// tether's own OAuth access token for it.
fn session(spec: &UrlSpec, client_authorization: Option<String>, token: Option<String>) -> Result<Session, ClientError> {
    let mut options =
        crate::http::client_options(spec, client_authorization, |var| std::env::var(var).ok()).map_err(ClientError::Transport)?;
    if token.is_some() {
        options.bearer_token = token;
    }
    let client_info = json!({"name": "tether-gateway", "version": env!("CARGO_PKG_VERSION")});
    Session::sessionless(&spec.url, options, client_info, json!({}))
}
