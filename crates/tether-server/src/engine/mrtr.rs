//! Multi round-trip requests (2026-07-28): how a sessionless request asks
//! its client something. An application asks as it would in a session
//! (`RequestCtx::request_client`, e.g. `roots/list`); without a session the
//! engine cannot hold the request open for the answer, so the ask ends this
//! round with `resultType: "input_required"`, `inputRequests` and a sealed
//! `requestState`. The client repeats the request with `inputResponses`
//! (and the state, byte for byte); the application runs again from the
//! start, and the same ask, in the same order, now gets its answer. The
//! answers of earlier rounds travel in the state, so a request that asks
//! twice takes two rounds, not a loop.
//!
//! `requestState` is the client's to hold and so an attacker's to forge:
//! it is sealed with the server key and bound to the principal, the method,
//! the name the request is about (tool, prompt, resource) and an expiry. A
//! state that does not verify, or answers without a state, is `-32602`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tether_store::now_ms;
use tether_wire::{RpcError, code};

use super::keys::{same_tag, tag};

/// How long a client has to answer a round.
const ROUND_TTL: Duration = Duration::from_secs(600);
/// Asks one request may make in a round (a loop of asks is a bug, not input).
const MAX_ASKS: usize = 16;
const STATE_LABEL: &[u8] = b"tether-mrtr-v1";

/// What a request's rounds carry: the answers the client gave, and what the
/// work asked in this round.
#[derive(Debug, Default)]
pub struct Rounds {
    /// Every answer so far (earlier rounds' from the state, this round's).
    pub(crate) answers: Map<String, Value>,
    asked: Mutex<Vec<(String, Value)>>,
    /// Asks made by this run of the work, answered or not: the next key.
    made: AtomicUsize,
}

/// What `requestState` says; sealed, never trusted unsealed.
#[derive(Serialize, Deserialize)]
struct State {
    /// SHA-256 of the principal (the state travels through the client).
    p: String,
    m: String,
    n: Option<String>,
    e: i64,
    /// Answers of the rounds before.
    #[serde(default)]
    a: Map<String, Value>,
}

fn principal_hash(principal: &str) -> String {
    hex::encode(Sha256::digest(principal.as_bytes()))
}

/// The name a request is about (`params.name` or `params.uri`).
pub(crate) fn subject(params: &Map<String, Value>) -> Option<String> {
    params.get("name").or_else(|| params.get("uri")).and_then(Value::as_str).map(str::to_owned)
}

fn refused(why: &str) -> RpcError {
    RpcError::invalid_params(format!("invalid requestState: {why}; send the request again without inputResponses"))
}

/// Seals a state for `principal`'s `method` about `subject` (see [`subject`]).
pub(crate) fn seal(
    key: &[u8; 32],
    principal: &str,
    method: &str,
    subject: Option<String>,
    answers: &Map<String, Value>,
) -> String {
    let state = State {
        p: principal_hash(principal),
        m: method.to_owned(),
        n: subject,
        e: now_ms() + ROUND_TTL.as_millis() as i64,
        a: answers.clone(),
    };
    let body = serde_json::to_vec(&state).unwrap_or_default();
    let sealed = tag(key, STATE_LABEL, &[&body]);
    format!("{}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&body), hex::encode(sealed))
}

/// Takes `inputResponses` and `requestState` out of `params` and checks
/// them: the rounds the work sees.
pub fn take(key: &[u8; 32], principal: &str, method: &str, params: &mut Map<String, Value>) -> Result<Rounds, RpcError> {
    let answers = match params.remove("inputResponses") {
        None | Some(Value::Null) => None,
        Some(Value::Object(a)) => Some(a),
        Some(_) => return Err(RpcError::invalid_params("params.inputResponses must be an object")),
    };
    let state = params.remove("requestState");
    let Some(answers) = answers else { return Ok(Rounds::default()) };
    let state = state.as_ref().and_then(Value::as_str).ok_or_else(|| refused("inputResponses came without it"))?;
    let (body, sealed) = state.split_once('.').ok_or_else(|| refused("malformed"))?;
    let body = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(body).map_err(|_| refused("malformed"))?;
    let sealed = hex::decode(sealed).map_err(|_| refused("malformed"))?;
    if !same_tag(&tag(key, STATE_LABEL, &[&body]), &sealed) {
        return Err(refused("it was not issued by this server, or it was changed"));
    }
    let state: State = serde_json::from_slice(&body).map_err(|_| refused("malformed"))?;
    if state.p != principal_hash(principal) || state.m != method || state.n != subject(params) {
        return Err(refused("it was issued for another request"));
    }
    if state.e <= now_ms() {
        return Err(refused("expired"));
    }
    let mut all = state.a;
    all.extend(answers);
    Ok(Rounds { answers: all, ..Rounds::default() })
}

impl Rounds {
    /// The client's answer to the work's `n`th ask of `method`, if this
    /// round carries one; otherwise the ask is recorded and the work is
    /// told to stop (its error does not reach the client: the round ends
    /// `input_required`).
    pub(crate) fn ask(&self, method: &str, params: Option<Value>, capabilities: &Value) -> Result<Value, RpcError> {
        let needed = match method {
            "roots/list" => "roots",
            "sampling/createMessage" => "sampling",
            "elicitation/create" => "elicitation",
            other => return Err(RpcError::internal(format!("{other} cannot be asked of a sessionless client"))),
        };
        if capabilities.get(needed).is_none() {
            return Err(super::missing_capability(needed, &format!("this request asks the client {method}")));
        }
        let mut asked = self.asked.lock();
        let key = format!("{method}#{}", self.made.fetch_add(1, Ordering::Relaxed));
        if let Some(answer) = self.answers.get(&key) {
            return Ok(answer.clone());
        }
        if asked.len() >= MAX_ASKS {
            return Err(RpcError::internal("this request asked its client too many things in one round"));
        }
        let mut request = json!({"method": method});
        if let Some(p) = params {
            request["params"] = p;
        }
        asked.push((key, request));
        Err(RpcError::new(code::INTERNAL_ERROR, "input required from the client (answered as input_required)"))
    }

    /// Whether this round asked something not yet answered.
    pub(crate) fn has_asked(&self) -> bool {
        !self.asked.lock().is_empty()
    }

    /// The `input_required` result of a round that asked something.
    pub(crate) fn input_required(&self, state: impl FnOnce() -> String) -> Option<Value> {
        let asked = self.asked.lock();
        if asked.is_empty() {
            return None;
        }
        let requests: Map<String, Value> = asked.iter().cloned().collect();
        Some(json!({"resultType": "input_required", "inputRequests": requests, "requestState": state()}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_answers_of_earlier_rounds_come_back_in_the_state() {
        let key = [7u8; 32];
        let call = params(json!({"name": "thought"}));
        let earlier = params(json!({"roots/list#0": {"roots": []}}));
        let mut next = params(json!({"name": "thought", "inputResponses": {"roots/list#1": {"roots": []}}}));
        next.insert("requestState".into(), json!(seal(&key, "alice", "tools/call", subject(&call), &earlier)));
        let rounds = take(&key, "alice", "tools/call", &mut next).unwrap();
        assert!(rounds.answers.contains_key("roots/list#0") && rounds.answers.contains_key("roots/list#1"));
        assert!(!next.contains_key("inputResponses") && !next.contains_key("requestState"), "the application never sees them");
    }

    #[test]
    fn a_sealed_state_is_accepted_once_bound_and_refused_when_changed_or_moved() {
        let key = [7u8; 32];
        let call = params(json!({"name": "thought"}));
        let state = seal(&key, "alice", "tools/call", subject(&call), &Map::new());
        let round = |principal: &str, method: &str, p: Value, state: &str| {
            let mut p = params(p);
            p.insert("inputResponses".into(), json!({"roots/list#0": {"roots": []}}));
            p.insert("requestState".into(), json!(state));
            take(&key, principal, method, &mut p).map(|r| r.answers.len())
        };
        assert_eq!(round("alice", "tools/call", json!({"name": "thought"}), &state).unwrap(), 1);
        let code = |r: Result<usize, RpcError>| r.unwrap_err().code;
        assert_eq!(code(round("mallory", "tools/call", json!({"name": "thought"}), &state)), -32602);
        assert_eq!(code(round("alice", "tools/call", json!({"name": "other"}), &state)), -32602);
        assert_eq!(code(round("alice", "prompts/get", json!({"name": "thought"}), &state)), -32602);
        let (body, sealed) = state.split_once('.').unwrap();
        let mut forged = body.to_owned();
        forged.insert(3, 'x');
        assert_eq!(code(round("alice", "tools/call", json!({"name": "thought"}), &format!("{forged}.{sealed}"))), -32602);
        let mut answers_only = params(json!({"name": "thought", "inputResponses": {}}));
        assert_eq!(take(&key, "alice", "tools/call", &mut answers_only).unwrap_err().code, -32602);
    }

    #[test]
    fn an_ask_is_recorded_in_one_round_and_answered_in_the_next() {
        let caps = json!({"roots": {}});
        let first = Rounds::default();
        assert!(first.ask("roots/list", None, &caps).is_err());
        let required = first.input_required(|| "s".into()).unwrap();
        assert_eq!(required["inputRequests"]["roots/list#0"]["method"], "roots/list");
        let second = Rounds { answers: params(json!({"roots/list#0": {"roots": [{"uri": "file:///p"}]}})), ..Rounds::default() };
        assert_eq!(second.ask("roots/list", None, &caps).unwrap()["roots"][0]["uri"], "file:///p");
        assert!(second.input_required(|| "s".into()).is_none());
        assert!(second.ask("roots/list", None, &caps).is_err(), "a second ask is a new key");
        assert!(second.input_required(|| "s".into()).unwrap()["inputRequests"]["roots/list#1"].is_object());
        assert_eq!(Rounds::default().ask("roots/list", None, &json!({})).unwrap_err().code, -32021);
    }
}
