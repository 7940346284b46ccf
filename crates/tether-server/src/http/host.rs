//! [`HostLayer`]: the `Host` allow-list of every route (`/mcp`, the health
//! routes, `/metrics`, the console, the metadata), against DNS rebinding: a
//! page of another site that made its name resolve to 127.0.0.1 sends
//! same-origin requests without an `Origin` header, but with its own name
//! in `Host`.
//!
//! The list is the loopback names (`localhost`, `127.0.0.1`, `[::1]`: a
//! rebinding page never carries them, its `Host` is its own name), the
//! `--allowed-host` names and `--public-url`'s host; bound elsewhere than
//! loopback with no `--allowed-host`, no list is kept (a warning at start
//! says so). So a container's health check on 127.0.0.1 always passes. A request whose `Host` (its name, any port) is not on the
//! list gets 421 Misdirected Request before any route runs. A plain tower
//! layer: no boxed future per request.

use std::sync::Arc;

use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::{Either, Ready, ready};

/// The names a request's `Host` may carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    /// The loopback names, and `extra` (host names, lowercased; a port is ignored).
    pub fn loopback_and(extra: &[String]) -> Self {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"].iter().map(|s| (*s).to_owned()).collect();
        names.extend(extra.iter().map(|h| name_of(h).to_ascii_lowercase()));
        names.dedup();
        Self(names)
    }

    fn allows(&self, host: &str) -> bool {
        let name = name_of(host);
        self.0.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
    }
}

/// A `Host` value's name, without its port (`[::1]:80` is `[::1]`).
fn name_of(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(name, _)| name)
}

/// Checks `Host` against the list before the routes (none: no check).
#[derive(Clone)]
pub(crate) struct HostLayer(pub Option<Arc<AllowedHosts>>);

impl<S> tower::Layer<S> for HostLayer {
    type Service = HostCheck<S>;

    fn layer(&self, inner: S) -> HostCheck<S> {
        HostCheck { inner, allowed: self.0.clone() }
    }
}

#[derive(Clone)]
pub(crate) struct HostCheck<S> {
    inner: S,
    allowed: Option<Arc<AllowedHosts>>,
}

impl<S, B> tower::Service<Request<B>> for HostCheck<S>
where
    S: tower::Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(allowed) = &self.allowed else { return Either::Right(self.inner.call(request)) };
        let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).or_else(|| request.uri().host());
        match host {
            Some(host) if allowed.allows(host) => Either::Right(self.inner.call(request)),
            Some(host) => Either::Left(ready(Ok(refused(&format!(
                "Host `{}` is not one this server answers to; reach it by a name it is set up for (--allowed-host)",
                name_of(host)
            ))))),
            None => Either::Left(ready(Ok(refused("a request needs a Host header")))),
        }
    }
}

fn refused(message: &str) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": tether_wire::code::INVALID_REQUEST, "message": message}});
    (StatusCode::MISDIRECTED_REQUEST, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_matched_by_its_name_whatever_the_port() {
        let loopback = AllowedHosts::loopback_and(&["MCP.example.com:443".into()]);
        for ok in ["localhost", "localhost:8787", "127.0.0.1:1", "[::1]:8787", "[::1]", "mcp.example.com", "Mcp.Example.Com:80"] {
            assert!(loopback.allows(ok), "{ok}");
        }
        for refused in ["evil.example", "evil.example:8787", "127.0.0.2:8787", "localhost.evil.example", "[::2]:1", ""] {
            assert!(!loopback.allows(refused), "{refused}");
        }
    }
}
