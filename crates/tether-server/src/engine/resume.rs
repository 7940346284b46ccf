//! The session resume handshake (the "broker" side of the stdio seed).
//!
//! Every `initialize` result carries `_meta["dev.tether/sessionResumeToken"]`.
//! A later `initialize` that presents it gets the same durable session back
//! and a new token; the old one is spent (rotation: the session's
//! `resume_generation` moves on, so every older token of that session stops
//! working too).
//!
//! A token is `tt1_` + hex(16 random bytes ‖ first 16 bytes of
//! HMAC-SHA256(server key, id)). It reveals nothing: the session, principal
//! and generation live in a store record keyed by the random part. The server
//! key is generated once and kept in the store, so every replica and every
//! restart verifies the same tokens (see `keys`).

use serde::{Deserialize, Serialize};
use tether_store::{Store, StoreError, now_ms};

use super::keys::{same_tag, tag};

const TOKEN_NAMESPACE: &str = "resume-token";
const TOKEN_PREFIX: &str = "tt1_";
/// Spent and unspent token records are forgotten after this long.
const TOKEN_RECORD_TTL_MS: i64 = 7 * 24 * 3600 * 1000;

/// Why a presented token does not resume anything (one word, for `_meta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a token this server sealed (bad format or MAC).
    Tampered,
    /// Sealed by us but no record (never issued here, or forgotten).
    Unknown,
    /// Already exchanged for a newer token.
    Used,
    /// Its session expired or was deleted.
    Expired,
    /// Issued to another principal.
    Foreign,
}

impl Refusal {
    /// Why, in a word, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Tampered => "tampered",
            Refusal::Unknown => "unknown",
            Refusal::Used => "used",
            Refusal::Expired => "expired",
            Refusal::Foreign => "foreign",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct TokenRecord {
    session: String,
    principal: String,
    generation: u64,
    used: bool,
}

/// A token that was valid and is now spent.
pub(crate) struct Redeemed {
    pub session: String,
    pub generation: u64,
}

#[derive(Default)]
pub(crate) struct ResumeTokens;

fn mac(key: &[u8; 32], id: &[u8]) -> [u8; 16] {
    tag(key, b"tether-resume-v1", &[id])
}

/// The random part of a token if it carries our MAC.
pub fn open_token(key: &[u8; 32], token: &str) -> Option<[u8; 16]> {
    let raw = hex::decode(token.strip_prefix(TOKEN_PREFIX)?).ok()?;
    if raw.len() != 32 {
        return None;
    }
    let (id, presented) = raw.split_at(16);
    let expected = mac(key, id);
    if !same_tag(&expected, presented) {
        return None;
    }
    id.try_into().ok()
}

/// The resume token of stream `id`, sealed with `key`.
pub fn seal_token(key: &[u8; 32], id: &[u8; 16]) -> String {
    format!("{TOKEN_PREFIX}{}{}", hex::encode(id), hex::encode(mac(key, id)))
}

fn encode(record: &TokenRecord) -> Result<bytes::Bytes, StoreError> {
    serde_json::to_vec(record).map(Into::into).map_err(|e| StoreError::Backend(e.to_string()))
}

impl ResumeTokens {
    /// A new token for `session` at `generation`.
    pub async fn issue(
        &self,
        store: &dyn Store,
        key: &[u8; 32],
        session: &str,
        principal: &str,
        generation: u64,
    ) -> Result<String, StoreError> {
        let id: [u8; 16] = rand::random();
        let record = TokenRecord { session: session.to_owned(), principal: principal.to_owned(), generation, used: false };
        store
            .kv_compare_and_set(TOKEN_NAMESPACE, &hex::encode(id), None, encode(&record)?, Some(now_ms() + TOKEN_RECORD_TTL_MS))
            .await?
            .ok_or_else(|| StoreError::Conflict("resume token id collision".into()))?;
        Ok(seal_token(key, &id))
    }

    /// Checks a token without spending it: what [`ResumeTokens::spend`] takes
    /// (the caller may refuse it first, leaving it usable).
    pub async fn open(
        &self,
        store: &dyn Store,
        key: &[u8; 32],
        token: &str,
        principal: &str,
    ) -> Result<Result<Opened, Refusal>, StoreError> {
        let Some(id) = open_token(key, token) else { return Ok(Err(Refusal::Tampered)) };
        let name = hex::encode(id);
        let Some(stored) = store.kv_get(TOKEN_NAMESPACE, &name, now_ms()).await? else {
            return Ok(Err(Refusal::Unknown));
        };
        let Ok(record) = serde_json::from_slice::<TokenRecord>(&stored.value) else {
            return Ok(Err(Refusal::Unknown));
        };
        if record.principal != principal {
            return Ok(Err(Refusal::Foreign));
        }
        if record.used {
            return Ok(Err(Refusal::Used));
        }
        Ok(Ok(Opened { name, revision: stored.revision, expires_at_ms: stored.expires_at_ms, record }))
    }

    /// Spends an opened token: once, whoever presents it at the same moment.
    pub async fn spend(&self, store: &dyn Store, opened: Opened) -> Result<Result<Redeemed, Refusal>, StoreError> {
        let Opened { name, revision, expires_at_ms, mut record } = opened;
        record.used = true;
        let spent = store.kv_compare_and_set(TOKEN_NAMESPACE, &name, Some(revision), encode(&record)?, expires_at_ms).await?;
        if spent.is_none() {
            // Somebody presented it at the same moment and won.
            return Ok(Err(Refusal::Used));
        }
        Ok(Ok(Redeemed { session: record.session, generation: record.generation }))
    }
}

/// A token checked but not spent yet.
pub(crate) struct Opened {
    name: String,
    revision: u64,
    expires_at_ms: Option<i64>,
    record: TokenRecord,
}

impl Opened {
    /// The session the token is for.
    pub fn session(&self) -> &str {
        &self.record.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl ResumeTokens {
        /// Opens and spends, as a resume does when the endpoint matches.
        async fn redeem(
            &self,
            store: &dyn Store,
            key: &[u8; 32],
            token: &str,
            principal: &str,
        ) -> Result<Result<Redeemed, Refusal>, StoreError> {
            match self.open(store, key, token, principal).await? {
                Ok(opened) => self.spend(store, opened).await,
                Err(refusal) => Ok(Err(refusal)),
            }
        }
    }

    #[test]
    fn sealed_tokens_open_and_every_bit_flip_is_refused() {
        let key = [7u8; 32];
        let id = [42u8; 16];
        let token = seal_token(&key, &id);
        assert_eq!(open_token(&key, &token), Some(id));
        assert_eq!(open_token(&[8u8; 32], &token), None, "another server's key");
        let bytes = token.as_bytes();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.to_vec();
                flipped[i] ^= 1 << bit;
                let Ok(s) = String::from_utf8(flipped) else { continue };
                if s.eq_ignore_ascii_case(&token) {
                    continue; // hex is case-insensitive: same token
                }
                assert_eq!(open_token(&key, &s), None, "flip of bit {bit} in byte {i} accepted");
            }
        }
        assert_eq!(open_token(&key, ""), None);
        assert_eq!(open_token(&key, &token[..token.len() - 2]), None);
    }

    #[tokio::test]
    async fn a_sealed_token_without_its_record_is_unknown_and_each_token_spends_once() {
        let store = tether_store::memory::MemoryStore::new(tether_store::StoreConfig::default());
        let key = [5u8; 32];
        let tokens = ResumeTokens;
        let token = tokens.issue(&store, &key, "s1", "alice", 0).await.unwrap();
        let id = hex::encode(open_token(&key, &token).unwrap());
        assert!(matches!(tokens.redeem(&store, &key, &token, "bob").await.unwrap(), Err(Refusal::Foreign)));
        let redeemed = tokens.redeem(&store, &key, &token, "alice").await.unwrap().map_err(|r| r.as_str()).unwrap();
        assert_eq!((redeemed.session.as_str(), redeemed.generation), ("s1", 0));
        assert!(matches!(tokens.redeem(&store, &key, &token, "alice").await.unwrap(), Err(Refusal::Used)));
        // Sealed by this server, but its record is gone (forgotten after its TTL).
        store.kv_delete(TOKEN_NAMESPACE, &id).await.unwrap();
        assert!(matches!(tokens.redeem(&store, &key, &token, "alice").await.unwrap(), Err(Refusal::Unknown)));
    }

    #[test]
    fn tokens_reveal_nothing_readable() {
        let token = seal_token(&[1u8; 32], &[2u8; 16]);
        assert!(token.starts_with(TOKEN_PREFIX));
        assert!(token[TOKEN_PREFIX.len()..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
