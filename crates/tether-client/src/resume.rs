//! The resume loop (seed "resume tokens for long-running operations", client
//! side): a `tools/call` result whose `_meta.nextResumeToken` is set is
//! followed by repeating the identical request with only
//! `params._meta.resumeToken` changed, until a result carries no
//! `nextResumeToken`. Tokens are opaque values passed back as they came.
//! Rounds marked `_meta["dev.tether/pending"] = true` carry no data; the
//! content of every other round is joined in order. Bounded rounds and
//! bytes; quick pending rounds are paced with a growing pause.

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tether_wire::meta::{NEXT_RESUME_TOKEN, PENDING, RESUME_TOKEN};

use crate::ClientError;

/// Default bound on rounds of one call.
pub const DEFAULT_MAX_ROUNDS: usize = 1000;
/// Bound on the text joined from all rounds.
pub const MAX_JOINED_BYTES: usize = 512 * 1024 * 1024;
/// A pending round answered faster than this is followed by a pause.
const QUICK_ROUND: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// What happened in one round, for progress displays.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// 1-based.
    pub number: usize,
    /// The round carried no data yet (the server is still working).
    pub pending: bool,
    /// More rounds follow.
    pub more: bool,
    /// Bytes of text received in all rounds so far.
    pub bytes: usize,
}

/// Runs `params` (of a `tools/call`) through `send` and follows
/// `nextResumeToken` for at most `max_rounds` rounds; returns the complete
/// result: the last round's result with the content of all data rounds.
pub async fn follow<F, Fut>(
    params: Value,
    max_rounds: usize,
    mut send: F,
    mut on_round: impl FnMut(&Round),
) -> Result<Value, ClientError>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = Result<Value, ClientError>>,
{
    let mut joined: Vec<Value> = Vec::new();
    let mut structured: Option<Value> = None;
    let mut bytes = 0usize;
    let mut token: Option<Value> = None;
    let mut quick_pending = 0u32;
    for number in 1..=max_rounds.max(1) {
        let request = match &token {
            None => params.clone(),
            Some(t) => with_token(&params, t.clone()),
        };
        let started = Instant::now();
        let result = send(request).await?;
        let meta = result.get("_meta").and_then(Value::as_object);
        let next = meta.and_then(|m| m.get(NEXT_RESUME_TOKEN)).filter(|t| !t.is_null()).cloned();
        let pending = meta.and_then(|m| m.get(PENDING)) == Some(&Value::Bool(true));
        if number == 1 && next.is_none() {
            // Not resumed: the result exactly as the server sent it.
            on_round(&Round { number, pending, more: false, bytes: text_bytes(&result) });
            return Ok(result);
        }
        if !pending {
            if let Some(content) = result.get("content").and_then(Value::as_array) {
                bytes += content.iter().map(block_text_len).sum::<usize>();
                if bytes > MAX_JOINED_BYTES {
                    return Err(ClientError::Transport(format!(
                        "the resumed result grew past {} MiB; refusing to hold more",
                        MAX_JOINED_BYTES / (1024 * 1024)
                    )));
                }
                joined.extend(content.iter().cloned());
            }
            if let Some(s) = result.get("structuredContent") {
                structured = Some(s.clone());
            }
        }
        on_round(&Round { number, pending, more: next.is_some(), bytes });
        match next {
            None => return Ok(finish(result, joined, structured)),
            Some(t) => token = Some(t),
        }
        if pending && started.elapsed() < QUICK_ROUND {
            // The server answered "not yet" at once: do not hammer it.
            let pause = (Duration::from_millis(100) * (1u32 << quick_pending.min(5))).min(MAX_PAUSE);
            quick_pending += 1;
            tokio::time::sleep(pause).await;
        } else {
            quick_pending = 0;
        }
    }
    Err(ClientError::Transport(format!(
        "the server still answered with a nextResumeToken after {max_rounds} rounds; giving up (the work may still be running on the server)"
    )))
}

/// `params` with `_meta.resumeToken` set, nothing else changed.
fn with_token(params: &Value, token: Value) -> Value {
    let mut p = params.clone();
    if !p.is_object() {
        p = Value::Object(Map::new());
    }
    if let Some(obj) = p.as_object_mut() {
        let meta = obj.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        if let Some(m) = meta.as_object_mut() {
            m.insert(RESUME_TOKEN.to_owned(), token);
        }
    }
    p
}

fn finish(mut last: Value, joined: Vec<Value>, structured: Option<Value>) -> Value {
    if let Some(obj) = last.as_object_mut() {
        obj.insert("content".to_owned(), Value::Array(joined));
        if let Some(s) = structured {
            obj.entry("structuredContent").or_insert(s);
        }
        if let Some(meta) = obj.get_mut("_meta").and_then(Value::as_object_mut) {
            meta.remove(NEXT_RESUME_TOKEN);
            meta.remove(PENDING);
        }
    }
    last
}

fn block_text_len(block: &Value) -> usize {
    block.get("text").and_then(Value::as_str).map_or(0, str::len)
}

fn text_bytes(result: &Value) -> usize {
    result.get("content").and_then(Value::as_array).map_or(0, |c| c.iter().map(block_text_len).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use serde_json::json;
    use std::sync::Arc;

    #[tokio::test]
    async fn follows_tokens_changing_only_the_resume_token_and_joins_data_rounds() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = vec![
            json!({"content": [], "_meta": {"nextResumeToken": "t1", "dev.tether/pending": true}}),
            json!({"content": [{"type": "text", "text": "ab"}], "_meta": {"nextResumeToken": {"opaque": [1]}}}),
            json!({"content": [{"type": "text", "text": "cd"}], "isError": false}),
        ];
        let params = json!({"name": "x", "arguments": {"k": 1}, "_meta": {"progressToken": "p"}});
        let s = seen.clone();
        let mut answers = answers.into_iter();
        let mut rounds = Vec::new();
        let result = follow(
            params.clone(),
            10,
            |p| {
                s.lock().push(p);
                let a = answers.next().unwrap();
                async move { Ok(a) }
            },
            |r| rounds.push(r.clone()),
        )
        .await
        .unwrap();
        assert_eq!(result["content"], json!([{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]));
        assert_eq!(result["isError"], false);
        let seen = seen.lock();
        assert_eq!(seen[0], params);
        let mut expected = params.clone();
        expected["_meta"]["resumeToken"] = json!("t1");
        assert_eq!(seen[1], expected, "only _meta.resumeToken changes");
        expected["_meta"]["resumeToken"] = json!({"opaque": [1]});
        assert_eq!(seen[2], expected, "tokens are passed back as they came");
        assert_eq!(rounds.len(), 3);
        assert!(rounds[0].pending && !rounds[2].more);
    }

    #[tokio::test]
    async fn a_result_without_a_token_is_returned_untouched_and_rounds_are_bounded() {
        let one = json!({"content": [{"type": "text", "text": "x"}], "_meta": {"k": 1}});
        let r = follow(
            json!({"name": "x"}),
            10,
            |_| {
                let o = one.clone();
                async move { Ok(o) }
            },
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!(r, one);

        let forever = json!({"content": [{"type": "text", "text": "x"}], "_meta": {"nextResumeToken": "again"}});
        let err = follow(
            json!({"name": "x"}),
            5,
            |_| {
                let o = forever.clone();
                async move { Ok(o) }
            },
            |_| {},
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("5 rounds"), "{err}");
    }
}
