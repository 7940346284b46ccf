//! OpenTelemetry spans (`--otlp-endpoint`): one per HTTP request and one per
//! JSON-RPC request, as `tracing` spans of the target [`TARGET`] that the
//! binary's `tracing-opentelemetry` layer exports (and its log layer leaves
//! out). The W3C trace context comes in from the `traceparent`/`tracestate`
//! headers or from a request's `params._meta` (2026-07-28 and stdio carry it
//! there) and goes on to upstreams in `params._meta` (see [`inject_meta`]).
//!
//! Off unless [`set_enabled`] was called: then no span is made (the spans
//! are `Span::none()`), nothing is read from or written to a request, and
//! the HTTP layer is not installed.
//!
//! Attributes are closed names with values the server chose or the client
//! named in its envelope (method, session ID, endpoint, status, error
//! code); never a token, a header's value or a request's arguments.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use serde_json::{Map, Value};
use tether_wire::{RpcError, headers, meta};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The `tracing` target of the spans that are exported (and only of them);
/// no module's path, so no log event shares it.
pub const TARGET: &str = "tether_spans";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the spans on (the binary does, with `--otlp-endpoint`, after it
/// installed the exporting layer and the W3C propagator).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether spans are made.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Request paths no span is made for: probes and scrapes, which would
/// drown the requests people trace.
const UNTRACED: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// The span of one HTTP request, its parent taken from the W3C headers.
pub(crate) fn http_span(method: &axum::http::Method, path: &str, request_headers: &HeaderMap) -> Span {
    if !enabled() || UNTRACED.contains(&path) {
        return Span::none();
    }
    // The route, not the path: `/mcp/{endpoint}` names a configured upstream
    // or a 404; other paths (console, admin) go by their method only.
    let name = if path == "/mcp" {
        format!("{method} /mcp")
    } else if path.starts_with("/mcp/") {
        format!("{method} /mcp/{{endpoint}}")
    } else {
        method.to_string()
    };
    let span = tracing::info_span!(
        target: "tether_spans",
        "http.request",
        otel.name = %name,
        otel.kind = "server",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = Empty,
        otel.status_code = Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderCarrier(request_headers)));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// Records the status of the response on an HTTP span (5xx: an error).
pub(crate) fn http_status(span: &Span, status: u16) {
    // As i64: the OpenTelemetry bridge records unsigned integers as strings.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// The span of one JSON-RPC request, a child of the current span (its HTTP
/// request's), or of the trace context in `params._meta` when that belongs
/// to another trace (a 2026-07-28 client that sent no headers).
pub(crate) fn rpc_span(method: &str, session: Option<&str>, params: Option<&Map<String, Value>>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "tether_spans",
        "rpc.request",
        otel.name = %method,
        rpc.system = "jsonrpc",
        rpc.method = %method,
        mcp.session = Empty,
        mcp.upstream = Empty,
        rpc.jsonrpc.error_code = Empty,
        otel.status_code = Empty,
    );
    if let Some(session) = session {
        span.record("mcp.session", session);
    }
    if let Some(request_meta) = params.and_then(|p| p.get("_meta")).and_then(Value::as_object) {
        let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetaCarrier(request_meta)));
        let remote = parent.span().span_context().clone();
        let current = Span::current().context().span().span_context().trace_id();
        if remote.is_valid() && remote.trace_id() != current {
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// Names the session on the current JSON-RPC span (`initialize` learns it late).
pub fn record_session(session: &str) {
    if enabled() {
        Span::current().record("mcp.session", session);
    }
}

/// Names the gateway upstream that serves the current JSON-RPC request.
pub fn record_upstream(upstream: &str) {
    if enabled() {
        Span::current().record("mcp.upstream", upstream);
    }
}

/// Records a JSON-RPC error answer on the current span.
pub(crate) fn record_error(error: &RpcError) {
    if enabled() {
        let span = Span::current();
        span.record("rpc.jsonrpc.error_code", error.code);
        span.record("otel.status_code", "ERROR");
    }
}

/// Puts the current span's W3C trace context in `params._meta`
/// (`traceparent`, and `tracestate` if any) of a request going upstream,
/// replacing what the client had there; the client runtime repeats them as
/// headers for an HTTP upstream. Does nothing when spans are off, or when
/// `params` is not an object (or absent and there is nothing to add).
pub fn inject_meta(params: &mut Option<Value>) {
    if !enabled() {
        return;
    }
    let cx = Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let mut fields = Fields::default();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut fields));
    let Some(traceparent) = fields.traceparent else { return };
    let params = params.get_or_insert_with(|| Value::Object(Map::new()));
    let Some(params) = params.as_object_mut() else { return };
    let request_meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    let Some(request_meta) = request_meta.as_object_mut() else { return };
    request_meta.insert(meta::TRACEPARENT.into(), Value::String(traceparent));
    match fields.tracestate {
        Some(state) => request_meta.insert(meta::TRACESTATE.into(), Value::String(state)),
        None => request_meta.remove(meta::TRACESTATE),
    };
}

/// The W3C fields of a request's headers.
struct HeaderCarrier<'a>(&'a HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            headers::TRACEPARENT | headers::TRACESTATE => self.0.get(key).and_then(|v| v.to_str().ok()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![headers::TRACEPARENT, headers::TRACESTATE]
    }
}

/// The W3C fields of a request's `_meta`.
struct MetaCarrier<'a>(&'a Map<String, Value>);

impl Extractor for MetaCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            meta::TRACEPARENT | meta::TRACESTATE => self.0.get(key).and_then(Value::as_str),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![meta::TRACEPARENT, meta::TRACESTATE]
    }
}

/// What the propagator writes: the two W3C fields, nothing else.
#[derive(Default)]
struct Fields {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for Fields {
    fn set(&mut self, key: &str, value: String) {
        match key {
            headers::TRACEPARENT => self.traceparent = Some(value),
            headers::TRACESTATE if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

/// Spans for HTTP requests: a plain tower layer (like the request counter in
/// `http/ops.rs`), installed only when spans are on.
#[derive(Clone, Copy)]
pub(crate) struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner }
    }
}

#[derive(Clone)]
pub(crate) struct Traced<S> {
    inner: S,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Traced<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::response::Response>,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let span = http_span(request.method(), request.uri().path(), request.headers());
        let inner = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        TracedFuture { inner, span }
    }
}

pin_project_lite::pin_project! {
    pub(crate) struct TracedFuture<F> {
        #[pin]
        inner: F,
        span: Span,
    }
}

impl<F, E> std::future::Future for TracedFuture<F>
where
    F: std::future::Future<Output = Result<axum::response::Response, E>>,
{
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = self.project();
        let out = {
            let _entered = this.span.enter();
            std::task::ready!(this.inner.poll(cx))
        };
        if let Ok(response) = &out {
            http_status(this.span, response.status().as_u16());
        }
        std::task::Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_w3c_fields_are_read_from_meta_and_headers_only() {
        let mut m = Map::new();
        m.insert("traceparent".into(), Value::String("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()));
        m.insert("progressToken".into(), Value::from(3));
        let carrier = MetaCarrier(&m);
        assert_eq!(carrier.get("traceparent"), Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        assert_eq!(carrier.get("progressToken"), None);
        let mut h = HeaderMap::new();
        h.insert("traceparent", "x".parse().unwrap());
        h.insert("authorization", "Bearer secret".parse().unwrap());
        let carrier = HeaderCarrier(&h);
        assert_eq!(carrier.get("traceparent"), Some("x"));
        assert_eq!(carrier.get("authorization"), None);
    }

    #[test]
    fn nothing_is_injected_while_spans_are_off() {
        let mut params = Some(serde_json::json!({"name": "t"}));
        inject_meta(&mut params);
        assert_eq!(params, Some(serde_json::json!({"name": "t"})));
        let mut none = None;
        inject_meta(&mut none);
        assert_eq!(none, None);
    }
}
