//! [`SessionState`]: what the gateway keeps of a tether session in the
//! store, so that any process can rebuild the session's upstream
//! connections from it (after a restart, on another replica, after a child
//! died). One versioned struct under one app-state key, [`STATE_KEY`]:
//!
//! ```json
//! {"gateway": {"version": 2,
//!              "upstream": {"initialize": {…}, "carryOn": {…}, "capabilities": {…},
//!                           "logLevel": "debug", "subscriptions": ["file:///a"]}}}
//! ```
//!
//! An upstream served alone keeps its [`Part`] under `upstream`; a virtual
//! server's session keeps one per member under `members`, by member name
//! (see [`Slot`]).
//!
//! Reading ([`SessionState::read`]):
//!
//! - version [`VERSION`]: the struct as it is;
//! - no version: the layout before versions (version 1), written by tether
//!   up to the build that introduced this module: the part of an upstream
//!   alone as the object under `gateway` itself, each member's under its
//!   own key `member:NAME`, with the same field names. It is converted
//!   here, and written in this layout by the next change (the `member:`
//!   keys then go);
//! - a newer version: refused with an error that says so (this build cannot
//!   know what it would drop), which ends the request that needed it; the
//!   session is left as it is for the newer tether;
//! - anything else (not an object, a field of the wrong type): refused with
//!   an error that says what could not be read.
//!
//! Nothing here panics on what the store holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tether_server::{Initialize, RpcError, SessionCtx};

use crate::slot::Slot;

/// The app-state key of the gateway's state.
pub(crate) const STATE_KEY: &str = "gateway";
/// The layout this build writes, and the newest it reads.
pub(crate) const VERSION: u32 = 2;
/// In the layout before versions, a member's part was under this and its name.
const PREVIOUS_MEMBER_PREFIX: &str = "member:";

/// Everything the gateway keeps of one tether session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionState {
    /// The layout: [`VERSION`] when written by this build.
    version: u32,
    /// The part of an upstream served alone at its endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Part>,
    /// The parts of a virtual server's members, by member name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub members: BTreeMap<String, Part>,
}

/// One upstream's part of a session: how to carry its connection on, or
/// to start a new one the way the client set the first one up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Part {
    /// The client's `initialize` params as the upstream got them (without
    /// tether's `_meta` keys and the trace context). None for a member
    /// added to its virtual server after the session began: it is started
    /// with another member's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialize: Option<Map<String, Value>>,
    /// What the transport needs to carry the upstream connection on in
    /// another process (an HTTP upstream's session ID and revision, the
    /// keeper's child); the transport's own, read only by it. None: a new
    /// connection is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carry_on: Option<Value>,
    /// The capabilities the upstream declared in its `initialize` result
    /// (a virtual server asks a member only for the lists it offers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Map<String, Value>>,
    /// The client's last `logging/setLevel` the upstream took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// The resources the client subscribed to, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subscriptions: Vec<String>,
}

impl Default for SessionState {
    fn default() -> Self {
        Self { version: VERSION, upstream: None, members: BTreeMap::new() }
    }
}

impl SessionState {
    /// The gateway's state in a session's app state (empty if it has none).
    pub(crate) fn read(app: &Map<String, Value>) -> Result<Self, RpcError> {
        let Some(stored) = app.get(STATE_KEY) else { return Self::previous(None, app) };
        let Value::Object(object) = stored else {
            return Err(unreadable(format_args!("it is {}, not an object", kind(stored))));
        };
        let Some(version) = object.get("version") else { return Self::previous(Some(object), app) };
        match version.as_u64() {
            Some(v) if v > u64::from(VERSION) => Err(RpcError::internal(format!(
                "this session was stored by a newer tether (gateway state version {v}; this build reads up to {VERSION}): serve it with that tether or a newer one, or start a new session"
            ))),
            Some(v) if v == u64::from(VERSION) => {
                Self::deserialize(stored).map_err(|e| unreadable(format_args!("version {VERSION}: {e}")))
            }
            _ => Err(unreadable(format_args!("its version is {version}, which no tether writes"))),
        }
    }

    /// The layout before versions (see the module doc): `alone` is the
    /// object under [`STATE_KEY`], the members' parts are under their keys.
    fn previous(alone: Option<&Map<String, Value>>, app: &Map<String, Value>) -> Result<Self, RpcError> {
        let mut state = Self { upstream: alone.map(Part::previous).transpose()?, ..Self::default() };
        for (key, part) in app {
            let Some(member) = key.strip_prefix(PREVIOUS_MEMBER_PREFIX) else { continue };
            let Value::Object(part) = part else {
                return Err(unreadable(format_args!("`{key}` is {}, not an object", kind(part))));
            };
            state.members.insert(member.to_owned(), Part::previous(part)?);
        }
        Ok(state)
    }

    /// Reads the session's state, changes `slot`'s part with `change` (made
    /// empty if the session had none) and stores it (in this layout).
    pub(crate) async fn update(
        session: &SessionCtx,
        slot: &Slot,
        change: impl Fn(&mut Part) + Send + Sync,
    ) -> Result<(), RpcError> {
        let mut refused = None;
        session
            .update_app_state(|app| match Self::read(app) {
                Ok(mut state) => {
                    refused = None;
                    change(state.part_mut(slot));
                    state.write(app);
                }
                Err(e) => refused = Some(e),
            })
            .await?;
        refused.map_or(Ok(()), Err)
    }

    /// Puts this state in a session's app state, under its one key; the
    /// keys of the layout before versions go.
    pub(crate) fn write(&self, app: &mut Map<String, Value>) {
        app.retain(|key, _| !key.starts_with(PREVIOUS_MEMBER_PREFIX));
        app.insert(STATE_KEY.to_owned(), self.to_value());
    }

    /// Puts this state in the session a client's `initialize` makes.
    pub(crate) fn keep_in(&self, init: &mut Initialize<'_>) {
        init.set_app_state(STATE_KEY, self.to_value());
    }

    fn to_value(&self) -> Value {
        // A struct of strings, maps with string keys and JSON values: it
        // always serialises.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// `slot`'s part, if the session has one.
    pub(crate) fn part(&self, slot: &Slot) -> Option<&Part> {
        match slot {
            Slot::Alone => self.upstream.as_ref(),
            Slot::Member(name) => self.members.get(name),
        }
    }

    /// `slot`'s part, made empty if the session had none.
    pub(crate) fn part_mut(&mut self, slot: &Slot) -> &mut Part {
        match slot {
            Slot::Alone => self.upstream.get_or_insert_with(Part::default),
            Slot::Member(name) => self.members.entry(name.clone()).or_default(),
        }
    }

    /// `slot`'s part is `part`.
    pub(crate) fn put(&mut self, slot: &Slot, part: Part) {
        *self.part_mut(slot) = part;
    }

    /// The `initialize` params `slot` starts a new connection with: its
    /// own, else (a member added after the session began) another member's
    /// (the client initialized them all alike).
    pub(crate) fn initialize_of(&self, slot: &Slot) -> Option<&Map<String, Value>> {
        match self.part(slot).and_then(|part| part.initialize.as_ref()) {
            Some(own) => Some(own),
            None if matches!(slot, Slot::Member(_)) => self.members.values().find_map(|part| part.initialize.as_ref()),
            None => None,
        }
    }
}

impl Part {
    /// A part as the layout before versions wrote it, read as leniently as
    /// the gateway read it then: a log level that is not a string, or
    /// capabilities that are not an object, were never replayed nor used
    /// (they are dropped), nor were subscriptions that are not a list; only
    /// the resources named by a string are kept.
    fn previous(part: &Map<String, Value>) -> Result<Self, RpcError> {
        let initialize = match part.get("initialize") {
            None | Some(Value::Null) => None,
            Some(Value::Object(params)) => Some(params.clone()),
            Some(other) => return Err(unreadable(format_args!("its `initialize` is {}, not an object", kind(other)))),
        };
        let carry_on = part.get("carryOn").filter(|c| !c.is_null()).cloned();
        let capabilities = part.get("capabilities").and_then(Value::as_object).cloned();
        let log_level = part.get("logLevel").and_then(Value::as_str).map(str::to_owned);
        let subscriptions = part.get("subscriptions").and_then(Value::as_array).into_iter().flatten();
        let subscriptions = subscriptions.filter_map(Value::as_str).map(str::to_owned).collect();
        Ok(Self { initialize, carry_on, capabilities, log_level, subscriptions })
    }
}

/// The error of a stored state that cannot be read.
fn unreadable(why: std::fmt::Arguments<'_>) -> RpcError {
    RpcError::internal(format!(
        "the gateway's stored state of this session cannot be read ({why}); end the session and start a new one"
    ))
}

/// What a JSON value is, for errors (never the value: it may hold a token).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn member(name: &str) -> Slot {
        Slot::Member(name.to_owned())
    }

    fn params() -> Map<String, Value> {
        json!({"protocolVersion": "2025-06-18", "capabilities": {"roots": {}}, "clientInfo": {"name": "c", "version": "1"}})
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn the_state_goes_round_the_store_whole_under_one_key() {
        let mut state = SessionState::default();
        state.put(
            &Slot::Alone,
            Part {
                initialize: Some(params()),
                carry_on: Some(json!({"sessionId": "up-1", "protocolVersion": "2025-06-18"})),
                capabilities: json!({"tools": {}}).as_object().cloned(),
                log_level: Some("debug".into()),
                subscriptions: vec!["file:///a".into(), "file:///b".into()],
            },
        );
        let mut app = Map::new();
        app.insert("member:old".into(), json!({"initialize": {}}));
        app.insert("other".into(), json!(1));
        state.write(&mut app);
        assert_eq!(app.keys().collect::<Vec<_>>(), ["gateway", "other"], "one key; the old layout's keys go");
        assert_eq!(app["gateway"]["version"], json!(VERSION));
        assert_eq!(app["gateway"]["upstream"]["carryOn"]["sessionId"], json!("up-1"));
        assert_eq!(app["gateway"]["upstream"]["logLevel"], json!("debug"));
        assert_eq!(SessionState::read(&app).unwrap(), state);

        // A virtual server's members, each its own part.
        let mut state = SessionState::default();
        state.put(&member("a"), Part { initialize: Some(params()), ..Part::default() });
        state.part_mut(&member("b")).subscriptions.push("file:///b".into());
        let mut app = Map::new();
        state.write(&mut app);
        assert_eq!(app["gateway"]["members"]["b"], json!({"subscriptions": ["file:///b"]}));
        let read = SessionState::read(&app).unwrap();
        assert_eq!(read, state);
        assert_eq!(read.initialize_of(&member("b")), Some(&params()), "b was added later: started as a was");
        assert_eq!(read.initialize_of(&Slot::Alone), None);
        assert_eq!(SessionState::read(&Map::new()).unwrap(), SessionState::default(), "nothing stored yet");
    }

    /// What the gateway wrote before versions, exactly: `initialize` kept
    /// `{"initialize", "carryOn", "capabilities"}` (`carryOn` null for a
    /// child, `capabilities` null when the upstream declared none), a
    /// member it could not reach `{"initialize", "carryOn": null}`, a
    /// reconnect set `carryOn` (making the object if there was none),
    /// `logging/setLevel` set `logLevel` to the client's `level` (null if
    /// it sent none) and a (un)subscribe kept the list `subscriptions`.
    #[test]
    fn the_layout_before_versions_is_read_and_converted() {
        let mut app = Map::new();
        app.insert(
            "gateway".into(),
            json!({
                "initialize": params(),
                "carryOn": {"sessionId": "up-1", "protocolVersion": "2025-06-18"},
                "capabilities": {"tools": {"listChanged": true}},
                "logLevel": "warning",
                "subscriptions": ["file:///a", "file:///b"],
            }),
        );
        let state = SessionState::read(&app).unwrap();
        let part = state.part(&Slot::Alone).unwrap();
        assert_eq!(part.initialize, Some(params()));
        assert_eq!(part.carry_on, Some(json!({"sessionId": "up-1", "protocolVersion": "2025-06-18"})));
        assert_eq!(part.capabilities, json!({"tools": {"listChanged": true}}).as_object().cloned());
        assert_eq!(part.log_level.as_deref(), Some("warning"));
        assert_eq!(part.subscriptions, ["file:///a", "file:///b"]);
        assert!(state.members.is_empty());

        // A virtual server's session: a key per member, one of them down at
        // `initialize`, one added later that only reconnected, and the
        // nulls the earlier gateway wrote.
        let mut app = Map::new();
        app.insert("member:a".into(), json!({"initialize": params(), "carryOn": null, "capabilities": null, "logLevel": null}));
        app.insert("member:b".into(), json!({"initialize": params(), "carryOn": null}));
        app.insert("member:c".into(), json!({"carryOn": {"keeper": "k", "child": 7}}));
        let state = SessionState::read(&app).unwrap();
        assert!(state.upstream.is_none());
        assert_eq!(state.members.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(state.members["a"], Part { initialize: Some(params()), ..Part::default() });
        assert_eq!(state.members["b"], state.members["a"]);
        assert_eq!(state.members["c"].carry_on, Some(json!({"keeper": "k", "child": 7})));
        assert_eq!(state.initialize_of(&member("c")), Some(&params()));

        // Written back: this layout, the member keys gone.
        let mut written = app.clone();
        state.write(&mut written);
        assert_eq!(written.keys().collect::<Vec<_>>(), ["gateway"]);
        assert_eq!(SessionState::read(&written).unwrap(), state);
    }

    #[test]
    fn a_state_of_a_newer_tether_is_refused_saying_so() {
        let mut app = Map::new();
        app.insert("gateway".into(), json!({"version": VERSION + 1, "upstream": {"somethingNew": true}}));
        let error = SessionState::read(&app).unwrap_err();
        assert_eq!(error.code, tether_wire::code::INTERNAL_ERROR);
        assert!(
            error.message.starts_with(&format!(
                "this session was stored by a newer tether (gateway state version {}; this build reads up to {VERSION})",
                VERSION + 1
            )),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_state_that_cannot_be_read_is_refused_saying_what() {
        let cases = [
            (json!({"gateway": "x"}), "it is a string, not an object"),
            (json!({"gateway": {"version": "2"}}), "its version is \"2\", which no tether writes"),
            (json!({"gateway": {"version": 0}}), "its version is 0, which no tether writes"),
            (json!({"gateway": {"version": VERSION, "upstream": {"subscriptions": "file:///a"}}}), "version 2: "),
            (json!({"gateway": {"version": VERSION, "members": []}}), "version 2: "),
            (json!({"gateway": {"initialize": "x"}}), "its `initialize` is a string, not an object"),
            (json!({"member:a": 5}), "`member:a` is a number, not an object"),
        ];
        for (app, why) in cases {
            let app = app.as_object().cloned().unwrap_or_default();
            let error = SessionState::read(&app).unwrap_err();
            assert!(
                error.message.starts_with("the gateway's stored state of this session cannot be read (")
                    && error.message.contains(why),
                "{app:?}: {}",
                error.message
            );
        }
    }
}
