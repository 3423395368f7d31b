//! Organization secrets (training workers' secrets, webhook endpoints' signing secrets): AES-256-GCM at rest, a random nonce per
//! value. The key is `secrets.encryption_key` (64 hex characters) or, when that is empty,
//! derived from the session secret; with neither, secrets cannot be stored (503).

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::domain::OrgId;

#[derive(Clone)]
pub struct SecretBox {
    cipher: Aes256Gcm,
}

impl SecretBox {
    pub fn from_settings(encryption_key_hex: &str, session_secret: &str) -> anyhow::Result<Option<Self>> {
        let key: [u8; 32] = if !encryption_key_hex.is_empty() {
            hex::decode(encryption_key_hex)
                .ok()
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
                .ok_or_else(|| anyhow::anyhow!("secrets.encryption_key must be 64 hex characters"))?
        } else if !session_secret.is_empty() {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(session_secret.as_bytes())
                .map_err(|e| anyhow::anyhow!("deriving the secrets key: {e}"))?;
            mac.update(b"keel org secrets v1");
            mac.finalize().into_bytes().into()
        } else {
            return Ok(None);
        };
        Ok(Some(Self {
            cipher: Aes256Gcm::new(&Key::<Aes256Gcm>::from(key)),
        }))
    }

    /// A box with a random key of this process's own (what it seals opens only here, until
    /// the process ends).
    pub fn ephemeral() -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self {
            cipher: Aes256Gcm::new(&Key::<Aes256Gcm>::from(key)),
        }
    }

    /// Encrypts `value`, binding it to its organization and name (so a sealed value
    /// moved to another row does not open).
    pub fn seal(&self, org_id: &OrgId, name: &str, value: &str) -> anyhow::Result<String> {
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let aad = format!("{org_id}/{name}");
        let sealed = self
            .cipher
            .encrypt(
                &Nonce::from(nonce),
                aes_gcm::aead::Payload {
                    msg: value.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| anyhow::anyhow!("encrypting a secret failed"))?;
        Ok(format!("{}{}", hex::encode(nonce), hex::encode(sealed)))
    }

    pub fn open(&self, org_id: &OrgId, name: &str, sealed: &str) -> anyhow::Result<String> {
        let bytes = hex::decode(sealed)?;
        if bytes.len() < 12 {
            anyhow::bail!("sealed secret too short");
        }
        let (nonce, ciphertext) = bytes.split_at(12);
        let nonce: [u8; 12] = nonce.try_into()?;
        let aad = format!("{org_id}/{name}");
        let plain = self
            .cipher
            .decrypt(
                &Nonce::from(nonce),
                aes_gcm::aead::Payload {
                    msg: ciphertext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| anyhow::anyhow!("a secret could not be decrypted (wrong key?)"))?;
        Ok(String::from_utf8(plain)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn org() -> OrgId {
        OrgId::parse("org").unwrap()
    }

    #[test]
    fn sealed_values_open_only_for_their_row_and_key() {
        let sb = SecretBox::from_settings("", "session").unwrap().unwrap();
        let sealed = sb.seal(&org(), "HF_TOKEN", "hf_abc").unwrap();
        assert!(!sealed.contains("hf_abc"));
        assert_eq!(sb.open(&org(), "HF_TOKEN", &sealed).unwrap(), "hf_abc");
        assert!(sb.open(&org(), "OTHER", &sealed).is_err());
        let other = SecretBox::from_settings(&"11".repeat(32), "").unwrap().unwrap();
        assert!(other.open(&org(), "HF_TOKEN", &sealed).is_err());
        assert!(SecretBox::from_settings("", "").unwrap().is_none());
        assert!(SecretBox::from_settings("zz", "").is_err());
    }
}
