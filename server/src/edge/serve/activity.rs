//! The phase clock of one connection ([`Activity`]): what its I/O, its requests and its
//! watchdog share, and the deadline it gives ([`Expiry`]). [`RequestGuard`] is an open
//! request; the connection (`conn`) and the body wrapper (`body`) both hold it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::ServerConfig;

/// Where a connection stands between requests.
#[derive(Debug)]
struct Phase {
    /// When each request whose answer has not been fully handed to the socket yet began (its
    /// head), with how many began at that instant.
    open: BTreeMap<Instant, usize>,
    /// Since when a write to the socket has been waiting for the client to read.
    blocked_since: Option<Instant>,
    /// When the connection's last answer was sent (its accept, until then).
    quiet_since: Instant,
    /// When the head of the next request started: its first byte, or the accept for a new
    /// connection (which owes a request at once).
    head_since: Option<Instant>,
}

/// Why the watchdog closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// No request and no byte for `idle_timeout` after an answer.
    Idle,
    /// A request head not complete `header_timeout` after its first byte (or after the
    /// accept, for a new connection).
    Header,
    /// An answer not handed to the socket `answer_timeout` after its request's head (a slow
    /// handler, or an HTTP/2 stream whose window the client keeps shut).
    Answer,
    /// A write waiting `answer_timeout` for a client that does not read.
    Stalled,
}

impl Expiry {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Expiry::Idle => "idle_timeout",
            Expiry::Header => "header_timeout",
            Expiry::Answer => "answer_timeout",
            Expiry::Stalled => "write_stalled",
        }
    }
}

/// The phase clock of one connection, shared by its I/O, its requests and its watchdog.
///
/// Nothing here wakes the watchdog: every deadline a change can set lies at least the
/// smallest of the three timeouts after that change (a head's first byte starts the header
/// clock, the last answer the idle clock, a request's head or a blocked write the answer
/// clock), so a watchdog that looks again no later than that long after each look never
/// misses one (see [`serve_connection`]). A request costs no task wake-up and no timer reset
/// for its clock.
pub(crate) struct Activity {
    phase: Mutex<Phase>,
}

impl Activity {
    /// A connection accepted at `now`: its first head is due within the header timeout.
    pub fn new(now: Instant) -> Self {
        Self {
            phase: Mutex::new(Phase {
                open: BTreeMap::new(),
                blocked_since: None,
                quiet_since: now,
                head_since: Some(now),
            }),
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // The phase is three plain fields, valid whatever a panicking holder did.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes were read from the socket.
    pub fn bytes_arrived(&self) {
        let mut phase = self.phase();
        if phase.open.is_empty() && phase.head_since.is_none() {
            phase.head_since = Some(Instant::now());
        }
    }

    /// A request head was parsed at `now`; the guard ends the request when its answer is sent
    /// or dropped.
    pub fn request_started(self: &Arc<Self>, now: Instant) -> RequestGuard {
        let mut phase = self.phase();
        *phase.open.entry(now).or_default() += 1;
        phase.head_since = None;
        RequestGuard {
            activity: Arc::clone(self),
            started: now,
        }
    }

    fn request_finished(&self, started: Instant) {
        let mut phase = self.phase();
        if let Some(n) = phase.open.get_mut(&started) {
            *n -= 1;
            if *n == 0 {
                phase.open.remove(&started);
            }
        }
        if phase.open.is_empty() {
            phase.quiet_since = Instant::now();
            phase.head_since = None;
        }
    }

    /// A write to the socket could not proceed (`true`) or went through again (`false`).
    pub(crate) fn write_blocked(&self, blocked: bool) {
        self.phase().blocked_since = blocked.then(Instant::now);
    }

    /// When the connection expires if nothing changes, and why.
    pub fn deadline(&self, config: &ServerConfig) -> (Instant, Expiry) {
        let phase = self.phase();
        let phase_deadline = match (phase.open.keys().next(), phase.head_since) {
            (Some(oldest), _) => (*oldest + config.answer_timeout, Expiry::Answer),
            (None, Some(head)) => (head + config.header_timeout, Expiry::Header),
            (None, None) => (phase.quiet_since + config.idle_timeout, Expiry::Idle),
        };
        match phase.blocked_since {
            Some(since) if since + config.answer_timeout < phase_deadline.0 => {
                (since + config.answer_timeout, Expiry::Stalled)
            }
            _ => phase_deadline,
        }
    }
}

/// An open request; dropping it (answer sent, or the connection gone) ends the request.
pub(crate) struct RequestGuard {
    activity: Arc<Activity>,
    started: Instant,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.activity.request_finished(self.started);
    }
}
