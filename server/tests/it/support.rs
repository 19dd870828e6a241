//! `spawn_app()` and helpers shared by the integration tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Value, json};
use tally::core::clock::{Clock, ManualClock};
use tally::core::day::SiteZone;
use tally::core::ids::{EventId, SiteId};
use tally::ops::config::ServeConfig;
use tally::store::{Site, Store};
use tally_wire::Counts;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A browser-like user agent (empty and bot-like agents are filtered).
pub const UA: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36";
/// The origin allowed for the test site `blog`.
pub const ORIGIN: &str = "https://blog.example";

pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub store: Arc<dyn Store>,
    pub db: PathBuf,
    /// Keeps the database directory alive for the test.
    pub _dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(UA)
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

/// Settings a test may change before the app starts.
pub struct Options {
    pub at: Timestamp,
    pub zone: &'static str,
    pub configure: fn(&mut ServeConfig),
}

impl Default for Options {
    fn default() -> Self {
        Self {
            at: Timestamp::now(),
            zone: "UTC",
            configure: |_| {},
        }
    }
}

/// Turn every per-address limit off (load tests send everything from one address).
pub fn unlimited(c: &mut ServeConfig) {
    c.rate_limit_per_minute = 0;
    c.address_limit_per_minute = 0;
    c.new_sites_per_hour = 0;
}

/// A client whose requests come from another loopback address (`127.0.0.x`): another
/// client network for the per-address limits.
pub fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(UA)
        .local_address(Some(ip.parse().expect("ip")))
        .build()
        .expect("client")
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

pub async fn spawn_app_with(options: Options) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("tally.sqlite");
    let mut config = ServeConfig::for_db(&db);
    (options.configure)(&mut config);
    let store = tally::open_store(&config).await.expect("store");
    store
        .put_site(&Site {
            id: SiteId::parse("blog").expect("id"),
            origins: vec![ORIGIN.into()],
            zone: SiteZone::parse(options.zone).expect("zone"),
            public: true,
            ingest_key: None,
        })
        .await
        .expect("site");
    let clock = ManualClock::new(options.at);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(tally::run(
        listener,
        config,
        Arc::clone(&store),
        Arc::clone(&clock) as Arc<dyn Clock>,
        async move {
            let _ = rx.await;
        },
    ));
    TestApp {
        addr,
        client: client(),
        clock,
        store,
        db,
        _dir: dir,
        shutdown: Some(tx),
        server: Some(server),
    }
}

/// Polls `probe` until it is true; panics after 30 s (a condition wait, not a sleep-as-sync).
pub async fn wait_until<F, Fut>(probe: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !probe().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached within 30 s"
        );
        tokio::task::yield_now().await;
    }
}

/// A UUIDv7 event id whose time is `at`.
pub fn event_id_at(at: Timestamp) -> String {
    let random: [u8; 10] = uuid::Uuid::new_v4().as_bytes()[..10]
        .try_into()
        .expect("10 bytes");
    EventId::new_at(at, random).uuid().to_string()
}

pub fn pageview(event_id: &str, visitor: Option<&str>, path: &str) -> Value {
    json!({
        "site": "blog", "type": "pageview", "event_id": event_id, "visitor_id": visitor,
        "url": format!("https://blog.example{path}?utm_source=x"), "referrer": "https://news.example/x?y=1"
    })
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// POST a hit as a beacon would (text/plain) from the allowed origin.
    pub async fn post_hit(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/api/v1/hit"))
            .header("content-type", "text/plain;charset=UTF-8")
            .header("origin", ORIGIN)
            .body(body.to_string())
            .send()
            .await
            .expect("request")
    }

    /// POST a fresh anonymous page view of `path` with the user agent `ua` (empty: none).
    pub async fn post_view_as(&self, ua: &str, path: &str) -> reqwest::Response {
        let body = pageview(&event_id_at(self.now()), None, path).to_string();
        self.client
            .post(self.url("/api/v1/hit"))
            .header("user-agent", ua)
            .header("content-type", "text/plain")
            .header("origin", ORIGIN)
            .body(body)
            .send()
            .await
            .expect("request")
    }

    /// POST a hit and return its `status`.
    pub async fn hit_status(&self, body: &Value) -> String {
        let r = self.post_hit(body).await;
        assert_eq!(r.status(), 200, "hit answered {}", r.status());
        let v: Value = r.json().await.expect("json");
        v["status"].as_str().expect("status").to_owned()
    }

    /// GET a path on the app (browser user agent, no origin).
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request")
    }

    /// Counters must equal their recount from raw events.
    pub async fn assert_no_drift(&self) {
        let report = self.store.verify(false).await.expect("verify");
        assert!(report.drift.is_empty(), "drift: {:?}", report.drift);
    }

    /// The value of one metric line (`name` with its labels), if present.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        metric_value(&self.metrics().await, name)
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        self.get("/metrics")
            .await
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn counts(&self, page: &str) -> Counts {
        let r = self
            .client
            .get(self.url(&format!("/api/v1/counts?site=blog&page={page}")))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
        r.json().await.expect("counts json")
    }

    /// Stop accepting, commit what is queued, and wait for the server to finish.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("join").expect("server result");
        }
    }
}

/// A real `tally serve` process on a fresh database (for RSS, signals and files).
pub struct Binary {
    pub child: tokio::process::Child,
    pub base: String,
    pub db: PathBuf,
    pub _dir: tempfile::TempDir,
}

impl Binary {
    /// Start `tally serve` on port 0 with `args` after `serve`; waits for its address.
    pub async fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("tally.sqlite");
        Self::start_on(dir, db, args).await
    }

    /// Start on the database `tally.sqlite` in an existing directory (kept after the test).
    pub async fn start_in(dir: &std::path::Path, args: &[&str]) -> Self {
        let keep = tempfile::tempdir().expect("tempdir");
        Self::start_on(keep, dir.join("tally.sqlite"), args).await
    }

    /// Start on `db`, keeping `dir` alive as long as the process.
    pub async fn start_on(dir: tempfile::TempDir, db: PathBuf, args: &[&str]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tally"))
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("TALLY_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn tally");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = lines.next_line().await.expect("read").expect("a line");
        let base = line
            .strip_prefix("listening on ")
            .expect("listening line")
            .to_owned();
        Self {
            child,
            base,
            db,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The body of `GET path` as text (e.g. `/metrics`).
    pub async fn text(&self, path: &str) -> String {
        client()
            .get(self.url(path))
            .send()
            .await
            .expect("request")
            .text()
            .await
            .expect("text")
    }

    /// A `/proc/<pid>/status` value in KiB (`VmRSS`, `VmHWM`).
    pub fn proc_kib(&self, field: &str) -> u64 {
        let pid = self.child.id().expect("running");
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .expect("field")
    }

    /// SIGTERM, and wait for the process to finish; returns the database directory, kept.
    pub async fn stop(mut self) -> tempfile::TempDir {
        let pid = self.child.id().expect("running");
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let status = self.child.wait().await.expect("wait");
        assert!(status.success(), "tally exited with {status}");
        self._dir
    }
}

/// The value of the metric line `name` (with its labels, if any) in a `/metrics` text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// The URL of a service the tests need from the environment variable `var`. Unset: a loud
/// "SKIPPED" on stderr (past the test harness's capture) and `None`, except under `CI=true`,
/// where a missing service is a failure, never a skip.
pub fn service_url(var: &str, example: &str) -> Option<String> {
    let url = std::env::var(var).ok().filter(|u| !u.is_empty());
    if url.is_none() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        assert!(
            !ci,
            "CI=true but {var} is not set (e.g. {example}): this test must run in CI"
        );
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: set {var} (e.g. {example}) to run this test; .ci/run sets it"
        );
    }
    url
}

/// The test PostgreSQL (`TALLY_TEST_POSTGRES`), see [`service_url`].
pub fn postgres_url() -> Option<String> {
    service_url(
        "TALLY_TEST_POSTGRES",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// The test Redis (`TALLY_TEST_REDIS`), see [`service_url`].
pub fn redis_url() -> Option<String> {
    service_url("TALLY_TEST_REDIS", "redis://127.0.0.1:6379")
}

/// Delete every Redis key under `prefix` (a test's own); returns how many there were.
pub fn redis_cleanup(url: &str, prefix: &str) -> usize {
    let client = ::redis::Client::open(url).expect("redis url");
    let mut conn = client.get_connection().expect("redis");
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut conn)
        .expect("keys");
    if !keys.is_empty() {
        let _: u64 = ::redis::cmd("DEL")
            .arg(&keys)
            .query(&mut conn)
            .expect("del");
    }
    keys.len()
}

/// POST `body` to a real binary's `/api/v1/hit` (as the snippet does: `text/plain`).
pub async fn post_hit(
    http: &reqwest::Client,
    server: &Binary,
    body: &serde_json::Value,
) -> reqwest::Response {
    http.post(server.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .body(body.to_string())
        .send()
        .await
        .expect("request")
}

/// A Redis URL for the Redis at `url` behind a TCP proxy on a loopback port that holds every
/// chunk Redis sends back for `delay` before passing it on: a Redis that answers, but too
/// late. Requests pass at once.
pub async fn slow_redis(url: &str, delay: std::time::Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = url
        .trim_start_matches("redis://")
        .split(['/', '?'])
        .next()
        .and_then(|hostport| {
            use std::net::ToSocketAddrs;
            hostport.to_socket_addrs().ok()?.next()
        })
        .expect("a host:port in the Redis URL");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = server_rx.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    if client_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    format!("redis://{addr}/")
}
