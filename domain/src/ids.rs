//! Identifiers.

use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize};

/// An organization id as keel stores and compares it: a UUID in its canonical spelling
/// (lowercase, hyphenated), any other text trimmed and lowercased. The one place an
/// organization id is normalized.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct OrgId(String);

impl OrgId {
    pub fn parse(raw: &str) -> Self {
        let trimmed = raw.trim();
        match uuid::Uuid::try_parse(trimmed) {
            Ok(id) => Self(id.hyphenated().to_string()),
            Err(_) => Self(trimmed.to_ascii_lowercase()),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Whether `raw`, parsed, is this organization.
    pub fn is(&self, raw: &str) -> bool {
        Self::parse(raw) == *self
    }
}

impl Deref for OrgId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for OrgId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OrgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<OrgId> for String {
    fn from(id: OrgId) -> Self {
        id.0
    }
}

/// A stored id (already canonical) against a parsed one.
impl PartialEq<String> for OrgId {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<OrgId> for String {
    fn eq(&self, other: &OrgId) -> bool {
        *self == other.0
    }
}

impl PartialEq<str> for OrgId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl<'de> Deserialize<'de> for OrgId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::parse(&raw))
    }
}

/// An id keel gives out as a UUID: its canonical spelling (lowercase, hyphenated) when the
/// text is one, else the text as sent (validation then refuses it where a UUID is required).
fn canonical_uuid(raw: &str) -> String {
    uuid::Uuid::parse_str(raw).map_or_else(|_| raw.to_owned(), |u| u.hyphenated().to_string())
}

/// An id carried as text, normalized by `$normalize` wherever it is read.
macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $normalize:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn parse(raw: &str) -> Self {
                let normalize: fn(&str) -> String = $normalize;
                Self(normalize(raw))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
                Ok(Self::parse(&raw))
            }
        }
    };
}

text_id!(
    /// A project id (a UUID keel gave out), in its canonical spelling.
    ProjectId,
    canonical_uuid
);

text_id!(
    /// A training job id (a UUID keel gave out), in its canonical spelling.
    JobId,
    canonical_uuid
);

text_id!(
    /// An API key's id (a UUID keel gave out), in its canonical spelling.
    ApiKeyId,
    canonical_uuid
);

text_id!(
    /// A recorded trace's id (a UUID keel gave out), in its canonical spelling.
    TraceId,
    canonical_uuid
);

text_id!(
    /// A training run id as its caller named it (1..128 characters of any text): compared
    /// and keyed exactly as sent.
    RunId,
    str::to_owned
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn organization_ids_have_one_spelling() {
        let canonical = "3f2c0a1e-4b5d-4c6e-8f90-a1b2c3d4e5f6";
        for spelling in [
            canonical,
            "3F2C0A1E-4B5D-4C6E-8F90-A1B2C3D4E5F6",
            " 3f2c0a1e-4b5d-4c6e-8f90-a1b2c3d4e5f6\n",
            "3f2c0a1e4b5d4c6e8f90a1b2c3d4e5f6",
            "{3f2c0a1e-4b5d-4c6e-8f90-a1b2c3d4e5f6}",
        ] {
            assert_eq!(OrgId::parse(spelling).as_str(), canonical, "{spelling:?}");
            assert!(OrgId::parse(canonical).is(spelling));
        }
        assert_eq!(OrgId::parse("  Acme-Legacy ").as_str(), "acme-legacy");
        let from_json: OrgId = serde_json::from_str("\" ABC \"").unwrap();
        assert_eq!(from_json.as_str(), "abc");
        assert_eq!(serde_json::to_string(&from_json).unwrap(), "\"abc\"");
    }

    #[test]
    fn uuid_ids_have_one_spelling_and_run_ids_are_kept_as_sent() {
        let canonical = "3f2c0a1e-4b5d-4c6e-8f90-a1b2c3d4e5f6";
        assert_eq!(
            ProjectId::parse("3F2C0A1E4B5D4C6E8F90A1B2C3D4E5F6").as_str(),
            canonical
        );
        assert_eq!(
            JobId::parse("3F2C0A1E-4B5D-4C6E-8F90-A1B2C3D4E5F6"),
            canonical.to_owned()
        );
        // Not a UUID: left as sent, for validation to refuse.
        assert_eq!(ProjectId::parse(" nope ").as_str(), " nope ");
        let run: RunId = serde_json::from_str("\" Run-1 \"").unwrap();
        assert_eq!(run.as_str(), " Run-1 ");
    }
}
