//! The server loop under hostile connections: silent sockets, heads and bodies sent a byte at
//! a time, idle keep-alive, the connection cap, oversized heads, HTTP/2, and shutdown in
//! bounded time with slow clients still connected (the real binary and SIGTERM).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{ORIGIN, Options, TestApp, UA, event_id_at, pageview, spawn_app_with};

/// How a slow client behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slow {
    /// Connects and never sends a byte (owes its first head within the header timeout).
    Silent,
    /// Sends a request head a byte at a time, never finishing it.
    Head,
    /// Sends a complete head, then its body a byte at a time.
    Body,
}

/// What happened to a slow client.
#[derive(Debug)]
struct Ending {
    kind: Slow,
    /// From the client's connect to the server's close.
    after: Duration,
    /// What the server sent before closing.
    answer: String,
}

const TRICKLE_EVERY: Duration = Duration::from_millis(200);

fn slow_head(kind: Slow) -> &'static [u8] {
    match kind {
        Slow::Silent => b"",
        Slow::Head => b"POST /api/v1/hit HTTP/1.1\r\nHost: tally\r\nUser-Agent: ",
        Slow::Body => {
            b"POST /api/v1/hit HTTP/1.1\r\nHost: tally\r\nContent-Type: text/plain\r\n\
              Origin: https://blog.example\r\nContent-Length: 1000\r\n\r\n{"
        }
    }
}

/// Opens `count` connections at once, each sending what its kind sends; each reports when the
/// server closed it, failing past `limit`.
fn slow_clients(addr: SocketAddr, count: usize, limit: Duration) -> JoinSet<Ending> {
    let kinds = [Slow::Silent, Slow::Head, Slow::Body];
    let mut clients = JoinSet::new();
    for i in 0..count {
        let kind = kinds[i % kinds.len()];
        clients.spawn(async move {
            // Taken before the connect, so never after the server's accept.
            let start = Instant::now();
            let stream = TcpStream::connect(addr).await.expect("connect");
            slow_client(stream, start, kind, limit).await
        });
    }
    clients
}

/// Sends what `kind` sends (a byte per [`TRICKLE_EVERY`] after the first part) and reports
/// when the server closed the connection, failing past `limit`.
async fn slow_client(mut stream: TcpStream, start: Instant, kind: Slow, limit: Duration) -> Ending {
    let head = slow_head(kind);
    if !head.is_empty() {
        stream.write_all(head).await.expect("first part");
    }
    let (mut read, mut write) = stream.split();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    tick.tick().await;
    let end = start + limit;
    let mut sending = kind != Slow::Silent;
    loop {
        tokio::select! {
            got = read.read(&mut buf) => match got {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tick.tick(), if sending => {
                // Once the server has closed, a write fails; what it answered may still be
                // waiting to be read.
                sending = write.write_all(b"a").await.is_ok();
            }
            () = tokio::time::sleep_until(end) => panic!("{kind:?} client still connected after {limit:?}"),
        }
    }
    Ending {
        kind,
        after: start.elapsed(),
        answer: String::from_utf8_lossy(&answer).into_owned(),
    }
}

/// The soft open-file limit (raised to the hard one by the server when it started).
fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// A client that opens a fresh connection per request (pooled connections would hide the cap).
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(UA)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// Polls `probe` every 10 ms until it holds; panics after 30 s. (Every probe is a request to
/// the server under test: a tight loop would compete with what it measures.)
async fn poll_until<F, Fut>(probe: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut every = tokio::time::interval(Duration::from_millis(10));
    while !probe().await {
        assert!(
            Instant::now() < deadline,
            "condition not reached within 30 s"
        );
        every.tick().await;
    }
}

/// One line of `/metrics` as a number (0 when absent).
async fn metric(app: &TestApp, line: &str) -> f64 {
    app.metric(line).await.unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_connections_are_cut_on_time_while_a_normal_client_is_served() {
    // Long enough to open all of them before the first is cut (1 to 3 s in a debug build on a
    // busy 2-core machine), short enough to keep the test within seconds. The idle timeout
    // does not apply: none of these connections gets an answer it could idle after.
    const HEADER: Duration = Duration::from_secs(5);
    const BODY: Duration = Duration::from_secs(6);
    const IDLE: Duration = Duration::from_secs(60);
    /// Scheduling slack on a loaded 2-core machine (load average above 10 seen while testing).
    const SLACK: Duration = Duration::from_millis(2500);
    let app = spawn_app_with(Options {
        configure: |c| {
            c.server.header_timeout = HEADER;
            c.server.body_timeout = BODY;
            c.server.idle_timeout = IDLE;
            c.server.max_connections = 2000;
            // Every client of this test is one address.
            c.server.max_connections_per_address = 2000;
            c.server.max_requests_per_address = 2000;
        },
        ..Options::default()
    })
    .await;
    // Two descriptors per connection (both ends live in this process), leaving room for the
    // other tests of this binary.
    let fds = open_file_limit();
    let slow = usize::try_from(fds.saturating_sub(600) / 2)
        .unwrap_or(usize::MAX)
        .min(1000);
    assert!(slow >= 300, "open-file limit {fds} too low for this test");
    // The server loop runs (and has raised its accept backlog) before the flood starts.
    assert_eq!(app.get("/healthz").await.status(), 200);
    let opening = Instant::now();
    let mut clients = slow_clients(app.addr, slow, BODY + SLACK + SLACK);
    // Every slow connection has been accepted and is being served, none cut yet.
    poll_until(|| async { metric(&app, "tally_connections_open").await >= slow as f64 }).await;
    assert!(
        opening.elapsed() < HEADER,
        "opening {slow} connections took {:?}: the test cannot hold them all at once",
        opening.elapsed()
    );

    // A normal client, on a fresh connection, is answered promptly.
    let client = fresh_client();
    let started = Instant::now();
    let health = client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let hit = client
        .post(app.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .header("origin", ORIGIN)
        .body(pageview(&event_id_at(app.now()), None, "/normal").to_string())
        .send()
        .await
        .expect("hit");
    assert_eq!(hit.status(), 200);
    let status: Value = hit.json().await.expect("json");
    assert_eq!(status["status"], "accepted");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "a normal client waited {took:?} beside {slow} slow connections"
    );

    eprintln!(
        "{slow} slow connections opened in {:?}; normal client answered in {took:?}",
        opening.elapsed()
    );
    let mut cut = [0u32; 3];
    let mut latest = [Duration::ZERO; 3];
    while let Some(ending) = clients.join_next().await {
        let ending = ending.expect("slow client");
        let (limit, index) = match ending.kind {
            Slow::Silent => (HEADER, 0),
            Slow::Head => (HEADER, 1),
            Slow::Body => (BODY, 2),
        };
        cut[index] += 1;
        latest[index] = latest[index].max(ending.after.saturating_sub(limit));
        assert!(
            ending.after + Duration::from_millis(50) >= limit && ending.after <= limit + SLACK,
            "{:?} client cut after {:?}, limit {limit:?}",
            ending.kind,
            ending.after
        );
        match ending.kind {
            Slow::Silent | Slow::Head => assert_eq!(ending.answer, "", "closed without an answer"),
            Slow::Body => {
                assert!(
                    ending.answer.starts_with("HTTP/1.1 408 "),
                    "{}",
                    ending.answer
                );
                assert!(
                    ending.answer.contains("\"error\":\"request_timeout\""),
                    "{}",
                    ending.answer
                );
                assert!(
                    ending
                        .answer
                        .to_ascii_lowercase()
                        .contains("connection: close"),
                    "{}",
                    ending.answer
                );
            }
        }
    }
    eprintln!("cut (silent, head, body): {cut:?}, latest past the limit: {latest:?}");
    // Silent connections never sent a request: they count as header timeouts.
    let cut = [0, cut[0] + cut[1], cut[2]];
    for (reason, count) in ["idle_timeout", "header_timeout", "body_timeout"]
        .iter()
        .zip(cut)
    {
        let seen = metric(
            &app,
            &format!("tally_connections_cut_total{{reason=\"{reason}\"}}"),
        )
        .await;
        assert!(seen >= f64::from(count), "{reason}: {seen} < {count}");
    }
    // Nothing the slow clients sent was counted; the normal hit was.
    assert_eq!(app.counts("/normal").await.site.views, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_outlives_the_header_timeout() {
    const HEADER: Duration = Duration::from_millis(500);
    const IDLE: Duration = Duration::from_millis(1500);
    let app = spawn_app_with(Options {
        configure: |c| {
            c.server.header_timeout = HEADER;
            c.server.idle_timeout = IDLE;
        },
        ..Options::default()
    })
    .await;
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    let request = b"GET /healthz HTTP/1.1\r\nHost: tally\r\n\r\n";
    stream.write_all(request).await.expect("first request");
    let first = read_answer(&mut stream).await;
    assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
    // Idle past the header timeout (the scenario, not a synchronisation): still open.
    tokio::time::sleep(HEADER * 2).await;
    stream.write_all(request).await.expect("second request");
    let second = read_answer(&mut stream).await;
    assert!(second.starts_with("HTTP/1.1 200 "), "{second}");
    let idle_from = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(IDLE * 3, stream.read_to_end(&mut rest)).await;
    let idle = idle_from.elapsed();
    assert!(closed.is_ok(), "still open after {idle:?}");
    assert!(rest.is_empty(), "nothing more is sent");
    assert!(
        idle + Duration::from_millis(50) >= IDLE && idle <= IDLE + Duration::from_secs(1),
        "idle connection closed after {idle:?}, idle timeout {IDLE:?}"
    );
}

/// Reads one answer with a `content-length` body.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("answer within 5 s")
            .expect("read");
        assert!(n > 0, "closed mid-answer: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_a_client_is_refused_clearly_and_served_again_once_connections_close() {
    const CAP: usize = 50;
    let app = spawn_app_with(Options {
        configure: |c| {
            c.server.max_connections = CAP;
            c.server.idle_timeout = Duration::from_secs(30);
        },
        ..Options::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(TcpStream::connect(app.addr).await.expect("connect"));
    }
    let client = fresh_client();
    // Once the server has taken all CAP, a new connection gets the refusal.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let r = client
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("answer");
        if r.status() == 503 {
            break r;
        }
        assert!(Instant::now() < deadline, "never refused at the cap");
        tokio::task::yield_now().await;
    };
    let header = |name: &str| {
        refused
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(header("connection").as_deref(), Some("close"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    let body: Value = refused.json().await.expect("json body");
    assert_eq!(body["error"], "too_many_connections");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));

    // The held connections close: new ones are served again.
    drop(held);
    poll_until(|| async {
        // Refusals beyond the ones that wait for the request can reach a client before its
        // request: reqwest reports those as errors. Only a 200 ends the wait.
        let r = client.get(app.url("/healthz")).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(metric(&app, "tally_connections_refused_total{reason=\"cap\"}").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_kb_header_is_refused_before_any_handler() {
    let app = spawn_app_with(Options::default()).await;
    let body = pageview(&event_id_at(app.now()), None, "/big").to_string();
    let request = |user_agent: &str| {
        format!(
            "POST /api/v1/hit HTTP/1.1\r\nHost: tally\r\nContent-Type: text/plain\r\n\
             Origin: {ORIGIN}\r\nUser-Agent: {user_agent}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let huge = format!("{UA} {}", "x".repeat(100 * 1024));
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    // The server may close before all of it is written: that is one of the allowed outcomes.
    let _ = stream.write_all(request(&huge).as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("closed within 5 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431 "),
        "{answer}"
    );
    // No handler saw it: nothing counted, nothing rejected.
    assert_eq!(app.counts("/big").await.site.views, 0);
    let metrics = app.metrics().await;
    // Every known code is listed at 0 from the start: none may have moved.
    let moved = metrics
        .lines()
        .filter(|l| l.starts_with("tally_rejected_total{"))
        .any(|l| !l.ends_with(" 0"));
    assert!(!moved, "a handler saw the request: {metrics}");
    // The same request with a normal user agent is counted: the size alone refused it.
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    stream
        .write_all(request(UA).as_bytes())
        .await
        .expect("write");
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(app.counts("/big").await.site.views, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_is_served_and_counted() {
    use axum::body::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let app = spawn_app_with(Options::default()).await;
    let stream = TcpStream::connect(app.addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let body = pageview(&event_id_at(app.now()), None, "/h2").to_string();
    let request = hyper::Request::post(app.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .header("origin", ORIGIN)
        .header("user-agent", UA)
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("h2 answer");
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["status"], "accepted", "{v}");
    assert_eq!(app.counts("/h2").await.site.views, 1);
    drop(sender);
    let _ = driver.await;
}

/// `tally serve` on port 0 with short limits; returns the child and its base URL.
async fn start_binary(db: &std::path::Path, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["serve", "--listen", "127.0.0.1:0", "--auto-sites"])
        .args(["--rate-limit-per-minute", "0", "--db"])
        .arg(db)
        .args(args)
        .env("TALLY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn tally");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("a line");
    let base = line
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    (child, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_exits_within_the_grace_period() {
    const GRACE: Duration = Duration::from_secs(2);
    const SLOW: usize = 150;
    // The slow ones, the request in flight, the pooled connection of the hits, the probe.
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("shutdown.sqlite");
    let (mut child, base) = start_binary(
        &db,
        &[
            "--shutdown-grace-secs",
            "2",
            "--header-timeout-secs",
            "60",
            "--body-timeout-secs",
            "60",
            "--idle-timeout-secs",
            "60",
            // Every client of this test is one address.
            "--max-connections-per-address",
            "1000",
        ],
    )
    .await;
    let addr: SocketAddr = base
        .strip_prefix("http://")
        .expect("http base")
        .parse()
        .expect("address");
    let hit = |id: &str| {
        serde_json::json!({"site": "down", "type": "pageview", "event_id": id,
            "url": "https://down.example/p", "referrer": null})
        .to_string()
    };
    // Hits answered before the signal (over pooled keep-alive connections that stay open).
    let client = crate::support::client();
    for _ in 0..5 {
        let r = client
            .post(format!("{base}/api/v1/hit"))
            .header("content-type", "text/plain")
            .body(hit(&uuid::Uuid::now_v7().to_string()))
            .send()
            .await
            .expect("hit");
        assert_eq!(r.status(), 200);
    }
    // Slow clients that the timeouts (60 s) would not cut before the grace ends.
    let mut slow = slow_clients(addr, SLOW, Duration::from_secs(30));
    // A request in flight: head and half its body now, the rest after the signal.
    let body = hit(&uuid::Uuid::now_v7().to_string());
    let (first, second) = body.split_at(body.len() / 2);
    let mut in_flight = TcpStream::connect(addr).await.expect("connect");
    in_flight
        .write_all(
            format!(
                "POST /api/v1/hit HTTP/1.1\r\nHost: tally\r\nContent-Type: text/plain\r\n\
                 User-Agent: {UA}\r\nContent-Length: {}\r\n\r\n{first}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("first half");
    let probe = fresh_client();
    let open_now = || async {
        let text = probe
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        text.lines()
            .find_map(|l| l.strip_prefix("tally_connections_open "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    poll_until(|| async { open_now().await >= (SLOW + 3) as f64 }).await;

    let pid = rustix::process::Pid::from_raw(
        i32::try_from(child.id().expect("running")).expect("pid fits"),
    )
    .expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let signalled = Instant::now();
    // New connections are no longer accepted.
    let deadline = signalled + Duration::from_secs(1);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::task::yield_now().await;
    }
    // The request in flight finishes and is answered.
    in_flight
        .write_all(second.as_bytes())
        .await
        .expect("second half");
    let answer = read_answer(&mut in_flight).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.contains("\"status\":\"accepted\""), "{answer}");

    let status = tokio::time::timeout(GRACE + Duration::from_secs(3), child.wait())
        .await
        .expect("exited within the grace period and 3 s")
        .expect("reaped");
    let took = signalled.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took + Duration::from_millis(100) >= GRACE,
        "exited after {took:?}: slow clients were not given the grace period"
    );
    assert!(
        took <= GRACE + Duration::from_millis(1500),
        "exited {took:?} after SIGTERM, grace {GRACE:?}"
    );
    // Every slow client was disconnected by the exit, none by a timeout.
    while let Some(ending) = slow.join_next().await {
        let ending = ending.expect("slow client");
        assert!(
            ending.after < Duration::from_secs(30),
            "{:?} still connected",
            ending.kind
        );
    }
    // The five answered hits and the one in flight were committed.
    let events: i64 = rusqlite::Connection::open(&db)
        .expect("open")
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .expect("count");
    assert_eq!(events, 6);
}
