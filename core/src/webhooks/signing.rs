//! Standard Webhooks signatures (the spec Svix and OpenAI use), made by its reference
//! implementation (the `standardwebhooks` crate): `webhook-signature: v1,<base64
//! HMAC-SHA256 over "{id}.{timestamp}.{body}">`, keyed by the secret's decoded bytes. During
//! a rotation the old and the new secret both sign: two signatures, space-separated, either
//! of which a receiver accepts.

use base64::Engine as _;
use rand::RngCore;

/// An endpoint secret's prefix, as Standard Webhooks writes them.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new endpoint secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// Why a delivery could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    /// A stored secret that is not `whsec_` and base64 (never shown: it is a secret).
    #[error("an endpoint secret is not valid base64")]
    BadSecret,
    /// Standard Webhooks signs text: the body must be UTF-8 (keel's JSON always is).
    #[error("the body to sign is not UTF-8")]
    BadBody,
}

/// The `webhook-signature` header's value for `body` sent as message `id` at `timestamp`
/// (Unix seconds), one `v1,` signature per secret, in the order given.
pub fn signature_header(
    secrets: &[&str],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SigningError> {
    let mut signatures = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let webhook = standardwebhooks::Webhook::new(secret).map_err(|_| SigningError::BadSecret)?;
        let signature = webhook
            .sign(id, timestamp, body)
            .map_err(|_| SigningError::BadBody)?;
        signatures.push(signature);
    }
    Ok(signatures.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's own example (its test suites use it).
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: i64 = 1614265330;
    const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn signs_the_specifications_example_as_it_does() {
        let header = signature_header(&[SPEC_SECRET], SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY.as_bytes()).unwrap();
        assert_eq!(header, SPEC_SIGNATURE);
    }

    #[test]
    fn a_rotation_signs_with_both_secrets_and_a_receiver_of_either_verifies() {
        let (old, new) = (new_secret(), new_secret());
        let header = signature_header(&[&new, &old], "msg_1", 1_700_000_000, b"{}").unwrap();
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
        for secret in [&old, &new] {
            let alone = signature_header(&[secret], "msg_1", 1_700_000_000, b"{}").unwrap();
            assert!(parts.contains(&alone.as_str()));
        }
    }

    #[test]
    fn new_secrets_are_32_random_bytes_after_the_prefix() {
        let secret = new_secret();
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.strip_prefix(SECRET_PREFIX).unwrap())
            .unwrap();
        assert_eq!(key.len(), 32);
        assert_ne!(new_secret(), secret);
        assert!(matches!(
            signature_header(&["whsec_not base64!"], "m", 1, b"{}"),
            Err(SigningError::BadSecret)
        ));
    }
}
