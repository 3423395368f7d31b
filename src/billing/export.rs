//! The ledger as CSV, streamed (the API's `ledger.csv` and the console's download).

use actix_web::web::Bytes;
use actix_web::HttpResponse;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;

use keel_core::domain::OrgId;

/// Every entry of the organization created in `[from, to)`, oldest first: RFC 4180 with a
/// header row, amounts in cents with six decimals; read and sent 1,000 entries at a time.
pub fn ledger_csv(
    billing: &keel_core::billing::Billing,
    org_id: OrgId,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
) -> HttpResponse {
    let pages = keel_core::billing::statement::entries(billing, org_id, from, to);
    let header = futures_util::stream::once(async { Ok(csv_rows(&[], true)) });
    let body = header.chain(pages.map(|page| match page {
        Ok(page) => Ok(csv_rows(&page, false)),
        Err(err) => {
            // The status is sent: the body ends short, and the log says why.
            tracing::error!(error = %err, "ledger export failed");
            Err(actix_web::error::ErrorInternalServerError("ledger export failed"))
        }
    }));
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            actix_web::http::header::CONTENT_DISPOSITION,
            "attachment; filename=\"ledger.csv\"",
        ))
        .streaming(body)
}

/// Microcents as cents with six decimals: `-12.345678`.
fn cents_exact(microcents: i64) -> String {
    let sign = if microcents < 0 { "-" } else { "" };
    let abs = microcents.unsigned_abs();
    format!("{sign}{}.{:06}", abs / 1_000_000, abs % 1_000_000)
}

/// A text cell as a spreadsheet cannot read it as a formula (OWASP's CSV injection advice): a
/// cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'`.
/// Numbers are written by keel and stay numbers.
fn text_cell(text: &str) -> std::borrow::Cow<'_, str> {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => std::borrow::Cow::Owned(format!("'{text}")),
        _ => std::borrow::Cow::Borrowed(text),
    }
}

/// A page of entries as CSV rows (RFC 4180, by the `csv` crate), with the header first.
fn csv_rows(entries: &[entities::ledger_entry::Model], header: bool) -> Bytes {
    let mut writer = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::with_capacity(entries.len() * 96));
    let mut row = |fields: [&str; 7]| {
        // Writing to a Vec cannot fail.
        let _ = writer.write_record(fields);
    };
    if header {
        row([
            "id",
            "created_at",
            "kind",
            "amount_cents",
            "balance_after_cents",
            "reason",
            "idempotency_key",
        ]);
    }
    for e in entries {
        let (id, at) = (
            e.id.to_string(),
            e.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        );
        let (amount, after) = (
            cents_exact(e.amount_microcents.get()),
            cents_exact(e.balance_after_microcents.get()),
        );
        row([
            &id,
            &at,
            e.kind.as_str(),
            &amount,
            &after,
            &text_cell(&e.reason),
            &text_cell(e.idempotency_key.as_deref().unwrap_or("")),
        ]);
    }
    Bytes::from(writer.into_inner().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    fn formula_like_text_is_quoted_and_everything_else_kept() {
        for (text, cell) in [
            ("=HYPERLINK(\"http://evil\")", "'=HYPERLINK(\"http://evil\")"),
            ("+1", "'+1"),
            ("-2+3", "'-2+3"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("\rx", "'\rx"),
            ("run fee, tracer job 1", "run fee, tracer job 1"),
            ("", ""),
        ] {
            assert_eq!(super::text_cell(text), cell);
        }
    }

    #[test]
    fn cents_keep_every_microcent() {
        assert_eq!(super::cents_exact(-12_345_678), "-12.345678");
        assert_eq!(super::cents_exact(5), "0.000005");
        assert_eq!(super::cents_exact(0), "0.000000");
        assert_eq!(super::cents_exact(1_000_000), "1.000000");
    }
}
