//! Feeds arbitrary bytes to every parser of peer input: the JSON-RPC
//! envelope, Last-Event-ID, and resume tokens. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_server::engine::resume::open_token;
use tether_server::ids::EventId;
use tether_server::tether_wire::parse_message;

fuzz_target!(|data: &[u8]| {
    let _ = parse_message(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = EventId::parse(s);
        let _ = open_token(&[7u8; 32], s);
    }
});
