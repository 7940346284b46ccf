//! `tether serve` serves the web console at /console (no token needed to load
//! it, a strict Content-Security-Policy) unless `--no-console`; /mcp is the
//! same either way. The page itself is tested in a browser by
//! `console/tests/run.sh`.

mod support;

use support::start_binary;

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn base(mcp_url: &str) -> String {
    mcp_url.strip_suffix("/mcp").unwrap_or(mcp_url).to_owned()
}

#[tokio::test]
async fn the_console_is_served_by_default_with_auth_on_and_turned_off_by_no_console() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "console-test-token-0123456789 alice\n").unwrap();
    let (child, url) = start_binary(&dir.path().join("a.db"), &["--auth-tokens", tokens.to_str().unwrap()]);
    let _on = Killed(child);
    let http = reqwest::Client::new();
    let page = http.get(format!("{}/console", base(&url))).send().await.unwrap();
    assert_eq!(page.status(), 200, "the page loads without a token");
    let csp = page.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(csp.contains("connect-src 'self'") && csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("/console/app.js"));
    let mcp = http.get(&url).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(mcp.status(), 401, "/mcp still needs the token");

    let (child, url) = start_binary(&dir.path().join("b.db"), &["--no-console"]);
    let _off = Killed(child);
    for path in ["/console", "/console/app.js"] {
        let status = http.get(format!("{}{path}", base(&url))).send().await.unwrap().status();
        assert_eq!(status, 404, "{path} with --no-console");
    }
    assert_eq!(http.get(format!("{}/healthz", base(&url))).send().await.unwrap().status(), 200);
}
