//! Session tokens: HS256 JWTs whose `sub` is a user id. `sub` and `exp` are required and
//! `exp` is checked exactly; `nbf` and `iat`, when present, may not lie in the future by
//! more than [`CLOCK_SKEW_SECS`].

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::domain::UserId;

/// How far another clock may run ahead of ours for `nbf` and `iat`.
pub const CLOCK_SKEW_SECS: i64 = 30;

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
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
            iat: Some(now),
            nbf: None,
            exp: now + ttl_secs,
        };
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &self.encoding,
        )?)
    }

    /// When a valid token expires (Unix seconds).
    pub fn expiry(&self, token: &str) -> Option<i64> {
        self.verify(token)?;
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .ok()
            .map(|data| data.claims.exp)
    }

    /// The user id of a valid, unexpired token that is already valid.
    pub fn verify(&self, token: &str) -> Option<UserId> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .ok()?
            .claims;
        let latest = chrono::Utc::now().timestamp() + CLOCK_SKEW_SECS;
        let in_future = |at: Option<i64>| at.is_some_and(|at| at > latest);
        if in_future(claims.nbf) || in_future(claims.iat) {
            return None;
        }
        UserId::parse(&claims.sub).ok()
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
        assert_eq!(keys.verify(&token).as_ref().map(UserId::as_str), Some("user-1"));
        let expired = keys.issue("user-1", -10).expect("issues");
        assert_eq!(keys.verify(&expired), None);
        let other = SessionKeys::new("other").expect("configured");
        assert_eq!(other.verify(&token), None);
        assert!(SessionKeys::new("").is_none());
    }

    fn signed(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"secret"),
        )
        .expect("encodes")
    }

    #[test]
    fn sub_and_exp_suffice_and_nbf_and_iat_may_not_lie_ahead() {
        let keys = SessionKeys::new("secret").expect("configured");
        let now = chrono::Utc::now().timestamp();
        let exp = now + 600;
        let verify = |claims| keys.verify(&signed(claims));
        assert_eq!(
            verify(serde_json::json!({"sub": "u", "exp": exp}))
                .as_ref()
                .map(UserId::as_str),
            Some("u")
        );
        assert_eq!(verify(serde_json::json!({"exp": exp})), None);
        assert_eq!(verify(serde_json::json!({"sub": "u"})), None);
        assert_eq!(
            verify(serde_json::json!({"sub": "u", "exp": exp, "nbf": now + 500})),
            None
        );
        assert_eq!(
            verify(serde_json::json!({"sub": "u", "exp": exp, "iat": now + 500})),
            None
        );
        // Within the clock skew, and in the past, both pass.
        assert!(
            verify(serde_json::json!({"sub": "u", "exp": exp, "nbf": now + 20, "iat": now + 20})).is_some()
        );
        assert!(
            verify(serde_json::json!({"sub": "u", "exp": exp, "nbf": now - 60, "iat": now - 60})).is_some()
        );
    }
}
