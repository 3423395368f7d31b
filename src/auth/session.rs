//! Session tokens: HS256 JWTs whose `sub` is a user id; `exp` is always checked.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: i64,
    pub iat: i64,
}

#[derive(Clone)]
pub struct SessionKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl SessionKeys {
    /// `None` when no secret is configured: sessions are then rejected.
    pub fn new(secret: &str) -> Option<Self> {
        if secret.is_empty() {
            return None;
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        Some(Self {
            encoding: EncodingKey::from_secret(secret.as_bytes()),
            decoding: DecodingKey::from_secret(secret.as_bytes()),
            validation,
        })
    }

    pub fn issue(&self, user_id: &str, ttl_secs: i64) -> anyhow::Result<String> {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: user_id.to_owned(),
            iat: now,
            exp: now + ttl_secs,
        };
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &self.encoding,
        )?)
    }

    /// The user id of a valid, unexpired token.
    pub fn verify(&self, token: &str) -> Option<String> {
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .ok()
            .map(|data| data.claims.sub)
            .filter(|sub| !sub.is_empty())
    }
}

/// Whether a token has the shape of a JWT (three base64url parts).
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_verify_and_expired_ones_do_not() {
        let keys = SessionKeys::new("secret").expect("configured");
        let token = keys.issue("user-1", 60).expect("issues");
        assert_eq!(keys.verify(&token).as_deref(), Some("user-1"));
        let expired = keys.issue("user-1", -10).expect("issues");
        assert_eq!(keys.verify(&expired), None);
        let other = SessionKeys::new("other").expect("configured");
        assert_eq!(other.verify(&token), None);
        assert!(SessionKeys::new("").is_none());
    }
}
