//! A project's traces filter as the console carries it: in a list's address, in the forms
//! that act on "every trace the filter keeps", and on a trace's page for its previous and
//! next. One reading, one set of messages for all three.

use keel_core::traces::TraceFilter;

use super::ConsoleError;

/// The filter's fields as typed: `model`, `status` (`ok`, `error`), `q` (the search box),
/// `tag`, `since` and `until` (days, both included), `minScore` (`NAME:VALUE`).
#[derive(Default, Clone)]
pub struct TraceFilters {
    pub model: Option<String>,
    pub status: Option<String>,
    pub q: Option<String>,
    pub tag: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub min_score: Option<String>,
}

/// The names the filter's fields travel under.
pub const NAMES: [&str; 7] = ["model", "status", "q", "tag", "since", "until", "minScore"];

/// A day typed in a date input (`YYYY-MM-DD`), as its first instant (UTC).
fn day_start(raw: Option<&str>, name: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, ConsoleError> {
    match raw {
        None => Ok(None),
        Some(day) => chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|d| Some(d.and_utc()))
            .ok_or_else(|| super::unreadable(name)),
    }
}

impl TraceFilters {
    /// Reads the fields `get` finds (empty ones are absent); unknown values are a 400 page.
    pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<(Self, TraceFilter), ConsoleError> {
        let field = |name: &str| {
            get(name)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let filters = TraceFilters {
            model: field("model"),
            status: field("status"),
            q: field("q"),
            tag: field("tag"),
            since: field("since"),
            until: field("until"),
            min_score: field("minScore"),
        };
        if let Some(s) = filters.status.as_deref().filter(|s| *s != "ok" && *s != "error") {
            return Err(super::unknown_choice("status", s, ["ok", "error"].into_iter()));
        }
        if filters
            .tag
            .as_deref()
            .is_some_and(|t| !keel_core::traces::marks::is_name(t))
        {
            return Err(super::unreadable("tag"));
        }
        let min_score = match filters.min_score.as_deref() {
            None => None,
            Some(raw) => Some(
                crate::traces::dto::min_score(raw)
                    .ok_or_else(|| super::unreadable("\"minScore\" (NAME:VALUE)"))?,
            ),
        };
        let since = day_start(filters.since.as_deref(), "since")?;
        // `until` is a day included: the filter stops at the next day's start.
        let until = day_start(filters.until.as_deref(), "until")?.map(|d| d + chrono::Duration::days(1));
        let filter = TraceFilter {
            model: filters.model.clone(),
            ok: filters.status.as_deref().map(|s| s == "ok"),
            since,
            until,
            tag: filters.tag.clone(),
            min_score,
            search: filters
                .q
                .as_deref()
                .map(keel_core::traces::search::Query::parse)
                .filter(|q| !q.is_empty()),
            ..TraceFilter::default()
        };
        Ok((filters, filter))
    }

    /// The fields set, as `(name, value)` pairs.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        NAMES
            .into_iter()
            .zip([
                &self.model,
                &self.status,
                &self.q,
                &self.tag,
                &self.since,
                &self.until,
                &self.min_score,
            ])
            .filter_map(|(name, value)| value.clone().map(|v| (name, v)))
            .collect()
    }

    /// The fields set as a query string (empty when none is).
    pub fn query(&self) -> String {
        let mut link = form_urlencoded::Serializer::new(String::new());
        for (name, value) in self.pairs() {
            link.append_pair(name, &value);
        }
        link.finish()
    }
}
