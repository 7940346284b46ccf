//! agentgateway (<https://github.com/agentgateway/agentgateway>), a Rust
//! gateway with an MCP front, as the bench runs it: built by
//! `scripts/bench` from its source at the pinned release (the source is in
//! no package registry: it is brought into `bench/agentgateway/src`, or
//! `AGENTGATEWAY_SRC`, which git ignores), checked against that release
//! here, and started with one MCP target (the bench's upstream) on a
//! loopback port, sessions on. docs/benchmarks.md says how to bring it.

use std::path::Path;

use serde_json::json;

/// The release the bench builds (its newest when it was added).
pub const PINNED_TAG: &str = "v1.4.1";
/// The commit of [`PINNED_TAG`].
pub const PINNED_COMMIT: &str = "163ea2146acb7b82082acea30ed691b29079095f";
/// FNV-1a (64 bits) of [`PINNED_TAG`]'s workspace `Cargo.toml` (its
/// dependency versions move with every release): how a source that is not a
/// git checkout (an archive, a snapshot) is recognised as that release.
const PINNED_CARGO_TOML_FNV: u64 = 0x8858_67a1_2fd0_e12b;

/// The one MCP target's name (with one target, agentgateway does not prefix tool names with it).
const TARGET_NAME: &str = "echo";

/// The environment variables agentgateway reads over its config (its
/// listeners, threads, telemetry, sessions): removed from its environment,
/// so the bench's config alone decides.
pub const ENVIRONMENT: [&str; 17] = [
    "ADMIN_ADDR",
    "STATS_ADDR",
    "READINESS_ADDR",
    "CPU_LIMIT",
    "WORKER_THREADS",
    "THREADING_MODE",
    "IPV6_ENABLED",
    "LOCAL_XDS_PATH",
    "XDS_ADDRESS",
    "OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "SESSION_KEY",
    "CONNECTION_TERMINATION_DEADLINE",
    "CONNECTION_MIN_TERMINATION_DEADLINE",
    "TERMINATION_GRACE_PERIOD_SECONDS",
    "RUST_LOG",
    "KUBERNETES_SERVICE_HOST",
];

/// What agentgateway's MCP target is.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A Streamable HTTP MCP endpoint (gateway_http's `rmcp_ref`).
    Url(&'a str),
    /// A stdio MCP server, this program without arguments (gateway_stdio's
    /// `stdio_echo`): a child per session, as every stdio gateway here runs it.
    Stdio(&'a Path),
}

/// agentgateway's config (JSON, which its YAML reader takes), passed with
/// `--config`: a gateway `default` on `port` (agentgateway binds every
/// address; the bench calls it on 127.0.0.1) whose MCP route (`/mcp`)
/// serves the one target, stateful (an `Mcp-Session-Id` per client, kept in
/// memory); its readiness probe on 127.0.0.1:`ready`
/// (`/healthz/ready`, the bench's health check); its admin and metrics
/// listeners off (two instances run at once); no authentication, no
/// tracing; its log at `warn` (at `info` it writes a line per request).
pub fn config(port: u16, ready: u16, target: &Target<'_>) -> String {
    let target = match target {
        Target::Url(url) => json!({"name": TARGET_NAME, "mcp": {"host": url}}),
        Target::Stdio(program) => json!({"name": TARGET_NAME, "stdio": {"cmd": program.to_string_lossy()}}),
    };
    json!({
        "config": {
            "adminAddr": "off",
            "statsAddr": "off",
            "readinessAddr": format!("127.0.0.1:{ready}"),
            "enableIpv6": false,
            "logging": {"level": "warn"},
        },
        "gateways": {"default": {"port": port}},
        "mcp": {"statefulMode": "stateful", "targets": [target]},
    })
    .to_string()
}

/// Which release the source in `src` is: `Ok` with its description when it
/// is [`PINNED_TAG`], else `Err` with what it is. A git checkout (`src/.git`)
/// is judged by its commit, any other tree by its `Cargo.toml`.
pub fn release_of(src: &Path) -> Result<String, String> {
    let pinned = format!("{PINNED_TAG} ({PINNED_COMMIT})");
    if src.join(".git").exists() {
        let head = std::process::Command::new("git")
            .arg("-C")
            .arg(src)
            .args(["rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        return match head {
            Some(commit) if commit == PINNED_COMMIT => Ok(format!("{pinned}, a git checkout")),
            Some(commit) => Err(format!("a git checkout at {commit}, not the pinned {pinned}")),
            None => Err(format!("a git checkout whose commit `git rev-parse HEAD` cannot read, not known to be {pinned}")),
        };
    }
    match std::fs::read(src.join("Cargo.toml")) {
        Ok(manifest) if fnv1a(&manifest) == PINNED_CARGO_TOML_FNV => Ok(pinned),
        Ok(_) => Err(format!("a tree whose Cargo.toml is not that of the pinned {pinned}")),
        Err(e) => Err(format!("no readable {}: {e}", src.join("Cargo.toml").display())),
    }
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::{Target, config, fnv1a, release_of};
    use serde_json::{Value, json};

    #[test]
    fn the_config_has_one_stateful_target_and_its_probe_on_loopback() {
        let http: Value = serde_json::from_str(&config(4000, 4001, &Target::Url("http://127.0.0.1:5000/mcp"))).expect("JSON");
        assert_eq!(http["gateways"], json!({"default": {"port": 4000}}));
        assert_eq!(http["config"]["readinessAddr"], "127.0.0.1:4001");
        assert_eq!(http["config"]["adminAddr"], "off");
        assert_eq!(http["config"]["statsAddr"], "off");
        assert_eq!(http["mcp"]["statefulMode"], "stateful");
        assert_eq!(http["mcp"]["targets"], json!([{"name": "echo", "mcp": {"host": "http://127.0.0.1:5000/mcp"}}]));
        let stdio: Value = serde_json::from_str(&config(4000, 4001, &Target::Stdio("/t/stdio \"echo\"".as_ref()))).expect("JSON");
        assert_eq!(stdio["mcp"]["targets"], json!([{"name": "echo", "stdio": {"cmd": "/t/stdio \"echo\""}}]));
    }

    #[test]
    fn a_source_is_recognised_by_its_cargo_toml() {
        // The FNV-1a test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let dir = tempfile::tempdir().expect("a temp dir");
        assert!(release_of(dir.path()).is_err_and(|e| e.starts_with("no readable")));
        std::fs::write(dir.path().join("Cargo.toml"), "[workspace]\n").expect("written");
        assert!(release_of(dir.path()).is_err_and(|e| e.contains("not that of the pinned v1.4.1")));
    }
}
