//! The attack suite, imports: hostile files given to `tally import` (which runs beside a live
//! collector) stay within 256 MB of memory and 16 MiB of reject file, and reject bad lines one
//! by one with their line numbers. The real binary; its peak RSS is read from `/proc`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::Binary;

/// A database with site `blog`, public, in a temporary directory.
struct Db {
    dir: tempfile::TempDir,
}

impl Db {
    fn new() -> Self {
        let db = Self {
            dir: tempfile::tempdir().expect("dir"),
        };
        let out = db
            .cmd(&[
                "site",
                "add",
                "blog",
                "--origin",
                "https://blog.example",
                "--public",
            ])
            .output()
            .expect("site add");
        assert!(out.status.success(), "{out:?}");
        db
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cmd(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tally"));
        cmd.env_remove("TALLY_DB")
            .env_remove("TALLY_CONFIG")
            .env("TALLY_LOG", "warn")
            .arg("--db")
            .arg(self.path("tally.sqlite"))
            .args(args);
        cmd
    }

    /// `tally import --format F FILE`: its output, its peak RSS in MiB (VmHWM, read from
    /// `/proc` every 5 ms until it exits) and the size of its reject file.
    fn import(&self, format: &str, file: &Path) -> Imported {
        let reject = self.path("rejects.tsv");
        let mut child = self
            .cmd(&[
                "import", "--format", format, "--site", "blog", "--pause", "0",
            ])
            .arg("--reject")
            .arg(&reject)
            .arg(file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn import");
        let status = format!("/proc/{}/status", child.id());
        let mut peak_kib = 0u64;
        loop {
            if let Some(hwm) = std::fs::read_to_string(&status).ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            }) {
                peak_kib = peak_kib.max(hwm);
            }
            if child.try_wait().expect("wait").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = child.wait_with_output().expect("output");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        Imported {
            ok: out.status.success(),
            text,
            peak_mib: peak_kib / 1024,
            reject_bytes: std::fs::metadata(&reject).map(|m| m.len()).unwrap_or(0),
            rejects: std::fs::read_to_string(&reject).unwrap_or_default(),
        }
    }
}

struct Imported {
    ok: bool,
    text: String,
    peak_mib: u64,
    reject_bytes: u64,
    rejects: String,
}

/// A combined-log line for `/page` at `time` (`10/Oct/2025:13:55:36 +0000`).
fn log_line(page: &str, time: &str) -> String {
    format!(
        "203.0.113.7 - - [{time}] \"GET {page} HTTP/1.1\" 200 512 \"-\" \
         \"Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0\"\n"
    )
}

#[test]
fn a_256_mb_line_costs_no_memory_and_one_short_reject() {
    let db = Db::new();
    let file = db.path("huge.log");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file).expect("create"));
        f.write_all(log_line("/before", "10/Oct/2025:13:55:36 +0000").as_bytes())
            .expect("write");
        let chunk = vec![b'a'; 1024 * 1024];
        for _ in 0..256 {
            f.write_all(&chunk).expect("write");
        }
        f.write_all(b"\n").expect("write");
        f.write_all(log_line("/after", "10/Oct/2025:13:55:37 +0000").as_bytes())
            .expect("write");
    }
    let run = db.import("combined", &file);
    eprintln!(
        "256 MB line: peak RSS {} MiB, reject file {} B",
        run.peak_mib, run.reject_bytes
    );
    assert!(run.ok, "{}", run.text);
    assert!(run.text.contains("imported 2"), "{}", run.text);
    assert!(run.peak_mib <= 256, "peak RSS {} MiB", run.peak_mib);
    assert!(
        run.reject_bytes < 1024,
        "reject file {} B",
        run.reject_bytes
    );
    assert!(
        run.rejects.starts_with("2\tline longer than 65536 bytes"),
        "{}",
        run.rejects
    );
}

#[test]
fn a_zip_bomb_is_refused_by_name_within_256_mb() {
    let db = Db::new();
    let file = db.path("export.zip");
    {
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&file).expect("create"));
        let deflated = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .large_file(true);
        zip.start_file("imported_pages_20250101_20251231.csv", deflated)
            .expect("entry");
        let zeros = vec![0u8; 1024 * 1024];
        for _ in 0..256 {
            zip.write_all(&zeros).expect("write");
        }
        zip.start_file("imported_visitors_20250101_20251231.csv", deflated)
            .expect("entry");
        zip.write_all(b"date,visitors,pageviews\n2025-03-01,5,9\n")
            .expect("write");
        zip.finish().expect("finish");
    }
    let zipped = std::fs::metadata(&file).expect("zip").len();
    let run = db.import("plausible", &file);
    eprintln!(
        "{zipped} B zip of 256 MiB NULs: peak RSS {} MiB, reject file {} B",
        run.peak_mib, run.reject_bytes
    );
    assert!(run.ok, "{}", run.text);
    assert!(run.peak_mib <= 256, "peak RSS {} MiB", run.peak_mib);
    assert!(
        run.reject_bytes < 1024,
        "reject file {} B",
        run.reject_bytes
    );
    assert!(
        run.rejects
            .contains("imported_pages_20250101_20251231.csv: entry refused"),
        "{}",
        run.rejects
    );
    assert!(run.text.contains("imported 1"), "{}", run.text);
}

#[test]
fn the_reject_file_stops_at_16_mib_and_counts_the_rest() {
    let db = Db::new();
    let file = db.path("junk.log");
    // 300,000 malformed lines of 100 bytes: 30 MB of rejects before the cap.
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file).expect("create"));
        let junk = format!("{}\n", "x".repeat(99));
        for _ in 0..300_000 {
            f.write_all(junk.as_bytes()).expect("write");
        }
    }
    let run = db.import("combined", &file);
    eprintln!("300,000 rejected lines: reject file {} B", run.reject_bytes);
    assert!(run.ok, "{}", run.text);
    assert!(run.text.contains("rejected 300000"), "{}", run.text);
    assert!(
        run.reject_bytes <= 16 * 1024 * 1024 + 200,
        "reject file {} B",
        run.reject_bytes
    );
    let last = run.rejects.lines().last().unwrap_or_default().to_owned();
    assert!(last.contains("more rejected lines"), "{last}");
}

#[test]
fn a_pre_1970_line_is_rejected_with_its_number_and_the_rest_imported() {
    let db = Db::new();
    let file = db.path("old.log");
    let text = [
        log_line("/one", "10/Oct/2025:13:55:36 +0000"),
        log_line("/old", "31/Dec/1969:23:59:59 +0000"),
        log_line("/two", "10/Oct/2025:13:55:37 +0000"),
    ]
    .concat();
    std::fs::write(&file, text).expect("write");
    let run = db.import("combined", &file);
    assert!(run.ok, "{}", run.text);
    assert!(run.text.contains("imported 2"), "{}", run.text);
    assert!(
        run.rejects
            .starts_with("2\ttime 1969-12-31T23:59:59Z is before 1970"),
        "{}",
        run.rejects
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_numbers_past_the_ceiling_are_refused_and_reads_never_overflow() {
    let db = Db::new();
    let file = db.path("daily.csv");
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    let yesterday = today.yesterday().expect("day");
    std::fs::write(
        &file,
        format!(
            "day,page,views,visitors\n\
             {today},/p,1000000000000,1000000000000\n\
             {yesterday},/p,1000000000000,1\n\
             {today},/q,9223372036854775808,1\n\
             {today},*,18446744073709551615,1\n"
        ),
    )
    .expect("write");
    let run = db.import("tally-csv", &file);
    assert!(run.ok, "{}", run.text);
    assert!(run.text.contains("imported 2"), "{}", run.text);
    assert_eq!(run.rejects.lines().count(), 2, "{}", run.rejects);
    assert!(run.rejects.contains("above the ceiling"), "{}", run.rejects);
    // A live hit on the same page, then the reads that overflowed before.
    let server = Binary::start_in(db.dir.path(), &[]).await;
    let hit = serde_json::json!({"site": "blog", "type": "pageview",
        "event_id": uuid::Uuid::now_v7().to_string(),
        "url": "https://blog.example/p", "referrer": null});
    let http = crate::support::client();
    let answer = http
        .post(server.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .header("origin", "https://blog.example")
        .body(hit.to_string())
        .send()
        .await
        .expect("hit");
    assert_eq!(answer.status(), 200);
    for path in [
        "/api/v1/sites/blog/top?range=30d",
        "/api/v1/sites/blog/series?range=30d",
        "/dashboard/blog?range=30d",
    ] {
        let r = http.get(server.url(path)).send().await.expect("read");
        assert_eq!(r.status(), 200, "{path}: {:?}", r.text().await);
    }
    drop(server);
    let (ok, text) = {
        let out = db.cmd(&["verify"]).output().expect("verify");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    assert!(ok, "{text}");
    // A tampered imported row (past the ceiling, its all-time sum left alone) is found, and
    // repaired to the ceiling with the sum recomputed.
    let sqlite = rusqlite::Connection::open(db.path("tally.sqlite")).expect("open");
    let changed = sqlite
        .execute(
            "UPDATE counters SET views = 9000000000000000000 \
             WHERE source = 2 AND day >= 0 AND views = 1000000000000 AND visitors = 1",
            [],
        )
        .expect("tamper");
    assert_eq!(changed, 1);
    drop(sqlite);
    let verify = |args: &[&str]| {
        let out = db.cmd(args).output().expect("verify");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = verify(&["verify"]);
    assert!(!ok && text.contains("drift"), "{text}");
    let (ok, text) = verify(&["verify", "--repair"]);
    assert!(ok, "{text}");
    let (ok, text) = verify(&["verify"]);
    assert!(ok && text.contains(" 0 drifted"), "{text}");
}
