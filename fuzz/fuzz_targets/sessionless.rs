//! What a 2026-07-28 client controls before any application sees it: the
//! `requestState` it echoes (sealed, but parsed before its tag is checked),
//! `Mcp-Name` / `Mcp-Param-*` values with the base64 sentinel, and the body's
//! `_meta` claim that makes a request sessionless. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use tether_server::engine::mrtr;
use tether_server::http::sessionless;

fuzz_target!(|data: &[u8]| {
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
        if let Ok(message) = tether_wire::parse_message(data) {
            let _ = sessionless::is_sessionless(&message, &headers);
        }
    }
});
