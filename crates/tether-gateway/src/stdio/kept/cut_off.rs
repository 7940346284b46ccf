//! The calls an earlier engine left running on a kept child (see
//! [`super`]): found by the tags the keeper kept for their request lines,
//! their answers and progress parked (frames unacknowledged) until this
//! engine's recovery claims each ([`KeptChild::resume`]), at most
//! [`CLAIM_WAIT`]; at most [`PARKED_PER_CALL`] messages parked per call.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tether_wire::{RpcError, envelope};
use tokio::sync::{mpsc, oneshot};

use super::{FrameHold, KeptChild};
use crate::progress::Progress;
use crate::stdio::{self, Answer, Shared};
use crate::upstream::{CutOffCall, PeerMessage, UpstreamError, UpstreamResult};

/// How long a call cut off by a crash waits for the new engine to claim it.
pub const CLAIM_WAIT: Duration = Duration::from_secs(60);
/// Messages of one cut-off call parked until it is claimed, at most.
pub const PARKED_PER_CALL: usize = 256;

impl KeptChild {
    pub(crate) fn cut_off_call(&self, key: &str) -> Option<CutOffCall> {
        let cut_off = self.cut_off.lock();
        let call = cut_off.calls.values().find(|c| c.tag.key == key)?;
        let progress = match (&call.tag.issued, &call.tag.client) {
            (Some(issued), Some(client)) => Some(Progress { issued: issued.clone(), client: client.clone() }),
            _ => None,
        };
        Some(CutOffCall { id: json!(call.tag.id), progress })
    }

    /// Picks up the answer of a call cut off by a crash (see the module
    /// doc); its messages go to `messages`, in order, first those parked.
    pub(crate) async fn resume(
        &self,
        request_id: &Value,
        messages: mpsc::Sender<PeerMessage>,
        wait: Duration,
        shared: &Shared,
    ) -> UpstreamResult {
        let Some(id) = stdio::our_id(request_id) else { return Err(UpstreamError::Restarted) };
        let (tx, rx) = oneshot::channel();
        let mut tx = Some(tx);
        loop {
            let (parked, answer) = {
                let mut cut_off = self.cut_off.lock();
                let Some(call) = cut_off.calls.get_mut(&id) else {
                    return Err(UpstreamError::Restarted);
                };
                if call.parked.is_empty() {
                    match call.answer.take() {
                        Some(answer) => (Vec::new(), Some(answer)),
                        None => {
                            call.claim = Some(Claim { messages: messages.clone(), answer: tx.take() });
                            (Vec::new(), None)
                        }
                    }
                } else {
                    (call.parked.drain(..).collect(), None)
                }
            };
            for (message, hold) in parked {
                let _ = messages.send(message).await;
                drop(hold);
            }
            if let Some((answer, hold)) = answer {
                self.forget_call(id);
                drop(hold);
                return answer;
            }
            if tx.is_none() {
                break;
            }
        }
        let answer = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(UpstreamError::Restarted),
            Err(_) => Err(RpcError::internal(format!(
                "upstream {} did not answer a call cut off by an engine restart within {} (its request_timeout)",
                shared.upstream,
                humantime::format_duration(wait)
            ))
            .into()),
        };
        self.forget_call(id);
        answer
    }

    fn forget_call(&self, id: u64) {
        let call = self.cut_off.lock().calls.remove(&id);
        if let Some(call) = call {
            self.done(Bytes::from(call.tag.to_json().to_string()));
        }
    }

    /// Takes a frame that belongs to a cut-off call (true), else leaves it
    /// to the usual dispatch (false).
    /// Whether calls cut off by a crash wait to be claimed.
    pub(super) fn has_cut_offs(&self) -> bool {
        !self.cut_off.lock().calls.is_empty()
    }

    pub(super) async fn route_cut_off(&self, frame: u64, line: &[u8]) -> bool {
        if self.cut_off.lock().calls.is_empty() {
            return false;
        }
        self.expire_unclaimed();
        let Ok(message) = envelope::parse_message(line) else { return false };
        let (id, delivery) = {
            let mut cut_off = self.cut_off.lock();
            match PeerMessage::from_inbound(message) {
                Err((id, outcome)) => {
                    let Some(n) = stdio::our_id(&id) else { return false };
                    let Some(call) = cut_off.calls.get_mut(&n) else { return false };
                    let answer: Answer = match outcome {
                        Ok(result) => {
                            serde_json::value::to_raw_value(&result).map_err(|e| RpcError::internal(e.to_string()).into())
                        }
                        Err(error) => Err(RpcError::from_object(&error).into()),
                    };
                    let hold = self.frames.hold(frame);
                    match call.claim.as_mut().and_then(|c| c.answer.take()) {
                        Some(tx) => {
                            let _ = tx.send(answer);
                            drop(hold);
                        }
                        None => call.answer = Some((answer, hold)),
                    }
                    return true;
                }
                Ok(message) => {
                    let Some(id) = cut_off.owner(&message) else { return false };
                    (id, message)
                }
            }
        };
        let hold = self.frames.hold(frame);
        let claimed = {
            let mut cut_off = self.cut_off.lock();
            let Some(call) = cut_off.calls.get_mut(&id) else { return false };
            match &call.claim {
                Some(claim) => Some(claim.messages.clone()),
                None => {
                    if call.parked.len() >= PARKED_PER_CALL {
                        tracing::warn!(
                            child = self.child,
                            "too many messages of a cut-off call before it was claimed; dropping the oldest"
                        );
                        call.parked.pop_front();
                    }
                    call.parked.push_back((delivery.clone(), hold.clone()));
                    None
                }
            }
        };
        if let Some(messages) = claimed {
            let _ = messages.send(delivery).await;
        }
        drop(hold);
        true
    }

    /// Calls nobody claimed within [`CLAIM_WAIT`] of the attach are let go.
    fn expire_unclaimed(&self) {
        let expired: Vec<CutOffCallState> = {
            let mut cut_off = self.cut_off.lock();
            if cut_off.since.elapsed() < CLAIM_WAIT {
                return;
            }
            let ids: Vec<u64> = cut_off.calls.iter().filter(|(_, c)| c.claim.is_none()).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| cut_off.calls.remove(&id)).collect()
        };
        for call in expired {
            tracing::info!(child = self.child, "no request claimed a call cut off by the engine restart; letting it go");
            self.done(Bytes::from(call.tag.to_json().to_string()));
        }
    }
}

/// What a request's line says of it (see the module doc).
pub(super) struct Tag {
    pub(super) key: String,
    pub(super) id: u64,
    pub(super) issued: Option<Value>,
    pub(super) client: Option<Value>,
}

impl Tag {
    pub(super) fn to_json(&self) -> Value {
        json!({"key": self.key, "id": self.id, "issued": self.issued, "client": self.client})
    }

    fn parse(tag: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(tag).ok()?;
        Some(Self {
            key: v.get("key")?.as_str()?.to_owned(),
            id: v.get("id")?.as_u64()?,
            issued: v.get("issued").filter(|t| !t.is_null()).cloned(),
            client: v.get("client").filter(|t| !t.is_null()).cloned(),
        })
    }
}

/// The calls an earlier engine left running on the child.
pub(super) struct CutOffs {
    since: Instant,
    pub(super) calls: HashMap<u64, CutOffCallState>,
}

pub(super) struct CutOffCallState {
    tag: Tag,
    answer: Option<(Answer, FrameHold)>,
    parked: VecDeque<(PeerMessage, FrameHold)>,
    claim: Option<Claim>,
}

struct Claim {
    messages: mpsc::Sender<PeerMessage>,
    answer: Option<oneshot::Sender<Answer>>,
}

impl CutOffs {
    pub(super) fn from_tags(open: &[Bytes]) -> Self {
        let calls = open
            .iter()
            .filter_map(|t| Tag::parse(t))
            .map(|tag| (tag.id, CutOffCallState { tag, answer: None, parked: VecDeque::new(), claim: None }))
            .collect();
        Self { since: Instant::now(), calls }
    }

    /// The cut-off call a message is about: by the progress token it was
    /// issued.
    fn owner(&self, message: &PeerMessage) -> Option<u64> {
        let params = match message {
            PeerMessage::Notification { params, .. } | PeerMessage::Request { params, .. } => params.as_ref()?,
        };
        let token = params.get("progressToken")?;
        self.calls.iter().find(|(_, c)| c.tag.issued.as_ref() == Some(token)).map(|(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_request_and_reads_back() {
        let tag = Tag { key: "s/r1".into(), id: 4_294_967_301, issued: Some(json!("tether-ab")), client: Some(json!(7)) };
        let read = Tag::parse(tag.to_json().to_string().as_bytes()).expect("a tag reads back");
        assert_eq!(
            (read.key.as_str(), read.id, read.issued, read.client),
            ("s/r1", 4_294_967_301, Some(json!("tether-ab")), Some(json!(7)))
        );
        assert!(Tag::parse(b"not json").is_none());
        let cut = CutOffs::from_tags(&[Bytes::from(tag.to_json().to_string()), Bytes::from_static(b"{}")]);
        assert_eq!(cut.calls.len(), 1, "an unreadable tag is skipped");
        let progress = PeerMessage::Notification {
            method: "notifications/progress".into(),
            params: Some(json!({"progressToken": "tether-ab", "progress": 1})),
        };
        assert_eq!(cut.owner(&progress), Some(4_294_967_301));
        let other = PeerMessage::Notification { method: "notifications/message".into(), params: Some(json!({"data": 1})) };
        assert_eq!(cut.owner(&other), None);
    }
}
