//! The limits an API key may have.

/// Which limit refused a call (the `limit` label of `keel_proxy_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    RequestsPerMinute,
    TokensPerDay,
    ConcurrentStreams,
}

impl LimitKind {
    pub const ALL: [Self; 3] = [
        Self::RequestsPerMinute,
        Self::TokensPerDay,
        Self::ConcurrentStreams,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestsPerMinute => "requests_per_minute",
            Self::TokensPerDay => "tokens_per_day",
            Self::ConcurrentStreams => "concurrent_streams",
        }
    }
}
