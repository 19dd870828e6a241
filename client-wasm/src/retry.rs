//! When to try a failed send again: capped exponential backoff with jitter, and the
//! collector's `Retry-After`.
//!
//! Contract:
//! - [`backoff_ms`] for the n-th failure (n ≥ 1) is drawn from `[d/2, d]` where
//!   `d = min(BASE_MS · 2^(n-1), CAP_MS)` ("equal jitter": never zero, never above the cap,
//!   spread so that many clients released by one outage do not retry in lockstep).
//! - `Retry-After` arrives already read as a wait in milliseconds: `js/host.js` takes
//!   delay-seconds (`"120"`) itself and hands an HTTP-date (IMF-fixdate, RFC 850 or asctime,
//!   the three forms HTTP requires recipients to accept) to the browser's `Date.parse`,
//!   which reads all three; a date in the past or anything unreadable is a wait of 0.
//! - [`next_delay_ms`] is the wait the client actually uses: the larger of the backoff and
//!   the `Retry-After` wait, the latter capped at [`MAX_RETRY_AFTER_MS`].
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

/// The delay before the next try after `attempt` failures, never shorter than the answer's
/// `Retry-After` wait (`retry_after_ms`, 0 when there was none, it is unreadable or it lies
/// in the past), which is honoured up to [`MAX_RETRY_AFTER_MS`].
pub fn next_delay_ms(attempt: u32, random: u32, retry_after_ms: u64) -> u64 {
    backoff_ms(attempt, random).max(retry_after_ms.min(MAX_RETRY_AFTER_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn next_delay_takes_the_longer_of_backoff_and_retry_after() {
        assert_eq!(next_delay_ms(1, 0, 3_000), 3_000);
        assert_eq!(next_delay_ms(5, 0, 3_000), 8_000);
        assert_eq!(next_delay_ms(1, 0, 0), 500);
        assert_eq!(next_delay_ms(1, 0, u64::MAX), MAX_RETRY_AFTER_MS);
    }
}
