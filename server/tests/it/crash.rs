//! `kill -9` under load: every acknowledged hit survives, retries of unacknowledged hits with
//! the same event ids count once, and counters equal the recount.

use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::support::{UA, client};

const SENDERS: usize = 16;
/// Acknowledged hits to wait for before the kill.
const ACKED_BEFORE_KILL: usize = 3_000;

async fn start(db: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--auto-sites",
            "--rate-limit-per-minute",
            "0",
            "--address-limit-per-minute",
            "0",
            "--new-sites-per-hour",
            "0",
            "--db",
        ])
        .arg(db)
        .env("TALLY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn tally");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let base = line
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    (child, base)
}

fn hit(id: &str, visitor: &str) -> Value {
    json!({"site": "crash", "type": "pageview", "event_id": id, "visitor_id": visitor,
           "url": "https://crash.example/page", "referrer": null})
}

async fn send(client: &reqwest::Client, base: &str, body: &Value) -> Option<String> {
    let r = client
        .post(format!("{base}/api/v1/hit"))
        .header("content-type", "text/plain")
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    if r.status() != 200 {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    v["status"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_hit_and_retries_count_once() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("crash.sqlite");
    let (mut child, base) = start(&db).await;
    let visitors: Arc<Vec<String>> =
        Arc::new((0..100).map(|_| uuid::Uuid::new_v4().to_string()).collect());

    let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let unacked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let acked_n = Arc::new(AtomicUsize::new(0));
    let dead = Arc::new(AtomicBool::new(false));
    let reached = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for w in 0..SENDERS {
        let (acked, unacked, acked_n, dead, visitors, base, reached) = (
            Arc::clone(&acked),
            Arc::clone(&unacked),
            Arc::clone(&acked_n),
            Arc::clone(&dead),
            Arc::clone(&visitors),
            base.clone(),
            Arc::clone(&reached),
        );
        tasks.push(tokio::spawn(async move {
            let client = client();
            let mut n = w;
            // Bounded: stops at the kill, or after 200k hits at the latest.
            while !dead.load(Ordering::SeqCst) && n < 200_000 {
                let id = uuid::Uuid::now_v7().to_string();
                let visitor = visitors[n % visitors.len()].clone();
                n += SENDERS;
                match send(&client, &base, &hit(&id, &visitor)).await.as_deref() {
                    Some("accepted") => {
                        acked.lock().await.push((id, visitor));
                        if acked_n.fetch_add(1, Ordering::SeqCst) + 1 >= ACKED_BEFORE_KILL {
                            reached.notify_one();
                        }
                    }
                    _ => unacked.lock().await.push((id, visitor)),
                }
            }
        }));
    }
    // Wait (bounded) for enough acknowledgements, then kill -9 mid-load.
    tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while acked_n.load(Ordering::SeqCst) < ACKED_BEFORE_KILL {
            reached.notified().await;
        }
    })
    .await
    .expect("load reached the kill point within 120 s");
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    dead.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("sender");
    }
    let acked = acked.lock().await.clone();
    let unacked = unacked.lock().await.clone();
    assert!(acked.len() >= ACKED_BEFORE_KILL);

    let (mut child, base) = start(&db).await;
    let client = client();
    // Every acknowledged hit is already stored: sending it again is a duplicate.
    for (id, visitor) in &acked {
        assert_eq!(
            send(&client, &base, &hit(id, visitor)).await.as_deref(),
            Some("duplicate"),
            "acked {id} was lost"
        );
    }
    // Unacknowledged hits are retried with their ids: stored once, whatever happened before.
    for (id, visitor) in &unacked {
        let status = send(&client, &base, &hit(id, visitor)).await;
        assert!(
            matches!(status.as_deref(), Some("accepted" | "duplicate")),
            "{status:?}"
        );
    }
    let all: HashSet<&String> = acked.iter().chain(&unacked).map(|(id, _)| id).collect();
    let distinct_visitors: HashSet<&String> =
        acked.iter().chain(&unacked).map(|(_, v)| v).collect();
    let counts: tally_wire::Counts = client
        .get(format!("{base}/api/v1/counts?site=crash&page=/page"))
        .header("user-agent", UA)
        .send()
        .await
        .expect("counts")
        .json()
        .await
        .expect("json");
    assert_eq!(
        counts.site.views,
        all.len() as u64,
        "every hit counted exactly once"
    );
    assert_eq!(counts.page.visitors, distinct_visitors.len() as u64);

    child.start_kill().expect("kill");
    child.wait().await.expect("reaped");
    let verify = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["verify", "--db"])
        .arg(&db)
        .output()
        .await
        .expect("verify");
    let out = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify failed: {out}");
    assert!(out.contains(", 0 drifted"), "{out}");
}

/// A clean stop (SIGTERM) folds the WAL into the database: what stays on disk is the main
/// file alone, and it holds every acknowledged hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_folds_the_wal_into_the_database() {
    const HITS: usize = 300;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("stop.sqlite");
    let wal = dir.path().join("stop.sqlite-wal");
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (mut child, base) = start(&db).await;
    let client = client();
    let visitor = uuid::Uuid::new_v4().to_string();
    for _ in 0..HITS {
        let id = uuid::Uuid::now_v7().to_string();
        assert_eq!(
            send(&client, &base, &hit(&id, &visitor)).await.as_deref(),
            Some("accepted")
        );
    }
    assert!(len(&wal) > 0, "a running collector commits into its WAL");
    let pid = child.id().expect("running");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = child.wait().await.expect("wait");
    assert!(status.success(), "tally exited with {status}");
    assert_eq!(
        len(&wal),
        0,
        "the WAL was folded in and truncated at the stop"
    );
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open");
    let stored: i64 = conn
        .query_row("SELECT COUNT(*) FROM events WHERE kind = 0", [], |r| {
            r.get(0)
        })
        .expect("count");
    assert_eq!(stored, HITS as i64);
}
