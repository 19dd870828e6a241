//! Report periods: a week is Monday to Sunday, a month a calendar month, both of local days
//! (the site's time zone decides which day "today" is; see [`crate::core::day`]). A period's
//! report is due once the period has ended, i.e. from the first local day after its last.

use jiff::civil::Date;

/// How often a scheduled report goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Every {
    Week,
    Month,
}

/// Neither `week` nor `month`.
#[derive(Debug, thiserror::Error)]
#[error("unknown report period {0:?} (expected week or month)")]
pub struct UnknownEvery(pub String);

impl Every {
    /// `week` or `month` (the stored form).
    pub fn parse(text: &str) -> Result<Self, UnknownEvery> {
        match text {
            "week" => Ok(Every::Week),
            "month" => Ok(Every::Month),
            other => Err(UnknownEvery(other.to_owned())),
        }
    }

    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Every::Week => "week",
            Every::Month => "month",
        }
    }
}

impl std::fmt::Display for Every {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One week or month of local days, `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub every: Every,
    pub first: Date,
    pub last: Date,
}

impl Period {
    /// The period holding `day`.
    pub fn containing(every: Every, day: Date) -> Self {
        let first = match every {
            Every::Week => day
                .checked_sub(jiff::Span::new().days(day.weekday().to_monday_zero_offset()))
                .unwrap_or(day),
            Every::Month => day.first_of_month(),
        };
        let last = match every {
            Every::Week => first
                .checked_add(jiff::Span::new().days(6))
                .unwrap_or(first),
            Every::Month => first.last_of_month(),
        };
        Self { every, first, last }
    }

    /// The last period that has ended by the local day `today` (the one before today's).
    pub fn last_complete(every: Every, today: Date) -> Self {
        Self::containing(every, today).previous()
    }

    /// The period just before this one (for the change against the previous period).
    pub fn previous(&self) -> Self {
        let day_before = self.first.yesterday().unwrap_or(self.first);
        Self::containing(self.every, day_before)
    }

    /// Whether the period has ended by the local day `today`.
    pub fn has_ended(&self, today: Date) -> bool {
        today > self.last
    }

    /// "week of 2026-11-23" or "November 2026".
    pub fn title(&self) -> String {
        match self.every {
            Every::Week => format!("week of {} to {}", self.first, self.last),
            Every::Month => self.first.strftime("%B %Y").to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    #[test]
    fn weeks_run_monday_to_sunday() {
        // 2026-12-03 is a Thursday.
        let p = Period::containing(Every::Week, date(2026, 12, 3));
        assert_eq!((p.first, p.last), (date(2026, 11, 30), date(2026, 12, 6)));
        let sunday = Period::containing(Every::Week, date(2026, 12, 6));
        assert_eq!(sunday, p);
        let done = Period::last_complete(Every::Week, date(2026, 12, 7));
        assert_eq!(done, p);
        assert!(p.has_ended(date(2026, 12, 7)) && !p.has_ended(date(2026, 12, 6)));
        assert_eq!(p.previous().first, date(2026, 11, 23));
    }

    #[test]
    fn months_are_calendar_months() {
        let p = Period::last_complete(Every::Month, date(2026, 3, 1));
        assert_eq!((p.first, p.last), (date(2026, 2, 1), date(2026, 2, 28)));
        assert_eq!(p.previous().first, date(2026, 1, 1));
        assert_eq!(p.previous().last, date(2026, 1, 31));
        assert_eq!(p.title(), "February 2026");
        assert!(Every::parse("fortnight").is_err());
        assert_eq!(Every::parse("month").map(Every::as_str).ok(), Some("month"));
    }
}
