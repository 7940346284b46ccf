//! Header and body checks of the transport, each with the status the spec
//! asks for and a message that says what to send instead.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};

use tether_wire::code::INVALID_REQUEST;
use tether_wire::headers::{LAST_EVENT_ID, PROTOCOL_VERSION, SESSION_ID};
use tether_wire::revision;

use super::HttpError;

/// The one value of a header; two values of a header that must have one is
/// a bad request, not a guess.
fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, HttpError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(HttpError::bad_request(format!("the {name} header must appear at most once")));
    }
    match first {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| HttpError::bad_request(format!("the {name} header must be visible ASCII"))),
    }
}

fn is_local_host(host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host.ends_with(".localhost")
}

/// DNS-rebinding protection: a present Origin must be a localhost origin or
/// one of `--allowed-origin`.
pub fn origin(headers: &HeaderMap, allowed: &[String]) -> Result<(), HttpError> {
    let Some(value) = headers.get(header::ORIGIN) else { return Ok(()) };
    let forbidden = |o: &str| {
        HttpError::new(
            StatusCode::FORBIDDEN,
            INVALID_REQUEST,
            format!("Origin `{o}` is not allowed; start the server with --allowed-origin {o} to allow it"),
        )
    };
    let origin = value.to_str().map_err(|_| forbidden("<non-ASCII>"))?.trim_end_matches('/');
    if allowed.iter().any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin)) {
        return Ok(());
    }
    let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    let host = rest.map(|r| match r.rfind(':') {
        Some(i) if !r.ends_with(']') && r[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &r[..i],
        _ => r,
    });
    match host {
        Some(h) if is_local_host(h) => Ok(()),
        _ => Err(forbidden(origin)),
    }
}

fn accepts(headers: &HeaderMap) -> (bool, bool) {
    let mut json = false;
    let mut sse = false;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let media = range.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            match media.as_str() {
                "*/*" => {
                    json = true;
                    sse = true;
                }
                "application/json" | "application/*" => json = true,
                "text/event-stream" | "text/*" => sse = true,
                _ => {}
            }
        }
    }
    (json, sse)
}

pub fn accept_for_post(headers: &HeaderMap) -> Result<(), HttpError> {
    match accepts(headers) {
        (true, true) => Ok(()),
        _ => Err(HttpError::new(
            StatusCode::NOT_ACCEPTABLE,
            INVALID_REQUEST,
            "Accept must list both application/json and text/event-stream",
        )),
    }
}

pub fn accept_for_get(headers: &HeaderMap) -> Result<(), HttpError> {
    match accepts(headers) {
        (_, true) => Ok(()),
        _ => Err(HttpError::new(
            StatusCode::NOT_ACCEPTABLE,
            INVALID_REQUEST,
            "Accept must list text/event-stream to open a stream",
        )),
    }
}

pub fn content_type_json(headers: &HeaderMap) -> Result<(), HttpError> {
    let media = header_str(headers, header::CONTENT_TYPE.as_str())
        .ok()
        .flatten()
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
    match media.as_deref() {
        Some("application/json") => Ok(()),
        _ => Err(HttpError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, INVALID_REQUEST, "Content-Type must be application/json")),
    }
}

fn too_large(max: usize) -> HttpError {
    HttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        INVALID_REQUEST,
        format!("body is larger than {max} bytes (the server's --max-body)"),
    )
}

/// The body, at most `max` bytes, in full within `timeout` of the head (a
/// slow upload gets 408; hyper then closes the connection, since the rest
/// of the body was never read).
pub async fn read_body(headers: &HeaderMap, body: Body, max: usize, timeout: Duration) -> Result<bytes::Bytes, HttpError> {
    let declared = header_str(headers, header::CONTENT_LENGTH.as_str())?.and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    let Ok(read) = tokio::time::timeout(timeout, axum::body::to_bytes(body, max)).await else {
        return Err(HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            format!("the request body did not arrive within {timeout:?} (the server's --body-timeout); send it again"),
        ));
    };
    read.map_err(|e| {
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            if s.is::<http_body_util::LengthLimitError>() {
                return too_large(max);
            }
            source = s.source();
        }
        HttpError::bad_request(format!("could not read the body: {e}"))
    })
}

/// `MCP-Protocol-Version`, if present, must name a revision we serve.
pub fn protocol_version(headers: &HeaderMap) -> Result<(), HttpError> {
    match header_str(headers, PROTOCOL_VERSION)? {
        None => Ok(()),
        Some(v) if revision::is_supported(v) => Ok(()),
        Some(v) => Err(HttpError::bad_request(format!(
            "unsupported MCP-Protocol-Version `{}`; this server speaks {}",
            v.chars().take(40).collect::<String>(),
            revision::SUPPORTED.join(", ")
        ))),
    }
}

pub fn session_id(headers: &HeaderMap) -> Result<String, HttpError> {
    let id = header_str(headers, SESSION_ID)?.ok_or_else(|| {
        HttpError::bad_request("Mcp-Session-Id header is required: send initialize first and echo the session ID it returns")
    })?;
    if id.is_empty() || id.len() > 256 || !id.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(HttpError::bad_request("Mcp-Session-Id must be 1 to 256 visible ASCII characters"));
    }
    Ok(id.to_owned())
}

pub fn last_event_id(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    Ok(header_str(headers, LAST_EVENT_ID)?.map(str::to_owned).filter(|s| !s.is_empty()))
}
