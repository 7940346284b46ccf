//! Byte strings kept against a few shared references, for the memory store.
//!
//! What an idle session holds is mostly near-copies of what every other
//! session holds: its initialize response differs from the next session's
//! only in the resume token, its state only in a stream name. A [`Packer`]
//! keeps a handful of recent payloads as references; a payload that shares
//! at least half its bytes (a common prefix plus a common suffix) with one
//! of them, and at least half of that one's, is kept as that reference plus
//! the bytes in between.

use std::sync::Arc;

use bytes::Bytes;

/// Shorter payloads are copied whole: a reference would not pay for itself.
const MIN_PACKED: usize = 96;
/// References tried per payload; a payload that matches none replaces the oldest.
const REFERENCES: usize = 4;

/// One kept byte string.
pub(super) enum Packed {
    Whole(Box<[u8]>),
    /// `base[..prefix] + middle + base[base.len() - suffix..]`.
    Near {
        base: Arc<[u8]>,
        prefix: u32,
        suffix: u32,
        middle: Box<[u8]>,
    },
}

impl Packed {
    pub(super) fn len(&self) -> usize {
        match self {
            Packed::Whole(b) => b.len(),
            Packed::Near { prefix, suffix, middle, .. } => *prefix as usize + middle.len() + *suffix as usize,
        }
    }

    pub(super) fn to_bytes(&self) -> Bytes {
        match self {
            Packed::Whole(b) => Bytes::copy_from_slice(b),
            Packed::Near { base, prefix, suffix, middle } => {
                let mut out = Vec::with_capacity(self.len());
                out.extend_from_slice(&base[..*prefix as usize]);
                out.extend_from_slice(middle);
                out.extend_from_slice(&base[base.len() - *suffix as usize..]);
                Bytes::from(out)
            }
        }
    }
}

/// The references of one kind of payload (events, session states, records).
#[derive(Default)]
pub(super) struct Packer {
    references: [Option<Arc<[u8]>>; REFERENCES],
    oldest: usize,
}

impl Packer {
    pub(super) fn pack(&mut self, bytes: &[u8]) -> Packed {
        if bytes.len() < MIN_PACKED || u32::try_from(bytes.len()).is_err() {
            return Packed::Whole(bytes.into());
        }
        let best = self
            .references
            .iter()
            .flatten()
            .map(|base| (base, shared_ends(base, bytes)))
            // At least half of both: a short payload must not keep a long reference alive.
            .filter(|(base, (prefix, suffix))| 2 * (prefix + suffix) >= bytes.len().max(base.len()))
            .max_by_key(|(_, (prefix, suffix))| prefix + suffix);
        if let Some((base, (prefix, suffix))) = best {
            return Packed::Near {
                base: base.clone(),
                prefix: prefix as u32,
                suffix: suffix as u32,
                middle: bytes[prefix..bytes.len() - suffix].into(),
            };
        }
        // A new shape: it becomes a reference, and is kept as one (no second copy).
        let base: Arc<[u8]> = bytes.into();
        self.references[self.oldest] = Some(base.clone());
        self.oldest = (self.oldest + 1) % REFERENCES;
        Packed::Near { base, prefix: bytes.len() as u32, suffix: 0, middle: Box::default() }
    }
}

/// Lengths of the common prefix and, in what is left of both, the common suffix.
fn shared_ends(a: &[u8], b: &[u8]) -> (usize, usize) {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    let suffix = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
    (prefix, suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(packer: &mut Packer, text: &str) -> Packed {
        let packed = packer.pack(text.as_bytes());
        assert_eq!(packed.to_bytes(), text.as_bytes(), "packing {text:?} changed it");
        assert_eq!(packed.len(), text.len());
        packed
    }

    fn kept_bytes(p: &Packed) -> usize {
        match p {
            Packed::Whole(b) => b.len(),
            Packed::Near { middle, .. } => middle.len(),
        }
    }

    #[test]
    fn near_copies_keep_only_what_differs() {
        let mut packer = Packer::default();
        let response = |token: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":0,"result":{{"_meta":{{"token":"{token}"}},"instructions":"{}"}}}}"#,
                "x".repeat(200)
            )
        };
        let first = round_trip(&mut packer, &response("aaaaaaaaaaaaaaaa"));
        assert_eq!(kept_bytes(&first), 0, "the first of its shape is the reference itself");
        let second = round_trip(&mut packer, &response("bbbbbbbbbbbbbbbb"));
        assert_eq!(kept_bytes(&second), 16, "only the token differs");
        // A payload that is a prefix or suffix of the reference (overlapping ends).
        round_trip(&mut packer, &response("aaaaaaaa"));
        round_trip(&mut packer, &response("aaaaaaaaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn unlike_payloads_become_references_and_the_oldest_is_replaced() {
        let mut packer = Packer::default();
        let shapes: Vec<String> = (0..REFERENCES + 1).map(|i| format!("{i}").repeat(100)).collect();
        let kept: Vec<Packed> = shapes.iter().map(|s| round_trip(&mut packer, s)).collect();
        // The first shape was replaced: a copy of it is its own reference again.
        let again = round_trip(&mut packer, &shapes[0]);
        assert!(
            matches!(&again, Packed::Near { base, .. } if !Arc::ptr_eq(base, match &kept[0] { Packed::Near { base, .. } => base, Packed::Whole(_) => unreachable!() }))
        );
        // The last one is still a reference: a copy of it keeps nothing new.
        assert_eq!(kept_bytes(&round_trip(&mut packer, &shapes[REFERENCES])), 0);
        // What was packed against a replaced reference still reads back.
        assert_eq!(kept[0].to_bytes(), shapes[0].as_bytes());
    }

    #[test]
    fn a_short_payload_does_not_keep_a_long_reference_alive() {
        let mut packer = Packer::default();
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(100_000));
        round_trip(&mut packer, &long);
        let short = format!("{{\"a\":\"{}\"}}", "x".repeat(200));
        let packed = round_trip(&mut packer, &short);
        assert!(matches!(&packed, Packed::Near { base, .. } if base.len() == short.len()), "its own reference, not the long one");
    }

    #[test]
    fn short_payloads_are_copied_whole() {
        let mut packer = Packer::default();
        assert!(matches!(round_trip(&mut packer, "{\"ok\":true}"), Packed::Whole(_)));
        assert!(matches!(round_trip(&mut packer, ""), Packed::Whole(_)));
    }
}
