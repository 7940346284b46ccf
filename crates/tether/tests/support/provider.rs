//! The real authorization server of the OAuth tests (oidc-provider from
//! npm, `interop/oauth/provider.mjs`): started on a free port, killed when
//! dropped, with what its `/test/…` routes tell (tokens issued,
//! introspections asked) and the client-credentials, revocation and
//! self-signed-token calls the tests make.

use std::io::BufRead;

use serde_json::Value;

/// The authorization server, killed when dropped.
pub struct Provider {
    child: std::process::Child,
    pub issuer: String,
    /// Its signing key (PEM) and kid, for tokens a test makes itself.
    pub key_pem: String,
    pub kid: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The repository's root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interop packages (npm and the Python venv) the fixtures need, installed once.
pub fn ensure_interop() {
    let ensure = std::process::Command::new("bash").arg(repo_root().join("interop/servers/ensure.sh")).output().unwrap();
    assert!(ensure.status.success(), "interop/servers/ensure.sh failed: {}", String::from_utf8_lossy(&ensure.stderr));
}

/// Waits for a child's `READY` line, then drains its stdout.
pub fn wait_ready(child: &mut std::process::Child, what: &str) {
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("READY"), "{what} did not start");
    std::thread::spawn(move || for _ in lines {});
}

/// Starts the authorization server, its key written under `dir`.
pub fn start_provider(dir: &std::path::Path) -> Provider {
    ensure_interop();
    let port = free_port();
    let key_file = dir.join("provider-key.pem");
    let mut child = std::process::Command::new("node")
        .arg(repo_root().join("interop/oauth/provider.mjs"))
        .args([&port.to_string(), key_file.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("node runs the authorization server");
    wait_ready(&mut child, "the authorization server");
    let text = std::fs::read_to_string(&key_file).unwrap();
    let kid = text.lines().next().and_then(|l| l.strip_prefix("# kid: ")).unwrap().to_owned();
    let key_pem = text.lines().skip(1).collect::<Vec<_>>().join("\n");
    Provider { child, issuer: format!("http://127.0.0.1:{port}"), key_pem, kid }
}

impl Provider {
    /// A token by client credentials for `resource`.
    pub async fn token(&self, client: &str, resource: &str, scope: &str) -> String {
        let secret = format!("{client}-secret");
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", client),
            ("client_secret", &secret),
            ("resource", resource),
            ("scope", scope),
        ];
        let answer: Value =
            reqwest::Client::new().post(format!("{}/token", self.issuer)).form(&form).send().await.unwrap().json().await.unwrap();
        answer["access_token"].as_str().unwrap_or_else(|| panic!("no token: {answer}")).to_owned()
    }

    /// A token of our own making, signed with the provider's key.
    pub fn sign(&self, claims: &Value, kid: &str) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.key_pem.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    /// How many tokens it issued to `client` so far.
    pub async fn issued(&self, client: &str) -> u64 {
        let issued: Value = reqwest::get(format!("{}/test/tokens-issued", self.issuer)).await.unwrap().json().await.unwrap();
        issued[client].as_u64().unwrap_or(0)
    }

    /// Revokes `token` of `client` (RFC 7009).
    pub async fn revoke(&self, client: &str, token: &str) {
        let response = reqwest::Client::new()
            .post(format!("{}/token/revocation", self.issuer))
            .basic_auth(client, Some(format!("{client}-secret")))
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "revocation: {}", response.text().await.unwrap_or_default());
    }

    /// What it was asked to introspect so far: how many requests, and their tokens.
    pub async fn introspected(&self) -> (u64, Vec<String>) {
        let answer: Value = reqwest::get(format!("{}/test/introspected", self.issuer)).await.unwrap().json().await.unwrap();
        let tokens = answer["tokens"].as_array().unwrap().iter().filter_map(Value::as_str).map(str::to_owned).collect();
        (answer["count"].as_u64().unwrap(), tokens)
    }
}
