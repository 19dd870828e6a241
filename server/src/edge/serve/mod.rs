//! The HTTP server loop: accepts TCP connections up to a cap, serves each over HTTP/1 or
//! HTTP/2 (hyper-util's auto builder) under header, body and idle timeouts, and shuts down in
//! bounded time. It replaces `axum::serve`, which has no header timeout and no cap.
//!
//! Contract:
//! - At most `max_connections` connections are served at once (lowered to fit the open-file
//!   limit, which is first raised to its hard maximum), and at most
//!   `max_connections_per_address` from one client network (see [`share`]; trusted proxies
//!   are exempt). Past either a connection is still accepted and answered `503` with
//!   `Retry-After: 1`, `Connection: close` and `{"error":"too_many_connections",…}`, then
//!   closed: clients and proxies see a clear, retryable refusal instead of a hanging connect.
//!   At most [`REFUSAL_SLOTS`] refusals wait for the client's request and close cleanly;
//!   beyond that the answer is written without waiting and the socket closed at once (a
//!   client that sends its request after that close may see a reset instead of the answer).
//! - Open requests (HTTP/1 requests, HTTP/2 streams) are bounded per connection
//!   ([`MAX_CONCURRENT_STREAMS`]) and per client network (`max_requests_per_address`; past it
//!   `503 too_many_requests` without reaching the application).
//! - The accept backlog is raised (see [`os`]) so a burst of connects is queued, not dropped.
//! - Accept errors never spin the loop: errors of one connection are skipped, resource errors
//!   (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) pause accepting for [`ACCEPT_BACKOFF`], and
//!   they are logged at most once per [`ACCEPT_LOG_INTERVAL`] with a count.
//! - Request heads are bounded by [`MAX_HEADER_BYTES`] (HTTP/1: 431 from hyper, before any
//!   handler; HTTP/2: the advertised header list size).
//! - Timeouts per connection: see [`conn`] (heads, idle, answers, stalled writes) and
//!   [`body`] (bodies, 408). Every connection ends within the largest of `header_timeout`,
//!   `idle_timeout` and `answer_timeout` after it last made progress that the server counts:
//!   a finished answer, or the first byte of a new head.
//! - Shutdown: when `shutdown` resolves the listener is closed, every connection starts a
//!   graceful shutdown, and after `shutdown_grace` whatever is still connected is dropped.
//!   [`serve`] returns only when every connection task has ended, so the router (and the ingest
//!   queue senders inside it) is gone and the writer can drain.

mod activity;
mod body;
mod conn;
pub mod os;
mod share;

pub use body::BodyTimeout;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::core::forwarded::TrustedProxies;
use crate::metrics::{Metrics, ReasonLabel};
use conn::Shared;
use share::AddressShares;

/// Largest request head in bytes (HTTP/1 read buffer, HTTP/2 header list); a longer HTTP/1
/// head is answered 431 without reaching a handler.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Refusals (503 at the cap) in progress at once; each holds a socket for at most
/// [`REFUSAL_LINGER`] twice.
pub const REFUSAL_SLOTS: usize = 64;
/// How long a refusal waits to write its answer, then to read the client's request and EOF
/// (closing with unread input would reset the connection and could destroy the answer).
pub const REFUSAL_LINGER: Duration = Duration::from_millis(500);
/// Pause after an accept error that is about this process or system, not one connection.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Accept errors are logged at most once per interval.
pub const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// HTTP/2 streams one connection may have open at once (a browser opens a handful; the
/// per-address request share bounds the sum over connections).
pub const MAX_CONCURRENT_STREAMS: u32 = 32;

/// The answer past the connection cap.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
cache-control: no-store\r\n\
connection: close\r\n\
content-length: 85\r\n\
\r\n\
{\"error\":\"too_many_connections\",\"message\":\"too many open connections; retry shortly\"}";

/// The answer past an address's connection share.
const ADDRESS_REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
cache-control: no-store\r\n\
connection: close\r\n\
content-length: 103\r\n\
\r\n\
{\"error\":\"too_many_connections\",\"message\":\"too many open connections from your address; retry shortly\"}";

/// Timeouts, caps and grace of the server loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// From the first byte of a request head to its end (slowloris bound).
    pub header_timeout: Duration,
    /// From the end of a request head to the end of its body; then 408.
    pub body_timeout: Duration,
    /// A connection with no request open and no byte received is closed after this.
    pub idle_timeout: Duration,
    /// From a request's head to the end of its answer handed to the socket, and the longest a
    /// write may wait for a client that does not read; the connection is closed past it.
    pub answer_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections one client network may hold at once.
    pub max_connections_per_address: usize,
    /// Requests (HTTP/2 streams included) one client network may have open at once.
    pub max_requests_per_address: usize,
    /// How long shutdown lets requests in flight finish before dropping every connection.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    /// 10 s for a head (a browser sends it in one packet; a 2G phone within a second or two),
    /// 30 s for a body (hits are at most a few KiB, but mobile uploads stall), 75 s idle (more
    /// than the 60 s upstream keep-alive of nginx and common load balancers, so a proxy never
    /// reuses a connection this server is closing), 60 s for an answer (a body's 30 s plus
    /// the slowest read twice over), 1024 connections, 64 of them and 128 open requests per
    /// client network (a browser opens six connections per host; a large office behind one
    /// address stays far below), 10 s of shutdown grace.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            answer_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_address: 64,
            max_requests_per_address: 128,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Serve `router` on `listener` until `shutdown` resolves; then stop accepting, let requests in
/// flight finish within the grace period, drop the rest, and return when every connection is
/// gone.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: ServerConfig,
    exempt: TrustedProxies,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let cap = os::connection_cap(
        config.max_connections,
        os::raise_nofile_limit(),
        REFUSAL_SLOTS,
    );
    os::raise_backlog(&listener);
    if cap < config.max_connections {
        tracing::warn!(
            wanted = config.max_connections,
            cap,
            "connection cap lowered to fit the open-file limit"
        );
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut acceptor = Acceptor {
        shared: Arc::new(Shared {
            builder: builder(),
            router,
            config,
            metrics: Arc::clone(&metrics),
        }),
        permits: Arc::new(Semaphore::new(cap)),
        shares: Arc::new(AddressShares::new(
            config.max_connections_per_address,
            config.max_requests_per_address,
            exempt,
        )),
        refusals: Arc::new(Semaphore::new(REFUSAL_SLOTS)),
        stop: stop_rx,
        tasks: JoinSet::new(),
    };
    let mut errors = AcceptErrors::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = acceptor.tasks.join_next(), if !acceptor.tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => acceptor.admit(stream, peer),
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!(error = %e, "accept failed for one connection");
                }
                Err(e) => {
                    errors.record(&e);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drain(acceptor.tasks, config.shutdown_grace, &metrics).await;
}

/// The accept loop's state: what connections share, the cap, and the connection tasks.
struct Acceptor {
    shared: Arc<Shared>,
    /// One permit per connection served; `max_connections` (or less, see [`os`]).
    permits: Arc<Semaphore>,
    /// Each client network's share.
    shares: Arc<AddressShares>,
    /// One per refusal that waits for the client (see [`refuse`]).
    refusals: Arc<Semaphore>,
    /// Turns true at shutdown; every connection holds a receiver.
    stop: watch::Receiver<bool>,
    /// Every connection being served (refusals run detached).
    tasks: JoinSet<()>,
}

impl Acceptor {
    /// Serve an accepted connection, or refuse it past its address's share or the cap.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        // Small answers go out at once instead of waiting for the client's ACK.
        let _ = stream.set_nodelay(true);
        let Some(share) = self.shares.connect(peer.ip()) else {
            self.refuse(stream, "address_share", ADDRESS_REFUSAL);
            return;
        };
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            self.refuse(stream, "cap", REFUSAL);
            return;
        };
        let open = OpenConnection::new(&self.shared.metrics, permit);
        let shared = Arc::clone(&self.shared);
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            conn::serve_connection(stream, peer, share, shared, stop).await;
            drop(open);
        });
    }

    /// Answer `stream` with `answer` (a 503) and close it.
    fn refuse(&self, stream: TcpStream, reason: &'static str, answer: &'static [u8]) {
        self.shared
            .metrics
            .connections_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
        match Arc::clone(&self.refusals).try_acquire_owned() {
            // Refusals hold no application state and end within twice REFUSAL_LINGER: they
            // run detached, even past shutdown.
            Ok(slot) => {
                tokio::spawn(async move {
                    refuse(stream, answer).await;
                    drop(slot);
                });
            }
            // No slot: the answer goes into the empty send buffer at once and the socket
            // closes; a request the client sends after that meets a reset, but the answer is
            // already on its side.
            Err(_) => {
                let _ = stream.try_write(answer);
            }
        }
    }
}

/// Wait for every connection (they are shutting down gracefully) for at most `grace`, then
/// drop the ones left.
async fn drain(mut tasks: JoinSet<()>, grace: Duration, metrics: &Metrics) {
    let open = tasks.len();
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        let left = tasks.len();
        tracing::warn!(
            connections = left,
            grace_secs = grace.as_secs_f64(),
            "closing connections still open at the end of the shutdown grace"
        );
        metrics
            .connections_cut
            .get_or_create(&ReasonLabel {
                reason: "shutdown_grace",
            })
            .inc_by(left as u64);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    } else if open > 0 {
        tracing::info!(
            connections = open,
            "every connection finished within the grace"
        );
    }
}

/// A served connection: its cap permit and its place in the `connections_open` gauge, both
/// given back when the task ends or is aborted.
struct OpenConnection {
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(metrics: &Arc<Metrics>, permit: OwnedSemaphorePermit) -> Self {
        metrics.connections_open.inc();
        Self {
            metrics: Arc::clone(metrics),
            _permit: permit,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connections_open.dec();
    }
}

/// HTTP/1 and HTTP/2 with bounded heads. hyper's own HTTP/1 header timeout is off: the
/// connection's watchdog keeps the header and idle clocks apart (see [`conn`]).
fn builder() -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    builder
}

/// Answer a connection past the cap, then close it without resetting it. Each step is
/// bounded by [`REFUSAL_LINGER`].
async fn refuse(mut stream: TcpStream, answer: &[u8]) {
    // The answer follows the request head: an HTTP client that receives an answer before it
    // has sent its request treats it as a broken connection, not as a 503. A silent client
    // gets the answer when the wait ends.
    let _ = tokio::time::timeout(REFUSAL_LINGER, read_head(&mut stream)).await;
    let written = tokio::time::timeout(REFUSAL_LINGER, stream.write_all(answer)).await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let _ = stream.shutdown().await;
    // Read what else the client sends until it closes (it will: the answer says so), so the
    // close is a FIN, not a reset that could discard the answer before the client reads it.
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Read until the end of a request head (`\r\n\r\n`), the end of the stream, or
/// [`MAX_HEADER_BYTES`].
async fn read_head(stream: &mut TcpStream) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_HEADER_BYTES {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return;
        }
    }
}

/// Errors that concern one connection only: skip it and accept the next at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Rate-limited logging of accept errors.
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    /// Errors since the last log line.
    unlogged: u64,
}

impl AcceptErrors {
    fn record(&mut self, e: &io::Error) {
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|at| now.duration_since(at) < ACCEPT_LOG_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            error = %e,
            errors = self.unlogged,
            backoff_ms = ACCEPT_BACKOFF.as_millis(),
            "accept failed (logged at most every {} s)",
            ACCEPT_LOG_INTERVAL.as_secs()
        );
        self.last_logged = Some(now);
        self.unlogged = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusals_are_well_formed_json_with_the_right_length() {
        for refusal in [REFUSAL, ADDRESS_REFUSAL] {
            refusal_is_well_formed(refusal);
        }
    }

    fn refusal_is_well_formed(refusal: &[u8]) {
        let text = std::str::from_utf8(refusal).expect("ascii");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("content-length")
            .parse()
            .expect("number");
        assert_eq!(length, body.len());
        let json: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(json["error"], "too_many_connections");
        assert!(head.starts_with("HTTP/1.1 503 "));
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_are_logged_once_per_interval() {
        let mut errors = AcceptErrors::default();
        let e = io::Error::from_raw_os_error(24); // EMFILE
        errors.record(&e);
        assert_eq!(errors.unlogged, 0, "the first error is logged");
        for _ in 0..1000 {
            errors.record(&e);
        }
        assert_eq!(errors.unlogged, 1000, "then counted, not logged");
        tokio::time::advance(ACCEPT_LOG_INTERVAL).await;
        errors.record(&e);
        assert_eq!(errors.unlogged, 0, "one line per interval, with the count");
        assert!(!is_per_connection(&e), "EMFILE backs off");
        assert!(is_per_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
    }
}
