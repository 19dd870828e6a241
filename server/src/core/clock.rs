//! Injected time. Logic receives a [`Clock`] (or a timestamp taken from one) so tests can set
//! the time, e.g. one second before local midnight.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that shows whatever a test sets; shared by cloning the `Arc`.
#[derive(Debug)]
pub struct ManualClock {
    /// Milliseconds since the Unix epoch.
    millis: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `at`.
    pub fn new(at: Timestamp) -> Arc<Self> {
        Arc::new(Self {
            millis: AtomicI64::new(at.as_millisecond()),
        })
    }

    /// Move the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        self.millis.store(at.as_millisecond(), Ordering::SeqCst);
    }

    /// Move the clock forward by `millis`.
    pub fn advance_millis(&self, millis: i64) {
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        // Every stored value came from a valid Timestamp (or a small advance of one).
        Timestamp::from_millisecond(self.millis.load(Ordering::SeqCst))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }
}
