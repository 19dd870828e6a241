//! `tally import`, `tally export` and `tally backup`, run as a user would, on the committed
//! sample files of each format (`tests/fixtures/import/`). Each import test runs on SQLite and
//! on PostgreSQL ([`on_both`]): the same commands must give the same answers on both.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use jiff::civil::date;
use tally::core::ids::{PagePath, SiteId};
use tally::store::prelude::*;
use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};
use tally_wire::Numbers;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{client, event_id_at, pageview};

pub(crate) fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

/// Which database a test's commands run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

pub(crate) struct Db {
    _dir: tempfile::TempDir,
    /// The `--db` value: the SQLite file, or the URL of a fresh PostgreSQL schema.
    pub(crate) path: PathBuf,
    pub(crate) dir: PathBuf,
    /// The PostgreSQL schema (dropped with this).
    pub(crate) pg: Option<crate::store_conformance::postgres::Db>,
}

impl Db {
    /// A fresh SQLite database with site `blog` (UTC).
    pub(crate) async fn new() -> Self {
        Self::on(Backend::Sqlite)
            .await
            .expect("SQLite is always there")
    }

    /// A fresh database on `backend` with site `blog` (UTC); `None` (the test skips, loudly)
    /// when the test PostgreSQL is not configured.
    pub(crate) async fn on(backend: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().expect("dir");
        let (path, pg) = match backend {
            Backend::Sqlite => (dir.path().join("tally.sqlite"), None),
            Backend::Postgres => {
                let pg = crate::store_conformance::postgres::Db::new()?;
                (PathBuf::from(pg.url_in_schema()), Some(pg))
            }
        };
        let db = Self {
            path,
            dir: dir.path().to_owned(),
            _dir: dir,
            pg,
        };
        let (ok, text) = db
            .run(&["site", "add", "blog", "--origin", "https://blog.example"])
            .await;
        assert!(ok, "{text}");
        Some(db)
    }

    pub(crate) fn backend(&self) -> Backend {
        if self.pg.is_some() {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }

    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
        cmd.env_remove("TALLY_DB")
            .env_remove("TALLY_CONFIG")
            .env("TALLY_LOG", "warn")
            .kill_on_drop(true)
            .arg("--db")
            .arg(&self.path)
            .args(args);
        cmd
    }

    pub(crate) async fn run(&self, args: &[&str]) -> (bool, String) {
        let out = self.cmd(args).output().await.expect("run tally");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// `tally import --format F --site blog FILE [extra]`, asserting success.
    pub(crate) async fn import(&self, format: &str, file: &Path, extra: &[&str]) -> String {
        let reject = self.dir.join(format!("{format}.rejects"));
        let mut args = vec![
            "import",
            "--format",
            format,
            "--site",
            "blog",
            "--reject",
            reject.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        args.push(file.to_str().expect("utf-8"));
        let (ok, text) = self.run(&args).await;
        assert!(ok, "{text}");
        text
    }

    pub(crate) fn rejects(&self, format: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{format}.rejects"))).unwrap_or_default()
    }

    pub(crate) async fn export(&self, args: &[&str]) -> String {
        let mut all = vec!["export", "--site", "blog"];
        all.extend_from_slice(args);
        let (ok, text) = self.run(&all).await;
        assert!(ok, "{text}");
        text
    }

    pub(crate) async fn store(&self) -> Arc<dyn Store> {
        match &self.pg {
            Some(pg) => Arc::new(pg.pg_store(1000).await),
            None => Arc::new(
                SqliteStore::open(
                    &self.path,
                    StoreOptions {
                        sync: SyncMode::Normal,
                        min_free_bytes: 0,
                        max_new_pages_per_day: 1000,
                    },
                )
                .expect("open"),
            ),
        }
    }

    pub(crate) async fn verify_clean(&self) {
        let (ok, text) = self.run(&["verify"]).await;
        assert!(ok && text.contains(" 0 drifted"), "{text}");
    }
}

pub(crate) fn blog() -> SiteId {
    SiteId::parse("blog").expect("site")
}

/// `on_both!(name)`: the test `name(db: Db)` as `name::sqlite` and `name::postgres` (the
/// module that uses it imports `Db` and `Backend`).
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                if let Some(db) = super::Db::on(super::Backend::Sqlite).await {
                    super::$name(db).await;
                }
            }

            #[tokio::test]
            async fn postgres() {
                if let Some(db) = super::Db::on(super::Backend::Postgres).await {
                    super::$name(db).await;
                }
            }
        }
    };
}
pub(crate) use on_both;

on_both!(combined_log_counts_page_views_rejects_the_rest_and_reimports_nothing);
async fn combined_log_counts_page_views_rejects_the_rest_and_reimports_nothing(db: Db) {
    let first = db.import("combined", &sample("access.log"), &[]).await;
    assert!(
        first.contains("read 10 lines") && first.contains("imported 4, duplicates 0, rejected 6"),
        "{first}"
    );
    let rejects = db.rejects("combined");
    let reasons: Vec<&str> = rejects
        .lines()
        .map(|l| l.split('\t').nth(1).expect("reason"))
        .collect();
    assert_eq!(
        reasons,
        [
            "not a page: static asset",
            "not a page: static asset",
            "bot",
            "not a page view: method POST",
            "not a page view: status 404",
            "malformed: no [time]",
        ],
        "{rejects}"
    );
    assert!(rejects.starts_with("2\t"), "line numbers: {rejects}");
    assert!(rejects.contains("Googlebot"), "the line itself is kept");
    let second = db.import("combined", &sample("access.log"), &[]).await;
    assert!(
        second.contains("imported 0, duplicates 4, rejected 6"),
        "{second}"
    );
    // 2025 is older than the default raw retention (400 days): its days are sealed at once,
    // and a collector's retention removes the raw events later (the import keeps them).
    assert!(first.contains("sealed 2 finished days"), "{first}");
    let daily = db.export(&[]).await;
    assert_eq!(
        daily,
        "day,page,views,visitors\n\
         2025-03-02,*,3,2\n\
         2025-03-02,/,1,1\n\
         2025-03-02,/posts/hello-world/,2,2\n\
         2025-03-03,*,1,1\n\
         2025-03-03,/about/,1,1\n"
    );
    assert_eq!(db.export(&["--what", "events"]).await.lines().count(), 5);
    db.verify_clean().await;
}

on_both!(caddy_log_with_a_host_filter_keeps_raw_events_within_retention);
async fn caddy_log_with_a_host_filter_keeps_raw_events_within_retention(db: Db) {
    let config = db.dir.join("tally.toml");
    std::fs::write(&config, "retention-days = 0\n").expect("config");
    let out = db
        .import(
            "caddy",
            &sample("caddy.log"),
            &[
                "--host",
                "blog.example.com",
                "--config",
                config.to_str().expect("utf-8"),
            ],
        )
        .await;
    assert!(
        out.contains("imported 3, duplicates 0, rejected 4"),
        "{out}"
    );
    let rejects = db.rejects("caddy");
    for reason in [
        "\tother host: shop.example.com\t",
        "\tbot\t",
        "\tnot a page view: status 404\t",
        "\tmalformed: no request object\t",
    ] {
        assert!(rejects.contains(reason), "{reason} in {rejects}");
    }
    let events = db.export(&["--what", "events", "--format", "json"]).await;
    let events: serde_json::Value = serde_json::from_str(&events).expect("json array");
    let events = events.as_array().expect("array");
    assert_eq!(events.len(), 3, "raw events kept (retention 0 = forever)");
    assert_eq!(events[0]["page"], "/");
    assert_eq!(events[0]["referrer"], "https://www.google.com/");
    assert_eq!(events[2]["time"], "2025-03-03T06:45:00Z");
    db.verify_clean().await;
    let (ok, text) = db.run(&["verify", "--repair", "--site", "blog"]).await;
    assert!(ok && text.contains(" 0 drifted"), "{text}");
    assert!(
        !text.contains("checked 0 "),
        "the site's counters are checked: {text}"
    );
    let (ok, text) = db.run(&["verify", "--site", "nobody"]).await;
    assert!(ok && text.contains("checked 0 counters"), "{text}");
}

// GoatCounter's current exports, as its documentation describes them: `UserAgent` is always
// blank and bots are marked in `Bot` (0 = not a bot). One session, two pages, one bot row.
on_both!(goatcounter_export_with_blank_user_agents_counts_by_the_bot_column);
async fn goatcounter_export_with_blank_user_agents_counts_by_the_bot_column(db: Db) {
    let out = db
        .import("goatcounter", &sample("goatcounter-blank-ua.csv"), &[])
        .await;
    assert!(
        out.contains("imported 2, duplicates 0, rejected 1"),
        "{out}"
    );
    let rejects = db.rejects("goatcounter");
    assert!(
        rejects.starts_with("4\tbot (GoatCounter bot flag 4)"),
        "{rejects}"
    );
    let c = db
        .store()
        .await
        .counts(&blog(), &PagePath::root(), date(2025, 3, 2))
        .await
        .expect("counts");
    assert_eq!(
        c.site_today.web,
        Numbers {
            views: 2,
            visitors: 1
        },
        "one session on one day is one visitor"
    );
    db.verify_clean().await;
}

on_both!(goatcounter_export_imports_views_and_events);
async fn goatcounter_export_imports_views_and_events(db: Db) {
    let out = db
        .import("goatcounter", &sample("goatcounter.csv"), &[])
        .await;
    assert!(
        out.contains("imported 4, duplicates 0, rejected 2"),
        "{out}"
    );
    let rejects = db.rejects("goatcounter");
    assert!(
        rejects.contains("bot (GoatCounter bot flag 4)"),
        "{rejects}"
    );
    assert!(rejects.contains("malformed Date"), "{rejects}");
    let again = db
        .import("goatcounter", &sample("goatcounter.csv"), &[])
        .await;
    assert!(again.contains("imported 0, duplicates 4"), "{again}");
    let store = db.store().await;
    let page = PagePath::parse("/posts/hello-world/").expect("page");
    let c = store
        .counts(&blog(), &page, date(2025, 3, 2))
        .await
        .expect("counts");
    assert_eq!(
        c.page_today.web,
        Numbers {
            views: 2,
            visitors: 2
        }
    );
    assert_eq!(
        c.site_today.web,
        Numbers {
            views: 3,
            visitors: 2
        }
    );
    assert_eq!(
        db.export(&["--what", "custom"]).await,
        "day,name,count\n2025-03-02,newsletter-signup,1\n"
    );
    db.verify_clean().await;
}

on_both!(plausible_zip_becomes_daily_numbers_and_the_daily_csv_round_trips);
async fn plausible_zip_becomes_daily_numbers_and_the_daily_csv_round_trips(db: Db) {
    // 9 rows: 6 of pages, 2 of daily totals, 1 of sources; the page without a slash is
    // refused, the 8 others counted (two hostnames' rows of one page add up).
    let out = db.import("plausible", &sample("plausible.zip"), &[]).await;
    assert!(
        out.contains("read 9 lines") && out.contains("imported 8, duplicates 0, rejected 1"),
        "{out}"
    );
    assert!(
        db.rejects("plausible")
            .contains("page \"no-slash\" must start with /")
    );
    let daily = db.export(&[]).await;
    assert_eq!(
        daily,
        "day,page,views,visitors\n\
         2024-11-01,*,178,130\n\
         2024-11-01,/,131,98\n\
         2024-11-01,/posts/hello-world/,47,40\n\
         2024-11-02,*,122,95\n\
         2024-11-02,/,109,87\n\
         2024-11-02,/about/,12,12\n"
    );
    // Imported aggregates add to the shown numbers and are never "drift".
    let c = db
        .store()
        .await
        .counts(&blog(), &PagePath::root(), date(2024, 11, 2))
        .await
        .expect("counts");
    assert_eq!(c.site_all.web.views, 300);
    assert_eq!(c.page_all.web.views, 240);
    db.verify_clean().await;
    // Re-importing sets the same numbers.
    db.import("plausible", &sample("plausible.zip"), &[]).await;
    assert_eq!(db.export(&[]).await, daily);

    // Round trip: mix in counted events, export, import into a new database, export again.
    db.import("combined", &sample("access.log"), &[]).await;
    let exported = db.export(&[]).await;
    let file = db.dir.join("daily.csv");
    std::fs::write(&file, &exported).expect("write");
    let other = Db::on(db.backend()).await.expect("same backend");
    let out = other.import("tally-csv", &file, &[]).await;
    assert!(
        out.contains("imported 11, duplicates 0, rejected 0"),
        "{out}"
    );
    assert_eq!(other.export(&[]).await, exported);
    assert_eq!(
        other
            .export(&["--from", "2025-03-03", "--to", "2025-03-03"])
            .await,
        "day,page,views,visitors\n2025-03-03,*,1,1\n2025-03-03,/about/,1,1\n"
    );
}

on_both!(bases_rows_set_site_and_page_bases);
async fn bases_rows_set_site_and_page_bases(db: Db) {
    let out = db.import("bases", &sample("bases.csv"), &[]).await;
    assert!(
        out.contains("imported 3, duplicates 0, rejected 1"),
        "{out}"
    );
    assert!(
        db.rejects("bases")
            .contains("views \"many\" is not a number")
    );
    db.import("bases", &sample("bases.csv"), &[]).await;
    let c = db
        .store()
        .await
        .counts(
            &blog(),
            &PagePath::parse("/posts/hello-world/").expect("page"),
            date(2026, 1, 1),
        )
        .await
        .expect("counts");
    assert_eq!(
        c.site_base,
        Numbers {
            views: 12345,
            visitors: 4321
        }
    );
    assert_eq!(
        c.page_base,
        Numbers {
            views: 2048,
            visitors: 900
        }
    );
}

#[tokio::test]
async fn backup_while_serving_holds_every_acknowledged_hit() {
    let db = Db::new().await;
    let mut child = db
        .cmd(&["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("line");
    let base = line.strip_prefix("listening on ").expect("listening");
    let hit = client()
        .post(format!("{base}/api/v1/hit"))
        .header("content-type", "text/plain")
        .header("origin", "https://blog.example")
        .body(pageview(&event_id_at(jiff::Timestamp::now()), None, "/a").to_string())
        .send()
        .await
        .expect("hit");
    assert_eq!(hit.status(), 200, "{:?}", hit.text().await);
    let copy = db.dir.join("copy.sqlite");
    let (ok, text) = db.run(&["backup", copy.to_str().expect("utf-8")]).await;
    assert!(ok, "{text}");
    let (ok, text) = db.run(&["backup", copy.to_str().expect("utf-8")]).await;
    assert!(!ok && text.contains("exists"), "never overwrites: {text}");
    child.kill().await.expect("kill");
    let restored = SqliteStore::open(
        &copy,
        StoreOptions {
            sync: SyncMode::Normal,
            min_free_bytes: 0,
            max_new_pages_per_day: 1000,
        },
    )
    .expect("the copy opens");
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    let c = restored
        .counts(&blog(), &PagePath::parse("/a").expect("page"), today)
        .await
        .expect("counts");
    assert_eq!(
        c.page_all.web.views, 1,
        "the acknowledged hit is in the copy"
    );
}

/// What `tally export` says of the database, all of it.
async fn every_export(db: &Db) -> Vec<String> {
    let mut out = Vec::new();
    for what in ["daily", "custom", "events"] {
        out.push(db.export(&["--what", what]).await);
    }
    out
}

/// On PostgreSQL `tally backup` is a `pg_dump` of Tally's schema; the `pg_restore` command it
/// prints brings back every answer after the schema is gone.
#[tokio::test]
async fn backup_on_postgres_is_a_dump_the_printed_command_restores() {
    let Some(db) = Db::on(Backend::Postgres).await else {
        return;
    };
    db.import("goatcounter", &sample("goatcounter.csv"), &[])
        .await;
    db.import("plausible", &sample("plausible.zip"), &[]).await;
    let before = every_export(&db).await;
    assert!(before[0].lines().count() > 5, "{}", before[0]);
    assert!(before[1].contains("newsletter-signup"), "{}", before[1]);
    let file = db.dir.join("tally.dump");
    let (ok, text) = db.run(&["backup", file.to_str().expect("utf-8")]).await;
    assert!(ok, "{text}");
    let (ok, again) = db.run(&["backup", file.to_str().expect("utf-8")]).await;
    assert!(!ok && again.contains("exists"), "never overwrites: {again}");
    let restore = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("pg_restore "))
        .unwrap_or_else(|| panic!("a restore command in: {text}"))
        .to_owned();

    let pg = db.pg.as_ref().expect("postgres");
    pg.exec(&format!("DROP SCHEMA {} CASCADE", pg.schema()));
    let (ok, text) = db.run(&["export", "--site", "blog"]).await;
    assert!(!ok, "the schema is gone: {text}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&restore)
        .output()
        .expect("run pg_restore");
    assert!(
        out.status.success(),
        "{restore}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(every_export(&db).await, before, "every answer is back");
    db.verify_clean().await;
    // And counting goes on where it was: a re-import finds every event in the ledger.
    let again = db
        .import("goatcounter", &sample("goatcounter.csv"), &[])
        .await;
    assert!(again.contains("imported 0, duplicates 4"), "{again}");
}

#[tokio::test]
async fn version_prints_the_crate_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--version")
        .output()
        .await
        .expect("run");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("tally {}", env!("CARGO_PKG_VERSION"))
    );
}
