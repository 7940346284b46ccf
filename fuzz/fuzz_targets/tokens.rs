//! Tokens and token files from peers and operators: operation tokens
//! (`rt1_…`, parsed before their tag is checked), resume tokens (`tt1_…`),
//! and `--auth-tokens` files. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_server::engine::{operations, resume};
use tether_server::http::TokenTable;

fuzz_target!(|data: &[u8]| {
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
});
