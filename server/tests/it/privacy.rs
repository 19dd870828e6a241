//! No client address anywhere: the real binary at `TALLY_LOG=trace` behind a trusted proxy
//! takes hits, badges, pixels, events, a wrong login and a dashboard read from a test address;
//! then its log, the SQLite file, its WAL and its shared-memory file are scanned for the
//! address in text and in binary (4 network-order bytes) — the client's and the peer's.
//! And the server secret is a private file beside the database, never inside it.

use std::path::Path;
use std::process::Stdio;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{event_id_at, pageview, wait_until};

/// The address the client claims through the trusted proxy (TEST-NET-3).
const CLIENT: [u8; 4] = [203, 0, 113, 77];
/// The address the requests really come from (the "proxy").
const PEER: [u8; 4] = [127, 0, 0, 77];

fn text(ip: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3])
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every file of the database (main, `-wal`, `-shm`) that exists, with its bytes.
fn database_files(db: &Path) -> Vec<(String, Vec<u8>)> {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| {
            let path = format!("{}{suffix}", db.display());
            std::fs::read(&path).ok().map(|bytes| (path, bytes))
        })
        .collect()
}

fn assert_no_address(what: &str, bytes: &[u8]) {
    for ip in [CLIENT, PEER] {
        assert!(
            !holds(bytes, text(ip).as_bytes()),
            "{what} holds {} as text",
            text(ip)
        );
        assert!(!holds(bytes, &ip), "{what} holds {} as 4 bytes", text(ip));
    }
}

#[tokio::test]
async fn no_client_address_in_logs_database_or_wal_at_trace_level() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let log = dir.path().join("stderr.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--db")
        .arg(&db)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--auto-sites",
            "--trusted-proxies",
            "loopback",
            "--admin-token",
            "privacy-admin-token-0123",
        ])
        .env("TALLY_LOG", "trace")
        .env_remove("TALLY_SECRET")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("line");
    let base = line.strip_prefix("listening on ").expect("line").to_owned();

    let http = reqwest::Client::builder()
        .user_agent(crate::support::UA)
        .local_address(Some(std::net::IpAddr::from(PEER)))
        .build()
        .expect("client");
    let client = text(CLIENT);
    let xff = format!("198.51.100.1, {client}");
    let now = jiff::Timestamp::now();
    // Page views without a visitor id: the visitor is a keyed hash of the address.
    for page in ["/a", "/b"] {
        let r = http
            .post(format!("{base}/api/v1/hit"))
            .header("x-forwarded-for", &xff)
            .header("content-type", "text/plain")
            .body(pageview(&event_id_at(now), None, page).to_string())
            .send()
            .await
            .expect("hit");
        assert_eq!(r.status(), 200);
    }
    let batch = json!({"events": [
        {"site": "blog", "type": "event", "name": "signup", "dedupe": "s-1",
         "event_id": event_id_at(now), "url": "https://blog.example/join"}
    ]});
    let r = http
        .post(format!("{base}/api/v1/events"))
        .header("x-forwarded-for", &xff)
        .json(&batch)
        .send()
        .await
        .expect("events");
    assert_eq!(r.status(), 200);
    for path in [
        "/badge/blog.svg?page=/a",
        "/api/v1/pixel.gif?site=blog&page=/c",
        "/dashboard/blog",
        "/api/v1/counts?site=blog&page=/a",
        "/no/such/route",
    ] {
        http.get(format!("{base}{path}"))
            .header("x-forwarded-for", &xff)
            .send()
            .await
            .expect("get");
    }
    // A wrong login and a malformed hit log what they log, without an address.
    http.post(format!("{base}/dashboard/blog/login"))
        .header("x-forwarded-for", &xff)
        .form(&[("token", "wrong-wrong-wrong-wrong")])
        .send()
        .await
        .expect("login");
    http.post(format!("{base}/api/v1/hit"))
        .header("x-forwarded-for", &xff)
        .body("{not json")
        .send()
        .await
        .expect("bad hit");

    let counted = || async {
        http.get(format!("{base}/api/v1/counts?site=blog&page=/a"))
            .send()
            .await
            .ok()
            .map(|r| r.status() == 200)
            .unwrap_or(false)
    };
    wait_until(counted).await;
    // While running: the WAL holds the latest pages.
    for (path, bytes) in database_files(&db) {
        assert_no_address(&path, &bytes);
    }
    let pid = child.id().expect("running");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    assert!(child.wait().await.expect("wait").success());
    for (path, bytes) in database_files(&db) {
        assert_no_address(&path, &bytes);
    }
    let log_bytes = std::fs::read(&log).expect("log");
    assert!(
        holds(&log_bytes, b"starting") && holds(&log_bytes, b"server secret"),
        "the log was captured"
    );
    assert_no_address("the trace log", &log_bytes);

    // The server secret: created beside the database, owner-only, and not in the database.
    let secret_path = dir.path().join("tally.secret");
    let secret = std::fs::read_to_string(&secret_path).expect("secret file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret_path)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let secret = secret.trim();
    assert_eq!(secret.len(), 64);
    for (path, bytes) in database_files(&db) {
        assert!(
            !holds(&bytes, secret.as_bytes()),
            "{path} holds the server secret"
        );
    }
    assert!(
        !holds(&log_bytes, secret.as_bytes()),
        "the log holds the secret"
    );
}

#[tokio::test]
async fn an_expired_salt_leaves_no_copy_in_the_file_or_the_wal() {
    use tally::store::prelude::*;
    use tally::store::sqlite::SqliteStore;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("salts.sqlite");
    let store = SqliteStore::open(&db, Default::default()).expect("open");
    let day = jiff::civil::date(2026, 3, 1);
    let salt = [0x5au8, 0xa5, 0x3c, 0xc3, 0x69, 0x96, 0x0f, 0xf0]
        .repeat(4)
        .try_into()
        .expect("32 bytes");
    assert_eq!(store.salt_for(day, salt).await.expect("salt"), salt);
    for (path, bytes) in database_files(&db) {
        if path.ends_with("-wal") {
            assert!(holds(&bytes, &salt), "the test must see the salt first");
        }
    }
    // Three days later the salt of the first day is deleted (and the WAL checkpointed).
    let later = jiff::civil::date(2026, 3, 4);
    store.salt_for(later, [7u8; 32]).await.expect("salt");
    for (path, bytes) in database_files(&db) {
        assert!(!holds(&bytes, &salt), "{path} still holds the deleted salt");
    }
}
