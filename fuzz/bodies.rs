// What each fuzz target does with its input, one function per target: any
// panic is a bug. Shared by the libFuzzer targets (`fuzz_targets/*.rs`,
// run by `scripts/fuzz`) and by the test that replays every input kept in
// `fuzz/regressions/` in the normal suite
// (`crates/tether/tests/fuzz_regressions.rs`), each through `include!`.

use serde_json::{Map, Value, json};
use tether_gateway::config::{UpstreamTable, parse_flag};
use tether_server::engine::mrtr;
use tether_server::engine::{operations, resume};
use tether_server::http::TokenTable;
use tether_server::http::sessionless;
use tether_server::ids::EventId;
use tether_server::tether_wire::parse_message;
use tether_server::tether_wire::sse::Decoder;

/// Feeds arbitrary bytes to every parser of peer input: the JSON-RPC
/// envelope, Last-Event-ID, and resume tokens. Any panic is a bug.
pub fn envelope(data: &[u8]) {
    let _ = parse_message(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = EventId::parse(s);
        let _ = resume::open_token(&[7u8; 32], s);
    }
}

/// The SSE decoder (`tether_wire::sse::Decoder`), which reads every stream a
/// peer sends the client, the bridge and the gateway: arbitrary bytes, cut
/// into chunks where the input says. Any panic, or an event larger than the
/// decoder's bound, is a bug.
pub fn sse(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else { return };
    let step = usize::from(cut).max(1);
    let mut decoder = Decoder::new();
    for chunk in rest.chunks(step) {
        if decoder.push(bytes::Bytes::copy_from_slice(chunk)).is_err() {
            break;
        }
    }
}

/// Tokens and token files from peers and operators: operation tokens
/// (`rt1_…`, parsed before their tag is checked), resume tokens (`tt1_…`),
/// and `--auth-tokens` files. Any panic is a bug.
pub fn tokens(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = operations::parse(text);
    let _ = resume::open_token(&[3u8; 32], text);
    if let Ok(table) = TokenTable::parse(text) {
        // Every line's token resolves; a prefix of one never does by accident of length.
        for line in text.lines() {
            if let Some(token) = line.split_whitespace().next() {
                let _ = table.principal(token);
            }
        }
    }
}

/// What a 2026-07-28 client controls before any application sees it: the
/// `requestState` it echoes (sealed, but parsed before its tag is checked),
/// `Mcp-Name` / `Mcp-Param-*` values with the base64 sentinel, and the body's
/// `_meta` claim that makes a request sessionless. Any panic is a bug.
pub fn sessionless(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut params = Map::new();
        params.insert("name".into(), json!("thought"));
        params.insert("inputResponses".into(), json!({"roots/list#0": {"roots": []}}));
        params.insert("requestState".into(), Value::String(text.to_owned()));
        let _ = mrtr::take(&[3u8; 32], "principal", "tools/call", &mut params);
        let mut headers = axum::http::HeaderMap::new();
        if let Ok(value) = axum::http::HeaderValue::from_str(text) {
            headers.insert("mcp-name", value.clone());
            headers.insert("mcp-protocol-version", value);
            let _ = sessionless::header_value(&headers, "mcp-name");
        }
        if let Ok(message) = parse_message(data) {
            let _ = sessionless::is_sessionless(&message, &headers);
        }
    }
}

/// The config file's upstream tables (`[upstreams.NAME]`, TOML) and the
/// `--upstream NAME=TARGET` flag, both read from what operators write:
/// errors, never panics.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_flag(text);
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        upstreams: std::collections::BTreeMap<String, UpstreamTable>,
    }
    if let Ok(file) = toml::from_str::<File>(text) {
        for (name, table) in file.upstreams {
            let _ = table.into_config(&name);
        }
    }
}
