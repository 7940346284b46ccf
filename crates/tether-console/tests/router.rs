//! The console's router: every file with its content type, the strict
//! Content-Security-Policy on every answer, 404 for anything else; the
//! sign-in page's policy adds exactly the valid origins its URL names.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn get(path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let app: axum::Router = tether_console::router();
    let request = Request::get(path).body(Body::empty()).unwrap_or_else(|e| panic!("{path}: {e}"));
    let response = app.oneshot(request).await.unwrap();
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
        ("/console/oauth.js", "text/javascript"),
        ("/console/sign-in.js", "text/javascript"),
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
async fn the_console_page_keeps_connect_src_self_whatever_its_url_says() {
    for path in ["/console?connect=https://as.example", "/console/?connect=https%3A%2F%2Fas.example"] {
        let (status, headers, _) = get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(
            headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap(),
            tether_console::CONTENT_SECURITY_POLICY,
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_sign_in_page_may_connect_to_the_origins_its_url_names_and_no_others() {
    let (status, headers, html) = get("/console/sign-in").await;
    assert_eq!(status, StatusCode::OK);
    assert_secured("/console/sign-in", &headers);
    assert_eq!(headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap(), tether_console::CONTENT_SECURITY_POLICY);
    assert_eq!(headers.get(header::CACHE_CONTROL).map(|v| v.as_bytes()), Some(&b"no-store"[..]), "it carries the code");
    assert_eq!(headers.get(header::REFERRER_POLICY).map(|v| v.as_bytes()), Some(&b"no-referrer"[..]));
    assert!(html.contains(r#"<script type="module" src="/console/sign-in.js"></script>"#), "{html}");
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("<style") && !html.contains(" style=") && !html.contains(" onclick="), "inline code in sign-in.html");

    let path = concat!(
        "/console/sign-in?connect=http%3A%2F%2F127.0.0.1%3A9000&code=abc&state=xyz",
        "&connect=https%3A%2F%2FToken.Example.com&connect=http%3A%2F%2F127.0.0.1%3A9000&iss=http%3A%2F%2F127.0.0.1%3A9000",
    );
    let (status, headers, _) = get(path).await;
    assert_eq!(status, StatusCode::OK);
    let csp = headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap();
    assert!(csp.contains("connect-src 'self' http://127.0.0.1:9000 https://token.example.com;"), "{csp}");
    assert_eq!(csp.matches("connect-src").count(), 1, "{csp}");
    // Everything else is the console's policy, word for word.
    assert_eq!(
        csp.replace(" http://127.0.0.1:9000 https://token.example.com", ""),
        tether_console::CONTENT_SECURITY_POLICY,
        "only connect-src changes"
    );

    // What is not one plain http(s) origin adds nothing.
    for bad in [
        "*",
        "https://*.example.com",
        "https%3A%2F%2Fa.example%20https%3A%2F%2Fb.example",
        "https%3A%2F%2Fa.example%3B%20script-src%20*",
        "https%3A%2F%2Fa.example%2Fpath",
        "%27unsafe-inline%27",
        "data%3A",
        "javascript%3Aalert(1)",
        "https%3A%2F%2Fa_b.example",
        "https%3A%2F%2Fa.example%3A99999",
        "https%3A%2F%2Fuser%40a.example",
        "https%3A",
        "%ZZ",
    ] {
        let (status, headers, _) = get(&format!("/console/sign-in?connect={bad}")).await;
        assert_eq!(status, StatusCode::OK, "{bad}");
        assert_eq!(
            headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap(),
            tether_console::CONTENT_SECURITY_POLICY,
            "connect={bad} must add nothing"
        );
    }

    // At most four.
    let many: Vec<String> = (1..=6).map(|i| format!("connect=https%3A%2F%2Fa{i}.example")).collect();
    let (_, headers, _) = get(&format!("/console/sign-in?{}", many.join("&"))).await;
    let csp = headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap();
    assert!(csp.contains("https://a4.example;") && !csp.contains("a5.example"), "{csp}");
}

#[test]
fn origins_are_checked_strictly() {
    use tether_console::origin;
    for (input, want) in [
        ("http://127.0.0.1:9000", Some("http://127.0.0.1:9000")),
        ("https://AS.Example.COM", Some("https://as.example.com")),
        ("https://xn--bcher-kva.example:8443", Some("https://xn--bcher-kva.example:8443")),
        ("http://[::1]:8080", Some("http://[::1]:8080")),
        ("http://[::1]", Some("http://[::1]")),
        ("http://localhost", Some("http://localhost")),
        ("https://as.example/", None),
        ("https://as.example:0", None),
        ("https://as.example:080", None),
        ("https://as.example:", None),
        ("https://-as.example", None),
        ("https://as..example", None),
        ("https://as.example.", None),
        ("https://[::1]x", None),
        ("https://[]", None),
        ("ftp://as.example", None),
        ("https://as.example'", None),
        ("https://as.example;", None),
        ("", None),
    ] {
        assert_eq!(origin(input).as_deref(), want, "{input:?}");
    }
}

#[tokio::test]
async fn unknown_files_are_404_with_the_same_policy() {
    for path in ["/console/nope.js", "/console/..%2fCargo.toml", "/console/app.js.map", "/console/sign-in.html"] {
        let (status, headers, _) = get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_secured(path, &headers);
    }
    let (status, _, _) = get("/console/a/b").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn get_from(app: axum::Router, path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let request = Request::get(path).body(Body::empty()).unwrap_or_else(|e| panic!("{path}: {e}"));
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// The console and the admin page, merged as `tether serve` does when the admin API is on.
fn with_admin() -> axum::Router {
    tether_console::router().merge(tether_console::admin_router())
}

#[tokio::test]
async fn the_admin_page_is_only_where_it_is_merged_with_its_files_and_a_stricter_policy() {
    // The console alone (no admin API): no admin page, none of its files.
    for path in ["/console/admin", "/console/admin/", "/console/admin/admin.js"] {
        let (status, _, _) = get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path} without the admin API");
    }
    for (path, kind) in [
        ("/console/admin", "text/html"),
        ("/console/admin/", "text/html"),
        ("/console/admin/admin.js", "text/javascript"),
        ("/console/admin/dom.js", "text/javascript"),
        ("/console/admin/api.js", "text/javascript"),
        ("/console/admin/health.js", "text/javascript"),
        ("/console/admin/sse.js", "text/javascript"),
        ("/console/admin/admin.css", "text/css"),
        ("/console/admin/favicon.svg", "image/svg+xml"),
    ] {
        let (status, headers, body) = get_from(with_admin(), path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let ty = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(ty.starts_with(kind), "{path}: {ty}");
        let csp = headers.get(header::CONTENT_SECURITY_POLICY).and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert_eq!(csp, tether_console::ADMIN_CONTENT_SECURITY_POLICY, "{path}");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "require-trusted-types-for 'script'",
            "trusted-types 'none'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp} lacks {directive}");
        }
        assert!(!csp.contains("unsafe-") && !csp.contains("data:"), "{csp}");
        assert!(!body.is_empty(), "{path} is empty");
    }
    // The console's own pages keep theirs.
    let (_, headers, _) = get_from(with_admin(), "/console/app.js").await;
    assert_eq!(headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap(), tether_console::CONTENT_SECURITY_POLICY);
    let (status, _, _) = get_from(with_admin(), "/console/admin/nope.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_admin_page_has_no_inline_code_and_never_builds_html_from_strings() {
    let (_, _, html) = get_from(with_admin(), "/console/admin").await;
    assert!(html.contains(r#"<script type="module" src="/console/admin/admin.js"></script>"#), "{html}");
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("<style") && !html.contains(" style="), "inline style in admin.html");
    for handler in [" onclick=", " onload=", " onerror=", " onsubmit=", " onchange=", "javascript:"] {
        assert!(!html.contains(handler), "inline handler {handler} in admin.html");
    }
    for script in ["admin.js", "dom.js", "api.js", "health.js"] {
        let (_, _, js) = get_from(with_admin(), &format!("/console/admin/{script}")).await;
        for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage"] {
            assert!(!js.contains(sink), "{script} uses {sink}");
        }
        let foreign = js.replace("http://www.w3.org/2000/svg", "");
        assert!(!foreign.contains("http://") && !foreign.contains("https://"), "{script} names another origin");
    }
}
