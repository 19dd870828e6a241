//! `tally-loadgen run`: the throughput of the collector against a do-nothing baseline, in one
//! run, with the same mix and connections, and what a stored hit costs on disk.
//!
//! Order: the baseline (warm-up, then `duration` measured), the durable ceiling
//! ([`crate::ceiling`]: parse, one group-committed write and `fdatasync` per batch, nothing
//! else: about the most a durable collector reaches here), then tally on a fresh SQLite file
//! (warm-up, `duration` measured, peak RSS read, then SIGTERM: tally commits its queue and
//! closes the database). The database bytes per stored hit are the main file plus the WAL
//! after that stop, divided by every hit answered `accepted` (warm-up included).
//!
//! All servers share the host's cores with this load generator, so the ratio is bounded by
//! CPU: the run also prints the CPU time each server and the generator spent per answered
//! request during the measured window (`/proc/<pid>/stat`), which says where the cores went.

use std::path::PathBuf;
use std::time::Duration;

use crate::drive::{Drive, LegitSource, Stats};
use crate::mix::{MixArgs, MixKind, Plan};
use crate::server::{self, Cpu, DbSize, load_average, mb};

/// Options of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The tally binary (build it with --release).
    #[arg(long, default_value = "target/release/tally")]
    pub tally: PathBuf,
    /// Seconds measured per server.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Where the traffic comes from.
    #[arg(long, value_enum, default_value_t = LegitSource::One)]
    pub legit_source: LegitSource,
    /// Arguments for `tally serve` besides --listen and --db. All load comes from one address
    /// by default, hence no per-source limit.
    #[arg(
        long,
        default_value = "--auto-sites --rate-limit-per-minute 0 --address-limit-per-minute 0 --new-sites-per-hour 0",
        allow_hyphen_values = true
    )]
    pub tally_args: String,
    #[command(flatten)]
    pub mix: MixArgs,
}

const WARM_UP: Duration = Duration::from_millis(500);

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.duration);
    let load_before = load_average();
    let dir = server::TempDir::new()?;
    let drive = |addr, salt| Drive {
        addr,
        connections: args.connections,
        source: args.legit_source,
        plan: Plan::new(&args.mix, salt),
    };

    let base_server = server::spawn_baseline().await?;
    drive(base_server.addr, 1).run(WARM_UP).await?;
    let (base, base_cpu) = measured(&base_server, drive(base_server.addr, 2), duration).await?;
    base_server.stop().await?;

    let ceiling_server = server::spawn_ceiling(&dir.join("ceiling.jsonl")).await?;
    drive(ceiling_server.addr, 1).run(WARM_UP).await?;
    let (ceil, ceil_cpu) =
        measured(&ceiling_server, drive(ceiling_server.addr, 2), duration).await?;
    ceiling_server.stop().await?;

    let db = dir.join("bench.sqlite");
    let mut tally =
        server::spawn_tally(&args.tally, &db, &args.tally_args, &dir.join("tally.log")).await?;
    let warm = drive(tally.addr, 1).run(WARM_UP).await?;
    let (t, tally_cpu) = measured(&tally, drive(tally.addr, 2), duration).await?;
    let rss = tally.peak_rss_mb().unwrap_or(f64::NAN);
    let crashed = tally.exited();
    let tail = tally.log_tail(10);
    let clean = tally.stop().await?;
    let size = DbSize::of(&db);

    println!(
        "load: {} connections from {:?} source, {} s each, tally args {:?}; host: {} cores, \
         load average {load_before} before, {} after",
        args.connections,
        args.legit_source,
        args.duration,
        args.tally_args,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    match args.mix.mix {
        MixKind::Realistic => println!(
            "mix: realistic, {} visitors, {} pages (Zipf s={}), sent to tally: {}",
            args.mix.visitors,
            args.mix.pages,
            args.mix.zipf,
            t.mix_line()
        ),
        MixKind::Cache => println!(
            "mix: cache (one visitor per connection, 50 pages), {}% duplicate event ids",
            args.mix.duplicates
        ),
    }
    println!(
        "{:<14} {:>12} {:>10} {:>10} {:>8}",
        "server", "hits/s", "p50 ms", "p99 ms", "errors"
    );
    for (name, s) in [("baseline", &base), ("ceiling", &ceil), ("tally", &t)] {
        print_row(name, s);
    }
    println!(
        "ratio tally/baseline: {:.2} (goal >= 0.5); ceiling/baseline: {:.2} (durable, counting \
         nothing); tally/ceiling: {:.2}",
        t.rate() / base.rate(),
        ceil.rate() / base.rate(),
        t.rate() / ceil.rate()
    );
    println!(
        "tally p99: {:.2} ms (goal <= 25 ms); tally peak RSS {rss:.1} MB",
        t.pct(0.99)
    );
    println!(
        "CPU per answered hit (µs, from /proc/<pid>/stat, 10 ms ticks): baseline server {:.1} + \
         load generator {:.1}; ceiling {:.1} + load generator {:.1}; tally {:.1} + load \
         generator {:.1}",
        base_cpu.0, base_cpu.1, ceil_cpu.0, ceil_cpu.1, tally_cpu.0, tally_cpu.1
    );
    let stored = warm.accepted + t.accepted;
    let per_hit = |bytes: u64| bytes as f64 / stored.max(1) as f64;
    println!(
        "database after {} stop: file {:.1} MB + WAL {:.1} MB = {:.1} MB for {stored} stored hits \
         = {:.0} bytes per stored hit (file alone: {:.0})",
        if clean {
            "a clean (SIGTERM)"
        } else {
            "an unclean"
        },
        mb(size.file),
        mb(size.wal),
        mb(size.total()),
        per_hit(size.total()),
        per_hit(size.file)
    );
    if let Some(status) = crashed {
        println!("tally had exited during the run ({status}); log tail:\n{tail}");
    }
    Ok(())
}

/// Drive `server` for `duration`; returns the result and the CPU both processes used meanwhile,
/// µs per answered request: (server, load generator).
async fn measured(
    server: &server::Server,
    drive: Drive,
    duration: Duration,
) -> anyhow::Result<(Stats, (f64, f64))> {
    let before = Cpu::now(&[server])?;
    let stats = drive.run(duration).await?;
    let [server, _, _, generator] = Cpu::now(&[server])?.since(&before).per_hit(stats.ok);
    Ok((stats, (server, generator)))
}

pub fn print_row(name: &str, s: &Stats) {
    let detail = s.error_detail();
    println!(
        "{name:<14} {:>12.0} {:>10.2} {:>10.2} {:>8}{}",
        s.rate(),
        s.pct(0.5),
        s.pct(0.99),
        s.errors(),
        if detail.is_empty() {
            String::new()
        } else {
            format!("  ({detail})")
        }
    );
}
