//! tether as an OAuth 2.1 resource server, against a real authorization
//! server (oidc-provider from npm, `interop/oauth/provider.mjs`) issuing JWT
//! access tokens by client credentials with RFC 8707 resource indicators:
//! the challenge and the metadata that lead a client to it, its tokens
//! accepted for the endpoint they name, every kind of bad token refused with
//! a 401 challenge (or 503 while an issuer's keys cannot be had), and
//! sessions bound to the token's `sub`.

mod support;

use std::io::BufRead;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use support::*;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn b64(v: &Value) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

struct Protected {
    _tether: Tether,
    base: String,
}

fn start_protected(dir: &tempfile::TempDir, issuers: &[&str]) -> Protected {
    start_protected_with(dir, issuers, "")
}

/// [`start_protected`] with `config` as its config file.
fn start_protected_with(dir: &tempfile::TempDir, issuers: &[&str], config: &str) -> Protected {
    start_protected_env(dir, issuers, config, &[], &[])
}

/// [`start_protected_with`] with more flags and environment variables.
fn start_protected_env(
    dir: &tempfile::TempDir,
    issuers: &[&str],
    config: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Protected {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config_path = dir.path().join("tether.toml");
    std::fs::write(&config_path, config).unwrap();
    let config_path = config_path.to_str().unwrap().to_owned();
    let mut args = vec!["--config", &config_path, "--listen", &listen, "--oauth-scopes", "tools:read,tools:write", "--upstream"];
    let upstream = format!("fx=stdio:python3 {}", fixture());
    args.push(&upstream);
    for issuer in issuers {
        args.extend(["--oauth-issuer", issuer]);
    }
    args.extend(extra);
    let db = dir.path().join("t.db");
    let (child, _) = start_binary_with_env(&format!("sqlite:{}", db.display()), &db.with_extension("log"), &args, env);
    Protected { _tether: Tether(child), base: format!("http://127.0.0.1:{port}") }
}

async fn post_initialize(url: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "oauth-test", "version": "0"}}})
            .to_string(),
        );
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

fn challenge(response: &reqwest::Response) -> String {
    response.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
}

#[tokio::test]
async fn a_client_finds_the_authorization_server_from_the_challenge_and_its_token_opens_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer]);
    let mcp = format!("{}/mcp", tether.base);

    // No token: 401 with the challenge naming the metadata and the scopes.
    let refused = post_initialize(&mcp, None).await;
    assert_eq!(refused.status(), 401);
    let metadata_url = format!("{}/.well-known/oauth-protected-resource/mcp", tether.base);
    assert_eq!(challenge(&refused), format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"tools:read tools:write\""));
    let metadata: Value = reqwest::get(&metadata_url).await.unwrap().json().await.unwrap();
    assert_eq!(metadata["resource"], mcp.as_str());
    assert_eq!(metadata["authorization_servers"], json!([provider.issuer]));
    assert_eq!(metadata["scopes_supported"], json!(["tools:read", "tools:write"]));
    let fx: Value =
        reqwest::get(format!("{}/.well-known/oauth-protected-resource/mcp/fx", tether.base)).await.unwrap().json().await.unwrap();
    assert_eq!(fx["resource"], format!("{mcp}/fx"), "each endpoint is its own resource");
    assert_eq!(
        reqwest::get(format!("{}/.well-known/oauth-protected-resource/mcp/nope", tether.base)).await.unwrap().status(),
        404
    );

    // A token for this resource, from the authorization server.
    let token = provider.token("svc", &mcp, "tools:read").await;
    let c = Client::with_token(&mcp, &token);
    let (sid, result) = c
        .initialize_params(
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
        )
        .await;
    assert!(result["serverInfo"].is_object(), "{result}");
    let called = c.call(&sid, 1, "thought", thought_args(1)).await;
    assert_eq!(called["result"]["structuredContent"]["thoughtNumber"], 1, "{called}");

    // Another subject (another client of the same issuer) cannot use the session.
    let other = Client::with_token(&mcp, &provider.token("reader", &mcp, "tools:read").await);
    let foreign = other.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).send().await.unwrap();
    assert_eq!(foreign.status(), 404, "a session is bound to its token's subject");
    // The same token on another endpoint is for another resource.
    let wrong = post_initialize(&format!("{mcp}/fx"), Some(&token)).await;
    assert_eq!(wrong.status(), 401);
    assert!(challenge(&wrong).contains("error=\"invalid_token\""), "{}", challenge(&wrong));
    assert!(challenge(&wrong).contains("oauth-protected-resource/mcp/fx"), "{}", challenge(&wrong));
}

#[tokio::test]
async fn bad_tokens_get_a_401_challenge_and_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer, "http://127.0.0.1:9/never-up"]);
    let mcp = format!("{}/mcp", tether.base);
    let claims = |over: Value| {
        let mut c = json!({"iss": provider.issuer, "sub": "mallory", "aud": mcp, "exp": now() + 300, "iat": now()});
        for (k, v) in over.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    // A token of our own with the provider's key passes: the checks below are the only difference.
    let good = provider.sign(&claims(json!({})), &provider.kid);
    assert_eq!(post_initialize(&mcp, Some(&good)).await.status(), 200, "a well-formed token of the issuer");

    // One character of the signature changed (not its last, whose low bits
    // are padding): still base64, no longer the signature.
    let tampered = {
        let mut t = good.clone().into_bytes();
        let at = t.len() - 10;
        t[at] = if t[at] == b'A' { b'B' } else { b'A' };
        String::from_utf8(t).unwrap()
    };
    let header_none = json!({"alg": "none", "typ": "JWT"});
    let alg_none = format!("{}.{}.", b64(&header_none), b64(&claims(json!({}))));
    let hs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims(json!({})),
        &jsonwebtoken::EncodingKey::from_secret(provider.key_pem.as_bytes()),
    )
    .unwrap();
    let cases = [
        ("expired", provider.sign(&claims(json!({"exp": now() - 600})), &provider.kid), "expired"),
        ("not yet valid", provider.sign(&claims(json!({"nbf": now() + 600})), &provider.kid), "not valid yet"),
        (
            "another endpoint's",
            provider.sign(&claims(json!({"aud": format!("{mcp}/fx")})), &provider.kid),
            "not for this resource",
        ),
        ("another issuer's", provider.sign(&claims(json!({"iss": "https://evil.example"})), &provider.kid), "not accepted"),
        ("alg none", alg_none, "not accepted"),
        ("HS256", hs256, "not accepted"),
        ("tampered", tampered, "signature"),
        ("unknown kid", provider.sign(&claims(json!({})), "no-such-kid"), "kid"),
        ("100 KB", "x".repeat(100 * 1024), ""),
        ("not a JWT", "this-is-no-token-at-all".to_owned(), "not a JWT"),
    ];
    for (what, token, reason) in cases {
        let response = post_initialize(&mcp, Some(&token)).await;
        let status = response.status().as_u16();
        assert!(
            status == 401 || (what == "100 KB" && status == 431),
            "{what}: {status} {}",
            response.text().await.unwrap_or_default()
        );
        if status == 401 {
            let challenge = challenge(&response);
            assert!(challenge.starts_with("Bearer resource_metadata=\""), "{what}: {challenge}");
            assert!(challenge.contains("error=\"invalid_token\""), "{what}: {challenge}");
            assert!(challenge.contains(reason), "{what}: {challenge}");
        }
        assert!(response.headers().get("mcp-session-id").is_none(), "{what}: no session");
    }

    // A flood of made-up kids: at most one more fetch of the keys (once per 30 s).
    let fetches = || async {
        let answer: Value = reqwest::get(format!("{}/test/jwks-fetches", provider.issuer)).await.unwrap().json().await.unwrap();
        answer["fetches"].as_u64().unwrap()
    };
    let before = fetches().await;
    assert!(before >= 1, "tether fetched the keys to check the tokens above");
    for n in 0..50 {
        let token = provider.sign(&claims(json!({})), &format!("made-up-{n}"));
        assert_eq!(post_initialize(&mcp, Some(&token)).await.status(), 401);
    }
    assert!(fetches().await <= before + 1, "{} fetches of the keys for 50 unknown kids", fetches().await - before);

    // A token in the query string is refused outright.
    let in_query = reqwest::Client::new()
        .post(format!("{mcp}?access_token={good}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(in_query.status(), 400);

    // An issuer whose keys were never had fails closed.
    let never_up = provider.sign(&claims(json!({"iss": "http://127.0.0.1:9/never-up"})), &provider.kid);
    let closed = post_initialize(&mcp, Some(&never_up)).await;
    assert_eq!(closed.status(), 503, "{}", closed.text().await.unwrap_or_default());

    // The authorization server goes down: the keys tether has go on working.
    drop(provider);
    let again = post_initialize(&mcp, Some(&good)).await;
    assert_eq!(again.status(), 200);
}

#[tokio::test]
async fn a_tool_a_policy_refuses_is_hidden_and_403_insufficient_scope_until_the_client_steps_up() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let policy = "[[policies]]\ntools = [\"thought\"]\nallow = '\"tools:write\" in jwt.scope'\nscope = \"tools:write\"\n";
    let tether = start_protected_with(&dir, &[&provider.issuer], policy);
    let mcp = format!("{}/mcp", tether.base);
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});

    // A token with tools:read only: the tool is not listed, and its call is 403.
    let reader = Client::with_token(&mcp, &provider.token("svc", &mcp, "tools:read").await);
    let (sid, _) = reader.initialize_params(params).await;
    let listed = reader.request(&sid, 1, "tools/list", json!({})).await.last().unwrap().json();
    let names: Vec<&str> = listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"thought"), "hidden from a principal without the scope: {names:?}");
    let call =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "thought", "arguments": thought_args(1)}});
    let refused = reader.post(Some(&sid), &call).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    let challenge = challenge(&refused);
    assert!(challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"tools:write\""), "{challenge}");
    assert!(challenge.contains("resource_metadata=\""), "{challenge}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["id"], 2);
    assert!(body["error"]["message"].as_str().unwrap().contains("tools:write"), "{body}");

    // Stepped up (a new token of the same subject with the scope): the same session calls it.
    let writer = Client::with_token(&mcp, &provider.token("svc", &mcp, "tools:read tools:write").await);
    let listed = writer.request(&sid, 3, "tools/list", json!({})).await.last().unwrap().json();
    assert!(listed["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "thought"), "{listed}");
    let called = writer.call(&sid, 4, "thought", thought_args(1)).await;
    assert_eq!(called["result"]["structuredContent"]["thoughtNumber"], 1, "{called}");
}

#[tokio::test]
async fn prompts_and_resources_follow_their_rules_and_every_decision_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let audit = dir.path().join("audit/decisions.jsonl");
    let config = format!(
        "audit_log = {:?}\n\
         [[policies]]\nendpoint = \"fx\"\nprompts = [\"greet\"]\nallow = '\"prompts:read\" in jwt.scope'\nscope = \"prompts:read\"\n\
         [[policies]]\nendpoint = \"fx\"\nresources = [\"fixture://*\"]\nallow = '\"files:read\" in jwt.scope && mcp.resource.uri.endsWith(\"/info\")'\n",
        audit.display().to_string()
    );
    let tether = start_protected_with(&dir, &[&provider.issuer], &config);
    let fx = format!("{}/mcp/fx", tether.base);
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});

    // Without the scopes: the prompt and the resource are hidden, and using them is refused.
    let reader = Client::with_token(&fx, &provider.token("svc", &fx, "tools:read").await);
    let (sid, _) = reader.initialize_params(params).await;
    let prompts = reader.request(&sid, 1, "prompts/list", json!({})).await.last().unwrap().json();
    assert_eq!(prompts["result"]["prompts"], json!([]), "{prompts}");
    let resources = reader.request(&sid, 2, "resources/list", json!({})).await.last().unwrap().json();
    assert_eq!(resources["result"]["resources"], json!([]), "{resources}");
    let get = json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": {"name": "greet", "arguments": {"who": "x"}}});
    let refused = reader.post(Some(&sid), &get).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    assert!(challenge(&refused).starts_with("Bearer error=\"insufficient_scope\", scope=\"prompts:read\""));
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("prompt `greet`"), "{body}");
    let read = json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": "fixture://fixture/info"}});
    let refused = reader.post(Some(&sid), &read).send().await.unwrap();
    assert_eq!(refused.status(), 403, "a rule naming no scope refuses without a challenge");
    assert!(refused.headers().get("www-authenticate").is_none());

    // With them, in the same session: listed and used.
    let all = Client::with_token(&fx, &provider.token("svc", &fx, "tools:read prompts:read files:read").await);
    let prompts = all.request(&sid, 5, "prompts/list", json!({})).await.last().unwrap().json();
    assert_eq!(prompts["result"]["prompts"][0]["name"], "greet", "{prompts}");
    let got = all.request(&sid, 6, "prompts/get", json!({"name": "greet", "arguments": {"who": "x"}})).await;
    assert!(got.last().unwrap().json()["result"]["messages"].is_array(), "{:?}", got.last().unwrap().json());
    let read = all.request(&sid, 7, "resources/read", json!({"uri": "fixture://fixture/info"})).await.last().unwrap().json();
    assert!(read["result"]["contents"].is_array(), "{read}");

    // The audit log has each decision, with who, where, what, and the rule.
    let lines = wait_for_lines(&audit, 6);
    let seen: Vec<(String, String, String)> = lines
        .iter()
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
            (s("method"), s("name"), s("decision"))
        })
        .collect();
    for expected in [
        ("prompts/list", "greet", "hidden"),
        ("resources/list", "fixture://fixture/info", "hidden"),
        ("prompts/get", "greet", "deny"),
        ("resources/read", "fixture://fixture/info", "deny"),
        ("prompts/get", "greet", "allow"),
        ("resources/read", "fixture://fixture/info", "allow"),
    ] {
        let expected = (expected.0.to_owned(), expected.1.to_owned(), expected.2.to_owned());
        assert!(seen.contains(&expected), "{expected:?} missing from {seen:?}");
    }
    let denied = lines.iter().find(|l| l["method"] == "prompts/get" && l["decision"] == "deny").unwrap();
    assert_eq!(denied["principal"], format!("svc@{}", provider.issuer));
    assert_eq!(denied["endpoint"], "/mcp/fx");
    assert_eq!(denied["rule"], "\"prompts:read\" in jwt.scope");
    assert_eq!(denied["scopes"], json!(["prompts:read"]));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&audit).unwrap().permissions().mode() & 0o777, 0o600);
}

/// The JSON lines of `path` once it has at least `n` (the audit writer is
/// a thread of its own), within a generous deadline.
fn wait_for_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(std::time::Instant::now() < deadline, "{} has {} lines, not {n}: {text}", path.display(), lines.len());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[tokio::test]
async fn opaque_tokens_are_checked_by_introspection_at_the_issuer() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected_env(
        &dir,
        &[&provider.issuer],
        "",
        &["--oauth-client-id", "tether"],
        &[("TETHER_OAUTH_CLIENT_SECRET", "tether-secret")],
    );
    let mcp = format!("{}/mcp", tether.base);
    let opaque = provider.token("opaque", &mcp, "tools:read").await;
    assert_ne!(opaque.split('.').count(), 3, "the provider issues an opaque token to this client: {opaque}");

    // Accepted: a session of its own principal, and a call.
    let client = Client::with_token(&mcp, &opaque);
    let (sid, _) = client
        .initialize_params(
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
        )
        .await;
    let called = client.call(&sid, 1, "thought", thought_args(1)).await;
    assert_eq!(called["result"]["structuredContent"]["thoughtNumber"], 1, "{called}");

    // An opaque token for another endpoint, and one the issuer never made: 401 with the challenge.
    let fx = format!("{}/mcp/fx", tether.base);
    let for_fx = provider.token("opaque", &fx, "tools:read").await;
    let refused = post_initialize(&mcp, Some(&for_fx)).await;
    assert_eq!(refused.status(), 401);
    assert!(challenge(&refused).contains("not for this resource"), "{}", challenge(&refused));
    let made_up = post_initialize(&mcp, Some("QmFkVG9rZW5UaGF0SXNOb3RSZWFs")).await;
    assert_eq!(made_up.status(), 401);
    assert!(challenge(&made_up).contains("not active"), "{}", challenge(&made_up));

    // The same opaque token on its own endpoint is still good (a session per endpoint).
    let at_fx = post_initialize(&fx, Some(&for_fx)).await;
    assert_eq!(at_fx.status(), 200, "{}", at_fx.text().await.unwrap_or_default());
}

#[tokio::test]
async fn without_an_introspection_client_an_opaque_token_is_refused_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer]);
    let mcp = format!("{}/mcp", tether.base);
    let opaque = provider.token("opaque", &mcp, "tools:read").await;
    let refused = post_initialize(&mcp, Some(&opaque)).await;
    assert_eq!(refused.status(), 401);
    assert!(challenge(&refused).contains("--oauth-client-id"), "{}", challenge(&refused));
}

#[tokio::test]
async fn an_upstream_gets_tethers_own_token_by_client_credentials_or_token_exchange_never_the_clients() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let (_upstream, upstream_url) = start_py_server("bearer");
    let issuer = &provider.issuer;
    let config = format!(
        "[upstreams.cc]\nurl = \"{upstream_url}\"\n\
         [upstreams.cc.oauth]\ngrant = \"client_credentials\"\nissuer = \"{issuer}\"\nclient_id = \"tether-up\"\n\
         client_secret_env = \"UPSTREAM_CLIENT_SECRET\"\nscope = \"tools:read\"\n\
         [upstreams.ex]\nurl = \"{upstream_url}\"\n\
         [upstreams.ex.oauth]\ngrant = \"token_exchange\"\ntoken_url = \"{issuer}/token\"\nclient_id = \"tether-up\"\n\
         client_secret_env = \"UPSTREAM_CLIENT_SECRET\"\n"
    );
    let tether = start_protected_env(&dir, &[issuer], &config, &[], &[("UPSTREAM_CLIENT_SECRET", "tether-up-secret")]);
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});

    // The upstream refuses any token not made for it, so a call that answers
    // went with a token of tether's own.
    let mut client_tokens = Vec::new();
    for name in ["cc", "ex"] {
        let endpoint = format!("{}/mcp/{name}", tether.base);
        let client_token = provider.token("svc", &endpoint, "tools:read").await;
        let client = Client::with_token(&endpoint, &client_token);
        let (sid, _) = client.initialize_params(params.clone()).await;
        for id in 1..=3 {
            let called = client.call(&sid, id, "echo", json!({"text": format!("{name} {id}")})).await;
            assert_eq!(called["result"]["content"][0]["text"], format!("{name} {id}"), "{called}");
        }
        client_tokens.push(client_token);
    }

    // What the upstream saw: tokens for its own audience from the
    // authorization server, one of tether's client, one on behalf of the
    // caller, and never a token the client sent.
    let stats: Value = reqwest::get(upstream_url.replace("/mcp", "/stats")).await.unwrap().json().await.unwrap();
    let seen: Vec<&str> = stats["tokens"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(!seen.is_empty(), "{stats}");
    for client_token in &client_tokens {
        assert!(!seen.contains(&client_token.as_str()), "the client's token reached the upstream");
    }
    let claims: Vec<Value> = seen
        .iter()
        .map(|t| {
            use base64::Engine as _;
            let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t.split('.').nth(1).unwrap()).unwrap();
            serde_json::from_slice(&payload).unwrap()
        })
        .collect();
    for c in &claims {
        assert_eq!(c["aud"], upstream_url, "{c}");
        assert_eq!(c["iss"], *issuer, "{c}");
    }
    assert!(
        claims.iter().any(|c| c["sub"] == "tether-up" && c.get("act").is_none()),
        "a client-credentials token of tether's own client: {claims:?}"
    );
    assert!(
        claims.iter().any(|c| c["sub"] == "svc" && c["act"]["sub"] == "tether-up"),
        "a token exchanged on behalf of the caller (svc): {claims:?}"
    );
    assert!(claims.len() <= 3, "tokens are reused while good, not fetched per call: {claims:?}");
}

/// `tether ARGS` as a person runs it, with only `env` of the OAuth client
/// variables, its token cache in `cache`.
fn tether_cli(args: &[&str], env: &[(&str, &str)], home: &std::path::Path) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tether"));
    cmd.args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("TETHER_OAUTH_CACHE", home.join("oauth-cache"))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null());
    for k in ["MCP_AUTH_TOKEN", "MCP_SERVER_URL", "MCP_OAUTH_CLIENT_ID", "MCP_OAUTH_CLIENT_SECRET", "XDG_CACHE_HOME"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the tether binary runs")
}

#[tokio::test]
async fn tether_call_and_tools_follow_the_challenge_with_client_credentials_and_keep_the_token_private() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer]);
    let mcp = format!("{}/mcp", tether.base);
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let text = |o: &std::process::Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));

    // No credentials: refused, saying what to set.
    let out = tether_cli(&["tools", &mcp], &[], &home);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("MCP_OAUTH_CLIENT_ID"), "{}", text(&out));

    // A wrong secret: the authorization server's refusal, named.
    let wrong = [("MCP_OAUTH_CLIENT_ID", "svc"), ("MCP_OAUTH_CLIENT_SECRET", "not-the-secret")];
    let out = tether_cli(&["tools", &mcp], &wrong, &home);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("refused client svc"), "{}", text(&out));

    // Client credentials: 401 -> metadata -> token -> the call.
    let creds = [("MCP_OAUTH_CLIENT_ID", "svc"), ("MCP_OAUTH_CLIENT_SECRET", "svc-secret")];
    let args = r#"{"thought":"t","thoughtNumber":1,"totalThoughts":1,"nextThoughtNeeded":false}"#;
    let out = tether_cli(&["call", &mcp, "thought", "--json", args], &creds, &home);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["structuredContent"]["thoughtNumber"], 1, "{result}");

    // The token is kept in a private file, never the secret.
    use std::os::unix::fs::PermissionsExt;
    let cache = home.join("oauth-cache");
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777, 0o600);
    let kept = std::fs::read_to_string(&files[0]).unwrap();
    assert!(!kept.contains("svc-secret"), "the secret is never written");

    // The authorization server goes away: the cached token goes on working.
    drop(provider);
    let out = tether_cli(&["tools", &mcp, "--json"], &creds, &home);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("thought"), "{}", text(&out));
}

#[tokio::test]
async fn another_subject_gets_neither_the_replay_of_a_session_nor_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    // Every resumable call is a task at once.
    let tether = start_protected_env(&dir, &[&provider.issuer], "", &["--resume-wait", "0s"], &[]);
    let mcp = format!("{}/mcp", tether.base);
    let owner = Client::with_token(&mcp, &provider.token("svc", &mcp, "tools:read").await);
    let other = Client::with_token(&mcp, &provider.token("reader", &mcp, "tools:read").await);

    // Replay of the owner's stream: 404 for another subject.
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
    let (sid, _) = owner.initialize_params(params).await;
    let events = owner.request(&sid, 1, "tools/call", json!({"name": "thought", "arguments": thought_args(1)})).await;
    let last = events.iter().rev().find_map(|e| e.id.clone()).expect("the answer has an event ID");
    assert_eq!(other.get(&sid, Some(&last)).send().await.unwrap().status(), 404, "replay is the session's principal's");
    assert_eq!(owner.get(&sid, Some(&last)).send().await.unwrap().status(), 200, "and the owner's replay works");

    // A task: only its principal sees it.
    let tasks = json!({
        (tether_wire::meta::PROTOCOL_VERSION): SESSIONLESS,
        (tether_wire::meta::CLIENT_CAPABILITIES): {"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}},
    });
    let call = json!({"name": "session", "arguments": {"operation": "export", "format": "json"}, "_meta": tasks});
    let (status, created) = send_sessionless(&owner, &sessionless_request(2, "tools/call", call), Some("session"), &[]).await;
    assert_eq!(status, 200, "{created}");
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    let get = sessionless_request(3, "tasks/get", json!({"taskId": task, "_meta": tasks}));
    let (_, theirs) = send_sessionless(&other, &get, Some(&task), &[]).await;
    assert!(theirs["result"].is_null() && theirs["error"].is_object(), "another subject's tasks/get: {theirs}");
    let (_, own) = send_sessionless(&owner, &get, Some(&task), &[]).await;
    assert!(own["result"]["status"].is_string(), "the owner's tasks/get: {own}");
}

#[tokio::test]
async fn a_token_of_the_token_file_is_never_sent_to_the_authorization_server() {
    const STATIC: &str = "static-token-of-alice-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{STATIC} alice\n")).unwrap();
    let policy = "[[policies]]\ntools = [\"thought\"]\nallow = '\"tools:write\" in jwt.scope'\nscope = \"tools:write\"\n";
    let tether = start_protected_env(
        &dir,
        &[&provider.issuer],
        policy,
        &["--auth-tokens", tokens.to_str().unwrap(), "--oauth-client-id", "tether"],
        &[("TETHER_OAUTH_CLIENT_SECRET", "tether-secret")],
    );
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});

    // The static token on /mcp (the notebook) and on /mcp/fx (a gateway):
    // a session, a list the policy filters, and a call the policy refuses
    // (a static token has no claims).
    for endpoint in [format!("{}/mcp", tether.base), format!("{}/mcp/fx", tether.base)] {
        let alice = Client::with_token(&endpoint, STATIC);
        let (sid, _) = alice.initialize_params(params.clone()).await;
        let listed = alice.request(&sid, 1, "tools/list", json!({})).await.last().unwrap().json();
        let names: Vec<&str> = listed["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
        assert!(!names.is_empty() && !names.contains(&"thought"), "{endpoint}: {names:?}");
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "thought", "arguments": thought_args(1)}});
        let refused = alice.post(Some(&sid), &call).send().await.unwrap();
        assert_eq!(refused.status(), 403, "{endpoint}");
        let body: Value = refused.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("token file carries no OAuth scopes"), "{endpoint}: saying why: {body}");
    }

    // An opaque access token is introspected, so the provider's record of
    // introspections is live...
    let mcp = format!("{}/mcp", tether.base);
    let opaque = provider.token("opaque", &mcp, "tools:read tools:write").await;
    let client = Client::with_token(&mcp, &opaque);
    let (sid, _) = client.initialize_params(params).await;
    let listed = client.request(&sid, 1, "tools/list", json!({})).await.last().unwrap().json();
    assert!(listed["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "thought"), "{listed}");
    let (count, seen) = provider.introspected().await;
    assert!(seen.contains(&opaque), "the opaque token was introspected: {count} requests");
    // ...and it never saw the static token.
    assert!(!seen.iter().any(|t| t == STATIC), "the token file's token was sent to the authorization server");
    assert_eq!(count as usize, seen.iter().filter(|t| **t == opaque).count(), "only the opaque token was asked about: {seen:?}");
}

#[tokio::test]
async fn made_up_opaque_tokens_are_introspected_within_the_limits_and_remembered_tokens_are_never_limited() {
    use tether_server::http::oauth::{
        INTROSPECT_BURST, INTROSPECT_BURST_PER_CLIENT, INTROSPECT_RATE, INTROSPECT_RATE_PER_CLIENT,
    };
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected_env(
        &dir,
        &[&provider.issuer],
        "",
        &["--oauth-client-id", "tether"],
        &[("TETHER_OAUTH_CLIENT_SECRET", "tether-secret")],
    );
    let mcp = format!("{}/mcp", tether.base);
    // A client's opaque token, checked (and so remembered) before the flood.
    let opaque = provider.token("opaque", &mcp, "tools:read").await;
    assert_eq!(post_initialize(&mcp, Some(&opaque)).await.status(), 200);
    let start = std::time::Instant::now();
    let (before, _) = provider.introspected().await;

    // One address sends many made-up tokens: its burst is introspected,
    // the rest are refused with 401 without asking, saying to retry later.
    let flood = |n: usize, from: &str| format!("made-up-token-{from}-{n}-not-issued-by-anyone");
    let mut limited = 0;
    for n in 0..60 {
        let response = post_initialize(&mcp, Some(&flood(n, "one"))).await;
        assert_eq!(response.status(), 401);
        let retry_after = response.headers().get("retry-after").is_some();
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
        if message.contains("retry in a few seconds") {
            assert!(retry_after, "{message}");
            limited += 1;
        } else {
            assert!(message.contains("not active"), "{message}");
        }
    }
    let (after_one, _) = provider.introspected().await;
    let allowed_one = INTROSPECT_BURST_PER_CLIENT + INTROSPECT_RATE_PER_CLIENT * start.elapsed().as_secs_f64();
    assert!(
        (after_one - before) as f64 <= allowed_one + 1.0,
        "{} introspections from one address, at most {allowed_one:.0} allowed",
        after_one - before
    );
    assert!(limited > 0, "the limit refused some");

    // Many addresses (loopback has all of 127/8): the overall limit.
    for n in 0..200 {
        let from = std::net::IpAddr::from([127, 0, 0, 2 + (n % 50) as u8]);
        let client = reqwest::Client::builder().local_address(from).build().unwrap();
        let response = client
            .post(&mcp)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(flood(n, "many"))
            .body(json!({"jsonrpc": "2.0", "id": 0, "method": "ping"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401);
    }
    let (after_many, _) = provider.introspected().await;
    let allowed = INTROSPECT_BURST + INTROSPECT_RATE * start.elapsed().as_secs_f64();
    assert!(
        (after_many - before) as f64 <= allowed + 1.0,
        "{} introspections in all, at most {allowed:.0} allowed",
        after_many - before
    );

    // The remembered token is not limited, nor is a JWT (checked here).
    let remembered = post_initialize(&mcp, Some(&opaque)).await;
    assert_eq!(remembered.status(), 200, "{}", remembered.text().await.unwrap_or_default());
    let jwt = provider.token("svc", &mcp, "tools:read").await;
    assert_eq!(post_initialize(&mcp, Some(&jwt)).await.status(), 200);
}

#[tokio::test]
async fn a_token_naming_two_endpoints_works_on_both() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer]);
    let mcp = format!("{}/mcp", tether.base);
    let fx = format!("{mcp}/fx");
    let claims = json!({"iss": provider.issuer, "sub": "both", "aud": [mcp, fx], "exp": now() + 300, "iat": now()});
    let token = provider.sign(&claims, &provider.kid);
    for url in [&mcp, &fx, &mcp, &fx] {
        let response = post_initialize(url, Some(&token)).await;
        assert_eq!(response.status(), 200, "{url}: {}", challenge(&response));
    }
    // A token naming only /mcp is still refused on /mcp/fx after its use on /mcp.
    let one = provider.sign(&json!({"iss": provider.issuer, "sub": "one", "aud": mcp, "exp": now() + 300}), &provider.kid);
    assert_eq!(post_initialize(&mcp, Some(&one)).await.status(), 200);
    let refused = post_initialize(&fx, Some(&one)).await;
    assert_eq!(refused.status(), 401);
    assert!(challenge(&refused).contains("not for this resource"), "{}", challenge(&refused));
}

#[tokio::test]
async fn a_jwt_with_a_critical_header_extension_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path());
    let tether = start_protected(&dir, &[&provider.issuer]);
    let mcp = format!("{}/mcp", tether.base);
    let claims = json!({"iss": provider.issuer, "sub": "crit", "aud": mcp, "exp": now() + 300, "iat": now()});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(provider.kid.clone());
    header.crit = Some(vec!["urn:example:must-understand".to_owned()]);
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(provider.key_pem.as_bytes()).unwrap();
    let token = jsonwebtoken::encode(&header, &claims, &key).unwrap();
    let refused = post_initialize(&mcp, Some(&token)).await;
    assert_eq!(refused.status(), 401);
    let challenge = challenge(&refused);
    assert!(challenge.contains("error=\"invalid_token\"") && challenge.contains("`crit`"), "{challenge}");
    // The same claims without `crit` pass: only the header differs.
    assert_eq!(post_initialize(&mcp, Some(&provider.sign(&claims, &provider.kid))).await.status(), 200);
}

/// What `tether serve ARGS` logs until it listens (`Ok`) or exits (`Err`),
/// on a free port with an in-memory store; the server is stopped after.
fn startup_log(args: &[&str]) -> Result<Vec<String>, Vec<String>> {
    let mut child = std::process::Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory", "--no-console"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("TETHER_AUTH_TOKENS")
        .env_remove("TETHER_OAUTH_ISSUER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tether binary runs");
    let mut lines = Vec::new();
    let mut listening = false;
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let Ok(line) = line else { break };
        listening = line.contains("tether listening");
        lines.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    if listening { Ok(lines) } else { Err(lines) }
}

#[test]
fn forward_auth_beside_an_oauth_issuer_refuses_to_start_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    std::fs::write(&config, "[upstreams.up]\nurl = \"http://127.0.0.1:9/mcp\"\nforward_auth = true\n").unwrap();
    let config = config.to_str().unwrap();
    let refused = startup_log(&["--config", config, "--oauth-issuer", "http://127.0.0.1:9/issuer"])
        .expect_err("forward_auth with --oauth-issuer must not start");
    let text = refused.join("\n");
    assert!(
        text.contains("[upstreams.up] forward_auth = true with --oauth-issuer") && text.contains("[upstreams.up.oauth]"),
        "{text}"
    );
    // Without OAuth, forwarding the client's header is the operator's choice.
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "static-token-of-alice-0123456789abcdef alice\n").unwrap();
    startup_log(&["--config", config, "--auth-tokens", tokens.to_str().unwrap()])
        .unwrap_or_else(|log| panic!("forward_auth without OAuth starts: {}", log.join("\n")));
}

#[test]
fn with_oauth_and_no_token_file_the_log_says_authentication_is_on() {
    let with_oauth = startup_log(&["--oauth-issuer", "http://127.0.0.1:9/issuer"]).unwrap_or_else(|log| panic!("{log:?}"));
    let text = with_oauth.join("\n");
    assert!(!text.contains("authentication is off"), "{text}");
    assert!(text.contains("authentication is on: OAuth access tokens"), "{text}");
    let without = startup_log(&[]).unwrap_or_else(|log| panic!("{log:?}")).join("\n");
    assert!(without.contains("authentication is off"), "{without}");
}
