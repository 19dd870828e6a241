//! `tally-loadgen import`: what a `tally import` costs the live traffic, in one run. A
//! generated combined log (many sources, Zipf-ish pages, three browsers, timestamps over the
//! last `lines` seconds) is imported by a second process on the database `tally serve` is
//! serving, while the realistic live mix drives the server; the same live load is measured
//! first with no import (idle). Prints the import's rate (lines/s while serving), live
//! throughput and p50/p99 idle and during the import, and the p99 ratio against its goal
//! (≤ 2×). If the import ends before the live measurement does, the ratio flatters the import
//! and the run says so (raise `--lines`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::drive::{Drive, LegitSource};
use crate::mix::{DESKTOP_UA, MixArgs, Plan, SITE};
use crate::run::print_row;
use crate::server::{self, load_average};

/// Options of `import`.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The tally binary (build it with --profile dist).
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    /// Log lines to generate and import.
    #[arg(long, default_value_t = 300_000)]
    pub lines: u64,
    /// Seconds of live load, idle and again during the import.
    #[arg(long, default_value_t = 8)]
    pub duration: u64,
    /// Concurrent live connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Extra arguments for `tally import` (e.g. "--pause 0" to see the lane's effect).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub import_args: String,
    #[command(flatten)]
    pub mix: MixArgs,
}

const WARM_UP: Duration = Duration::from_secs(1);

/// Write a combined log of `lines` page views, one a second up to now: 20,000 sources over
/// 200 pages (popularity ~ 1/rank), three browsers, a referrer on every third line.
fn write_log(path: &Path, lines: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let now = jiff::Timestamp::now().as_second();
    let agents = [
        DESKTOP_UA,
        "Mozilla/5.0 (X11; Linux x86_64; rv:135.0) Gecko/20100101 Firefox/135.0",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_3 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.3 Mobile/15E148 Safari/604.1",
    ];
    let mut rng = crate::rng::Rng::new(7);
    for i in 0..lines {
        let at = jiff::Timestamp::from_second(now - (lines - i) as i64)?;
        let when = at.strftime("%d/%b/%Y:%H:%M:%S +0000");
        let source = rng.below(20_000);
        // 1/rank popularity without a table: the rank is 200^u for a uniform u.
        let page = (200f64.powf(rng.unit()) as u64).min(200);
        let referrer = if i % 3 == 0 {
            "https://news.example/"
        } else {
            "-"
        };
        writeln!(
            out,
            "10.{}.{}.{} - - [{when}] \"GET /posts/{page}/ HTTP/1.1\" 200 5120 \"{referrer}\" \"{}\"",
            source / 65_536,
            (source / 256) % 256,
            source % 256,
            agents[(source % 3) as usize]
        )?;
    }
    out.flush()?;
    Ok(())
}

pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    if !args.tally.exists() {
        bail!(
            "{} not found: run `cargo build --profile dist -p tally` first",
            args.tally.display()
        );
    }
    let load_before = load_average();
    let dir = server::TempDir::new()?;
    let db = dir.join("bench.sqlite");
    let log = dir.join("access.log");
    write_log(&log, args.lines)?;
    let status = Command::new(&args.tally)
        .args(["site", "add", SITE, "--origin", "*", "--db"])
        .arg(&db)
        .env("TALLY_LOG", "error")
        .status()
        .await?;
    anyhow::ensure!(status.success(), "tally site add failed");
    let tally = server::spawn_tally(
        &args.tally,
        &db,
        "--rate-limit-per-minute 0 --address-limit-per-minute 0",
        &dir.join("tally.log"),
    )
    .await?;
    let drive = |salt| Drive {
        addr: tally.addr,
        connections: args.connections,
        source: LegitSource::One,
        plan: Plan::new(&args.mix, salt),
    };
    let span = Duration::from_secs(args.duration);
    drive(1).run(WARM_UP).await?;
    let idle = drive(2).run(span).await?;

    let started = Instant::now();
    let child = Command::new(&args.tally)
        .args(["import", "--format", "combined", "--site", SITE, "--db"])
        .arg(&db)
        .args(args.import_args.split_whitespace())
        .arg(&log)
        .env("TALLY_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start tally import")?;
    let busy = drive(3).run(span).await?;
    let live_done = started.elapsed();
    let out = child.wait_with_output().await?;
    let took = started.elapsed();
    let clean = tally.stop().await?;
    anyhow::ensure!(out.status.success(), "tally import failed");

    println!(
        "load: {} live connections ({} mix), {} s idle and {} s during the import of {} \
         combined-log lines; import args {:?}; host: {} cores, load average {load_before} \
         before, {} after",
        args.connections,
        format!("{:?}", args.mix.mix).to_lowercase(),
        args.duration,
        args.duration,
        args.lines,
        args.import_args,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    println!(
        "tally import said: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    println!(
        "import rate: {} lines in {:.2} s = {:.0} lines/s (while serving the live load){}",
        args.lines,
        took.as_secs_f64(),
        args.lines as f64 / took.as_secs_f64(),
        if took < live_done {
            "  NOTE: the import ended before the live measurement did: raise --lines"
        } else {
            ""
        }
    );
    println!(
        "{:<14} {:>12} {:>10} {:>10} {:>8}",
        "live", "hits/s", "p50 ms", "p99 ms", "errors"
    );
    print_row("idle", &idle);
    print_row("during import", &busy);
    let ratio = busy.pct(0.99) / idle.pct(0.99);
    println!(
        "p99 during import / idle = {ratio:.2} (goal <= 2: {})",
        if ratio <= 2.0 { "met" } else { "NOT met" }
    );
    println!(
        "throughput during import / idle = {:.2}",
        busy.rate() / idle.rate()
    );
    if !clean {
        println!("tally did not stop cleanly");
    }
    Ok(())
}
