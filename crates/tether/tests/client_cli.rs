//! `tether tools` and `tether call` as a user runs them, against a real
//! `tether serve` on loopback: output formats, the config file and the
//! generic environment (`MCP_SERVER_URL`, `MCP_AUTH_TOKEN`, `auth_env`),
//! and the exit codes: 0 success, 1 the tool returned isError, 2 usage,
//! 3 connection/protocol/auth failure with a one-line reason on stderr.

mod client_support;

use client_support::*;
use serde_json::Value;

const TOKEN: &str = "cli-token-0123456789abcdef";

fn one_line_reason(o: &std::process::Output) -> String {
    let e = stderr(o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stderr: {e:?}");
    assert!(lines[0].starts_with("tether: "), "{e:?}");
    lines[0].to_owned()
}

#[test]
fn tools_prints_a_table_or_json() {
    let server = Server::start(&[]);
    let home = tempfile::tempdir().unwrap();
    let out = tether(&["tools", &server.url()], &[], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("NAME"), "{table}");
    let thought = table.lines().find(|l| l.starts_with("thought ")).expect("a thought row");
    assert!(thought.contains("Record one step of sequential thinking"), "{thought}");
    assert_eq!(stderr(&out), "");

    let out = tether(&["tools", &server.url(), "--json"], &[], home.path());
    assert_eq!(out.status.code(), Some(0));
    let tools: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = tools.as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"thought") && names.contains(&"session"), "{names:?}");
    assert!(tools[0]["inputSchema"].is_object(), "whole tool objects");
}

#[test]
fn call_prints_the_result_and_exits_by_outcome() {
    let server = Server::start(&[]);
    let home = tempfile::tempdir().unwrap();
    let url = server.url();

    // --arg values: numbers and booleans become JSON.
    let out = tether(
        &[
            "call",
            &url,
            "thought",
            "--arg",
            "thought=first step",
            "--arg",
            "thoughtNumber=1",
            "--arg",
            "totalThoughts=2",
            "--arg",
            "nextThoughtNeeded=true",
        ],
        &[],
        home.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).expect("a structured result prints as JSON");
    assert_eq!(result["structuredContent"]["thoughtNumber"], 1);
    assert_eq!(stderr(&out), "");

    // A text-only result prints as text.
    let out = tether(
        &["call", &url, "session", "--json", r#"{"operation":"export","format":"markdown","sessionId":"nope"}"#],
        &[],
        home.path(),
    );
    // (an unknown notebook session is a tool error: isError, exit 1, the text on stdout)
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("no such session"), "{}", stdout(&out));
    assert!(!stdout(&out).trim_start().starts_with('{'), "text as is");
    assert!(one_line_reason(&out).contains("reported an error"));

    // Usage errors: exit 2.
    for args in [
        vec!["call", &url, "thought", "--json", "{not json"],
        vec!["call", &url, "thought", "--json", "[1, 2]"],
        vec!["call", &url, "thought", "--arg", "no-equals-sign"],
        vec!["call", "no-such-server", "thought"],
        vec!["call", &url, "thought", "--arg", "thought=x", "--requires-session", "false", "--protocol", "session"],
    ] {
        let out = tether(&args, &[], home.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        one_line_reason(&out);
    }
    let out = tether(&["call", &url, "thought", "--requires-session", "false", "--protocol", "session"], &[], home.path());
    assert!(stderr(&out).contains("requires_session"), "the setting is named: {}", stderr(&out));
    let out = tether(&["call", "--json", "{}"], &[], home.path());
    assert_eq!(out.status.code(), Some(2), "clap usage error");
    // A JSON-RPC "invalid params" refusal (here: an unknown tool) is a usage error too.
    let out = tether(&["call", &url, "nosuchtool"], &[], home.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(one_line_reason(&out).contains("nosuchtool"));
    // A tool's own validation error is the tool's result: isError, exit 1.
    let out = tether(&["call", &url, "thought", "--arg", "thought=x"], &[], home.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("thoughtNumber"), "{}", stdout(&out));

    // Nothing listening: exit 3 with the reason.
    let dead = format!("http://127.0.0.1:{}/mcp", free_port());
    let out = tether(&["call", &dead, "thought", "--json", "{}"], &[], home.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(one_line_reason(&out).contains("cannot connect"), "{}", stderr(&out));
    let out = tether(&["tools", &dead], &[], home.path());
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn tokens_come_from_the_environment_and_a_401_says_how_to_pass_one() {
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens");
    std::fs::write(&file, format!("{TOKEN} alice\n")).unwrap();
    let file = file.display().to_string();
    let server = Server::start(&["--auth-tokens", &file]);
    let home = tempfile::tempdir().unwrap();

    let out = tether(&["tools", &server.url()], &[], home.path());
    assert_eq!(out.status.code(), Some(3));
    let reason = one_line_reason(&out);
    assert!(reason.contains("401") && reason.contains("MCP_AUTH_TOKEN") && reason.contains("auth_env"), "{reason}");

    let out = tether(&["tools", &server.url()], &[("MCP_AUTH_TOKEN", TOKEN)], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = tether(&["tools", &server.url()], &[("MCP_AUTH_TOKEN", "wrong-token-0123456789")], home.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(one_line_reason(&out).contains("refused"), "{}", stderr(&out));

    // A configured server with auth_env takes its token from that variable only.
    let config = home.path().join("tether");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!(
            "default = \"notes\"\n\n[servers.notes]\nurl = \"{}\"\nrequires_session = \"auto\"\nauth_env = \"NOTES_TOKEN\"\n",
            server.url()
        ),
    )
    .unwrap();
    let out = tether(&["tools", "notes"], &[("MCP_AUTH_TOKEN", TOKEN)], home.path());
    assert_eq!(out.status.code(), Some(3), "MCP_AUTH_TOKEN does not go to a server with its own auth_env");
    assert!(one_line_reason(&out).contains("NOTES_TOKEN"), "{}", stderr(&out));
    let out = tether(&["tools", "notes"], &[("NOTES_TOKEN", TOKEN)], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // No target: `default` from the default config path.
    let out = tether(&["tools"], &[("NOTES_TOKEN", TOKEN)], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn targets_come_from_the_config_file_or_mcp_server_url() {
    let server = Server::start(&[]);
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("elsewhere.toml");
    std::fs::write(&file, format!("[servers.nb]\nurl = \"{}\"\nrequires_session = true\n", server.url())).unwrap();
    let file = file.display().to_string();

    let out = tether(&["tools", "nb", "--config", &file], &[], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = tether(&["call", "nb", "session", "--arg", "operation=list", "--config", &file], &[], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // MCP_SERVER_URL is the default URL; `call TOOL` alone uses it.
    let out = tether(&["call", "session", "--arg", "operation=list"], &[("MCP_SERVER_URL", &server.url())], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = tether(&["tools"], &[], home.path());
    assert_eq!(out.status.code(), Some(2), "no target at all is a usage error");
    assert!(one_line_reason(&out).contains("MCP_SERVER_URL"));

    // A broken config file: exit 2 naming the file.
    std::fs::write(&file, "[servers.nb]\nurl = 3\n").unwrap();
    let out = tether(&["tools", "nb", "--config", &file], &[], home.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line_reason(&out).contains("elsewhere.toml"), "{}", stderr(&out));
    let out = tether(&["tools", "nb", "--config", "/nonexistent/tether.toml"], &[], home.path());
    assert_eq!(out.status.code(), Some(2));
}
