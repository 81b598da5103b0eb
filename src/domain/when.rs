//! Dates a query names, and whether a memory happened within them
//! (date-aware matching).
//!
//! A question that names a date ("What did Maria donate on 7 July, 2023?",
//! "What happened to John's job in August 2023?") is answered by what
//! happened then, and a memory's `occurred_at` says when that was. Neither
//! leg sees it: the date is rarely in the memory's words, and an embedding
//! does not compare dates.
//!
//! Recognised, case ignored, English month names (or their three-letter
//! forms, and "Sept") with a four-digit year: a day ("7 July, 2023",
//! "July 7th 2023", "2023-07-07") is the window from the day before to the
//! day after (times of day and time zones differ between the writer and the
//! asker); a month without a day ("August 2023") is that month; a year after
//! "in", "during" or "of" ("in 2022") is that year. Words around the date
//! ("the week before", "last weekend before") are not read: the date is
//! where a memory about it was most likely written. A month and day without
//! a year ("on May 3") is not read: "may" is too common a word, and the
//! year would be a guess.
//!
//! Must not: touch storage.

use std::sync::LazyLock;

use chrono::{DateTime, Days, Months, NaiveDate, TimeZone, Utc};
use regex::Regex;

const MONTH: &str = "jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?\
                     |sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?";

static DAY_MONTH_YEAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({MONTH})\.?,?\s+(\d{{4}})\b"))
        .expect("date pattern compiles")
});
static MONTH_DAY_YEAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(?i)\b({MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b"))
        .expect("date pattern compiles")
});
static MONTH_YEAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"(?i)\b({MONTH})\.?,?\s+(\d{{4}})\b")).expect("date pattern compiles"));
static ISO_DAY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(\d{4})-(\d{2})-(\d{2})\b").expect("date pattern compiles"));
static YEAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?:in|during|of)\s+(\d{4})\b").expect("date pattern compiles"));

/// The time windows a query names (half-open, UTC).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryDates {
    windows: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl QueryDates {
    /// The dates in `query`; `None` when it names none.
    pub fn new(query: &str) -> Option<Self> {
        let mut windows = Vec::new();
        // Spans already read as a day, so that "7 July, 2023" is not also
        // read as the month "July, 2023".
        let mut taken: Vec<(usize, usize)> = Vec::new();
        // A day that does not exist ("31 February 2023") names nothing.
        for c in DAY_MONTH_YEAR.captures_iter(query) {
            let m = c.get(0).expect("whole match");
            taken.push((m.start(), m.end()));
            if let Some(day) = day(&c[3], &c[2], &c[1]) {
                windows.push(around(day));
            }
        }
        for c in MONTH_DAY_YEAR.captures_iter(query) {
            let m = c.get(0).expect("whole match");
            taken.push((m.start(), m.end()));
            if let Some(day) = day(&c[3], &c[1], &c[2]) {
                windows.push(around(day));
            }
        }
        for c in ISO_DAY.captures_iter(query) {
            if let Some(day) = ymd(&c[1], &c[2], &c[3]) {
                windows.push(around(day));
            }
        }
        for c in MONTH_YEAR.captures_iter(query) {
            let m = c.get(0).expect("whole match");
            if taken.iter().any(|&(s, e)| m.start() < e && s < m.end()) {
                continue;
            }
            if let Some(first) = month(&c[1]).and_then(|m| NaiveDate::from_ymd_opt(c[2].parse().ok()?, m, 1)) {
                windows.push((midnight(first), midnight(first + Months::new(1))));
            }
        }
        for c in YEAR.captures_iter(query) {
            let first = c[1].parse().ok().and_then(|y| NaiveDate::from_ymd_opt(y, 1, 1));
            if let Some(first) = first {
                windows.push((midnight(first), midnight(first + Months::new(12))));
            }
        }
        (!windows.is_empty()).then_some(Self { windows })
    }

    /// Whether `t` falls within one of the query's dates.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.windows.iter().any(|&(from, to)| from <= t && t < to)
    }
}

fn month(name: &str) -> Option<u32> {
    let n = name.to_ascii_lowercase();
    let i = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        .iter()
        .position(|m| n.starts_with(m))?;
    Some(i as u32 + 1)
}

fn day(year: &str, month_name: &str, day: &str) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(year.parse().ok()?, month(month_name)?, day.parse().ok()?)
}

fn ymd(year: &str, month: &str, day: &str) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(year.parse().ok()?, month.parse().ok()?, day.parse().ok()?)
}

fn midnight(d: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists"))
}

/// The day before to the day after, whole days.
fn around(d: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
    (midnight(d - Days::new(1)), midnight(d + Days::new(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).expect("test date").with_timezone(&Utc)
    }

    #[test]
    fn a_day_in_either_order_is_the_day_with_a_day_either_side() {
        for q in [
            "What did Maria donate on 7 July, 2023?",
            "What happened on July 7th 2023?",
            "what happened on jul 7, 2023",
            "Anything from 2023-07-07?",
        ] {
            let d = QueryDates::new(q).unwrap_or_else(|| panic!("{q}: no date"));
            assert!(d.contains(at("2023-07-07T13:56:00Z")), "{q}");
            assert!(d.contains(at("2023-07-06T00:00:00Z")), "{q}: the day before");
            assert!(d.contains(at("2023-07-08T23:59:59Z")), "{q}: the day after");
            assert!(!d.contains(at("2023-07-09T00:00:00Z")), "{q}: two days after");
            assert!(!d.contains(at("2023-07-05T23:59:59Z")), "{q}: two days before");
            assert!(!d.contains(at("2023-08-07T12:00:00Z")), "{q}: a month after, read as a month");
        }
    }

    #[test]
    fn a_month_with_a_year_is_the_whole_month() {
        let d = QueryDates::new("What happened to John's job in August 2023?").expect("a month");
        assert!(d.contains(at("2023-08-01T00:00:00Z")));
        assert!(d.contains(at("2023-08-31T23:59:59Z")));
        assert!(!d.contains(at("2023-09-01T00:00:00Z")));
        assert!(!d.contains(at("2023-07-31T23:59:59Z")));
        let d = QueryDates::new("Who did I meet in Sept. 2021").expect("a short month");
        assert!(d.contains(at("2021-09-15T10:00:00Z")));
    }

    #[test]
    fn a_year_after_in_is_the_whole_year() {
        let d = QueryDates::new("How many times did Melanie go to the beach in 2023?").expect("a year");
        assert!(d.contains(at("2023-01-01T00:00:00Z")));
        assert!(d.contains(at("2023-12-31T23:59:59Z")));
        assert!(!d.contains(at("2024-01-01T00:00:00Z")));
    }

    #[test]
    fn words_that_are_not_dates_name_none() {
        for q in [
            "May I ask what Caroline researched?",
            "What did Melanie do on May 3?",
            "Where did Caroline move from 4 years ago?",
            "Room 2023 is where the meeting was",
            "What happened on 31 February 2023?",
            "",
        ] {
            assert_eq!(QueryDates::new(q), None, "{q}");
        }
    }
}
