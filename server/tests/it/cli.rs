//! The `tally` binary's configuration sources and commands, run as a user would.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{client, event_id_at, pageview};

fn tally() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
    cmd.env_remove("TALLY_DB")
        .env("TALLY_LOG", "warn")
        .kill_on_drop(true);
    cmd
}

async fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().await.expect("run tally");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// POSTs one page view for site `blog` to a running binary.
async fn post_hit(base: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/api/v1/hit"))
        .header("content-type", "text/plain")
        .body(pageview(&event_id_at(jiff::Timestamp::now()), None, "/a").to_string())
        .send()
        .await
        .expect("hit")
}

/// Starts `serve` as configured by `cmd` and returns the child and its base URL.
async fn serve(mut cmd: Command) -> (tokio::process::Child, String) {
    let mut child = cmd
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
    (
        child,
        line.strip_prefix("listening on ")
            .expect("listening line")
            .to_owned(),
    )
}

#[tokio::test]
async fn environment_and_config_file_configure_serve() {
    let dir = tempfile::tempdir().expect("dir");
    // Environment only: TALLY_DB, TALLY_LISTEN, TALLY_AUTO_SITES.
    let mut cmd = tally();
    cmd.arg("serve")
        .env("TALLY_DB", dir.path().join("env.sqlite"))
        .env("TALLY_LISTEN", "127.0.0.1:0")
        .env("TALLY_AUTO_SITES", "true");
    let (mut child, base) = serve(cmd).await;
    let r = post_hit(&base).await;
    assert_eq!(
        r.json::<Value>().await.expect("json")["status"],
        "accepted",
        "auto-sites from env"
    );
    child.start_kill().expect("kill");
    assert!(dir.path().join("env.sqlite").exists(), "TALLY_DB was used");

    // A TOML file; a flag overrides it.
    let file = dir.path().join("tally.toml");
    let db = dir.path().join("file.sqlite");
    std::fs::write(
        &file,
        format!(
            "db = {:?}\nlisten = \"127.0.0.1:1\"\nauto-sites = false\n",
            db
        ),
    )
    .expect("write");
    let mut cmd = tally();
    cmd.args(["--config"])
        .arg(&file)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let (mut child, base) = serve(cmd).await;
    let r = post_hit(&base).await;
    assert_eq!(
        r.status(),
        403,
        "auto-sites off from the file: unknown site"
    );
    child.start_kill().expect("kill");
    assert!(db.exists(), "the file's db was used");

    // Unknown keys in the file are errors, not silently ignored.
    std::fs::write(&file, "listne = \"127.0.0.1:0\"\n").expect("write");
    let (ok, text) = run(tally().args(["--config"]).arg(&file).arg("serve")).await;
    assert!(!ok && text.contains("listne"), "{text}");
}

#[tokio::test]
async fn site_commands_and_verify_exit_codes() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("cli.sqlite");
    let with_db = |args: &[&str]| {
        let mut cmd = tally();
        cmd.arg("--db").arg(&db).args(args);
        cmd
    };
    let (ok, text) = run(&mut with_db(&[
        "site",
        "add",
        "blog",
        "--origin",
        "https://Blog.Example.com/",
        "--timezone",
        "Europe/Berlin",
        "--public",
    ]))
    .await;
    assert!(ok, "{text}");
    let (ok, text) = run(&mut with_db(&[
        "site",
        "add",
        "bad",
        "--origin",
        "https://x.example",
        "--timezone",
        "Mars/Base",
    ]))
    .await;
    assert!(!ok && text.contains("Mars/Base"), "{text}");
    let (ok, text) = run(&mut with_db(&[
        "site",
        "add",
        "Bad Id",
        "--origin",
        "https://x.example",
    ]))
    .await;
    assert!(!ok, "{text}");
    let (_, list) = run(&mut with_db(&["site", "list"])).await;
    assert!(
        list.contains("blog\tEurope/Berlin\tpublic\thttps://blog.example.com"),
        "{list}"
    );
    let (ok, text) = run(&mut with_db(&[
        "site",
        "set-base",
        "blog",
        "--views",
        "500",
        "--visitors",
        "40",
    ]))
    .await;
    assert!(ok, "{text}");
    let (ok, text) = run(&mut with_db(&["verify"])).await;
    assert!(ok && text.contains(", 0 drifted"), "{text}");
    // Tamper with a counter: verify fails (exit 1), --repair fixes it.
    {
        let conn = rusqlite::Connection::open(&db).expect("open");
        // A page counter of 2026-01-01 (day 20454) that no raw event backs.
        conn.execute_batch(
            "INSERT INTO pages (site, path) SELECT id, '/x' FROM site_keys WHERE name = 'blog';
             INSERT INTO counters SELECT id, 0, 20454, 7, 7 FROM pages WHERE path = '/x';",
        )
        .expect("tamper");
    }
    let (ok, text) = run(&mut with_db(&["verify"])).await;
    assert!(!ok && text.contains("1 drifted"), "{text}");
    let (ok, text) = run(&mut with_db(&["verify", "--repair"])).await;
    assert!(ok && text.contains("repaired"), "{text}");
    let (ok, text) = run(&mut with_db(&["verify"])).await;
    assert!(ok && text.contains(", 0 drifted"), "{text}");
    let (ok, _) = run(&mut with_db(&["site", "remove", "blog"])).await;
    assert!(ok);
    let (ok, text) = run(&mut with_db(&["site", "remove", "blog"])).await;
    assert!(!ok && text.contains("no site"), "{text}");
}

#[tokio::test]
async fn site_key_prints_the_same_key_until_rotated_and_site_add_keeps_it() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("key.sqlite");
    let with_db = |args: &[&str]| {
        let mut cmd = tally();
        cmd.arg("--db").arg(&db).args(args);
        cmd
    };
    let (ok, text) = run(&mut with_db(&["site", "key", "blog"])).await;
    assert!(!ok && text.contains("no site blog"), "{text}");
    let add = ["site", "add", "blog", "--origin", "https://blog.example"];
    let (ok, added) = run(&mut with_db(&add)).await;
    assert!(ok && added.contains("site blog added"), "{added}");
    let (ok, first) = run(&mut with_db(&["site", "key", "blog"])).await;
    assert!(ok && first.trim().len() >= 32, "{first}");
    let (_, again) = run(&mut with_db(&["site", "key", "blog"])).await;
    assert_eq!(first, again, "printing does not rotate");
    // Re-adding the site (e.g. to change its origins) replaces its settings, says what they
    // were, and keeps the key.
    let (ok, replaced) = run(&mut with_db(&add)).await;
    assert!(
        ok && replaced.contains(
            "site blog replaced (was: origins https://blog.example, time zone UTC, private)"
        ),
        "{replaced}"
    );
    let (_, kept) = run(&mut with_db(&["site", "key", "blog"])).await;
    assert_eq!(first, kept);
    let (ok, rotated) = run(&mut with_db(&["site", "key", "blog", "--rotate"])).await;
    assert!(ok && rotated != first, "{rotated}");
}

#[tokio::test]
async fn a_weak_admin_token_is_refused_at_startup_without_echoing_it() {
    let dir = tempfile::tempdir().expect("dir");
    for token in ["short-Qx7", "non-ascii-tökén-Qx7-Qx7-Qx7"] {
        let (ok, text) = run(tally()
            .arg("--db")
            .arg(dir.path().join("t.sqlite"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("TALLY_ADMIN_TOKEN", token))
        .await;
        assert!(!ok, "started with a weak token");
        assert!(text.contains("admin-token"), "{text}");
        assert!(!text.contains("Qx7"), "the error echoes the token: {text}");
    }
}

#[tokio::test]
async fn help_and_config_errors_print_no_secret() {
    const SECRET: &str = "Hq2-very-secret-value-Hq2-0123456789abcdef";
    let (ok, text) = run(tally()
        .args(["serve", "--help"])
        .env("TALLY_ADMIN_TOKEN", SECRET)
        .env("TALLY_METRICS_TOKEN", SECRET)
        .env("TALLY_SECRET", SECRET))
    .await;
    assert!(ok, "{text}");
    assert!(text.contains("--admin-token") && text.contains("--trusted-proxies"));
    assert!(!text.contains("Hq2"), "--help shows a secret: {text}");

    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("tally.toml");
    for content in [
        format!("admin-token = \"{SECRET}\nlisten = \"127.0.0.1:0\"\n"),
        format!("admin-token = {SECRET}\n"),
        format!("{SECRET}\n"),
        format!("secret = 12345\nadmin-token = \"{SECRET}\"\n"),
    ] {
        std::fs::write(&file, &content).expect("write");
        let (ok, text) = run(tally().arg("--config").arg(&file).arg("serve")).await;
        assert!(!ok, "{content}");
        assert!(
            text.contains("invalid config file") && text.contains("line "),
            "{text}"
        );
        assert!(!text.contains("Hq2"), "the error echoes the file: {text}");
    }
}

/// The exit of `serve` on a database whose side files cannot be used: a clear error naming
/// the file, never a signal (an unwritable `-shm` is mapped read-only by SQLite and used to
/// kill the process with SIGBUS and no log line).
async fn refused_at_startup(cmd: &mut Command, file: &str) {
    let out = cmd.output().await.expect("run tally");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {text}");
    assert!(
        out.status.code().is_some(),
        "killed by a signal ({:?}): {text}",
        out.status
    );
    assert!(text.contains(file), "{text}");
    assert!(text.contains("read-write access"), "{text}");
}

/// A database made and closed, without its `-shm` (SQLite rebuilds it from the `-wal`).
async fn closed_database(dir: &std::path::Path) -> std::path::PathBuf {
    let db = dir.join("t.sqlite");
    let options = tally::store::sqlite::StoreOptions::default();
    drop(tally::store::sqlite::SqliteStore::open(&db, options).expect("create"));
    let _ = std::fs::remove_file(dir.join("t.sqlite-shm"));
    db
}

#[tokio::test]
async fn an_unusable_shm_file_is_a_clear_startup_error_not_a_crash() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let db = closed_database(dir.path()).await;
    let shm = dir.path().join("t.sqlite-shm");

    // Not a regular file.
    std::fs::create_dir(&shm).expect("mkdir");
    refused_at_startup(
        tally()
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", "127.0.0.1:0"]),
        "t.sqlite-shm",
    )
    .await;
    std::fs::remove_dir(&shm).expect("rmdir");

    // A regular file this process may read but not write. Root may write anything, so as
    // root the server runs as `nobody` (setpriv, util-linux) on a directory `nobody` owns.
    std::fs::write(&shm, b"").expect("shm");
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let root = rustix::process::geteuid().is_root();
    let mut cmd = if root {
        let nobody = Some(rustix::process::Uid::from_raw(65534));
        let group = Some(rustix::process::Gid::from_raw(65534));
        for path in [dir.path(), &db] {
            rustix::fs::chown(path, nobody, group).expect("chown to nobody");
        }
        let wal = dir.path().join("t.sqlite-wal");
        if wal.exists() {
            rustix::fs::chown(&wal, nobody, group).expect("chown to nobody");
        }
        // The binary may sit below a directory `nobody` cannot enter.
        let exe = dir.path().join("tally-bin");
        std::fs::copy(env!("CARGO_BIN_EXE_tally"), &exe).expect("copy binary");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .env("TALLY_LOG", "warn")
            .kill_on_drop(true);
        cmd
    } else {
        tally()
    };
    cmd.arg("--db")
        .arg(&db)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("TALLY_SECRET", "s".repeat(40));
    refused_at_startup(&mut cmd, "t.sqlite-shm").await;
}

/// `--db postgres://…` selects PostgreSQL for `serve`, `site` and `verify`; the SQLite-only
/// commands say so instead of creating a file named like the URL.
#[tokio::test]
async fn serve_site_and_verify_on_postgres() {
    let Some(db) = crate::store_conformance::postgres::Db::new() else {
        return;
    };
    let url = db.url_in_schema();
    let with_db = |args: &[&str]| {
        let mut cmd = tally();
        cmd.arg("--db").arg(&url).args(args);
        cmd
    };
    let (ok, text) = run(&mut with_db(&[
        "site",
        "add",
        "blog",
        "--origin",
        "https://blog.example",
    ]))
    .await;
    assert!(ok, "{text}");
    let mut cmd = with_db(&["serve", "--listen", "127.0.0.1:0", "--db-pool", "3"]);
    cmd.env(
        "TALLY_SECRET",
        "a-test-secret-that-is-long-enough-0123456789",
    );
    let (mut child, base) = serve(cmd).await;
    let id = event_id_at(jiff::Timestamp::now());
    for expected in ["accepted", "duplicate"] {
        let r = client()
            .post(format!("{base}/api/v1/hit"))
            .header("content-type", "text/plain")
            .body(pageview(&id, None, "/a").to_string())
            .send()
            .await
            .expect("hit");
        assert_eq!(r.json::<Value>().await.expect("json")["status"], expected);
    }
    let ready = client()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    child.start_kill().expect("kill");
    let _ = child.wait().await;
    assert_eq!(
        db.exec("SELECT 1 FROM events"),
        1,
        "the hit is in PostgreSQL, once"
    );
    let (ok, text) = run(&mut with_db(&["verify"])).await;
    assert!(ok && text.contains(", 0 drifted"), "{text}");
    let (ok, text) = run(&mut with_db(&["backup", "/nonexistent/x.sqlite"])).await;
    assert!(!ok && text.contains("pg_dump"), "{text}");
}

/// A PostgreSQL URL whose port accepts connections and never answers: the command fails
/// within the connect timeout (10 s) and says why, instead of hanging.
#[tokio::test]
async fn a_postgres_port_that_never_answers_fails_with_a_clear_message() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("address").port();
    let started = std::time::Instant::now();
    let (ok, text) = run(tally()
        .args([
            "--db",
            &format!("postgres://postgres@127.0.0.1:{port}/test"),
        ])
        .args(["site", "list"]))
    .await;
    let took = started.elapsed();
    assert!(!ok, "{text}");
    assert!(text.contains("no connection within 10 s"), "{text}");
    assert!(
        took < std::time::Duration::from_secs(30),
        "gave up after {took:?}"
    );
    drop(silent);
}

/// A wrong user is named in the error with the server's words, not "db error".
#[tokio::test]
async fn a_wrong_postgres_user_is_reported_in_the_servers_words() {
    let Some(url) = crate::support::postgres_url() else {
        return;
    };
    let Some(rest) = url.split_once("://").map(|(_, rest)| rest) else {
        panic!("not a URL: {url}");
    };
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let wrong = format!("postgres://no_such_tally_user@{host}");
    let (ok, text) = run(tally().args(["--db", &wrong]).args(["site", "list"])).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("no_such_tally_user") && !text.contains("db error"),
        "{text}"
    );
}
