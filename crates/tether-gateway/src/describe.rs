//! What operators see of one upstream ([`upstream`]: the admin API's `GET
//! /admin/endpoints`, through `McpApp::describe`): its kind and target,
//! its state (`up`, `restarting`, `failing`) with the last error, its live
//! connections (a command's children) with whose each is, and for a
//! command its use of `max_processes` and each principal's share.
//!
//! States: `failing` while new connections are refused at once (the
//! backoff, `backoff.rs`), with how long still; `restarting` when a start
//! failed within the last 30 s but the next use tries again; `up`
//! otherwise. A child's pid is the keeper's to tell (`/admin/keeper`,
//! labelled `UPSTREAM/SESSION`): a connection here knows its link, not its
//! process.
//!
//! Bounded: at most [`MAX_LISTED`] connections and principals are listed,
//! with the totals beside them.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::backoff::Backoff;
use crate::config::{Target, UpstreamConfig};
use crate::links::Links;
use crate::processes::{Processes, ServerProcesses};

/// Connections and principals listed at most.
pub(crate) const MAX_LISTED: usize = 200;

/// A URL as shown: scheme, host and path, without credentials or a query
/// (a URL may carry a key there).
fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let rest = match rest.split_once('/') {
        Some((authority, path)) => format!("{}/{path}", authority.rsplit('@').next().unwrap_or(authority)),
        None => rest.rsplit('@').next().unwrap_or(rest).to_owned(),
    };
    if scheme.is_empty() { rest } else { format!("{scheme}://{rest}") }
}

/// One upstream's account of itself (see the module doc).
pub(crate) fn upstream(config: &UpstreamConfig, links: &Links, backoff: &Backoff, processes: Option<&Processes>) -> Value {
    let (failures, wait, last_error) = backoff.seen();
    let state = match (wait, failures) {
        (Some(_), _) => "failing",
        (None, 0) => "up",
        (None, _) => "restarting",
    };
    let live: Vec<_> = links.live().into_iter().filter(|link| link.has_live()).collect();
    let mut shares: HashMap<String, usize> = HashMap::new();
    for link in &live {
        *shares.entry(link.principal().unwrap_or_default()).or_default() += 1;
    }
    let connections: Vec<Value> = live
        .iter()
        .take(MAX_LISTED)
        .map(|link| {
            let idle = link.idle_for();
            json!({
                "principal": link.principal(),
                "busy": idle.is_none(),
                "idle_ms": idle.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
        })
        .collect();
    let mut shares: Vec<(String, usize)> = shares.into_iter().collect();
    shares.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let principals = shares.len();
    let shares: Vec<Value> =
        shares.into_iter().take(MAX_LISTED).map(|(principal, n)| json!({"principal": principal, "connections": n})).collect();
    let mut out = json!({
        "kind": "upstream",
        "name": config.name,
        "state": state,
        "last_error": last_error,
        "failures_30s": failures,
        "retry_in_ms": wait.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "connections": connections,
        "connections_total": live.len(),
        "shares": shares,
        "principals": principals,
    });
    match &config.target {
        Target::Command(spec) => {
            out["transport"] = json!("stdio");
            out["target"] = json!(spec.display());
            out["max_processes"] = json!(spec.max_processes);
            out["max_processes_per_principal"] = json!(spec.max_processes_per_principal);
            out["processes_live"] = json!(processes.map(Processes::live));
            let server = ServerProcesses::global();
            out["max_stdio_processes"] = json!({"live": server.live(), "max": server.max()});
        }
        Target::Url(spec) => {
            out["transport"] = json!("url");
            out["target"] = json!(shown_url(&spec.url));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_credentials_or_query() {
        assert_eq!(shown_url("https://user:pw@mcp.example/v1/mcp?key=s3cret#x"), "https://mcp.example/v1/mcp");
        assert_eq!(shown_url("http://127.0.0.1:9/mcp"), "http://127.0.0.1:9/mcp");
        assert_eq!(shown_url("http://k@h"), "http://h");
    }

    #[test]
    fn a_failing_upstream_says_so_with_its_last_error() {
        let config = UpstreamConfig::new("x".into(), Target::Command(crate::config::CommandSpec::new(vec!["false".into()])));
        let (links, backoff) = (Links::default(), Backoff::default());
        assert_eq!(upstream(&config, &links, &backoff, None)["state"], "up");
        backoff.failed("x", "exit status 1");
        let seen = upstream(&config, &links, &backoff, None);
        assert_eq!((seen["state"].as_str(), seen["last_error"].as_str()), (Some("restarting"), Some("exit status 1")));
        backoff.failed("x", "exit status 1");
        backoff.failed("x", "exit status 2");
        let seen = upstream(&config, &links, &backoff, None);
        assert_eq!((seen["state"].as_str(), seen["last_error"].as_str()), (Some("failing"), Some("exit status 2")));
        assert!(seen["retry_in_ms"].as_u64().is_some());
        assert_eq!(seen["transport"], "stdio");
    }
}
