//! `Stripe-Signature` verification: `t=<unix>,v1=<hex HMAC-SHA256 of "t.body">` (several
//! `v1` values allowed, for secret rotation), 300 s tolerance, constant-time comparison.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const TOLERANCE_SECS: i64 = 300;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no webhook secret is configured")]
    NotConfigured,
    #[error("missing or malformed Stripe-Signature header")]
    Malformed,
    #[error("signature timestamp outside the tolerance")]
    Stale,
    #[error("signature does not match")]
    Mismatch,
}

pub fn verify(secret: &str, header: Option<&str>, body: &[u8], now: i64) -> Result<(), SignatureError> {
    if secret.is_empty() {
        return Err(SignatureError::NotConfigured);
    }
    let header = header.ok_or(SignatureError::Malformed)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", sig)) => {
                if let Ok(bytes) = hex::decode(sig) {
                    signatures.push(bytes);
                }
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if (now - timestamp).abs() > TOLERANCE_SECS {
        return Err(SignatureError::Stale);
    }
    let matches = signatures.iter().any(|signature| {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
            return false;
        };
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.verify_slice(signature).is_ok()
    });
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The header value for a payload (used by tests and local tooling).
pub fn sign(secret: &str, body: &[u8], timestamp: i64) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_payload_verifies_within_the_tolerance_only() {
        let body = br#"{"id":"evt_1"}"#;
        let header = sign("whsec", body, 1_000);
        assert_eq!(verify("whsec", Some(&header), body, 1_100), Ok(()));
        assert_eq!(
            verify("whsec", Some(&header), body, 1_000 + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify("other", Some(&header), body, 1_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("whsec", Some(&header), b"{}", 1_000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(verify("whsec", None, body, 1_000), Err(SignatureError::Malformed));
        assert_eq!(
            verify("", Some(&header), body, 1_000),
            Err(SignatureError::NotConfigured)
        );
    }

    #[test]
    fn any_of_several_v1_signatures_may_match() {
        let body = b"payload";
        let good = sign("whsec", body, 50);
        let sig = good.split("v1=").nth(1).unwrap_or_default();
        let header = format!("t=50,v1={},v1={sig}", "00".repeat(32));
        assert_eq!(verify("whsec", Some(&header), body, 50), Ok(()));
    }
}
