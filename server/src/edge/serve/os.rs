//! What the server asks of the operating system (Unix; elsewhere these are no-ops):
//! - the open-file budget: the soft `RLIMIT_NOFILE` is raised to the hard limit at start
//!   (where permitted), and the connection cap is kept under what remains after a reserve for
//!   the database, logs and refusals, so serving connections never exhausts descriptors;
//! - the accept backlog: raised on the listener it is given (Linux and the BSDs update the
//!   backlog of a socket that already listens). Listeners bound by tokio or std get 128, and a
//!   burst of connections beyond that has its SYNs dropped: those clients wait 1 s or more
//!   for a retransmission before the server even sees them.

/// Backlog asked for the listening socket; the kernel caps it (`net.core.somaxconn`).
pub const ACCEPT_BACKLOG: i32 = 4096;

/// Descriptors kept for everything but connections: the listener, SQLite's files (the database,
/// its WAL and shared memory, once per writer and reader connection), stdio, the runtime.
pub const FD_RESERVE: u64 = 128;

/// Raise the soft open-file limit to the hard limit and return the soft limit now in force
/// (`None`: unlimited, or unknown on this platform).
pub fn raise_nofile_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        if limit.current != limit.maximum {
            let raised = Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => {
                    tracing::debug!(from = ?limit.current, to = ?limit.maximum, "raised the open-file limit");
                }
                Err(e) => {
                    tracing::info!(error = %e, soft = ?limit.current, "cannot raise the open-file limit");
                }
            }
        }
        getrlimit(Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raise the accept backlog of an already listening socket to [`ACCEPT_BACKLOG`].
pub fn raise_backlog(listener: &tokio::net::TcpListener) {
    #[cfg(unix)]
    if let Err(e) = rustix::net::listen(listener, ACCEPT_BACKLOG) {
        tracing::info!(error = %e, "cannot raise the accept backlog");
    }
    #[cfg(not(unix))]
    let _ = listener;
}

/// The connection cap in force: `wanted`, lowered to fit `nofile` minus the reserve and the
/// refusal slots, and at least 1.
pub fn connection_cap(wanted: usize, nofile: Option<u64>, refusal_slots: usize) -> usize {
    let Some(nofile) = nofile else {
        return wanted.max(1);
    };
    let budget = nofile
        .saturating_sub(FD_RESERVE)
        .saturating_sub(refusal_slots as u64);
    let budget = usize::try_from(budget).unwrap_or(usize::MAX);
    wanted.min(budget).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_under_the_open_file_limit() {
        assert_eq!(connection_cap(1024, None, 64), 1024);
        assert_eq!(connection_cap(1024, Some(1_048_576), 64), 1024);
        assert_eq!(connection_cap(1024, Some(1024), 64), 1024 - 128 - 64);
        assert_eq!(connection_cap(1024, Some(100), 64), 1, "never zero");
    }

    /// Linux lets any process raise its soft limit up to the hard one.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit() {
        let soft = raise_nofile_limit();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(soft, limit.maximum);
        assert_eq!(limit.current, limit.maximum);
    }
}
