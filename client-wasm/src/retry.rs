//! When to try a failed send again: capped exponential backoff with jitter, and the
//! collector's `Retry-After` in both of its forms.
//!
//! Contract:
//! - [`backoff_ms`] for the n-th failure (n ≥ 1) is drawn from `[d/2, d]` where
//!   `d = min(BASE_MS · 2^(n-1), CAP_MS)` ("equal jitter": never zero, never above the cap,
//!   spread so that many clients released by one outage do not retry in lockstep).
//! - [`retry_after_ms`] reads a `Retry-After` value — delay-seconds (`"120"`) or an HTTP-date
//!   in any of the three forms HTTP requires recipients to accept (IMF-fixdate, RFC 850,
//!   asctime) — as a delay from `now_ms`, capped at [`MAX_RETRY_AFTER_MS`]. A date in the past
//!   means "now" (0); anything unreadable is `None`, and the caller falls back to backoff alone.
//! - [`next_delay_ms`] is the wait the client actually uses: the larger of the two.
//! - Pure functions: time and randomness are parameters.

/// First backoff step.
pub const BASE_MS: u64 = 1_000;
/// Longest backoff step.
pub const CAP_MS: u64 = 5 * 60 * 1_000;
/// Longest `Retry-After` honoured; a queued event expires long before anything larger matters.
pub const MAX_RETRY_AFTER_MS: u64 = 24 * 60 * 60 * 1_000;

/// Backoff before retry number `attempt` (the count of failures so far, ≥ 1), with `random`
/// supplying the jitter.
pub fn backoff_ms(attempt: u32, random: u32) -> u64 {
    let doublings = attempt.saturating_sub(1).min(20);
    let step = (BASE_MS << doublings).min(CAP_MS);
    let half = step / 2;
    half + u64::from(random) % (half + 1)
}

/// The delay before the next try after `attempt` failures, honouring `retry_after` (the
/// header's raw value, when the answer had one).
pub fn next_delay_ms(attempt: u32, random: u32, retry_after: Option<&str>, now_ms: u64) -> u64 {
    let backoff = backoff_ms(attempt, random);
    match retry_after.and_then(|v| retry_after_ms(v, now_ms)) {
        Some(wait) => wait.max(backoff),
        None => backoff,
    }
}

/// Reads a `Retry-After` header value as a delay in milliseconds from `now_ms`.
pub fn retry_after_ms(value: &str, now_ms: u64) -> Option<u64> {
    let value = value.trim_ascii().as_bytes();
    let wait = match digits(value) {
        // Too many digits to fit means "very long": the cap below applies.
        Some(secs) => secs.saturating_mul(1_000),
        None => http_date_ms(value)?.saturating_sub(now_ms),
    };
    Some(wait.min(MAX_RETRY_AFTER_MS))
}

/// A non-empty run of ASCII digits as a number, saturating at `u64::MAX`; `None` otherwise.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
    })
}

/// Parses an HTTP-date into Unix milliseconds. Accepts
/// `Sun, 06 Nov 1994 08:49:37 GMT`, `Sunday, 06-Nov-94 08:49:37 GMT` and
/// `Sun Nov  6 08:49:37 1994` (ASCII case-insensitive); the weekday is not checked (it is
/// redundant). Byte-level on purpose: `str::parse` and friends cost WebAssembly bytes.
pub fn http_date_ms(value: &[u8]) -> Option<u64> {
    const MONTHS: &[u8; 36] = b"janfebmaraprmayjunjulaugsepoctnovdec";
    let (mut month, mut time, mut day, mut year) = (None, None, None, None);
    for token in value.split(|b| matches!(b, b' ' | b',' | b'-')) {
        if token.contains(&b':') {
            time = Some(clock(token)?);
        } else if let Some(n) = digits(token) {
            match (day, year, token.len()) {
                (None, _, 1 | 2) => day = Some(n),
                (Some(_), None, 2) => year = Some(n + if n < 70 { 2000 } else { 1900 }),
                (_, None, 4) => year = Some(n),
                _ => return None,
            }
        } else if token.len() == 3 && month.is_none() {
            // A three-letter token is either the month or a short weekday name.
            month = MONTHS
                .chunks(3)
                .position(|m| m.eq_ignore_ascii_case(token))
                .map(|i| i as u64 + 1);
        }
    }
    let (month, secs_of_day, day, year) = (month?, time?, day?, year?);
    if !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    Some((days_from_civil(year, month, day) * 86_400 + secs_of_day) * 1_000)
}

/// `HH:MM:SS` as seconds of the day.
fn clock(t: &[u8]) -> Option<u64> {
    if t.len() != 8 || t[2] != b':' || t[5] != b':' {
        return None;
    }
    let (h, m, s) = (digits(&t[0..2])?, digits(&t[3..5])?, digits(&t[6..8])?);
    (h < 24 && m < 60 && s < 61).then_some(h * 3600 + m * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (year ≥ 1970), after H. Hinnant.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOV_6_1994: u64 = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        for attempt in 1..=12u32 {
            let step = (BASE_MS << (attempt - 1)).min(CAP_MS);
            let lo = backoff_ms(attempt, 0);
            let hi = backoff_ms(attempt, u32::MAX - 1);
            assert_eq!(lo, step / 2, "attempt {attempt}");
            assert!(hi <= step && hi >= lo, "attempt {attempt}: {hi}");
        }
        assert_eq!(backoff_ms(1, 500), 1_000);
        assert_eq!(backoff_ms(1, 501), 500);
        assert!(backoff_ms(u32::MAX, u32::MAX) <= CAP_MS);
        assert_eq!(backoff_ms(0, 0), backoff_ms(1, 0));
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(retry_after_ms("120", 5), Some(120_000));
        assert_eq!(retry_after_ms(" 0 ", 5), Some(0));
        assert_eq!(
            retry_after_ms("99999999999999999999999", 0),
            Some(MAX_RETRY_AFTER_MS)
        );
        assert_eq!(retry_after_ms("-1", 0), None);
        assert_eq!(retry_after_ms("1.5", 0), None);
        assert_eq!(retry_after_ms("", 0), None);
    }

    #[test]
    fn retry_after_http_date_in_all_three_forms() {
        let now = NOV_6_1994 - 30_000;
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "sun, 06 NOV 1994 08:49:37 gmt",
        ] {
            assert_eq!(http_date_ms(form.as_bytes()), Some(NOV_6_1994), "{form}");
            assert_eq!(retry_after_ms(form, now), Some(30_000), "{form}");
        }
    }

    #[test]
    fn retry_after_date_in_the_past_means_now() {
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", NOV_6_1994 + 1),
            Some(0)
        );
    }

    #[test]
    fn dates_around_leap_days_and_epoch() {
        assert_eq!(http_date_ms(b"Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date_ms(b"Thu, 29 Feb 2024 00:00:00 GMT"),
            Some(1_709_164_800_000)
        );
        assert_eq!(
            http_date_ms(b"Fri, 01 Mar 2024 23:59:59 GMT"),
            Some(1_709_337_599_000)
        );
        assert_eq!(
            http_date_ms(b"Fri, 31 Dec 2038 12:00:00 GMT"),
            Some(2_177_409_600_000)
        );
    }

    #[test]
    fn unreadable_dates_are_none() {
        for bad in [
            "soon",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 GMT",
            "Sun, 06 Nov 08:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37:01 GMT",
            "1 2 3 4 Nov 08:49:37",
        ] {
            assert_eq!(http_date_ms(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn next_delay_takes_the_longer_of_backoff_and_retry_after() {
        assert_eq!(next_delay_ms(1, 0, Some("3"), 0), 3_000);
        assert_eq!(next_delay_ms(5, 0, Some("3"), 0), 8_000);
        assert_eq!(next_delay_ms(1, 0, Some("garbage"), 0), 500);
        assert_eq!(next_delay_ms(1, 0, None, 0), 500);
    }
}
