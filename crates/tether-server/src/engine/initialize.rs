//! `initialize`: a new session, or the one a resume token names.
//!
//! The application answers first; a refusal (or a panic) leaves no session
//! behind. Then a valid resume token re-attaches its session (the token is
//! spent only once the endpoint and the principal match), or a durable
//! session is created, and the answer goes out on a new stream of that
//! session with a fresh resume token.

use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value, json};
use tether_store::{SessionRecord, StoreError, now_ms};
use tether_wire::{RpcError, code, envelope, meta, revision};
use tracing::Instrument;

use super::request::RequestHead;
use super::{Engine, EngineError, PostOutcome, Refusal, Reply, Session, SessionCtx, SessionState, request, resume, unavailable};
use crate::app::{Authorized, Caller, ClientDeclaration, Initialize};
use crate::ids;

impl Engine {
    /// Handles `initialize`: the application answers it (or refuses, which
    /// leaves no session behind); then the session named by a valid resume
    /// token in `params._meta` is re-attached, or a durable session is
    /// created, and the answer goes out on a new stream of that session with
    /// a fresh resume token.
    pub async fn initialize(
        &self,
        endpoint: &str,
        principal: &str,
        id: Value,
        params: Option<Map<String, Value>>,
        reply: Reply,
        authorized: Option<Authorized>,
    ) -> Result<PostOutcome, EngineError> {
        let span = crate::trace::rpc_span("initialize", None, params.as_ref());
        self.initialize_in_span(endpoint, principal, id, params, reply, authorized).instrument(span).await
    }

    async fn initialize_in_span(
        &self,
        endpoint: &str,
        principal: &str,
        id: Value,
        params: Option<Map<String, Value>>,
        reply: Reply,
        authorized: Option<Authorized>,
    ) -> Result<PostOutcome, EngineError> {
        if self.inner.life.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let app = self.inner.apps.get(endpoint).ok_or_else(|| EngineError::UnknownEndpoint(endpoint.to_owned()))?.clone();
        let params = params.unwrap_or_default();
        let requested = match params.get("protocolVersion") {
            Some(Value::String(v)) => v.as_str(),
            _ => {
                return Err(EngineError::BadRequest {
                    code: code::INVALID_PARAMS,
                    message: "initialize needs params.protocolVersion (a string such as \"2025-11-25\")".into(),
                    id: Some(id),
                });
            }
        };
        let caller = Caller {
            principal: principal.to_owned(),
            client: Arc::new(ClientDeclaration {
                protocol_version: revision::negotiate(Some(requested)).to_owned(),
                client_info: params.get("clientInfo").cloned().unwrap_or(Value::Null),
                client_capabilities: params.get("capabilities").cloned().unwrap_or_else(|| json!({})),
            }),
        };
        // The ID a new session gets, known to the application from the start
        // (its logs carry it); a resumed session keeps its own.
        let new_id = ids::new_session_id();
        let mut init = Initialize::new(&caller, &params, authorized.as_ref(), &new_id);
        let answered = std::panic::AssertUnwindSafe(app.initialize(&mut init)).catch_unwind().await;
        let (initial_app_state, initial_local) = (std::mem::take(&mut init.app_state), init.local.take());
        let mut result = match answered {
            Ok(Ok(result)) => result,
            Ok(Err(refused)) => {
                tracing::info!(code = refused.code, message = %refused.message, "the application refused initialize");
                let body = envelope::error_message(Some(&id), &refused);
                return Ok(PostOutcome::Sessionless { body, refusal: Refusal::from(&refused) });
            }
            Err(_) => {
                tracing::error!("the application panicked answering initialize");
                let error = RpcError::internal(request::PANICKED_MESSAGE);
                let body = envelope::error_message(Some(&id), &error);
                return Ok(PostOutcome::Sessionless { body, refusal: Refusal::from(&error) });
            }
        };
        // The application may answer with another revision it speaks; the
        // session follows what the client is told.
        let version = match result.get("protocolVersion").and_then(Value::as_str) {
            Some(v) if revision::is_supported(v) => v.to_owned(),
            _ => caller.protocol_version().to_owned(),
        };
        result.insert("protocolVersion".into(), Value::String(version.clone()));
        let presented = params.get("_meta").and_then(|m| m.get(meta::SESSION_RESUME_TOKEN)).and_then(Value::as_str);

        let mut result_meta = match result.remove("_meta") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        let mut resumed = None;
        if let Some(token) = presented {
            match self.resume_session(endpoint, principal, token).await? {
                Ok(session) => resumed = Some(session),
                Err(refusal) => {
                    tracing::info!(reason = refusal.as_str(), "resume token refused; starting a fresh session");
                    result_meta.insert(meta::RESUME_REFUSED.into(), json!(refusal.as_str()));
                }
            }
        }
        let session = match resumed {
            Some(session) => {
                let ctx = SessionCtx::new(self.inner.clone(), session.clone());
                let state = ctx
                    .update_state(|s| {
                        s.client = Arc::new(ClientDeclaration { protocol_version: version.clone(), ..(*caller.client).clone() });
                        s.initialized = false;
                        s.resume_generation += 1;
                        s.app.extend(initial_app_state.clone());
                    })
                    .await
                    .map_err(unavailable)?;
                session.set_caller_from(&state);
                tracing::info!(session = %session.id, version, "session resumed with a resume token");
                result_meta.insert(meta::RESUMED.into(), json!(true));
                session
            }
            None => {
                let session = self.create_session(new_id, endpoint, &caller, &version, initial_app_state).await?;
                if presented.is_some() {
                    result_meta.insert(meta::RESUMED.into(), json!(false));
                }
                session
            }
        };
        crate::trace::record_session(&session.id);
        if let Some(local) = initial_local {
            session.set_local(local);
        }
        let generation = session.durable.lock().await.state.resume_generation;
        let key = self.inner.key.get(self.inner.store.as_ref()).await?;
        let token = self.inner.tokens.issue(self.inner.store.as_ref(), &key, &session.id, principal, generation).await?;
        result_meta.insert(meta::SESSION_RESUME_TOKEN.into(), json!(token));
        result.insert("_meta".into(), Value::Object(result_meta));
        let raw = crate::app::raw_result(&result).map_err(unavailable)?;
        self.inner
            .clone()
            .start_request(
                session,
                RequestHead { id, progress_token: None, authorized: None },
                "initialize",
                reply,
                Box::new(move |_| Box::pin(async move { Ok(raw) })),
            )
            .await
    }

    /// Spends a resume token and returns its session, or why not.
    async fn resume_session(
        &self,
        endpoint: &str,
        principal: &str,
        token: &str,
    ) -> Result<Result<Arc<Session>, resume::Refusal>, EngineError> {
        let key = self.inner.key.get(self.inner.store.as_ref()).await?;
        let store = self.inner.store.as_ref();
        let opened = match self.inner.tokens.open(store, &key, token, principal).await? {
            Ok(opened) => opened,
            Err(refusal) => return Ok(Err(refusal)),
        };
        // The endpoint before the token is spent: a token of another
        // endpoint's session is refused and stays good where it belongs.
        if self.inner.load(opened.session()).await?.is_some_and(|s| s.endpoint != endpoint) {
            return Ok(Err(resume::Refusal::Foreign));
        }
        let redeemed = match self.inner.tokens.spend(store, opened).await? {
            Ok(r) => r,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let session = match self.session(endpoint, &redeemed.session, principal).await {
            Ok(s) => s,
            Err(EngineError::SessionNotFound) => return Ok(Err(resume::Refusal::Expired)),
            Err(e) => return Err(e),
        };
        if session.durable.lock().await.state.resume_generation != redeemed.generation {
            return Ok(Err(resume::Refusal::Used));
        }
        Ok(Ok(session))
    }

    async fn create_session(
        &self,
        id: String,
        endpoint: &str,
        caller: &Caller,
        version: &str,
        app: Map<String, Value>,
    ) -> Result<Arc<Session>, EngineError> {
        self.inner.admit_session(&caller.principal).await?;
        let state = SessionState {
            client: Arc::new(ClientDeclaration { protocol_version: version.to_owned(), ..(*caller.client).clone() }),
            standalone_stream: ids::new_standalone_stream(),
            initialized: false,
            resume_generation: 0,
            app,
            endpoint: endpoint.to_owned(),
        };
        let now = now_ms();
        let record = SessionRecord {
            id,
            principal: caller.principal.clone(),
            created_at_ms: now,
            expires_at_ms: self.inner.expiry_from(now),
            revision: 0,
            state: serde_json::to_value(&state).map_err(|e| StoreError::Backend(e.to_string()))?,
        };
        self.inner.store.create_session(&record).await?;
        let session = Arc::new(Session::new(record.id.clone(), record.principal.clone(), 0, state, record.expires_at_ms));
        self.inner.cache(session.clone());
        tracing::info!(session = %session.id, version, "session created");
        Ok(session)
    }
}
