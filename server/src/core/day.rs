//! Day boundaries. Timestamps are stored in UTC; each site has an IANA time zone, and a hit
//! belongs to the calendar day its timestamp falls on in that zone.

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

/// A parsed IANA time zone together with its name.
#[derive(Debug, Clone)]
pub struct SiteZone {
    name: String,
    tz: TimeZone,
}

/// The zone name is not in the bundled IANA database.
#[derive(Debug, thiserror::Error)]
#[error("unknown time zone {0:?} (expected an IANA name such as Europe/Berlin)")]
pub struct UnknownZone(pub String);

impl SiteZone {
    /// Parse an IANA name such as `Europe/Berlin` or `UTC`.
    pub fn parse(name: &str) -> Result<Self, UnknownZone> {
        let tz = TimeZone::get(name).map_err(|_| UnknownZone(name.to_owned()))?;
        Ok(Self {
            name: name.to_owned(),
            tz,
        })
    }

    /// UTC.
    pub fn utc() -> Self {
        Self {
            name: "UTC".to_owned(),
            tz: TimeZone::UTC,
        }
    }

    /// The IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zone itself.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// The local calendar day of `at`.
    pub fn day_of(&self, at: Timestamp) -> Date {
        at.to_zoned(self.tz.clone()).date()
    }

    /// The instants covered by the local days `from..=to`: `[start of from, start of to + 1)`.
    pub fn span(&self, from: Date, to: Date) -> (Timestamp, Timestamp) {
        let start = |d: Date| {
            d.to_zoned(self.tz.clone())
                .map(|z| z.timestamp())
                .unwrap_or(Timestamp::UNIX_EPOCH)
        };
        let end = to.tomorrow().map(start).unwrap_or(Timestamp::MAX);
        (start(from), end)
    }
}

/// The stored form of a day: `YYYY-MM-DD`.
pub fn day_key(day: Date) -> String {
    day.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn berlin_midnight_splits_days() {
        let zone = SiteZone::parse("Europe/Berlin").expect("zone");
        // 2026-03-01 00:00 in Berlin (UTC+1) is 2026-02-28 23:00 UTC.
        let before: Timestamp = "2026-02-28T22:59:59.999Z".parse().expect("ts");
        let after: Timestamp = "2026-02-28T23:00:00Z".parse().expect("ts");
        assert_eq!(day_key(zone.day_of(before)), "2026-02-28");
        assert_eq!(day_key(zone.day_of(after)), "2026-03-01");
    }

    #[test]
    fn span_covers_whole_local_days() {
        let zone = SiteZone::parse("Europe/Berlin").expect("zone");
        let (a, b) = zone.span(
            jiff::civil::date(2026, 3, 28),
            jiff::civil::date(2026, 3, 29),
        );
        assert_eq!(a.to_string(), "2026-03-27T23:00:00Z");
        // The DST night makes 2026-03-29 23 hours long.
        assert_eq!(b.to_string(), "2026-03-29T22:00:00Z");
    }

    #[test]
    fn unknown_zone_is_an_error() {
        assert!(SiteZone::parse("Mars/Olympus").is_err());
    }
}
