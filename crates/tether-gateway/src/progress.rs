//! [`Progress`]: a client's `progressToken` never goes upstream as it is.
//! Each request gets a token of tether's own ([`Progress::issue`], random),
//! and what the upstream sends under it reaches the client under the
//! client's token again. A progress notification under any other token is
//! not this session's (an upstream that mixed its streams up): it is
//! dropped and counted, never relayed.

use serde_json::Value;
use tether_wire::PeerMessage;

/// A request's progress token upstream, and the client's it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub issued: Value,
    pub client: Value,
}

impl Progress {
    /// Puts a token of tether's own in place of the client's in `params`
    /// (`_meta.progressToken`), if the client gave one.
    pub(crate) fn issue(params: Option<&mut serde_json::Map<String, Value>>) -> Option<Self> {
        let token = params?.get_mut("_meta")?.get_mut("progressToken")?;
        let issued = Value::String(format!("tether-{}", hex::encode(rand::random::<[u8; 12]>())));
        let client = std::mem::replace(token, issued.clone());
        Some(Self { issued, client })
    }

    /// `message` as the client must see it: the issued token back to the
    /// client's. `Err` (the message handed back) if it carries a progress
    /// token that is not the issued one: it belongs to no request of ours.
    pub(crate) fn translate(this: Option<&Self>, mut message: PeerMessage) -> Result<PeerMessage, PeerMessage> {
        let Some(token) = message_params(&mut message).and_then(|p| p.get_mut("progressToken")) else {
            return Ok(message);
        };
        match this.filter(|p| &p.issued == token) {
            Some(progress) => {
                *token = progress.client.clone();
                Ok(message)
            }
            None => Err(message),
        }
    }
}

fn message_params(message: &mut PeerMessage) -> Option<&mut Value> {
    match message {
        PeerMessage::Notification { params, .. } | PeerMessage::Request { params, .. } => params.as_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_progress_token_of_our_own_goes_upstream_and_only_it_comes_back_as_the_clients() {
        let mut params = json!({"name": "slow", "_meta": {"progressToken": 7}});
        let progress = Progress::issue(params.as_object_mut()).expect("the client gave a token");
        assert_eq!(progress.client, json!(7));
        assert_eq!(params["_meta"]["progressToken"], progress.issued, "upstream sees tether's token");
        let again = Progress::issue(json!({"_meta": {"progressToken": 7}}).as_object_mut()).unwrap();
        assert_ne!(again.issued, progress.issued, "every request gets its own");
        assert!(Progress::issue(json!({"name": "x"}).as_object_mut()).is_none());

        let ours = PeerMessage::Notification {
            method: "notifications/progress".into(),
            params: Some(json!({"progressToken": progress.issued.clone(), "progress": 1})),
        };
        let seen = Progress::translate(Some(&progress), ours).expect("ours");
        assert_eq!(
            seen,
            PeerMessage::Notification {
                method: "notifications/progress".into(),
                params: Some(json!({"progressToken": 7, "progress": 1}))
            }
        );
        // Another request's token (even the client's own value) is foreign.
        for token in [again.issued.clone(), json!(7)] {
            let foreign = PeerMessage::Notification {
                method: "notifications/progress".into(),
                params: Some(json!({"progressToken": token, "progress": 1})),
            };
            assert!(Progress::translate(Some(&progress), foreign.clone()).is_err());
            assert!(Progress::translate(None, foreign).is_err());
        }
        // A message without a token passes as it is.
        let log = PeerMessage::Notification { method: "notifications/message".into(), params: Some(json!({"data": "x"})) };
        assert_eq!(Progress::translate(Some(&progress), log.clone()), Ok(log));
    }
}
