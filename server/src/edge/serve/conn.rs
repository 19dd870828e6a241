//! One connection, served until it ends, times out, or shutdown cuts it.
//!
//! Contract:
//! - A new connection must deliver its first request head within `header_timeout` of its
//!   accept (a silent socket is a slowloris too). After an answer, with no request open, it is
//!   closed `idle_timeout` after that answer, or `header_timeout` after the first byte that
//!   followed, whichever phase it is in: the first rule bounds idle keep-alive connections,
//!   the second a request head sent byte by byte. Both clocks are kept here, over the socket,
//!   for HTTP/1 and HTTP/2 alike: hyper's own HTTP/1 `header_read_timeout` starts as soon as a
//!   connection goes idle, so it cannot tell a 10 s header budget from a 75 s keep-alive (see
//!   `connections::idle_keep_alive_outlives_the_header_timeout`).
//! - A request's body must arrive within `body_timeout` of its head (see [`super::body`]).
//! - Handlers see the peer as `ConnectInfo<SocketAddr>` in the request extensions.
//! - On shutdown, hyper's graceful shutdown runs (HTTP/1 closes once idle, HTTP/2 sends GOAWAY)
//!   while requests in flight finish; the server drops what is left after the grace period.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use super::ServerConfig;
use super::activity::Activity;
use super::body::{Answer, TimedBody, request_timeout, too_many_requests};
use super::share::ConnectionShare;
use crate::metrics::{Metrics, ReasonLabel};

/// What every connection of one server shares.
pub(crate) struct Shared {
    /// HTTP/1 and HTTP/2 settings (header size bounds); built once.
    pub builder: Builder<TokioExecutor>,
    /// The application; cloned per request (an `Arc` inside).
    pub router: Router,
    pub config: ServerConfig,
    pub metrics: Arc<Metrics>,
}

/// Serve one accepted connection until it ends, its watchdog expires it, or it is dropped.
pub(crate) async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    share: ConnectionShare,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new(Instant::now()));
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
        blocked: false,
    });
    let service = ConnService {
        router: shared.router.clone(),
        peer,
        share: Arc::new(share),
        activity: Arc::clone(&activity),
        body_timeout: shared.config.body_timeout,
        metrics: Arc::clone(&shared.metrics),
    };
    let conn = shared.builder.serve_connection(io, service);
    tokio::pin!(conn);
    // The watchdog looks at the phase no later than `recheck` after its last look: no change
    // made since can have set a deadline earlier than that (see [`Activity`]).
    let config = &shared.config;
    let recheck = config
        .header_timeout
        .min(config.idle_timeout)
        .min(config.answer_timeout);
    let watchdog = tokio::time::sleep(recheck);
    tokio::pin!(watchdog);
    let mut stopping = false;
    loop {
        let now = Instant::now();
        let (at, why) = activity.deadline(config);
        if at <= now {
            tracing::debug!(reason = why.reason(), "closing connection");
            shared
                .metrics
                .connections_cut
                .get_or_create(&ReasonLabel {
                    reason: why.reason(),
                })
                .inc();
            return;
        }
        watchdog.as_mut().reset(at.min(now + recheck));
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = &mut watchdog => {}
        }
    }
}

/// The socket, telling the phase clock when bytes arrive and when writes wait on the client.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    /// The last write could not proceed (only changes reach the shared clock).
    blocked: bool,
}

impl Watched {
    /// Note whether a write went through.
    fn wrote<T>(&mut self, polled: Poll<T>) -> Poll<T> {
        let blocked = polled.is_pending();
        if blocked != self.blocked {
            self.blocked = blocked;
            self.activity.write_blocked(blocked);
        }
        polled
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.wrote(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The per-connection service: the peer address, its share, the body deadline, the
/// open-request guard.
#[derive(Clone)]
struct ConnService {
    router: Router,
    peer: SocketAddr,
    share: Arc<ConnectionShare>,
    activity: Arc<Activity>,
    body_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Answer>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let now = Instant::now();
        let guard = self.activity.request_started(now);
        let version = request.version();
        let Some(slot) = self.share.request() else {
            // The address holds its whole share of open requests: answered at once, without
            // reading the body or reaching the application.
            self.metrics.requests_refused.inc();
            let response = too_many_requests(version);
            return Box::pin(async move { Ok(response.map(|b| Answer::new(b, guard, None))) });
        };
        let timed_out = Arc::new(AtomicBool::new(false));
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(ConnectInfo(self.peer));
        let deadline = now + self.body_timeout;
        let body = TimedBody::new(body, deadline, Arc::clone(&timed_out));
        let request = Request::from_parts(parts, Body::new(body));
        let router = self.router.clone();
        let body_timeout = self.body_timeout;
        let metrics = Arc::clone(&self.metrics);
        Box::pin(async move {
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let response = if timed_out.load(Ordering::Acquire) {
                metrics
                    .connections_cut
                    .get_or_create(&ReasonLabel {
                        reason: "body_timeout",
                    })
                    .inc();
                request_timeout(version, body_timeout)
            } else {
                response
            };
            Ok(response.map(|body| Answer::new(body, guard, slot)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::serve::activity::Expiry;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// One connection served on loopback under `config`; returns the client's socket.
    async fn one_connection(config: ServerConfig) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let shared = Arc::new(Shared {
            builder: super::super::builder(),
            router: Router::new().route("/", axum::routing::get(|| async { "ok" })),
            config,
            metrics: Arc::new(Metrics::new()),
        });
        tokio::spawn(async move {
            let (stream, peer) = listener.accept().await.expect("accept");
            let (_stop_tx, stop) = watch::channel(false);
            let shares = super::super::share::AddressShares::new(
                1,
                8,
                crate::core::forwarded::TrustedProxies::none(),
            );
            let share = shares.connect(peer.ip()).expect("a share");
            serve_connection(stream, peer, share, shared, stop).await;
        });
        TcpStream::connect(addr).await.expect("connect")
    }

    /// Read until the server closes the connection; returns everything read.
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&all).into_owned(),
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Send one request and read its whole answer (the test router's body is `ok`).
    async fn exchange(stream: &mut TcpStream) {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("write");
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        while !all.ends_with(b"ok") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before the answer");
            all.extend_from_slice(&buf[..n]);
        }
    }

    // The watchdog is never signalled: these pin that it still cuts each connection at the
    // deadline its phase sets, not at one it saw earlier (paused time: exact to the tick).
    // With the watchdog waiting for the idle deadline it last saw, the first fails (25 s).
    #[tokio::test(start_paused = true)]
    async fn a_head_begun_after_a_long_quiet_spell_is_cut_at_its_own_deadline() {
        let config = config();
        let mut client = one_connection(config).await;
        exchange(&mut client).await;
        // Quiet for 50 s: the idle deadline (75 s) is still ahead when a head begins.
        tokio::time::sleep(Duration::from_secs(50)).await;
        client.write_all(b"GET / HT").await.expect("write");
        let head = Instant::now();
        assert_eq!(
            read_to_close(&mut client).await,
            "",
            "a head never finished"
        );
        assert_eq!(
            head.elapsed(),
            config.header_timeout,
            "cut when the new head's header timeout ran out, not at the idle deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_cut_when_its_idle_time_runs_out() {
        let config = config();
        let mut client = one_connection(config).await;
        exchange(&mut client).await;
        let quiet = Instant::now();
        assert_eq!(read_to_close(&mut client).await, "");
        assert_eq!(quiet.elapsed(), config.idle_timeout);
    }

    fn config() -> ServerConfig {
        ServerConfig {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
            ..ServerConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_follows_the_phase() {
        let config = config();
        let start = Instant::now();
        let activity = Arc::new(Activity::new(start));
        let first_head = (start + config.header_timeout, Expiry::Header);
        assert_eq!(
            activity.deadline(&config),
            first_head,
            "a new connection owes its first head within the header timeout"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.bytes_arrived();
        assert_eq!(
            activity.deadline(&config),
            first_head,
            "bytes do not extend it"
        );
        let first = Instant::now();
        let request = activity.request_started(first);
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = activity.request_started(Instant::now());
        assert_eq!(
            activity.deadline(&config),
            (first + config.answer_timeout, Expiry::Answer),
            "while answering, the oldest open request's answer clock runs"
        );
        activity.bytes_arrived();
        drop(request);
        assert_eq!(
            activity.deadline(&config),
            (
                first + Duration::from_secs(1) + config.answer_timeout,
                Expiry::Answer
            ),
            "then the next oldest"
        );
        tokio::time::advance(Duration::from_secs(40)).await;
        drop(second);
        let quiet = start + Duration::from_secs(46);
        assert_eq!(
            activity.deadline(&config),
            (quiet + config.idle_timeout, Expiry::Idle),
            "the idle clock starts when the last answer is sent"
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        activity.bytes_arrived();
        let head = quiet + Duration::from_secs(30);
        assert_eq!(
            activity.deadline(&config),
            (head + config.header_timeout, Expiry::Header),
            "the first byte of the next head starts the header clock"
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        activity.bytes_arrived();
        assert_eq!(
            activity.deadline(&config),
            (head + config.header_timeout, Expiry::Header),
            "later bytes of the head do not extend it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_on_the_client_runs_its_own_clock() {
        let config = config();
        let start = Instant::now();
        let activity = Arc::new(Activity::new(start));
        let guard = activity.request_started(start);
        drop(guard);
        // The answer sits in the socket's buffer; the client reads nothing.
        activity.write_blocked(true);
        assert_eq!(
            activity.deadline(&config),
            (start + config.answer_timeout, Expiry::Stalled),
            "a blocked write ends the connection before its idle time would"
        );
        tokio::time::advance(Duration::from_secs(20)).await;
        activity.write_blocked(false);
        assert_eq!(
            activity.deadline(&config),
            (start + config.idle_timeout, Expiry::Idle),
            "a write that went through stops the clock"
        );
    }
}
