//! The web console: a page served at `/console` that speaks MCP's Streamable
//! HTTP to this server's `/mcp` endpoints from the browser, and whose calls
//! survive a page refresh and a server restart (it re-attaches to each open
//! request stream with `GET` + `Last-Event-ID`).
//!
//! The page is plain ES modules and CSS written by hand, embedded with
//! `include_str!`: there is no front-end build step, so `cargo build` needs
//! no Node and there is no generated output that could go stale.
//!
//! Every response carries a strict Content-Security-Policy (no inline script
//! or style, `connect-src 'self'`) and `frame-ancestors 'none'`.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy on every console response. `img-src data:` lets a tool's image
/// result (base64 in the JSON) be shown; nothing else leaves the origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The path the page is served at.
pub const PATH: &str = "/console";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset =
    Asset { name: "index.html", content_type: "text/html; charset=utf-8", body: include_str!("../web/index.html") };

/// Everything under `/console/`. The page loads them by absolute path.
const ASSETS: &[Asset] = &[
    INDEX,
    Asset { name: "console.css", content_type: "text/css; charset=utf-8", body: include_str!("../web/console.css") },
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/app.js") },
    Asset { name: "mcp.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/mcp.js") },
    Asset { name: "sse.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/sse.js") },
    Asset { name: "form.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/form.js") },
    Asset { name: "store.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/store.js") },
    Asset { name: "favicon.svg", content_type: "image/svg+xml", body: include_str!("../web/favicon.svg") },
];

/// `GET /console`, `GET /console/` and `GET /console/ASSET`. Needs no token:
/// the page holds none; the person types it and the page sends it on its MCP
/// requests only.
pub fn router() -> Router {
    Router::new().route(PATH, get(index)).route("/console/", get(index)).route("/console/{asset}", get(asset))
}

async fn index() -> Response {
    respond(&INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => respond(a),
        None => {
            let mut response = (StatusCode::NOT_FOUND, "no such console file\n").into_response();
            secure(&mut response);
            response
        }
    }
}

fn respond(asset: &Asset) -> Response {
    let mut response =
        (StatusCode::OK, [(header::CONTENT_TYPE, asset.content_type), (header::CACHE_CONTROL, "no-cache")], asset.body)
            .into_response();
    secure(&mut response);
    response
}

fn secure(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}
