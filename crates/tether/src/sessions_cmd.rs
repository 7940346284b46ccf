//! `tether sessions list|show ID|delete ID`: through a running server's
//! admin API (`--url`, token from `$TETHER_ADMIN_TOKEN`), or, without
//! `--url`, in a stopped server's store (`--store`; a SQLite file a running
//! server holds is refused: its lock file is taken).

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tether_store::{SessionRecord, Store, StoreConfig, StoreUrl, now_ms};

/// The environment variable `tether sessions --url` takes the admin token from.
pub const TOKEN_VAR: &str = "TETHER_ADMIN_TOKEN";
/// How long one admin API call may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(subcommand)]
    command: SessionsCommand,
    /// A running server (`http://HOST:PORT`, with or without `/mcp`); its
    /// admin API must be on (`serve --admin-token-env`), the token in $TETHER_ADMIN_TOKEN.
    #[arg(long, global = true)]
    url: Option<String>,
    /// Without --url: the store of a stopped server (`sqlite:PATH`, `redis://…`);
    /// default the server's default SQLite file.
    #[arg(long, global = true, env = "TETHER_STORE")]
    store: Option<String>,
    /// Key prefix in Redis.
    #[arg(long, global = true, env = "TETHER_STORE_PREFIX", default_value = "tether:")]
    store_prefix: String,
    /// Print JSON (for scripts) instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// Live sessions, most useful filters included.
    List {
        /// Only sessions of this principal.
        #[arg(long)]
        principal: Option<String>,
        /// Only sessions of this upstream (`/mcp/NAME`; "" for /mcp).
        #[arg(long)]
        upstream: Option<String>,
        /// Only sessions idle at least this long (e.g. 90s, 10m, 2h).
        #[arg(long)]
        idle: Option<String>,
        /// At most this many sessions.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One session: its record, streams, requests in flight and operations (each also a task).
    Show { id: String },
    /// End a session, as its client's DELETE would.
    Delete { id: String },
}

pub async fn run(args: SessionsArgs) -> anyhow::Result<()> {
    let out = match &args.url {
        Some(url) => remote(&args, url).await?,
        None => local(&args).await?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    match &args.command {
        SessionsCommand::List { .. } => print_table(&out),
        SessionsCommand::Show { .. } => print_show(&out),
        SessionsCommand::Delete { id } => println!("session {id} ended"),
    }
    Ok(())
}

// ---- through the admin API -------------------------------------------------------

async fn remote(args: &SessionsArgs, url: &str) -> anyhow::Result<Value> {
    admin_call(url, |http, base| {
        Ok(match &args.command {
            SessionsCommand::List { principal, upstream, idle, limit } => {
                let mut url =
                    reqwest::Url::parse(&format!("{base}/admin/sessions")).with_context(|| format!("`{base}` is not a URL"))?;
                url.query_pairs_mut().append_pair("limit", &limit.to_string());
                for (key, value) in [("principal", principal), ("upstream", upstream), ("idle", idle)] {
                    if let Some(v) = value {
                        url.query_pairs_mut().append_pair(key, v);
                    }
                }
                http.get(url)
            }
            SessionsCommand::Show { id } => http.get(format!("{base}/admin/sessions/{}", path_segment(id)?)),
            SessionsCommand::Delete { id } => http.delete(format!("{base}/admin/sessions/{}", path_segment(id)?)),
        })
    })
    .await
}

/// One call of a running server's admin API at `url` (its base, or its
/// `/mcp`), with the token from `$TETHER_ADMIN_TOKEN`: `request` makes it
/// from a client and the base URL. Its JSON answer, or an error that says
/// what to do.
pub(crate) async fn admin_call(
    url: &str,
    request: impl FnOnce(&reqwest::Client, &str) -> anyhow::Result<reqwest::RequestBuilder>,
) -> anyhow::Result<Value> {
    let token = std::env::var(TOKEN_VAR)
        .with_context(|| format!("set ${TOKEN_VAR} to the server's admin token (its `serve --admin-token-env` variable)"))?;
    let base = url.trim_end_matches('/');
    let base = base.strip_suffix("/mcp").unwrap_or(base);
    let http = reqwest::Client::builder().timeout(HTTP_TIMEOUT).build()?;
    let response =
        request(&http, base)?.bearer_auth(token.trim()).send().await.with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    match status.as_u16() {
        200 | 202 => Ok(body),
        401 => bail!("{base} refused the admin token: check ${TOKEN_VAR}"),
        404 if body.is_null() => bail!("{base} has no admin API: start it with --admin-token-env VAR"),
        _ => bail!("{base} answered {status}: {}", body.get("error").and_then(Value::as_str).unwrap_or("(no reason given)")),
    }
}

/// A session ID as it goes into a URL path (IDs are hex; anything else is refused).
fn path_segment(id: &str) -> anyhow::Result<&str> {
    if id.is_empty() || id.len() > 256 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        bail!("`{id}` is not a session ID");
    }
    Ok(id)
}

// ---- in a stopped server's store ------------------------------------------------------

async fn local(args: &SessionsArgs) -> anyhow::Result<Value> {
    let url: StoreUrl = match &args.store {
        Some(s) => s.parse()?,
        None => crate::serve::default_store()?,
    };
    let store: std::sync::Arc<dyn Store> = match &url {
        StoreUrl::Memory => bail!("a memory store lives only inside its server: use --url with the admin API"),
        StoreUrl::Sqlite(path) => {
            if !path.exists() {
                bail!("no store at {}: pass --store sqlite:PATH, or --url for a running server", path.display());
            }
            // A running server holds the lock for good: say so at once.
            let config = StoreConfig { lock_wait: std::time::Duration::ZERO, ..StoreConfig::default() };
            let store = tether_store::sqlite::SqliteStore::open(path, config).await.map_err(|e| {
                if matches!(e, tether_store::StoreError::InUse(_)) {
                    anyhow::anyhow!(
                        "{} is held by a running tether server; ask it instead: tether sessions … --url http://HOST:PORT \
                         (with its admin API on), or stop it first",
                        path.display()
                    )
                } else {
                    anyhow::anyhow!("cannot open {}: {e}", path.display())
                }
            })?;
            std::sync::Arc::new(store)
        }
        StoreUrl::Redis(redis) => {
            let config = StoreConfig { redis_prefix: args.store_prefix.clone(), ..StoreConfig::default() };
            std::sync::Arc::new(tether_store::redis::RedisStore::open(redis, config).await?)
        }
    };
    let now = now_ms();
    match &args.command {
        SessionsCommand::List { principal, upstream, idle, limit } => {
            let idle_ms = match idle {
                None => None,
                Some(s) => Some(humantime::parse_duration(s).with_context(|| format!("--idle `{s}`"))?.as_millis() as i64),
            };
            let (mut sessions, mut cursor) = (Vec::new(), None::<String>);
            loop {
                let page = store.scan_sessions(cursor.as_deref(), 500, now).await?;
                for record in &page.sessions {
                    let last = record.expires_at_ms.saturating_sub(ttl_guess(record));
                    let keep = principal.as_deref().is_none_or(|p| p == record.principal)
                        && upstream.as_deref().is_none_or(|u| u == endpoint_of(record))
                        && idle_ms.is_none_or(|ms| now - last >= ms);
                    if keep && sessions.len() < *limit {
                        sessions.push(summary(record, now));
                    }
                }
                cursor = page.next;
                if cursor.is_none() || sessions.len() >= *limit {
                    break;
                }
            }
            Ok(json!({"sessions": sessions, "next": cursor}))
        }
        SessionsCommand::Show { id } => {
            let record = store.get_session(id, now).await?.with_context(|| format!("no live session {id}"))?;
            let streams = store.open_streams(id).await?;
            let mut out = summary(&record, now);
            if let Some(obj) = out.as_object_mut() {
                obj.insert("revision".into(), json!(record.revision));
                obj.insert("state".into(), record.state.clone());
                obj.insert(
                    "streams".into(),
                    json!(
                        streams
                            .iter()
                            .map(|s| json!({"stream": s.stream, "first_seq": s.first_seq, "head": s.last_seq, "finished": s.finished}))
                            .collect::<Vec<_>>()
                    ),
                );
                obj.insert("requests_in_flight".into(), json!([]));
                // A stopped server runs nothing.
                let operations = tether_server::engine::operations::of_session(store.as_ref(), id, |_| false).await?;
                obj.insert("operations".into(), json!(operations));
            }
            Ok(out)
        }
        SessionsCommand::Delete { id } => {
            if !store.delete_session(id).await? {
                bail!("no session {id}");
            }
            store.flush().await?;
            Ok(json!({"deleted": id}))
        }
    }
}

/// The stored record does not keep the server's TTL; the default one
/// (30 min) estimates the last activity of a stopped server's sessions.
fn ttl_guess(_record: &SessionRecord) -> i64 {
    30 * 60 * 1000
}

fn endpoint_of(record: &SessionRecord) -> &str {
    record.state.get("endpoint").and_then(Value::as_str).unwrap_or("")
}

fn summary(record: &SessionRecord, now: i64) -> Value {
    let last = record.expires_at_ms.saturating_sub(ttl_guess(record));
    tether_server::http::session_summary(record, last, false, now)
}

// ---- for people ---------------------------------------------------------------------------

fn duration(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn print_table(out: &Value) {
    let sessions = out.get("sessions").and_then(Value::as_array).cloned().unwrap_or_default();
    let now = now_ms();
    let rows: Vec<[String; 5]> = sessions
        .iter()
        .map(|s| {
            let upstream = text(s, "upstream");
            [
                text(s, "id"),
                text(s, "principal"),
                if upstream.is_empty() { "/mcp".into() } else { format!("/mcp/{upstream}") },
                duration(s.get("idle_ms").and_then(Value::as_i64).unwrap_or(0)),
                duration(s.get("expires_at_ms").and_then(Value::as_i64).unwrap_or(now) - now),
            ]
        })
        .collect();
    let header = ["ID", "PRINCIPAL", "ENDPOINT", "IDLE", "EXPIRES IN"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let parts: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header);
    for row in &rows {
        line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
    match out.get("next").and_then(Value::as_str) {
        Some(_) => println!("({} shown; more with a larger --limit or a filter)", rows.len()),
        None => println!("({} sessions)", rows.len()),
    }
}

fn print_show(out: &Value) {
    let now = now_ms();
    let upstream = text(out, "upstream");
    println!("session     {}", text(out, "id"));
    println!("principal   {}", text(out, "principal"));
    println!("endpoint    {}", if upstream.is_empty() { "/mcp".into() } else { format!("/mcp/{upstream}") });
    println!("protocol    {}", text(out, "protocol_version"));
    println!("client      {}", out.get("client").map(Value::to_string).unwrap_or_default());
    println!("idle        {}", duration(out.get("idle_ms").and_then(Value::as_i64).unwrap_or(0)));
    println!("expires in  {}", duration(out.get("expires_at_ms").and_then(Value::as_i64).unwrap_or(now) - now));
    for upstream in out.get("upstreams").and_then(Value::as_array).into_iter().flatten() {
        let mut line = format!("upstream    {}", text(upstream, "upstream"));
        if let Some(member) = upstream.get("member").and_then(Value::as_str) {
            line = format!("member      {member} ({})", text(upstream, "upstream"));
        }
        line.push_str(&format!("  {}", text(upstream, "state")));
        if upstream.get("down") == Some(&Value::Bool(true)) {
            line.push_str("  down");
        }
        if let Some(id) = upstream.get("upstream_session").and_then(Value::as_str) {
            line.push_str(&format!("  upstream session {id}"));
        }
        println!("{line}");
    }
    let streams = out.get("streams").and_then(Value::as_array).cloned().unwrap_or_default();
    println!("streams     {}", streams.len());
    for s in &streams {
        println!(
            "  {}  {}  head {}  {}",
            text(s, "stream"),
            text(s, "kind"),
            text(s, "head"),
            if s.get("finished").and_then(Value::as_bool) == Some(true) { "finished" } else { "open" }
        );
    }
    let inflight = out.get("requests_in_flight").and_then(Value::as_array).cloned().unwrap_or_default();
    println!("in flight   {}", inflight.iter().map(Value::to_string).collect::<Vec<_>>().join(", "));
    let operations = out.get("operations").and_then(Value::as_array).cloned().unwrap_or_default();
    println!("operations  {}", operations.len());
    for op in &operations {
        println!(
            "  {}  {}  {}  {} chunk(s)  updated {} ago",
            text(op, "id"),
            text(op, "tool"),
            text(op, "state"),
            text(op, "chunks"),
            duration(now - op.get("updated_at_ms").and_then(Value::as_i64).unwrap_or(now))
        );
    }
}
