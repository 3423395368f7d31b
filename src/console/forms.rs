//! What a console form carries: its fields (parsed and held to the JSON API's bounds for the
//! same body) and the outcome shown once on the next page.

use actix_web::cookie::Cookie;
use actix_web::HttpRequest;

use crate::error::ApiError;
use keel_core::domain::OrgId;

/// The outcome of a form, shown once on the next page.
#[derive(Debug, Clone)]
pub struct Flash {
    pub ok: bool,
    pub message: String,
}

pub(crate) const FLASH_COOKIE: &str = "keel_flash";

impl Flash {
    pub(crate) fn read(req: &HttpRequest) -> Option<Self> {
        let cookie = req.cookie(FLASH_COOKIE)?;
        let raw = hex::decode(cookie.value()).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (kind, message) = text.split_once(':')?;
        Some(Self {
            ok: kind == "ok",
            message: message.chars().take(500).collect(),
        })
    }

    pub(crate) fn cookie(&self) -> Cookie<'static> {
        let kind = if self.ok { "ok" } else { "error" };
        let message: String = self.message.chars().take(500).collect();
        let mut cookie = Cookie::new(FLASH_COOKIE, hex::encode(format!("{kind}:{message}")));
        cookie.set_path("/console");
        cookie.set_http_only(true);
        cookie.set_same_site(actix_web::cookie::SameSite::Strict);
        cookie
    }

    pub(crate) fn cleared() -> Cookie<'static> {
        let mut cookie = Cookie::new(FLASH_COOKIE, "");
        cookie.set_path("/console");
        cookie.make_removal();
        cookie
    }
}

/// A submitted console form: its CSRF token, and its other fields, which parse and validate
/// as the JSON API's body for the same action (the same bounds, the same messages).
pub struct FormFields {
    pub(crate) csrf: String,
    pub(crate) fields: Vec<(String, String)>,
}

impl FormFields {
    pub(crate) fn parse(body: &[u8]) -> Self {
        let mut csrf = String::new();
        let mut fields = Vec::new();
        for (name, value) in form_urlencoded::parse(body) {
            match name.as_ref() {
                "csrf" => csrf = value.into_owned(),
                _ if value.trim().is_empty() => {}
                _ => fields.push((name.into_owned(), value.into_owned())),
            }
        }
        Self { csrf, fields }
    }

    /// Every value of a repeated field.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }

    /// A field as a JSON number for an API body, or as the text it is (for that body's own
    /// 422) when it is not one; `None` when absent.
    pub(crate) fn number(&self, name: &str) -> Option<serde_json::Value> {
        self.get(name).map(|text| {
            text.trim()
                .parse::<i64>()
                .map_or_else(|_| serde_json::Value::from(text), serde_json::Value::from)
        })
    }

    /// The form carries the confirmation its destructive action asks for first.
    pub(crate) fn confirmed(&self) -> bool {
        self.get("confirmed") == Some("yes")
    }

    /// Its fields but the confirmation, as a confirmation page carries them on.
    pub(crate) fn carried(&self) -> Vec<(String, String)> {
        self.fields
            .iter()
            .filter(|(name, _)| name != "confirmed")
            .cloned()
            .collect()
    }

    /// The fields as the API's body `T` of organization `org_id`.
    pub(crate) fn body<
        T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema,
    >(
        &self,
        org_id: &OrgId,
    ) -> Result<T, ApiError> {
        self.parse_as(Some(org_id.as_str()))
    }

    /// The fields as the API's body `T`, which names no organization.
    pub(crate) fn plain_body<
        T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema,
    >(
        &self,
    ) -> Result<T, ApiError> {
        self.parse_as(None)
    }

    pub(crate) fn parse_as<
        T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema,
    >(
        &self,
        org_id: Option<&str>,
    ) -> Result<T, ApiError> {
        let mut fields: Vec<(String, String)> = Vec::new();
        if let Some(org_id) = org_id {
            fields.push(("orgId".into(), org_id.to_owned()));
        }
        fields.extend(self.fields.iter().cloned());
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in &fields {
            query.append_pair(name, value);
        }
        let parsed: T = crate::http::extract::parse_query(&query.finish())?;
        // Held to the body's bounds, as the JSON API holds the same body.
        let value = crate::http::schemas::form_value(&T::name(), &fields);
        let issues = crate::http::schemas::bound_issues("query", &T::name(), &value);
        if issues.is_empty() {
            Ok(parsed)
        } else {
            Err(ApiError::Validation(issues))
        }
    }
}
