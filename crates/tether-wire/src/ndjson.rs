//! Newline-delimited JSON, MCP's stdio framing: one JSON-RPC message per
//! line. The one bounded reader of it, used by the gateway (a child's
//! stdout and stderr) and by the bridge (its host's stdin).
//!
//! [`LineDecoder`] is the framing without I/O: fed whatever bytes are
//! available, it says how many it used and whether a line ended. It never
//! holds more than its bound of one line; an over-long line is read to its
//! end and reported as [`Line::TooLong`] with its length and a few bytes of
//! its head and tail, enough to find the request it answers
//! ([`salvage_id`]). [`read_line`] and [`read_line_blocking`] drive it over
//! an async or a blocking reader.
//!
//! Invariant: memory per reader is at most the bound plus
//! [`HEAD_KEPT`] + [`TAIL_KEPT`] bytes, whatever the peer writes.

use std::io::BufRead;

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Bytes of an over-long line's start kept (see [`Line::TooLong`]).
pub const HEAD_KEPT: usize = 4096;
/// Bytes of an over-long line's end kept.
pub const TAIL_KEPT: usize = 512;

/// One line, without its `\n` (or `\r\n`). Blank lines are skipped.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A whole line within the bound.
    Text(Vec<u8>),
    /// Longer than the bound: its length, its first [`HEAD_KEPT`] bytes and
    /// its last [`TAIL_KEPT`] bytes (they overlap on a short line).
    TooLong {
        /// The line's whole length in bytes.
        len: usize,
        /// Its first bytes.
        head: Vec<u8>,
        /// Its last bytes.
        tail: Vec<u8>,
    },
}

/// Splits bytes into lines of at most `max` bytes.
#[derive(Debug)]
pub struct LineDecoder {
    max: usize,
    buf: Vec<u8>,
    /// Bytes of the current line so far (also past the bound).
    len: usize,
    too_long: bool,
    tail: Vec<u8>,
}

impl LineDecoder {
    /// A decoder of lines of at most `max` bytes (a longer one comes as
    /// [`Line::TooLong`], never buffered whole).
    pub fn new(max: usize) -> Self {
        Self { max, buf: Vec::new(), len: 0, too_long: false, tail: Vec::new() }
    }

    /// The bound on one line.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes bytes from `available` up to the end of the next line: how many
    /// it used, and the line if one ended (blank ones do not count).
    pub fn decode(&mut self, available: &[u8]) -> (usize, Option<Line>) {
        let (chunk, used, complete) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        self.take(chunk);
        (used, if complete { self.end_line() } else { None })
    }

    /// The end of input: the last line, if it had no `\n`.
    pub fn finish(&mut self) -> Option<Line> {
        self.end_line()
    }

    fn take(&mut self, chunk: &[u8]) {
        self.len += chunk.len();
        if self.too_long {
            keep_tail(&mut self.tail, chunk);
            return;
        }
        if self.buf.len() + chunk.len() <= self.max {
            self.buf.extend_from_slice(chunk);
            return;
        }
        // Over the bound: from here on only the head and the tail are kept.
        self.too_long = true;
        let mut tail = std::mem::take(&mut self.buf);
        let keep = HEAD_KEPT.min(self.max);
        let mut head = tail[..keep.min(tail.len())].to_vec();
        let room = keep - head.len();
        head.extend_from_slice(&chunk[..room.min(chunk.len())]);
        keep_tail(&mut tail, chunk);
        tail.shrink_to(TAIL_KEPT);
        self.buf = head;
        self.tail = tail;
    }

    fn end_line(&mut self) -> Option<Line> {
        let len = std::mem::take(&mut self.len);
        let mut line = std::mem::take(&mut self.buf);
        if std::mem::take(&mut self.too_long) {
            let mut tail = std::mem::take(&mut self.tail);
            if tail.last() == Some(&b'\r') {
                tail.pop();
            }
            return Some(Line::TooLong { len, head: line, tail });
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) { None } else { Some(Line::Text(line)) }
    }
}

/// Appends `chunk` to `tail`, keeping its last [`TAIL_KEPT`] bytes.
fn keep_tail(tail: &mut Vec<u8>, chunk: &[u8]) {
    if chunk.len() >= TAIL_KEPT {
        tail.clear();
        tail.extend_from_slice(&chunk[chunk.len() - TAIL_KEPT..]);
    } else {
        tail.extend_from_slice(chunk);
        if tail.len() > TAIL_KEPT {
            tail.drain(..tail.len() - TAIL_KEPT);
        }
    }
}

/// The next line from an async reader; `None` at the end of input.
pub async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R, decoder: &mut LineDecoder) -> std::io::Result<Option<Line>> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(decoder.finish());
        }
        let (used, line) = decoder.decode(available);
        reader.consume(used);
        if line.is_some() {
            return Ok(line);
        }
    }
}

/// The next line from a blocking reader; `None` at the end of input.
pub fn read_line_blocking<R: BufRead>(reader: &mut R, decoder: &mut LineDecoder) -> std::io::Result<Option<Line>> {
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(decoder.finish());
        }
        let (used, line) = decoder.decode(available);
        reader.consume(used);
        if line.is_some() {
            return Ok(line);
        }
    }
}

/// What can be read of a message that cannot be parsed whole (broken JSON,
/// invalid UTF-8, or only the head and tail of an over-long line): its
/// top-level `id`, whether it names a `method` (a request or notification)
/// and whether it has a `result` or `error` (an answer).
#[derive(Debug, Default, PartialEq)]
pub struct Salvaged {
    /// The top-level `id`, if it could be read whole (null is none).
    pub id: Option<Value>,
    /// Whether a top-level `method` was seen.
    pub has_method: bool,
    /// Whether a top-level `result` or `error` was seen.
    pub is_answer: bool,
}

/// Reads what it can of the top level of a JSON object from its start
/// (`head`) and its end (`tail`; pass the same bytes for a whole line).
/// Only a string or integer `id` at the top level counts: an `"id"` inside
/// a result is never taken for it.
pub fn salvage_id(head: &[u8], tail: &[u8]) -> Salvaged {
    let mut found = scan_head(head);
    if found.id.is_none() {
        found.id = last_member_id(tail);
    }
    found
}

/// Walks the top-level members from the start until the bytes run out or
/// stop making sense.
fn scan_head(bytes: &[u8]) -> Salvaged {
    let mut found = Salvaged::default();
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return found;
    }
    at += 1;
    loop {
        at = skip_ws(bytes, at);
        let Some((key, after_key)) = read_string(bytes, at) else { return found };
        at = skip_ws(bytes, after_key);
        if bytes.get(at) != Some(&b':') {
            return found;
        }
        at = skip_ws(bytes, at + 1);
        match key.as_slice() {
            b"method" => found.has_method = true,
            b"result" | b"error" => found.is_answer = true,
            _ => {}
        }
        let Some(value_end) = skip_value(bytes, at) else { return found };
        if key == b"id" {
            found.id = id_value(&bytes[at..value_end]);
        }
        at = skip_ws(bytes, value_end);
        match bytes.get(at) {
            Some(b',') => at += 1,
            _ => return found,
        }
    }
}

/// The `id` when it is the object's last member (`…,"id":7}`), possibly
/// followed by `"jsonrpc":"2.0"` (what some SDKs write last).
fn last_member_id(bytes: &[u8]) -> Option<Value> {
    let mut end = bytes.len();
    while end > 0 && bytes[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    if end == 0 || bytes[end - 1] != b'}' {
        return None;
    }
    let mut body = &bytes[..end - 1];
    for _ in 0..2 {
        let (key, value, rest) = last_pair(body)?;
        if key == b"id" {
            return id_value(value);
        }
        if key != b"jsonrpc" {
            return None;
        }
        body = rest;
    }
    None
}

/// Splits `…,"key":value` at its last member (a value without quotes or
/// one simple string): the key, the value's bytes and what comes before.
fn last_pair(bytes: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let trimmed = trim_end(bytes);
    let value_start = if trimmed.last() == Some(&b'"') {
        let inner = &trimmed[..trimmed.len() - 1];
        let open = inner.iter().rposition(|b| *b == b'"')?;
        if inner[..open].last() == Some(&b'\\') {
            return None;
        }
        open
    } else {
        trimmed.iter().rposition(|b| *b == b':').map(|i| i + 1)?
    };
    let value = trim_start(&trimmed[value_start..]);
    let before = trim_end(&trimmed[..value_start]);
    let before = before.strip_suffix(b":")?;
    let before = trim_end(before);
    let before = before.strip_suffix(b"\"")?;
    let open = before.iter().rposition(|b| *b == b'"')?;
    let key = &before[open + 1..];
    let rest = trim_end(&before[..open]);
    let rest = rest.strip_suffix(b",").or_else(|| rest.strip_suffix(b"{"))?;
    Some((key, value, rest))
}

fn id_value(bytes: &[u8]) -> Option<Value> {
    let value: Value = serde_json::from_slice(trim_end(trim_start(bytes))).ok()?;
    crate::envelope::valid_id(&value).then_some(value)
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    &bytes[start..]
}

fn trim_end(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
    &bytes[..end]
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// A string starting at `at`: its raw content and the index after it.
fn read_string(bytes: &[u8], at: usize) -> Option<(Vec<u8>, usize)> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some((bytes[at + 1..i].to_vec(), i + 1)),
            _ => i += 1,
        }
    }
    None
}

/// The index after a JSON value starting at `at` (depth-counted, strings
/// skipped), `None` if the bytes end first.
fn skip_value(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => read_string(bytes, at).map(|(_, end)| end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = read_string(bytes, i)?.1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let end = bytes[at..].iter().position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace());
            end.map(|n| at + n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(input: &[u8], max: usize, buffer: usize) -> Vec<Line> {
        let mut reader = std::io::BufReader::with_capacity(buffer, input);
        let mut decoder = LineDecoder::new(max);
        let mut out = Vec::new();
        while let Some(line) = read_line_blocking(&mut reader, &mut decoder).unwrap() {
            out.push(line);
        }
        out
    }

    fn text(s: &str) -> Line {
        Line::Text(s.as_bytes().to_vec())
    }

    #[test]
    fn lines_split_across_any_buffer_size_and_over_long_ones_are_read_to_their_end() {
        let input = b"{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\":3}";
        for buffer in [1, 2, 3, 7, 64] {
            assert_eq!(lines(input, 100, buffer), vec![text("{\"a\":1}"), text("{\"b\":2}"), text("{\"c\":3}")]);
        }
        let mut input = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 50));
        input.extend_from_slice(b"\nexact-ten!\n");
        input.extend(std::iter::repeat_n(b'y', 11));
        for buffer in [1, 4, 16, 1024] {
            let got = lines(&input, 10, buffer);
            assert_eq!(got.len(), 4, "{buffer}");
            assert_eq!(got[0], text("short"));
            assert!(
                matches!(&got[1], Line::TooLong { len: 50, head, tail } if head == b"xxxxxxxxxx" && tail.len() == 50),
                "{buffer}: {:?}",
                got[1]
            );
            assert_eq!(got[2], text("exact-ten!"));
            assert!(matches!(&got[3], Line::TooLong { len: 11, .. }), "{buffer}");
        }
        assert!(lines(b"", 10, 8).is_empty());
        assert!(lines(b"\n \n", 10, 8).is_empty());
    }

    #[test]
    fn an_over_long_line_keeps_a_bounded_head_and_tail() {
        let mut line = br#"{"jsonrpc":"2.0","id":"t-9","result":{"text":""#.to_vec();
        line.extend(std::iter::repeat_n(b'z', 100_000));
        line.extend_from_slice(b"\"}}\n");
        let got = lines(&line, 1000, 8192);
        let [Line::TooLong { len, head, tail }] = got.as_slice() else { panic!("{got:?}") };
        assert_eq!(*len, line.len() - 1);
        assert_eq!(head.len(), 1000);
        assert_eq!(tail.len(), TAIL_KEPT);
        assert!(tail.ends_with(b"zzz\"}}"));
        assert_eq!(salvage_id(head, tail).id, Some(json!("t-9")));
    }

    #[test]
    fn the_id_is_found_at_the_top_level_from_either_end() {
        // At the start, as most SDKs write it; the broken rest does not matter.
        let s = salvage_id(br#"{"jsonrpc":"2.0","id":7,"result":{"x":"#, b"");
        assert_eq!(s, Salvaged { id: Some(json!(7)), has_method: false, is_answer: true });
        // Behind a result that holds its own "id" (not taken).
        let broken = br#"{"result":{"id":99,"v":[1,{"id":98}]},"jsonrpc":"2.0","id":"abc"}"#;
        assert_eq!(salvage_id(broken, broken).id, Some(json!("abc")));
        // Only the tail survives: the last member, or the one before "jsonrpc".
        assert_eq!(salvage_id(b"{\"result\":\"zzz", br#"zzz"},"jsonrpc":"2.0","id":12}"#).id, Some(json!(12)));
        assert_eq!(salvage_id(b"{\"result\":\"zzz", br#"zzz"},"id":12,"jsonrpc":"2.0"}"#).id, Some(json!(12)));
        assert_eq!(salvage_id(b"{\"result\":\"zzz", br#"zzz"}, "id" : "a-1" } "#).id, Some(json!("a-1")));
        // A notification says so; a nested id at the end is not the message's.
        let s = salvage_id(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"#, br#"{"id":5}}"#);
        assert_eq!(s, Salvaged { id: None, has_method: true, is_answer: false });
        // Invalid UTF-8 inside a string does not stop the scan.
        let s = salvage_id(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":\"\xff\xfe\"}", b"");
        assert_eq!(s.id, Some(json!(3)));
        // Nothing to find.
        assert_eq!(salvage_id(b"not json at all", b"not json at all"), Salvaged::default());
        assert_eq!(salvage_id(b"{\"id\":null}", b"{\"id\":null}").id, None);
    }
}
