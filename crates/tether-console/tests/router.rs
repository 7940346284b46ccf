//! The console's router: every file with its content type, the strict
//! Content-Security-Policy on every answer, 404 for anything else.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn get(path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let app: axum::Router = tether_console::router();
    let response = app.oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

fn assert_secured(path: &str, headers: &axum::http::HeaderMap) {
    let csp = headers.get(header::CONTENT_SECURITY_POLICY).and_then(|v| v.to_str().ok()).unwrap_or_default();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{path}: CSP `{csp}` lacks `{directive}`");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{path}: CSP allows inline code: {csp}");
    assert_eq!(headers.get(header::X_CONTENT_TYPE_OPTIONS).map(|v| v.as_bytes()), Some(&b"nosniff"[..]), "{path}");
}

#[tokio::test]
async fn the_page_and_its_files_are_served_with_their_types_and_a_strict_policy() {
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/", "text/html"),
        ("/console/index.html", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/mcp.js", "text/javascript"),
        ("/console/sse.js", "text/javascript"),
        ("/console/form.js", "text/javascript"),
        ("/console/store.js", "text/javascript"),
        ("/console/console.css", "text/css"),
        ("/console/favicon.svg", "image/svg+xml"),
    ] {
        let (status, headers, body) = get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let ty = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(ty.starts_with(kind), "{path}: content type {ty}, wanted {kind}");
        assert_eq!(headers.get(header::CACHE_CONTROL).map(|v| v.as_bytes()), Some(&b"no-cache"[..]), "{path}");
        assert_secured(path, &headers);
        assert!(!body.is_empty(), "{path} is empty");
    }
}

#[tokio::test]
async fn the_page_has_no_inline_script_or_style_and_loads_only_its_own_files() {
    let (_, _, html) = get("/console").await;
    assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#), "{html}");
    // Every <script> has a src; no style attribute or <style> element (the CSP would block them).
    assert_eq!(html.matches("<script").count(), html.matches("<script type=\"module\" src=\"/console/").count());
    assert!(!html.contains("<style") && !html.contains(" style="), "inline style in index.html");
    assert!(!html.contains(" onclick=") && !html.contains("javascript:"), "inline handler in index.html");
}

#[tokio::test]
async fn unknown_files_are_404_with_the_same_policy() {
    for path in ["/console/nope.js", "/console/..%2fCargo.toml", "/console/app.js.map"] {
        let (status, headers, _) = get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_secured(path, &headers);
    }
    let (status, _, _) = get("/console/a/b").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
