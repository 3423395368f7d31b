//! The console's signed, expiring cookie: what it names (an API key's id, a session's user
//! and organization, or the operator) and the keys that sign it. Never the credential itself.

use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::domain::{ApiKeyId, OrgId, UserId};

/// Who a console cookie is for (never accepted as a bearer token: another audience and key).
const AUDIENCE: &str = "keel-console";

/// What a console session stands for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Standing {
    /// An API key, by id: acts as a member of the key's organization.
    Key { key_id: ApiKeyId, org_id: OrgId },
    /// A user's session, in one of the user's organizations (`None` until one is picked).
    User { user_id: UserId, org_id: Option<OrgId> },
    /// An operator internal key, by a keyed digest: reads every organization.
    Operator { fingerprint: String },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    #[serde(flatten)]
    pub standing: Standing,
    /// The session's row (`console_sessions`): the cookie holds only while it is there.
    pub sid: String,
    /// The per-session token every state-changing form carries.
    pub csrf: String,
    aud: String,
    iat: i64,
    pub exp: i64,
}

/// Signs and verifies console cookies (HS256).
#[derive(Clone)]
pub struct CookieKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    /// Keyed with the cookies' key: fingerprints an operator's internal key.
    fingerprints: Hmac<Sha256>,
    pub ttl_secs: i64,
}

impl CookieKeys {
    /// Keys derived from `secret` (so they differ from the session tokens' own), or random
    /// ones for this process when it is empty: console logins then end at restart.
    /// (HMAC takes a key of any length: the error cannot happen with SHA-256, but is passed
    /// on rather than assumed away.)
    pub fn new(secret: &str, ttl_secs: i64) -> Result<Self, hmac::digest::InvalidLength> {
        let mac: [u8; 32] = if secret.is_empty() {
            let mut key = [0u8; 32];
            rand::rng().fill_bytes(&mut key);
            key
        } else {
            let mut derive = Hmac::<Sha256>::new_from_slice(secret.as_bytes())?;
            derive.update(b"keel console cookie v1");
            derive.finalize().into_bytes().into()
        };
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "aud"]);
        validation.set_audience(&[AUDIENCE]);
        validation.leeway = 0;
        Ok(Self {
            encoding: EncodingKey::from_secret(&mac),
            decoding: DecodingKey::from_secret(&mac),
            validation,
            fingerprints: Hmac::<Sha256>::new_from_slice(&mac)?,
            ttl_secs,
        })
    }

    /// The operator fingerprint of an internal key's digest.
    pub fn fingerprint(&self, digest: &[u8; 32]) -> String {
        let mut mac = self.fingerprints.clone();
        mac.update(b"operator:");
        mac.update(digest);
        hex::encode(mac.finalize().into_bytes())
    }

    pub fn sign(
        &self,
        standing: Standing,
        sid: String,
        expires: i64,
        csrf: Option<String>,
    ) -> Result<(String, String), jsonwebtoken::errors::Error> {
        let now = chrono::Utc::now().timestamp();
        let csrf = csrf.unwrap_or_else(|| {
            let mut csrf = [0u8; 16];
            rand::rng().fill_bytes(&mut csrf);
            hex::encode(csrf)
        });
        let claims = Claims {
            standing,
            sid,
            csrf: csrf.clone(),
            aud: AUDIENCE.into(),
            iat: now,
            exp: expires.min(now + self.ttl_secs),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)?;
        Ok((token, csrf))
    }

    pub fn verify(&self, token: &str) -> Option<Claims> {
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .ok()
            .map(|data| data.claims)
    }
}
