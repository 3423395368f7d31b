//! A month's statement (UTC): what the balance was, what came in and went out by kind, what
//! expired, and what it came to; and the ledger as pages for a CSV export of any length.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use entities::ledger_entry;
use futures_util::Stream;

use super::{repo, Billing, BillingError};
use crate::domain::{EntryKind, OrgId};

/// One UTC month's statement; amounts in microcents (credits, debits and expired positive).
/// `opening + Σ credits − Σ debits − expired = closing`, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// `YYYY-MM`.
    pub month: String,
    pub opening: i64,
    pub credits: BTreeMap<String, i64>,
    pub debits: BTreeMap<String, i64>,
    pub expired: i64,
    pub closing: i64,
}

impl Statement {
    /// From the balance before the month and the month's sums per (kind, whether a credit).
    pub fn from_sums(month: String, opening: i64, sums: &[(EntryKind, bool, i64)]) -> Self {
        let mut statement = Self {
            month,
            opening,
            credits: BTreeMap::new(),
            debits: BTreeMap::new(),
            expired: 0,
            closing: opening,
        };
        for (kind, credit, total) in sums {
            statement.closing += total;
            match (kind, credit) {
                (EntryKind::Expiry, _) => statement.expired -= total,
                (_, true) => *statement.credits.entry(kind.to_string()).or_default() += total,
                (_, false) => *statement.debits.entry(kind.to_string()).or_default() -= total,
            }
        }
        statement
    }
}

/// The first instant of `month` (`YYYY-MM`) and of the next one; none for a month that is
/// not one.
pub fn month_bounds(month: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (year, number) = month.split_once('-')?;
    if year.len() != 4 || number.len() != 2 {
        return None;
    }
    let first = NaiveDate::from_ymd_opt(year.parse().ok()?, number.parse().ok()?, 1)?;
    let next = match first.month() {
        12 => NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)?,
        m => NaiveDate::from_ymd_opt(first.year(), m + 1, 1)?,
    };
    let at = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default());
    Some((at(first), at(next)))
}

/// The organization's statement of `month` (`YYYY-MM`, checked by the caller).
pub async fn statement(billing: &Billing, org_id: &OrgId, month: &str) -> Result<Statement, BillingError> {
    super::service::account_of(billing, org_id).await?;
    let (from, to) = month_bounds(month).ok_or(BillingError::NotAMonth)?;
    let (opening, sums) = repo::month_sums(&billing.db, org_id, from, to).await?;
    Ok(Statement::from_sums(month.to_owned(), opening, &sums))
}

/// Entries read per page of an export.
const EXPORT_PAGE: u64 = 1_000;

/// Every entry of the organization created in `[from, to)` (either open), oldest first, as
/// pages of up to 1,000 read one after another: an export of any length in constant memory.
pub fn entries(
    billing: &Billing,
    org_id: OrgId,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
) -> impl Stream<Item = Result<Vec<ledger_entry::Model>, BillingError>> + 'static {
    let db = billing.db.clone();
    futures_util::stream::unfold(Some(None::<i64>), move |after| {
        let (db, org_id) = (db.clone(), org_id.clone());
        async move {
            let after = after?;
            match repo::ledger_after(&db, &org_id, after, from, to, EXPORT_PAGE).await {
                Ok(page) if page.is_empty() => None,
                Ok(page) => {
                    let next = (page.len() as u64 == EXPORT_PAGE).then(|| page.last().map(|e| e.id));
                    Some((Ok(page), next))
                }
                Err(err) => Some((Err(err.into()), None)),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn months_are_utc_and_the_next_one_follows() {
        let (from, to) = month_bounds("2026-12").unwrap();
        assert_eq!(from.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        for bad in [
            "2026-13",
            "2026-00",
            "26-01",
            "2026-1",
            "2026/01",
            "",
            "2026-01-01",
        ] {
            assert!(month_bounds(bad).is_none(), "{bad}");
        }
    }

    fn entry() -> impl Strategy<Value = (usize, i64, u8)> {
        (0_usize..EntryKind::ALL.len(), -5_000_000_i64..5_000_000, 0_u8..3)
    }

    proptest! {
        /// For any ledger spread over three months: each month's opening + credits − debits −
        /// expired is its closing, to the microcent, and is the sum of every entry before the
        /// month's end; the next month opens where it closed.
        #[test]
        fn a_statement_adds_up_exactly(entries in proptest::collection::vec(entry(), 0..80)) {
            let mut opening = 0_i64;
            for month in 0_u8..3 {
                let mut sums: BTreeMap<(usize, bool), i64> = BTreeMap::new();
                for (kind, amount, at) in &entries {
                    let kind_now = EntryKind::ALL[*kind];
                    // An expiry is only ever negative.
                    let amount = if kind_now == EntryKind::Expiry { -amount.abs() } else { *amount };
                    if *at == month && amount != 0 {
                        *sums.entry((*kind, amount > 0)).or_default() += amount;
                    }
                }
                let rows: Vec<(EntryKind, bool, i64)> =
                    sums.iter().map(|((k, c), t)| (EntryKind::ALL[*k], *c, *t)).collect();
                let s = Statement::from_sums(format!("m{month}"), opening, &rows);
                let credits: i64 = s.credits.values().sum();
                let debits: i64 = s.debits.values().sum();
                prop_assert_eq!(s.opening + credits - debits - s.expired, s.closing);
                prop_assert!(s.credits.values().all(|v| *v > 0) && s.debits.values().all(|v| *v > 0));
                prop_assert!(s.expired >= 0);
                let through: i64 = entries
                    .iter()
                    .filter(|(_, _, at)| *at <= month)
                    .map(|(k, a, _)| if EntryKind::ALL[*k] == EntryKind::Expiry { -a.abs() } else { *a })
                    .sum();
                prop_assert_eq!(s.closing, through);
                opening = s.closing;
            }
        }
    }
}
