//! `tether tools [URL|NAME] [--json]`: lists a server's tools as a table
//! (name, first line of the description) or as the tool objects in JSON.

use std::io::Write;
use std::process::ExitCode;

use serde_json::Value;
use tether_client::PoolOptions;

use crate::client_config::{CommonArgs, Failure, failure, resolve, with_pool};

#[derive(clap::Args, Debug)]
pub struct ToolsArgs {
    /// Server URL (http://...) or a server name from the config file
    /// (default: $MCP_SERVER_URL, then `default` in the config).
    #[arg(value_name = "URL|NAME")]
    pub target: Option<String>,
    /// Print the tool objects as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

pub async fn run(args: ToolsArgs) -> ExitCode {
    let resolved = match resolve(args.target.as_deref(), &args.common).await {
        Ok(r) => r,
        Err(f) => return f.exit(),
    };
    with_pool(PoolOptions::default(), |pool| async move {
        let tools = match pool.list_tools(&resolved.spec).await {
            Ok(t) => t,
            Err(e) => return failure(e, &resolved).exit(),
        };
        let text = if args.json {
            match serde_json::to_string_pretty(&tools) {
                Ok(s) => s + "\n",
                Err(e) => return Failure::Connection(format!("cannot print the tools: {e}")).exit(),
            }
        } else {
            table(&tools)
        };
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        ExitCode::SUCCESS
    })
    .await
}

/// `NAME  DESCRIPTION` rows, names padded to one column.
pub fn table(tools: &[Value]) -> String {
    let rows: Vec<(String, String)> = tools
        .iter()
        .map(|t| {
            let name = t.get("name").and_then(Value::as_str).unwrap_or("?").to_owned();
            let description = t
                .get("description")
                .and_then(Value::as_str)
                .and_then(|d| d.lines().map(str::trim).find(|l| !l.is_empty()))
                .unwrap_or("")
                .to_owned();
            (name, description)
        })
        .collect();
    if rows.is_empty() {
        return "(the server offers no tools)\n".to_owned();
    }
    let width = rows.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(4).clamp(4, 40);
    let mut out = format!("{:width$}  DESCRIPTION\n", "NAME");
    for (name, description) in rows {
        out.push_str(format!("{name:width$}  {description}").trim_end());
        out.push('\n');
    }
    out
}
