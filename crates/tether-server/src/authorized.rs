//! [`Authorized`]: a request as the HTTP front let it in: what the front
//! established about it, once, carried to the engine and the application
//! instead of its headers.
//!
//! The front verifies the bearer token once per request (a token of the
//! token file, or an OAuth access token: signature, audience, expiry) and,
//! where a policy covers the use a request makes (`tools/call`,
//! `prompts/get`, `resources/read`, `resources/subscribe`), decides it once.
//! The engine hands it to the application with the request
//! ([`crate::RequestCtx::authorized`]); [`crate::policy::Policed`] takes the
//! front's decision instead of deciding again, and adds only what the front
//! cannot know (the rule of a virtual server's member a name comes from).
//!
//! Held in memory for the request only: never stored, never logged (its
//! `Debug` shows no token).

use std::sync::Arc;

use serde_json::Value;

use crate::policy::{Decision, Target};

/// What the front established about one request: the claims of its verified
/// access token, the token itself for the one kind of application that must
/// present it on (the gateway's `forward_auth` and token exchange), and the
/// policy's decision on the use it makes.
#[derive(Clone, Default)]
pub struct Authorized {
    /// The access token's claims; `Value::Null` for a token of the token file.
    claims: Arc<Value>,
    token: Option<Arc<str>>,
    decided: Option<Arc<Decided>>,
}

/// The front's decision on one use (what it decided on, so that a request
/// whose use is not the one decided is decided again).
struct Decided {
    method: String,
    kind: &'static str,
    name: String,
    decision: Decision,
}

impl Authorized {
    /// A request that presented `token` (verified, unless authentication is
    /// off), whose claims are `claims`.
    pub fn verified(token: &str, claims: Arc<Value>) -> Self {
        Self { claims, token: Some(Arc::from(token)), decided: None }
    }

    /// The verified access token's claims (`Value::Null` without any).
    pub fn claims(&self) -> &Arc<Value> {
        &self.claims
    }

    /// The bearer token the client presented (verified, unless
    /// authentication is off): only for an application that must present it
    /// on and is configured to.
    pub fn bearer_token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The front decided `decision` on `method`'s use of `target`.
    pub(crate) fn decide(&mut self, method: &str, target: Target<'_>, decision: Decision) {
        let decided = Decided { method: method.to_owned(), kind: target.kind(), name: target.name().to_owned(), decision };
        self.decided = Some(Arc::new(decided));
    }

    /// The front's decision on `method`'s use of `target`, if it made one.
    pub(crate) fn decision_on(&self, method: &str, target: Target<'_>) -> Option<&Decision> {
        let decided = self.decided.as_deref()?;
        (decided.method == method && decided.kind == target.kind() && decided.name == target.name()).then_some(&decided.decision)
    }
}

impl std::fmt::Debug for Authorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorized")
            .field("claims", &self.claims)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("decided", &self.decided.as_ref().map(|d| (&d.method, &d.name)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fronts_decision_holds_only_for_the_use_it_was_made_on_and_the_token_never_shows() {
        let mut authorized = Authorized::verified("s3cret", Arc::new(serde_json::json!({"sub": "alice"})));
        let allowed = Decision::Allow { rules: vec!["tools".into()] };
        authorized.decide("tools/call", Target::Tool("echo"), allowed.clone());
        assert_eq!(authorized.decision_on("tools/call", Target::Tool("echo")), Some(&allowed));
        assert_eq!(authorized.decision_on("tools/call", Target::Tool("other")), None, "another tool is decided again");
        assert_eq!(authorized.decision_on("prompts/get", Target::Prompt("echo")), None, "another kind is decided again");
        assert_eq!(authorized.bearer_token(), Some("s3cret"));
        assert_eq!(authorized.claims()["sub"], "alice");
        assert!(!format!("{authorized:?}").contains("s3cret"), "Debug shows no token");
        assert_eq!(Authorized::default().decision_on("tools/call", Target::Tool("echo")), None);
    }
}
