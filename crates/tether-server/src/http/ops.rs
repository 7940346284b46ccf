//! What operators use: `GET /readyz`, `GET /metrics` (Prometheus text) and
//! the middleware that counts HTTP requests. None needs a token.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::engine::Engine;
use crate::metrics;

/// How long `/readyz` and the stored-sessions gauge wait for the store.
const STORE_WAIT: Duration = Duration::from_secs(2);

/// `GET /readyz`: 200 when the store answers and the server takes work;
/// 503 with a reason while it drains (SIGTERM) or the store does not answer.
/// (The listener opens only once the store is open, so "starting" is never
/// seen on it.)
pub(super) async fn readyz(State(state): State<super::AppState>) -> Response {
    let engine = &state.engine;
    let store = super::store_kind(engine.store().as_ref());
    let unavailable = |reason: String| {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "unavailable", "store": store, "reason": reason})))
    };
    if engine.shutdown_token().is_cancelled() {
        return unavailable("draining: the server is shutting down and takes no new work".into()).into_response();
    }
    match tokio::time::timeout(STORE_WAIT, engine.health()).await {
        Ok(Ok(())) => {
            let mut body = json!({"status": "ready", "store": store});
            if let Some(durability) = engine.store().durability() {
                body["durability"] = json!(durability);
            }
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Ok(Err(e)) => unavailable(format!("the store does not answer: {e}")).into_response(),
        Err(_) => unavailable(format!("the store did not answer within {STORE_WAIT:?}")).into_response(),
    }
}

/// `GET /metrics` in the Prometheus text format.
pub fn metrics_router(engine: Engine) -> Router {
    Router::new().route("/metrics", get(render)).with_state(engine)
}

async fn render(State(engine): State<Engine>) -> Response {
    let now = tether_store::now_ms();
    if metrics::stored_sessions_due(now) {
        match tokio::time::timeout(STORE_WAIT, engine.store().count_all_sessions(now)).await {
            Ok(Ok(n)) => metrics::set_stored_sessions(n),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not count the stored sessions for /metrics"),
            Err(_) => tracing::warn!("the store did not count the sessions in time for /metrics"),
        }
    }
    let body = metrics::render(engine.cached_sessions());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

/// Counts every answered request by method and status: a plain tower layer
/// (`axum::middleware::from_fn` boxes a future and clones the route per request).
#[derive(Clone, Copy)]
pub(super) struct CountLayer;

impl<S> tower::Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count { inner }
    }
}

#[derive(Clone)]
pub(super) struct Count<S> {
    inner: S,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Count<S>
where
    S: tower::Service<axum::http::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let method = request.method().clone();
        Counted { inner: self.inner.call(request), method }
    }
}

pin_project_lite::pin_project! {
    pub(super) struct Counted<F> {
        #[pin]
        inner: F,
        method: axum::http::Method,
    }
}

impl<F, E> std::future::Future for Counted<F>
where
    F: std::future::Future<Output = Result<Response, E>>,
{
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &out {
            metrics::http_request(this.method, response.status().as_u16());
        }
        std::task::Poll::Ready(out)
    }
}
