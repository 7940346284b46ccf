//! `stdio_echo`: the stdio MCP server of tether-bench's `gateway_stdio`.
//!
//! Newline-delimited JSON-RPC on stdin and stdout, one message a line, as the
//! MCP stdio transport has it; no SDK. It answers `initialize` (the client's
//! protocol version when it is one it knows, else the latest; a `tools`
//! capability), `ping`, `tools/list` and `tools/call` of `thought`, the tool
//! the bench's load calls everywhere (the input and output schema of
//! `rmcp_ref`'s). Notifications are read and ignored; any other request is
//! answered `-32601`.
//!
//! It keeps no state: `thoughtHistoryLength` is the call's `thoughtNumber`,
//! which is what a session's own history would hold for the load's nth call
//! (the load numbers each session's calls 1, 2, 3…). So the load's checks
//! hold whether a gateway gives each session a child of its own (tether,
//! supergateway's stateful mode) or shares one child among all sessions
//! (mcp-proxy). It exits at the end of stdin.

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

fn thought_tool() -> Value {
    json!({
        "name": "thought",
        "description": "Record one step of sequential thinking (this server keeps no history).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "thought": {"type": "string"},
                "thoughtNumber": {"type": "integer", "minimum": 1},
                "totalThoughts": {"type": "integer", "minimum": 1},
                "nextThoughtNeeded": {"type": "boolean"}
            },
            "required": ["thought", "thoughtNumber", "totalThoughts", "nextThoughtNeeded"]
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "thoughtNumber": {"type": "integer"},
                "totalThoughts": {"type": "integer"},
                "nextThoughtNeeded": {"type": "boolean"},
                "branches": {"type": "array", "items": {"type": "string"}},
                "thoughtHistoryLength": {"type": "integer"}
            },
            "required": ["thoughtNumber", "totalThoughts", "nextThoughtNeeded", "branches", "thoughtHistoryLength"]
        }
    })
}

fn positive(args: &Map<String, Value>, key: &str) -> Result<u64, String> {
    match args.get(key).and_then(Value::as_u64) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{key}` must be an integer of 1 or more")),
    }
}

/// The structuredContent of one `thought` call.
fn thought(args: &Map<String, Value>) -> Result<Value, String> {
    match args.get("thought") {
        Some(Value::String(s)) if !s.trim().is_empty() => {}
        _ => return Err("`thought` must be a non-empty string".into()),
    }
    let number = positive(args, "thoughtNumber")?;
    let total = positive(args, "totalThoughts")?.max(number);
    let next = args.get("nextThoughtNeeded").and_then(Value::as_bool).ok_or("`nextThoughtNeeded` must be true or false")?;
    Ok(json!({
        "thoughtNumber": number,
        "totalThoughts": total,
        "nextThoughtNeeded": next,
        "branches": [],
        "thoughtHistoryLength": number,
    }))
}

/// The answer to one request: `Ok(result)` or `Err((code, message))`.
fn answer(method: &str, params: &Value) -> Result<Value, (i64, String)> {
    match method {
        "initialize" => {
            let requested = params.get("protocolVersion").and_then(Value::as_str);
            let version = requested.filter(|v| PROTOCOL_VERSIONS.contains(v)).unwrap_or(PROTOCOL_VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "tether-bench-stdio-echo", "version": env!("CARGO_PKG_VERSION")}
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": [thought_tool()]})),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            if name != "thought" {
                return Err((-32602, format!("unknown tool `{name}`")));
            }
            let empty = Map::new();
            let args = params.get("arguments").and_then(Value::as_object).unwrap_or(&empty);
            Ok(match thought(args) {
                Ok(structured) => json!({
                    "content": [{"type": "text", "text": structured.to_string()}],
                    "structuredContent": structured,
                    "isError": false
                }),
                Err(message) => json!({"content": [{"type": "text", "text": message}], "isError": true}),
            })
        }
        other => Err((-32601, format!("method not found: {other}"))),
    }
}

/// The line to write for one line read, if any (notifications, responses
/// and blank lines get none; a line that is not JSON gets a parse error).
fn reply(line: &str) -> Option<Value> {
    if line.trim().is_empty() {
        return None;
    }
    let message: Value = match serde_json::from_str(line) {
        Ok(m) => m,
        Err(e) => {
            return Some(
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("parse error: {e}")}}),
            );
        }
    };
    let id = message.get("id").filter(|id| !id.is_null())?.clone();
    let method = message.get("method").and_then(Value::as_str)?;
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    Some(match answer(method, &params) {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    })
}

fn main() -> std::io::Result<()> {
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lines() {
        if let Some(out) = reply(&line?) {
            serde_json::to_writer(&mut stdout, &out)?;
            stdout.write_all(b"\n")?;
            stdout.flush()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_initialize_list_and_call_and_ignores_notifications() {
        let init = reply(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#).unwrap();
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        assert!(init["result"]["capabilities"]["tools"].is_object());
        assert_eq!(reply(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), None);
        let list = reply(r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#).unwrap();
        assert_eq!(list["id"], "a");
        assert_eq!(list["result"]["tools"][0]["name"], "thought");
        let call = reply(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"thought","arguments":{"thought":"t","thoughtNumber":7,"totalThoughts":7,"nextThoughtNeeded":true}}}"#,
        )
        .unwrap();
        assert_eq!(
            call["result"]["structuredContent"],
            json!({"thoughtNumber": 7, "totalThoughts": 7, "nextThoughtNeeded": true, "branches": [], "thoughtHistoryLength": 7})
        );
        let bad = reply(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"thought","arguments":{}}}"#).unwrap();
        assert_eq!(bad["result"]["isError"], true);
        assert_eq!(reply(r#"{"jsonrpc":"2.0","id":9,"method":"nope"}"#).unwrap()["error"]["code"], -32601);
        assert_eq!(reply("not json").unwrap()["error"]["code"], -32700);
    }
}
