//! tools_call_oauth's authorization server: `interop/oauth/provider.mjs`
//! (oidc-provider from npm, the one the OAuth tests use) on a free port,
//! and JWT access tokens from it by client credentials for a resource.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

/// How long the authorization server may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The authorization server, killed when dropped.
pub struct Issuer {
    pub url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Issuer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Issuer {
    /// Starts `node SCRIPT PORT KEYFILE` and waits for its `READY`.
    pub async fn start(script: &Path) -> anyhow::Result<Issuer> {
        let dir = tempfile::Builder::new().prefix("tether-bench-issuer-").tempdir().context("cannot create a temp dir")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new("node")
            .arg(script)
            .arg(port.to_string())
            .arg(dir.path().join("key.pem"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start node {}", script.display()))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let ready = tokio::time::timeout(
            START_TIMEOUT,
            tokio::task::spawn_blocking(move || {
                let mut lines = std::io::BufReader::new(stdout).lines();
                let first = lines.next().and_then(Result::ok);
                // Drain the rest so the provider never blocks on a full pipe.
                std::thread::spawn(move || lines.for_each(drop));
                first
            }),
        )
        .await;
        let issuer = Issuer { url: format!("http://127.0.0.1:{port}"), child, _dir: dir };
        match ready {
            Ok(Ok(Some(line))) if line == "READY" => Ok(issuer),
            Ok(_) => bail!("{} did not print READY", script.display()),
            Err(_) => bail!("{} did not start within {START_TIMEOUT:?}", script.display()),
        }
    }

    /// `n` access tokens of the client `svc` for `resource`, by client credentials.
    pub async fn tokens(&self, resource: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let http = reqwest::Client::new();
        let mut tokens = Vec::with_capacity(n);
        for _ in 0..n {
            let answer: Value = http
                .post(format!("{}/token", self.url))
                .basic_auth("svc", Some("svc-secret"))
                .form(&[("grant_type", "client_credentials"), ("resource", resource), ("scope", "tools:read tools:write")])
                .send()
                .await
                .context("the token request failed")?
                .json()
                .await
                .context("the token answer is not JSON")?;
            let token = answer["access_token"].as_str().with_context(|| format!("no access_token in {answer}"))?;
            tokens.push(token.to_owned());
        }
        Ok(tokens)
    }
}
