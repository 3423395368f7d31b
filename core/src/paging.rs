//! Keyset paging: a list walked newest first is resumed after the last row a page gave,
//! `(created_at, id)`, exact to the nanosecond. The cursor is opaque to clients and written
//! `<seconds>-<nanoseconds>-<uuid without dashes>`, so every string of that pattern (the
//! schema's) is a position to walk from.

use chrono::{DateTime, Utc};

/// Where a walk stands: the last row it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyset {
    pub at: DateTime<Utc>,
    /// The row's UUID id, hyphenated as ids are stored.
    pub id: String,
}

impl Keyset {
    /// The schema's pattern of a cursor.
    pub const PATTERN: &'static str = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$";

    pub fn new(at: DateTime<Utc>, id: impl Into<String>) -> Self {
        Self { at, id: id.into() }
    }

    pub fn encode(&self) -> String {
        let id = self.id.replace('-', "");
        format!(
            "{}-{:09}-{id}",
            self.at.timestamp(),
            self.at.timestamp_subsec_nanos()
        )
    }

    /// A cursor [`Keyset::encode`] wrote (any string of [`Keyset::PATTERN`]); `None` else.
    pub fn decode(raw: &str) -> Option<Self> {
        let mut parts = raw.splitn(3, '-');
        let (secs, nanos, id) = (parts.next()?, parts.next()?, parts.next()?);
        let digits =
            |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(secs, 12) || nanos.len() != 9 || !digits(nanos, 9) || id.len() != 32 {
            return None;
        }
        if !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let at = DateTime::from_timestamp(secs.parse().ok()?, nanos.parse().ok()?)?;
        let id = uuid::Uuid::try_parse(id).ok()?.hyphenated().to_string();
        Some(Self { at, id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written_and_nothing_else_reads() {
        let at = DateTime::from_timestamp(1_764_000_000, 123_456_789).unwrap();
        let keyset = Keyset::new(at, "0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11");
        let written = keyset.encode();
        assert_eq!(written, "1764000000-123456789-0b6f5f0e4c1a4a449d5c2f1c3e0a7b11");
        assert_eq!(Keyset::decode(&written), Some(keyset));
        for bad in [
            "",
            "1-2-3",
            "1764000000-12345678-0b6f5f0e4c1a4a449d5c2f1c3e0a7b11",
            "x-123456789-0b6f5f0e4c1a4a449d5c2f1c3e0a7b11",
            "1764000000-123456789-0B6F5F0E4C1A4A449D5C2F1C3E0A7B11",
        ] {
            assert_eq!(Keyset::decode(bad), None, "{bad}");
        }
    }
}
