//! Load benchmark for the collector.
//!
//! `tally-loadgen run` starts, in the same run, (1) a baseline axum server that answers 204 to
//! the same request without doing anything and (2) `tally serve` on a fresh SQLite file, drives
//! both over loopback with the same mix (unique event ids plus a share of duplicates, N
//! connections, fixed duration), and prints hits/s, p50 and p99 for each and the ratio
//! tally/baseline. `tally-loadgen memory` sends one million distinct visitors in one day (in
//! batches) and prints the server's peak RSS. Traffic goes to 127.0.0.1 only and every loop is
//! bounded in time or count.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const UA: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36";

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Baseline vs tally throughput and latency.
    Run {
        /// The tally binary (build it with --release).
        #[arg(long, default_value = "target/release/tally")]
        tally: PathBuf,
        /// Seconds per server.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Concurrent connections.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Percentage of requests that repeat an earlier event id.
        #[arg(long, default_value_t = 25)]
        duplicates: u64,
        /// Extra arguments for `tally serve` (e.g. "--sync normal").
        #[arg(long, default_value = "")]
        tally_args: String,
    },
    /// Peak RSS of tally after one million distinct visitors in one day.
    Memory {
        #[arg(long, default_value = "target/release/tally")]
        tally: PathBuf,
        /// Distinct visitors to send.
        #[arg(long, default_value_t = 1_000_000)]
        visitors: u64,
        /// Concurrent connections.
        #[arg(long, default_value_t = 8)]
        connections: usize,
    },
    /// Live p99 with no import vs during a `tally import` of a generated combined log on the
    /// same database (the import's low-priority lane), and the import's rate, in one run.
    Import {
        #[arg(long, default_value = "target/release/tally")]
        tally: PathBuf,
        /// Log lines to generate and import.
        #[arg(long, default_value_t = 300_000)]
        lines: u64,
        /// Seconds of live load, idle and again during the import.
        #[arg(long, default_value_t = 8)]
        duration: u64,
        /// Concurrent live connections.
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// Extra arguments for `tally import` (e.g. "--pause 0").
        #[arg(long, default_value = "")]
        import_args: String,
    },
    /// The do-nothing baseline server (started by `run`).
    Baseline,
    /// Drive an already running server (for profiling).
    Drive {
        #[arg(long)]
        addr: String,
        #[arg(long, default_value_t = 10)]
        duration: u64,
        #[arg(long, default_value_t = 64)]
        connections: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Cmd::Baseline => baseline().await,
            Cmd::Drive {
                addr,
                duration,
                connections,
            } => {
                let s = drive(&addr, Duration::from_secs(duration), connections, 25).await?;
                println!(
                    "{:.0} hits/s p50 {:.2} ms p99 {:.2} ms errors {}",
                    s.rate(),
                    s.pct(0.5),
                    s.pct(0.99),
                    s.errors
                );
                Ok(())
            }
            Cmd::Run {
                tally,
                duration,
                connections,
                duplicates,
                tally_args,
            } => run(tally, duration, connections, duplicates, tally_args).await,
            Cmd::Memory {
                tally,
                visitors,
                connections,
            } => memory(tally, visitors, connections).await,
            Cmd::Import {
                tally,
                lines,
                duration,
                connections,
                import_args,
            } => import(tally, lines, duration, connections, import_args).await,
        }
    })
}

async fn baseline() -> anyhow::Result<()> {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/api/v1/hit",
        post(|_body: Bytes| async { axum::http::StatusCode::NO_CONTENT }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// Start a server process and read its address from the "listening on" line.
async fn spawn(mut cmd: Command) -> anyhow::Result<(Child, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await?
        .context("no output")?;
    let addr = line
        .strip_prefix("listening on http://")
        .context("no listening line")?
        .to_owned();
    Ok((child, addr))
}

async fn spawn_tally(
    tally: &PathBuf,
    db: &PathBuf,
    extra: &str,
) -> anyhow::Result<(Child, String)> {
    if !tally.exists() {
        bail!(
            "{} not found: run `cargo build --release -p tally` first",
            tally.display()
        );
    }
    let mut cmd = Command::new(tally);
    // All load comes from one source: the per-source rate limit is off.
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--auto-sites",
        "--rate-limit-per-minute",
        "0",
        "--db",
    ])
    .arg(db);
    cmd.args(extra.split_whitespace());
    cmd.env("TALLY_LOG", "error");
    spawn(cmd).await
}

fn uuid_v7() -> String {
    uuid::Uuid::now_v7().to_string()
}

fn hit_body(event_id: &str, visitor: &str, page: u64) -> String {
    format!(
        r#"{{"site":"bench","type":"pageview","event_id":"{event_id}","visitor_id":"{visitor}","url":"https://bench.example/p{page}","referrer":null}}"#
    )
}

struct Stats {
    latencies_us: Vec<u32>,
    errors: u64,
    elapsed: Duration,
}

impl Stats {
    fn rate(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.latencies_us[i]) / 1000.0
    }
}

/// One HTTP/1.1 keep-alive connection.
async fn connect(
    addr: &str,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: &str,
    path: &str,
    body: String,
) -> anyhow::Result<u16> {
    sender.ready().await?;
    let req = Request::post(path)
        .header("host", addr)
        .header("content-type", "text/plain;charset=UTF-8")
        .header("user-agent", UA)
        .body(Full::new(Bytes::from(body)))?;
    let res = sender.send_request(req).await?;
    let status = res.status().as_u16();
    res.into_body().collect().await?;
    Ok(status)
}

/// Drive `addr` with `connections` clients for `duration`.
async fn drive(
    addr: &str,
    duration: Duration,
    connections: usize,
    dup_pct: u64,
) -> anyhow::Result<Stats> {
    let deadline = Instant::now() + duration;
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let addr = addr.to_owned();
        let counter = Arc::clone(&counter);
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(&addr).await?;
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut recent: Vec<String> = Vec::new();
            let visitor = uuid::Uuid::new_v4().to_string();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                // Every (100 / dup_pct)-th request repeats an id this client sent before.
                let dup = dup_pct > 0 && n % 100 < dup_pct && !recent.is_empty();
                let id = if dup {
                    recent[(n as usize) % recent.len()].clone()
                } else {
                    uuid_v7()
                };
                let body = hit_body(&id, &visitor, n % 50);
                let t = Instant::now();
                match post(&mut sender, &addr, "/api/v1/hit?t=1", body).await {
                    Ok(200 | 204) => {
                        latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32)
                    }
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        sender = connect(&addr).await?;
                    }
                }
                if !dup {
                    if recent.len() < 64 {
                        recent.push(id);
                    } else {
                        recent[(n as usize + c) % 64] = id;
                    }
                }
            }
            anyhow::Ok((latencies, errors))
        }));
    }
    let started = Instant::now();
    let mut latencies_us = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await??;
        latencies_us.extend(l);
        errors += e;
    }
    latencies_us.sort_unstable();
    Ok(Stats {
        latencies_us,
        errors,
        elapsed: started.elapsed().max(duration),
    })
}

fn peak_rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

async fn run(
    tally: PathBuf,
    secs: u64,
    connections: usize,
    dup: u64,
    extra: String,
) -> anyhow::Result<()> {
    let duration = Duration::from_secs(secs);
    let dir = tempdir()?;
    let me = std::env::current_exe()?;
    let (mut base_child, base_addr) = spawn({
        let mut c = Command::new(&me);
        c.arg("baseline");
        c
    })
    .await?;
    // Warm up connections and code paths briefly, then measure.
    drive(&base_addr, Duration::from_millis(500), connections, dup).await?;
    let base = drive(&base_addr, duration, connections, dup).await?;
    base_child.kill().await?;

    let db = dir.join("bench.sqlite");
    let (mut tally_child, tally_addr) = spawn_tally(&tally, &db, &extra).await?;
    drive(&tally_addr, Duration::from_millis(500), connections, dup).await?;
    let t = drive(&tally_addr, duration, connections, dup).await?;
    let rss = tally_child
        .id()
        .map(peak_rss_mb)
        .transpose()?
        .unwrap_or(f64::NAN);
    tally_child.kill().await?;
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "load: {connections} connections, {secs} s each, {dup}% duplicate event ids, tally args {extra:?}"
    );
    println!(
        "{:<10} {:>12} {:>10} {:>10} {:>8}",
        "server", "hits/s", "p50 ms", "p99 ms", "errors"
    );
    for (name, s) in [("baseline", &base), ("tally", &t)] {
        println!(
            "{name:<10} {:>12.0} {:>10.2} {:>10.2} {:>8}",
            s.rate(),
            s.pct(0.5),
            s.pct(0.99),
            s.errors
        );
    }
    println!(
        "ratio tally/baseline: {:.2} (goal >= 0.5)",
        t.rate() / base.rate()
    );
    println!(
        "tally p99: {:.2} ms (goal <= 25 ms); tally peak RSS {rss:.1} MB",
        t.pct(0.99)
    );
    Ok(())
}

async fn memory(tally: PathBuf, visitors: u64, connections: usize) -> anyhow::Result<()> {
    let dir = tempdir()?;
    let db = dir.join("memory.sqlite");
    let (mut child, addr) = spawn_tally(&tally, &db, "").await?;
    let pid = child.id().context("pid")?;
    let start_rss = peak_rss_mb(pid)?;
    const BATCH: u64 = 500;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (addr, next) = (addr.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(&addr).await?;
            loop {
                let from = next.fetch_add(BATCH, Ordering::Relaxed);
                if from >= visitors {
                    return anyhow::Ok(());
                }
                let records: Vec<String> = (from..(from + BATCH).min(visitors))
                    .map(|i| hit_body(&uuid_v7(), &uuid::Uuid::new_v4().to_string(), i % 1000))
                    .collect();
                let body = format!(r#"{{"events":[{}]}}"#, records.join(","));
                let status = post(&mut sender, &addr, "/api/v1/events", body).await?;
                if status != 200 {
                    bail!("batch answered {status}");
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let rss = peak_rss_mb(pid)?;
    let counts = {
        let mut sender = connect(&addr).await?;
        sender.ready().await?;
        let req = Request::get("/api/v1/counts?site=bench&page=/p1")
            .header("host", &addr)
            .body(Full::new(Bytes::new()))?;
        let body = sender
            .send_request(req)
            .await?
            .into_body()
            .collect()
            .await?
            .to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    };
    child.kill().await?;
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "sent {visitors} distinct visitors in {:.1} s ({:.0} hits/s, batches of {BATCH})",
        elapsed.as_secs_f64(),
        visitors as f64 / elapsed.as_secs_f64()
    );
    println!("counts: {counts}");
    println!("tally peak RSS: {rss:.1} MB (at start {start_rss:.1} MB; goal <= 100 MB)");
    Ok(())
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("tally-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A combined log of `lines` page views over the last `lines` seconds: 2,000 sources, 200
/// pages, a few user agents.
fn write_log(path: &std::path::Path, lines: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let now = jiff::Timestamp::now().as_second();
    let agents = [
        UA,
        "Mozilla/5.0 (X11; Linux x86_64; rv:135.0) Gecko/20100101 Firefox/135.0",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_3 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.3 Mobile/15E148 Safari/604.1",
    ];
    for i in 0..lines {
        let at = jiff::Timestamp::from_second(now - (lines - i) as i64)?;
        let when = at.strftime("%d/%b/%Y:%H:%M:%S +0000");
        writeln!(
            out,
            "10.{}.{}.{} - - [{when}] \"GET /posts/{}/ HTTP/1.1\" 200 5120 \"https://news.example/\" \"{}\"",
            (i / 65536) % 256,
            (i / 256) % 8,
            i % 250,
            (i * 7919) % 200,
            agents[(i % 3) as usize]
        )?;
    }
    out.flush()?;
    Ok(())
}

async fn import(
    tally: PathBuf,
    lines: u64,
    duration: u64,
    connections: usize,
    import_args: String,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("bench.sqlite");
    let log = dir.path().join("access.log");
    write_log(&log, lines)?;
    let status = Command::new(&tally)
        .args(["site", "add", "bench", "--origin", "*", "--db"])
        .arg(&db)
        .env("TALLY_LOG", "error")
        .status()
        .await?;
    anyhow::ensure!(status.success(), "site add failed");
    let (_server, addr) = spawn_tally(&tally, &db, "--address-limit-per-minute 0").await?;
    let span = Duration::from_secs(duration);
    // Warm up (page ids, caches), then the idle measurement.
    drive(&addr, Duration::from_secs(1), connections, 0).await?;
    let idle = drive(&addr, span, connections, 0).await?;
    let started = Instant::now();
    let mut cmd = Command::new(&tally);
    cmd.args(["import", "--format", "combined", "--site", "bench", "--db"])
        .arg(&db)
        .args(import_args.split_whitespace())
        .arg(&log)
        .env("TALLY_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let child = cmd.spawn()?;
    let busy = drive(&addr, span, connections, 0).await?;
    let live_done = started.elapsed();
    let out = child.wait_with_output().await?;
    let took = started.elapsed();
    anyhow::ensure!(out.status.success(), "import failed");
    let report = String::from_utf8_lossy(&out.stdout);
    println!("import: {}", report.trim());
    println!(
        "import: {lines} lines in {:.2} s = {:.0} lines/s (while serving live load){}",
        took.as_secs_f64(),
        lines as f64 / took.as_secs_f64(),
        if took < live_done {
            "  NOTE: the import ended before the live measurement: raise --lines"
        } else {
            ""
        }
    );
    for (name, s) in [("idle", &idle), ("during import", &busy)] {
        println!(
            "live {name:<14} {:>7.0} hits/s  p50 {:>6.2} ms  p99 {:>6.2} ms  errors {}",
            s.rate(),
            s.pct(0.5),
            s.pct(0.99),
            s.errors
        );
    }
    let ratio = busy.pct(0.99) / idle.pct(0.99);
    println!(
        "p99 during import / idle = {ratio:.2} ({})",
        if ratio <= 2.0 {
            "within 2x"
        } else {
            "ABOVE 2x"
        }
    );
    Ok(())
}
