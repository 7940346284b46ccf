//! The server key: 32 random bytes, created once in the store and shared by
//! every replica and restart. Resume tokens and operation tokens are sealed
//! with it (HMAC-SHA256), under different labels.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tether_store::{Store, StoreError, now_ms};

const KEY_NAMESPACE: &str = "server";
const KEY_NAME: &str = "resume-key";

#[derive(Default)]
pub(crate) struct ServerKey {
    key: tokio::sync::OnceCell<[u8; 32]>,
}

impl ServerKey {
    /// Reads the key from the store, or creates it there (first writer wins).
    pub async fn get(&self, store: &dyn Store) -> Result<[u8; 32], StoreError> {
        self.key
            .get_or_try_init(|| async {
                for _ in 0..3 {
                    if let Some(v) = store.kv_get(KEY_NAMESPACE, KEY_NAME, now_ms()).await? {
                        return v.value.as_ref().try_into().map_err(|_| StoreError::Corrupt("server key".into()));
                    }
                    let fresh: [u8; 32] = rand::random();
                    let created = store
                        .kv_compare_and_set(KEY_NAMESPACE, KEY_NAME, None, bytes::Bytes::copy_from_slice(&fresh), None)
                        .await?;
                    if created.is_some() {
                        return Ok(fresh);
                    }
                }
                Err(StoreError::Backend("could not settle the server key".into()))
            })
            .await
            .copied()
    }
}

/// First 16 bytes of HMAC-SHA256(key, label ‖ parts…).
pub fn tag(key: &[u8; 32], label: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    // HMAC accepts keys of any length, so this cannot fail.
    let Ok(mut m) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else { return [0u8; 16] };
    m.update(label);
    for p in parts {
        m.update(p);
    }
    let full = m.finalize().into_bytes();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Constant-time comparison of two tags.
pub fn same_tag(a: &[u8], b: &[u8]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(a, b))
}
