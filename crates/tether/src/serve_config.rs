//! `tether serve --config FILE`: a TOML file with the serve flags as keys
//! (the flag's name, `_` or `-` between words), `[upstreams.NAME]` tables and
//! `[servers.NAME]` tables (virtual servers).
//!
//! The file's flags become command-line arguments placed before the ones
//! typed, so what is typed wins; a key whose `TETHER_*` variable is set is
//! skipped, so the environment wins over the file too. An unknown key is an
//! error that names the key and its line.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, bail};
use clap::CommandFactory;
use tether_gateway::config::{ServerConfig, ServerTable, UpstreamConfig, UpstreamTable};

/// The upstreams and virtual servers keys; everything else is a flag.
const UPSTREAMS: &str = "upstreams";
const SERVERS: &str = "servers";
const POLICIES: &str = "policies";
const SCOPE_IMPLIES: &str = "scope_implies";

/// `argv` with the flags of a `serve --config FILE` file put in front of
/// the typed ones (unchanged for anything else). The keeper's engine
/// (`tether engine`, the same flags) reads the file itself, on each start.
pub fn expand(argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    if !matches!(argv.get(1).and_then(|a| a.to_str()), Some("serve" | "engine")) {
        return Ok(argv);
    }
    let Some(path) = config_path(&argv[2..]) else { return Ok(argv) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read the config file {path}"))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("{path} is not valid TOML"))?;
    let known = known_flags();
    let mut from_file = Vec::new();
    for (key, value) in &table {
        if [UPSTREAMS, SERVERS, POLICIES, SCOPE_IMPLIES, "config"].contains(&key.as_str()) {
            continue;
        }
        let flag = key.replace('_', "-");
        let Some(env) = known.iter().find(|(name, _)| *name == flag).map(|(_, env)| env.clone()) else {
            bail!(
                "{path}:{}: unknown key `{key}`; the keys are the serve flags ({}), [upstreams.NAME], [servers.NAME], [[policies]] and [scope_implies]",
                line_of(&text, key),
                known.iter().map(|(n, _)| n.replace('-', "_")).collect::<Vec<_>>().join(", ")
            );
        };
        if env.is_some_and(|var| std::env::var_os(var).is_some()) {
            continue;
        }
        push_flag(&mut from_file, &flag, value).with_context(|| format!("{path}:{}: key `{key}`", line_of(&text, key)))?;
    }
    let mut expanded = argv[..2].to_vec();
    expanded.extend(from_file);
    expanded.extend_from_slice(&argv[2..]);
    Ok(expanded)
}

/// The upstream tables of the config file.
pub fn upstreams(path: &Path) -> anyhow::Result<Vec<UpstreamConfig>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config file {}", path.display()))?;
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        upstreams: std::collections::BTreeMap<String, UpstreamTable>,
    }
    let file: File = toml::from_str(&text).with_context(|| format!("{}: [upstreams] tables", path.display()))?;
    file.upstreams
        .into_iter()
        .map(|(name, table)| table.into_config(&name).map_err(|e| anyhow::anyhow!("{}: {e}", path.display())))
        .collect()
}

/// The virtual servers of the config file; `upstreams` are the names of
/// every upstream (of the file and the flags), which their members must be.
pub fn servers(path: &Path, upstreams: &[&str]) -> anyhow::Result<Vec<ServerConfig>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config file {}", path.display()))?;
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        servers: std::collections::BTreeMap<String, ServerTable>,
    }
    let file: File = toml::from_str(&text).with_context(|| format!("{}: [servers] tables", path.display()))?;
    file.servers
        .into_iter()
        .map(|(name, table)| table.into_config(&name, upstreams).map_err(|e| anyhow::anyhow!("{}: {e}", path.display())))
        .collect()
}

/// The policies of the config file (`[[policies]]`, `[scope_implies]`).
pub fn policies(path: &Path) -> anyhow::Result<tether_server::policy::PolicyConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("{}: [[policies]] and [scope_implies]", path.display()))
}

fn config_path(args: &[OsString]) -> Option<String> {
    let mut iter = args.iter().filter_map(|a| a.to_str());
    while let Some(arg) = iter.next() {
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(path.to_owned());
        }
        if arg == "--config" {
            return iter.next().map(str::to_owned);
        }
    }
    std::env::var("TETHER_CONFIG").ok()
}

/// Every serve flag's long name and its environment variable.
fn known_flags() -> Vec<(String, Option<String>)> {
    let command = crate::Cli::command();
    let Some(serve) = command.find_subcommand("serve") else { return Vec::new() };
    serve
        .get_arguments()
        .flat_map(|a| {
            let env = a.get_env().and_then(|e| e.to_str()).map(str::to_owned);
            // A key may be the flag's name or one of its aliases (`oauth_issuers`).
            let aliases = a.get_all_aliases().unwrap_or_default();
            a.get_long().into_iter().chain(aliases).map(move |l| (l.to_owned(), env.clone())).collect::<Vec<_>>()
        })
        .collect()
}

fn push_flag(out: &mut Vec<OsString>, flag: &str, value: &toml::Value) -> anyhow::Result<()> {
    match value {
        toml::Value::Boolean(true) => out.push(format!("--{flag}").into()),
        toml::Value::Boolean(false) => {}
        toml::Value::String(s) => out.push(format!("--{flag}={s}").into()),
        toml::Value::Integer(n) => out.push(format!("--{flag}={n}").into()),
        toml::Value::Array(items) => {
            for item in items {
                push_flag(out, flag, item)?;
            }
        }
        other => bail!("a string, number, boolean or list of them is wanted, not {}", other.type_str()),
    }
    Ok(())
}

/// The line a top-level key is set on (1-based; 0 if not found).
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn file_flags_go_before_typed_ones_and_unknown_keys_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:9999\"\njson_response = true\nallowed-origin = [\"https://a\", \"https://b\"]\n[upstreams.x]\nurl = \"http://127.0.0.1:1/mcp\"\n").unwrap();
        let p = path.to_str().unwrap();
        let out = expand(argv(&["tether", "serve", "--config", p, "--listen", "127.0.0.1:1"])).unwrap();
        let out: Vec<String> = out.into_iter().map(|a| a.into_string().unwrap()).collect();
        let (head, rest) = out.split_at(2);
        let (from_file, typed) = rest.split_at(rest.len() - 4);
        assert_eq!(head, ["tether", "serve"]);
        assert_eq!(typed, ["--config", p, "--listen", "127.0.0.1:1"], "what was typed comes last, so it wins");
        let mut from_file = from_file.to_vec();
        from_file.sort();
        assert_eq!(
            from_file,
            ["--allowed-origin=https://a", "--allowed-origin=https://b", "--json-response", "--listen=127.0.0.1:9999"]
        );
        assert_eq!(upstreams(&path).unwrap()[0].name, "x");
        std::fs::write(&path, "listen = \"127.0.0.1:9999\"\n\nsesion_ttl = \"1m\"\n").unwrap();
        let err = expand(argv(&["tether", "serve", "--config", p])).unwrap_err().to_string();
        assert!(err.contains(":3: unknown key `sesion_ttl`"), "{err}");
    }

    #[test]
    fn the_console_can_be_turned_off_in_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.toml");
        let p = path.to_str().unwrap();
        std::fs::write(&path, "no_console = true\n").unwrap();
        let out = expand(argv(&["tether", "serve", "--config", p])).unwrap();
        assert_eq!(out, argv(&["tether", "serve", "--no-console", "--config", p]));
        std::fs::write(&path, "no-console = false\n").unwrap();
        let out = expand(argv(&["tether", "serve", "--config", p])).unwrap();
        assert_eq!(out, argv(&["tether", "serve", "--config", p]), "false leaves the console on");
    }
}
