//! Email reports end to end, against the real SMTP server of `smtp.rs`: `--now` from the CLI
//! delivers a multipart message with the right numbers; a schedule sends once when its week
//! ends (ManualClock), not again after a restart, and once with two collectors on one
//! PostgreSQL database; a refused send is retried after its backoff and shows in `/metrics`;
//! STARTTLS and implicit TLS deliver with the test CA trusted (and fail without it); a bad
//! `--smtp` URL stops `tally serve` with a clear error that never repeats the password.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::Date;
use tally::core::clock::{Clock, ManualClock};
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, PagePath, SiteId, VisitorKey};
use tally::core::period::{Every, Period};
use tally::core::record::{Record, Source};
use tally::ops::config::ServeConfig;
use tally::ops::report::mail::{MailSettings, Mailer};
use tally::store::{ReportSchedule, Site, Store};
use tokio::process::Command;

use crate::smtp::{Received, SmtpServer};
use crate::support::{client, metric_value, wait_until};

fn blog() -> SiteId {
    SiteId::parse("blog").expect("id")
}

async fn add_site(store: &dyn Store) {
    store
        .put_site(&Site {
            id: blog(),
            origins: vec!["https://blog.example".into()],
            zone: SiteZone::utc(),
            public: true,
            ingest_key: None,
        })
        .await
        .expect("site");
}

fn view(n: u8, visitor: u8, page: &str, at: Timestamp, referrer: Option<&str>) -> Record {
    Record {
        event_id: EventId::new_at(at, [n; 10]),
        site: blog(),
        source: Source::Web,
        kind: HitKind::Pageview,
        page: PagePath::parse(page).expect("page"),
        visitor: VisitorKey([visitor; 16]),
        at_ms: at.as_millisecond(),
        day: SiteZone::utc().day_of(at),
        referrer: referrer.map(Into::into),
        dims: Default::default(),
    }
}

fn at(day: Date, offset_days: i64, hh_mm: &str) -> Timestamp {
    let day = day
        .checked_add(jiff::Span::new().days(offset_days))
        .expect("day");
    format!("{day}T{hh_mm}:00Z").parse().expect("ts")
}

/// Views of the week starting `first` and of the week before: 4 views, 2 visitors, 3 visits
/// (/a 3, /b 1; one from news.example) against 2 views, 1 visitor, 1 visit.
async fn seed_two_weeks(store: &dyn Store, first: Date) {
    store
        .commit(vec![
            view(1, 1, "/a", at(first, 0, "10:00"), None),
            view(2, 1, "/b", at(first, 0, "10:10"), None),
            view(3, 1, "/a", at(first, 1, "10:00"), None),
            view(
                4,
                2,
                "/a",
                at(first, 2, "12:00"),
                Some("https://news.example/item"),
            ),
            view(5, 3, "/a", at(first, -7, "09:00"), None),
            view(6, 3, "/a", at(first, -7, "09:05"), None),
        ])
        .await
        .expect("seed");
}

/// The text and HTML parts of a received message (checked to be multipart/alternative).
fn parts(message: &Received) -> (String, String) {
    let parsed = mailparse::parse_mail(message.data.as_bytes()).expect("parse");
    assert_eq!(parsed.ctype.mimetype, "multipart/alternative");
    let part = |mime: &str| {
        parsed
            .subparts
            .iter()
            .find(|p| p.ctype.mimetype == mime)
            .unwrap_or_else(|| panic!("no {mime} part"))
            .get_body()
            .expect("body")
    };
    (part("text/plain"), part("text/html"))
}

fn tally_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
    cmd.env_remove("TALLY_DB")
        .env_remove("TALLY_SMTP")
        .env("TALLY_LOG", "warn")
        .kill_on_drop(true);
    cmd
}

async fn run(args: &[&str]) -> (bool, String) {
    let out = tally_cmd().args(args).output().await.expect("run tally");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_now_from_the_cli_delivers_a_multipart_summary_with_the_right_numbers() {
    let smtp = SmtpServer::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let week = Period::last_complete(Every::Week, SiteZone::utc().day_of(Timestamp::now()));
    {
        let store = tally::open_store(&ServeConfig::for_db(&db))
            .await
            .expect("store");
        add_site(store.as_ref()).await;
        seed_two_weeks(store.as_ref(), week.first).await;
    }
    let db_arg = db.to_str().expect("path");
    let (ok, out) = run(&[
        "--db",
        db_arg,
        "site",
        "report",
        "blog",
        "--to",
        "ann@example.com",
        "--now",
        "--smtp",
        &smtp.plain_url(),
        "--mail-from",
        "Reports <reports@blog.example>",
    ])
    .await;
    assert!(ok, "{out}");
    assert!(out.contains(&week.first.to_string()), "{out}");
    let messages = smtp.messages();
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(
        (m.from.as_str(), m.to.as_slice()),
        ("reports@blog.example", &["ann@example.com".to_owned()][..])
    );
    assert!(
        m.data
            .contains(&format!("Subject: Tally: blog, week of {}", week.first)),
        "{}",
        m.data
    );
    let (text, html) = parts(m);
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("Views"), "Views 4 +100 % (was 2)");
    assert_eq!(line("Visitors"), "Visitors 2 +100 % (was 1)");
    assert_eq!(line("Visits"), "Visits 3 +200 % (was 1)");
    assert_eq!(line("       3"), "3 +50 % /a", "/a: 3 views against 2");
    assert_eq!(line("       1"), "1 new /b");
    assert!(text.contains("new  news.example"), "{text}");
    assert!(text.contains("raw events"), "the visits note: {text}");
    for needle in ["blog", "+200 %", "+50 %", "/a", "news.example", "(was 2)"] {
        assert!(html.contains(needle), "{needle} in {html}");
    }
    assert!(
        !html.contains("<link") && !html.contains("<script"),
        "no external assets"
    );
    // --now leaves the schedule alone.
    let (ok, out) = run(&["--db", db_arg, "site", "report", "blog"]).await;
    assert!(ok && out.trim().is_empty(), "{out}");
}

#[tokio::test]
async fn the_report_cli_adds_lists_and_stops_schedules_and_checks_its_input() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    {
        let store = tally::open_store(&ServeConfig::for_db(&db))
            .await
            .expect("store");
        add_site(store.as_ref()).await;
    }
    let db = db.to_str().expect("path");
    let report = |args: &'static [&'static str]| {
        let mut all = vec!["--db", db, "site", "report", "blog"];
        all.extend_from_slice(args);
        async move { run(&all).await }
    };
    let (ok, out) = report(&["--to", "ann@example.com", "--every", "week"]).await;
    assert!(ok && out.contains("added"), "{out}");
    let (ok, out) = report(&["--to", "bob@example.com", "--every", "month"]).await;
    assert!(ok, "{out}");
    let (ok, out) = report(&[]).await;
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "blog\tweek\tann@example.com",
            "blog\tmonth\tbob@example.com"
        ]
    );
    let (ok, out) = report(&["--to", "ann@example.com", "--every", "week", "--stop"]).await;
    assert!(ok && out.contains("removed"), "{out}");
    let (ok, out) = report(&[]).await;
    assert_eq!((ok, out.trim()), (true, "blog\tmonth\tbob@example.com"));
    for (args, says) in [
        (
            &["--to", "not an address", "--every", "week"][..],
            "not an email address",
        ),
        (
            &["--to", "ann@example.com", "--every", "fortnight"][..],
            "fortnight",
        ),
        (
            &["--to", "ann@example.com", "--every", "week", "--stop"][..],
            "no week report",
        ),
        (&["--to", "ann@example.com", "--now"][..], "--smtp"),
    ] {
        let (ok, out) = report(args).await;
        assert!(!ok && out.contains(says), "{args:?}: {out}");
    }
    let (ok, out) = run(&["--db", db, "site", "report", "nosuch"]).await;
    assert!(!ok && out.contains("no site nosuch"), "{out}");
}

#[tokio::test]
async fn a_bad_smtp_url_stops_serve_with_a_clear_error_without_the_password() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let db = db.to_str().expect("path");
    for (url, says) in [
        (
            "smtp://ann:hunter2@mail.example.com:25?tls=none",
            "only for a relay on this machine",
        ),
        ("smtpx://ann:hunter2@mail.example.com", "not smtp or smtps"),
        ("smtp://ann:hunter2@", "host"),
    ] {
        let (ok, out) = run(&[
            "--db",
            db,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--smtp",
            url,
        ])
        .await;
        assert!(!ok, "{url}: {out}");
        assert!(out.contains(says), "{url}: {out}");
        assert!(!out.contains("hunter2"), "{url}: {out}");
    }
    let out = tally_cmd()
        .args(["--db", db, "serve", "--listen", "127.0.0.1:0"])
        .env("TALLY_SMTP", "smtp://ann:hunter2@mail.example.com?tls=none")
        .output()
        .await
        .expect("run");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("tls=none") && !text.contains("hunter2"),
        "{text}"
    );
}

/// One collector run in this process on `config`'s database, with the shared `clock`.
struct Collector {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Collector {
    async fn start(config: ServeConfig, store: Arc<dyn Store>, clock: Arc<ManualClock>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tally::run(
            listener,
            config,
            store,
            clock as Arc<dyn Clock>,
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = client()
            .get(format!("http://{}/metrics", self.addr))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        metric_value(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// Waits until the report task has made `n` more passes over the schedules.
    async fn passes(&self, n: f64) {
        let start = self.metric("tally_report_checks_total").await;
        wait_until(|| async { self.metric("tally_report_checks_total").await >= start + n }).await;
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await.expect("join").expect("run");
    }
}

fn reporting(db: &Path, smtp: &SmtpServer) -> ServeConfig {
    let mut config = ServeConfig::for_db(db);
    config.mail = Some(MailSettings::resolve(&smtp.plain_url().into(), None, None).expect("mail"));
    config.report_interval = Duration::from_millis(20);
    config
}

fn weekly(created: Timestamp) -> ReportSchedule {
    ReportSchedule {
        site: blog(),
        recipient: "ann@example.com".into(),
        every: Every::Week,
        created_ms: created.as_millisecond(),
    }
}

/// Sunday noon of the week 2026-11-23 .. 2026-11-29.
const SUNDAY: &str = "2026-11-29T12:00:00Z";
/// The first second of the Monday after.
const MONDAY: &str = "2026-11-30T00:00:01Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_sends_once_when_its_week_ends_and_not_again_after_a_restart() {
    let smtp = SmtpServer::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let config = reporting(&db, &smtp);
    let store = tally::open_store(&config).await.expect("store");
    add_site(store.as_ref()).await;
    let sunday: Timestamp = SUNDAY.parse().expect("ts");
    seed_two_weeks(store.as_ref(), "2026-11-23".parse().expect("day")).await;
    store.add_report(&weekly(sunday)).await.expect("add");
    let clock = ManualClock::new(sunday);
    let first = Collector::start(config.clone(), Arc::clone(&store), Arc::clone(&clock)).await;
    first.passes(3.0).await;
    assert!(smtp.messages().is_empty(), "the week has not ended");
    clock.set(MONDAY.parse().expect("ts"));
    wait_until(|| async { !smtp.messages().is_empty() }).await;
    first.passes(3.0).await;
    assert_eq!(smtp.messages().len(), 1);
    assert_eq!(first.metric("tally_reports_sent_total").await, 1.0);
    let (text, _) = parts(&smtp.messages()[0]);
    assert!(text.contains("2026-11-23 to 2026-11-29"), "{text}");
    first.stop().await;
    drop(store);
    // A restart on the same file, a day later: the week is sent already.
    clock.advance_millis(86_400_000);
    let store = tally::open_store(&config).await.expect("reopen");
    let second = Collector::start(config, store, Arc::clone(&clock)).await;
    second.passes(3.0).await;
    assert_eq!(smtp.messages().len(), 1, "not again after a restart");
    assert_eq!(second.metric("tally_reports_sent_total").await, 0.0);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_send_is_retried_after_its_backoff_and_shows_in_metrics() {
    let smtp = SmtpServer::start().await;
    smtp.refuse_next(1);
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let config = reporting(&db, &smtp);
    let store = tally::open_store(&config).await.expect("store");
    add_site(store.as_ref()).await;
    store
        .add_report(&weekly(SUNDAY.parse().expect("ts")))
        .await
        .expect("add");
    let clock = ManualClock::new(MONDAY.parse().expect("ts"));
    let app = Collector::start(config, store, Arc::clone(&clock)).await;
    wait_until(|| async { app.metric("tally_report_failures_total").await >= 1.0 }).await;
    app.passes(3.0).await;
    assert_eq!(app.metric("tally_report_failures_total").await, 1.0);
    assert_eq!(app.metric("tally_reports_retry_waiting").await, 1.0);
    assert!(smtp.messages().is_empty(), "the retry waits a minute");
    clock.advance_millis(59_000);
    app.passes(3.0).await;
    assert!(smtp.messages().is_empty(), "not before its backoff");
    clock.advance_millis(2_000);
    wait_until(|| async { smtp.messages().len() == 1 }).await;
    app.passes(2.0).await;
    assert_eq!(app.metric("tally_reports_sent_total").await, 1.0);
    assert_eq!(app.metric("tally_reports_retry_waiting").await, 0.0);
    assert_eq!(smtp.messages().len(), 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_on_one_postgres_database_send_each_report_once() {
    let Some(pg) = crate::store_conformance::postgres::Db::new() else {
        return;
    };
    let smtp = SmtpServer::start().await;
    // No SQLite file, but the two share a secret file, as collectors of one database must.
    let dir = tempfile::tempdir().expect("dir");
    let mut config = reporting(&dir.path().join("unused.sqlite"), &smtp);
    config.db = tally::ops::config::Database::Postgres(pg.url_in_schema());
    let a = tally::open_store(&config).await.expect("store a");
    let b = tally::open_store(&config).await.expect("store b");
    add_site(a.as_ref()).await;
    let sunday: Timestamp = SUNDAY.parse().expect("ts");
    let recipients: Vec<String> = (0..8).map(|i| format!("r{i}@example.com")).collect();
    for r in &recipients {
        let mut s = weekly(sunday);
        s.recipient = r.clone();
        a.add_report(&s).await.expect("add");
    }
    let clock = ManualClock::new(MONDAY.parse().expect("ts"));
    let one = Collector::start(config.clone(), a, Arc::clone(&clock)).await;
    let two = Collector::start(config, b, Arc::clone(&clock)).await;
    wait_until(|| async { smtp.messages().len() >= recipients.len() }).await;
    one.passes(3.0).await;
    two.passes(3.0).await;
    let mut got: Vec<String> = smtp.messages().iter().flat_map(|m| m.to.clone()).collect();
    got.sort();
    assert_eq!(got, recipients, "each recipient once");
    let sent =
        one.metric("tally_reports_sent_total").await + two.metric("tally_reports_sent_total").await;
    assert_eq!(sent, recipients.len() as f64);
    one.stop().await;
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_implicit_tls_deliver_only_with_the_ca_trusted() {
    let smtp = SmtpServer::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = tally::open_store(&ServeConfig::for_db(dir.path().join("t.sqlite")))
        .await
        .expect("store");
    add_site(store.as_ref()).await;
    let site = store.get_site(&blog()).await.expect("get").expect("site");
    let week = Period::last_complete(Every::Week, "2026-11-30".parse().expect("day"));
    let starttls = format!("smtp://ann%40blog.example:s3cret@127.0.0.1:{}", smtp.port);
    let implicit = format!(
        "smtps://ann%40blog.example:s3cret@127.0.0.1:{}",
        smtp.tls_port
    );
    for (n, url) in [&starttls, &implicit].into_iter().enumerate() {
        let untrusted =
            Mailer::new(&MailSettings::resolve(&url.as_str().into(), None, None).expect("mail"))
                .expect("mailer");
        let e = tally::ops::report::send_report(
            store.as_ref(),
            &untrusted,
            &site,
            "bob@example.com",
            week,
        )
        .await
        .expect_err("a self-signed certificate is not trusted by default");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let trusted = Mailer::new(
            &MailSettings::resolve(&url.as_str().into(), None, Some(&smtp.ca)).expect("mail"),
        )
        .expect("mailer");
        tally::ops::report::send_report(store.as_ref(), &trusted, &site, "bob@example.com", week)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let messages = smtp.messages();
        assert_eq!(messages.len(), n + 1, "{url}");
        let m = &messages[n];
        assert!(m.tls, "{url}: encrypted");
        assert_eq!(
            m.user.as_deref(),
            Some("ann@blog.example"),
            "{url}: authenticated"
        );
        assert_eq!(
            m.from, "ann@blog.example",
            "the SMTP user is the default sender"
        );
    }
}
