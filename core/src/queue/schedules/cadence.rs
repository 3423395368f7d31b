//! A schedule's ticks: a cron expression read on an IANA zone's wall clock. croner parses
//! the expression and walks the clock; a daylight-saving change neither skips nor doubles a
//! tick (OCPS: a fixed time in the hour that is skipped runs at the hour's end, one in the
//! hour that repeats runs once, at its first pass; an interval such as `0 * * * *` keeps
//! ticking each real hour).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Characters a cron expression has at most.
pub const MAX_CRON_LEN: usize = 200;

/// The shape of an expression [`Cadence::parse`] reads, as the documents state it: a
/// nickname, or five or six fields of digits, names, `*`, `?`, `,`, `-`, `/`, `#`, `L`, `W`
/// (one space or more between them). What the fields mean (a range that runs upwards, a value
/// in its field's bounds, some time that matches) the parse checks.
pub const CRON_PATTERN: &str =
    "^(@(yearly|annually|monthly|weekly|daily|hourly)|[0-9A-Za-z*?,/#-]+( +[0-9A-Za-z*?,/#-]+){4,5})$";

/// The shape of an IANA zone name, as the documents state it (`UTC`, `Europe/Berlin`,
/// `America/Argentina/Buenos_Aires`, `Etc/GMT+1`): whether this build's database has it the
/// parse checks. (A list of the names would be exact, but generated clients make an enum of
/// it whose members collide: `Etc/GMT+0` and `Etc/GMT-0`.)
pub const ZONE_PATTERN: &str = "^[A-Z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$";

/// The IANA zone names [`Cadence::parse`] knows (this build's time zone database).
pub fn zone_names() -> impl Iterator<Item = &'static str> {
    chrono_tz::TZ_VARIANTS.iter().map(|zone| zone.name())
}

/// `at` on `zone`'s wall clock with the zone's abbreviation (`2026-12-04 02:30 CET`), as
/// the console shows a tick; `None` for a zone this build does not know.
pub fn on_clock(at: DateTime<Utc>, zone: &str) -> Option<String> {
    let zone = chrono_tz::Tz::from_str(zone).ok()?;
    Some(at.with_timezone(&zone).format("%Y-%m-%d %H:%M %Z").to_string())
}

/// Why a cron expression or a zone cannot make ticks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CadenceError {
    /// The expression does not parse (the parser's reason).
    #[error("not a cron expression: {0}")]
    Cron(String),
    /// It parses but no time matches it (say `0 0 30 2 *`).
    #[error("this cron expression never matches a time")]
    NeverMatches,
    #[error("not an IANA time zone name (such as UTC or Europe/Berlin)")]
    Timezone,
}

impl CadenceError {
    /// The body field at fault: `cron` or `timezone`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Cron(_) | Self::NeverMatches => "cron",
            Self::Timezone => "timezone",
        }
    }
}

/// A cron expression in a zone.
#[derive(Debug, Clone)]
pub struct Cadence {
    cron: Cron,
    zone: chrono_tz::Tz,
}

impl Cadence {
    /// Five fields (minute hour day-of-month month day-of-week), six with seconds first, or a
    /// nickname (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`); ranges, steps and
    /// lists in each field. A year field is refused.
    pub fn parse(cron: &str, timezone: &str) -> Result<Self, CadenceError> {
        let zone = chrono_tz::Tz::from_str(timezone).map_err(|_| CadenceError::Timezone)?;
        if cron.len() > MAX_CRON_LEN || cron.trim().is_empty() {
            return Err(CadenceError::Cron(format!(
                "it must have 1 to {MAX_CRON_LEN} characters"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| CadenceError::Cron(e.to_string()))?;
        let cadence = Self { cron, zone };
        cadence.next_after(Utc::now()).ok_or(CadenceError::NeverMatches)?;
        Ok(cadence)
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|next| next.with_timezone(&Utc))
    }

    /// The last tick strictly before `t`.
    pub fn last_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_previous_occurrence(&local, false)
            .ok()
            .map(|previous| previous.with_timezone(&Utc))
    }

    /// The `n` ticks after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::with_capacity(n);
        let mut at = t;
        while ticks.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    ticks.push(next);
                    at = next;
                }
                None => break,
            }
        }
        ticks
    }
}

/// Which ticks one pass enqueues for a schedule whose next tick is `next_run_at`, at `now`:
/// every tick from `next_run_at` up to `now` within `grace` of `now` is on time; older ones
/// were missed while no instance ran, and of those only the latest is enqueued, and only
/// with `catch_up_latest`. At most `max` ticks; answers the ticks and the schedule's next
/// tick after them (a tick still due when `max` was reached comes at the next pass).
pub fn due_ticks(
    cadence: &Cadence,
    next_run_at: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: chrono::Duration,
    catch_up_latest: bool,
    max: usize,
) -> DueTicks {
    let cutoff = now - grace;
    let mut ticks = Vec::new();
    let mut missed = 0;
    let mut catch_up = false;
    let mut at = Some(next_run_at);
    if next_run_at < cutoff {
        let last_missed = cadence
            .last_before(cutoff)
            .filter(|t| *t >= next_run_at)
            .unwrap_or(next_run_at);
        missed = 1;
        if catch_up_latest {
            ticks.push(last_missed);
            catch_up = true;
        }
        at = cadence.next_after(last_missed);
        // How many were missed, for the log (bounded: a per-second schedule down for a day).
        let mut t = Some(next_run_at);
        while let Some(tick) = t.filter(|t| *t < last_missed && missed < 10_000) {
            missed += 1;
            t = cadence.next_after(tick);
        }
    }
    while let Some(tick) = at.filter(|t| *t <= now && ticks.len() < max) {
        ticks.push(tick);
        at = cadence.next_after(tick);
    }
    DueTicks {
        ticks,
        missed,
        catch_up,
        next: at,
    }
}

/// What [`due_ticks`] answers.
#[derive(Debug, PartialEq, Eq)]
pub struct DueTicks {
    /// The ticks to enqueue, oldest first.
    pub ticks: Vec<DateTime<Utc>>,
    /// Ticks missed while no instance ran (at most 10,000 counted).
    pub missed: usize,
    /// The first of `ticks` is the latest missed one (`catchUp: "latest"`).
    pub catch_up: bool,
    /// The schedule's next tick after these.
    pub next: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone};

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    fn ticks_between(cadence: &Cadence, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::new();
        let mut at = from;
        while let Some(next) = cadence.next_after(at).filter(|t| *t < to) {
            ticks.push(next);
            at = next;
        }
        ticks
    }

    #[test]
    fn a_daily_tick_in_berlin_runs_once_on_each_day_a_clock_changes() {
        let cadence = Cadence::parse("30 2 * * *", "Europe/Berlin").unwrap();
        // Spring forward, 2026-03-29: 02:00 CET becomes 03:00 CEST, so 02:30 never happens;
        // the tick comes once, at 03:00 CEST (01:00 UTC).
        let spring = ticks_between(&cadence, utc(2026, 3, 27, 12, 0, 0), utc(2026, 3, 30, 12, 0, 0));
        assert_eq!(
            spring,
            vec![
                utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
                utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST: the skipped hour's end
                utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
            ]
        );
        // Fall back, 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 happens twice; the
        // tick comes once, at the first (CEST).
        let fall = ticks_between(&cadence, utc(2026, 10, 23, 12, 0, 0), utc(2026, 10, 26, 12, 0, 0));
        assert_eq!(
            fall,
            vec![
                utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
                utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST, the first of the two
                utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
            ]
        );
    }

    #[test]
    fn an_hourly_tick_in_berlin_keeps_each_real_hour_through_both_changes() {
        let cadence = Cadence::parse("@hourly", "Europe/Berlin").unwrap();
        for (day_start, day_end, hours) in [
            // 2026-03-29 in Berlin: 23 hours long.
            (utc(2026, 3, 28, 23, 0, 0), utc(2026, 3, 29, 22, 0, 0), 23),
            // 2026-10-25 in Berlin: 25 hours long.
            (utc(2026, 10, 24, 22, 0, 0), utc(2026, 10, 25, 23, 0, 0), 25),
        ] {
            let ticks = ticks_between(&cadence, day_start - Duration::seconds(1), day_end);
            assert_eq!(ticks.len(), hours, "{ticks:?}");
            assert_eq!(ticks[0], day_start);
            for pair in ticks.windows(2) {
                assert_eq!(pair[1] - pair[0], Duration::hours(1), "{pair:?}");
            }
        }
    }

    #[test]
    fn expressions_take_five_or_six_fields_and_nicknames() {
        let at = utc(2026, 12, 3, 10, 0, 0);
        let next = |cron: &str| Cadence::parse(cron, "UTC").unwrap().next_after(at).unwrap();
        assert_eq!(next("*/15 * * * *"), utc(2026, 12, 3, 10, 15, 0));
        assert_eq!(next("0 9-17/4 * * MON-FRI"), utc(2026, 12, 3, 13, 0, 0));
        assert_eq!(next("5,10 10 * * *"), utc(2026, 12, 3, 10, 5, 0));
        assert_eq!(next("*/10 * * * * *"), utc(2026, 12, 3, 10, 0, 10));
        assert_eq!(next("@hourly"), utc(2026, 12, 3, 11, 0, 0));
        assert_eq!(next("@daily"), utc(2026, 12, 4, 0, 0, 0));
        for bad in [
            "",
            "* * * *",
            "0 0 * * * * 2027",
            "61 * * * *",
            "* * * * mon-",
            "nonsense",
            "0 0 30 2 *",
        ] {
            assert_eq!(Cadence::parse(bad, "UTC").unwrap_err().field(), "cron", "{bad:?}");
        }
        for zone in ["Mars/Olympus", "utc ", ""] {
            assert_eq!(
                Cadence::parse("@daily", zone).unwrap_err(),
                CadenceError::Timezone
            );
        }
        assert!(Cadence::parse("@daily", "America/New_York").is_ok());
    }

    #[test]
    fn the_documented_shape_takes_every_kind_of_expression_and_the_parse_knows_every_zone_named() {
        let shape = regex::Regex::new(CRON_PATTERN).unwrap();
        for good in [
            "*/15 9-17 * * MON-FRI",
            "0 0 * * *",
            "*/10 * * * * *",
            "@hourly",
            "@daily",
            "5,10  10 L * ?",
            "0 0 * * 5#2",
        ] {
            assert!(shape.is_match(good), "{good}");
        }
        for bad in [
            "",
            " 0 0 * * *",
            "0 0 * * * ",
            "* * * *",
            "0 0 * * * * *",
            "@every 5m",
            "0 0 * * *\n",
            "a",
        ] {
            assert!(!shape.is_match(bad), "{bad}");
        }
        let tick = Utc.with_ymd_and_hms(2026, 12, 4, 1, 30, 0).unwrap();
        assert_eq!(
            on_clock(tick, "Europe/Berlin").as_deref(),
            Some("2026-12-04 02:30 CET")
        );
        let zones: Vec<&str> = zone_names().collect();
        assert!(zones.len() > 400 && zones.contains(&"Europe/Berlin") && zones.contains(&"UTC"));
        let zone_shape = regex::Regex::new(ZONE_PATTERN).unwrap();
        for zone in zones {
            assert!(zone.len() <= 64 && zone_shape.is_match(zone), "{zone}");
            assert!(Cadence::parse("@daily", zone).is_ok(), "{zone}");
        }
        for bad in [
            "",
            "a",
            "utc",
            " UTC",
            "Europe/",
            "Europe//Berlin",
            "Europe/Berlin/A/B",
        ] {
            assert!(!zone_shape.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn missed_ticks_enqueue_only_the_latest_and_only_when_asked() {
        let cadence = Cadence::parse("0 * * * *", "UTC").unwrap();
        let grace = Duration::seconds(60);
        let now = utc(2026, 12, 3, 10, 0, 30);
        // On time: the 10:00 tick, 30 s late.
        let due = due_ticks(&cadence, utc(2026, 12, 3, 10, 0, 0), now, grace, false, 100);
        assert_eq!(due.ticks, vec![utc(2026, 12, 3, 10, 0, 0)]);
        assert_eq!((due.missed, due.next), (0, Some(utc(2026, 12, 3, 11, 0, 0))));
        // Down from 06:30: 07:00, 08:00 and 09:00 were missed, 10:00 is on time.
        let first = utc(2026, 12, 3, 7, 0, 0);
        let none = due_ticks(&cadence, first, now, grace, false, 100);
        assert_eq!(none.ticks, vec![utc(2026, 12, 3, 10, 0, 0)]);
        assert_eq!(none.missed, 3);
        let latest = due_ticks(&cadence, first, now, grace, true, 100);
        assert_eq!(
            latest.ticks,
            vec![utc(2026, 12, 3, 9, 0, 0), utc(2026, 12, 3, 10, 0, 0)]
        );
        assert!(latest.catch_up && !none.catch_up);
        // Down past 10:01: every tick was missed; "latest" makes only 10:00.
        let later = utc(2026, 12, 3, 10, 5, 0);
        assert!(due_ticks(&cadence, first, later, grace, false, 100)
            .ticks
            .is_empty());
        let latest = due_ticks(&cadence, first, later, grace, true, 100);
        assert_eq!(latest.ticks, vec![utc(2026, 12, 3, 10, 0, 0)]);
        assert_eq!(
            (latest.missed, latest.next),
            (4, Some(utc(2026, 12, 3, 11, 0, 0)))
        );
        // A per-second schedule a few seconds behind enqueues each second, up to `max`.
        let seconds = Cadence::parse("* * * * * *", "UTC").unwrap();
        let due = due_ticks(&seconds, now - Duration::seconds(4), now, grace, false, 3);
        assert_eq!(due.ticks.len(), 3);
        assert_eq!(due.next, Some(now - Duration::seconds(1)));
    }
}
