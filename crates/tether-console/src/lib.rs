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
//!
//! Signing in at an OAuth authorization server (when `/mcp` answers 401 with
//! a `resource_metadata` challenge) happens on a page of its own,
//! `/console/sign-in`: it is the only page that talks to another origin (the
//! authorization server's metadata, registration and token endpoints). This
//! crate does not know the authorization servers (they are tether's
//! `--oauth-issuer` flags, read elsewhere), so the page names the origins it
//! needs in its own URL (`?connect=ORIGIN`, from tether's protected resource
//! metadata) and gets exactly those added to `connect-src`; its script talks
//! only to origins that tether's metadata names, and it shows nothing it did
//! not write itself. The console page, which shows what servers return,
//! keeps `connect-src 'self'`.
//!
//! The operators' page, `/console/admin` ([`admin_router`]), is served only
//! when the admin API is on (tether merges it with the admin routes). It
//! talks only to its own origin (`/admin/*` with the admin token in a
//! header, `/metrics`), and its policy is stricter still: nothing but its
//! own files, no `data:` images, and Trusted Types required, so no string
//! can reach an HTML sink (`innerHTML` and the like throw): every name a
//! client or an upstream chose is shown as text.

use axum::Router;
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy on every console response. `img-src data:` lets a tool's image
/// result (base64 in the JSON) be shown; nothing else leaves the origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The admin page's policy: its own files only, and Trusted Types with no
/// policy, so the page cannot turn a string into HTML or script.
pub const ADMIN_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; \
     require-trusted-types-for 'script'; trusted-types 'none'";

/// The path the page is served at.
pub const PATH: &str = "/console";

/// The admin page's path; its files are under `/console/admin/`.
pub const ADMIN_PATH: &str = "/console/admin";

/// The sign-in page (also the OAuth `redirect_uri`).
pub const SIGN_IN_PATH: &str = "/console/sign-in";

/// At most this many origins are added to the sign-in page's `connect-src`
/// (an authorization server's issuer, token and registration endpoints).
pub const MAX_CONNECT_ORIGINS: usize = 4;

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset =
    Asset { name: "index.html", content_type: "text/html; charset=utf-8", body: include_str!("../web/index.html") };

const SIGN_IN: Asset =
    Asset { name: "sign-in.html", content_type: "text/html; charset=utf-8", body: include_str!("../web/sign-in.html") };

/// Everything under `/console/`. The page loads them by absolute path.
const ASSETS: &[Asset] = &[
    INDEX,
    Asset { name: "console.css", content_type: "text/css; charset=utf-8", body: include_str!("../web/console.css") },
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/app.js") },
    Asset { name: "mcp.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/mcp.js") },
    Asset { name: "sse.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/sse.js") },
    Asset { name: "form.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/form.js") },
    Asset { name: "store.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/store.js") },
    Asset { name: "oauth.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/oauth.js") },
    Asset { name: "sign-in.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/sign-in.js") },
    Asset { name: "favicon.svg", content_type: "image/svg+xml", body: include_str!("../web/favicon.svg") },
];

const ADMIN_INDEX: Asset =
    Asset { name: "admin.html", content_type: "text/html; charset=utf-8", body: include_str!("../web/admin.html") };

/// Everything under `/console/admin/`.
const ADMIN_ASSETS: &[Asset] = &[
    ADMIN_INDEX,
    Asset { name: "admin.css", content_type: "text/css; charset=utf-8", body: include_str!("../web/admin.css") },
    Asset { name: "admin.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/admin.js") },
    Asset { name: "dom.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/admin/dom.js") },
    Asset { name: "api.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/admin/api.js") },
    Asset { name: "health.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/admin/health.js") },
    Asset { name: "sse.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../web/sse.js") },
    Asset { name: "favicon.svg", content_type: "image/svg+xml", body: include_str!("../web/favicon.svg") },
];

/// `GET /console/admin` and `GET /console/admin/ASSET`: the operators'
/// page. Merge it only where the admin API is on. Needs no token to load:
/// the operator types it into the page, which sends it in a header.
pub fn admin_router() -> Router {
    Router::new()
        .route(ADMIN_PATH, get(admin_index))
        .route("/console/admin/", get(admin_index))
        .route("/console/admin/{asset}", get(admin_asset))
}

async fn admin_index() -> Response {
    admin_respond(&ADMIN_INDEX)
}

async fn admin_asset(Path(name): Path<String>) -> Response {
    match ADMIN_ASSETS.iter().find(|a| a.name == name) {
        Some(a) => admin_respond(a),
        None => {
            let mut response = (StatusCode::NOT_FOUND, "no such admin page file\n").into_response();
            secure_with(&mut response, ADMIN_CONTENT_SECURITY_POLICY);
            response
        }
    }
}

fn admin_respond(asset: &Asset) -> Response {
    let mut response =
        (StatusCode::OK, [(header::CONTENT_TYPE, asset.content_type), (header::CACHE_CONTROL, "no-cache")], asset.body)
            .into_response();
    secure_with(&mut response, ADMIN_CONTENT_SECURITY_POLICY);
    response
}

/// `GET /console`, `GET /console/`, `GET /console/sign-in` and `GET
/// /console/ASSET`. Needs no token: the page holds none; the person types it
/// (or signs in) and the page sends it on its MCP requests only.
pub fn router() -> Router {
    Router::new()
        .route(PATH, get(index))
        .route("/console/", get(index))
        .route(SIGN_IN_PATH, get(sign_in))
        .route("/console/{asset}", get(asset))
}

async fn index() -> Response {
    respond(&INDEX)
}

/// The sign-in page, with the origins its URL names (`connect=ORIGIN`,
/// repeated) added to `connect-src`; anything that is not a plain http(s)
/// origin is left out. Never cached: its URL carries the authorization code
/// on the way back.
async fn sign_in(RawQuery(query): RawQuery) -> Response {
    let origins = connect_origins(query.as_deref().unwrap_or(""));
    let mut response = respond(&SIGN_IN);
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(policy) = HeaderValue::from_str(&sign_in_policy(&origins)) {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    response
}

/// The console's policy with `origins` added to `connect-src`, nothing else changed.
pub fn sign_in_policy(origins: &[String]) -> String {
    let mut connect = String::from("connect-src 'self'");
    for origin in origins {
        connect.push(' ');
        connect.push_str(origin);
    }
    CONTENT_SECURITY_POLICY.replacen("connect-src 'self'", &connect, 1)
}

/// The distinct valid origins of the `connect` parameters of `query`, at
/// most [`MAX_CONNECT_ORIGINS`].
pub fn connect_origins(query: &str) -> Vec<String> {
    let mut origins: Vec<String> = Vec::new();
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix("connect=") else { continue };
        let Some(origin) = percent_decode(value).and_then(|v| origin(&v)) else { continue };
        if !origins.contains(&origin) {
            origins.push(origin);
        }
        if origins.len() == MAX_CONNECT_ORIGINS {
            break;
        }
    }
    origins
}

/// `application/x-www-form-urlencoded` decoding of one value; `None` if it
/// is not valid UTF-8 or has a broken escape.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// `value` as a CSP source for exactly one origin: `http` or `https`, a host
/// of DNS labels (letters, digits, hyphens) or an IPv6 literal in brackets,
/// an optional port; lower-cased. Anything else (a path, a wildcard, a
/// quote, a space, another scheme) is refused.
pub fn origin(value: &str) -> Option<String> {
    let value = value.to_ascii_lowercase();
    let rest = value.strip_prefix("https://").or_else(|| value.strip_prefix("http://"))?;
    let (host, port) = match rest.strip_prefix('[') {
        // An IPv6 literal: `[hex:...]` then nothing or `:PORT`.
        Some(v6) => {
            let (inside, after) = v6.split_once(']')?;
            if inside.is_empty() || !inside.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
                return None;
            }
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (None, port)
        }
        None => match rest.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(rest), None),
        },
    };
    if let Some(host) = host {
        let label = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.len() > 253 || !host.split('.').all(label) {
            return None;
        }
    }
    if let Some(port) = port {
        let digits = (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()) && !port.starts_with('0');
        if !digits || port.parse::<u32>().ok()? > 65_535 {
            return None;
        }
    }
    Some(value)
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
    secure_with(response, CONTENT_SECURITY_POLICY);
}

fn secure_with(response: &mut Response, policy: &'static str) {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}
