//! How the console writes money, times and sizes.

use chrono::{DateTime, Utc};

use keel_core::domain::Microcents;

/// Dollars and cents, floored to the cent as balances are: `$1,234.56`, `-$0.05`.
pub fn dollars(amount: Microcents) -> String {
    let cents = amount.floor_cents().0;
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    let whole = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}${grouped}.{:02}", cents % 100)
}

/// Whole cents as dollars.
pub fn cents(amount: i64) -> String {
    dollars(Microcents(amount.saturating_mul(1_000_000)))
}

/// The exact amount, for a title on hover: `123456789 microcents`.
pub fn exact(amount: Microcents) -> String {
    format!("{} microcents", amount.0)
}

pub fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub fn opt_time(at: Option<DateTime<Utc>>) -> String {
    at.map(time).unwrap_or_else(|| "—".into())
}

/// A duration as people read it: `42 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub fn age(d: chrono::Duration) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

/// A stored JSON text, indented; the text as it is when it is not JSON.
pub fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned())
}

/// At most `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_group_thousands_and_floor_to_the_cent() {
        assert_eq!(dollars(Microcents(0)), "$0.00");
        assert_eq!(dollars(Microcents(123_456_789_999)), "$1,234.56");
        assert_eq!(dollars(Microcents(100_000_000_000)), "$1,000.00");
        assert_eq!(dollars(Microcents(-5_000_000)), "-$0.05");
        assert_eq!(cents(2500), "$25.00");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(chrono::Duration::seconds(42)), "42 s");
        assert_eq!(age(chrono::Duration::seconds(185)), "3 min 5 s");
        assert_eq!(age(chrono::Duration::seconds(7800)), "2 h 10 min");
        assert_eq!(clip("abcdef", 3), "abc…");
        assert_eq!(clip("abc", 3), "abc");
    }
}

/// A count with thousands separators (`100,000`).
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod count_tests {
    #[test]
    fn counts_have_thousands_separators() {
        assert_eq!(super::count(0), "0");
        assert_eq!(super::count(999), "999");
        assert_eq!(super::count(100_000), "100,000");
        assert_eq!(super::count(-1_234_567), "-1,234,567");
    }
}
