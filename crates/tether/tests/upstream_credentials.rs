//! tether's own OAuth tokens for a URL upstream when the upstream stops
//! taking one: a real authorization server (oidc-provider,
//! `interop/oauth/provider.mjs`) issues opaque tokens by client credentials
//! and revokes them (RFC 7009); the upstream (the Python SDK fixture behind
//! `interop/servers/py_introspected.py`) checks every request's token by
//! introspection (RFC 7662), so a revoked token is refused with 401 from its
//! next request on. tether drops the refused token, fetches one new token
//! for every caller that saw the refusal, and sends the refused message
//! again; an upstream that refuses every token gets no more than one new
//! token per `RENEW_EVERY`.

mod support;

use std::time::Instant;

use serde_json::{Value, json};
use support::*;
use tether_gateway::credentials::RENEW_EVERY;

/// The client tether fetches its upstream tokens as (opaque tokens, so they
/// can be introspected and revoked).
const CLIENT: &str = "opaque";

/// The upstream: `interop/servers/py_introspected.py SHAPE`, killed when dropped.
struct Upstream {
    _server: PyServer,
    url: String,
}

fn start_upstream(shape: &str, issuer: &str) -> Upstream {
    let port = free_port();
    let mut child = std::process::Command::new(repo_root().join("interop/py/.venv/bin/python"))
        .arg(repo_root().join("interop/servers/py_introspected.py"))
        .args([shape, &port.to_string(), issuer])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the introspecting fixture starts");
    wait_ready(&mut child, "py_introspected.py");
    Upstream { _server: PyServer(child), url: format!("http://127.0.0.1:{port}/mcp") }
}

impl Upstream {
    /// `{"accepted": [TOKEN...], "refused": N}`.
    async fn auth(&self) -> Value {
        reqwest::get(self.url.replace("/mcp", "/test/auth")).await.unwrap().json().await.unwrap()
    }

    async fn accepted(&self) -> Vec<String> {
        let auth = self.auth().await;
        auth["accepted"].as_array().unwrap().iter().filter_map(Value::as_str).map(str::to_owned).collect()
    }

    async fn refused(&self) -> u64 {
        self.auth().await["refused"].as_u64().unwrap()
    }

    async fn stats(&self) -> Value {
        reqwest::get(self.url.replace("/mcp", "/stats")).await.unwrap().json().await.unwrap()
    }

    /// From now on every token is refused.
    async fn refuse_all(&self) {
        let response = reqwest::Client::new().post(self.url.replace("/mcp", "/test/refuse-all")).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
}

/// tether with `upstreams` (names) at `url`, each with tether's own client
/// credentials at `issuer`; its base URL (`http://…/mcp`).
fn start_tether(dir: &tempfile::TempDir, issuer: &str, upstreams: &[(&str, &str)]) -> (Tether, String) {
    let mut config = String::new();
    for (name, url) in upstreams {
        config.push_str(&format!(
            "[upstreams.{name}]\nurl = \"{url}\"\n\
             [upstreams.{name}.oauth]\ngrant = \"client_credentials\"\nissuer = \"{issuer}\"\nclient_id = \"{CLIENT}\"\n\
             client_secret_env = \"UPSTREAM_CLIENT_SECRET\"\nscope = \"tools:read\"\n"
        ));
    }
    let config_path = dir.path().join("tether.toml");
    std::fs::write(&config_path, config).unwrap();
    let db = dir.path().join("t.db");
    let (child, url) = start_binary_with_env(
        &format!("sqlite:{}", db.display()),
        &db.with_extension("log"),
        &["--config", config_path.to_str().unwrap()],
        &[("UPSTREAM_CLIENT_SECRET", &format!("{CLIENT}-secret"))],
    );
    (Tether(child), url)
}

fn echoed(response: &Value) -> Option<&str> {
    response["result"]["content"][0]["text"].as_str()
}

#[tokio::test]
async fn a_revoked_upstream_token_is_replaced_by_one_new_token_and_the_refused_calls_go_through() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let upstream = start_upstream("stateful", &provider.issuer);
    let (_tether, base) = start_tether(&dir, &provider.issuer, &[("up", &upstream.url)]);
    let c = Client::new(&format!("{base}/up"));

    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(c.initialize().await);
    }
    let called = c.call(&sessions[0], 1, "echo", json!({"text": "before"})).await;
    assert_eq!(echoed(&called), Some("before"), "{called}");
    assert_eq!(provider.issued(CLIENT).await, 1, "one token of tether's own for every session");
    let first = upstream.accepted().await;
    assert_eq!(first.len(), 1, "{first:?}");

    // Revoked at the authorization server, long before it expires: the
    // upstream refuses it from now on.
    provider.revoke(CLIENT, &first[0]).await;

    // Calls on every session at once, and a new session, all after the
    // revocation: each goes through, on one new token between them.
    let calls = sessions.iter().enumerate().flat_map(|(n, sid)| {
        let c = c.clone();
        (0..4u64).map(move |k| {
            let (c, sid) = (c.clone(), sid.clone());
            async move {
                let text = format!("after {n} {k}");
                let called = c.call(&sid, 10 + k, "echo", json!({"text": text})).await;
                assert_eq!(echoed(&called), Some(text.as_str()), "{called}");
            }
        })
    });
    let opened = async {
        let sid = c.initialize().await;
        let called = c.call(&sid, 1, "echo", json!({"text": "new session"})).await;
        assert_eq!(echoed(&called), Some("new session"), "{called}");
    };
    futures::join!(futures::future::join_all(calls), opened);

    assert!(upstream.refused().await >= 1, "the revoked token was sent and refused");
    assert_eq!(provider.issued(CLIENT).await, 2, "exactly one new token after the revocation");
    let accepted = upstream.accepted().await;
    assert_eq!(accepted.len(), 2, "the upstream took the first token, then the new one: {accepted:?}");
    assert_ne!(accepted[1], first[0]);
    // The upstream sessions stayed: only the new client session initialized.
    assert_eq!(upstream.stats().await["initialize"], 5);
}

#[tokio::test]
async fn a_flood_against_an_upstream_that_refuses_every_token_fetches_at_most_one_token_per_bound() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let upstream = start_upstream("stateful", &provider.issuer);
    let (_tether, base) = start_tether(&dir, &provider.issuer, &[("up", &upstream.url)]);
    let c = Client::new(&format!("{base}/up"));
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(c.initialize().await);
    }
    let called = c.call(&sessions[0], 1, "echo", json!({"text": "before"})).await;
    assert_eq!(echoed(&called), Some("before"), "{called}");
    assert_eq!(provider.issued(CLIENT).await, 1);

    upstream.refuse_all().await;
    let started = Instant::now();
    let refused_before = upstream.refused().await;
    // A burst on every session at once, then calls one after another.
    let burst = sessions.iter().flat_map(|sid| {
        let c = c.clone();
        (0..5u64).map(move |k| {
            let (c, sid) = (c.clone(), sid.clone());
            async move { c.call(&sid, 100 + k, "echo", json!({"text": "refused"})).await }
        })
    });
    let mut answers = futures::future::join_all(burst).await;
    for k in 0..20u64 {
        answers.push(c.call(&sessions[k as usize % sessions.len()], 200 + k, "echo", json!({"text": "refused"})).await);
    }
    let elapsed = started.elapsed();

    for answer in &answers {
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("refused tether's OAuth access token (HTTP 401)"), "{message}");
    }
    assert!(upstream.refused().await - refused_before >= answers.len() as u64, "every call reached the upstream");
    // Renewals at least RENEW_EVERY apart, all within `elapsed`.
    let bound = 1 + (elapsed.as_secs_f64() / RENEW_EVERY.as_secs_f64()) as u64;
    let new_tokens = provider.issued(CLIENT).await - 1;
    assert!(new_tokens >= 1, "the first refusal fetched a new token");
    assert!(
        new_tokens <= bound,
        "{new_tokens} new tokens for {} refused calls in {elapsed:?}; at most {bound} allowed",
        answers.len()
    );
}

#[tokio::test]
async fn a_sessionless_upstream_gets_a_new_token_after_a_revocation_bridged_or_passed_through() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let upstream = start_upstream("modern-only", &provider.issuer);
    // Two names for one upstream: two token sources, one per path.
    let (_tether, base) = start_tether(&dir, &provider.issuer, &[("bridged", &upstream.url), ("passed", &upstream.url)]);
    let bridged = Client::new(&format!("{base}/bridged"));
    let passed = Client::new(&format!("{base}/passed"));

    // A session-era client (bridged to the sessionless upstream) and a
    // sessionless one (passed through).
    let sid = bridged.initialize().await;
    let call_bridged = |id: u64, text: &str| {
        let (bridged, sid, text) = (bridged.clone(), sid.clone(), text.to_owned());
        async move { bridged.call(&sid, id, "echo", json!({"text": text})).await }
    };
    let call_passed = |id: u64, text: &str| {
        let body = sessionless_request(id, "tools/call", json!({"name": "echo", "arguments": {"text": text}}));
        let passed = passed.clone();
        async move {
            let (status, answer) = send_sessionless(&passed, &body, Some("echo"), &[]).await;
            assert_eq!(status, 200, "{answer}");
            answer
        }
    };
    let called = call_bridged(1, "bridged before").await;
    assert_eq!(echoed(&called), Some("bridged before"), "{called}");
    let called = call_passed(1, "passed before").await;
    assert_eq!(echoed(&called), Some("passed before"), "{called}");
    let issued = provider.issued(CLIENT).await;
    let before = upstream.accepted().await;

    for token in &before {
        provider.revoke(CLIENT, token).await;
    }
    let refused_before = upstream.refused().await;
    let called = call_bridged(2, "bridged after").await;
    assert_eq!(echoed(&called), Some("bridged after"), "{called}");
    let called = call_passed(2, "passed after").await;
    assert_eq!(echoed(&called), Some("passed after"), "{called}");

    assert!(upstream.refused().await - refused_before >= 2, "each path sent its revoked token and was refused");
    assert_eq!(provider.issued(CLIENT).await, issued + 2, "one new token for each upstream");
}
