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
    /// The tally binary (build it with --profile dist).
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    /// Seconds measured per server.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Rounds of baseline, ceiling and tally, one after the other; the ratios are printed per
    /// round and as medians (the host is shared and noisy: one round can swing by a third).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
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

/// One round's three measurements.
struct Round {
    base: Stats,
    ceil: Stats,
    tally: Stats,
    /// µs per answered hit: (server, load generator) of the baseline, the ceiling and tally.
    cpu: [(f64, f64); 3],
    rss: f64,
}

impl Round {
    /// tally/baseline, ceiling/baseline, tally/ceiling.
    fn ratios(&self) -> [f64; 3] {
        let (b, c, t) = (self.base.rate(), self.ceil.rate(), self.tally.rate());
        [t / b, c / b, t / c]
    }
}

/// The median of `values` (the mean of the middle two when even).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

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
    println!(
        "load: {} connections from {:?} source, {} s each, {} round(s), tally args {:?}; \
         host: {} cores, load average {load_before} before",
        args.connections,
        args.legit_source,
        args.duration,
        args.rounds,
        args.tally_args,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    let mut rounds = Vec::new();
    let mut last_db = None;
    for round in 1..=args.rounds.max(1) {
        let base_server = server::spawn_baseline().await?;
        drive(base_server.addr, 1).run(WARM_UP).await?;
        let (base, base_cpu) = measured(&base_server, drive(base_server.addr, 2), duration).await?;
        base_server.stop().await?;

        let ceiling_log = dir.join(&format!("ceiling-{round}.jsonl"));
        let ceiling_server = server::spawn_ceiling(&ceiling_log).await?;
        drive(ceiling_server.addr, 1).run(WARM_UP).await?;
        let (ceil, ceil_cpu) =
            measured(&ceiling_server, drive(ceiling_server.addr, 2), duration).await?;
        ceiling_server.stop().await?;
        std::fs::remove_file(&ceiling_log)?;

        let db = dir.join(&format!("bench-{round}.sqlite"));
        let log = dir.join(&format!("tally-{round}.log"));
        let mut tally = server::spawn_tally(&args.tally, &db, &args.tally_args, &log).await?;
        let warm = drive(tally.addr, 1).run(WARM_UP).await?;
        let (t, tally_cpu) = measured(&tally, drive(tally.addr, 2), duration).await?;
        let rss = tally.peak_rss_mb().unwrap_or(f64::NAN);
        let crashed = tally.exited();
        let tail = tally.log_tail(10);
        let clean = tally.stop().await?;
        if let Some(status) = crashed {
            anyhow::bail!("tally had exited during round {round} ({status}); log tail:\n{tail}");
        }
        if round == 1 {
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
        }
        let r = Round {
            base,
            ceil,
            tally: t,
            cpu: [base_cpu, ceil_cpu, tally_cpu],
            rss,
        };
        print_round(round, &r);
        // The database of the last round is measured; earlier ones only take disk.
        if let Some((old, _, _)) = last_db.replace((db, warm.accepted + r.tally.accepted, clean)) {
            remove_database(&old);
        }
        rounds.push(r);
    }

    let ratios: Vec<[f64; 3]> = rounds.iter().map(Round::ratios).collect();
    let listed = |i: usize| {
        ratios
            .iter()
            .map(|r| format!("{:.2}", r[i]))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let med = |i: usize| median(ratios.iter().map(|r| r[i]).collect());
    println!(
        "ratio tally/baseline: {:.2} (goal >= 0.5; rounds {}); ceiling/baseline: {:.2} \
         (durable, counting nothing; rounds {}); tally/ceiling: {:.2} (rounds {})",
        med(0),
        listed(0),
        med(1),
        listed(1),
        med(2),
        listed(2)
    );
    println!(
        "tally p99: {:.2} ms (median of rounds; goal <= 25 ms); tally peak RSS {:.1} MB (largest)",
        median(rounds.iter().map(|r| r.tally.pct(0.99)).collect()),
        rounds.iter().map(|r| r.rss).fold(f64::NAN, f64::max)
    );
    if let Some((db, stored, clean)) = last_db {
        let size = DbSize::of(&db);
        let per_hit = |bytes: u64| bytes as f64 / stored.max(1) as f64;
        println!(
            "database after {} stop: file {:.1} MB + WAL {:.1} MB = {:.1} MB for {stored} stored \
             hits = {:.0} bytes per stored hit (file alone: {:.0})",
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
    }
    println!("load average after: {}", load_average());
    Ok(())
}

/// A round's table: each server's rate and latency, the ratios, CPU per answered hit.
fn print_round(round: usize, r: &Round) {
    println!(
        "round {round}\n{:<14} {:>12} {:>10} {:>10} {:>8}",
        "server", "hits/s", "p50 ms", "p99 ms", "errors"
    );
    for (name, s) in [
        ("baseline", &r.base),
        ("ceiling", &r.ceil),
        ("tally", &r.tally),
    ] {
        print_row(name, s);
    }
    for (name, s) in [("ceiling", &r.ceil), ("tally", &r.tally)] {
        let line: Vec<String> = s
            .timeline()
            .iter()
            .map(|(p99, max)| format!("{p99:.0}/{max:.0}"))
            .collect();
        println!("{name} p99/max ms per second: {}", line.join(" "));
    }
    let [tb, cb, tc] = r.ratios();
    let [b, c, t] = r.cpu;
    println!(
        "tally/baseline {tb:.2}, ceiling/baseline {cb:.2}, tally/ceiling {tc:.2}; CPU per answered \
         hit (µs, from /proc/<pid>/stat, 10 ms ticks): baseline server {:.1} + load generator \
         {:.1}; ceiling {:.1} + load generator {:.1}; tally {:.1} + load generator {:.1}",
        b.0, b.1, c.0, c.1, t.0, t.1
    );
}

/// Remove a database file and its side files.
fn remove_database(db: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
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

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![0.3, 0.1, 0.2]), 0.2);
        assert_eq!(median(vec![0.4, 0.1, 0.3, 0.2]), 0.25);
        assert!(median(Vec::new()).is_nan());
    }
}
