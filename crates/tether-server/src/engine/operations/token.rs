//! Resume tokens of resumable operations: how one is sealed, parsed and
//! checked, and the request binding it is checked against.
//!
//! Tokens are `rt1_` + hex(operation id ‖ HMAC(server key, id ‖ chunk index)):
//! the index (the cursor) is only inside the MAC, the id is random. The same
//! point of progress always yields the same token. A token is bound to the
//! principal and to the request (method + params without `_meta`): the
//! record keeps a SHA-256 of both ([`binding`]).
//!
//! Invariant: a token names a chunk index only through its tag, which is
//! compared in constant time ([`index_of`]); nothing but the server key
//! makes a tag, and a token reveals nothing but the operation's random id.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::engine::keys::{same_tag, tag};

const TOKEN_PREFIX: &str = "rt1_";

/// JSON with object keys sorted at every level, so equal requests hash equal
/// whatever order their keys came in.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> =
                keys.iter().map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k]))).collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// What a token is bound to: principal + method + params without `_meta`.
pub fn binding(principal: &str, method: &str, params_without_meta: &Value) -> String {
    let mut h = Sha256::new();
    h.update(principal.as_bytes());
    h.update([0]);
    h.update(method.as_bytes());
    h.update([0]);
    h.update(canonical(params_without_meta).as_bytes());
    hex::encode(h.finalize())
}

fn token_tag(key: &[u8; 32], id: &[u8], index: u64) -> [u8; 16] {
    tag(key, b"tether-op-v1", &[id, &index.to_be_bytes()])
}

/// The resume token of chunk `index` of operation `id`, sealed with `key`.
pub fn seal(key: &[u8; 32], id: &[u8; 16], index: u64) -> String {
    format!("{TOKEN_PREFIX}{}{}", hex::encode(id), hex::encode(token_tag(key, id, index)))
}

/// Splits a token into the operation id and its tag, if well-formed.
pub fn parse(token: &str) -> Option<([u8; 16], [u8; 16])> {
    let raw = hex::decode(token.strip_prefix(TOKEN_PREFIX)?).ok()?;
    if raw.len() != 32 {
        return None;
    }
    Some((raw[..16].try_into().ok()?, raw[16..].try_into().ok()?))
}

/// The chunk index, at most `chunks`, that `presented` (a token's tag) was
/// sealed for, newest first; `None` if it was sealed for none of them.
pub(super) fn index_of(key: &[u8; 32], id: &[u8; 16], presented: &[u8; 16], chunks: u64) -> Option<u64> {
    (0..=chunks).rev().find(|i| same_tag(&token_tag(key, id, *i), presented))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":2,"p":3}],"x":null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"p":3,"q":2}]},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_ne!(binding("p", "tools/call", &a), binding("q", "tools/call", &a));
    }

    #[test]
    fn tokens_are_stable_bound_to_their_index_and_reveal_nothing() {
        let key = [3u8; 32];
        let id = [9u8; 16];
        assert_eq!(seal(&key, &id, 4), seal(&key, &id, 4), "same point of progress, same token");
        assert_ne!(seal(&key, &id, 4), seal(&key, &id, 5));
        let t = seal(&key, &id, 4);
        let (pid, ptag) = parse(&t).unwrap();
        assert_eq!(pid, id);
        assert!(same_tag(&token_tag(&key, &id, 4), &ptag));
        assert!(!same_tag(&token_tag(&key, &id, 3), &ptag));
        assert!(parse("rt1_zz").is_none() && parse("").is_none());
    }

    #[test]
    fn a_token_is_found_at_its_index_among_the_chunks_and_never_beyond_them() {
        let key = [3u8; 32];
        let id = [9u8; 16];
        let (_, presented) = parse(&seal(&key, &id, 4)).unwrap();
        assert_eq!(index_of(&key, &id, &presented, 4), Some(4));
        assert_eq!(index_of(&key, &id, &presented, 9), Some(4));
        assert_eq!(index_of(&key, &id, &presented, 3), None);
        assert_eq!(index_of(&[4u8; 32], &id, &presented, 9), None, "another key");
        assert_eq!(index_of(&key, &[8u8; 16], &presented, 9), None, "another operation");
    }
}
