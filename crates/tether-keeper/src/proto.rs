//! The control protocol between the keeper and its engine, without I/O.
//!
//! One Unix stream socket per engine (the engine's standard input, a
//! socketpair only it and the keeper hold) carries frames both ways:
//!
//! ```text
//! frame  := len:u32le kind:u8 body          (len counts kind and body)
//! body   := fields in the order the variant declares them
//! u32, u64 little-endian; bytes := len:u32le octets; string := bytes (UTF-8);
//! list   := count:u32le items; option := 0 | 1 item
//! ```
//!
//! [`Decoder`] is fed whatever bytes arrived and yields whole frames; it
//! never holds more than one frame of at most [`MAX_FRAME`] bytes plus
//! what was fed past it. A frame it cannot read (an unknown kind, a field
//! cut short, a length over the bound) is a [`ProtoError`]: the peer speaks
//! another protocol, and the connection ends. [`encode`] writes one frame.
//!
//! [`VERSION`] is the protocol's version: an engine says it first
//! ([`ToKeeper::Hello`]) and a keeper of another version refuses it
//! ([`ToEngine::Refused`]) and keeps its old engine serving.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The control protocol's version (see the module doc).
pub const VERSION: u32 = 1;

/// The largest frame either side sends or accepts: a child's line of at
/// most the largest `max_message_bytes` there is, and its framing.
pub const MAX_FRAME: usize = 256 * 1024 * 1024 + 1024;

/// What a child runs as: the command and how to carry its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// The program (a path, or a name looked up in `PATH`) and its arguments.
    pub program: String,
    pub args: Vec<String>,
    /// The child's whole environment (nothing else is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// The bound on one line of its stdout.
    pub max_line: u64,
    /// Bytes of its stdout the keeper holds unacknowledged at most; past
    /// them it stops reading the pipe (the child blocks on write).
    pub hold_bytes: u64,
    /// How long it may live with no engine holding it (its engine died and
    /// no new one took it); then the keeper stops it.
    pub orphan_ms: u64,
    /// What logs and the admin API call it (`upstream/session`).
    pub label: String,
}

/// A child the keeper holds, as it tells a new engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub child: u64,
    pub pid: u32,
    pub label: String,
    /// Whether an engine holds it now.
    pub attached: bool,
}

/// Engine to keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToKeeper {
    /// The first frame: the engine's protocol version and process ID.
    Hello { version: u32, pid: u32 },
    /// Start a child; answered with `Spawned` or `SpawnFailed` under `req`.
    /// The child is held by this engine from the start.
    Spawn { req: u64, spec: SpawnSpec },
    /// Hold a child the keeper keeps; its stdout follows from the frame
    /// after `after` (what this engine has stored already). Answered with
    /// `Attached` or `AttachFailed`.
    Attach { child: u64, after: u64 },
    /// One line for the child's stdin (without its newline), written once:
    /// a `seq` at or below the last one written is skipped. `tag` names
    /// what the line is for (a request cut off by a crash is found by it
    /// again: `Attached::open`); empty for none.
    Write { child: u64, seq: u64, tag: Bytes, line: Bytes },
    /// Every stdout frame up to `upto` is stored: the keeper lets go of it.
    Ack { child: u64, upto: u64 },
    /// The requests these tags named have ended: forget the tags (an
    /// engine gathers them, a frame now and then rather than one a call).
    Done { child: u64, tags: Vec<Bytes> },
    /// This engine lets go of the child; it lives on for the next one.
    Release { child: u64 },
    /// Stop the child (its whole process group).
    Stop { child: u64 },
    /// Answered with `Status` under `req`.
    Status { req: u64 },
    /// The engine serves (its store is open, its listeners are taken): an
    /// engine that exits before it said so failed to start, and the
    /// keeper's first one doing so stops the keeper with its exit code.
    Ready,
}

/// Keeper to engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToEngine {
    /// The answer to `Hello`: `keeper` identifies this keeper process (child
    /// IDs mean something only to it), `epoch` counts the engines it started
    /// (this one's), `children` are the ones it keeps.
    Welcome {
        version: u32,
        keeper: u64,
        epoch: u64,
        children: Vec<Kept>,
    },
    /// The engine is refused (another protocol version); the keeper closes.
    Refused {
        reason: String,
    },
    Spawned {
        req: u64,
        child: u64,
        pid: u32,
    },
    SpawnFailed {
        req: u64,
        error: String,
    },
    /// The child is this engine's now: `written` is the last `seq` its stdin
    /// got; `open` the tags of lines whose requests have not ended.
    Attached {
        child: u64,
        written: u64,
        open: Vec<Bytes>,
    },
    AttachFailed {
        child: u64,
        reason: String,
    },
    /// Frame `frame` of the child's stdout: one line, without its newline.
    Line {
        child: u64,
        frame: u64,
        line: Bytes,
    },
    /// Frame `frame`: a line over the child's `max_line`, of `len` bytes,
    /// its head and tail.
    TooLong {
        child: u64,
        frame: u64,
        len: u64,
        head: Bytes,
        tail: Bytes,
    },
    /// Lines up to `seq` reached the child's stdin.
    Written {
        child: u64,
        seq: u64,
    },
    /// One line of the child's stderr (not numbered: dropped while no engine
    /// holds the child).
    Stderr {
        child: u64,
        line: Bytes,
    },
    /// The child is gone (`status` as a person reads it); every frame of its
    /// stdout was sent before this.
    Exited {
        child: u64,
        status: String,
    },
    /// The keeper's counts, for the engine's metrics and admin API:
    /// engines started after the first, the last restart's duration (from
    /// the old engine's exit to the new one's `Hello`), the stdout bytes
    /// held unacknowledged, every child kept.
    Status {
        req: u64,
        restarts: u64,
        last_restart_ms: u64,
        held_bytes: u64,
        children: Vec<Kept>,
    },
    /// Hand over (an upgrade): stop accepting connections, release every
    /// child (do not stop them), leave what runs to the next engine, exit.
    Handover,
}

/// A frame that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "keeper control protocol: {}", self.0)
    }
}

impl std::error::Error for ProtoError {}

/// A message of one direction.
pub trait Message: Sized {
    fn put(&self, out: &mut BytesMut);
    fn take(kind: u8, body: &mut Bytes) -> Result<Self, ProtoError>;
}

/// Appends `message` as one frame to `out`.
pub fn encode<M: Message>(message: &M, out: &mut BytesMut) {
    let start = out.len();
    out.put_u32_le(0);
    message.put(out);
    let len = out.len() - start - 4;
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// `message` as one frame.
pub fn frame<M: Message>(message: &M) -> Bytes {
    let mut out = BytesMut::new();
    encode(message, &mut out);
    out.freeze()
}

/// Splits bytes into frames (see the module doc).
#[derive(Debug, Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Where bytes can be read into directly (then [`Decoder::next`]).
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The next whole frame, if one has arrived.
    #[allow(clippy::should_implement_trait)] // fallible and typed: not an iterator
    pub fn next<M: Message>(&mut self) -> Result<Option<M>, ProtoError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(ProtoError(format!("a frame of {len} bytes (at most {MAX_FRAME})")));
        }
        if self.buf.len() < 4 + len {
            self.buf.reserve(4 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(4);
        let mut body = self.buf.split_to(len).freeze();
        let kind = body.get_u8();
        let message = M::take(kind, &mut body)?;
        if body.has_remaining() {
            return Err(ProtoError(format!("{} bytes left over in a frame of kind {kind}", body.remaining())));
        }
        Ok(Some(message))
    }
}

// Field writers and readers.

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32_le(u32::try_from(b.len()).unwrap_or(u32::MAX));
    out.put_slice(b);
}

fn put_list<T>(out: &mut BytesMut, items: &[T], mut put: impl FnMut(&mut BytesMut, &T)) {
    out.put_u32_le(u32::try_from(items.len()).unwrap_or(u32::MAX));
    for item in items {
        put(out, item);
    }
}

fn need(body: &Bytes, n: usize) -> Result<(), ProtoError> {
    if body.remaining() < n {
        return Err(ProtoError(format!("a field of {n} bytes cut short ({} left)", body.remaining())));
    }
    Ok(())
}

fn u32_of(body: &mut Bytes) -> Result<u32, ProtoError> {
    need(body, 4)?;
    Ok(body.get_u32_le())
}

fn u64_of(body: &mut Bytes) -> Result<u64, ProtoError> {
    need(body, 8)?;
    Ok(body.get_u64_le())
}

fn bytes_of(body: &mut Bytes) -> Result<Bytes, ProtoError> {
    let len = u32_of(body)? as usize;
    need(body, len)?;
    Ok(body.split_to(len))
}

fn string_of(body: &mut Bytes) -> Result<String, ProtoError> {
    String::from_utf8(bytes_of(body)?.to_vec()).map_err(|_| ProtoError("a string that is not UTF-8".into()))
}

fn list_of<T>(body: &mut Bytes, mut take: impl FnMut(&mut Bytes) -> Result<T, ProtoError>) -> Result<Vec<T>, ProtoError> {
    let count = u32_of(body)? as usize;
    // Every item takes at least one byte: a count beyond what is left is a lie.
    if count > body.remaining() {
        return Err(ProtoError(format!("a list of {count} items in {} bytes", body.remaining())));
    }
    (0..count).map(|_| take(body)).collect()
}

fn bool_of(body: &mut Bytes) -> Result<bool, ProtoError> {
    need(body, 1)?;
    match body.get_u8() {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(ProtoError(format!("a flag of {other}"))),
    }
}

fn put_kept(out: &mut BytesMut, k: &Kept) {
    out.put_u64_le(k.child);
    out.put_u32_le(k.pid);
    put_bytes(out, k.label.as_bytes());
    out.put_u8(u8::from(k.attached));
}

fn kept_of(b: &mut Bytes) -> Result<Kept, ProtoError> {
    Ok(Kept { child: u64_of(b)?, pid: u32_of(b)?, label: string_of(b)?, attached: bool_of(b)? })
}

impl SpawnSpec {
    fn put(&self, out: &mut BytesMut) {
        put_bytes(out, self.program.as_bytes());
        put_list(out, &self.args, |o, a| put_bytes(o, a.as_bytes()));
        put_list(out, &self.env, |o, (k, v)| {
            put_bytes(o, k.as_bytes());
            put_bytes(o, v.as_bytes());
        });
        match &self.cwd {
            Some(cwd) => {
                out.put_u8(1);
                put_bytes(out, cwd.as_bytes());
            }
            None => out.put_u8(0),
        }
        out.put_u64_le(self.max_line);
        out.put_u64_le(self.hold_bytes);
        out.put_u64_le(self.orphan_ms);
        put_bytes(out, self.label.as_bytes());
    }

    fn take(body: &mut Bytes) -> Result<Self, ProtoError> {
        Ok(Self {
            program: string_of(body)?,
            args: list_of(body, string_of)?,
            env: list_of(body, |b| Ok((string_of(b)?, string_of(b)?)))?,
            cwd: if bool_of(body)? { Some(string_of(body)?) } else { None },
            max_line: u64_of(body)?,
            hold_bytes: u64_of(body)?,
            orphan_ms: u64_of(body)?,
            label: string_of(body)?,
        })
    }
}

impl Message for ToKeeper {
    fn put(&self, out: &mut BytesMut) {
        match self {
            Self::Hello { version, pid } => {
                out.put_u8(1);
                out.put_u32_le(*version);
                out.put_u32_le(*pid);
            }
            Self::Spawn { req, spec } => {
                out.put_u8(2);
                out.put_u64_le(*req);
                spec.put(out);
            }
            Self::Attach { child, after } => {
                out.put_u8(3);
                out.put_u64_le(*child);
                out.put_u64_le(*after);
            }
            Self::Write { child, seq, tag, line } => {
                out.put_u8(4);
                out.put_u64_le(*child);
                out.put_u64_le(*seq);
                put_bytes(out, tag);
                put_bytes(out, line);
            }
            Self::Ack { child, upto } => {
                out.put_u8(5);
                out.put_u64_le(*child);
                out.put_u64_le(*upto);
            }
            Self::Done { child, tags } => {
                out.put_u8(6);
                out.put_u64_le(*child);
                put_list(out, tags, |o, t| put_bytes(o, t));
            }
            Self::Release { child } => {
                out.put_u8(7);
                out.put_u64_le(*child);
            }
            Self::Stop { child } => {
                out.put_u8(8);
                out.put_u64_le(*child);
            }
            Self::Status { req } => {
                out.put_u8(9);
                out.put_u64_le(*req);
            }
            Self::Ready => out.put_u8(10),
        }
    }

    fn take(kind: u8, b: &mut Bytes) -> Result<Self, ProtoError> {
        Ok(match kind {
            1 => Self::Hello { version: u32_of(b)?, pid: u32_of(b)? },
            2 => Self::Spawn { req: u64_of(b)?, spec: SpawnSpec::take(b)? },
            3 => Self::Attach { child: u64_of(b)?, after: u64_of(b)? },
            4 => Self::Write { child: u64_of(b)?, seq: u64_of(b)?, tag: bytes_of(b)?, line: bytes_of(b)? },
            5 => Self::Ack { child: u64_of(b)?, upto: u64_of(b)? },
            6 => Self::Done { child: u64_of(b)?, tags: list_of(b, bytes_of)? },
            7 => Self::Release { child: u64_of(b)? },
            8 => Self::Stop { child: u64_of(b)? },
            9 => Self::Status { req: u64_of(b)? },
            10 => Self::Ready,
            other => return Err(ProtoError(format!("an engine frame of unknown kind {other}"))),
        })
    }
}

impl Message for ToEngine {
    fn put(&self, out: &mut BytesMut) {
        match self {
            Self::Welcome { version, keeper, epoch, children } => {
                out.put_u8(1);
                out.put_u32_le(*version);
                out.put_u64_le(*keeper);
                out.put_u64_le(*epoch);
                put_list(out, children, put_kept);
            }
            Self::Refused { reason } => {
                out.put_u8(2);
                put_bytes(out, reason.as_bytes());
            }
            Self::Spawned { req, child, pid } => {
                out.put_u8(3);
                out.put_u64_le(*req);
                out.put_u64_le(*child);
                out.put_u32_le(*pid);
            }
            Self::SpawnFailed { req, error } => {
                out.put_u8(4);
                out.put_u64_le(*req);
                put_bytes(out, error.as_bytes());
            }
            Self::Attached { child, written, open } => {
                out.put_u8(5);
                out.put_u64_le(*child);
                out.put_u64_le(*written);
                put_list(out, open, |o, t| put_bytes(o, t));
            }
            Self::AttachFailed { child, reason } => {
                out.put_u8(6);
                out.put_u64_le(*child);
                put_bytes(out, reason.as_bytes());
            }
            Self::Line { child, frame, line } => {
                out.put_u8(7);
                out.put_u64_le(*child);
                out.put_u64_le(*frame);
                put_bytes(out, line);
            }
            Self::TooLong { child, frame, len, head, tail } => {
                out.put_u8(8);
                out.put_u64_le(*child);
                out.put_u64_le(*frame);
                out.put_u64_le(*len);
                put_bytes(out, head);
                put_bytes(out, tail);
            }
            Self::Written { child, seq } => {
                out.put_u8(9);
                out.put_u64_le(*child);
                out.put_u64_le(*seq);
            }
            Self::Stderr { child, line } => {
                out.put_u8(10);
                out.put_u64_le(*child);
                put_bytes(out, line);
            }
            Self::Exited { child, status } => {
                out.put_u8(11);
                out.put_u64_le(*child);
                put_bytes(out, status.as_bytes());
            }
            Self::Status { req, restarts, last_restart_ms, held_bytes, children } => {
                out.put_u8(12);
                out.put_u64_le(*req);
                out.put_u64_le(*restarts);
                out.put_u64_le(*last_restart_ms);
                out.put_u64_le(*held_bytes);
                put_list(out, children, put_kept);
            }
            Self::Handover => out.put_u8(13),
        }
    }

    fn take(kind: u8, b: &mut Bytes) -> Result<Self, ProtoError> {
        Ok(match kind {
            1 => Self::Welcome { version: u32_of(b)?, keeper: u64_of(b)?, epoch: u64_of(b)?, children: list_of(b, kept_of)? },
            2 => Self::Refused { reason: string_of(b)? },
            3 => Self::Spawned { req: u64_of(b)?, child: u64_of(b)?, pid: u32_of(b)? },
            4 => Self::SpawnFailed { req: u64_of(b)?, error: string_of(b)? },
            5 => Self::Attached { child: u64_of(b)?, written: u64_of(b)?, open: list_of(b, bytes_of)? },
            6 => Self::AttachFailed { child: u64_of(b)?, reason: string_of(b)? },
            7 => Self::Line { child: u64_of(b)?, frame: u64_of(b)?, line: bytes_of(b)? },
            8 => Self::TooLong { child: u64_of(b)?, frame: u64_of(b)?, len: u64_of(b)?, head: bytes_of(b)?, tail: bytes_of(b)? },
            9 => Self::Written { child: u64_of(b)?, seq: u64_of(b)? },
            10 => Self::Stderr { child: u64_of(b)?, line: bytes_of(b)? },
            11 => Self::Exited { child: u64_of(b)?, status: string_of(b)? },
            12 => Self::Status {
                req: u64_of(b)?,
                restarts: u64_of(b)?,
                last_restart_ms: u64_of(b)?,
                held_bytes: u64_of(b)?,
                children: list_of(b, kept_of)?,
            },
            13 => Self::Handover,
            other => return Err(ProtoError(format!("a keeper frame of unknown kind {other}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SpawnSpec {
        SpawnSpec {
            program: "python3".into(),
            args: vec!["-u".into(), "server.py".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: Some("/tmp".into()),
            max_line: 1 << 20,
            hold_bytes: 4 << 20,
            orphan_ms: 600_000,
            label: "echo/s1".into(),
        }
    }

    #[test]
    fn every_message_reads_back_as_written_whatever_the_bytes_arrive_in() {
        let to_keeper = vec![
            ToKeeper::Hello { version: VERSION, pid: 42 },
            ToKeeper::Spawn { req: 1, spec: spec() },
            ToKeeper::Spawn { req: 2, spec: SpawnSpec { cwd: None, ..spec() } },
            ToKeeper::Attach { child: 3, after: 9 },
            ToKeeper::Write { child: 3, seq: 10, tag: Bytes::from_static(b"s/r1"), line: Bytes::from_static(b"{}") },
            ToKeeper::Ack { child: 3, upto: 10 },
            ToKeeper::Done { child: 3, tags: vec![Bytes::from_static(b"s/r1"), Bytes::from_static(b"s/r2")] },
            ToKeeper::Release { child: 3 },
            ToKeeper::Stop { child: 3 },
            ToKeeper::Status { req: 4 },
            ToKeeper::Ready,
        ];
        let to_engine = vec![
            ToEngine::Welcome {
                version: VERSION,
                keeper: 7,
                epoch: 2,
                children: vec![Kept { child: 3, pid: 99, label: "echo/s1".into(), attached: false }],
            },
            ToEngine::Refused { reason: "no".into() },
            ToEngine::Spawned { req: 1, child: 3, pid: 99 },
            ToEngine::SpawnFailed { req: 2, error: "ENOENT".into() },
            ToEngine::Attached { child: 3, written: 10, open: vec![Bytes::from_static(b"s/r1")] },
            ToEngine::AttachFailed { child: 4, reason: "gone".into() },
            ToEngine::Line { child: 3, frame: 11, line: Bytes::from_static(b"{\"id\":1}") },
            ToEngine::TooLong {
                child: 3,
                frame: 12,
                len: 1 << 30,
                head: Bytes::from_static(b"{"),
                tail: Bytes::from_static(b"}"),
            },
            ToEngine::Written { child: 3, seq: 10 },
            ToEngine::Stderr { child: 3, line: Bytes::from_static(b"warn") },
            ToEngine::Exited { child: 3, status: "exit status: 0".into() },
            ToEngine::Status {
                req: 4,
                restarts: 1,
                last_restart_ms: 250,
                held_bytes: 17,
                children: vec![Kept { child: 3, pid: 99, label: "echo/s1".into(), attached: true }],
            },
            ToEngine::Handover,
        ];
        let mut wire = BytesMut::new();
        to_keeper.iter().for_each(|m| encode(m, &mut wire));
        // One byte at a time: a frame is whole or not there.
        let mut decoder = Decoder::new();
        let mut read = Vec::new();
        for byte in wire.iter() {
            decoder.push(&[*byte]);
            while let Some(m) = decoder.next::<ToKeeper>().unwrap() {
                read.push(m);
            }
        }
        assert_eq!(read, to_keeper);
        let mut wire = BytesMut::new();
        to_engine.iter().for_each(|m| encode(m, &mut wire));
        let mut decoder = Decoder::new();
        decoder.push(&wire);
        let mut read = Vec::new();
        while let Some(m) = decoder.next::<ToEngine>().unwrap() {
            read.push(m);
        }
        assert_eq!(read, to_engine);
    }

    #[test]
    fn a_frame_that_cannot_be_read_is_an_error_not_a_panic_nor_a_huge_allocation() {
        // Over the bound.
        let mut d = Decoder::new();
        d.push(&u32::MAX.to_le_bytes());
        assert!(d.next::<ToKeeper>().is_err());
        // An unknown kind.
        let mut d = Decoder::new();
        d.push(&[1, 0, 0, 0, 200]);
        assert!(d.next::<ToKeeper>().is_err());
        // A field cut short inside a whole frame.
        let mut d = Decoder::new();
        d.push(&[3, 0, 0, 0, 3, 1, 2]);
        assert!(d.next::<ToKeeper>().is_err());
        // A list that claims more items than bytes.
        let mut body = BytesMut::new();
        body.put_u8(5);
        body.put_u64_le(1);
        body.put_u64_le(1);
        body.put_u32_le(u32::MAX);
        let mut d = Decoder::new();
        d.push(&u32::try_from(body.len()).unwrap().to_le_bytes());
        d.push(&body);
        assert!(d.next::<ToEngine>().is_err());
        // Bytes left over.
        let mut d = Decoder::new();
        d.push(&[10, 0, 0, 0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 9]);
        assert!(d.next::<ToKeeper>().is_err());
    }
}
