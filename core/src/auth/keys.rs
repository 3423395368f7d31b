//! User API keys and operator internal keys.

use rand::distr::{Alphanumeric, SampleString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub const API_KEY_PREFIX: &str = "keel_sk_";
const API_KEY_RANDOM_CHARS: usize = 40;
/// Characters of a key kept for display (`keel_sk_` and four more).
const DISPLAY_PREFIX_CHARS: usize = 12;

/// A freshly minted API key: the secret is shown once, only the hash is stored.
pub struct NewApiKey {
    pub secret: String,
    pub hash: String,
    pub prefix: String,
}

pub fn mint_api_key() -> NewApiKey {
    let secret = format!(
        "{API_KEY_PREFIX}{}",
        Alphanumeric.sample_string(&mut rand::rng(), API_KEY_RANDOM_CHARS)
    );
    NewApiKey {
        hash: hash_api_key(&secret),
        prefix: secret.chars().take(DISPLAY_PREFIX_CHARS).collect(),
        secret,
    }
}

pub fn hash_api_key(secret: &str) -> String {
    hex::encode(api_key_digest(secret))
}

/// The SHA-256 of a key: [`hash_api_key`] before its hex encoding (which costs more than the
/// hash itself), for in-memory look-ups.
pub fn api_key_digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether a token has the shape of a user API key (`keel_sk_` + 32 or more base62).
pub fn looks_like_api_key(token: &str) -> bool {
    token
        .strip_prefix(API_KEY_PREFIX)
        .is_some_and(|rest| rest.len() >= 32 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The configured internal keys, kept as digests so every comparison takes the same time
/// whatever the lengths involved.
#[derive(Clone, Default)]
pub struct InternalKeys {
    digests: Vec<[u8; 32]>,
}

impl InternalKeys {
    pub fn new(keys: &[String]) -> Self {
        Self {
            digests: keys.iter().map(|k| Sha256::digest(k.as_bytes()).into()).collect(),
        }
    }

    /// The SHA-256 digest of each configured key (never the keys themselves).
    pub fn digests(&self) -> &[[u8; 32]] {
        &self.digests
    }

    pub fn matches(&self, token: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare against every key without stopping early.
        self.digests
            .iter()
            .fold(subtle::Choice::from(0), |found, key| found | key.ct_eq(&digest))
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_have_the_contract_shape_and_a_stable_hash() {
        let key = mint_api_key();
        assert!(looks_like_api_key(&key.secret));
        assert_eq!(key.hash, hash_api_key(&key.secret));
        assert!(key.secret.starts_with(&key.prefix));
        assert_ne!(mint_api_key().secret, key.secret);
    }

    #[test]
    fn internal_keys_match_any_configured_key_only() {
        let keys = InternalKeys::new(&["old".into(), "new".into()]);
        assert!(keys.matches("old"));
        assert!(keys.matches("new"));
        assert!(!keys.matches("ne"));
        assert!(!InternalKeys::default().matches(""));
    }
}
