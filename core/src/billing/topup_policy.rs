//! Auto top-up's settings and its monthly cap: read by the account's row, the service that
//! saves them and the task that charges the card.

use chrono::Utc;
use entities::billing_account;

use crate::domain::Cents;

/// Auto top-up's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoTopupSettings {
    pub enabled: bool,
    pub threshold: Option<Cents>,
    pub amount: Option<Cents>,
    /// The most its charges may come to in a UTC month (none: no cap).
    pub monthly_limit: Option<Cents>,
}

/// The first instant of `at`'s UTC month.
pub fn month_start(at: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
    use chrono::Datelike;
    at.date_naive()
        .with_day(1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(at, |d| d.and_utc())
}

/// Whether auto top-up may charge `amount` more this month under its cap.
pub fn under_cap(account: &billing_account::Model, charged: Cents, amount: Cents) -> bool {
    account
        .auto_topup_monthly_limit_cents
        .is_none_or(|limit| charged.get() + amount.get() <= limit.get())
}
