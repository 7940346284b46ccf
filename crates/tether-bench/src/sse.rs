//! An incremental Server-Sent Events parser (the subset MCP servers send:
//! `id`, `data`, `event`, `retry` fields and `:` comments). Bytes go in as
//! they arrive; complete events come out when their blank line has arrived.
//! An event without a terminating blank line is never returned, as the SSE
//! specification says.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `id` field of this event, if it had one.
    pub id: Option<String>,
    /// The `data` lines joined with `\n` (empty for priming events).
    pub data: String,
}

impl Event {
    /// Priming events and the like carry no data.
    pub fn has_data(&self) -> bool {
        !self.data.trim().is_empty()
    }
}

#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not yet ended by `\n`.
    partial: Vec<u8>,
    id: Option<String>,
    data: Vec<String>,
    /// Any field seen since the last dispatch.
    started: bool,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events completed by them. A line that is
    /// not UTF-8 is an error (the stream is broken).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            let mut line = std::mem::take(&mut self.partial);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line).map_err(|e| format!("SSE line is not UTF-8: {e}"))?;
            if let Some(event) = self.line(&line) {
                out.push(event);
            }
        }
        self.partial.extend_from_slice(rest);
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            if !self.started {
                return None;
            }
            self.started = false;
            return Some(Event { id: self.id.take(), data: std::mem::take(&mut self.data).join("\n") });
        }
        if line.starts_with(':') {
            return None; // comment (keep-alive)
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        self.started = true;
        match field {
            "id" => self.id = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            _ => {} // `event`, `retry` and unknown fields do not matter here
        }
        None
    }
}

/// All complete events of a whole body.
pub fn parse_body(body: &[u8]) -> Result<Vec<Event>, String> {
    Parser::new().push(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_come_out_whole() {
        let mut p = Parser::new();
        assert!(p.push(b"id: g1.0\nretry: 1000\ndata: \n\n: keep-alive\n\nevent: message\nid: g1").unwrap()[0].data.is_empty());
        let events = p.push(b".1\ndata: {\"id\":1}\r\n\r\n").unwrap();
        assert_eq!(events, vec![Event { id: Some("g1.1".into()), data: "{\"id\":1}".into() }]);
        assert!(events[0].has_data());
    }

    #[test]
    fn a_body_with_priming_then_a_response() {
        let events = parse_body(b"id: 0\nretry: 3000\ndata:\n\nevent: message\nid: 1\ndata: {\"id\":1}\n\n").unwrap();
        assert_eq!(events.len(), 2);
        assert!(!events[0].has_data());
        assert_eq!(events[1].data, "{\"id\":1}");
    }
}
