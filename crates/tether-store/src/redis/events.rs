//! How an event log is kept on Redis and read back: a Redis Stream, one
//! entry per event (ID `0-{seq}`, fields `k` for the kind and `p` for the
//! payload), or, for a stream that starts with its final event, one string
//! holding it whole (`P{id}:d:STREAM`, [`encode_whole`]).
//!
//! Invariant: what does not parse whole as one of these is `None`, never a
//! guess; the store reports the stream as corrupt.

use bytes::Bytes;
use redis::Value as RValue;

use crate::{EventKind, StoredEvent};

/// One `XRANGE` entry, `[ID, [k, KIND, p, PAYLOAD]]` (the fields as a map in
/// RESP3), as a stored event; `None` if it is not one.
pub(super) fn stored_event(entry: RValue) -> Option<StoredEvent> {
    let RValue::Array(parts) = entry else { return None };
    let mut parts = parts.into_iter();
    let (RValue::BulkString(id), Some(fields)) = (parts.next()?, parts.next()) else { return None };
    let seq = std::str::from_utf8(id.strip_prefix(b"0-")?).ok()?.parse().ok()?;
    let pairs: Vec<(RValue, RValue)> = match fields {
        RValue::Array(flat) => {
            let mut flat = flat.into_iter();
            std::iter::from_fn(|| Some((flat.next()?, flat.next()?))).collect()
        }
        RValue::Map(pairs) => pairs,
        _ => return None,
    };
    let (mut kind, mut payload) = (None, None);
    for (name, value) in pairs {
        match (name, value) {
            (RValue::BulkString(name), RValue::BulkString(k)) if name == b"k" => {
                kind = std::str::from_utf8(&k).ok()?.parse::<u8>().ok().and_then(EventKind::from_u8);
            }
            (RValue::BulkString(name), RValue::BulkString(p)) if name == b"p" => payload = Some(Bytes::from(p)),
            _ => {}
        }
    }
    Some(StoredEvent { seq, kind: kind?, payload: payload? })
}

/// A stream stored whole (`records.lua`): per event its kind (one digit),
/// its payload's length in decimal, `:` and the payload.
pub(super) fn encode_whole(events: &[(EventKind, Bytes)]) -> Bytes {
    let mut blob = Vec::with_capacity(events.iter().map(|(_, p)| p.len() + 12).sum());
    for (kind, payload) in events {
        blob.extend_from_slice(format!("{}{}:", *kind as u8, payload.len()).as_bytes());
        blob.extend_from_slice(payload);
    }
    Bytes::from(blob)
}

/// The events of a stream stored whole, numbered from 1; `None` if the
/// blob is not one [`encode_whole`] wrote.
pub(super) fn decode_whole(blob: Bytes) -> Option<Vec<StoredEvent>> {
    let mut events = Vec::new();
    let mut pos = 0;
    while pos < blob.len() {
        let kind = EventKind::from_u8(blob[pos].checked_sub(b'0')?)?;
        let colon = pos + 1 + blob[pos + 1..].iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&blob[pos + 1..colon]).ok()?.parse().ok()?;
        let end = colon.checked_add(1 + len).filter(|&end| end <= blob.len())?;
        events.push(StoredEvent { seq: events.len() as u64 + 1, kind, payload: blob.slice(colon + 1..end) });
        pos = end;
    }
    Some(events)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use redis::Value as V;

    fn bulk(b: &[u8]) -> V {
        V::BulkString(b.to_vec())
    }

    #[test]
    fn an_xrange_entry_is_an_event_and_anything_else_is_not() {
        let entry = |id: &[u8], fields: V| V::Array(vec![bulk(id), fields]);
        let fields = V::Array(vec![bulk(b"k"), bulk(b"2"), bulk(b"p"), bulk(b"{}")]);
        let event = super::stored_event(entry(b"0-7", fields.clone())).unwrap();
        assert_eq!((event.seq, event.kind, &event.payload[..]), (7, crate::EventKind::Final, &b"{}"[..]));
        let map = V::Map(vec![(bulk(b"p"), bulk(b"x")), (bulk(b"k"), bulk(b"1"))]);
        assert_eq!(super::stored_event(entry(b"0-1", map)).unwrap().payload, &b"x"[..]);
        for bad in [
            entry(b"7", fields.clone()),
            entry(b"0-x", fields.clone()),
            entry(b"0-1", V::Array(vec![bulk(b"k"), bulk(b"9"), bulk(b"p"), bulk(b"")])),
            entry(b"0-1", V::Array(vec![bulk(b"k"), bulk(b"1")])),
            entry(b"0-1", V::Array(vec![bulk(b"k")])),
            V::Array(vec![bulk(b"0-1")]),
            V::Int(3),
        ] {
            assert!(super::stored_event(bad.clone()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_stream_stored_whole_reads_back_and_anything_else_is_refused() {
        use crate::EventKind::{Final, Prime};
        let events = vec![(Prime, Bytes::new()), (Final, Bytes::from_static(b"{\"a\":\"1:2\"}"))];
        let blob = super::encode_whole(&events);
        assert_eq!(&blob[..], &b"00:211:{\"a\":\"1:2\"}"[..]);
        let back = super::decode_whole(blob).unwrap();
        assert_eq!(
            back.iter().map(|e| (e.seq, e.kind, e.payload.clone())).collect::<Vec<_>>(),
            [(1, Prime, Bytes::new()), (2, Final, events[1].1.clone())]
        );
        for bad in [&b"2"[..], b"25:abc", b"x1:a", b"9", b"2a:b", b"21:a2"] {
            assert!(super::decode_whole(Bytes::from_static(bad)).is_none(), "{bad:?}");
        }
        assert_eq!(super::decode_whole(Bytes::new()).unwrap().len(), 0);
    }
}
