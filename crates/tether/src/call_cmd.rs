//! `tether call [URL|NAME] TOOL (--json ARGS | --arg key=value ...)`: calls
//! one tool and prints its complete result (a resumable result is followed
//! to the end, its chunks joined in order): the text as is when the result
//! is only text, else the result object as JSON. A progress bar runs on
//! stderr while a resumable call waits, only when stderr is a terminal.
//! Exit 1 when the tool reports `isError`.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tether_client::{CallProgress, PoolOptions, ProgressHandler};

use crate::client_config::{CommonArgs, Failure, failure, resolve, with_pool};

#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// `[URL|NAME] TOOL`: the server (a URL, or a server name from the
    /// config; default $MCP_SERVER_URL, then `default` in the config) and
    /// the tool to call.
    #[arg(value_name = "[URL|NAME] TOOL", num_args = 1..=2, required = true)]
    pub positionals: Vec<String>,
    /// The arguments as one JSON object (`-` reads it from stdin).
    #[arg(long = "json", value_name = "ARGS", conflicts_with = "args")]
    pub json: Option<String>,
    /// One argument: `key=value` (numbers, true, false and null become JSON
    /// values, anything else a string) or `key:=JSON` (any JSON value, e.g.
    /// `n:='"42"'` for the string "42"). Repeatable.
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

pub async fn run(args: CallArgs) -> ExitCode {
    let (target, tool) = match args.positionals.as_slice() {
        [tool] => (None, tool.clone()),
        [target, tool] => (Some(target.as_str()), tool.clone()),
        _ => return Failure::Usage("expected [URL|NAME] TOOL".into()).exit(),
    };
    let arguments = match arguments(args.json.as_deref(), &args.args) {
        Ok(a) => a,
        Err(f) => return f.exit(),
    };
    let resolved = match resolve(target, &args.common).await {
        Ok(r) => r,
        Err(f) => return f.exit(),
    };
    let bar = progress_bar(&tool);
    with_pool(PoolOptions::default(), |pool| async move {
        let handler = bar.as_ref().map(|b| progress_handler(b.clone()));
        let outcome = pool.call_tool(&resolved.spec, &tool, Value::Object(arguments), handler).await;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let result = match outcome {
            Ok(r) => r,
            Err(e) => return failure(e, &resolved).exit(),
        };
        let _ = std::io::stdout().lock().write_all(render(&result).as_bytes());
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            eprintln!("tether: the tool {tool} reported an error");
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    })
    .await
}

/// The tool's arguments from `--json` or `--arg`s.
pub fn arguments(json: Option<&str>, pairs: &[String]) -> Result<Map<String, Value>, Failure> {
    if let Some(text) = json {
        let text = if text == "-" {
            let mut s = String::new();
            std::io::stdin()
                .take(64 * 1024 * 1024)
                .read_to_string(&mut s)
                .map_err(|e| Failure::Usage(format!("cannot read --json from stdin: {e}")))?;
            s
        } else {
            text.to_owned()
        };
        return match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => {
                Err(Failure::Usage("--json must be a JSON object of the tool's arguments, e.g. '{\"text\": \"hi\"}'".into()))
            }
            Err(e) => Err(Failure::Usage(format!("--json is not valid JSON: {e}"))),
        };
    }
    let mut out = Map::new();
    for pair in pairs {
        let (key, value) = if let Some((k, raw)) = pair.split_once(":=") {
            let v = serde_json::from_str(raw)
                .map_err(|e| Failure::Usage(format!("--arg {pair}: the value after := is not valid JSON: {e}")))?;
            (k, v)
        } else if let Some((k, v)) = pair.split_once('=') {
            (k, scalar(v))
        } else {
            return Err(Failure::Usage(format!("--arg {pair:?}: expected key=value or key:=JSON")));
        };
        if key.is_empty() {
            return Err(Failure::Usage(format!("--arg {pair:?}: the key is empty")));
        }
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// `42`, `-1.5`, `true`, `false`, `null` as JSON; anything else as a string.
fn scalar(v: &str) -> Value {
    match serde_json::from_str::<Value>(v) {
        Ok(j @ (Value::Number(_) | Value::Bool(_) | Value::Null)) => j,
        _ => Value::String(v.to_owned()),
    }
}

/// Only text content (and no structured content): the text, joined as is.
/// Otherwise the result object as JSON.
pub fn render(result: &Value) -> String {
    let content = result.get("content").and_then(Value::as_array);
    let only_text = result.get("structuredContent").is_none_or(Value::is_null)
        && content.is_some_and(|c| !c.is_empty() && c.iter().all(|b| b.get("type").and_then(Value::as_str) == Some("text")));
    let mut out = if only_text {
        content.into_iter().flatten().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<String>()
    } else {
        serde_json::to_string_pretty(result).unwrap_or_else(|_| result.to_string())
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn progress_bar(tool: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {prefix} {wide_msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_prefix(tool.to_owned());
    Some(bar)
}

/// Shows the bar once the call turns out to be resumable (or the server
/// reports progress); updates it each round.
fn progress_handler(bar: indicatif::ProgressBar) -> ProgressHandler {
    Arc::new(move |p: CallProgress| match p {
        CallProgress::Round(r) if r.more => {
            bar.enable_steady_tick(Duration::from_millis(120));
            let state = if r.pending { "working" } else { "receiving" };
            bar.set_message(format!("{state}: round {}, {} received", r.number, size(r.bytes)));
        }
        CallProgress::Round(_) => {}
        CallProgress::Progress { progress, total, message } => {
            bar.enable_steady_tick(Duration::from_millis(120));
            let amount = match total {
                Some(t) if t > 0.0 => format!("{progress}/{t} ({:.0}%)", progress / t * 100.0),
                _ => format!("{progress}"),
            };
            bar.set_message(match message {
                Some(m) => format!("{amount} {m}"),
                None => amount,
            });
        }
    })
}

fn size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn args_become_json_values() {
        let m = arguments(
            None,
            &["n=3".into(), "s=hello world".into(), "b=true".into(), "z=007".into(), "q:=\"42\"".into(), "o:={\"a\":[1]}".into()],
        )
        .map_err(|_| ())
        .unwrap();
        assert_eq!(Value::Object(m), json!({"n": 3, "s": "hello world", "b": true, "z": "007", "q": "42", "o": {"a": [1]}}));
        assert!(matches!(arguments(None, &["novalue".into()]), Err(Failure::Usage(_))));
        assert!(matches!(arguments(Some("[1]"), &[]), Err(Failure::Usage(_))));
        assert!(matches!(arguments(Some("{bad"), &[]), Err(Failure::Usage(_))));
    }

    #[test]
    fn text_results_print_as_text_and_others_as_json() {
        assert_eq!(render(&json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})), "ab\n");
        let structured = json!({"content": [{"type": "text", "text": "{}"}], "structuredContent": {"x": 1}});
        assert!(render(&structured).contains("\"structuredContent\""));
        assert!(render(&json!({"content": [{"type": "image", "data": "", "mimeType": "image/png"}]})).contains("image/png"));
    }
}
