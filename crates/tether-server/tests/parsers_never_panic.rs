//! Property tests: the parsers that read peer input never panic and reject
//! what they did not produce.

use proptest::prelude::*;
use tether_server::engine::resume::{open_token, seal_token};
use tether_server::ids::EventId;
use tether_wire::parse_message;

proptest! {
    #[test]
    fn envelope_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_message(&bytes);
    }

    #[test]
    fn envelope_parser_survives_json_shaped_noise(s in r#"\{("[a-z]{1,8}":(null|true|[0-9]{1,3}|"[a-z/]{0,10}"|\[\]|\{\}),?){0,6}\}"#) {
        let _ = parse_message(s.as_bytes());
    }

    #[test]
    fn event_ids_roundtrip(stream in "[rg][a-z0-9]{1,40}", seq in any::<u64>()) {
        let id = EventId::new(&stream, seq);
        prop_assert_eq!(EventId::parse(&id.to_string()), Some(id));
    }

    #[test]
    fn event_id_parser_never_panics(s in "\\PC{0,80}") {
        let _ = EventId::parse(&s);
    }

    #[test]
    fn resume_token_parser_never_panics_and_rejects_forgeries(s in "\\PC{0,100}", key in any::<[u8; 32]>(), id in any::<[u8; 16]>()) {
        prop_assert_eq!(open_token(&key, &s), None);
        prop_assert_eq!(open_token(&key, &seal_token(&key, &id)), Some(id));
    }
}
