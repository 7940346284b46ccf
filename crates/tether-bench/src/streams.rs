//! `streams_10k`: many sessions, each with its standalone GET stream open
//! on one server, idle but for the server's keep-alive comments; the
//! server's RSS and CPU while idle, then the time for one notification to
//! reach every stream.
//!
//! The load generator holds every stream as a bare tokio `TcpStream` with a
//! hand-written HTTP/1.1 request, a chunked-body reader and the shared SSE
//! decoder (`tether_wire::sse::Decoder`): one small task per stream, so
//! 10,000 of them cost the bench little and the machine's two cores go to
//! the server. The notification is sent through the admin API
//! (`POST /admin/notify`), the server's one way to notify every session it
//! holds. [`streams_10k`] runs the scenario on one fresh tether-sqlite and
//! makes its row.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};

use crate::report::{Row, round};
use crate::running::start;
use crate::scenario::Scenario;
use crate::server::{self, Launch, Programs, Subject, System};
use crate::{Args, sessions};

/// Streams being opened at once (connect, request, response head): the
/// listener's accept backlog is not flooded, so no SYN waits for a retransmit.
const OPENING_AT_ONCE: usize = 256;
/// How long opening every stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the notification may take to reach every stream before the row fails.
const FANOUT_TIMEOUT: Duration = Duration::from_secs(60);
/// The notification's `params.data`, which tells it from anything else on the streams.
const MARK: &str = "tether-bench streams_10k";
/// Largest response head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// What every stream's task reports.
#[derive(Default)]
struct Shared {
    opened: AtomicUsize,
    /// Keep-alive comments received on each stream so far.
    keepalives: Vec<AtomicU64>,
    /// Streams that received the notification, and when the last one did.
    notified: AtomicUsize,
    last_notified: Mutex<Option<Instant>>,
    all_notified: Notify,
    errors: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn fail(&self, i: usize, e: impl std::fmt::Display) {
        if self.errors.fetch_add(1, Ordering::SeqCst) == 0 {
            *self.first_error.lock() = Some(format!("stream {i}: {e}"));
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        let errors = self.errors.load(Ordering::SeqCst);
        if errors > 0 {
            let first = self.first_error.lock().clone().unwrap_or_default();
            bail!("{errors} streams failed; the first: {first}");
        }
        Ok(())
    }
}

/// The streams, open.
pub struct Streams {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Streams {
    /// Opens a standalone GET stream for each session and returns once
    /// every one answered 200 `text/event-stream`.
    pub async fn open(addr: std::net::SocketAddr, path: &str, sessions: &[String]) -> anyhow::Result<Streams> {
        let shared = Arc::new(Shared { keepalives: sessions.iter().map(|_| AtomicU64::new(0)).collect(), ..Shared::default() });
        let gate = Arc::new(Semaphore::new(OPENING_AT_ONCE));
        let opened_all = Arc::new(Notify::new());
        let total = sessions.len();
        let mut tasks = Vec::with_capacity(total);
        for (i, session) in sessions.iter().enumerate() {
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n"
            );
            let (shared, gate, opened_all) = (shared.clone(), gate.clone(), opened_all.clone());
            tasks.push(tokio::spawn(async move {
                let permit = gate.acquire_owned().await;
                let stream = match open_one(addr, &request).await {
                    Ok(stream) => stream,
                    Err(e) => {
                        shared.fail(i, format!("{e:#}"));
                        opened_all.notify_one();
                        return;
                    }
                };
                drop(permit);
                if shared.opened.fetch_add(1, Ordering::SeqCst) + 1 == total {
                    opened_all.notify_one();
                }
                if let Err(e) = follow(stream, i, &shared).await {
                    shared.fail(i, format!("{e:#}"));
                    shared.all_notified.notify_one();
                }
            }));
        }
        let streams = Streams { shared, tasks };
        let deadline = tokio::time::Instant::now() + OPEN_TIMEOUT;
        while streams.shared.opened.load(Ordering::SeqCst) < total {
            streams.shared.check()?;
            if tokio::time::timeout_at(deadline, opened_all.notified()).await.is_err() {
                bail!("{} of {total} streams open after {OPEN_TIMEOUT:?}", streams.shared.opened.load(Ordering::SeqCst));
            }
        }
        streams.shared.check()?;
        Ok(streams)
    }

    /// Fails if a stream failed (closed, answered wrongly, sent something unexpected).
    pub fn check(&self) -> anyhow::Result<()> {
        self.shared.check()
    }

    /// The fewest and the most keep-alive comments any stream received so far.
    pub fn keepalives(&self) -> (u64, u64) {
        let counts = self.shared.keepalives.iter().map(|k| k.load(Ordering::SeqCst));
        counts.fold((u64::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)))
    }

    /// Sends the notification through the admin API and waits until every
    /// stream received it; returns ms from just before the POST to the
    /// moment the last stream read it, and what the server answered.
    pub async fn fan_out(&self, admin_url: &str, token: &str) -> anyhow::Result<(f64, String)> {
        let total = self.shared.keepalives.len();
        let http = reqwest::Client::builder().no_proxy().build()?;
        let body = serde_json::json!({
            "method": "notifications/message",
            "params": {"level": "notice", "logger": "tether-bench", "data": MARK},
        });
        let all = self.shared.all_notified.notified();
        tokio::pin!(all);
        all.as_mut().enable();
        let started = Instant::now();
        let answer = http.post(admin_url).bearer_auth(token).json(&body).send().await.context("POST /admin/notify")?;
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        anyhow::ensure!(status == reqwest::StatusCode::OK, "POST /admin/notify answered {status}: {text}");
        let notified = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["notified"].as_u64());
        anyhow::ensure!(notified == Some(total as u64), "POST /admin/notify answered {text}, want {total} notified");
        let deadline = tokio::time::Instant::now() + FANOUT_TIMEOUT;
        while self.shared.notified.load(Ordering::SeqCst) < total {
            self.shared.check()?;
            if tokio::time::timeout_at(deadline, all.as_mut()).await.is_err() {
                bail!(
                    "{} of {total} streams got the notification within {FANOUT_TIMEOUT:?}",
                    self.shared.notified.load(Ordering::SeqCst)
                );
            }
            all.set(self.shared.all_notified.notified());
            all.as_mut().enable();
        }
        self.shared.check()?;
        let last = (*self.shared.last_notified.lock()).context("no arrival time recorded")?;
        Ok((last.saturating_duration_since(started).as_secs_f64() * 1000.0, text))
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Connects, sends the GET and reads the response head, which must be 200
/// `text/event-stream` with a chunked body; returns the connection and any
/// body bytes read with the head.
async fn open_one(addr: std::net::SocketAddr, request: &str) -> anyhow::Result<(TcpStream, Vec<u8>)> {
    let mut tcp = TcpStream::connect(addr).await.context("connect")?;
    tcp.set_nodelay(true)?;
    tcp.write_all(request.as_bytes()).await?;
    let mut head = Vec::with_capacity(512);
    let end = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        anyhow::ensure!(head.len() < MAX_HEAD, "a response head over {MAX_HEAD} bytes");
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the server closed the connection before its response head");
        head.extend_from_slice(&buf[..n]);
    };
    let rest = head.split_off(end);
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = text.lines().next().unwrap_or("");
    anyhow::ensure!(status.starts_with("http/1.1 200"), "answered `{}`", status.trim());
    anyhow::ensure!(text.contains("content-type: text/event-stream"), "not an SSE response: {}", text.trim());
    anyhow::ensure!(text.contains("transfer-encoding: chunked"), "not a chunked body: {}", text.trim());
    Ok((tcp, rest))
}

/// Reads one stream until it fails or is dropped: counts keep-alives, and
/// records when the notification arrives (it must arrive once).
async fn follow((mut tcp, mut pending): (TcpStream, Vec<u8>), i: usize, shared: &Shared) -> anyhow::Result<()> {
    let mut chunks = Chunked::default();
    let mut decoder = tether_wire::sse::Decoder::new();
    let mut buf = [0u8; 2048];
    let mut seen = false;
    loop {
        if pending.is_empty() {
            let n = tcp.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "the server closed the stream");
            pending.extend_from_slice(&buf[..n]);
        }
        let body = chunks.decode(&mut pending)?;
        let events = decoder.push(body).map_err(|e| anyhow::anyhow!("SSE: {e:?}"))?;
        shared.keepalives[i].store(decoder.comments(), Ordering::SeqCst);
        for event in events.iter().filter(|e| e.has_data()) {
            let message: serde_json::Value = serde_json::from_str(&event.data).context("an event that is not JSON")?;
            let ours = message["method"] == "notifications/message" && message["params"]["data"] == MARK;
            anyhow::ensure!(ours && !seen, "unexpected event: {}", event.data);
            anyhow::ensure!(event.id.is_some(), "the notification has no event ID: it could not be resumed");
            seen = true;
            let now = Instant::now();
            {
                let mut last = shared.last_notified.lock();
                *last = Some(last.map_or(now, |l| l.max(now)));
            }
            if shared.notified.fetch_add(1, Ordering::SeqCst) + 1 == shared.keepalives.len() {
                shared.all_notified.notify_one();
            }
        }
    }
}

/// A chunked transfer-coding reader (RFC 9112 §7.1) for a body that never
/// ends: sizes in hex, no extensions or trailers expected.
#[derive(Default)]
struct Chunked {
    /// Bytes of the current chunk still to come, then its CRLF.
    left: usize,
    crlf: usize,
}

impl Chunked {
    /// Takes what it can from `input` (leaving an incomplete size line) and returns the body bytes.
    fn decode(&mut self, input: &mut Vec<u8>) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            if self.left > 0 {
                let n = self.left.min(input.len() - at);
                out.extend_from_slice(&input[at..at + n]);
                (self.left, at) = (self.left - n, at + n);
                if self.left == 0 {
                    self.crlf = 2;
                }
            } else if self.crlf > 0 {
                anyhow::ensure!(matches!(input[at], b'\r' | b'\n'), "no CRLF after a chunk");
                (self.crlf, at) = (self.crlf - 1, at + 1);
            } else {
                let Some(eol) = input[at..].windows(2).position(|w| w == b"\r\n") else { break };
                let line = std::str::from_utf8(&input[at..at + eol]).context("a chunk size that is not text")?;
                let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                    .with_context(|| format!("chunk size `{line}`"))?;
                anyhow::ensure!(size > 0, "the body ended (a zero-size chunk)");
                (self.left, at) = (size, at + eol + 2);
            }
        }
        input.drain(..at);
        Ok(out)
    }
}

/// The environment variable that hands streams_10k's server its admin token.
const ADMIN_TOKEN_ENV: &str = "TETHER_BENCH_ADMIN_TOKEN";
/// The server's keep-alive interval (tether's default; there is no flag).
const SERVER_KEEPALIVE: Duration = Duration::from_secs(15);

/// Raises this process's soft limit on open files to `wanted` (its hard
/// limit allowing); the servers it spawns inherit it. Returns the limit.
fn raise_open_files(wanted: u64) -> anyhow::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let soft = limit.current.unwrap_or(u64::MAX);
    anyhow::ensure!(
        hard >= wanted,
        "streams_10k needs {wanted} open files in the bench and in the server, the hard limit is {hard}: raise it (ulimit -Hn, or LimitNOFILE)"
    );
    if soft < wanted {
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(wanted), maximum: limit.maximum })
            .context("cannot raise the soft limit on open files")?;
    }
    Ok(soft.max(wanted))
}

/// streams_10k on one fresh tether-sqlite: `--streams` sessions, a
/// standalone GET stream open on each; after the server settled, its RSS and
/// CPU over `--idle-window` (every stream must have had a keep-alive by
/// then); then one notification to every session through the admin API and
/// the time until the last stream has it.
pub(crate) async fn streams_10k(args: &Args, programs: &Programs) -> Row {
    let n = args.streams;
    let subject = Subject::from(System::TetherSqlite);
    eprintln!("== {}: streams_10k ({n} sessions with an open stream each)", subject.name());
    let mut row = Row::new(subject, Scenario::Streams10k, n, args.quick);
    row.count = Some(n as u64);
    let outcome = async {
        anyhow::ensure!(n > 0, "--streams must be 1 or more");
        // The bench holds a socket per stream, and so does the server (which
        // inherits the limit), plus its store's files and the session clients.
        let files = raise_open_files(n as u64 + 1_024)?;
        let token = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let mut launch = Launch::new(subject);
        // Sessions with an open stream are never evicted; a cache below their
        // number would rescan the whole map on every insertion beyond it.
        // The connection cap (default 10,000) must leave room beside the
        // streams for the admin API's POST: at the cap it would wait in the
        // listen backlog until a stream closed, that is forever.
        launch.extra_args = vec![
            "--session-cache".into(),
            (n + 1_024).to_string(),
            "--max-connections".into(),
            (n + 1_024).to_string(),
            "--admin-token-env".into(),
            ADMIN_TOKEN_ENV.into(),
        ];
        launch.env = vec![(ADMIN_TOKEN_ENV.into(), token.clone())];
        launch.max_sessions = Some(n + 1_024);
        let (server, _store) = start(programs, &launch).await?;
        let result = async {
            let started = Instant::now();
            let ids = sessions::create(&server.mcp_url, n, args.session_clients).await.context("creating the sessions")?;
            eprintln!("   {n} sessions in {:.1} s (open files: {files})", started.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss_sessions = server.rss_bytes()?;
            let origin = server::origin(&server.mcp_url);
            let addr: std::net::SocketAddr =
                origin.trim_start_matches("http://").parse().with_context(|| format!("no address in {}", server.mcp_url))?;
            let path = &server.mcp_url[origin.len()..];
            let started = Instant::now();
            let streams = Streams::open(addr, path, &ids).await?;
            eprintln!("   {n} streams open in {:.1} s", started.elapsed().as_secs_f64());
            drop(ids);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss_open = server.rss_bytes()?;
            let per_stream = (rss_open as f64 - rss_sessions as f64) / n as f64;
            // With a keeper: the keeper's and the engine's CPU.
            let (cpu_before, at) = (server.cpu_time().context("cannot read the server's CPU time")?, Instant::now());
            tokio::time::sleep(args.idle_window).await;
            let cpu = server.cpu_time().context("cannot read the server's CPU time")?.saturating_sub(cpu_before);
            let window = at.elapsed();
            let rss_idle = server.rss_bytes()?;
            streams.check()?;
            let (fewest, most) = streams.keepalives();
            if args.idle_window >= SERVER_KEEPALIVE {
                anyhow::ensure!(fewest >= 1, "a stream had no keep-alive after {window:?} idle");
            }
            let (fanout_ms, answer) = streams.fan_out(&format!("{origin}/admin/notify"), &token).await?;
            let rss_after = server.rss_bytes()?;
            let peak = server.peak_rss_mib()?;
            drop(streams);
            eprintln!(
                "   RSS {:.1} MiB with the sessions, {:.1} MiB with the streams open ({per_stream:.0} B per stream), {:.1} MiB idle, {:.1} MiB after the fan-out (peak {peak:.1}); idle CPU {:.2}% over {:.1} s; keep-alives per stream {fewest} to {most}; fan-out {fanout_ms:.0} ms ({answer})",
                rss_sessions as f64 / 1048576.0,
                rss_open as f64 / 1048576.0,
                rss_idle as f64 / 1048576.0,
                rss_after as f64 / 1048576.0,
                cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
                window.as_secs_f64()
            );
            Ok::<_, anyhow::Error>((rss_idle, cpu, window, (fewest, most), fanout_ms, (rss_sessions, per_stream, rss_after, peak)))
        }
        .await;
        if result.is_err() {
            eprintln!("   server log tail:\n{}", server.log_tail());
        }
        let (count, last) = server.problems();
        server.stop().await?;
        result.map(|r| (r, count, last))
    }
    .await;
    match outcome {
        Ok(((rss_idle, cpu, window, (fewest, most), fanout_ms, (rss_sessions, per_stream, rss_after, peak)), problems, last)) => {
            row.bytes = Some(round(per_stream, 0));
            row.rss_mib = Some(round(rss_idle as f64 / 1048576.0, 1));
            row.cpu_percent = Some(round(cpu.as_secs_f64() / window.as_secs_f64() * 100.0, 2));
            row.fanout_ms = Some(round(fanout_ms, 1));
            let mut note = format!(
                "idle window {:.0} s, keep-alives per stream {fewest} to {most}; RSS {:.1} MiB before the streams opened (bytes: RSS growth per open stream), {:.1} MiB after the fan-out, peak {peak:.1} MiB; --session-cache {} --max-sessions-per-principal {} --max-connections {}",
                window.as_secs_f64(),
                rss_sessions as f64 / 1048576.0,
                rss_after as f64 / 1048576.0,
                n + 1_024,
                n + 1_024,
                n + 1_024
            );
            if problems > 0 {
                eprintln!("   the server logged {problems} WARN/ERROR lines; the last ones:\n{}", last.join("\n"));
                note.push_str(&format!("; server log: {problems} WARN/ERROR lines"));
            }
            row.note = Some(note);
        }
        Err(e) => {
            eprintln!("   error: {e:#}");
            row.errors = 1;
            row.error = Some(format!("{e:#}"));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::Chunked;

    #[test]
    fn a_chunked_body_is_decoded_across_any_split() {
        let wire = b"d\r\n: keepalive\n\n\r\n3\r\nabc\r\n";
        for split in 0..wire.len() {
            let mut chunked = Chunked::default();
            let mut first = wire[..split].to_vec();
            let mut out = chunked.decode(&mut first).expect("first part");
            first.extend_from_slice(&wire[split..]);
            out.extend(chunked.decode(&mut first).expect("second part"));
            assert_eq!(out, b": keepalive\n\nabc", "split at {split}");
            assert!(first.is_empty());
        }
        assert!(Chunked::default().decode(&mut b"0\r\n\r\n".to_vec()).is_err(), "the end of an endless body is an error");
    }
}
